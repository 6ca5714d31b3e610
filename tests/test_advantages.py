"""grpokit/advantages.py: group baselines, reward post-processing and dynamic sampling.

Tables of hand-computed advantages for each baseline, then real TRL trainers on a tiny random Llama with the
embedded model's tokenizer (test_speedups' fixture): the advantages the loss sees, TRL's own with the defaults, the
run state across a resume, and dynamic sampling refilling (and, when it cannot, completing) the batch.
"""

import json
import math
import statistics

import pytest
from test_speedups import _lora_model, tiny_model_dir  # noqa: F401 - the fixture, shared

NAN = math.nan
G = 4


def _t(values):
    import torch

    return torch.tensor(values, dtype=torch.float32)


# Each case: one group of 4 rewards and its advantage (reward - baseline, scale_rewards 'none') per baseline,
# computed by hand.
CASES = [
    # distinct values: mean 4; median (2 + 3) / 2; leave-one-out: the mean of the other three
    ([1, 2, 3, 10], {"group_mean": [-3, -2, -1, 6], "group_median": [-1.5, -0.5, 0.5, 7.5],
                     "leave_one_out": [1 - 5, 2 - 14 / 3, 3 - 13 / 3, 10 - 2]}),
    # ties: the two middle values are both 1
    ([0, 1, 1, 1], {"group_mean": [-0.75, 0.25, 0.25, 0.25], "group_median": [-1, 0, 0, 0],
                    "leave_one_out": [-1, 1 / 3, 1 / 3, 1 / 3]}),
    # None (NaN) is left out: 3 valid values, median 1 (odd count), mean 2; its own advantage is 0
    ([NAN, 0, 1, 5], {"group_mean": [0, -2, -1, 3], "group_median": [0, -1, 0, 4],
                      "leave_one_out": [0, 0 - 3, 1 - 2.5, 5 - 0.5]}),
    # all equal: nothing to compare
    ([2, 2, 2, 2], {"group_mean": [0] * 4, "group_median": [0] * 4, "leave_one_out": [0] * 4}),
    # one valid value: no baseline but itself
    ([NAN, NAN, 3, NAN], {"group_mean": [0] * 4, "group_median": [0] * 4, "leave_one_out": [0] * 4}),
    # nothing scored
    ([NAN] * 4, {"group_mean": [0] * 4, "group_median": [0] * 4, "leave_one_out": [0] * 4}),
    # an even count of valid values left by None: the median of (1, 4) is 2.5 (torch.nanmedian would say 1)
    ([4, NAN, 1, NAN], {"group_mean": [1.5, 0, -1.5, 0], "group_median": [1.5, 0, -1.5, 0],
                        "leave_one_out": [3, 0, -3, 0]}),
]
IN_GROUP = ("group_mean", "group_median", "leave_one_out")


@pytest.mark.parametrize("rewards,expected", CASES)
@pytest.mark.parametrize("baseline", IN_GROUP)
def test_advantages_by_hand(rewards, expected, baseline):
    import torch

    from grpokit.advantages import advantages

    result = advantages(_t(rewards), G, baseline, "none")
    torch.testing.assert_close(result, _t(expected[baseline]), rtol=0, atol=1e-5)
    assert not torch.isnan(result).any()
    # 'group' divides by the group's std (Bessel, over the valid values) + 1e-4, as TRL does
    valid = [r for r in rewards if not math.isnan(r)]
    std = statistics.stdev(valid) if len(valid) > 1 else 0.0
    scaled = [0.0 if std == 0 else a / (std + 1e-4) for a in expected[baseline]]
    torch.testing.assert_close(advantages(_t(rewards), G, baseline, "group"), _t(scaled), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("baseline", IN_GROUP)
def test_batch_scaling_shift_invariance_and_groups_are_independent(baseline):
    import torch

    from grpokit.advantages import advantages

    rewards = [r for case, _ in CASES for r in case]
    batch = _t(rewards)
    by_group = torch.cat([advantages(_t(case), G, baseline, "none") for case, _ in CASES])
    torch.testing.assert_close(advantages(batch, G, baseline, "none"), by_group, rtol=0, atol=1e-5)
    std = statistics.stdev([r for r in rewards if not math.isnan(r)])
    torch.testing.assert_close(advantages(batch, G, baseline, "batch"), by_group / (std + 1e-4), rtol=1e-5, atol=1e-5)
    for scale in ("group", "batch", "none"):  # adding a constant to every reward changes no advantage
        torch.testing.assert_close(advantages(batch + 7.25, G, baseline, scale), advantages(batch, G, baseline, scale),
                                   rtol=1e-4, atol=1e-4)


def test_group_mean_is_trls_formula():
    import torch
    from trl.trainer.utils import nanstd

    from grpokit.advantages import advantages

    rewards = _t([0.5, 1.5, 0.25, 3.0, 1, 1, 1, 1, NAN, 2, 0, 1])
    grouped = rewards.view(-1, G)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(G)
    trl_group = torch.nan_to_num((rewards - mean) / (nanstd(grouped, dim=1).repeat_interleave(G) + 1e-4), nan=0.0)
    torch.testing.assert_close(advantages(rewards, G, "group_mean", "group"), trl_group, rtol=0, atol=1e-6)
    trl_batch = torch.nan_to_num((rewards - mean) / (nanstd(rewards) + 1e-4), nan=0.0)
    torch.testing.assert_close(advantages(rewards, G, "group_mean", "batch"), trl_batch, rtol=0, atol=1e-6)


def test_ema_baseline_across_steps():
    import torch

    from grpokit.advantages import PromptEMA, advantages

    ema = PromptEMA(0.9)
    # step 1: first sighting of both prompts: the baseline is the group's mean
    first = ema.update(["a", "b"], _t([0.5, 2.0]))
    torch.testing.assert_close(first, _t([0.5, 2.0]))
    # step 2: prompt a again, with mean 1.0: 0.9 * 0.5 + 0.1 * 1.0; c is new
    second = ema.update(["a", "c"], _t([1.0, 3.0]))
    torch.testing.assert_close(second, _t([0.55, 3.0]))
    rewards = _t([1, 1, 1, 1, 2, 3, 4, 3])
    # a group that scored the same throughout: 1 - 0.55 with no scaling; 0 under 'group' (std 0)
    none = advantages(rewards, G, "exponential_moving_average", "none", second)
    torch.testing.assert_close(none, _t([0.45] * 4 + [-1, 0, 1, 0]), rtol=0, atol=1e-6)
    group = advantages(rewards, G, "exponential_moving_average", "group", second)
    torch.testing.assert_close(group[:4], torch.zeros(4))
    # a group with no valid reward leaves its prompt's value alone
    assert math.isnan(ema.update(["a"], _t([NAN]))[0]) and ema.values["a"] == pytest.approx(0.55)


def test_reward_transforms_and_running_normaliser():
    import numpy as np
    import torch

    from grpokit.advantages import Welford, transform_rewards

    raw = _t([-4, 0.5, NAN, 3, 1])
    out, clipped = transform_rewards(raw, scaling=2.0, clipping=3.0)  # scale first, then clip
    torch.testing.assert_close(out, _t([-3, 1, NAN, 3, 2]), equal_nan=True)
    assert clipped.tolist() == [True, False, False, True, False]  # the None row is neither clipped nor counted
    same, none_clipped = transform_rewards(raw)
    torch.testing.assert_close(same, raw, equal_nan=True)
    assert not none_clipped.any()

    welford, seen = Welford(), []
    for batch in ([1.0, 2.0, NAN], [5.0], [0.5, -3.0, 2.5, 8.0]):  # running stats over every valid value so far
        welford.update(_t(batch))
        seen += [v for v in batch if not math.isnan(v)]
        assert welford.count == len(seen)
        assert welford.mean == pytest.approx(np.mean(seen))
        assert welford.std == pytest.approx(np.std(seen, ddof=1))
    torch.testing.assert_close(welford.normalise(_t([np.mean(seen)])), _t([0.0]), rtol=0, atol=1e-6)
    restored = Welford(**json.loads(json.dumps(welford.state())))
    assert restored.std == welford.std and restored.mean == welford.mean
    lone = Welford()
    lone.update(_t([3.0]))  # no spread yet: subtract the mean, divide by 1
    torch.testing.assert_close(lone.normalise(_t([4.0])), _t([1.0]))


@pytest.mark.parametrize("setting,message", [
    ({"baseline_type": "median"}, "group_mean"),
    ({"baseline_ema_decay": 1.0}, "'baseline_ema_decay' must be in (0, 1)"),
    ({"baseline_ema_decay": 0}, "'baseline_ema_decay' must be in (0, 1)"),
    ({"reward_clipping": -1}, "'reward_clipping' must be >= 0"),
    ({"reward_scaling": -2}, "'reward_scaling' must be > 0"),
    ({"dynamic_sampling_max_rounds": -1}, "'dynamic_sampling_max_rounds' must be >= 0"),
    ({"baseline_type": "leave_one_out", "multi_objective_aggregation": "normalize_then_sum"},
     "need multi_objective_aggregation 'sum_then_normalize'"),
])
def test_bad_values_are_one_line_errors(setting, message):
    from config.errors import UsageError
    from grpo_trainer import GRPOConfig

    with pytest.raises(UsageError) as caught:
        GRPOConfig(model_name="smollm2-135m", **setting)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    if setting.get("baseline_type") == "median":  # the valid names are listed
        assert all(name in str(caught.value) for name in ("group_median", "leave_one_out",
                                                          "exponential_moving_average"))


# ---- through a real TRL trainer --------------------------------------------------------------------------------


def _dataset(questions=("What is 3 + 4?", "Name a colour.", "Count to three, please, slowly and clearly.", "Hi")):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in list(questions) * 4])


class Recorder:
    """A reward (TRL's contract) that scores by length with ties (`len // 3 % 4`), and keeps what it returned;
    `flat` names prompts whose completions all get 1.0."""

    __name__ = "recorded"

    def __init__(self, flat=()):
        self.flat, self.calls = tuple(flat), []

    def __call__(self, prompts, completions, **kwargs):
        scores = [1.0 if any(f in p[-1]["content"] for f in self.flat) else float(len(c[0]["content"]) // 3 % 4)
                  for p, c in zip(prompts, completions, strict=True)]
        self.calls.append(scores)
        return scores


def _trainer(path, out, reward, options=None, steps=2, cls=None, **args):
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from grpokit.advantages import Options
    from grpokit.trl_trainer import TRLGRPOTrainer

    settings = dict(output_dir=str(out), per_device_train_batch_size=8, num_generations=G, max_completion_length=12,
                    max_steps=steps, learning_rate=5e-3, seed=0, report_to="none", use_cpu=True, bf16=False,
                    gradient_checkpointing=False, logging_steps=1, save_strategy="no")
    settings.update(args)
    trainer = (cls or TRLGRPOTrainer)(model=_lora_model(path), processing_class=AutoTokenizer.from_pretrained(path),
                                      reward_funcs=reward, args=GRPOConfig(**settings), train_dataset=_dataset())
    if options is not None:
        trainer.advantage_options = Options(**options)
    return trainer


def _record(trainer, name):
    """Keep what `name` returns (its first argument too for the loss) on the trainer, unchanged."""
    seen = []
    method = getattr(trainer, name)

    def recorded(*args, **kwargs):
        result = method(*args, **kwargs)
        seen.append((args[-1] if name == "_compute_loss" else args[0], result))
        return result

    setattr(trainer, name, recorded)
    return seen


def _hand_median_advantages(rewards):
    out = []
    for start in range(0, len(rewards), G):
        group = rewards[start:start + G]
        std = statistics.stdev(group)
        out += [0.0 if std == 0 else (r - statistics.median(group)) / (std + 1e-4) for r in group]
    return out


def test_group_median_is_what_the_loss_sees(tiny_model_dir, tmp_path):  # noqa: F811 - the fixture
    import torch

    reward = Recorder()
    trainer = _trainer(tiny_model_dir, tmp_path, reward, {"baseline_type": "group_median"})
    generated = _record(trainer, "_generate_and_score_completions")
    losses = _record(trainer, "_compute_loss")
    trainer.train()
    assert len(reward.calls) == len(generated) == len(losses) == 2
    for rewards, (_, output), (inputs, _) in zip(reward.calls, generated, losses, strict=True):
        expected = torch.tensor(_hand_median_advantages(rewards))
        torch.testing.assert_close(output["advantages"], expected, rtol=1e-5, atol=1e-5)
        # the loss sees the same batch, shuffled by TRL
        torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values, rtol=1e-5, atol=1e-5)
    assert any(any(a != 0 for a in _hand_median_advantages(r)) for r in reward.calls)  # something to learn
    # a median differs from the mean on these groups (ties): the test would notice TRL's baseline
    assert any(statistics.median(r[i:i + G]) != statistics.mean(r[i:i + G]) for r in reward.calls
               for i in range(0, len(r), G))
    logged = [h for h in trainer.state.log_history if "reward/raw_mean" in h]
    assert len(logged) == 2 and all(h["reward/raw_mean"] == pytest.approx(h["reward"]) for h in logged)
    assert all(h["reward/clipped_frac"] == 0 for h in logged)


def test_defaults_are_trls_advantages_bit_for_bit(tiny_model_dir, tmp_path):  # noqa: F811 - the fixture
    import torch
    import trl

    from grpokit.advantages import advantages

    runs = {}
    for name, cls, options in (("trl", trl.GRPOTrainer, None), ("ours", None, {}),
                               ("recomputed", None, {"reward_clipping": 1e9})):
        reward = Recorder()
        trainer = _trainer(tiny_model_dir, tmp_path / name, reward, options, cls=cls)
        generated = _record(trainer, "_generate_and_score_completions")
        trainer.train()
        runs[name] = (reward.calls, [out["advantages"] for _, out in generated])
    assert runs["ours"][0] == runs["trl"][0]  # the same completions were scored
    for ours, theirs in zip(runs["ours"][1], runs["trl"][1], strict=True):
        assert torch.equal(ours, theirs)
    # the recompute path (any option on) with the mean baseline is TRL's formula, to float rounding
    assert runs["recomputed"][0] == runs["trl"][0]
    for rewards, ours, theirs in zip(runs["trl"][0], runs["recomputed"][1], runs["trl"][1], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(advantages(torch.tensor(rewards), G), theirs, rtol=1e-5, atol=1e-5)


def test_run_state_is_saved_and_a_resumed_run_continues_it(tiny_model_dir, tmp_path):  # noqa: F811 - the fixture
    from grpokit.advantages import STATE_FILE, run_state
    from grpokit.checkpoints import DeterministicSampling

    options = {"baseline_type": "exponential_moving_average", "reward_normalization": True, "reward_scaling": 0.5}
    full = _trainer(tiny_model_dir, tmp_path / "full", Recorder(), options, steps=3, save_strategy="steps",
                    save_steps=1)
    full.add_callback(DeterministicSampling())  # the run's own per-step seeding: a resumed step samples the same
    full.train()
    saved = json.loads((tmp_path / "full" / "checkpoint-2" / STATE_FILE).read_text())
    assert saved["normaliser"]["count"] == 16  # two steps of 8 completions
    assert 1 <= len(saved["ema_baselines"]) <= 4  # at most the 4 distinct prompts, keyed by their text (no id)
    resumed = _trainer(tiny_model_dir, tmp_path / "resumed", Recorder(), options, steps=3, save_strategy="steps",
                       save_steps=1)
    resumed.add_callback(DeterministicSampling())
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    final, again = run_state(full).to_json(), run_state(resumed).to_json()
    assert again["normaliser"] == pytest.approx(final["normaliser"])
    assert again["ema_baselines"] == pytest.approx(final["ema_baselines"])
    assert final["normaliser"]["count"] == 24  # the resumed run continued the saved statistics (16 + 8)


def test_dynamic_sampling_refills_with_groups_that_have_variance(tiny_model_dir, tmp_path):  # noqa: F811
    """Prompts 'Hi' and 'Name a colour.' always score 1.0 (zero variance): they are replaced by other prompts. Two
    micro-batches per generation and two iterations over each: TRL's buffering and old log-probs see merged rows."""
    import torch

    reward = Recorder(flat=("Hi", "colour"))
    trainer = _trainer(tiny_model_dir, tmp_path, reward, {"dynamic_sampling": True}, steps=4,
                       per_device_train_batch_size=4, gradient_accumulation_steps=2, num_iterations=2)
    generated = _record(trainer, "_generate_and_score_completions")
    losses = _record(trainer, "_compute_loss")
    trainer.train()
    tokenizer = trainer.processing_class
    assert len(losses) == 8 and all(inputs["advantages"].shape == (4,) for inputs, _ in losses)
    for _, output in generated:
        assert output["completion_ids"].shape[0] == output["prompt_ids"].shape[0] == 8  # TRL's batch shape
        assert "old_per_token_logps" in output  # num_iterations 2: the old policy's log-probs travel with the rows
        prompts = tokenizer.batch_decode(output["prompt_ids"], skip_special_tokens=True)
        assert not any("Hi" in p.split("user")[-1] or "colour" in p for p in prompts), prompts
        kept = output["advantages"].view(-1, G)
        assert (kept.abs().sum(dim=1) > 0).all()  # every group has something to teach
        mask = output["completion_mask"]
        assert output["num_items_in_batch"] == mask.sum()
        assert torch.isfinite(output["advantages"]).all()
    logged = [h for h in trainer.state.log_history if "dynamic_sampling/kept_frac" in h]
    assert logged and all(h["dynamic_sampling/capped"] == 0 for h in logged)
    assert any(h["dynamic_sampling/rounds"] >= 1 and h["dynamic_sampling/kept_frac"] < 1 for h in logged)


def test_dynamic_sampling_cap_keeps_the_batch_and_says_so(tiny_model_dir, tmp_path, caplog):  # noqa: F811
    import logging

    reward = Recorder(flat=("",))  # every prompt: zero variance, so no round can fill the batch
    trainer = _trainer(tiny_model_dir, tmp_path, reward, {"dynamic_sampling": True, "dynamic_sampling_max_rounds": 2,
                                                           "baseline_type": "group_median"})
    generated = _record(trainer, "_generate_and_score_completions")
    with caplog.at_level(logging.WARNING, logger="grpo"):
        trainer.train()
    assert len(reward.calls) == 2 * 3  # 2 steps x (1 + 2 rounds)
    for _, output in generated:
        assert output["prompt_ids"].shape[0] == 8 and (output["advantages"] == 0).all()
    logged = [h for h in trainer.state.log_history if "dynamic_sampling/capped" in h]
    assert [h["dynamic_sampling/capped"] for h in logged] == [1.0, 1.0]
    assert [h["dynamic_sampling/rounds"] for h in logged] == [2.0, 2.0]
    assert [h["dynamic_sampling/kept_frac"] for h in logged] == [0.0, 0.0]
    assert sum("dynamic_sampling:" in r.getMessage() for r in caplog.records) == 1  # one warning per run


DDP_SCRIPT = """
import json, os, sys
root, path, out = sys.argv[1:4]
sys.path[:0] = [root, os.path.join(root, "tests")]
from grpokit.model_loader import import_backend
import_backend("transformers")
from test_advantages import Recorder, _record, _trainer
from grpokit.advantages import run_state

trainer = _trainer(path, out, Recorder(flat=("Hi", "colour")), {"dynamic_sampling": True,
                   "baseline_type": "exponential_moving_average"}, steps=3, per_device_train_batch_size=4)
generated = _record(trainer, "_generate_and_score_completions")
trainer.train()
tokenizer = trainer.processing_class
report = {
    "step": trainer.state.global_step,
    "logged": [{k: v for k, v in h.items() if k.startswith("dynamic_sampling/")} for h in trainer.state.log_history
               if "dynamic_sampling/rounds" in h],
    "rows": [out["prompt_ids"].shape[0] for _, out in generated],
    "prompts": [tokenizer.batch_decode(out["prompt_ids"], skip_special_tokens=True) for _, out in generated],
    "ema": run_state(trainer).to_json()["ema_baselines"],
}
with open(os.path.join(out, f"rank{trainer.accelerator.process_index}.json"), "w") as f:
    json.dump(report, f)
"""


@pytest.mark.slow
def test_dynamic_sampling_under_two_processes(tiny_model_dir, tmp_path):  # noqa: F811 - the fixture
    """torchrun, 2 CPU processes (gloo), one group per process: the ranks run the same number of rounds, each keeps
    a batch of TRL's shape without the zero-variance prompts, and the EMA baselines agree."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from conftest import ROOT

    script = tmp_path / "ddp_dynamic_sampling.py"
    script.write_text(DDP_SCRIPT)
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(script), str(ROOT),
                             str(tiny_model_dir), str(tmp_path / "out")], env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] == 3
    assert ranks[0]["logged"] == ranks[1]["logged"] and len(ranks[0]["logged"]) == 3
    assert any(h["dynamic_sampling/rounds"] >= 1 for h in ranks[0]["logged"])
    for rank in ranks:
        assert rank["rows"] == [4, 4, 4]
        for prompts in rank["prompts"]:
            assert not any("Hi" in p.split("user")[-1] or "colour" in p for p in prompts), prompts
    assert ranks[0]["ema"] == pytest.approx(ranks[1]["ema"])

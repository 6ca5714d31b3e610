"""Adaptive group size (grpokit/group_schedule.py): the schedule, its parse-time checks, `--dry-run`, and real TRL
runs on a tiny random Llama (the embedded model's tokenizer) whose generation rounds really hold size-g groups,
before and after a resume."""

import json

import pytest
from conftest import make_tiny_model
from test_mixed_loss import _length_reward, _lora_model

from config.errors import UsageError
from grpokit.group_schedule import GroupSchedule, ScheduledGroupSampler, valid_group_sizes


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def _schedule(sizes, kind="linear", steps=4, batch=8, generate_every=1, accumulation=1):
    return GroupSchedule(tuple(sizes), kind, steps, batch, generate_every, accumulation)


def test_valid_sizes_divide_the_generation_batch():
    assert valid_group_sizes(8) == [2, 4, 8] and valid_group_sizes(12) == [2, 3, 4, 6, 12]


@pytest.mark.parametrize(
    "schedule, per_step",
    [
        (_schedule([2, 4]), [2, 2, 4, 4]),  # the brief's case: linear over 2..4 with a batch of 8 visits 2 and 4
        (_schedule([4, 8, 16], steps=9, batch=16), [4, 4, 8, 8, 8, 8, 16, 16, 16]),  # the guide's 4 -> 16, nearest
        (_schedule([2, 4, 8], "stages", steps=6), [2, 2, 4, 4, 8, 8]),  # an equal share per size
        (_schedule([4]), [4, 4, 4, 4]),  # min == max: constant
        (_schedule([2, 4], steps=1), [2]),  # one step: the min
    ],
)
def test_schedule_per_step(schedule, per_step):
    assert [schedule.size_at_step(s) for s in range(schedule.total_steps)] == per_step


def test_rounds_follow_the_step_they_start_in():
    # num_iterations 2 (one generation per 2 optimizer steps): a round takes the size of its first step
    schedule = _schedule([2, 4], steps=4, generate_every=2)
    assert schedule.rounds() == 2 and [schedule.size_for_round(r) for r in range(2)] == [2, 4]
    assert schedule.changes() == {1: 2, 3: 4}


def test_sampler_yields_whole_groups_from_a_stream_of_permutations():
    schedule = _schedule([2, 4], steps=4)
    sampler = ScheduledGroupSampler(6, schedule, repeat_count=2, seed=3)
    indices = list(sampler)
    assert len(indices) == len(sampler) == 4 * 2 * 8
    rounds = [indices[i:i + 16] for i in range(0, len(indices), 16)]
    prompts = []
    for round_index, chunk in enumerate(rounds):
        size = schedule.size_for_round(round_index)
        assert chunk[:8] == chunk[8:]  # repeated for each micro-step of the round, as TRL's RepeatSampler does
        groups = [chunk[i:i + size] for i in range(0, 8, size)]
        assert all(len(set(g)) == 1 for g in groups)
        prompts += [g[0] for g in groups]
    assert sorted(prompts[:6]) == list(range(6))  # 4 + 4 + 2 + 2 prompts: the first 6 are one permutation
    assert list(ScheduledGroupSampler(6, schedule, repeat_count=2, seed=3)) == indices  # a function of the seed


# ---- parse time ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["min_group_size=3", "max_group_size=4"],
         "'min_group_size' 3 does not divide the generation batch of 8 completions .* valid group sizes are 2, 4, 8."),
        (["min_group_size=2", "max_group_size=16"], "'max_group_size' 16 does not divide .* are 2, 4, 8."),
        (["min_group_size=4", "max_group_size=2"], "'min_group_size' 4 is larger than 'max_group_size' 2"),
        (["min_group_size=2", "max_group_size=4", "max_steps=-1"], "set max_steps"),
    ],
)
def test_a_schedule_the_batch_cannot_hold_is_refused_at_parse_time(overrides, message):
    from config.loader import build_config

    base = ["adaptive_group_size=true", "per_device_train_batch_size=8", "num_generations=4", "max_steps=10"]
    with pytest.raises(UsageError, match=message):
        build_config(preset=None, overrides=base + overrides)
    # the generation batch counts accumulation and steps_per_generation: 8 x 2 holds 16
    build_config(preset=None, overrides=base + ["min_group_size=2", "max_group_size=16",
                                                "gradient_accumulation_steps=2"])


def test_both_loss_weights_zero_is_refused():
    from config.loader import build_config

    with pytest.raises(UsageError, match="both 0: nothing would be trained"):
        build_config(preset=None, overrides=["grpo_loss_weight=0"])
    with pytest.raises(UsageError, match="'sft_loss_weight' must be >= 0"):
        build_config(preset=None, overrides=["sft_loss_weight=-1"])


def test_dry_run_shows_the_schedule(cli, tmp_path):
    code, out, err = cli("--quick-test", "--dry-run", "--max-steps", "10", "--output-dir", str(tmp_path),
                         "--set", "adaptive_group_size=true", "--set", "min_group_size=2", "--set", "max_group_size=8")
    assert code == 0, err
    document = json.loads(out[out.index("{"):])
    assert document["group_size_schedule"] == {"1": 2, "3": 4, "8": 8}
    code, _, err = cli("--quick-test", "--dry-run", "--output-dir", str(tmp_path), "--set", "adaptive_group_size=true",
                       "--set", "min_group_size=3", "--set", "max_group_size=8")
    assert code == 2 and "valid group sizes are 2, 4, 8" in err


# ---- real runs -----------------------------------------------------------------------------------------------------


def _prompts(n=16):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Question number {i}?"}]} for i in range(n)])


def _trainer(path, out, steps=4, save_steps=0):
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from grpo_trainer import GRPOConfig as RunConfig
    from grpokit.group_schedule import schedule_from_config
    from grpokit.trl_trainer import TRLGRPOTrainer

    class Recording(TRLGRPOTrainer):
        """Keeps what each generation round held: its prompts and the advantages TRL computed for them."""

        rounds: list

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            self.rounds.append(([row["prompt"][0]["content"] for row in inputs], self.num_generations,
                                output["advantages"].clone()))
            return output

    run = RunConfig(adaptive_group_size=True, min_group_size=2, max_group_size=4, per_device_train_batch_size=8,
                    num_generations=2, max_steps=steps)
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=8, num_generations=2, max_completion_length=4,
                      max_steps=steps, learning_rate=5e-3, seed=0, report_to="none", use_cpu=True, bf16=False,
                      gradient_checkpointing=False, logging_steps=1,
                      save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500)
    trainer = Recording(model=_lora_model(path), processing_class=AutoTokenizer.from_pretrained(path),
                        reward_funcs=_length_reward, args=args, train_dataset=_prompts())
    trainer.rounds = []
    trainer.group_schedule = schedule_from_config(run)
    return trainer


def test_a_run_grows_its_groups_and_resumes_on_schedule(tiny_model_dir, tmp_path):
    import torch

    trainer = _trainer(tiny_model_dir, tmp_path, steps=4, save_steps=2)
    trainer.train()
    assert [h["group_size"] for h in trainer.state.log_history if "group_size" in h] == [2, 2, 4, 4]
    seen = []
    for prompts, size, advantages in trainer.rounds:
        # 8 completions: 8 / size prompts, each `size` times in a row, and TRL normalised rewards within those groups
        groups = [prompts[i:i + size] for i in range(0, 8, size)]
        assert len(prompts) == 8 and all(len(set(g)) == 1 for g in groups) and len({g[0] for g in groups}) == 8 // size
        torch.testing.assert_close(advantages.view(-1, size).sum(1), torch.zeros(8 // size), atol=1e-4, rtol=0)
        seen += [g[0] for g in groups]
    assert len(set(seen)) == 4 + 4 + 2 + 2  # 12 of the 16 prompts, none twice
    assert trainer.num_generations_eval == 2  # evaluation keeps num_generations

    # Resume from step 2: the same rounds 3 and 4 (prompts and group size) as the uninterrupted run.
    resumed = _trainer(tiny_model_dir, tmp_path, steps=4)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert [(p, s) for p, s, _ in resumed.rounds] == [(p, s) for p, s, _ in trainer.rounds[2:]]
    assert [h["group_size"] for h in resumed.state.log_history if "group_size" in h] == [2, 2, 4, 4]
    assert [h["step"] for h in resumed.state.log_history if "group_size" in h][-2:] == [3, 4]


@pytest.mark.slow
def test_cli_run_on_the_embedded_model_with_both_options(tmp_path):
    """The real CLI on the embedded SmolLM2 (Unsloth's CPU backend): the source recipe's 1.0 SFT / 0.5 GRPO on the
    built-in sums while the groups grow 2 -> 4; the log has both per step."""
    from conftest import train_cli

    out = tmp_path / "out"
    command = ["--quick-test", "--max-steps", "2", "--output-dir", str(out),
               "--disable-generation-logging", "--set", "adaptive_group_size=true", "--set", "min_group_size=2",
               "--set", "max_group_size=4", "--set", "sft_loss_weight=1.0", "--set", "grpo_loss_weight=0.5",
               "--set", "eval_fraction=0", "--set", "save_steps=0", "--no-4bit", "--set", "max_completion_length=6",
               "--set", "max_eval_samples=2"]
    result = train_cli(*command, cwd=tmp_path)  # from another directory than the checkout
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [h for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "group_size" in h]
    assert [h["group_size"] for h in steps] == [2, 4]
    assert all(h["sft_loss"] > 0 for h in steps)
    header = " ".join((result.stdout + result.stderr).split())  # the console wraps long lines
    assert "4 -> 2 prompts x 2 -> 4 completions (linear) per step" in header  # 8 completions per step
    # grpo_training.log's step lines carry the group size; the report's settings show the schedule, not one size
    step_lines = [line for line in (out / "grpo_training.log").read_text().splitlines()
                  if (" step 1: " in line or " step 2: " in line) and " loss=" in line]
    assert [("group_size=2" in line, "group_size=4" in line) for line in step_lines] == [(True, False), (False, True)]
    assert "2 -&gt; 4 (linear; evaluation 4)" in (out / "report.html").read_text()

"""End to end: the real CLI, the embedded SmolLM2 through Unsloth's CPU backend, real TRL GRPO, a few steps.

One run serves many assertions (each CLI run costs ~40 s on 2 cores), so the runs are module-scoped fixtures.
"""

import hashlib
import json
import re
from pathlib import Path

import pytest
from conftest import train_cli

pytestmark = pytest.mark.slow


def run_cli(*args, env_extra=None, timeout=900):
    return train_cli(*args, env={"WANDB_MODE": "offline", **(env_extra or {})}, timeout=timeout)


def embedded_weights() -> Path:
    from grpokit.model_loader import embedded_model_dir

    return embedded_model_dir() / "model.safetensors"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def multi_run(tmp_path_factory):
    """2 steps, evaluation after each, multi rewards (math preset: accuracy, format, length), W&B offline."""
    out = tmp_path_factory.mktemp("multi") / "run"
    base_hash_before = sha(embedded_weights())
    result = run_cli("--quick-test", "--max-steps", "2", "--eval-steps", "1", "--reward-function", "multi",
                     "--reward-preset", "math", "--max-generation-samples", "3", "--output-dir", str(out),
                     "--wandb-project", "grpo-tests", "--run-name", "e2e", "--set", "save_steps=1",
                     "--set", "eval_pass_k=2", "--set", "best_metric=greedy_reward", "--set", "max_eval_samples=4",
                     env_extra={"WANDB_DIR": str(out.parent)})
    return out, result, base_hash_before


def test_run_exits_0_and_prints_a_summary(multi_run):
    out, result, _ = multi_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert "GRPO run finished" in result.stderr
    assert "held-out prompts: " in result.stderr and " at step 0 -> " in result.stderr
    assert re.search(r"better on \d+, worse on \d+, same on \d+ of 3 prompts", result.stderr), result.stderr[-2000:]


def test_adapter_trained_and_base_weights_untouched(multi_run):
    from safetensors.torch import load_file

    out, result, base_hash_before = multi_run
    adapter = load_file(out / "adapter_model.safetensors")
    assert adapter and all("lora_" in key for key in adapter)  # only LoRA weights are saved
    # LoRA B matrices start at zero: any non-zero B means training changed the adapter
    assert any(t.abs().sum() > 0 for k, t in adapter.items() if "lora_B" in k)
    assert sha(embedded_weights()) == base_hash_before
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 16


def test_expected_files_exist(multi_run):
    out, _, _ = multi_run
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer_config.json", "trainer_state.json",
                 "metrics_summary.json", "grpo_training.log", "checkpoint-2/trainer_state.json",
                 "plots/reward.png", "plots/learning_rate.png", "plots/completion_length.png"):
        assert (out / name).exists(), name
    summary = json.loads((out / "metrics_summary.json").read_text())
    assert summary["global_step"] == 2 and summary["backend"] == "unsloth"


def test_pass_at_k_reported_for_verifiable_data(multi_run):
    out, _, _ = multi_run
    summary = json.loads((out / "metrics_summary.json").read_text())
    assert 0.0 <= summary["generation_eval"]["pass@1"] <= summary["generation_eval"]["pass@2"] <= 1.0
    # also before training: the figure training must beat, in the summary and in the log at step 0
    assert 0.0 <= summary["generation_eval"]["baseline_pass@1"] <= summary["generation_eval"]["baseline_pass@2"] <= 1.0
    assert "Step 0: pass@1 " in (out / "grpo_training.log").read_text()


def test_best_checkpoint_is_tracked_by_the_named_metric(multi_run):
    """best_metric=greedy_reward: the generation log's greedy reward picks the checkpoint, best_checkpoint.json says
    which, with the value its generation log has."""
    out, _, _ = multi_run
    summary = json.loads((out / "metrics_summary.json").read_text())
    greedy = {}
    for step in (1, 2):
        entries = json.loads((out / "generation_logs" / f"generation_log_step_{step}.json").read_text())
        greedy[step] = sum(e["reward_total"] for e in entries) / len(entries)
    best_step = max(greedy, key=lambda step: (greedy[step], -step))  # the first step reaching the best value
    assert summary["best_checkpoint"].endswith(f"checkpoint-{best_step}")
    assert summary["best_metric"] == pytest.approx(greedy[best_step])
    record = json.loads((out / "best_checkpoint.json").read_text())
    assert record["metric"] == "greedy_reward" and record["step"] == best_step
    assert record["value"] == pytest.approx(greedy[best_step]) and record["checkpoint"] == summary["best_checkpoint"]
    assert "eval_reward" in summary["eval"]  # TRL's sampled eval metrics are still reported


def test_eval_only_on_a_saved_adapter_leaves_it_unchanged(multi_run):
    """One evaluation-only run on the saved adapter (each CLI run costs ~20 s), with the settings of a run that keeps
    its best checkpoint (the sft_grpo_qa preset's load_best_model_at_end): the evaluation saves nothing, so there is
    no best checkpoint to reload, and transformers' refusal of load_best_model_at_end without saves must not reach
    it; the adapter and the run's checkpoints stay as they were."""
    out, _, _ = multi_run
    before = sha(out / "adapter_model.safetensors")
    checkpoints = sorted(p.relative_to(out) for p in out.rglob("checkpoint-*"))
    result = run_cli("--quick-test", "--reward-preset", "math", "--eval-only", "--resume-from-checkpoint", str(out),
                     "--output-dir", str(out), "--max-generation-samples", "2", "--set", "max_eval_samples=2",
                     "--eval-steps", "1", "--set", "save_steps=1", "--set", "best_metric=greedy_reward",
                     "--set", "load_best_model_at_end=true")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sha(out / "adapter_model.safetensors") == before
    assert sorted(p.relative_to(out) for p in out.rglob("checkpoint-*")) == checkpoints  # nothing saved
    eval_dir = out / "eval_only" / f"{out.name}-step_2"
    entries = json.loads((eval_dir / "generation_log_step_2.json").read_text())
    assert len(entries) == 2 and entries[0]["global_step"] == 2
    metrics = json.loads((eval_dir / "eval_metrics.json").read_text())
    assert metrics["global_step"] == 2
    assert "eval_reward" in metrics["eval"] and "eval_rewards/reward_total/mean" in metrics["eval"]  # single mode
    assert "reward_mean" in metrics["generation_log"]  # the greedy generation log ran too


def test_multi_logs_one_metric_per_component(multi_run):
    out, _, _ = multi_run
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    train_logs = [h for h in history if "reward" in h]
    assert len(train_logs) == 2
    for name in ("accuracy", "format", "length"):
        assert f"rewards/{name}/mean" in train_logs[0]
    assert any("eval_reward" in h for h in history)


def test_generation_logs_at_baseline_and_every_evaluation(multi_run):
    out, _, _ = multi_run
    files = sorted((out / "generation_logs").glob("generation_log_step_*.json"))
    assert [f.name for f in files] == [f"generation_log_step_{n}.json" for n in (0, 1, 2)]
    for eval_step, file in enumerate(sorted(files, key=lambda f: int(f.stem.rsplit("_", 1)[1]))):
        entries = json.loads(file.read_text())
        assert len(entries) == 3  # --max-generation-samples 3
        for i, entry in enumerate(entries):
            assert entry["eval_step"] == eval_step and entry["sample_index"] == i
            assert entry["global_step"] == int(file.stem.rsplit("_", 1)[1])
            assert entry["full_response"].endswith(entry["generated"])
            assert set(entry["rewards"]) == {"accuracy", "format", "length"}
            assert isinstance(entry["truncated"], bool) and entry["completion_tokens"] >= 0
    # the same prompts every time, so steps are comparable
    prompts = [[e["prompt"] for e in json.loads(f.read_text())] for f in files]
    assert prompts[0] == prompts[1] == prompts[2]


def test_training_log_file_has_config_steps_and_saves(multi_run):
    out, _, _ = multi_run
    text = (out / "grpo_training.log").read_text()
    for needle in ("Config (preset quick_test)", "Backend: unsloth", "step 1:", "step 2:", "Saved checkpoint",
                   "Generation log step 0"):
        assert needle in text, needle


def test_wandb_offline_run_has_config_and_generation_table(multi_run):
    out, _, _ = multi_run
    runs = list((out.parent / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    records = next(runs[0].glob("run-*.wandb")).read_bytes()  # offline runs keep config and history here
    assert b"num_generations" in records  # TRL's GRPOConfig
    assert b"grpo_cli" in records and b"reward_config_name" in records  # our effective config
    tables = list((runs[0] / "files" / "media" / "table").rglob("*.table.json"))
    assert len(tables) == 3  # baseline + 2 evaluations
    table = json.loads(tables[0].read_text())
    assert "generated" in table["columns"] and len(table["data"]) == 3


@pytest.fixture(scope="module")
def fallback_run(tmp_path_factory):
    """The transformers + PEFT path (as when Unsloth cannot import), without generation logging."""
    out = tmp_path_factory.mktemp("fallback") / "run"
    result = run_cli("--quick-test", "--max-steps", "1", "--backend", "transformers", "--no-4bit",
                     "--disable-generation-logging", "--output-dir", str(out), "--set", "save_steps=0",
                     "--save-merged")
    return out, result


def test_transformers_fallback_trains_on_cpu(fallback_run):
    out, result = fallback_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Model loaded in" in result.stderr and "(transformers, CPU" in result.stderr  # the console's one line
    assert "Backend: transformers" in (out / "grpo_training.log").read_text()  # the detail, in the log file
    assert json.loads((out / "metrics_summary.json").read_text())["global_step"] == 1


def test_save_merged_writes_a_loadable_16bit_model(fallback_run):
    from transformers import AutoModelForCausalLM

    out, _ = fallback_run
    merged = AutoModelForCausalLM.from_pretrained(out / "merged_16bit")
    assert not any("lora" in name for name, _ in merged.named_parameters())
    assert (out / "merged_16bit" / "tokenizer_config.json").exists()


def test_disabled_generation_logging_writes_none(fallback_run):
    out, _ = fallback_run
    assert not (out / "generation_logs").exists()


def test_a_run_that_learned_nothing_says_why(tmp_path):
    """Every completion cut at 1 token, none can hold a two-digit sum: every group's rewards are identical, the
    adapter stays at zero, and the run's last word names the cause and the fix, not only 'check rewards'."""
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                            for a, b in [(45, 38), (27, 61), (53, 29), (34, 47), (66, 25), (18, 73), (52, 39),
                                         (41, 44)]))
    result = run_cli("--quick-test", "--custom-data", str(data), "--max-steps", "2", "--output-dir",
                     str(tmp_path / "run"), "--no-wandb", "--set", "max_completion_length=1",
                     "--set", "max_eval_samples=2", "--max-generation-samples", "2", "--set", "save_steps=0")
    assert result.returncode == 0, result.stderr[-3000:]
    said = " ".join((result.stdout + result.stderr).split())
    assert "nothing was learned (in all 2 steps every group's completions got identical rewards" in said, said[-3000:]
    assert "100% of the completions were cut at max_completion_length 1" in said
    assert "--set max_completion_length=2" in said

"""Our run through the GRPOConfig / GRPOTrainer classes Unsloth generates for a GPU, on this CPU.

tests/fixtures/unsloth_generated_trainer.py imports `unsloth.models.rl` (the generator; it needs the real `triton`
package, which `make test` installs into .venv/triton-cpu) so that `trl.GRPOTrainer` is Unsloth's generated
`UnslothGRPOTrainer` exactly as on a GPU, then runs the CLI twice in that interpreter: 2 steps of the default path
(Unsloth, 4-bit LoRA) on a tiny random Llama, then a one-step calculator tool run. Substituted for a GPU run: Unsloth's CPU model loader instead of its CUDA kernels, the llama.cpp
sampler instead of vLLM / generate. Every method of ours meets the generated code's real signatures, keywords,
batch keys and return shapes, so a mismatch fails here, not on a user's GPU. When the generator stops replacing
TRL's trainer, the test fails and says so: it never passes on TRL's own classes.
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, make_tiny_model, train_cli

pytestmark = pytest.mark.slow

TRITON_DIR = ROOT / ".venv" / "triton-cpu"
DRIVER = ROOT / "tests" / "fixtures" / "unsloth_generated_trainer.py"


@pytest.fixture(scope="module")
def generated_run(tmp_path_factory):
    if not (TRITON_DIR / ".installed").exists():
        pytest.fail(f"triton is not in {TRITON_DIR}: `make test` installs it (make {TRITON_DIR.relative_to(ROOT)})")
    work = tmp_path_factory.mktemp("generated")
    model = make_tiny_model(work / "tiny-llama")
    out = work / "run"
    # then the tool run (test_a_tool_run_through_the_generated_trainer), in the same interpreter
    tool_run = ["--quick-test", "--model", str(model), "--max-steps", "1", "--output-dir", str(work / "tool-run"),
                "--no-wandb", "--tool", "calculator", "--set", "max_completion_length=8", "--set", "max_eval_samples=2",
                "--set", "max_generation_samples=2", "--set", "save_steps=0"]
    # All-truncated completions (a random model never samples EOS in 8 tokens): with Unsloth's DAPO rewrite
    # (mask_truncated_completions=True) no completion would get a gradient. Half the prompts have flat groups,
    # which dynamic sampling drops and refills: batches of several rounds are merged, max_left_pad included. The
    # sums' prompts differ in length (a round's prompt width and left padding differ from the next one's) and beta
    # 0.04 scores reference log-probs, which a merge must keep in Unsloth's frame (MERGE_CHECK: the driver's check).
    command = [sys.executable, str(DRIVER), "--quick-test", "--model", str(model), "--max-steps", "2",
               "--output-dir", str(out), "--no-wandb", "--reward", "tests.fixtures.user_rewards:length_on_odd_prompts",
               "--custom-data", str(ROOT / "tests" / "fixtures" / "sums_varied_prompts.jsonl"),
               "--set", "max_completion_length=8", "--set", "dynamic_sampling=true", "--set", "beta=0.04",
               "--set", "dynamic_sampling_max_rounds=2", "--set", "max_eval_samples=4",
               "--set", "max_generation_samples=4", "--set", "save_steps=0", "--then", *tool_run]
    # CI=1: torch then raises on an aliasing custom op where it otherwise warns (Unsloth's memory-planned loss)
    env = {**os.environ, "CI": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "MERGE_CHECK": str(work / "merges.jsonl"),
           "PYTHONPATH": os.pathsep.join([str(TRITON_DIR), str(ROOT)])}
    # cwd: Unsloth writes the generated sources into ./unsloth_compiled_cache
    result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    return result, out


def test_the_generated_trainer_runs_our_run(generated_run):
    result, out = generated_run
    said = next((line for line in result.stdout.splitlines() if line.startswith("generated: ")), "")
    assert "generated: UnslothGRPOTrainer" in said and "unsloth_compiled_cache" in said, (
        "Unsloth's generator no longer replaces TRL's GRPOTrainer with its generated class: read "
        f"unsloth/models/rl.py and update this test and grpokit/objective.py\n{result.stdout[-2000:]}"
        f"{result.stderr[-3000:]}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2


def test_the_generated_config_trains_the_stated_objective(generated_run):
    """Unsloth's generated GRPOConfig fills in loss settings of its own (an explicit 'dapo' gets the DAPO paper's
    mask_truncated_completions=True and epsilon_high=0.28, 'cispo' epsilon_high=5.0, 'dr_grpo' scale_rewards 'none');
    the run hands every setting over explicitly and puts back what is still changed, so the GPU trains what a CPU
    run and --dry-run state."""
    result, out = generated_run
    assert result.returncode == 0, result.stderr[-3000:]
    said = next(line for line in result.stdout.splitlines() if line.startswith("configs: "))
    configs = json.loads(said.removeprefix("configs: "))
    # What the generator does with TRL's bare keywords (when this changes, the generator moved: revisit
    # grpokit/objective.py's docstring and these figures).
    assert (configs["dapo"]["bare"]["mask_truncated_completions"], configs["dapo"]["bare"]["epsilon_high"]) == \
        (True, 0.28)
    assert configs["cispo"]["bare"]["epsilon_high"] == 5.0
    assert configs["dr_grpo"]["bare"]["scale_rewards"] == "none"
    # What the run gets: TRL's own values (the quick test's epsilon 0.2, scale_rewards 'group', no masking)
    for loss_type, seen in configs.items():
        assert seen["run"]["loss_type"] == loss_type
        assert (seen["run"]["mask_truncated_completions"], seen["run"]["epsilon_high"], seen["run"]["scale_rewards"]
                ) == (False, 0.2, "group"), (loss_type, seen)
    assert configs["dr_grpo"]["put_back"] == ["scale_rewards: 'none' -> 'group'"]
    assert configs["dapo"]["put_back"] == [] and configs["cispo"]["put_back"] == []

    # The run's trainer reads the stated values, and --dry-run of its run_config.json states the same
    objective = json.loads((out / "run_config.json").read_text())["objective"]
    dry = train_cli("--config", str(out / "run_config.json"), "--dry-run", timeout=120)
    assert dry.returncode == 0, dry.stderr[-2000:]
    stated = json.loads(dry.stdout)["objective"]
    assert objective["mask_truncated_completions"] is False and objective["epsilon_high"] == 0.2
    # the dry run states the sampler correction for either CPU engine; the run says the one it used (llama.cpp)
    assert objective["sampler_correction"] == "sequence_mask, ratio in [0, 3.0]"
    assert stated["sampler_correction"].startswith(objective["sampler_correction"] + " where llama_cpp samples")
    assert {k: v for k, v in objective.items() if k != "sampler_correction"} == \
           {k: v for k, v in stated.items() if k != "sampler_correction"}
    # every completion was truncated, so under the DAPO rewrite nothing would have trained: the LoRA B matrices moved
    from safetensors.torch import load_file

    weights = load_file(out / "adapter_model.safetensors")
    assert any(float(t.abs().max()) > 0 for name, t in weights.items() if "lora_B" in name)


def test_dynamic_sampling_merges_the_generated_trainers_batches(generated_run):
    """Unsloth's batches carry max_left_pad ([rows, 1]); merged rounds keep it instead of turning dynamic sampling off."""
    result, out = generated_run
    assert result.returncode == 0, result.stderr[-3000:]
    log = (out / "grpo_training.log").read_text()
    assert "cannot merge" not in log
    rounds = [entry["dynamic_sampling/rounds"] for entry in json.loads((out / "trainer_state.json").read_text())
              ["log_history"] if "dynamic_sampling/rounds" in entry]
    assert rounds and max(rounds) >= 1, rounds


def test_a_tool_run_through_the_generated_trainer(generated_run):
    """A calculator run through UnslothGRPOTrainer: TRL's tool loop inside its generation, and tool_mask through its
    fused loss (unsloth_zoo's grpo_accumulated_loss aligns the tool mask with its left-packed frame)."""
    result, out = generated_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    state = json.loads((out.parent / "tool-run" / "trainer_state.json").read_text())
    assert any("tools/call_frequency" in entry for entry in state["log_history"])
    assert all("trajectory" in entry for entry in json.loads(
        (out.parent / "tool-run" / "generation_logs" / "generation_log_step_1.json").read_text()))


def test_merged_batches_keep_each_rows_log_probs_where_unsloths_loss_reads_them(generated_run):
    """Unsloth's no-grad pass returns old / reference log-probs left-packed (pads moved right), completion width +
    max_left_pad wide, and its fused loss reads them back in that frame (the width gives max_left_pad). A batch
    merged from rounds of other prompt widths and paddings must hold each row's values at its own tokens there: the
    driver sets every merged batch against the generated trainer's own pass over the merged rows (the same weights),
    on the tokens the loss scores. Merged as completion-aligned, rows were compared with another token's log-prob
    (~10 nats off; the logged KL 0.02 -> 0.65)."""
    result, out = generated_run
    assert result.returncode == 0, result.stderr[-3000:]
    checks = [json.loads(line) for line in (out.parent / "merges.jsonl").read_text().splitlines()]
    assert any(check["key"] == "ref_per_token_logps" and len(check["frames"]) > 1 for check in checks), checks
    for check in checks:
        assert check["shape"] == check["again"], check
        assert max(check["row_max_diff"]) < 1e-3, check

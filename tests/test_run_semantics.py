"""Resume means continue (never redo or overrun), an extended run trains at the rate it logs, the baseline is the
run's real step 0, and an "eval" on training prompts says so. Real CLI, embedded model, 16-bit weights."""

import hashlib
import json

import pytest
from test_e2e import run_cli

pytestmark = pytest.mark.slow

ROWS = [{"question": f"What is {a} + {b}? Answer with just the number.", "answer": str(a + b)}
        for a, b in ((1, 2), (3, 4), (2, 2), (5, 1), (0, 7), (4, 4))]


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """2 steps on a 6-row file (too small for a held-out split), checkpoints at 1 and 2."""
    root = tmp_path_factory.mktemp("semantics")
    data = root / "six.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = root / "run"
    args = ("--quick-test", "--no-4bit", "--custom-data", str(data), "--max-generation-samples", "2",
            "--set", "save_steps=1", "--output-dir", str(out))
    result = run_cli(*args, "--max-steps", "2")
    return out, args, result


def test_an_eval_on_training_prompts_is_not_called_eval(finished_run):
    out, _, result = finished_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert "greedy reward on 2 TRAINING prompts" in result.stderr and "(no held-out split" in result.stderr
    assert "held-out" not in result.stderr.split("GRPO run finished")[1].split("TRAINING")[0]
    summary = json.loads((out / "metrics_summary.json").read_text())
    assert summary["generation_eval"]["held_out"] is False and summary["eval"] == {}
    entries = json.loads((out / "generation_logs" / "generation_log_step_0.json").read_text())
    assert {e["split"] for e in entries} == {"train"}


def test_resuming_a_finished_run_trains_nothing(finished_run):
    out, args, _ = finished_run
    adapter, state = sha(out / "adapter_model.safetensors"), (out / "trainer_state.json").read_text()
    result = run_cli(*args, "--max-steps", "2", "--resume-from-checkpoint", "latest")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the run is finished, nothing to train" in result.stderr and "raise --max-steps above 2" in result.stderr
    assert "checkpoint-2" in result.stderr  # the log names what 'latest' resolved to
    assert not (out / "checkpoint-3").exists() and (out / "checkpoint-1").exists()
    assert sha(out / "adapter_model.safetensors") == adapter and (out / "trainer_state.json").read_text() == state


def test_extending_a_run_trains_every_step_at_the_logged_rate(finished_run):
    out, args, _ = finished_run
    baseline = json.loads((out / "metrics_summary.json").read_text())["generation_eval"]["baseline"]
    result = run_cli(*args, "--max-steps", "4", "--resume-from-checkpoint", "latest")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Extending the run from 2 to 4 steps" in result.stderr
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    rates = {h["step"]: h["learning_rate"] for h in history if "learning_rate" in h}
    # Linear decay re-planned for 4 steps from step 2: step 3 trains at 2e-4 * (1 - 2/4), step 4 at 2e-4 * (1 - 3/4)
    assert rates[3] == pytest.approx(2e-4 * 2 / 4) and rates[4] == pytest.approx(2e-4 * 1 / 4)
    summary = json.loads((out / "metrics_summary.json").read_text())
    assert summary["global_step"] == 4 and summary["resumed_from"].endswith("checkpoint-2")
    # "before training" is the run's real step-0 figure, not the resumed process's first log
    assert summary["generation_eval"]["baseline"] == baseline and summary["generation_eval"]["baseline_step"] == 0

"""Ctrl-C as a user presses it, in a real run on the embedded model: during the final evaluation (the run finished:
exit 130, the adapter saved and labelled with its step, never "resume"), and twice during training (stopped at once,
with a line naming the checkpoint that holds the work)."""

import json

import pytest
from conftest import train_cli

RUN = ["--quick-test", "--no-4bit", "--max-steps", "2", "--seed", "7", "--disable-generation-logging",
       "--set", "per_device_train_batch_size=4", "--set", "num_generations=2", "--set", "save_total_limit=0",
       "--set", "max_eval_samples=4"]


def run(*args):
    return train_cli(*args)


@pytest.mark.slow
def test_ctrl_c_during_the_final_evaluation_keeps_the_finished_run(tmp_path):
    out = tmp_path / "run"
    result = run(*RUN, "--output-dir", str(out), "--reward", "tests.fixtures.flaky_rewards:interrupt_final_eval")
    assert result.returncode == 130, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "SIGINT during the final evaluation: training finished at step 2" in last
    assert f"--eval-only --resume-from-checkpoint {out}" in last
    assert "resume with" not in result.stderr and "Run failed" not in result.stderr and "Traceback" not in result.stderr
    assert (out / "adapter_model.safetensors").exists()
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2
    assert json.loads((out / "run_config.json").read_text())["max_steps"] == 2  # the finished run's config
    # the line's own advice works, and the adapter is labelled with the step it was trained to (not step 0)
    evaluated = run(*RUN, "--output-dir", str(out), "--eval-only", "--resume-from-checkpoint", str(out))
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert (out / "eval_only" / "run-step_2" / "eval_metrics.json").exists()
    assert f"adapter: {out} (step 2)" in " ".join((evaluated.stdout + evaluated.stderr).split())


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_and_says_where_the_work_is(tmp_path):
    out = tmp_path / "run"
    result = run(*RUN, "--output-dir", str(out), "--set", "save_steps=1", "--set", "eval_fraction=0",
                 "--reward", "tests.fixtures.flaky_rewards:interrupt_twice")
    assert result.returncode == 130, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "SIGINT again at step 2: stopped at once, that step not saved" in last
    assert f"the latest checkpoint is {out / 'checkpoint-1'}" in last and "Traceback" not in result.stderr
    assert not (out / "checkpoint-2").exists()

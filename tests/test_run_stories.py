"""A run's account of itself is always true: a table of run stories, each checked against the files on disk.

Every story ends with the same check (`agrees_with_disk`): the exit code, the console summary, metrics_summary.json,
best_checkpoint.json and report.html say what trainer_state.json and the directory say. Real CLI, embedded model,
16-bit weights; the stories that must be refused are refused before a model loads (they take seconds).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from test_e2e import run_cli

ROWS = [{"question": f"What is {a} + {b}? Answer with just the number.", "answer": str(a + b)}
        for a, b in ((1, 2), (3, 4), (2, 2), (5, 1), (0, 7), (4, 4))]
QUICK = ("--quick-test", "--no-4bit", "--max-generation-samples", "2", "--set", "save_steps=1",
         "--set", "max_eval_samples=4")


def agrees_with_disk(out, result, code=0):
    """The story's files and words agree with trainer_state.json."""
    assert result.returncode == code, result.stderr[-3000:]
    state = json.loads((out / "trainer_state.json").read_text())
    summary = json.loads((out / "metrics_summary.json").read_text())
    step = state["global_step"]
    assert summary["global_step"] == step and f"steps: {step}" in result.stderr
    evals = [h for h in state["log_history"] if "eval_reward" in h]
    if evals:
        # one evaluation per step, and the summary's eval reward is the one at the final step
        assert len({h["step"] for h in evals}) == len(evals), evals
        final = [h for h in evals if h["step"] == step]
        assert len(final) == 1 and summary["eval"]["eval_reward"] == pytest.approx(final[0]["eval_reward"])
        assert f"eval reward (sampled, held-out split): {final[0]['eval_reward']:.3f}" in result.stderr
    assert summary["best_checkpoint"] == state["best_model_checkpoint"]
    if state["best_model_checkpoint"]:
        best = json.loads((out / "best_checkpoint.json").read_text())
        assert best["checkpoint"] == state["best_model_checkpoint"]
        assert best["value"] == pytest.approx(state["best_metric"])
    logged = [h["train_seconds"] for h in state["log_history"] if "train_seconds" in h]
    assert logged and summary["train_seconds"] >= logged[-1]  # one training time, counted across resumes
    greedy = summary["generation_eval"]
    first = json.loads((out / "generation_logs" / "generation_log_step_0.json").read_text())
    assert greedy["baseline"] == pytest.approx(sum(e["reward_total"] for e in first) / len(first))
    checkpoints = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert checkpoints and checkpoints[-1] <= step
    page = (out / "report.html").read_text()
    assert any(text in page for text in (f"{greedy['final']:.3f}", f"{greedy['final']:.2f}", f"{greedy['final']:g}"))
    return state, summary


@pytest.fixture(scope="module")
def story_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("stories") / "run"


@pytest.mark.slow
def test_fresh_dir_and_an_eval_interval_longer_than_the_run(story_dir):
    """--eval-steps 50 on a 2-step run: the final evaluation runs once, and everything names its numbers."""
    result = run_cli(*QUICK, "--max-steps", "2", "--eval-steps", "50", "--output-dir", str(story_dir))
    agrees_with_disk(story_dir, result)
    assert "earlier run's files moved" not in result.stderr and not (story_dir / "previous_runs").exists()
    assert result.stderr.count("eval @ step 2") == 1
    assert "trained 2 steps in" not in result.stderr  # the summary's train time is the one training time


@pytest.mark.slow
def test_the_same_command_again_starts_clean_with_its_own_baseline(story_dir):
    before = json.loads((story_dir / "metrics_summary.json").read_text())
    result = run_cli(*QUICK, "--max-steps", "1", "--output-dir", str(story_dir))
    state, summary = agrees_with_disk(story_dir, result)
    previous = list((story_dir / "previous_runs").iterdir())
    assert len(previous) == 1 and (previous[0] / "checkpoint-2").is_dir()  # the earlier run, set aside whole
    assert json.loads((previous[0] / "metrics_summary.json").read_text()) == before
    assert state["global_step"] == 1 and not (story_dir / "checkpoint-2").exists()
    assert "earlier run's files moved to previous_runs/" in result.stderr
    # and the new run's own log says so too, though it was said before that log opened
    assert (story_dir / "grpo_training.log").read_text().count("earlier run's files moved to previous_runs/") == 1


@pytest.mark.slow
def test_an_unfinished_run_is_not_started_over_silently(story_dir, tmp_path):
    """Checkpoints but no summary: continuing is what a re-run most often means; refused with both fixes."""
    import shutil

    out = tmp_path / "unfinished"
    shutil.copytree(story_dir / "checkpoint-1", out / "checkpoint-1")
    started = time.perf_counter()
    result = run_cli(*QUICK, "--max-steps", "1", "--output-dir", str(out))
    assert result.returncode == 2 and "holds an unfinished run (newest checkpoint-1)" in result.stderr
    assert "--resume-from-checkpoint latest" in result.stderr and "--overwrite-output-dir" in result.stderr
    assert time.perf_counter() - started < 60  # refused before the model loads
    assert sorted(p.name for p in out.iterdir()) == [".grpo.lock", "checkpoint-1"]


@pytest.mark.parametrize("rows, args, message", [
    (ROWS[:1], ("--max-steps", "2"), "has 1 training prompt(s); one optimizer step takes 2"),
    (ROWS, ("--max-steps", "0"), "max_steps is 0: nothing would be trained"),
    (ROWS, ("--set", "max_steps=-1", "--epochs", "0.1"), "rounds to 0 steps"),
    (ROWS, ("--max-steps", "2", "--epochs", "1"), "both decide the run's length"),
])
def test_a_run_that_cannot_train_is_refused_before_loading(cli, tmp_path, rows, args, message):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, _, stderr = cli(*QUICK, "--custom-data", str(data), "--output-dir", str(tmp_path / "out"), *args)
    assert code == 2 and message in stderr and stderr.count("\n") == 1, stderr
    assert not (tmp_path / "out" / "trainer_state.json").exists()


def test_an_explicit_epochs_beats_the_presets_steps(cli):
    code, stdout, _ = cli("--quick-test", "--epochs", "2", "--dry-run")
    assert code == 0
    config = json.loads(stdout)["config"]
    assert config["max_steps"] == -1 and config["num_train_epochs"] == 2


@pytest.mark.slow
def test_a_signal_while_loading_ends_with_one_line_and_its_exit_code(tmp_path):
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "train_grpo.py", *QUICK, "--output-dir", str(out)], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "grpo_training.log").exists() and time.monotonic() < deadline:  # the log opens before loading
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == "stopped: SIGTERM before training started; nothing was trained."
    assert not list(out.glob("checkpoint-*")) and not (out / "metrics_summary.json").exists()


@pytest.mark.parametrize("phase, raises", [("training", False), ("evaluating", True), ("saving", False)])
def test_a_signal_is_handled_by_the_phase_it_lands_in(phase, raises):
    """Real signals to this process: training finishes the step (then checkpoints), the final evaluation is abandoned
    at once, the final save completes first; each remembers the signal for its one line and exit code."""
    import os

    from grpokit.run_end import GracefulStop, Stopped

    stop = GracefulStop()
    try:
        stop.phase = phase
        if raises:
            with pytest.raises(Stopped) as stopped:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)  # the handler runs between bytecodes: well before this returns
            assert stopped.value.exit_code == 143
        else:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
        assert stop.signal_name == "SIGTERM" and stop.exit_code == 143
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) != stop._handle  # the handlers in place before are back


def test_the_spec_reads_the_latest_runs_log_from_where_it_ran(tmp_path):
    """The spec's `tail -f grpo_training.log` / `grep "ERROR" grpo_training.log`: ./grpo_training.log links to the
    latest run's log; a user's own file of that name is never replaced."""
    from grpokit.run_dir import link_latest_log

    first, second = tmp_path / "a" / "grpo_training.log", tmp_path / "b" / "grpo_training.log"
    for path, text in ((first, "run a ERROR x\n"), (second, "run b\n")):
        path.parent.mkdir()
        path.write_text(text)
    here = tmp_path / "project"
    here.mkdir()
    assert link_latest_log(first, here) and (here / "grpo_training.log").read_text() == "run a ERROR x\n"
    assert link_latest_log(second, here) and (here / "grpo_training.log").read_text() == "run b\n"
    assert not link_latest_log(second, second.parent)  # the log itself is there: nothing to link
    own = tmp_path / "mine"
    own.mkdir()
    (own / "grpo_training.log").write_text("my notes\n")
    assert not link_latest_log(first, own) and (own / "grpo_training.log").read_text() == "my notes\n"
    assert sorted(p.name for p in here.iterdir()) == ["grpo_training.log"]  # no leftover partial link

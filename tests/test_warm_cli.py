"""The tests' warm CLI (tests/warm_cli.py) gives what a cold `python train_grpo.py` gives: the same exit code, stdout
and stderr, the run's files; it sends a run cold where a warm one could differ, and a timeout kills the whole run."""

import json
import os
import subprocess
import sys
import time

import pytest
import warm_cli
from conftest import ROOT


def cold(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "train_grpo.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_a_dry_run_and_a_refused_input_read_the_same_warm_and_cold(tmp_path):
    args = ["--quick-test", "--dry-run", "--set", "num_generations=2", "--output-dir", str(tmp_path / "o")]
    warm, reference = warm_cli.run(args), cold(*args)
    assert warm.returncode == reference.returncode == 0, warm.stderr[-2000:]
    assert json.loads(warm.stdout) == json.loads(reference.stdout)
    assert warm.stderr == reference.stderr
    assert warm.args == reference.args[:1] + [str(ROOT / "train_grpo.py")] + reference.args[2:]

    bad = ["--quick-test", "--dry-run", "--set", "loss_type=drgrpo", "--output-dir", str(tmp_path / "o")]
    warm, reference = warm_cli.run(bad), cold(*bad)
    assert warm.returncode == reference.returncode == 2
    assert (warm.stdout, warm.stderr) == (reference.stdout, reference.stderr)
    assert warm.stderr.startswith("error: ") and warm.stderr.count("\n") == 1, warm.stderr


def test_the_child_runs_in_the_requests_directory_with_its_environment(tmp_path):
    """A relative file name read from the request's working directory, and a variable a reward reads: the reward
    raises at its first call where FLAKY_FAIL_AT=1 says so, as in a cold run, and scores where it is unset."""
    (tmp_path / "rows.jsonl").write_text(json.dumps({"prompt": "What is 3 + 4?", "completion": "7", "answer": "7"})
                                         + "\n")  # rows the quick test's reward can score
    args = ["--quick-test", "--reward", "tests.fixtures.flaky_rewards:flaky", "--score-completions", "rows.jsonl"]
    for env in ({**os.environ, "FLAKY_FAIL_AT": "1"}, {k: v for k, v in os.environ.items() if k != "FLAKY_FAIL_AT"}):
        reference = subprocess.run([sys.executable, str(ROOT / "train_grpo.py"), *args], cwd=tmp_path, env=env,
                                   capture_output=True, text=True, timeout=300)
        warm = warm_cli.run(args, cwd=tmp_path, env=env)
        assert (warm.returncode, warm.stdout, warm.stderr) == (reference.returncode, reference.stdout,
                                                               reference.stderr)
        assert ("flaky reward broke on call 1" in warm.stderr) == ("FLAKY_FAIL_AT" in env), warm.stderr[-2000:]


def test_runs_are_sent_cold_where_a_warm_one_could_differ():
    assert warm_cli.flavour(["--quick-test"]) == "unsloth"
    assert warm_cli.flavour(["export", "run"]) == "plain"
    for args in (["--help"], ["--quick-test", "--verbose"], ["report", "run"], ["doctor"]):
        assert warm_cli.flavour(args) is None, args
    # a variable read at import time (OMP_NUM_THREADS: libgomp at load) differs from the warm interpreter's: cold
    assert "OMP_NUM_THREADS" not in warm_cli.RUN_TIME_VARIABLES


def test_a_transformers_backend_run_is_redone_cold_before_it_writes_anything(tmp_path):
    """The warm interpreter has imported Unsloth, which patches transformers: a run on the transformers backend
    would not be the run a user gets. The child sees the resolved backend and exits before its first file."""
    out = tmp_path / "o"
    args = ["--quick-test", "--dry-run", "--backend", "transformers", "--output-dir", str(out)]
    code, _, _ = warm_cli.warm("unsloth").run(args, ROOT, dict(os.environ), 300, None)
    assert code == warm_cli.REDO and not out.exists()
    result = warm_cli.run(args)
    assert result.returncode == 0 and json.loads(result.stdout)["config"]["backend"] == "transformers"


def test_a_timeout_kills_the_run_and_the_warm_interpreter_serves_the_next(tmp_path):
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        warm_cli.run(["--quick-test", "--max-steps", "1", "--output-dir", str(tmp_path / "o")], timeout=3)
    assert time.monotonic() - started < 60
    assert warm_cli.run(["--quick-test", "--dry-run", "--output-dir", str(tmp_path / "p")]).returncode == 0


def test_an_environment_goes_warm_only_where_the_imports_would_read_the_same():
    """What the warm interpreter started with, or what its imports set (this process has those too once a test
    imported Unsloth in it), or a variable read only at run time: warm, with the imports' variables added as a cold
    run's imports would add them. Anything else (a thread count, an import path): cold."""
    interpreter = object.__new__(warm_cli._Warm)  # its environment rule alone, no process
    interpreter.env = {"HF_HUB_OFFLINE": "1", "PATH": "/bin"}
    interpreter.imported = {**interpreter.env, "UNSLOTH_IS_PRESENT": "1", "TRANSFORMERS_VERBOSITY": "error"}
    assert interpreter.environment_for({"HF_HUB_OFFLINE": "1", "PATH": "/bin"}) == interpreter.imported
    after_import = {**interpreter.imported, "COLUMNS": "80", "FLAKY_FAIL_AT": "2"}
    assert interpreter.environment_for(after_import) == after_import
    for changed in ({"OMP_NUM_THREADS": "1"}, {"PYTHONPATH": "/x"}, {"HF_HUB_OFFLINE": "0"},
                    {"TRANSFORMERS_VERBOSITY": "info"}):
        assert interpreter.environment_for({**interpreter.env, **changed}) is None, changed
    assert interpreter.environment_for({"PATH": "/bin"}) is None  # HF_HUB_OFFLINE unset: read at import

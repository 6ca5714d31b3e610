"""Shared fixtures. Tests never touch the network: a hub call must fail fast, not hang."""

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import warm_cli

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `make test` runs the suite in two pytest-xdist workers (PYTEST_XDIST_WORKER set in each): each computes on one
# thread, its own and its CLI runs'. Two processes whose OpenMP pools each want both cores spin against each other:
# measured, a merged model's greedy pass in one worker took 296 s beside the other worker's runs, 60 s alone.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# ../shared/data beside the checkout (as in CI): real HH-RLHF and GSM8K rows, MIT licensed.
SHARED_DATA = ROOT.parent / "shared" / "data"
HH_FILE = SHARED_DATA / "hh-rlhf" / "harmless-base-test-head400.jsonl"
GSM8K_FILE = SHARED_DATA / "gsm8k" / "test.jsonl"


@pytest.fixture
def cli():
    """Invoke the real Typer app in-process; returns (exit_code, stdout, stderr)."""
    from typer.testing import CliRunner

    from train_grpo import app

    runner = CliRunner()

    def invoke(*args: str):
        result = runner.invoke(app, list(args), env={"COLUMNS": "250"})  # no truncated option names
        return result.exit_code, result.stdout, result.stderr

    return invoke


def train_cli(*args, cwd=ROOT, env=None, timeout=900, input=None) -> subprocess.CompletedProcess:
    """`python train_grpo.py *args` as a child process, offline, its output captured: warm where a warm interpreter
    gives what a cold one does (tests/warm_cli.py: ~7 s less per run), cold otherwise or with GRPO_TESTS_COLD=1.
    `env` adds to this process's environment."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **(env or {})}
    return warm_cli.run(args, cwd=cwd, env=env, timeout=timeout, input=input)


# `make test` gives each xdist worker whole test files (`--dist loadfile`: a file's module fixtures are made once), in
# collection order: the longest files start first, longest to shortest (make test's durations), so that what is left
# at the end is short files and neither worker waits long for the other (with only the five longest first,
# test_unsloth_generated came last and one worker waited 60 s).
LONGEST_FIRST = ("test_export", "test_engines", "test_distributed", "test_bench", "test_faults", "test_unsloth_generated",
                 "test_e2e", "test_code_task", "test_sandbox", "test_api", "test_code_agreement", "test_warm_cli",
                 "test_doctor", "test_advantages", "test_run_semantics", "test_run_stories", "test_code_hacks")


def pytest_collection_modifyitems(config, items):
    """The longest files first, the others in their usual order (the same order in every worker: each collects for
    itself, and xdist checks that they agree)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable


def pytest_sessionfinish(session, exitstatus):
    warm_cli.close()
    if hasattr(session.config, "workeroutput"):  # an xdist worker: its counts go to the controller
        session.config.workeroutput["warm_cli"] = json.dumps([warm_cli.counts, warm_cli.cold_because])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller adds up the workers' warm / cold counts."""
    if "warm_cli" in getattr(node, "workeroutput", {}):
        counts, because = json.loads(node.workeroutput["warm_cli"])
        for kind, n in counts.items():
            warm_cli.counts[kind] += n
        for name, n in because.items():
            warm_cli.cold_because[name] = warm_cli.cold_because.get(name, 0) + n


def pytest_terminal_summary(terminalreporter):
    if any(warm_cli.counts.values()):
        terminalreporter.write_line("train_grpo.py runs (tests/warm_cli.py): " +
                                    ", ".join(f"{n} {kind}" for kind, n in warm_cli.counts.items()) +
                                    "".join(f"; {n} cold for {name}" for name, n in warm_cli.cold_because.items()))


def make_tiny_model(path):
    """A 2-layer random Llama with the embedded model's tokenizer, saved in `path` (fast trainer-level tests)."""
    from transformers import AutoTokenizer

    from grpokit.doctor import save_tiny_llama
    from grpokit.model_loader import embedded_model_dir, import_backend

    import_backend("transformers")  # TRL's fused LM head needs its CPU implementation on this machine
    return save_tiny_llama(path, AutoTokenizer.from_pretrained(embedded_model_dir()))


# The real run that tests/test_faults.py breaks (a reward raising, a full disk, kill -9,
# Ctrl-C) and resume: 16-bit weights (bit-exact resume), 3 steps, small groups, a reward that can fail on demand
# (constant 0 otherwise: no change to training). Each such run is ~20 s on 2 quiet cores.
FAULT_RUN = ["--quick-test", "--no-4bit", "--max-steps", "3", "--seed", "7", "--disable-generation-logging",
             "--set", "per_device_train_batch_size=4", "--set", "num_generations=2", "--set", "save_total_limit=0",
             "--set", "max_eval_samples=4", "--reward", "tests.fixtures.flaky_rewards:flaky"]


def fault_run(out, *extra, env=None, popen=False):
    """FAULT_RUN into `out` as a child process (Popen with `popen`, else the finished CompletedProcess)."""
    if popen:  # a test signals it: a process of its own
        command = [sys.executable, "train_grpo.py", *FAULT_RUN, "--output-dir", str(out), *extra]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **(env or {})}
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return train_cli(*FAULT_RUN, "--output-dir", str(out), *extra, env=env)


# A test that kills a sandboxes' owner on purpose (test_sandbox.py's killed trainer) leaves owner-gone sandboxes for
# a few seconds, until it sweeps them; the other xdist worker's leftover checks would count them as their run's. It
# holds this lock exclusively from the kill to the sweep; sandbox_leftovers() waits for it (shared).
LEFTOVERS_LOCK = Path(tempfile.gettempdir()) / "grpokit-tests-sandbox-leftovers.lock"
_KILLING = []  # set while this process holds the lock exclusively: its own checks then read without waiting


@contextlib.contextmanager
def killing_sandbox_owners():
    """Around a kill of a sandboxes' owner and the sweep of what it left: no leftover check runs meanwhile."""
    import fcntl

    with open(LEFTOVERS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _KILLING.append(True)
        try:
            yield
        finally:
            _KILLING.pop()
            fcntl.flock(lock, fcntl.LOCK_UN)


def sandbox_owner(name: str) -> int | None:
    """The pid that owns a code sandbox's cgroup or directory, from its name (rewards/code/sandbox.py PREFIX + pid)."""
    owner = os.path.basename(name).removeprefix("grpokit-sandbox-").split("-", 1)[0]
    return int(owner) if owner.isdigit() else None


def sandbox_leftovers() -> set[str]:
    """What code sandboxes left on the host with no owner alive: cgroups and mount points / job roots whose owner pid
    (in their name) is gone, and sandbox processes orphaned to pid 1. Compare before and after a run: a run must
    remove all of its own (another live run's sandboxes, which this machine may be running, are not counted)."""
    if _KILLING:
        return _leftovers()
    import fcntl

    with open(LEFTOVERS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # not while a test elsewhere kills an owner on purpose (above)
        return _leftovers()


def _leftovers() -> set[str]:
    import glob

    import psutil

    found = set()
    for path in [*glob.glob("/sys/fs/cgroup/**/grpokit-sandbox-*", recursive=True),
                 *glob.glob(os.path.join(tempfile.gettempdir(), "grpokit-sandbox-*"))]:
        owner = sandbox_owner(path)
        if not (owner and psutil.pid_exists(owner)):
            found.add(path)
    for process in psutil.process_iter(["cmdline", "ppid"]):
        if process.info["ppid"] == 1 and any("sandbox_worker" in arg or "grpokit-sandbox-" in arg
                                             for arg in process.info["cmdline"] or []):
            found.add(f"pid {process.pid}")
    return found

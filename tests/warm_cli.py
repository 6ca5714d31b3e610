"""`python train_grpo.py ...` for the tests, without paying the imports each time.

A run of the CLI spends ~8 s of a 2-core machine importing Unsloth, TRL, transformers and torch before it reads its
first argument; the suite starts ~45 of them. Here a warm interpreter per flavour does those imports once, the
way the CLI does them (grpokit.console.quiet_third_party() first, then `import unsloth` before trl / transformers),
and forks a child per run. The child is an ordinary process from there on: its own pid and process group, the
request's working directory and environment, stdout / stderr / stdin on files, `sys.argv` and `sys.path[0]` as
`python train_grpo.py` sets them, the script run as `__main__`, and the interpreter's normal exit (SystemExit codes,
uncaught tracebacks on stderr with exit 1, atexit handlers, non-daemon threads joined). What differs from a cold
process is only what was imported before the arguments were read, so a run is sent here only where that is the same
as a cold one's:
- flavour "unsloth": the training command (no subcommand) whose configuration resolves to the Unsloth backend (the
  default). A child whose configuration asks for the transformers backend exits with REDO before anything is written
  (build_config is checked right after it returns), and the run is started cold instead.
- flavour "plain": `export` (torch, transformers and PEFT, no Unsloth: what an export imports).
- everything else (`--help`, `report`, `doctor`, `--verbose`, Popen-style runs that a test signals) runs as a cold
  `subprocess.run`.
A warm interpreter starts from its first request's environment; a later request whose environment changes a variable
read at import time goes to a second one of the flavour started from it, or, past two, cold.
GRPO_TESTS_COLD=1 runs every one cold (the reference this is checked against: tests/test_warm_cli.py).

Children are forked from a process that has run no torch op, so no OpenMP pool is inherited: a child's parallel
regions start their own threads (measured: a 1024 x 1024 matmul as fast in a forked child, on 2 threads, as in its
parent; a 3-step run at 1.6-1.7 s a step warm, whole runs 12-13 s warm against 18-20 s cold)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "train_grpo.py"
REDO = 75  # a child's "start me cold" (EX_TEMPFAIL): it exits with it before any side effect

# Environment variables a run may set differently from the warm interpreter: none of them is read at import time
# by anything the warm interpreter imported (they are read when a run starts, a reward runs, or a logger is made).
RUN_TIME_VARIABLES = {"COLUMNS", "LINES", "TERMINAL_WIDTH", "WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_SILENT",
                      "FLAKY_FAIL_AT", "SLOW_AT", "SLOW_SECONDS", "PYTEST_CURRENT_TEST",
                      "UNSLOTH_CPU_CE_CHUNK_ELEMENTS"}  # unsloth_zoo's CPU ops read it per call


def flavour(args: list[str]) -> str | None:
    """Which warm interpreter can run `train_grpo.py *args`, or None (cold)."""
    if any(a in ("--help", "-h", "--verbose", "-v") for a in args):
        return None
    if args and args[0] == "export":
        return "plain"
    if args and args[0] in ("report", "doctor"):
        return None
    return "unsloth"


class _Warm:
    def __init__(self, kind: str, env: dict[str, str]):
        self.kind, self.env = kind, dict(env)
        self.process = subprocess.Popen([sys.executable, __file__, kind], cwd=ROOT, env=self.env, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        # "ready": the imports are done, and set these variables (Unsloth sets ~30, quiet_third_party 4)
        self.imported = self._line(timeout=300)["environment"]

    def _line(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError
        line = self.process.stdout.readline()
        if not line:
            raise EOFError(f"the warm {self.kind} interpreter exited ({self.process.poll()})")
        return json.loads(line)

    def environment_for(self, env: dict[str, str]) -> dict[str, str] | None:
        """The environment a cold run started with `env` has once its imports are done, or None where its imports
        could differ from the warm interpreter's: a variable outside RUN_TIME_VARIABLES that is neither what the warm
        interpreter started with nor what its imports set it to. (This process's own environment gains the imports'
        variables once a test imports Unsloth in it: those are what the warm interpreter's imports set too.)"""
        started, imported = self.env, self.imported
        for name in (set(env) | set(started) | set(imported)) - RUN_TIME_VARIABLES:
            if name.startswith("HF_XET_"):  # download settings Unsloth derives from free memory at import
                continue
            if env.get(name) not in (started.get(name), imported.get(name)):
                self.cold_for = name
                return None
        after = dict(env)
        for name in set(started) | set(imported):
            if env.get(name) == started.get(name) and imported.get(name) != started.get(name):
                if name in imported:
                    after[name] = imported[name]
                else:
                    after.pop(name, None)
        return after

    def run(self, args: list[str], cwd: Path, env: dict[str, str], timeout: float, input: str | None):
        with tempfile.TemporaryDirectory(prefix="warm-cli-") as tmp:
            paths = {name: os.path.join(tmp, name) for name in ("stdin", "stdout", "stderr")}
            Path(paths["stdin"]).write_text(input or "")
            request = {"args": args, "cwd": str(cwd), "env": env, **paths}
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            pid = self._line(timeout=60)["pid"]
            try:
                returncode = self._line(timeout=timeout)["returncode"]
            except TimeoutError:
                os.killpg(pid, signal.SIGKILL)
                self._line(timeout=60)
                raise subprocess.TimeoutExpired([sys.executable, str(SCRIPT), *args], timeout,
                                                Path(paths["stdout"]).read_text(errors="replace"),
                                                Path(paths["stderr"]).read_text(errors="replace")) from None
            stdout = Path(paths["stdout"]).read_text(errors="replace")
            stderr = Path(paths["stderr"]).read_text(errors="replace")
        return returncode, stdout, stderr

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)


_warm: dict[str, list[_Warm]] = {}
PER_FLAVOUR = 2  # warm interpreters of one flavour at most: the suite's usual environment and one other
counts = {"warm": 0, "cold": 0, "redone cold": 0}  # said at the end of the test run (tests/conftest.py)
cold_because: dict[str, int] = {}  # the variable that sent a run cold: how often


def warm(kind: str, env: dict[str, str] | None = None) -> _Warm | None:
    """A warm interpreter of this flavour whose imports read what a cold run's would with `env` (os.environ when
    None): one already running, else one started from `env` itself (~8 s), at most PER_FLAVOUR of them (None past
    that: the run goes cold). Started from the request's environment, not the one pytest began with: a test that
    imports Unsloth in this process adds its variables (TRITON_DISABLE_LINE_INFO, ...) to every later run's."""
    env = dict(os.environ if env is None else env)
    running = _warm.setdefault(kind, [])
    running[:] = [interpreter for interpreter in running if interpreter.process.poll() is None]
    for interpreter in running:
        if interpreter.environment_for(env) is not None:
            return interpreter
    if len(running) == PER_FLAVOUR:
        return None
    running.append(_Warm(kind, env))
    return running[-1]


def run(args, cwd=ROOT, env=None, timeout: float = 900, input: str | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run([sys.executable, "train_grpo.py", *args], capture_output=True, text=True)`, warm where it can be
    (see the module's docstring); the same CompletedProcess (its args say the cold command either way)."""
    args = [str(a) for a in args]
    env = dict(os.environ if env is None else env)
    command = [sys.executable, str(SCRIPT), *args]
    kind = None if os.environ.get("GRPO_TESTS_COLD") == "1" else flavour(args)
    interpreter = warm(kind, env) if kind is not None else None
    if interpreter is not None:
        returncode, stdout, stderr = interpreter.run(args, Path(cwd), interpreter.environment_for(env), timeout, input)
        if returncode != REDO:
            counts["warm"] += 1
            return subprocess.CompletedProcess(command, returncode, stdout, stderr)
    elif kind is not None:
        reason = _warm[kind][0].cold_for
        cold_because[reason] = cold_because.get(reason, 0) + 1
    counts["redone cold" if interpreter is not None else "cold"] += 1
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, input=input)


def close() -> None:
    for running in _warm.values():
        for interpreter in running:
            interpreter.close()
    _warm.clear()


# --- the warm interpreter (this file run as a script) ---------------------------------------------------------------

def _serve(kind: str) -> dict:
    """Import as the CLI would, then fork a child per request line; returns the request in the child."""
    sys.path[0] = str(ROOT)  # as `python train_grpo.py` sets it (this file's own directory otherwise)
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the imports' banners (Unsloth prints one) go nowhere: the protocol has its own fd
    os.close(devnull)
    from grpokit.console import quiet_third_party

    quiet_third_party()
    if kind == "unsloth":
        from grpokit.model_loader import import_backend

        import_backend("unsloth")
        # a run ends by drawing its curves (grpokit/plots.py): pyplot's import is ~0.8 s of every run's end
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    else:
        import peft  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    # Temporary directories made at import (W&B's media directory) are removed by their finalizer when a process
    # exits: every child removes the one it shares with the warm interpreter, so each child makes it again.
    import gc

    temporary = [found.name for found in gc.get_objects() if isinstance(found, tempfile.TemporaryDirectory)]
    sys.stdout.flush()  # nothing printed during the imports may reach a child's stdout or stderr
    sys.stderr.flush()
    protocol.write(json.dumps({"ready": kind, "environment": dict(os.environ)}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            protocol.close()
            for path in temporary:
                os.makedirs(path, exist_ok=True)
            return request
        protocol.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        protocol.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
    sys.exit(0)


def _become(request: dict, kind: str) -> None:
    """In the child: turn into `python train_grpo.py *args` as started from request's cwd and env."""
    os.setpgid(0, 0)  # a timeout kills the run's whole group (its sandbox workers too), not the warm interpreter
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, name, mode in ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                           (2, "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(request[name], mode, 0o600)
        os.dup2(opened, fd)  # sys.stdin / stdout / stderr keep their objects (a pipe's buffering, as a cold run's)
        os.close(opened)
    sys.argv = [str(SCRIPT), *request["args"]]
    if kind == "unsloth":
        import config.loader
        from grpokit.model_loader import choose_backend

        build_config = config.loader.build_config

        def checked(*args, **kwargs):
            built = build_config(*args, **kwargs)
            if choose_backend(built.backend) != "unsloth":
                os._exit(REDO)  # nothing written yet: the run starts again, cold
            return built

        config.loader.build_config = checked


if __name__ == "__main__":
    import runpy

    flavour_name = sys.argv[1]
    _become(_serve(flavour_name), flavour_name)
    runpy.run_path(str(SCRIPT), run_name="__main__")

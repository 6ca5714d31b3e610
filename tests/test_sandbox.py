"""The code sandbox against hostile completions: each scores 0 (or its honest score) within its time limit plus a
margin, the reward call goes on, and nothing outside the sandbox's temp dir changes. Assertions about isolation
follow `sandbox.protections()`: what this machine enforces is probed, and a missing protection is skipped, not
pretended. The sandbox runs for real (no mocks); time limits are small so a failure cannot hang the machine."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, sandbox_owner

from rewards.code import CodeExecution, sandbox

TIMEOUT = 2.0
MARGIN = 3.0  # start-up, the namespace set-up and a loaded 2-core machine
TESTS = ["assert f() == 1", "assert f() + 1 == 2"]
PROTECTIONS = sandbox.protections()


def fenced(code: str) -> str:
    return f"Here you go:\n```python\n{code}\n```"


def score(completions, tests=TESTS, **settings):
    component = CodeExecution(timeout=settings.pop("timeout", TIMEOUT), **settings)
    start = time.monotonic()
    values = component(prompts=["p"] * len(completions), completions=completions, tests=[tests] * len(completions))
    return values, time.monotonic() - start, component.last_details


def test_protections_are_reported_once_in_one_line():
    line = sandbox.describe()
    assert line.startswith("code sandbox") and "\n" not in line
    for key in ("namespaces", "network_isolated", "read_only_fs", "pid_namespace", "process_limit", "rlimits"):
        assert key in PROTECTIONS


@pytest.mark.parametrize(
    "name, code",
    [
        ("infinite loop", "def f():\n    return 1\nwhile True:\n    pass"),
        ("sleeps past the limit", "import time\ndef f():\n    time.sleep(60)\n    return 1"),
        ("memory hog", "x = bytearray(8 << 30)\ndef f():\n    return 1"),
        ("sys.exit before the tests", "import sys\ndef f():\n    return 1\nsys.exit(0)"),
        ("os._exit before the tests", "import os\ndef f():\n    return 1\nos._exit(0)"),
        ("raise SystemExit", "def f():\n    return 1\nraise SystemExit(0)"),
        ("exit from inside the test", "import os\ndef f():\n    os._exit(0)"),
        ("syntax error", "def f(:\n    return 1"),
        ("no code", "I am not able to write this function."),
        ("empty", ""),
        ("forges result lines", "import os\nfor fd in range(3, 20):\n    try:\n        os.write(fd, b'x 0 1\\nx 1 1\\n')\n"
                                "    except OSError:\n        pass\nprint('0 1 1')\ndef f():\n    return 0"),
    ],
)
def test_hostile_completions_score_zero_in_time(name, code):
    values, elapsed, details = score([fenced(code) if code and "not able" not in code else code])
    assert values == [0.0], (name, details)
    assert elapsed < TIMEOUT + MARGIN, (name, elapsed)


def test_the_call_goes_on_after_hostile_completions():
    good = fenced("def f():\n    return 1")
    values, elapsed, details = score([fenced("while True:\n    pass"), good, fenced("import os\nos._exit(0)"), good])
    assert values == [0.0, 1.0, 0.0, 1.0]
    assert [d["status"] for d in details] == ["timeout", "passed", "exited before its tests", "passed"]
    assert elapsed < 2 * (TIMEOUT + MARGIN)


@pytest.mark.skipif(not PROTECTIONS["process_limit"], reason="no process cap here (root without a pids cgroup)")
def test_fork_bomb_is_contained():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    values, elapsed, _ = score([fenced(bomb)])
    assert values == [0.0] and elapsed < TIMEOUT + MARGIN
    time.sleep(0.5)
    # What stays in this process's sandboxes is the helper and a zygote, not the bomb's up-to-`processes` tasks. Counted
    # by cgroup, not host-wide: the other test worker starts and ends processes meanwhile (CI failed on 95 vs 82 + 10).
    ours = {os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))}
    left = [pid for pid, owner in sandboxed_processes().items() if owner in ours]
    assert len(left) < 10, left  # the job's group and namespace are gone


def sandboxed_processes() -> dict[int, int]:
    """Every process in a code sandbox's cgroup on this host: pid -> the pid that owns the sandbox (in the group's name)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            groups = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:  # ended meanwhile
            continue
        for line in groups.splitlines():
            name = line.rsplit("/", 1)[-1]
            if name.startswith(sandbox.PREFIX):
                found[int(pid)] = sandbox_owner(name)
                break
    return found


def test_a_gigabyte_of_output_is_read_and_dropped():
    run = sandbox.run_python("import sys\nb = b'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.buffer.write(b)\n",
                             sandbox.Limits(timeout=20))
    assert run.truncated and len(run.stdout) <= 64 * 1024
    assert run.timed_out or run.returncode == 0


# The process's environment as the kernel keeps it, where the job has a /proc (a job with namespaces of its own has none)
ENVIRON = """def environ():
    try:
        return open('/proc/self/environ', 'rb').read()
    except FileNotFoundError:
        return b''
"""


def test_the_environment_is_an_allow_list(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_for_the_test")
    monkeypatch.setenv("WANDB_API_KEY", "wandb_secret_for_the_test")
    run = sandbox.run_python("import os, json\nprint(json.dumps(dict(os.environ)))\n" + ENVIRON +
                             "print(environ().count(b'secret_for_the_test'))")
    env = json.loads(run.stdout.splitlines()[0])
    assert set(env) <= set(sandbox.ENV_ALLOWED) | {"PWD"}, env
    assert run.stdout.splitlines()[1] == "0"
    assert env["HOME"] == os.path.realpath(env["HOME"]) and env["HOME"] != str(Path.home())


def test_a_completion_reading_tokens_sees_none(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_for_the_test")
    code = ("import os\n" + ENVIRON + "def f():\n    leaked = 'HF_TOKEN' in os.environ or b'hf_secret' in environ()\n"
            "    return 0 if leaked else 1")
    assert score([fenced(code)])[0] == [1.0]


def test_writes_and_deletes_outside_the_temp_dir_fail(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("precious")
    home_target = Path.home() / f"sandbox-escape-{os.getpid()}.txt"
    code = (f"import os, shutil\ndef attack():\n    for target in ({str(tmp_path / 'written.txt')!r}, {str(home_target)!r},"
            f" os.path.expanduser('~/in-home.txt')):\n        try:\n            open(target, 'w').write('x')\n"
            f"        except OSError:\n            pass\n    for victim in ({str(keep)!r},):\n        try:\n"
            f"            os.remove(victim)\n        except OSError:\n            pass\n    shutil.rmtree({str(tmp_path)!r},"
            " ignore_errors=True)\nattack()\ndef f():\n    return 1")
    try:
        values, _, _ = score([fenced(code)])
        assert values == [1.0]  # the attack is not a test failure: the tests still ran
        if PROTECTIONS["read_only_fs"]:
            assert keep.read_text() == "precious"
            assert not (tmp_path / "written.txt").exists()
            assert not home_target.exists()
    finally:
        home_target.unlink(missing_ok=True)


def test_the_network_is_off_where_namespaces_allow():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    code = (f"import socket\ndef f():\n    try:\n        socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
            "        return 0\n    except OSError:\n        return 1")
    try:
        values, _, _ = score([fenced(code)], tests=["assert f() == 1"])
        if PROTECTIONS["network_isolated"]:
            assert values == [1.0]
            with pytest.raises(TimeoutError):
                listener.accept()  # nobody connected
        else:
            assert values == [0.0]
    finally:
        listener.close()


def test_completions_run_in_parallel():
    sleepy = fenced("import time\ntime.sleep(1)\ndef f():\n    return 1")
    values, elapsed, _ = score([sleepy] * 4, workers=4)
    assert values == [1.0] * 4
    assert elapsed < 3.5  # one after the other: over 4 s


def test_a_failing_sandbox_drops_the_sample(monkeypatch, tmp_path):
    sandbox.shutdown()  # no warm sandbox or helper in the pools: the next ones must start, and the sandbox cannot
    monkeypatch.setenv("GRPO_SANDBOX_PYTHON", str(tmp_path / "no-python-here"))
    try:
        values, _, details = score([fenced("def f():\n    return 1")])
    finally:
        sandbox.shutdown()  # the helper started with the broken setting goes too
    assert values == [None] and details[0]["status"] == "sandbox error"


# -----------------------------------------------------------------------------------------------------------------
# The external sandbox: a SandboxFusion-shaped server on 127.0.0.1 that runs the code with python
# -----------------------------------------------------------------------------------------------------------------


class FusionHandler(BaseHTTPRequestHandler):
    mode = "run"
    requests: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        import subprocess
        import sys

        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FusionHandler.requests.append((self.path, body))
        if self.mode == "broken":
            answer = {"status": "SandboxError", "message": "no runner", "run_result": None}
        elif self.mode == "slow":
            answer = {"status": "Failed", "run_result": {"status": "TimeLimitExceeded", "return_code": None,
                                                         "stdout": "", "stderr": ""}}
        else:
            done = subprocess.run([sys.executable, "-c", body["code"]], input=body.get("stdin", ""), text=True,
                                  capture_output=True, timeout=body["run_timeout"])
            answer = {"status": "Success" if done.returncode == 0 else "Failed",
                      "run_result": {"status": "Finished", "return_code": done.returncode, "stdout": done.stdout,
                                     "stderr": done.stderr, "execution_time": 0.1}}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fusion():
    server = HTTPServer(("127.0.0.1", 0), FusionHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FusionHandler.requests = []
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_sandbox_fusion_backend(fusion):
    server, url = fusion
    FusionHandler.mode = "run"
    right, wrong = fenced("def f():\n    return 1"), fenced("def f():\n    return 2")
    values, _, details = score([right, wrong, fenced("import sys\nsys.exit(0)")], sandbox_url=url)
    assert values == [1.0, 0.0, 0.0], details
    path, body = FusionHandler.requests[0]
    assert path == "/run_code" and body["language"] == "python" and body["run_timeout"] == TIMEOUT
    FusionHandler.mode = "slow"
    assert score([right], sandbox_url=url)[0] == [0.0]
    FusionHandler.mode = "broken"
    assert score([right], sandbox_url=url)[0] == [None]


def test_sandbox_fusion_unreachable_drops_the_sample():
    port_socket = socket.socket()
    port_socket.bind(("127.0.0.1", 0))
    port = port_socket.getsockname()[1]
    port_socket.close()  # nothing listens there now
    values, _, details = score([fenced("def f():\n    return 1")], sandbox_url=f"http://127.0.0.1:{port}")
    assert values == [None] and details[0]["status"] == "sandbox error"


# -----------------------------------------------------------------------------------------------------------------
# Where the OS refuses namespaces, and the hack monitor
# -----------------------------------------------------------------------------------------------------------------

# What a container's default seccomp profile does to the sandbox (Docker's refuses unshare): namespaces refused, the
# rest allowed. The process that installs it (and the sandboxes it starts) then really finds no namespaces.
CONTAINER_PROFILE = r"""
from rewards.code import sandbox_worker as _w
def _container_profile():
    arch, machine = _w._AUDIT[_w.os.uname().machine][0], _w.os.uname().machine
    n = _w.syscall_numbers(machine)
    ld, jeq, jset, ret, allow, eperm, enosys = 0x20, 0x15, 0x45, 0x06, 0x7FFF0000, 0x50001, 0x50026
    return [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, allow), (ld, 0, 0, 0),
            (jeq, 0, 1, n["unshare"]), (ret, 0, 0, eperm), (jeq, 0, 1, n["setns"]), (ret, 0, 0, eperm),
            (jeq, 0, 1, n["clone3"]), (ret, 0, 0, enosys), (jeq, 1, 0, n["clone"]), (ret, 0, 0, allow),
            (ld, 0, 0, 16), (jset, 0, 1, _w._NS_FLAGS), (ret, 0, 0, eperm), (ret, 0, 0, allow)]
assert _w.install_seccomp(_w.prepare_seccomp(_container_profile())) == ""
"""
_NO_NAMESPACES = r"""
import json, sys
sys.path.insert(0, {root!r})
""" + CONTAINER_PROFILE.replace("{", "{{").replace("}", "}}") + r"""
from rewards.code import sandbox
from config.errors import UsageError
from rewards.code import CodeExecution
out = {{"describe": sandbox.describe(), "missing": sandbox.missing()}}
right = "```python\ndef f():\n    return 1\n```"
out["scored"] = CodeExecution(timeout=5)(completions=[right], tests=[["assert f() == 1"]])
try:
    CodeExecution(timeout=5, require_sandbox=True).check("reward config")
    out["refused"] = ""
except UsageError as err:
    out["refused"] = str(err)
print(json.dumps(out))
"""


def test_without_namespaces_it_says_what_holds_and_require_sandbox_refuses():
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parent.parent)
    done = subprocess.run([sys.executable, "-c", _NO_NAMESPACES.format(root=root)], capture_output=True, text=True,
                          timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "NO namespaces" in out["describe"] and "\n" not in out["describe"]
    assert "no network" in out["missing"] and "no host files" in out["missing"]
    assert out["scored"] == [1.0]  # what holds still runs the code
    assert "require_sandbox" in out["refused"] and "\n" not in out["refused"]
    if os.geteuid() == 0:
        assert "not root" not in out["missing"]  # dropped to an unprivileged uid even without namespaces


# The CLI (or the API) in a process under a seccomp filter that refuses unshare as Docker's default profile does
# (CONTAINER_PROFILE): the probe then really finds no namespaces (nothing of the check is mocked).
_UNDER_SECCOMP = r"""
import os, sys
sys.path.insert(0, os.getcwd())
""" + CONTAINER_PROFILE + r"""
if sys.argv[1] == "api":
    from config import build_config
    from config.errors import UsageError
    from grpo_trainer import GRPOTrainer
    trainer = GRPOTrainer(build_config(preset="code_generation_cpu", overrides=[f"output_dir={sys.argv[2]}"]))
    try:
        trainer.train()
    except UsageError as err:
        print("refused" if trainer.model is None else "refused after loading", err)
    sys.exit(0)
os.execv(sys.executable, [sys.executable, "train_grpo.py", *sys.argv[1:]])
"""


def test_where_unshare_is_blocked_a_code_run_is_refused_unless_allowed_explicitly(tmp_path):
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parent.parent)

    def under_seccomp(*args, **env):
        done = subprocess.run([sys.executable, "-c", _UNDER_SECCOMP, *args], capture_output=True, text=True,
                              timeout=300, cwd=root, env={**os.environ, **env})
        return done.returncode, done.stdout, done.stderr

    run = ("--preset", "code_generation_cpu", "--dry-run", "--output-dir", str(tmp_path / "out"))
    code, out, err = under_seccomp(*run)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err  # one line, nothing else said
    assert err.startswith("error: the code_execution reward would run model-written code with NO namespaces here")
    assert "unshare refused" in err and "no network" in err and "allow_unsandboxed_code=true" in err
    code, out, err = under_seccomp(*run, "--set", "allow_unsandboxed_code=true")
    assert code == 0, err
    assert json.loads(out)["config"]["allow_unsandboxed_code"] is True
    assert "code sandbox (NO namespaces)" in err and "NOT enforced: no host files, no network, own pids" in err
    # require_sandbox keeps its meaning: the opt-in does not override it
    code, out, err = under_seccomp(*run, "--set", "allow_unsandboxed_code=true", GRPO_REQUIRE_SANDBOX="1")
    assert code == 2 and "'code_execution.require_sandbox' is on" in err.strip().splitlines()[-1]
    # the Python API's train() is refused by the same check, before the model loads
    code, out, err = under_seccomp("api", str(tmp_path / "api"))
    assert code == 0 and out.startswith("refused the code_execution reward would run"), err


def test_the_monitor_flags_and_zero_suspected_scores_zero():
    from rewards.code.monitor import scan

    assert scan("import gc\ndef f():\n    gc.collect()\n    return 1") == []  # gc.disable / collect: idioms
    assert scan("import gc\ndef f():\n    return len(gc.get_objects())") == ["gc"]
    assert scan("import builtins\nbuiltins.int = str") == ["builtins", "rebinding"]
    assert "custom __eq__" in scan("class A:\n    def __eq__(self, o):\n        return True\ndef f():\n    return A()")
    assert "frames" in scan("import sys\nx = sys._getframe(1).f_locals")
    assert "exit hook" in scan("import atexit\natexit.register(print)")
    assert "reads files outside its dir" in scan("data = open('/root/.netrc').read()")
    assert scan("class math:\n    isclose = staticmethod(lambda *a: True)") == ["rebinding"]
    # the cheap evasions: an alias, a computed name, a nested rebinding, a patched class, the harness's module
    assert scan("import os as _o\n_o._exit(0)") == ["exit"]
    assert scan("import sys\nf = getattr(sys, '_get' + 'frame')") == ["computed attribute"]
    assert scan("if True:\n    abs = lambda x: 0") == ["rebinding"]
    assert scan("class C:\n    pass\nC.__eq__ = lambda a, b: True") == ["custom __eq__"]
    assert "the harness" in scan("import __main__ as w\nw.write_frame = print")
    assert scan("def f(xs):\n    xs.remove(1)\n    return sorted(xs)") == []
    honest_but_odd = fenced("import inspect\ndef f():\n    return 1")
    values, _, details = score([honest_but_odd])
    assert values == [1.0] and details[0]["suspected"] == ["frames", "ran frames: inspect"]  # spelling, import
    values, _, details = score([honest_but_odd], zero_suspected=True)
    assert values == [0.0] and "hack suspected" in details[0]["status"]


def test_an_argument_that_is_no_plain_data_crosses_as_a_handle():
    # an iterator argument stays on the trusted side: the code pulls its items through the channel, and the test
    # runs where the tests run (there is no harness beside the code any more)
    tests = ["assert total(iter([1, 2, 3])) == 6", "assert total([4]) == 4"]
    right, wrong = fenced("def total(xs):\n    return sum(xs)"), fenced("def total(xs):\n    return 4")
    component = CodeExecution(timeout=TIMEOUT)
    values = component(completions=[right, wrong], tests=[tests, tests])
    assert values == [1.0, 0.5]
    assert [d["unsplit"] for d in component.last_details] == [0, 0]
    assert component.last_metrics["code/unsplit_tests"] == 0.0


def test_objects_of_the_code_cross_as_handles():
    component = CodeExecution(timeout=TIMEOUT)
    counter = fenced("class Counter:\n    def __init__(self):\n        self.n = 0\n    def inc(self):\n"
                     "        self.n += 1\n        return self.n")
    generator = fenced("def evens(n):\n    return (i for i in range(0, n, 2))")
    returns_function = fenced("def evens(n):\n    return lambda: [0, 2]")
    callback = fenced("def apply(f, xs):\n    return [f(x) for x in xs]")
    values = component(
        completions=[counter, generator, returns_function, callback],
        tests=[["c = Counter()\nc.inc()\nassert c.inc() == 2 and c.n == 2 and isinstance(c, Counter)"],
               ["assert list(evens(5)) == [0, 2, 4]", "assert len(list(evens(3))) == 2"],
               ["assert list(evens(3)) == [0, 2]", "assert evens(3) is not None"],
               ["assert apply(lambda x: x * 2, [1, 2]) == [2, 4]", "assert apply(str, [1]) == ['1']"]])
    assert values == [1.0, 1.0, 0.0, 1.0], component.last_details
    assert all(d["unsplit"] == 0 for d in component.last_details)  # each judged outside the sandbox


def test_a_helper_killed_at_its_deadline_leaves_nothing_on_the_host():
    """A helper process past its deadline is killed with the sandbox it holds mid-job: its cgroups, mount point and
    processes are removed by the trainer; an idle one closes its own at exit. Nothing of either stays behind."""
    from conftest import sandbox_leftovers

    before = sandbox_leftovers()
    started = time.monotonic()
    assert sandbox.trusted_call("rewards.code.sandbox:run_python", {"program": "import time\ntime.sleep(60)"}, 3) is None
    assert time.monotonic() - started < 15
    assert sandbox_leftovers() <= before
    answer = sandbox.trusted_call("rewards.code.reward:judge_in_sandbox", {
        "code": "def add(a, b):\n    return a + b\n", "steps": [["test", "assert add(1, 2) == 3"]], "entry": "add",
        "prefix": "", "timeout": 5.0, "memory_mb": 512}, 60)
    assert answer and "ok" in answer, answer
    import tempfile

    helpers = {h.process.pid for h in sandbox._TRUSTED_IDLE}
    held = [p for p in Path(tempfile.gettempdir()).glob(f"{sandbox.PREFIX}*")
            if sandbox_owner(p.name) in helpers]
    assert held  # the idle helper holds a sandbox between calls
    sandbox.shutdown()
    assert not any(p.exists() for p in held) and sandbox_leftovers() <= before  # closed by the helper itself


_AS_A_USER = r"""
import json, os, sys
sys.path.insert(0, {root!r})
os.geteuid = lambda: 1000  # the host side as a user without root: user namespaces, no cgroups, no uid drop
from rewards.code import sandbox
from rewards.code import CodeExecution
right = "```python\ndef f():\n    return 1\n```"
wrong = "```python\ndef f():\n    return 2\n```"
run = sandbox.run_python("import os, socket\n"
                         "print(os.path.exists({root!r}), os.path.exists('/home'), os.listdir('/'))\n"
                         "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=1); print('net')\n"
                         "except OSError:\n    print('no net')\n")
print(json.dumps({{"mode": sandbox.protections()["namespaces"], "describe": sandbox.describe(),
                  "missing": sandbox.missing(), "inside": run.stdout,
                  "scored": CodeExecution(timeout=5)(completions=[right, wrong], tests=[["assert f() == 1"]] * 2)}}))
"""


def test_as_a_user_without_root_the_user_namespace_mode_says_what_holds():
    """A laptop user: no root, so no cgroups and no drop to 65534, but an unprivileged user namespace gives the same
    private root, network, pid and IPC namespaces and seccomp filter; the memory and CPU caps are what it lacks (said in
    the run's line, and require_sandbox refuses on them)."""
    import shutil
    import subprocess
    import sys

    if not shutil.which("unshare") or subprocess.run(["unshare", "--user", "--map-root-user", "true"],
                                                      capture_output=True).returncode != 0:
        pytest.skip("this machine gives no user namespaces (unshare --user fails)")
    root = str(Path(__file__).resolve().parent.parent)
    done = subprocess.run([sys.executable, "-c", _AS_A_USER.format(root=root)], capture_output=True, text=True,
                          timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["mode"] == "user", out["describe"]  # the OS gives user namespaces: the sandbox must use them
    assert out["missing"] == ["memory cap"] and "NOT enforced: memory cap, CPU cap" in out["describe"]
    for held in ("no host files", "read-only root", "no network", "own pids", "own IPC", "seccomp"):
        assert held in out["describe"].split("; NOT")[0], held
    seen_root, home, *_ = out["inside"].split("\n")[0].split(" ", 2)
    assert (seen_root, home) == ("False", "False") and out["inside"].split("\n")[1] == "no net"
    assert out["scored"] == [1.0, 0.0]


def test_the_sweep_removes_only_what_belongs_to_the_process_named(tmp_path, monkeypatch):
    """A process's sandboxes carry its pid: pid 12's sweep leaves pid 123's (alive) alone, and the sweep of the dead
    leaves a live process's alone."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    live = os.getpid()
    dead = max(int(p) for p in os.listdir("/proc") if p.isdigit()) + 100000  # no such process
    mine = tmp_path / f"{sandbox.PREFIX}{live}-aaaa"
    longer = tmp_path / f"{sandbox.PREFIX}{live}0-bbbb"  # another pid that starts with the same digits
    gone = tmp_path / f"{sandbox.PREFIX}{dead}-cccc"
    for path in (mine, longer, gone):
        path.mkdir()
    assert sandbox.sweep(live) == 1 and not mine.exists() and longer.exists() and gone.exists()
    mine.mkdir()
    sandbox.sweep()
    assert mine.exists() and not gone.exists()
    assert longer.exists() == os.path.exists(f"/proc/{live}0")  # a dead pid's leftovers go, a live one's stay


def test_a_helper_uses_the_trainers_probe_and_its_sandboxes_get_the_memory_they_are_given(monkeypatch):
    """The helper that runs the tests starts with the trainer's view of the machine (no second probe inside its
    first call's deadline), and its own memory cap does not bound the sandboxes it starts: `memory_mb` above it
    reaches the code."""
    root = str(Path(__file__).resolve().parent.parent)
    payload = {"code": f"import os\ndef seen():\n    return os.path.exists({root!r})\n",
               "steps": [["test", "assert seen() is False"]], "entry": "seen", "prefix": "", "timeout": 5.0,
               "memory_mb": 512}
    sandbox.shutdown()
    real = sandbox.protections()
    monkeypatch.setitem(sandbox._STATE, "mode", "none")  # as if this machine had no namespaces
    monkeypatch.setitem(sandbox._STATE, "protections", {**real, "namespaces": ""})
    try:
        answer = sandbox.trusted_call("rewards.code.reward:judge_in_sandbox", payload, 60)
    finally:
        sandbox.shutdown()
    assert answer["ok"]["results"] == [[0, False]]  # the helper took the handed-over mode: the host's files show
    monkeypatch.undo()
    sandbox.shutdown()
    if real["namespaces"]:
        assert sandbox.trusted_call("rewards.code.reward:judge_in_sandbox", payload, 60)["ok"]["results"] == [[0, True]]
    big = 6000  # MiB: above the helper's own 4096 MiB soft cap
    right = "```python\nimport resource\ndef cap():\n    return resource.getrlimit(resource.RLIMIT_AS)[0] >> 20\n```"
    assert CodeExecution(timeout=5, memory_mb=big)(completions=[right], tests=[[f"assert cap() == {big}"]]) == [1.0]


@pytest.mark.parametrize("tag", ["S", "F", "d"])
def test_a_set_or_dict_of_colliding_keys_is_refused_before_it_is_built(tag):
    """Multiples of 2**61 - 1 all hash to 0: built, 20,000 of them take quadratic time. The codec refuses them at
    once, while distinct keys of the same count decode."""
    from rewards.code.sandbox_worker import decode

    def keys(step):
        return [["i", format(k * step, "x")] for k in range(1, 20001)]

    def wrap(items):
        return [tag, [[k, ["N"]] for k in items]] if tag == "d" else [tag, items]

    started = time.monotonic()
    with pytest.raises(ValueError, match="colliding hashes"):
        decode(wrap(keys((1 << 61) - 1)))
    assert time.monotonic() - started < 1.0
    assert len(decode(wrap(keys(7)))) == 20000


def test_a_job_starts_with_a_fresh_pythons_signals_whatever_the_run_was_launched_with():
    """A run started with signals ignored or blocked (a background job of a non-interactive shell ignores SIGINT,
    `nohup` SIGHUP) hands them to the zygote it starts; a job still gets a fresh Python's: SIGINT raises
    KeyboardInterrupt, SIGPIPE ignored, the rest default, nothing blocked (sandbox_worker.restore_signals)."""
    import signal

    ignored = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in ignored}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    try:
        with sandbox.acquire(sandbox.Limits(timeout=7)) as box:  # a Limits no other test uses: a zygote started now
            run = box.job("run", 5, "import signal\nprint(signal.getsignal(signal.SIGINT) is signal.default_int_handler,"
                                    " [signal.getsignal(s) == signal.SIG_DFL for s in (signal.SIGTERM, signal.SIGHUP)],"
                                    " signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,"
                                    " sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))").finish()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for number, handler in previous.items():
            signal.signal(number, handler)
    assert (run.returncode, run.stdout.strip()) == (0, "True [True, True] True []"), run


def test_a_job_cannot_kill_the_zygote_with_any_signal_it_can_send():
    """The zygote (pid 1 of its pid namespace) gets the signals it handles, and Python handles SIGINT: a job's
    os.kill(1, SIGINT) ended the sandbox. Every catchable signal now leaves it serving the next job, while the job's
    own process keeps Python's handlers (SIGINT raises KeyboardInterrupt there)."""
    import signal

    catchable = sorted(int(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))
    with sandbox.acquire(sandbox.Limits(timeout=5)) as box:
        zygote = box.process.pid
        for target in ("os.getppid()", "1") if PROTECTIONS["pid_namespace"] else ("os.getppid()",):
            run = box.job("run", 5, f"import os, time\nfor s in {catchable}:\n    try:\n        os.kill({target}, s)\n"
                                    "    except OSError:\n        pass\n    time.sleep(0.005)\nprint('sent')").finish()
            assert run.returncode == 0 and run.stdout.strip() == "sent", run
            assert box.alive
            after = box.job("run", 5, "import signal\nprint(signal.getsignal(signal.SIGINT) is "
                                      "signal.default_int_handler, signal.getsignal(signal.SIGTERM) == "
                                      "signal.SIG_DFL)\ntry:\n    signal.raise_signal(signal.SIGINT)\n"
                                      "except KeyboardInterrupt:\n    print('interrupted')").finish()
            assert (after.returncode, after.stdout.split()) == (0, ["True", "True", "interrupted"]), after
            assert box.alive and box.process.pid == zygote and box.process.poll() is None
    good = fenced("def f():\n    return 1")
    killer = fenced(f"import os\nfor s in {catchable}:\n    try:\n        os.kill(os.getppid(), s)\n"
                    "    except OSError:\n        pass\ndef f():\n    return 0")
    values, _, details = score([killer, good, killer, good], workers=1)
    assert values == [0.0, 1.0, 0.0, 1.0], details


@pytest.mark.skipif(not PROTECTIONS["no_nested_namespaces"], reason="no seccomp filter here")
def test_the_filter_is_an_allow_list():
    """The job's seccomp filter allows the calls honest programs make and nothing else. Refused on purpose (EPERM):
    nested namespaces, mounts, ptrace, keyrings, io_uring, userfaultfd, perf, bpf, what holds a host-wide resource
    (Linux AIO contexts from fs.aio-max-nr, inotify / fanotify instances of the uid every sandbox shares), the kernel
    log, pidfds, new pipes and sockets of any family (their inode numbers count the host's: a channel between jobs),
    flock (a lock on a file every sandbox reads is seen by a job running beside it). Outside the list (ENOSYS, as on
    a kernel without them): the page-cache probes, sysinfo, memfds, SysV IPC, and calls no list names (nfsservctl, a
    number past every table). Calls allowed with some arguments only: ioctl requests outside the terminal kind
    (ENOTTY), prctl options and fcntl locks (EINVAL), clone with namespace flags or CLONE_PIDFD (EPERM), preadv2 with
    RWF_NOWAIT (EOPNOTSUPP)."""
    import platform

    from rewards.code.sandbox_worker import syscall_numbers

    numbers = syscall_numbers(platform.machine())
    refused = ("unshare", "setns", "mount", "ptrace", "keyctl", "io_uring_setup", "userfaultfd", "perf_event_open",
               "bpf", "io_setup", "inotify_init1", "fanotify_init", "syslog", "memfd_secret", "pidfd_getfd",
               "pidfd_open", "pipe2", "socket", "socketpair", "flock")
    calls = {name: numbers[name] for name in refused}
    absent = {"mincore": {"x86_64": 27, "aarch64": 232}, "cachestat": 451, "sysinfo": {"x86_64": 99, "aarch64": 179},
              "memfd_create": {"x86_64": 319, "aarch64": 279}, "shmget": {"x86_64": 29, "aarch64": 194},
              "nfsservctl": {"x86_64": 180, "aarch64": 42}, "past every table": 1000}
    calls |= {name: n if type(n) is int else n[platform.machine()] for name, n in absent.items()}
    program = f"""
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(number, *args):
    ctypes.set_errno(0)
    return "allowed" if libc.syscall(number, *args) >= 0 else errno.errorcode.get(ctypes.get_errno())
ctx = ctypes.c_ulong(0)
out = {{name: call(number, *((128, ctypes.byref(ctx)) if name == "io_setup" else (0, 0, 0, 0, 0)))
       for name, number in {calls!r}.items()}}
out["ioctl TIOCSTI"] = call({numbers["ioctl"]}, 0, 0x5412, 0)
out["prctl PR_SET_CHILD_SUBREAPER"] = call({numbers["prctl"]}, 36, 1, 0, 0, 0)
out["fcntl F_SETLK"] = call({numbers["fcntl"]}, 0, 6, 0)
out["clone CLONE_NEWUSER"] = call({numbers["clone"]}, 0x10000000 | 17, 0, 0, 0, 0)
out["clone CLONE_PIDFD"] = call({numbers["clone"]}, 0x1000 | 17, 0, 0, 0, 0)
fd = os.open(os.__file__, os.O_RDONLY)
try:
    os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
    out["preadv2 RWF_NOWAIT"] = "allowed"
except OSError as err:
    out["preadv2 RWF_NOWAIT"] = errno.errorcode.get(err.errno)
out["honest"] = [os.preadv(fd, [bytearray(1)], 0, os.RWF_HIPRI), os.isatty(0), os.get_blocking(0)]
pid = os.fork()
if pid == 0:
    os._exit(7)
out["honest"].append(os.waitpid(pid, 0)[1] >> 8)
print(out)
"""
    run = sandbox.run_python(program, sandbox.Limits(timeout=10))
    assert run.returncode == 0, run.stderr[-2000:]
    out = eval(run.stdout.strip().splitlines()[-1])
    assert out.pop("honest") == [1, False, True, 7]
    expected = {name: "EPERM" for name in refused} | {name: "ENOSYS" for name in absent}
    expected |= {"ioctl TIOCSTI": "ENOTTY", "prctl PR_SET_CHILD_SUBREAPER": "EINVAL", "fcntl F_SETLK": "EINVAL",
                 "clone CLONE_NEWUSER": "EPERM",
                 "clone CLONE_PIDFD": "EPERM", "preadv2 RWF_NOWAIT": "ENOTSUP"}  # ENOTSUP: EOPNOTSUPP
    assert out == expected


# Honest programs in the styles the filter was traced on (bench/bench_sandbox_corpus.py runs these and the 164
# HumanEval canonical solutions): each prints what it computed, the same under the filter as anywhere.
HONEST = {
    "threads and recursion": ("import sys, threading\nsys.setrecursionlimit(1 << 20)\nthreading.stack_size(1 << 26)\n"
                              "def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\n"
                              "def main():\n    print(f(int(sys.stdin.readline())))\n"
                              "t = threading.Thread(target=main)\nt.start()\nt.join()\n", b"50000\n", "50000"),
    "gc and fast io": ("import gc, os, sys\ngc.disable()\ninput = sys.stdin.buffer.readline\nn = int(input())\n"
                       "a = list(map(int, input().split()))\nos.write(1, (str(sum(a)) + '\\n').encode())\n"
                       "gc.collect()\nsys.exit(0)\n", b"3\n1 2 3\n", "6"),
    "asyncio": ("import asyncio\nasync def m():\n    await asyncio.sleep(0.01)\n"
                "    x = await asyncio.get_running_loop().run_in_executor(None, sum, [1, 2])\n"
                "    return (await asyncio.gather(asyncio.wait_for(asyncio.sleep(0, x), 1)))[0]\n"
                "print(asyncio.run(m()))\n", b"", "3"),
    "files": ("import os, pathlib, shutil, tempfile\nopen('a.txt', 'w').write('hi')\nos.mkdir('d')\n"
              "shutil.copy2('a.txt', 'd/b.txt')\nwith tempfile.TemporaryDirectory() as t:\n"
              "    pathlib.Path(t, 'x').write_text('y')\nprint(open('d/b.txt').read() + str(sorted(os.listdir('d'))))\n",
              b"", "hi['b.txt']"),
    "stdlib": ("import datetime, hashlib, os, random, resource, time\nr = resource.getrlimit(resource.RLIMIT_STACK)\n"
               "resource.setrlimit(resource.RLIMIT_STACK, r)\nprint(len(os.urandom(4)), random.random() < 1, "
               "time.perf_counter() > 0, datetime.datetime.now().year > 2000, hashlib.sha256(b'').hexdigest()[:4], "
               "os.cpu_count() >= 1)\n", b"", "4 True True True e3b0 True"),
    "subprocess degrades": ("import subprocess\ntry:\n    subprocess.run(['true'])\nexcept OSError as err:\n"
                            "    print(type(err).__name__)\n", b"", "PermissionError"),
}


@pytest.mark.skipif(not PROTECTIONS["no_nested_namespaces"], reason="no seccomp filter here")
@pytest.mark.parametrize("name", list(HONEST))
def test_honest_programs_run_under_the_allow_list(name):
    program, stdin, expected = HONEST[name]
    run = sandbox.run_python(program, sandbox.Limits(timeout=20), stdin=stdin)
    assert (run.returncode, run.stdout.strip()) == (0, expected), run.stderr[-2000:]


def test_numpy_runs_under_the_allow_list():
    pytest.importorskip("numpy")
    program = "import numpy as np\na = np.arange(10000.0).reshape(100, 100)\nprint(int((a @ a.T).trace()))\n"
    run = sandbox.run_python(program, sandbox.Limits(timeout=30))
    assert (run.returncode, run.stdout.strip()) == (0, "333283335000"), run.stderr[-2000:]


@pytest.mark.skipif(os.geteuid() != 0 or not PROTECTIONS["memory_cap"], reason="no cgroups for the helper here")
def test_the_helper_that_runs_the_tests_is_under_a_memory_cap(monkeypatch):
    """An answer the tests turn into gigabytes ("x" * f(), f returning 3e9: under the helper's 4 GiB address-space
    rlimit) grew the helper, outside any cgroup, to ~3 GB. Now the helper's own memory cgroup ends it at
    TRUSTED_CGROUP_MB: that row fails with the reason, the row beside it scores, and the helper's peak stays
    capped."""
    peaks = []
    remove = sandbox._Cgroups.remove

    def measured(self):
        for path in self.dirs:
            if "-helper-" in path.name:
                for name in ("memory.max_usage_in_bytes", "memory.peak"):
                    try:
                        peaks.append(int((path / name).read_text()) >> 20)
                    except (OSError, ValueError):
                        pass
        remove(self)

    monkeypatch.setattr(sandbox._Cgroups, "remove", measured)
    huge = fenced("def f():\n    return 3_000_000_000")
    good = fenced("def f():\n    return 5")
    values, elapsed, details = score([huge, good], tests=['assert len("x" * f()) == 5'], timeout=10)
    sandbox.shutdown()  # the idle helper closes: its group's peak is read too
    assert values == [0.0, 1.0], details
    assert details[0]["status"] == "failed" and "memory cap" in details[0]["stderr"], details[0]
    assert peaks and max(peaks) <= sandbox.TRUSTED_CGROUP_MB, peaks


def test_a_completion_costs_the_step_at_most_its_time_limit_plus_one_second():
    """Judging got the time limit + JUDGE_GRACE (5 s) in all, so a completion whose answers make the tests spin (a
    test summing range(f()) with f() = 10**12) held the step's scoring for timeout + 5 s. The grace now covers only
    the start (a fresh helper, a sandbox); from its sandbox job's start a completion gets its time limit plus
    JUDGE_SLACK (1 s). Measured on a warm pool beside honest rows: an endless loop, and tests made to spin, each
    take at most TIMEOUT + 1 s + 0.5 s of scheduling on a loaded 2-core machine."""
    from rewards.code.reward import JUDGE_SLACK

    good = fenced("def f():\n    return 1")
    hostile = {"endless loop": (fenced("def f():\n    while True:\n        pass"), "assert f() == 1"),
               "tests made to spin": (fenced("def f():\n    return 10**12"), "assert sum(range(f())) == 1")}
    for name, (code, test) in hostile.items():
        warm = CodeExecution(timeout=TIMEOUT)(prompts=["p"] * 4, completions=[good] * 4, tests=[TESTS] * 4)
        assert warm == [1.0] * 4
        component = CodeExecution(timeout=TIMEOUT)
        started = time.monotonic()
        values = component(prompts=["p"] * 4, completions=[code, good, good, good], tests=[[test]] + [TESTS] * 3)
        elapsed = time.monotonic() - started
        assert values == [0.0, 1.0, 1.0, 1.0], (name, component.last_details)
        assert component.last_details[0]["status"] == "timeout", name
        assert elapsed <= TIMEOUT + JUDGE_SLACK + 0.5, (name, elapsed)


def test_the_environments_packages_import_read_only_and_nothing_else_shows():
    """The sandbox ran the stdlib only, where the official HumanEval harness runs in the user's environment: an
    honest numpy answer could not score. The environment's site-packages are now shown read-only (at /opt/site-N
    when they live elsewhere, e.g. a venv inside the checkout): numpy scores, and the code can neither write there
    nor see the project, the home directory or its caches."""
    pytest.importorskip("numpy")
    answer = fenced("import numpy as np\ndef mean(xs):\n    return float(np.mean(np.array(xs)))")
    values, _, details = score([answer, fenced("def mean(xs):\n    return 0.0")],
                               tests=["assert mean([1, 2, 3]) == 2.0", "assert mean([4]) == 4.0"], timeout=20)
    assert values == [1.0, 0.0], details
    root = str(Path(__file__).resolve().parent.parent)
    home = str(Path.home())
    program = f"""
import os, sys, numpy
seen = [p for p in ({root!r}, {home!r}, os.path.join({home!r}, ".cache"), "/root") if os.path.exists(p)]
seen += [p for p in sys.path if p.startswith({root!r})]
try:
    open(os.path.join(os.path.dirname(numpy.__file__), "planted.py"), "w").write("x = 1")
    seen.append("wrote into site-packages")
except OSError:
    pass
print(seen)
"""
    run = sandbox.run_python(program, sandbox.Limits(timeout=20))
    assert run.returncode == 0, run.stderr[-2000:]
    import numpy

    assert not (Path(numpy.__file__).parent / "planted.py").exists()
    if PROTECTIONS["private_files"]:
        assert run.stdout.strip() == "[]", run.stdout


def test_a_helper_outlives_no_trainer_killed_at_once(tmp_path):
    """kill -9 of the trainer while its helper spins on the code's answers (a C loop holding the GIL): the helper's
    watchdog kills it within seconds instead of leaving it to spin for good."""
    from conftest import killing_sandbox_owners, sandbox_leftovers

    before = sandbox_leftovers()
    trainer = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from rewards.code import sandbox; "
         "helper = sandbox._Trusted(); print(helper.process.pid, flush=True); "
         "helper.call('tests.fixtures.spin:spin', {}, 600)", str(ROOT)],
        stdout=subprocess.PIPE, text=True)
    helper = int(trainer.stdout.readline())
    time.sleep(1.5)  # the helper is spinning now
    assert psutil.Process(helper).status() != psutil.STATUS_ZOMBIE
    with killing_sandbox_owners():  # from the kill to the sweep, a code run's leftover check beside this one waits
        trainer.kill()
        trainer.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and psutil.pid_exists(helper) and \
                psutil.Process(helper).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.2)
        alive = psutil.pid_exists(helper) and psutil.Process(helper).status() != psutil.STATUS_ZOMBIE
        assert not alive, "the helper outlived its trainer"
        # What the killed pair could not remove (its sandbox's cgroups) the next run's start sweeps (sandbox.sweep()
        # of owners that are gone); swept here at once, so that a test running beside this one (another xdist
        # worker: a code run's leftover check) does not count it as its own
        sandbox.sweep()
        assert sandbox_leftovers() <= before


def _run_filter(program, arch, number, args=(0,) * 6):
    """What a classic BPF seccomp filter returns for one call: the few instructions the sandbox's filter uses."""
    data = {0: number, 4: arch, **{16 + 8 * i: a & 0xFFFFFFFF for i, a in enumerate(args)}}
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == 0x20:  # ld [k]
            acc, pc = data[k], pc + 1
        elif code == 0x05:  # ja k
            pc += 1 + k
        elif code in (0x15, 0x35, 0x45):  # jeq, jge, jset
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if hit else jf)
        else:
            assert code == 0x06, code
            return k


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_every_call_number_gets_the_action_its_list_gives(machine):
    """The filter's binary search on the call number, emulated for every number up to 1023 on both tables: ALLOWED
    calls are allowed, REFUSED get EPERM, every other number ENOSYS; a foreign architecture is killed."""
    from rewards.code import sandbox_worker as w

    program = w.seccomp_program(machine)
    arch = w._AUDIT[machine][0]
    numbers = w.syscall_numbers(machine)
    action = {numbers[n]: 0x7FFF0000 for n in w.ALLOWED if n in numbers}
    action |= {numbers[n]: 0x50001 for n in w.REFUSED if n in numbers}
    action |= {numbers[n]: 0x50000 for n in w.IGNORED}
    checked = {numbers[n] for n in w.CHECKED if n not in w.IGNORED}
    for number in range(1024):
        if number not in checked:
            assert _run_filter(program, arch, number) == action.get(number, 0x50026), (machine, number)
    assert _run_filter(program, arch ^ 1, numbers["read"]) == 0x80000000
    clone, madvise, ioctl, prctl = numbers["clone"], numbers["madvise"], numbers["ioctl"], numbers["prctl"]
    assert _run_filter(program, arch, clone, (17,)) == 0x7FFF0000  # fork's SIGCHLD
    assert _run_filter(program, arch, clone, (0x3D0F00,)) == 0x7FFF0000  # a thread's flags
    assert _run_filter(program, arch, clone, (0x10000000 | 17,)) == 0x50001  # CLONE_NEWUSER
    assert _run_filter(program, arch, clone, (0x1000 | 17,)) == 0x50001  # CLONE_PIDFD
    assert [_run_filter(program, arch, madvise, (0, 0, advice)) for advice in (4, 14, 20, 21, 25)] == \
        [0x7FFF0000, 0x7FFF0000, 0x50000, 0x50000, 0x50000]
    assert [_run_filter(program, arch, ioctl, (0, request)) for request in (0x5401, 0x5412)] == [0x7FFF0000, 0x50019]
    assert [_run_filter(program, arch, prctl, (option,)) for option in (15, 36)] == [0x7FFF0000, 0x50016]
    assert [_run_filter(program, arch, numbers["fcntl"], (0, command)) for command in (3, 1030, 6, 5, 37, 1031)] == \
        [0x7FFF0000, 0x7FFF0000, 0x50016, 0x50016, 0x50016, 0x50016]  # F_SETLK, F_GETLK, F_OFD_SETLK, F_SETPIPE_SZ
    for name in ("preadv2", "pwritev2"):
        assert [_run_filter(program, arch, numbers[name], (0,) * 5 + (flags,)) for flags in (0, 1, 8, 0x80)] == \
            [0x7FFF0000, 0x7FFF0000, 0x5005F, 0x5005F]

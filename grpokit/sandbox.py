"""Run model-written Python in a sandbox: one process group, a fresh temp dir, limits, and Linux namespaces.

Every execution gets:
  * its own session / process group (start_new_session), killed whole with SIGKILL at the time limit and again
    after a normal exit (children a program left behind, e.g. a fork bomb's);
  * a fresh temporary directory as its cwd and HOME, removed afterwards;
  * an environment reduced to an allow-list (PATH, LANG, LC_ALL, HOME, TMPDIR, PYTHONDONTWRITEBYTECODE,
    PYTHONHASHSEED): no HF_TOKEN, WANDB_API_KEY or anything else of the parent's;
  * resource limits set by the program's first lines, before any untrusted code: CPU seconds (RLIMIT_CPU), address
    space (RLIMIT_AS, 1 GiB by default), file size (RLIMIT_FSIZE), open files (RLIMIT_NOFILE), and RLIMIT_NPROC
    where it means something (not for root, whom the kernel exempts);
  * stdout / stderr read to the end but only the last `output_bytes` of each kept, so a program that prints a GB
    neither blocks nor fills memory;
  * `python -I -B` (isolated mode: no PYTHON* variables, no user site-packages, no script dir on sys.path).

Where the OS allows it (probed once per process with a real run, see `protections()`), the program also runs under
util-linux `unshare` in new network, mount and pid namespaces: no network but a loopback that is down; every mount
read-only except its temp dir; a /dev with only null, zero, random and urandom; a /proc showing only its own
processes; all capabilities dropped (`setpriv`), and, as root, a pids cgroup capping its processes (a fork bomb
hits the cap; RLIMIT_NPROC does nothing for root). As root the namespaces come from the kernel directly; otherwise
from an unprivileged user namespace when the kernel permits one. Without namespaces the run logs so once and keeps
the rest (limits, env allow-list, temp dir, group kill): the code can then reach the network and write wherever
this user can.

What it does not do: it is not a VM or a seccomp jail. The code shares the kernel, can read files this user can
read (read-only), can use up to `memory_mb` per process, and the host's memory is not capped as a whole (no memory
cgroup). For untrusted code at scale use an external sandbox (`SandboxFusion` below).
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("grpo")

ENV_ALLOWED = ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED")
PIDS_CGROUP_ROOT = Path("/sys/fs/cgroup/pids")  # cgroup v1 pids hierarchy (cgroup v2: not used, see protections)


class SandboxError(Exception):
    """The sandbox itself failed (cannot fork, cannot create its temp dir, the service is unreachable): not the
    program's fault, so the reward drops the sample (None) instead of scoring it 0."""


@dataclass(frozen=True)
class Limits:
    """What one execution may use. `timeout`: wall-clock seconds; CPU seconds are capped at the next whole second."""

    timeout: float = 10.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    open_files: int = 64
    processes: int = 64
    output_bytes: int = 64 * 1024


@dataclass
class Execution:
    """One run's outcome. `returncode` is None when it was killed at the time limit."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration: float
    channel: bytes = b""  # what the program wrote to its result channel (fd number given on stdin)
    truncated: bool = False


# -----------------------------------------------------------------------------------------------------------------
# The isolation layer: probed once, cached
# -----------------------------------------------------------------------------------------------------------------

# Run as `sh -c SCRIPT sandbox TMPDIR CGROUP MODE python ...`, inside new mount/net/pid namespaces. Mount
# propagation is made private first so nothing here reaches the host's mounts.
_SETUP = r"""
set -e
mount --make-rprivate /
mount --bind "$1" "$1"
if [ -n "$2" ]; then echo 0 > "$2/cgroup.procs" || true; fi
if [ "$3" = root ]; then
  mount -t tmpfs -o size=64k,mode=755,nosuid,noexec sandbox-dev /dev
  mknod -m 666 /dev/null c 1 3; mknod -m 666 /dev/zero c 1 5
  mknod -m 444 /dev/random c 1 8; mknod -m 444 /dev/urandom c 1 9
  ln -s /proc/self/fd /dev/fd
fi
while read -r _ _ _ _ m _; do
  [ "$m" = "$1" ] || mount -o remount,bind,ro "$m" 2>/dev/null || true
done < /proc/self/mountinfo
shift 3
exec setpriv --no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set=-all -- "$@"
"""

_PROBE = r"""
import json, os, socket
out = {}
try:
    s = socket.create_connection(("127.0.0.1", {port}), timeout=2); s.close(); out["network"] = False
except OSError:
    out["network"] = True
try:
    open(os.path.join({outside!r}, "written"), "w").write("x"); out["read_only"] = False
except OSError:
    out["read_only"] = True
out["cgroup"] = open("/proc/self/cgroup").read()
out["caps"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print(json.dumps(out))
"""

_STATE: dict = {}
_LOCK = threading.Lock()


def _namespace_prefix(mode: str) -> list[str]:
    user = [] if mode == "root" else ["--user", "--map-root-user"]
    return ["unshare", *user, "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc"]


def _probe_mode(mode: str) -> dict | None:
    """Run the probe program under `mode`; what it could not do, or None when the mode does not start."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    outside = tempfile.mkdtemp(prefix="sandbox-probe-")
    try:
        program = _PROBE.replace("{port}", str(listener.getsockname()[1])).replace("{outside!r}", repr(outside))
        result = _execute(program, Limits(timeout=20), mode=mode, cgroup=mode == "root")
        if result.returncode != 0:
            return None
        seen = json.loads(result.stdout.strip().splitlines()[-1])
        seen["read_only"] = seen["read_only"] and not os.path.exists(os.path.join(outside, "written"))
        return seen
    except (SandboxError, ValueError, IndexError, KeyError):
        return None
    finally:
        listener.close()
        shutil.rmtree(outside, ignore_errors=True)


def protections() -> dict[str, bool | str]:
    """What this machine enforces, probed once per process with a real sandboxed run:
    `namespaces` ("root", "user" or ""), `network_isolated`, `read_only_fs`, `pid_namespace`, `capabilities_dropped`,
    `process_limit` (a pids cgroup or RLIMIT_NPROC caps the processes), and the always-on `rlimits`,
    `env_allowlist`, `temp_dir`, `group_kill`; `why` says what is missing and why."""
    with _LOCK:
        if "protections" in _STATE:
            return dict(_STATE["protections"])
        found: dict[str, bool | str] = {"namespaces": "", "network_isolated": False, "read_only_fs": False,
                                        "pid_namespace": False, "capabilities_dropped": False,
                                        "process_limit": os.geteuid() != 0, "rlimits": True, "env_allowlist": True,
                                        "temp_dir": True, "group_kill": True, "why": ""}
        missing = [tool for tool in ("unshare", "setpriv", "mount") if not shutil.which(tool)]
        if sys.platform != "linux":
            found["why"] = f"namespaces are Linux-only (this is {sys.platform})"
        elif missing:
            found["why"] = f"{', '.join(missing)} not found (util-linux)"
        else:
            for mode in (("root", "user") if os.geteuid() == 0 else ("user",)):
                seen = _probe_mode(mode)
                if seen is None:
                    continue
                _STATE["mode"] = mode
                found.update(namespaces=mode, network_isolated=seen["network"], read_only_fs=seen["read_only"],
                             pid_namespace=max(seen["pids"], default=99) < 10,
                             capabilities_dropped=int(seen["caps"], 16) == 0)
                if mode == "root":
                    found["process_limit"] = "grpokit-sandbox" in seen["cgroup"]
                break
            else:
                found["why"] = "unshare failed (no permission for namespaces here)"
        _STATE["protections"] = found
        return dict(found)


def describe() -> str:
    """One line for the run's log: what the sandbox enforces here and what it could not."""
    p = protections()
    if not p["namespaces"]:
        return (f"code sandbox: NO namespaces ({p['why']}): the code runs with rlimits, an env allow-list, its own "
                "temp dir and group kill only; it can reach the network and write wherever this user can")
    on = [name for key, name in (("network_isolated", "no network"),
                                 ("read_only_fs", "read-only filesystem outside its temp dir"),
                                 ("pid_namespace", "own pid namespace"),
                                 ("capabilities_dropped", "no capabilities"),
                                 ("process_limit", "process cap")) if p[key]]
    off = [name for key, name in (("network_isolated", "network"), ("read_only_fs", "read-only filesystem"),
                                  ("process_limit", "process cap")) if not p[key]]
    line = f"code sandbox ({p['namespaces']} namespaces): {', '.join(on)}, rlimits, env allow-list, temp dir"
    return line + (f"; NOT enforced: {', '.join(off)}" if off else "")


def log_protections_once() -> None:
    with _LOCK:
        if _STATE.get("logged"):
            return
        _STATE["logged"] = True
    line = describe()
    (log.warning if "NO namespaces" in line or "NOT enforced" in line else log.info)("%s", line)


# -----------------------------------------------------------------------------------------------------------------
# One execution
# -----------------------------------------------------------------------------------------------------------------

_RLIMITS = r"""import resource as _r, os as _os
for _k, _v in {limits}:
    try:
        _r.setrlimit(getattr(_r, _k), (_v, _v))
    except (ValueError, OSError):
        pass
del _r, _os, _k, _v
"""


def _rlimit_lines(limits: Limits) -> str:
    pairs = [("RLIMIT_CPU", int(math.ceil(limits.timeout)) + 1), ("RLIMIT_AS", limits.memory_mb << 20),
             ("RLIMIT_FSIZE", limits.file_size_mb << 20), ("RLIMIT_NOFILE", limits.open_files),
             ("RLIMIT_CORE", 0)]
    if os.geteuid() != 0:
        # Counts every process of this user, the trainer's threads included: the cap is on top of those.
        pairs.append(("RLIMIT_NPROC", _user_tasks() + limits.processes))
    return _RLIMITS.replace("{limits}", repr(pairs))


def _user_tasks() -> int:
    uid, count = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue
    return count


def run_python(program: str, limits: Limits = Limits(), stdin: bytes = b"", channel: bool = False) -> Execution:
    """Run `program` (Python source) in the sandbox. With `channel`, a pipe's write end is open in the program and
    its fd number is the first line of its stdin (before `stdin`); what it writes comes back as `channel`.
    Raises SandboxError when the sandbox itself fails."""
    protections()
    return _execute(program, limits, stdin, channel, mode=_STATE.get("mode", ""), cgroup=_STATE.get("mode") == "root")


def _make_cgroup(limits: Limits) -> Path | None:
    try:
        path = PIDS_CGROUP_ROOT / f"grpokit-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
        path.mkdir()
        (path / "pids.max").write_text(str(limits.processes))
        return path
    except OSError:
        return None


def _remove_cgroup(path: Path | None) -> None:
    if path is None:
        return
    for _ in range(50):  # the namespace's processes are dying: the directory empties within milliseconds
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.02)


def _execute(program: str, limits: Limits, stdin: bytes = b"", channel: bool = False, mode: str = "",
             cgroup: bool = False) -> Execution:
    try:
        workdir = tempfile.mkdtemp(prefix="sandbox-")
    except OSError as err:
        raise SandboxError(f"cannot create a temp dir: {err}") from err
    group = _make_cgroup(limits) if cgroup else None
    read_fd = write_fd = None
    try:
        Path(workdir, "main.py").write_text(_rlimit_lines(limits) + program, encoding="utf-8")
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir,
               "TMPDIR": workdir, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        command = [sys.executable, "-I", "-B", "main.py"]
        if mode:
            command = [*_namespace_prefix(mode), "sh", "-c", _SETUP, "sandbox", workdir, str(group or ""), mode,
                       *command]
        pass_fds: tuple[int, ...] = ()
        if channel:
            read_fd, write_fd = os.pipe()
            pass_fds = (write_fd,)
            stdin = f"{write_fd}\n".encode() + stdin
        try:
            proc = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, pass_fds=pass_fds, start_new_session=True)
        except OSError as err:
            raise SandboxError(f"cannot start the sandboxed process: {err}") from err
        if write_fd is not None:
            os.close(write_fd)
            write_fd = None
        return _collect(proc, stdin, read_fd, limits)
    finally:
        for fd in (read_fd, write_fd):
            if fd is not None:
                os.close(fd)
        _remove_cgroup(group)
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _collect(proc: subprocess.Popen, stdin: bytes, channel_fd: int | None, limits: Limits) -> Execution:
    """Feed stdin, read every stream until it closes (keeping the last `output_bytes`), kill the group at the
    deadline or once the program exits."""
    start = time.monotonic()
    deadline = start + limits.timeout
    try:
        proc.stdin.write(stdin)  # small (a token and an fd number): fits the pipe buffer, never blocks
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    keep = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    channel_data = bytearray()
    truncated = timed_out = False
    selector = selectors.DefaultSelector()
    for stream in (proc.stdout, proc.stderr):
        os.set_blocking(stream.fileno(), False)
        selector.register(stream.fileno(), selectors.EVENT_READ)
    if channel_fd is not None:
        os.set_blocking(channel_fd, False)
        selector.register(channel_fd, selectors.EVENT_READ)
    exited = False
    while selector.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = proc.poll() is None
            break
        for key, _ in selector.select(timeout=min(left, 0.1)):
            try:
                chunk = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                selector.unregister(key.fd)
            elif key.fd == channel_fd:
                channel_data += chunk[: max(0, (1 << 20) - len(channel_data))]
            else:
                buffer = keep[key.fd]
                buffer += chunk
                if len(buffer) > limits.output_bytes:
                    truncated = True
                    del buffer[: len(buffer) - limits.output_bytes]
        if not exited and proc.poll() is not None:
            exited = True
            _kill_group(proc)  # leftovers (a daemonised child) die with the group; pipes then close
    selector.close()
    _kill_group(proc)
    try:
        returncode = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        returncode = None
    proc.stdout.close()
    proc.stderr.close()
    out, err = (bytes(b).decode("utf-8", "replace") for b in keep.values())
    return Execution(None if timed_out else returncode, out, err, timed_out, time.monotonic() - start,
                     bytes(channel_data), truncated)


# -----------------------------------------------------------------------------------------------------------------
# An external sandbox service
# -----------------------------------------------------------------------------------------------------------------


@dataclass
class SandboxFusion:
    """Client of a SandboxFusion server (bytedance/SandboxFusion, the service verl's code rewards call):
    POST {url}/run_code with {"code", "language": "python", "run_timeout", "memory_limit_MB"}; the answer is
    {"status": "Success" | "Failed" | "SandboxError", "run_result": {"status": "Finished" | "TimeLimitExceeded" |
    "Error", "return_code", "stdout", "stderr", ...}, ...}. The service runs the code; nothing runs here. It has no
    result channel, so the program prints its results on stdout (see rewards/code.py)."""

    url: str
    request_timeout: float = 30.0
    headers: dict = field(default_factory=dict)

    def run_python(self, program: str, limits: Limits = Limits(), stdin: bytes = b"") -> Execution:
        payload = {"code": program, "language": "python", "run_timeout": limits.timeout,
                   "memory_limit_MB": limits.memory_mb, "stdin": stdin.decode("utf-8", "replace")}
        request = urllib.request.Request(self.url.rstrip("/") + "/run_code", data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json", **self.headers})
        start = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout + limits.timeout) as response:
                answer = json.loads(response.read().decode("utf-8"))
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise SandboxError(f"sandbox service {self.url}: {err}") from err
        run = answer.get("run_result") or {}
        if answer.get("status") == "SandboxError" or not isinstance(run, dict) or not run:
            raise SandboxError(f"sandbox service {self.url}: {answer.get('message') or answer.get('status')}")
        timed_out = run.get("status") == "TimeLimitExceeded"
        code = run.get("return_code")
        return Execution(None if timed_out else code, str(run.get("stdout") or "")[-limits.output_bytes:],
                         str(run.get("stderr") or "")[-limits.output_bytes:], timed_out, time.monotonic() - start)

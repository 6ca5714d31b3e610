"""Run model-written Python where it sees nothing of the machine: the host side of the code sandbox.

Model-written code is hostile input. Each sandbox is a long-lived *zygote* (rewards/code/sandbox_worker.py) started once
inside fresh Linux namespaces; every completion runs in a child forked from it, so a completion costs a fork, not an
interpreter start. What a sandbox gets, where the OS allows it (probed once per process, see `protections()`):

  * user: not root. As root the sandbox drops to uid/gid 65534 (`SANDBOX_UID`) after setting up its namespaces, so
    root-owned files (tokens, keys, sockets) are closed to it even where a path were visible; as another user, an
    unprivileged user namespace maps its root to that user, with every capability dropped;
  * files: a root of its own (pivot_root onto a small read-only tmpfs) holding only the interpreter's prefix, the
    environment's own packages (`site_dirs()`: a venv's site-packages, at /opt/site-N when outside the system
    directories) and the system's /usr, /bin, /lib read-only, a /dev with null, zero, random and urandom, its own
    /proc, and a size-limited tmpfs /tmp where each job gets a fresh directory as its cwd and HOME (removed
    afterwards without recursion: thousands of nested directories cannot stop it). No home directories, caches,
    project or output directories, other sandboxes, unix sockets or the host's /tmp;
  * namespaces: network (a loopback that is down), mount, pid (the zygote is pid 1 and ignores every signal the
    code can send it, and a daemon the code leaves behind is killed after its job), IPC (no host SysV shared memory
    or queues), UTS and cgroup;
  * nothing between jobs: where the kernel lets the zygote make an unprivileged user namespace (`fresh_per_job`), each
    job runs in user, pid, mount, IPC and network namespaces of its own, with an empty read-only /proc and a tmpfs
    of its own for its directory, all gone with it: the pid and inode counters, IPC objects and network counters a
    job moves start afresh for the next one (rewards/code/sandbox_worker.py `job_in_namespaces`); its stdin, stdout,
    stderr and channel are FIFOs made in a host directory (`fifodir`), whose inode numbers no job moves (a pipe's
    come from the host-wide counter that jobs' pipes and /proc entries moved); the device nodes are read-only;
  * a seccomp allow-list on the job's process (sandbox_worker.ALLOWED: the calls honest Python programs make, found
    by tracing them, bench/bench_sandbox_corpus.py); anything else fails with ENOSYS, and what is refused on purpose
    with EPERM: nested namespaces, ptrace and process_vm_*, keyrings, mounts, bpf / perf / userfaultfd / io_uring /
    AIO / inotify / fanotify / syslog, pidfds, new pipes and sockets (their inode numbers count the host's); the
    page cache of the shared files can be neither probed nor evicted (fadvise, readahead and madvise COLD / PAGEOUT
    are ignored; preadv2 RWF_NOWAIT / RWF_DONTCACHE refused; mincore, cachestat and sysinfo outside the list); the
    zygote is non-dumpable (no /proc/<pid>/mem, fd or environ);
  * cgroups (v1 memory/cpu/pids, or v2 where this process may create child groups): `memory_mb` for the whole
    sandbox (the tmpfs included), one CPU, `processes` tasks; plus per-job rlimits (CPU seconds, address space,
    file size, open files, no core files);
  * an environment allow-list (no HF_TOKEN, WANDB_API_KEY, ...), a process group per job killed whole, stdout /
    stderr read to the end with only their tails kept.

Where the OS refuses a layer (a container whose seccomp profile blocks `unshare`, cgroup v2 without delegation),
`describe()` says in one line what holds and what does not, and the rest is kept: without namespaces a job still
runs as uid 65534 when started as root, under the seccomp filter (no sockets: no network), rlimits and the env
allow-list, but it reads what that uid can read. A run is then refused unless `allow_unsandboxed_code` (`unisolated()`,
rewards/code/reward.py `check_isolation`); `require_sandbox` also refuses where a cap is missing (`missing()`).

Not a VM: the code shares the kernel, and with it host-wide state a job can move and a later one can observe: a
page of a shared file a job reads stays cached (a later job can time a read of it).
For untrusted code at scale use an external service (`SandboxFusion`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rewards.code import sandbox_worker
from rewards.code.sandbox_worker import decode, encode, read_frame, write_frame

log = logging.getLogger("grpo")

ENV_ALLOWED = ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED",
               "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
SANDBOX_UID = 65534  # "nobody": owns nothing on the host
CGROUP_ROOT = Path("/sys/fs/cgroup")
WORKER_SOURCE = Path(sandbox_worker.__file__).read_text(encoding="utf-8")
START_TIMEOUT = 30.0
PREFIX = "grpokit-sandbox-"  # + the pid of the process that owns it: its cgroups and its mount point / job root


class SandboxError(Exception):
    """The sandbox itself failed (cannot start, its service is unreachable): not the program's fault, so the reward
    drops the sample (None) instead of scoring it 0."""


@dataclass(frozen=True)
class Limits:
    """What one job may use. `timeout`: wall-clock seconds for the job (CPU seconds capped at the next whole
    second); `memory_mb`: the whole sandbox (cgroup) and each process (address space); `disk_mb`: its tmpfs."""

    timeout: float = 10.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    disk_mb: int = 64
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
    channel: bytes = b""  # what the program wrote to fd 3
    truncated: bool = False
    events: tuple[str, ...] = ()  # what the run-time monitor saw the code do (sandbox_worker.install_monitor)


# -----------------------------------------------------------------------------------------------------------------
# Starting a sandbox
# -----------------------------------------------------------------------------------------------------------------

# Run as `sh -c SETUP sandbox ROOT TMP_MB MOUNTS UID python ...` (MOUNTS: "host=inside:..." read-only binds) inside new mount/pid/net/ipc/uts/cgroup namespaces
# (pid 1 of the new pid namespace). Mount propagation goes private first so nothing here reaches the host's mounts.
_SETUP = r"""
set -e
R=$1; TMP_MB=$2; RO=$3; AS_UID=$4; shift 4
mount --make-rprivate /
mount -t tmpfs -o size=1m,mode=755,nosuid sandbox-root "$R"
IFS=:
for m in $RO; do
  p=${m%%=*}; d=${m#*=}
  if [ -L "$p" ]; then mkdir -p "$R$(dirname "$d")"; ln -s "$(readlink "$p")" "$R$d"
  elif [ -d "$p" ]; then mkdir -p "$R$d"; mount --bind "$p" "$R$d"; mount -o remount,bind,ro,nosuid,nodev "$R$d"
  fi
done
unset IFS
mkdir -p "$R/dev" "$R/proc" "$R/tmp" "$R/.old"
for n in null zero random urandom; do
  touch "$R/dev/$n"; mount --bind "/dev/$n" "$R/dev/$n"; mount -o remount,bind,ro,nosuid "$R/dev/$n"
done
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
mount -t tmpfs -o "size=${TMP_MB}m,mode=755,nosuid,nodev" sandbox-tmp "$R/tmp"
mkdir -m 700 "$R/tmp/w"
if [ -n "$AS_UID" ]; then chown "$AS_UID:$AS_UID" "$R/tmp/w"; fi
cd "$R"
/usr/sbin/pivot_root . .old || pivot_root . .old
cd /
umount -l /.old
rmdir /.old
mount -o remount,ro,bind /
if [ -n "$AS_UID" ]; then
  exec setpriv --reuid="$AS_UID" --regid="$AS_UID" --clear-groups --no-new-privs --inh-caps=-all \
    --ambient-caps=-all --bounding-set=-all -- "$@"
fi
exec setpriv --no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set=-all -- "$@"
"""

_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}


SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def interpreter() -> str:
    """The interpreter the sandbox runs (with -I -S, its path set to the stdlib and `site_dirs()`):
    GRPO_SANDBOX_PYTHON, else the real interpreter behind this one (a venv's python is a link to it)."""
    return os.path.realpath(os.environ.get("GRPO_SANDBOX_PYTHON") or getattr(sys, "_base_executable", None)
                            or sys.executable)


def site_dirs() -> list[str]:
    """This environment's own package directories, which the sandbox shows read-only so the code imports what the
    official harnesses would give it (numpy, pandas): sysconfig's purelib and platlib (a venv's site-packages), and
    the directories its .pth files name inside this environment's prefix (not an editable install's project
    checkout, nor the .pth files' `import` lines). None with GRPO_SANDBOX_PYTHON (another interpreter: stdlib
    only)."""
    import sysconfig

    if os.environ.get("GRPO_SANDBOX_PYTHON"):
        return []
    found: list[str] = []
    paths = sysconfig.get_paths()
    for key in ("purelib", "platlib"):
        path = os.path.realpath(paths.get(key) or "")
        if os.path.isdir(path) and path not in found:
            found.append(path)
    prefix = os.path.realpath(sys.prefix)
    for directory in list(found):
        for pth in sorted(Path(directory).glob("*.pth")):
            try:
                lines = pth.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                line = line.strip()
                if not line or line.startswith(("#", "import ", "import\t")):
                    continue
                path = os.path.realpath(os.path.join(directory, line))
                if path.startswith(prefix.rstrip("/") + "/") and os.path.isdir(path) and path not in found:
                    found.append(path)
    return [path for path in found if ":" not in path and "=" not in path]


def _mounts() -> list[tuple[str, str]]:
    """(host path, path inside) of what the sandbox's root shows, read-only: the system's libraries where they
    are, the interpreter's prefix at /opt/python-N when it lives elsewhere (a pyenv or conda prefix under a
    home directory: the sandbox sees the interpreter, not the home directory around it), and each of
    `site_dirs()` not already inside one of those at /opt/site-N (a venv inside the project checkout: the sandbox
    sees its site-packages, not the project around it)."""
    prefixes = [os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix),
                os.path.dirname(os.path.dirname(interpreter()))]
    mounts = [(p, p) for p in SYSTEM_DIRS if os.path.lexists(p)]
    for prefix in prefixes:
        if any(prefix == host or prefix.startswith(host.rstrip("/") + "/") for host, _ in mounts
               if not os.path.islink(host)):
            continue
        mounts.append((prefix, f"/opt/python-{len(mounts)}"))
    for path in site_dirs():
        if not any(path == host or path.startswith(host.rstrip("/") + "/") for host, _ in mounts
                   if not os.path.islink(host)):
            mounts.append((path, f"/opt/site-{len(mounts)}"))
    return [(host, inside) for host, inside in mounts if ":" not in host and "=" not in host]


def _inside(path: str) -> str:
    """Where a host path under one of the mounts is, inside the sandbox."""
    for host, inside in _mounts():
        if path == host or path.startswith(host.rstrip("/") + "/"):
            return inside + path[len(host):]
    return path


class _Cgroups:
    """A memory / cpu / pids group for one sandbox (cgroup v1 hierarchies, or a v2 group where delegation allows
    one), or a memory group only (`helper`: a helper process that runs the tests, `limits.memory_mb` its cap).
    `procs`: the cgroup.procs files the launcher writes its pid to; `kinds`: what was capped."""

    def __init__(self, limits: Limits, helper: bool = False):
        self.dirs: list[Path] = []
        self.procs: list[str] = []
        self.kinds: list[str] = []
        name = f"{PREFIX}{os.getpid()}-{'helper-' if helper else ''}{secrets.token_hex(4)}"
        memory = str((limits.memory_mb + limits.disk_mb) << 20)
        if (CGROUP_ROOT / "memory" / "cgroup.procs").exists():
            own = _own_cgroup("memory")
            self._make(CGROUP_ROOT / "memory" / own.lstrip("/") / name, "memory",
                       {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory})
            if helper:
                return
            self._make(CGROUP_ROOT / "cpu" / _own_cgroup("cpu").lstrip("/") / name, "cpu",
                       {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"})
            self._make(CGROUP_ROOT / "pids" / _own_cgroup("pids").lstrip("/") / name, "pids",
                       {"pids.max": str(limits.processes)})
        elif (CGROUP_ROOT / "cgroup.controllers").exists():
            parent = CGROUP_ROOT / _own_cgroup("").lstrip("/")
            try:
                enabled = (parent / "cgroup.subtree_control").read_text().split()
            except OSError:
                enabled = []
            files = {"memory.max": memory, "memory.swap.max": "0", "cpu.max": "100000 100000",
                     "pids.max": str(limits.processes)}
            if helper:
                files = {"memory.max": memory, "memory.swap.max": "0"}
            wanted = {k: v for k, v in files.items() if k.split(".")[0] in enabled}
            if wanted:
                self._make(parent / name, "v2", wanted)
                if self.procs:
                    self.kinds = sorted({k.split(".")[0] for k in wanted})

    def _make(self, path: Path, kind: str, files: dict[str, str]) -> None:
        try:
            path.mkdir()
        except OSError:
            return
        self.dirs.append(path)
        wrote = False
        for key, value in files.items():
            try:
                (path / key).write_text(value)
                wrote = True
            except OSError:
                continue  # memsw without swap accounting, swap.max without swap
        if wrote:
            self.procs.append(str(path / "cgroup.procs"))
            self.kinds.append(kind)

    def oom_kills(self) -> int:
        """How many processes the memory cap's OOM killer ended in this group."""
        for path in self.dirs:
            for name in ("memory.oom_control", "memory.events"):
                try:
                    for line in (path / name).read_text().splitlines():
                        if line.startswith("oom_kill "):
                            return int(line.split()[1])
                except (OSError, ValueError):
                    continue
        return 0

    def remove(self) -> None:
        for path in self.dirs:
            _remove_cgroup(path)
        self.dirs = []


def _remove_cgroup(path: Path) -> None:
    """Kill what is still in the group, then remove it: its processes die within milliseconds, and a group can only
    be removed once empty."""
    for _ in range(100):
        try:
            for line in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(line), signal.SIGKILL)
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def _own_cgroup(controller: str) -> str:
    """This process's group in `controller`'s hierarchy ("" = cgroup v2); in a helper process, its trainer's (the
    helper's own is its memory cap: its sandboxes' groups go beside it, not under it)."""
    parents = _STATE.get("cgroup_parents")
    if isinstance(parents, dict) and isinstance(parents.get(controller), str):
        return parents[controller]
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if (controller and controller in names.split(",")) or (not controller and names == ""):
                return path
    except (OSError, ValueError):
        pass
    return "/"


def _owned(pid: int | None) -> list[Path]:
    """The cgroups and temporary directories of the sandboxes of process `pid`, or of every process that no longer
    exists (pid None)."""
    roots = [CGROUP_ROOT / c / _own_cgroup(c).lstrip("/") for c in ("memory", "cpu", "pids")]
    roots += [CGROUP_ROOT / _own_cgroup("").lstrip("/"), Path(tempfile.gettempdir())]
    found = []
    for root in roots:
        try:
            entries = list(root.glob(f"{PREFIX}{pid if pid is not None else ''}*"))
        except OSError:
            continue
        for path in entries:
            owner = path.name[len(PREFIX):].split("-", 1)[0]  # pid 12's glob also finds pid 123's: compared whole
            if owner.isdigit() and (owner == str(pid) if pid is not None else not os.path.exists(f"/proc/{owner}")):
                found.append(path)
    return found


def sweep(pid: int | None = None) -> int:
    """Remove what the sandboxes of process `pid` left on the host (or those of processes that are gone: a helper
    killed at its deadline, a run killed with SIGKILL): the processes still in their cgroups are killed, the groups
    and the empty mount points removed. Returns how many were removed."""
    removed = 0
    for path in _owned(pid):
        if path.parent == Path(tempfile.gettempdir()):
            _remove_host_tree(str(path))
        else:
            _remove_cgroup(path)
        removed += not path.exists()
    return removed


# Enters the cgroups (each file named before "--"), then execs the rest: the whole sandbox starts inside them.
_ENTER = 'while [ "$1" != -- ]; do echo $$ > "$1"; shift; done; shift; exec "$@"'


class Sandbox:
    """One zygote in its namespaces. Jobs run one at a time (`run`, `serve`); `alive` is False once it is lost."""

    def __init__(self, limits: Limits, mode: str):
        self.limits, self.mode = limits, mode
        self.cgroups = _Cgroups(limits) if os.geteuid() == 0 else None
        self.mountpoint = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-") if mode in ("root", "user") else ""
        self.hostroot = ""  # mode "none": the jobs' directories on the host
        self.fifodir = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")  # where each job's FIFOs are made
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.control = ours
        mounts = ":".join(f"{host}={inside}" for host, inside in _mounts())
        relocated = [inside for host, inside in _mounts() if host != inside]
        env = {**_ENV, **({"LD_LIBRARY_PATH": ":".join(f"{p}/lib" for p in relocated)} if relocated else {})}
        worker = [_inside(interpreter()) if mode in ("root", "user") else interpreter(), "-I", "-S", "-B", "-c",
                  WORKER_SOURCE, str(theirs.fileno())]
        packages = os.pathsep.join(_inside(p) if mode in ("root", "user") else p for p in site_dirs())
        if mode == "root":
            command = ["unshare", "--net", "--mount", "--pid", "--ipc", "--uts", "--cgroup", "--fork",
                       "--kill-child", "sh", "-c", _SETUP, "sandbox", self.mountpoint, str(limits.disk_mb),
                       mounts, str(SANDBOX_UID), *worker, "/tmp/w", "pidns", packages]
        elif mode == "user":
            command = ["unshare", "--user", "--map-root-user", "--net", "--mount", "--pid", "--ipc", "--uts",
                       "--cgroup", "--fork", "--kill-child", "sh", "-c", _SETUP, "sandbox", self.mountpoint,
                       str(limits.disk_mb), mounts, "", *worker, "/tmp/w", "pidns", packages]
        else:
            self.hostroot = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
            command = [*worker, self.hostroot, "nopidns", packages]
            if os.geteuid() == 0 and shutil.which("setpriv"):
                os.chown(self.hostroot, SANDBOX_UID, SANDBOX_UID)
                command = ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
                           "--inh-caps=-all", "--bounding-set=-all", "--", *command]
        if self.cgroups and self.cgroups.procs:
            command = ["sh", "-c", _ENTER, "enter", *self.cgroups.procs, "--", *command]
        try:
            self.process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, pass_fds=(theirs.fileno(),),
                                            start_new_session=True, cwd="/")
        except OSError as err:
            theirs.close()
            self.close()
            raise SandboxError(f"cannot start the sandbox: {err}") from err
        theirs.close()
        ready = self._answer(START_TIMEOUT)
        if not ready or not ready.get("ready"):
            err = self._stderr_tail()
            self.close()
            raise SandboxError(f"the sandbox did not start ({mode}): {err or 'no answer'}")
        self.uid = ready["uid"]
        self.seccomp = ready["seccomp"]  # "" when the filter is on, else why not
        self.namespaces = ready.get("ns") or {}  # the zygote's IPC and pid namespaces (inode numbers)
        self.shared = str(ready.get("shared", "no answer"))  # "" where each job gets namespaces of its own, else why
        if self.shared and mode != "none" and _STATE.get("protections", {}).get("fresh_per_job"):
            # this machine gave each job its own namespaces when probed: a sandbox that cannot is a failure, not a
            # quiet step down to jobs that share them
            self.close()
            raise SandboxError(f"the sandbox cannot give each job its own namespaces: {self.shared[:200]}")
        self.alive = True

    def _stderr_tail(self) -> str:
        try:
            if self.process.poll() is None:
                self.process.kill()
            return self.process.stderr.read().decode("utf-8", "replace").strip()[-300:]
        except (OSError, ValueError, AttributeError):
            return ""

    def _answer(self, timeout: float) -> dict | None:
        ready, _, _ = select.select([self.control], [], [], max(0.0, timeout))
        if not ready:
            return None
        try:
            return read_frame(self.control.fileno())
        except (OSError, ValueError):
            return None

    def job(self, kind: str, timeout: float, program: str = "") -> Job:
        return Job(self, kind, timeout, program)

    def close(self) -> None:
        self.alive = False
        process = getattr(self, "process", None)
        if process is not None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if process.stderr:
                process.stderr.close()
        self.control.close()
        if self.cgroups:
            self.cgroups.remove()
        for path in (self.mountpoint, self.hostroot, getattr(self, "fifodir", "")):
            if path:
                _remove_host_tree(path)


def _remove_host_tree(path: str) -> None:
    """Remove a directory (a job's leftovers in mode "none"): never raises, never recurses."""
    try:
        sandbox_worker.remove_tree(path)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def _rlimits(limits: Limits, pids_cgroup: bool) -> list[tuple[str, int]]:
    pairs = [("RLIMIT_CPU", int(math.ceil(limits.timeout)) + 1), ("RLIMIT_AS", limits.memory_mb << 20),
             ("RLIMIT_FSIZE", limits.file_size_mb << 20), ("RLIMIT_NOFILE", limits.open_files),
             ("RLIMIT_CORE", 0)]
    if not pids_cgroup:
        pairs.append(("RLIMIT_NPROC", limits.processes))
    return pairs


class Job:
    """One forked child of a sandbox, with its four pipes (stdin, stdout, stderr, channel). The host end pumps them
    together, so a program that prints a gigabyte while the host writes a request can never deadlock them."""

    def __init__(self, sandbox: Sandbox, kind: str, timeout: float, program: str = ""):
        self.sandbox, self.limits = sandbox, sandbox.limits
        self.start = time.monotonic()
        self.deadline = self.start + timeout + 2.0  # the zygote kills at `timeout`; this is the host's backstop
        # FIFOs, not pipes, where the sandbox has a root of its own: a pipe's inode number, which the job reads with
        # fstat, counts the pipes the host made before it (an earlier job's among them); a FIFO's is this host
        # directory's file system's, which no job writes (sandbox_worker.REFUSED)
        pipes = [sandbox_worker.fifo(sandbox.fifodir) if sandbox.mountpoint else os.pipe() for _ in range(4)]
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1]]
        self.stdin, self.stdout, self.stderr, self.channel = pipes[0][1], pipes[1][0], pipes[2][0], pipes[3][0]
        capped = set(sandbox.cgroups.kinds) if sandbox.cgroups else set()
        header = {"kind": kind, "timeout": timeout,
                  "rlimits": _rlimits(self.limits, bool({"pids", "v2"} & capped))}
        body = json.dumps(header).encode()
        try:
            sent = socket.send_fds(sandbox.control, [struct.pack(">I", len(body)) + body], theirs)
            sandbox.control.sendall((struct.pack(">I", len(body)) + body)[sent:])
        except OSError as err:
            sandbox.alive = False
            self._close_all(theirs)
            raise SandboxError(f"the sandbox is gone: {err}") from err
        finally:
            for fd in theirs:
                try:
                    os.close(fd)
                except OSError:
                    pass
        _report_start()
        for fd in (self.stdin, self.stdout, self.stderr, self.channel):
            os.set_blocking(fd, False)
        self.tails = {self.stdout: bytearray(), self.stderr: bytearray()}
        self.truncated = False
        self.inbox = bytearray()  # the channel's unread bytes
        self.outbox = bytearray()  # stdin's unwritten bytes
        self.open = {self.stdout, self.stderr, self.channel}
        self.result: dict | None = None
        if kind == "run":  # the program goes over the job's own stdin, never through the zygote
            data = json.dumps({"program": program}).encode()
            self.outbox += struct.pack(">I", len(data)) + data

    @staticmethod
    def _close_all(fds) -> None:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def _pump(self, until, timeout: float | None = None) -> bool:
        """Move bytes until `until()` holds (True) or the deadline / every stream closes (False)."""
        end = self.deadline if timeout is None else min(self.deadline, time.monotonic() + timeout)
        while not until():
            left = end - time.monotonic()
            if left <= 0 or (not self.open and not self.outbox):
                return until()
            writers = [self.stdin] if self.outbox and self.stdin is not None else []
            if not self.open and not writers:
                return until()
            readable, writable, _ = select.select(list(self.open), writers, [], min(left, 1.0))
            for fd in writable:
                try:
                    del self.outbox[: os.write(fd, self.outbox[: 1 << 16])]
                except (BrokenPipeError, OSError):
                    self.outbox.clear()
            for fd in readable:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    self.open.discard(fd)
                elif fd == self.channel:
                    if len(self.inbox) + len(chunk) > sandbox_worker.MAX_FRAME + 4:
                        self.open.discard(fd)  # a flood on the channel: stop listening, the job fails
                        self.inbox.clear()
                    else:
                        self.inbox += chunk
                else:
                    tail = self.tails[fd]
                    tail += chunk
                    if len(tail) > self.limits.output_bytes:
                        self.truncated = True
                        del tail[: len(tail) - self.limits.output_bytes]
        return True

    def request(self, message: dict) -> dict | None:
        """Send one request frame and wait for its reply frame; None when the child is gone or the time is up."""
        data = json.dumps(message).encode()
        self.outbox += struct.pack(">I", len(data)) + data
        return self.reply()

    def reply(self) -> dict | None:
        def complete() -> bool:
            if len(self.inbox) < 4:
                return False
            return len(self.inbox) >= 4 + struct.unpack(">I", self.inbox[:4])[0]

        if not self._pump(complete) and not complete():
            return None
        (size,) = struct.unpack(">I", self.inbox[:4])
        body = bytes(self.inbox[4: 4 + size])
        del self.inbox[: 4 + size]
        try:
            message = json.loads(body)
        except (ValueError, RecursionError):
            return None
        return message if isinstance(message, dict) else None

    def feed(self, data: bytes) -> None:
        self.outbox += data

    def finish(self) -> Execution:
        """Close stdin, read every stream to its end, and collect the zygote's word on how the child ended."""
        self._pump(lambda: not self.outbox)
        self._close_all([self.stdin])
        self.stdin = None
        self._pump(lambda: not self.open)
        answer = self.sandbox._answer(self.deadline - time.monotonic() + 3.0) if self.sandbox.alive else None
        self._close_all(list(self.open | {self.stdout, self.stderr, self.channel}))
        if answer is None or "returncode" not in answer:
            self.sandbox.alive = False  # lost (the memory cgroup's OOM killer, or past the backstop): a new one
            timed_out = time.monotonic() >= self.deadline
            answer = {"returncode": None if timed_out else -9, "timed_out": timed_out, "dirty": "lost"}
        if answer.get("dirty"):
            self.sandbox.alive = False
        out, err = (bytes(self.tails[fd]).decode("utf-8", "replace") for fd in (self.stdout, self.stderr))
        if answer.get("dirty") == sandbox_worker.NAMESPACES_FAILED:  # the code never ran: the sample is dropped
            raise SandboxError(f"{sandbox_worker.NAMESPACES_FAILED}: {err.strip()[-200:]}")
        timed_out = bool(answer["timed_out"])
        events = answer.get("events")
        events = tuple(str(e)[:160] for e in events[:64]) if isinstance(events, list) else ()
        return Execution(None if timed_out else answer["returncode"], out, err, timed_out,
                         time.monotonic() - self.start, bytes(self.inbox), self.truncated, events)


# -----------------------------------------------------------------------------------------------------------------
# The pool and what this machine enforces
# -----------------------------------------------------------------------------------------------------------------

_STATE: dict = {}
_LOCK = threading.Lock()
_IDLE: dict[Limits, list[Sandbox]] = {}


def _pool_key(limits: Limits) -> Limits:
    # Sandboxes differ only in what their cgroups and tmpfs cap; the time limit and output tails are per job.
    return Limits(timeout=0, memory_mb=limits.memory_mb, file_size_mb=limits.file_size_mb, disk_mb=limits.disk_mb,
                  open_files=limits.open_files, processes=limits.processes, output_bytes=limits.output_bytes)


@contextmanager
def acquire(limits: Limits = Limits()):
    """A sandbox of this pool for the caller's jobs (one thread at a time); back to the pool afterwards when it is
    still healthy, else closed (a fresh one next time)."""
    protections()
    key = _pool_key(limits)
    with _LOCK:
        idle = _IDLE.setdefault(key, [])
        box = idle.pop() if idle else None
    if box is None or not box.alive:
        box = Sandbox(limits, _STATE["mode"])
    try:
        yield box
    finally:
        if box.alive:
            with _LOCK:
                _IDLE.setdefault(key, []).append(box)
        else:
            box.close()


def shutdown() -> None:
    """Close every idle sandbox and helper process (at exit; tests that want fresh ones)."""
    with _LOCK:
        boxes = [box for idle in _IDLE.values() for box in idle]
        _IDLE.clear()
        helpers = list(_TRUSTED_IDLE)
        _TRUSTED_IDLE.clear()
    for box in boxes:
        box.close()
    for helper in helpers:
        helper.close(wait=10.0)


atexit.register(shutdown)


_PROBE = r"""
import ctypes, json, os, socket
out = {}
try:
    s = socket.create_connection(("127.0.0.1", {port}), timeout=2); s.close(); out["network"] = False
except OSError:
    out["network"] = True
try:
    open(os.path.join({outside!r}, "written"), "w").write("x"); out["read_only"] = False
except OSError:
    out["read_only"] = True
out["host_paths"] = [p for p in {host_paths!r} if os.path.exists(p)]
home = {home!r}
try:
    out["home"] = sorted(set(os.listdir(home)) - set({home_ok!r}))
except OSError:  # not there, or closed to this uid
    out["home"] = []
out["uid"] = os.getuid()
libc = ctypes.CDLL(None, use_errno=True)
header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # capget: _LINUX_CAPABILITY_VERSION_3, this process
caps = (ctypes.c_uint32 * 6)()
out["caps"] = hex(caps[0] | caps[3] << 32) if libc.capget(header, caps) == 0 else "unknown"
out["nested_userns"] = libc.unshare(0x10000000) == 0
st = os.statvfs(".")
out["disk_mb"] = st.f_blocks * st.f_frsize >> 20
print(json.dumps(out))
"""


def _probe(mode: str) -> dict | None:
    """Start a sandbox in `mode` and look from inside; None when the mode does not start."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    outside = tempfile.mkdtemp(prefix="sandbox-probe-")
    host_paths = sorted({os.getcwd(), outside, str(Path(__file__).resolve().parent)} - {"/"})
    home = str(Path.home())
    home_ok = [p[len(home) + 1:].split("/")[0] for p in SYSTEM_DIRS if p.startswith(home + "/")]
    program = (_PROBE.replace("{port}", str(listener.getsockname()[1])).replace("{outside!r}", repr(outside))
               .replace("{host_paths!r}", repr(host_paths))
               .replace("{home!r}", repr(home)).replace("{home_ok!r}", repr(home_ok)))
    box = None
    try:
        box = Sandbox(Limits(), mode)
        job = box.job("run", 20.0, program)
        run = job.finish()
        if run.returncode != 0:
            return None
        seen = json.loads(run.stdout.strip().splitlines()[-1])
        seen["read_only"] = seen["read_only"] and not os.path.exists(os.path.join(outside, "written"))
        seen["seccomp"] = box.seccomp
        seen["shared"] = box.shared
        seen["ipc"], seen["pidns"] = box.namespaces.get("ipc"), box.namespaces.get("pid")
        seen["cgroups"] = list(box.cgroups.kinds) if box.cgroups else []
        seen["host_ipc"] = os.stat("/proc/self/ns/ipc").st_ino
        seen["host_pidns"] = os.stat("/proc/self/ns/pid").st_ino
        return seen
    except (SandboxError, ValueError, IndexError, KeyError, OSError):
        return None
    finally:
        if box is not None:
            box.close()
        listener.close()
        shutil.rmtree(outside, ignore_errors=True)


ESSENTIAL = ("non_root", "private_files", "network_isolated", "pid_namespace", "ipc_namespace",
             "no_nested_namespaces", "memory_cap")


def protections() -> dict[str, bool | str]:
    """What this machine enforces, probed once per process with a real sandboxed job. Keys: `namespaces` ("root",
    "user" or ""), `non_root`, `private_files` (no host path visible), `read_only_fs`, `network_isolated`,
    `pid_namespace`, `ipc_namespace`, `no_nested_namespaces` (seccomp), `capabilities_dropped`, `memory_cap`,
    `cpu_cap`, `process_limit`, `disk_limit`, `fresh_per_job` (each job gets pid, mount, IPC and network namespaces, a
    /proc and a tmpfs of its own: nothing it sets there reaches the next job), and the always-on `rlimits`,
    `env_allowlist`, `temp_dir`, `group_kill`; `why`: what is missing and why."""
    with _LOCK:
        if "protections" in _STATE:
            return dict(_STATE["protections"])
    found: dict[str, bool | str] = {
        "namespaces": "", "non_root": False, "private_files": False, "read_only_fs": False,
        "network_isolated": False, "pid_namespace": False, "ipc_namespace": False, "no_nested_namespaces": False,
        "capabilities_dropped": False, "memory_cap": False, "cpu_cap": False, "process_limit": False,
        "disk_limit": False, "fresh_per_job": False, "rlimits": True, "env_allowlist": True, "temp_dir": True,
        "group_kill": True,
        "why": ""}
    why: list[str] = []
    mode = "none"
    if sys.platform != "linux":
        why.append(f"namespaces are Linux-only (this is {sys.platform})")
        seen = None
    else:
        missing = [tool for tool in ("unshare", "setpriv", "mount", "sh") if not shutil.which(tool)]
        seen = None
        if missing:
            why.append(f"{', '.join(missing)} not found (util-linux)")
        else:
            for candidate in (("root", "user") if os.geteuid() == 0 else ("user",)):
                seen = _probe(candidate)
                if seen is not None:
                    mode = candidate
                    break
            else:
                why.append("unshare refused (no permission for namespaces here, e.g. a container's seccomp profile)")
        if seen is None:
            seen = _probe("none")
    if seen is not None:
        found.update(
            namespaces=mode if mode != "none" else "", non_root=seen["uid"] != 0 or mode == "user",
            private_files=not seen["host_paths"] and not seen["home"], read_only_fs=seen["read_only"],
            network_isolated=seen["network"] and mode != "none", pid_namespace=seen["pidns"] != seen["host_pidns"],
            ipc_namespace=seen["ipc"] != seen["host_ipc"], no_nested_namespaces=not seen["nested_userns"],
            capabilities_dropped=seen["caps"] == "0x0",
            memory_cap=any(k in seen["cgroups"] for k in ("memory", "v2")),
            cpu_cap="cpu" in seen["cgroups"] or "v2" in seen["cgroups"],
            process_limit=bool({"pids", "v2"} & set(seen["cgroups"])) or os.geteuid() != 0,
            disk_limit=mode != "none" and seen["disk_mb"] <= Limits().disk_mb + 1,
            fresh_per_job=mode != "none" and not seen["shared"])
        if seen["seccomp"]:
            why.append(seen["seccomp"])
        if mode != "none" and seen["shared"]:
            why.append(f"jobs share one set of namespaces ({seen['shared'][:120]})")
        if not found["memory_cap"] and os.geteuid() == 0:
            why.append("no memory cgroup could be created (cgroup v2 without delegation?)")
        if os.geteuid() != 0:
            why.append("not root: no cgroups (memory capped per process only)")
    else:
        why.append("the sandbox does not start at all")
    found["why"] = "; ".join(why)
    with _LOCK:
        _STATE["mode"] = mode
        _STATE["protections"] = found
    sweep()  # what runs killed before they could clean up left behind
    return dict(found)


_NAMES = (("non_root", "not root"), ("private_files", "no host files"), ("read_only_fs", "read-only root"),
          ("network_isolated", "no network"), ("pid_namespace", "own pids"), ("ipc_namespace", "own IPC"),
          ("no_nested_namespaces", "seccomp: no nested namespaces/ptrace"), ("memory_cap", "memory cap"),
          ("cpu_cap", "CPU cap"), ("process_limit", "process cap"), ("disk_limit", "tmpfs size cap"),
          ("fresh_per_job", "fresh namespaces per job"))


def missing() -> list[str]:
    """The essential protections this machine does not give (what `require_sandbox` refuses on)."""
    p = protections()
    return [name for key, name in _NAMES if key in ESSENTIAL and not p[key]]


# What only the mount, network and pid namespaces give: without them the code reads every file its uid can read,
# reaches the network (the cloud's metadata service, the machine's own services) and sees and signals the other
# sandboxes' processes (same uid). A run is refused there unless allow_unsandboxed_code (grpokit/run.py).
ISOLATION = ("private_files", "network_isolated", "pid_namespace")


def unisolated() -> list[str]:
    """The namespace protections this machine does not give ([] where the sandbox isolates the code)."""
    p = protections()
    return [name for key, name in _NAMES if key in ISOLATION and not p[key]]


def describe() -> str:
    """One line for the run's log: what the sandbox enforces here and what it could not."""
    p = protections()
    on = [name for key, name in _NAMES if p[key]]
    off = [name for key, name in _NAMES if not p[key]]
    kind = f"{p['namespaces']} namespaces" if p["namespaces"] else "NO namespaces"
    line = f"code sandbox ({kind}): {', '.join(on) or 'rlimits only'}, rlimits, env allow-list"
    if off:
        line += f"; NOT enforced: {', '.join(off)}" + (f" ({p['why']})" if p["why"] else "")
    return line


def log_protections_once() -> bool:
    """Log what the sandbox enforces here, once per process; True for the call that logged it."""
    with _LOCK:
        if _STATE.get("logged"):
            return False
        _STATE["logged"] = True
    line = describe()
    (log.warning if "NOT enforced" in line else log.info)("%s", line)
    return True


def run_python(program: str, limits: Limits = Limits(), stdin: bytes = b"", channel: bool = False) -> Execution:
    """Run `program` (Python source) as `__main__` in a sandbox of the pool. What it writes to fd 3 comes back as
    `channel`. Raises SandboxError when the sandbox itself fails."""
    with acquire(limits) as box:
        job = box.job("run", limits.timeout, program)
        job.feed(stdin)
        return job.finish()


class Session:
    """A completion's code loaded in a sandbox child, answering calls with plain data (rewards/code/reward.py judges)."""

    def __init__(self, job: Job):
        self.job = job
        self.loaded: dict | None = None
        self.ended = False

    def load(self, solution: str) -> dict | None:
        self.loaded = self.job.request({"solution": solution})
        return self.loaded

    def names(self, names: list[str]) -> dict[str, list]:
        answer = self.job.request({"op": "names", "names": names}) if not self.ended else None
        if answer is None or not isinstance(answer.get("names"), dict):
            self.ended = True
            return {}
        return answer["names"]

    def request(self, message: dict) -> dict | None:
        """One request and its reply (a result, or a callback the code makes into the tests); None when the
        child is gone or its time is up: every request after that is None too."""
        if self.ended:
            return None
        answer = self.job.request(message)
        if answer is None:
            self.ended = True
        return answer


@contextmanager
def serve(limits: Limits = Limits()):
    """A Session in a pooled sandbox; `session.result` holds the child's Execution after the block."""
    with acquire(limits) as box:
        session = Session(box.job("serve", limits.timeout))
        try:
            yield session
        finally:
            session.result = session.job.finish()


# -----------------------------------------------------------------------------------------------------------------
# The trusted side's own process: where the tests run on the code's answers
# -----------------------------------------------------------------------------------------------------------------

_TRUSTED_MAIN = """
import sys
sys.path.insert(0, sys.argv[1])
from rewards.code.sandbox import trusted_main
trusted_main(sys.argv[2])
"""
TRUSTED_MEMORY_MB = 4096  # address space (soft rlimit): one huge allocation fails as MemoryError
TRUSTED_CGROUP_MB = 1024  # resident memory of the helper (a memory cgroup, where this process may make one)


def _report_start() -> None:
    """In a helper process: tell the caller, once per call, that the call's first sandbox job has started, so its
    own time limit runs from now (`trusted_call`'s `grace` ends). Nothing elsewhere."""
    out = _STATE.get("trusted_out")
    if out is None or _STATE.get("reported"):
        return
    _STATE["reported"] = True
    with contextlib.suppress(OSError, ValueError):
        write_frame(out, {"started": True})


def _end_with_the_trainer() -> None:
    """A watchdog child that kills this helper's process group once the trainer that started it is gone. A trainer
    killed at once (kill -9, a runner's time limit) cannot kill its helpers, and a helper spinning on the code's
    answers (a test's arithmetic on a huge number, in C, holding the GIL: no thread of its own would run) would spin
    on with no one to read its answer. The watchdog only sleeps and reads one /proc line a second; it is in the
    helper's group (start_new_session made the helper its leader), so it goes with it."""
    import signal as signals

    helper, trainer = os.getpid(), os.getppid()
    if os.fork() != 0:
        return
    try:
        # none of the helper's pipes: the trainer reads the end of its answers pipe as the helper's death (its memory
        # cap's OOM killer), which a copy held here would hide
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 1024)
        while True:
            time.sleep(1.0)
            try:
                with open(f"/proc/{helper}/stat", encoding="utf-8") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                break  # the helper is gone
            if parent != trainer:
                os.killpg(helper, signals.SIGKILL)
    finally:
        os._exit(0)


def trusted_main(probed: str = "") -> None:
    """A helper process's loop: read {"target": "module:function", "payload": {...}} frames, answer each with
    {"ok": result} or {"error": ...} (a SandboxError) or {"crash": ...}. Frames go over a copy of stdout; the real
    stdout goes to stderr, so nothing a library prints can corrupt them. `probed`: the trainer's probe of this
    machine (JSON), so the helper neither probes again (a sandboxed job, inside its first call's deadline) nor
    sweeps."""
    import importlib
    import resource

    _end_with_the_trainer()
    if probed:
        with _LOCK:
            _STATE.update(json.loads(probed), logged=True)
    out = os.dup(1)
    os.dup2(2, 1)
    _STATE["trusted_out"] = out
    try:  # a bomb of the code's data (a huge int in a test's arithmetic) ends here as MemoryError; the soft limit
        # only: the sandboxes this process starts inherit it, and each sets its own memory_mb above it if asked
        limit = TRUSTED_MEMORY_MB << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except (ValueError, OSError):
        pass
    while True:
        try:
            message = read_frame(0)
        except (OSError, ValueError):
            return
        if message is None:
            return
        _STATE["reported"] = False
        try:
            module, function = message["target"].split(":")
            answer = {"ok": getattr(importlib.import_module(module), function)(**message["payload"])}
        except SandboxError as err:
            answer = {"error": str(err)[:500]}
        except BaseException as err:  # noqa: BLE001 (whatever the code's data did to the tests: reported, not fatal)
            answer = {"crash": f"{type(err).__name__}: {str(err)[:300]}"}
        try:
            write_frame(out, answer)
        except (OSError, ValueError, TypeError):
            write_frame(out, {"crash": "unserialisable answer"})


class _Trusted:
    """A helper process that runs the tests on the code's answers, and holds the sandboxes it uses. Hostile data
    can slow it, fill its memory or crash it, never the trainer: the caller waits on a pipe (without the GIL) and
    kills it at the deadline. As root it runs in a memory cgroup of its own (TRUSTED_CGROUP_MB; its sandboxes'
    groups go beside it, under the trainer's), so what the code's answers make the tests build is capped there."""

    def __init__(self):
        root = str(Path(__file__).resolve().parents[2])  # the checkout: rewards/code/sandbox.py
        protections()  # probed here once, handed to every helper
        with _LOCK:
            probed = json.dumps({"mode": _STATE["mode"], "protections": _STATE["protections"],
                                 "cgroup_parents": {c: _own_cgroup(c) for c in ("memory", "cpu", "pids", "")}})
        self.died = False
        self.cgroups = _Cgroups(Limits(memory_mb=TRUSTED_CGROUP_MB, disk_mb=0), helper=True) \
            if os.geteuid() == 0 else None
        command = [sys.executable, "-c", _TRUSTED_MAIN, root, probed]
        if self.cgroups and self.cgroups.procs:
            command = ["sh", "-c", _ENTER, "enter", *self.cgroups.procs, "--", *command]
        try:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            if self.cgroups:
                self.cgroups.remove()
            raise

    def call(self, target: str, payload: dict, seconds: float, grace: float = 0.0) -> dict | None:
        """The answer, or None past the deadline: `seconds` + `grace` from now, or `seconds` from the call's report
        that its first sandbox job started, whichever is first. {"crash"} when the helper died before it."""
        try:
            write_frame(self.process.stdin.fileno(), {"target": target, "payload": payload})
        except OSError:
            return None
        fd = self.process.stdout.fileno()
        end = time.monotonic() + seconds + grace
        while True:
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                return None
            try:
                answer = read_frame(fd)
            except (OSError, ValueError):
                return None
            if answer is None:  # it died before its deadline: its memory cap's OOM killer, or a crash
                self.died = True
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=2)
                oom = self.cgroups is not None and self.cgroups.oom_kills() > 0
                why = f"over its memory cap of {TRUSTED_CGROUP_MB} MiB" if oom else \
                    f"exit status {self.process.returncode}"
                return {"crash": f"the process running the tests on its answers died ({why})"}
            if answer == {"started": True}:
                end = min(end, time.monotonic() + seconds)
                continue
            return answer if isinstance(answer, dict) else None

    def close(self, wait: float = 0.0) -> None:
        """Idle (`wait` seconds): end of input, so it closes its sandboxes and exits; then, or at once for one past
        its deadline, it is killed, and what its sandboxes left on the host is removed here."""
        if wait:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=wait)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        if self.cgroups:
            self.cgroups.remove()
        sweep(self.process.pid)


_TRUSTED_IDLE: list[_Trusted] = []


def trusted_call(target: str, payload: dict, seconds: float, grace: float = 0.0) -> dict | None:
    """`target(**payload)` ("module:function") in a helper process of the pool; its answer ({"ok"}, {"error"},
    {"crash"}, also when the helper died), or None when it ran past its deadline (then it is killed, with the
    sandboxes it held). The deadline: `seconds` from the start of the call's first sandbox job; `grace` is what
    getting there may take (a fresh helper, a sandbox start), granted only before that job starts."""
    with _LOCK:
        worker = _TRUSTED_IDLE.pop() if _TRUSTED_IDLE else None
    if worker is None or worker.process.poll() is not None:
        if worker is not None:
            worker.close()
        worker = _Trusted()
    answer = worker.call(target, payload, seconds, grace)
    if answer is None or worker.died:
        worker.close()
        return answer
    with _LOCK:
        _TRUSTED_IDLE.append(worker)
    return answer


__all__ = ["Limits", "Execution", "SandboxError", "Sandbox", "Session", "acquire", "serve", "run_python",
           "protections", "describe", "missing", "unisolated", "log_protections_once", "decode", "encode",
           "write_frame"]


# -----------------------------------------------------------------------------------------------------------------
# An external sandbox service
# -----------------------------------------------------------------------------------------------------------------


@dataclass
class SandboxFusion:
    """Client of a SandboxFusion server (bytedance/SandboxFusion, the service verl's code rewards call):
    POST {url}/run_code with {"code", "language": "python", "run_timeout", "memory_limit_MB"}; the answer is
    {"status": "Success" | "Failed" | "SandboxError", "run_result": {"status": "Finished" | "TimeLimitExceeded" |
    "Error", "return_code", "stdout", "stderr", ...}, ...}. The service runs the code; nothing runs here. It has no
    result channel, so the program prints its results on stdout (see rewards/code/reward.py)."""

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

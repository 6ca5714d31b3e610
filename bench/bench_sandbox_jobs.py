"""What one sandbox job costs: N trivial jobs (`pass`) one after another in one warm sandbox.

Wall time per job (median, p90) as the caller sees it, and CPU time per job inside the sandbox: the zygote's own and
that of every process it waited for (utime + stime + cutime + cstime of its /proc/<pid>/stat), which other load on
the machine disturbs far less than wall time. Each job's namespaces (rewards/code/sandbox_worker.py `job_in_namespaces`)
are part of both.

    .venv/bin/python bench/bench_sandbox_jobs.py        # 200 jobs
    .venv/bin/python bench/bench_sandbox_jobs.py 1000
"""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from rewards.code import sandbox  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime, stime, cutime, cstime


def main(n: int) -> None:
    print(sandbox.describe())
    with sandbox.acquire(sandbox.Limits(timeout=5)) as box:
        for _ in range(5):  # warm: the first jobs import what the rest reuse
            box.job("run", 5, "pass").finish()
        zygote = next(p.pid for p in psutil.Process(box.process.pid).children(recursive=True) if "python" in p.name())
        walls = []
        cpu = cpu_seconds(zygote)
        for _ in range(n):
            start = time.perf_counter()
            run = box.job("run", 5, "pass").finish()
            walls.append(time.perf_counter() - start)
            assert run.returncode == 0, run
        cpu = cpu_seconds(zygote) - cpu
    walls.sort()
    print(f"{n} jobs: wall median {statistics.median(walls) * 1000:.1f} ms, p90 {walls[int(n * 0.9)] * 1000:.1f} ms; "
          f"sandbox CPU {cpu / n * 1000:.2f} ms a job; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)

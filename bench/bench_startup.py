"""Wall time of `--help`, `--dry-run` and the quick test (goals: <= 0.5 s, <= 2 s, <= 90 s with a warm cache).

    .venv/bin/python bench/bench_startup.py            # 5 x help, 5 x dry-run, 1 x quick test
    .venv/bin/python bench/bench_startup.py --no-train # startup only
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def wall(args, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "train_grpo.py", *args], cwd=ROOT, env=ENV, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def peak_rss_run(args):
    """Wall time and peak RSS (MiB) of one run, from the child's rusage."""
    import resource

    start = time.perf_counter()
    subprocess.run([sys.executable, "train_grpo.py", *args], cwd=ROOT, env=ENV, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    return elapsed, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main() -> None:
    help_times = wall(["--help"], 5)
    dry_times = wall(["--quick-test", "--dry-run"], 5)
    print(f"--help:                 median {statistics.median(help_times):.2f} s (min {min(help_times):.2f})")
    print(f"--quick-test --dry-run: median {statistics.median(dry_times):.2f} s (min {min(dry_times):.2f})")
    if "--no-train" in sys.argv:
        return
    with tempfile.TemporaryDirectory() as tmp:
        wall([], 0)
        elapsed, rss = peak_rss_run(["--quick-test", "--output-dir", tmp])
        summary = json.loads((Path(tmp) / "metrics_summary.json").read_text())
    print(f"--quick-test:           {elapsed:.1f} s wall, peak RSS {rss:.0f} MiB, "
          f"train {summary['train_seconds']} s, generation logging {summary.get('generation_logging_seconds')} s, "
          f"greedy eval {(summary.get('generation_eval') or {}).get('baseline')} -> {(summary.get('generation_eval') or {}).get('final')}")


if __name__ == "__main__":
    main()

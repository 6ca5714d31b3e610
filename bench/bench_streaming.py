"""Streaming reads only what a run needs: `--dry-run --max-samples 64 --streaming` on a small and a large JSONL.

    .venv/bin/python bench/bench_streaming.py [--rounds 3] [--small 5000] [--large 200000]

Runs the real CLI as a subprocess, alternating small/large each round, and reports the median wall time and the
peak RSS (ru_maxrss of the child) of each, with and without --streaming. Goal: the large file costs at most
1.5x the small one in time with streaming, and peak RSS stays flat.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_rows(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for i in range(n):
            a, b = i % 97, (i * 7) % 89
            handle.write(json.dumps({"question": f"What is {a} + {b}? Answer with just the number. (#{i})",
                                     "answer": str(a + b)}) + "\n")


def run_once(path: Path, streaming: bool) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one dry run in a fresh process."""
    args = [sys.executable, str(ROOT / "train_grpo.py"), "--quick-test", "--custom-data", str(path), "--max-samples",
            "64", "--dry-run"] + (["--streaming"] if streaming else [])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "GRPO_CACHE_DIR": os.environ.get("GRPO_CACHE_DIR", str(Path.home() / ".cache" / "grpo-cli"))}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"dry run failed: {result.stderr[-2000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # max over children so far: kB on Linux
    return wall, max(peak, before) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small", type=int, default=5000)
    parser.add_argument("--large", type=int, default=200000)
    parser.add_argument("--no-baseline", action="store_true", help="skip the runs without --streaming")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = {"small": Path(tmp) / "small.jsonl", "large": Path(tmp) / "large.jsonl"}
        write_rows(files["small"], args.small)
        write_rows(files["large"], args.large)
        modes = [True] if args.no_baseline else [True, False]
        results: dict[str, list[tuple[float, float]]] = {}
        for streaming in modes:
            # RSS of a child is only measurable per process via a fresh getrusage baseline, so each measurement
            # runs in its own helper process below.
            for _ in range(args.rounds):
                for name in ("small", "large"):
                    key = f"{name}{'' if streaming else ' (no streaming)'}"
                    results.setdefault(key, []).append(measure(files[name], streaming))
        rows = {k: {"median_s": round(statistics.median(w for w, _ in v), 2),
                    "peak_rss_mib": round(max(r for _, r in v))} for k, v in results.items()}
        rows["ratio_large_over_small_streaming"] = round(rows["large"]["median_s"] / rows["small"]["median_s"], 2)
        print(json.dumps(rows, indent=2))


def measure(path: Path, streaming: bool) -> tuple[float, float]:
    """One measurement in a fresh helper process, so ru_maxrss is this dry run's own peak."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); from bench_streaming import run_once; "
            f"from pathlib import Path; print(*run_once(Path({str(path)!r}), {streaming}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), float(out[1])


if __name__ == "__main__":
    main()

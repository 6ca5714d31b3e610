"""Resident memory of a command over time: where its peak is, and how much of it is anonymous vs file-backed.

GNU time's %M (bench_speed.py) gives only the peak; this samples /proc/PID/status every 50 ms (Linux), so the peak
can be placed in a phase (generation, forward/backward) and split into anonymous memory (tensors, malloc's heap) and
file-backed pages (mmapped safetensors and GGUF weights, shared libraries).

    .venv/bin/python bench/rss_timeline.py [--out timeline.tsv] -- python train_grpo.py --quick-test --no-4bit
"""

import argparse
import json
import re
import subprocess
import sys
import time

FIELDS = ("VmRSS", "RssAnon", "RssFile")


def sample(pid: int) -> dict[str, int] | None:
    """MiB per field, or None once the process is gone."""
    try:
        status = open(f"/proc/{pid}/status").read()
    except OSError:
        return None
    values = {}
    for field in FIELDS:
        match = re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE)
        values[field] = int(match.group(1)) // 1024 if match else 0
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between samples")
    parser.add_argument("--out", default="", help="write every sample here (seconds, then MiB per field, tab-separated)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    a = parser.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        parser.error("give the command after --")
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    rows = []
    while proc.poll() is None:
        values = sample(proc.pid)
        if values is not None and values["VmRSS"]:
            rows.append((time.perf_counter() - started, values))
        time.sleep(a.interval)
    if a.out:
        with open(a.out, "w") as handle:
            handle.write("seconds\t" + "\t".join(FIELDS) + "\n")
            for seconds, values in rows:
                handle.write(f"{seconds:.2f}\t" + "\t".join(str(values[f]) for f in FIELDS) + "\n")
    if not rows:
        sys.exit(f"no samples (the command ended within {a.interval} s, or /proc is missing); exit code {proc.returncode}")
    seconds, peak = max(rows, key=lambda row: row[1]["VmRSS"])
    summary = {"exit_code": proc.returncode, "peak_rss_mib": peak["VmRSS"], "anon_mib": peak["RssAnon"],
               "file_mib": peak["RssFile"], "at_seconds": round(seconds, 2), "samples": len(rows)}
    print(f"peak RSS {peak['VmRSS']} MiB at {seconds:.1f} s: {peak['RssAnon']} MiB anonymous, {peak['RssFile']} MiB "
          f"file-backed ({len(rows)} samples)")
    print(json.dumps(summary))
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()

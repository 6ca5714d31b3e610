"""The row format of BENCHMARKS.md's tables: every benchmark prints its figures as rows a reader pastes there, each
with the machine, the date and the commit it was measured at."""

from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def machine() -> str:
    """The CPU in BENCHMARKS.md's words: cores, model, and whether it has bf16 units (the trainer's dtype)."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    units = "bf16 units" if flags & {"avx512_bf16", "amx_bf16"} else "AVX2 only" if "avx2" in flags else "no AVX2"
    return f"{os.cpu_count()} vCPUs, {model}, {units}"


def stamp() -> str:
    """'date, `commit`' (a trailing + when the working tree differs from the commit)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return ""

    commit = git("rev-parse", "--short=7", "HEAD") or "unknown"
    dirty = "+" if git("status", "--porcelain", "--untracked-files=no") else ""
    return f"{datetime.datetime.now(datetime.UTC).date()}, `{commit}{dirty}`"


def row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def header(*columns: str) -> str:
    return row(*columns) + "\n" + row(*["---"] * len(columns))

"""Mapping 100k custom JSONL rows (goal: <= 10 s on 2 cores; a second run near-instant).

    .venv/bin/python bench/bench_data.py [--rows N]
"""

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data_loader import load_grpo_dataset  # noqa: E402


def main(n: int = 100_000) -> None:
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.jsonl"
        with path.open("w") as handle:
            for i in range(n):
                handle.write(json.dumps({"prompt": f"Question {i}: " + "word " * rng.randint(5, 60),
                                         "chosen": "good " * rng.randint(5, 50),
                                         "rejected": "bad " * rng.randint(5, 50)}) + "\n")
        for attempt in ("first run", "second run"):
            start = time.perf_counter()
            train, evaluation, report = load_grpo_dataset(custom_data=str(path), eval_fraction=0.01, seed=0)
            elapsed = time.perf_counter() - start
            print(f"{attempt}: {n} rows -> {len(train)} train + {len(evaluation)} eval in {elapsed:.2f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows in the JSONL file (the goal's figure: 100000)")
    main(parser.parse_args().rows)

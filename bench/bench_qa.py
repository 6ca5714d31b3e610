"""The `qa` reward against a person's verdicts: agreement on each part of `tests/fixtures/qa_judged_pairs.jsonl`
(`dev`, the pairs the reader was tuned on; `held_out`, pairs written at the same time and not tuned on), how many
answers a person marks wrong score above 0 (hedges, negations, other units and currencies must not), and the time per
pair.

    .venv/bin/python bench/bench_qa.py            # the table rows
    .venv/bin/python bench/bench_qa.py --show dev # and the pairs where the reward and the person disagree
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from rewards.components import QA  # noqa: E402
from rewards.qa_reading import normalise, reference_kind, reference_words  # noqa: E402

PAIRS = ROOT / "tests" / "fixtures" / "qa_judged_pairs.jsonl"


def load() -> list[dict]:
    return [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]


def scores(pairs: list[dict]) -> list[float]:
    qa = QA()
    return [qa.score_one(p["completion"], p["reference"]) for p in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", choices=["dev", "held_out", "all"], help="print the disagreements of a part")
    parser.add_argument("--repeat", type=int, default=50, help="timing rounds over every pair (default 50)")
    args = parser.parse_args()
    from table import header, machine, row, stamp

    pairs = load()
    scored = scores(pairs)
    print(f"{machine()}; {stamp()}; {len(pairs)} pairs")
    print(header("part", "pairs", "agreement", "wrong answers scored above 0"))
    for part in ("dev", "held_out"):
        rows = [(p, s) for p, s in zip(pairs, scored, strict=True) if p["part"] == part]
        agree = sum((s == 1.0) == bool(p["verdict"]) for p, s in rows)
        leaks = sum(s > 0 and not p["verdict"] for p, s in rows)
        print(row(part, len(rows), f"{agree}/{len(rows)} ({100 * agree / len(rows):.1f} %)", leaks))
        if args.show in (part, "all"):
            for p, s in rows:
                if (s == 1.0) != bool(p["verdict"]):
                    print(f"  {p['reference']!r:28} {p['completion']!r:44} person {p['verdict']} reward {s:g}"
                          f"  ({p['note']})")
    qa = QA()
    rounds = []
    for _ in range(args.repeat):
        # cold: the reader caches what it made of a text, and a run's completions are all new
        normalise.cache_clear()
        reference_kind.cache_clear()
        reference_words.cache_clear()
        start = time.perf_counter()
        for p in pairs:
            qa.score_one(p["completion"], p["reference"])
        rounds.append((time.perf_counter() - start) / len(pairs) * 1e6)
    print(f"time per pair, caches cleared each round: {min(rounds):.0f} µs in the best of {args.repeat} rounds, "
          f"{sum(rounds) / len(rounds):.0f} µs on average")


if __name__ == "__main__":
    main()

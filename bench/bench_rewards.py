"""Rule-based rewards on 10,000 completions (goal: <= 1 s on a 2-core box).

    .venv/bin/python bench/bench_rewards.py
"""

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rewards import build_reward_functions, load_reward_config, parse_reward_config  # noqa: E402


def main(n: int = 10_000) -> None:
    rng = random.Random(0)
    words = "the model adds numbers because step for example answer think therefore 따라서 12 7 19".split()
    completions = [[{"role": "assistant", "content": " ".join(rng.choices(words, k=rng.randint(5, 120)))}]
                   for _ in range(n)]
    # As GRPO calls rewards: groups of num_generations=4 completions share one prompt and its references.
    group = 4
    answers = [a for _ in range(n // group) for a in [str(rng.randint(0, 30))] * group]
    chosen = [c for _ in range(n // group) for c in [" ".join(rng.choices(words, k=40))] * group]
    rejected = [r for _ in range(n // group) for r in [" ".join(rng.choices(words, k=40))] * group]
    from table import header, machine, row, stamp  # BENCHMARKS.md's reward-preset rows

    print(f"{machine()}; {stamp()}; {n} completions in groups of {group}")
    print(header("preset", "components", "time"))
    for preset in ("arithmetic", "math", "keywords", "balanced"):
        data, source = load_reward_config(preset)
        reward_set = parse_reward_config(data, source, max_completion_length=256)
        (single,), _ = build_reward_functions(reward_set, "single")
        start = time.perf_counter()
        single(prompts=[None] * n, completions=completions, answer=answers, chosen=chosen, rejected=rejected)
        elapsed = time.perf_counter() - start
        print(row(preset, " + ".join(reward_set.names), f"{elapsed:.2f} s"))


if __name__ == "__main__":
    main()

"""Your own reward: TRL's contract, fn(prompts, completions, **columns) -> list[float | None].

    python train_grpo.py --quick-test --reward examples.my_rewards:brevity

Dataset columns (answer, chosen, tests, ...) arrive as keyword arguments; return None for a completion you cannot
score (it is left out of its group's baseline).
"""


def brevity(prompts, completions, **columns):
    """1.0 for a reply of at most 5 words, falling to 0 at 25 words."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [max(0.0, min(1.0, (25 - len(text.split())) / 20)) for text in texts]

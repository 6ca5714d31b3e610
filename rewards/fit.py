"""Do the rewards fit the data? Checked on the data's own rows before a model loads.

A reward that cannot score a dataset (an exact-answer reward on preference rows that have no answer) returns None
for every completion: every group then has zero spread, every advantage is 0, and the run trains on nothing while
looking normal. Here each built-in component is called on a few real rows (with their reference texts as stand-in
completions); one that scores None on all of them cannot score this data.
"""

from __future__ import annotations

from typing import Any

# Components whose score needs no model and has no side effects: cheap and safe to call on a few rows up front.
# A user's function (custom) or a reward model is not probed: it may call a service or load weights.
PROBED = {"accuracy", "format", "length", "repetition", "quality", "similarity"}
PROBE_ROWS = 8


def default_reward_preset(config, data_format: str) -> str:
    """The reward preset a dataset gets when none is named: math for exact answers, the built-in task's own for
    arithmetic, keyword rewards for prompt-only data (nothing to compare against), balanced for preference data."""
    from data_loader import CUSTOM_FORMATS, DATASETS

    if config.custom_data or data_format in CUSTOM_FORMATS:
        return {"qa": "math", "prompt": "keywords", "tests": "code"}.get(data_format, "balanced")
    return DATASETS[config.dataset].default_rewards if config.dataset in DATASETS else "balanced"


def unscorable_components(reward_set, dataset) -> list[str]:
    """Names of the probed components that score None on every one of the first rows."""
    n = min(PROBE_ROWS, len(dataset))
    if n == 0:
        return []
    rows = [dataset[i] for i in range(n)]
    columns = {k: [row.get(k) for row in rows] for k in ("chosen", "rejected", "answer") if k in rows[0]}
    stand_ins = [str(row.get("answer") or row.get("chosen") or "a short reply") for row in rows]
    completions = [[{"role": "assistant", "content": text}] for text in stand_ins]
    prompts = [row["prompt"] for row in rows]
    missing = []
    for component in reward_set.components:
        if getattr(component, "name", "") not in PROBED or getattr(component, "backend", "lexical") != "lexical":
            continue
        if any(c not in columns for c in getattr(component, "needs", ())):
            continue  # check_columns names the missing column
        values = component(prompts=prompts, completions=completions, **columns)
        if all(v is None for v in values):
            missing.append(component.__name__)
    return missing


class UserRewardFunction:
    """A Python API user's own reward function, `fn(prompts, completions, **columns) -> list`, as a component."""

    needs: tuple[str, ...] = ()

    def __init__(self, fn):
        if not callable(fn):
            raise TypeError(f"reward_funcs: {fn!r} is not callable")
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, prompts=None, completions=None, **columns: Any):
        return self.fn(prompts=prompts, completions=completions, **columns)


def add_reward_functions(reward_set, functions: list, weight: float = 1.0) -> None:
    """Append the user's functions to the reward set (weight 1 each), refusing a name TRL would log twice."""
    from config.errors import UsageError

    for fn in functions:
        component = UserRewardFunction(fn)
        if component.__name__ in reward_set.names:
            raise UsageError(f"reward_funcs: a reward named '{component.__name__}' is already in the reward set: "
                             "rename your function (TRL logs rewards by name).")
        reward_set.components.append(component)
        reward_set.weights.append(weight)

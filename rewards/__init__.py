"""Rewards: one registry, reward configs (the spec's format), and the single / multi builders.

A reward config names components by registry key: `<name>_weight` sets its weight, `<name>: {...}` its settings.
The spec's file is exactly this shape:

    {"accuracy_weight": 0.5, "length_weight": 0.2, "quality_weight": 0.3,
     "accuracy": {"correct_keywords": [...]}, "length": {"optimal_length": 100, "length_weight": 1.0},
     "quality": {"reward_scale": 1.0, "penalty_scale": -0.5, "quality_keywords": [...], "negative_keywords": [...]}}

Weights are 0 or more (0 turns a component off); penalties are penalties whichever sign their setting is written
with (see rewards/base.py).

'single' hands TRL one function (the weighted sum, one curve); 'multi' hands TRL one function per component with
`reward_weights`, so each is logged as `rewards/<name>/mean` and TRL's `reward` is the same weighted total.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config.errors import UsageError
from rewards.base import RewardComponent, RewardError, check_reward_output, completion_text, tool_calls, with_timeout
from rewards.code import CodeExecution
from rewards.components import QA, Accuracy, Custom, Format, Length, Quality, Repetition, RewardModel, Similarity

REGISTRY: dict[str, type[RewardComponent]] = {
    cls.name: cls
    for cls in (Accuracy, QA, Format, Length, Repetition, Quality, Similarity, RewardModel, CodeExecution, Custom)
}

REWARD_PRESET_DIR = Path(__file__).resolve().parent.parent / "config" / "rewards"


def reward_preset_names() -> list[str]:
    return sorted(p.stem for p in REWARD_PRESET_DIR.glob("*.json"))


def load_reward_config(name: str = "", path: str = "") -> tuple[dict[str, Any], str]:
    """The reward config dict and where it came from: a file path wins over a preset name."""
    from config.loader import read_json_file

    if path:
        return read_json_file(path, "Reward config"), path
    file = REWARD_PRESET_DIR / f"{name}.json"
    if not file.exists():
        raise UsageError(f"Unknown reward preset '{name}'. Valid presets: {', '.join(reward_preset_names())}.")
    return read_json_file(file, "Reward preset"), f"reward preset '{name}'"


@dataclass
class RewardSet:
    """The components and their weights, in config order."""

    components: list[RewardComponent]
    weights: list[float]

    @property
    def names(self) -> list[str]:
        return [c.__name__ for c in self.components]


def parse_reward_config(data: dict[str, Any], source: str, custom_rewards: list[str] = (),
                        max_completion_length: int = 0) -> RewardSet:
    """Validate a reward config and build its components."""
    weights: dict[str, float] = {}
    settings: dict[str, dict] = {}
    valid_keys = ["description", *REGISTRY, *(f"{n}_weight" for n in REGISTRY)]
    for key, value in data.items():
        if key == "description":
            continue
        if key.endswith("_weight") and key[: -len("_weight")] in REGISTRY:
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise UsageError(f"{source}: '{key}' must be a number, not {value!r}.")
            if value < 0:
                raise UsageError(
                    f"{source}: '{key}' is {value:g}: a negative weight turns the reward upside down (its best "
                    "completions would score lowest; penalties such as 'repetition' already score <= 0). Use a "
                    "positive weight, or 0 to turn it off."
                )
            weights[key[: -len("_weight")]] = float(value)
        elif key in REGISTRY:
            if not isinstance(value, dict):
                raise UsageError(f"{source}: '{key}' must be an object of settings, not {type(value).__name__}.")
            settings[key] = value
        else:
            near = difflib.get_close_matches(key, valid_keys, n=1, cutoff=0.6)
            hint = f" Did you mean '{near[0]}'?" if near else f" Valid rewards: {', '.join(REGISTRY)}."
            raise UsageError(f"{source}: unknown reward config key '{key}'.{hint}")
    for name in settings:
        if name not in weights:
            raise UsageError(f"{source}: '{name}' has settings but no '{name}_weight': add a weight (0 disables it).")
    components, component_weights = [], []
    for name, weight in weights.items():
        if weight == 0:
            continue
        cfg = dict(settings.get(name, {}))
        if name == "length" and max_completion_length and "max_completion_length" not in cfg:
            cfg["max_completion_length"] = max_completion_length
        components.append(REGISTRY[name].from_settings(cfg, source))
        component_weights.append(weight)
    for path in custom_rewards:
        components.append(Custom(function=path))
        component_weights.append(1.0)
    if not components:
        raise UsageError(f"{source}: no reward has a non-zero weight: set at least one '<name>_weight'.")
    names = [c.__name__ for c in components]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise UsageError(f"{source}: two rewards are named {', '.join(sorted(duplicates))}: TRL logs by name.")
    return RewardSet(components, component_weights)


class WeightedSum:
    """'single' mode: one TRL reward function = sum(weight * component). Components that return None for a
    sample (not applicable) contribute nothing to it. A component that raises or runs past `timeout` seconds
    (0 = no limit) raises RewardError naming it. Picklable; its metric name is `reward_total`."""

    __name__ = "reward_total"

    def __init__(self, reward_set: RewardSet, timeout: float = 0.0):
        self.reward_set = reward_set
        self.timeout = timeout

    def components(self, prompts=None, completions=None, **columns) -> dict[str, list[float | None]]:
        n = len(completions or [])
        out = {}
        for c in self.reward_set.components:
            values = with_timeout(c, self.timeout, c.__name__)(prompts=prompts, completions=completions, **columns)
            out[c.__name__] = check_reward_output(c.__name__, values, n)
        return out

    def __call__(self, prompts=None, completions=None, **columns) -> list[float]:
        return weighted_total(self.components(prompts, completions, **columns), self.reward_set.weights)


def weighted_total(per_component: dict[str, list[float | None]], weights: list[float]) -> list[float]:
    columns = list(per_component.values())
    n = len(columns[0]) if columns else 0
    return [sum(w * v for w, col in zip(weights, columns, strict=True) if (v := col[i]) is not None)
            for i in range(n)]


class CheckedReward:
    """'multi' mode wrapper: the component's output checked (count, finite numbers) so a broken reward is named;
    an exception or a call past `timeout` seconds (0 = no limit) becomes a RewardError naming it."""

    def __init__(self, component: RewardComponent, timeout: float = 0.0):
        self.component = component
        self.timeout = timeout
        self.__name__ = component.__name__

    def __call__(self, prompts=None, completions=None, **columns):
        call = with_timeout(self.component, self.timeout, self.__name__)
        values = call(prompts=prompts, completions=completions, **columns)
        return check_reward_output(self.__name__, values, len(completions or []))


def build_reward_functions(reward_set: RewardSet, mode: str, timeout: float = 0.0) -> tuple[list, list[float] | None]:
    """(reward_funcs, reward_weights) for TRL's GRPOTrainer / GRPOConfig. `timeout`: seconds one reward call may
    take (the config's reward_timeout; 0 = no limit)."""
    if timeout < 0:
        raise UsageError(f"reward_timeout must be 0 (no limit) or more seconds, not {timeout:g}.")
    if mode == "single":
        return [WeightedSum(reward_set, timeout)], None
    if mode == "multi":
        return [CheckedReward(c, timeout) for c in reward_set.components], list(reward_set.weights)
    raise UsageError(f"reward_function_type must be 'single' or 'multi', not {mode!r}.")


def check_columns(reward_set: RewardSet, columns: set[str], source: str) -> None:
    """A reward that needs a column the dataset does not have would score None forever: say so up front."""
    for component in reward_set.components:
        missing = [c for c in component.needs if c not in columns]
        if missing:
            raise UsageError(
                f"Reward '{component.__name__}' needs the column(s) {', '.join(missing)}, which {source} does not "
                f"have: use {'code data (humaneval, mbpp, rows with tests)' if 'tests' in missing else 'a preference dataset'} "
                f"or set '{component.__name__}_weight' to 0."
            )


def _flagged(reward_set: RewardSet, count: int) -> list[list[str]]:
    """What the code reward's monitor flagged in each of the last call's `count` completions (its last_details)."""
    found: list[set[str]] = [set() for _ in range(count)]
    for component in reward_set.components:
        details = getattr(component, "last_details", None) or []
        if len(details) == count:
            for i, detail in enumerate(details):
                found[i].update(detail.get("suspected") or ())
    return [sorted(reasons) for reasons in found]


def score_rows(reward_set: RewardSet, rows: list[dict[str, Any]], timeout: float = 0.0) -> list[dict[str, Any]]:
    """`--score-completions`: each row's component scores and weighted total (a trajectory: also its tool calls);
    for groups, mean/std and the zero-variance flag (a group whose completions all score the same gives GRPO no
    signal)."""
    results = []
    single = WeightedSum(reward_set, timeout)
    for index, row in enumerate(rows):
        group = row.get("completions")
        completions = group if isinstance(group, list) else [row.get("completion", "")]
        columns = {k: [v] * len(completions) for k, v in row.items() if k not in ("prompt", "completion", "completions")}
        prompts = [row.get("prompt", "")] * len(completions)
        try:
            per = single.components(prompts=prompts, completions=completions, **columns)
        except RewardError as err:  # a preview names the row and the reward: one line, not a traceback
            raise UsageError(f"row {index + 1}: {err}; fix the reward function.") from None
        totals = weighted_total(per, reward_set.weights)
        result: dict[str, Any] = {"index": index}
        flagged = _flagged(reward_set, len(completions))
        if isinstance(group, list):
            mean = sum(totals) / len(totals) if totals else 0.0
            std = math.sqrt(sum((t - mean) ** 2 for t in totals) / max(1, len(totals) - 1)) if len(totals) > 1 else 0.0
            result.update(
                completions=[completion_text(c) for c in completions],
                scores={k: v for k, v in per.items()},
                total=totals, group_mean=mean, group_std=std, zero_variance=std < 1e-9,
            )
            if any(flagged):
                result["hack_suspected"] = flagged
        else:
            result.update(completion=completion_text(completions[0]), scores={k: v[0] for k, v in per.items()},
                          total=totals[0])
            if tool_calls(completions[0]):  # a trajectory: the calls and what each returned, beside its score
                result["tool_calls"] = tool_calls(completions[0])
            if flagged[0]:
                result["hack_suspected"] = flagged[0]
        results.append(result)
    return results


__all__ = [
    "REGISTRY", "RewardComponent", "RewardError", "RewardSet", "WeightedSum", "build_reward_functions", "check_columns",
    "load_reward_config", "parse_reward_config", "reward_preset_names", "score_rows", "weighted_total",
]

"""The reward contract (TRL's): `fn(prompts, completions, **columns) -> list[float | None]`.

Components are small picklable dataclasses with a stable `__name__` (the metric name `rewards/<name>/mean` in TRL).
Every component has `scale` and `clip` on top of its own settings: score -> score * scale -> clipped to [lo, hi].
`None` means "not applicable to this sample" (TRL skips it in its means).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from config.errors import UsageError


def completion_text(completion: Any) -> str:
    """Conversational completions arrive as [{"role": "assistant", "content": ...}], standard ones as str."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(m.get("content", "") if isinstance(m, dict) else str(m) for m in completion)
    if isinstance(completion, dict):
        return completion.get("content", "")
    return str(completion)


def prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list):
        return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in prompt if isinstance(m, dict))
    return str(prompt or "")


@dataclass
class RewardComponent:
    """Base class: subclasses set `name` and implement `score(texts, **columns)`."""

    name: ClassVar[str] = ""
    # Columns this component reads (for the error when a dataset lacks them).
    needs: ClassVar[tuple[str, ...]] = ()

    scale: float = 1.0
    clip: list[float] = field(default_factory=list)  # [] = no clipping, else [low, high]

    @property
    def __name__(self) -> str:  # TRL names the metric after this
        return self.name

    def score(self, texts: list[str], **columns: Any) -> list[float | None]:
        raise NotImplementedError

    def __call__(self, prompts: list | None = None, completions: list | None = None, **columns: Any):
        texts = [completion_text(c) for c in completions or []]
        raw = self.score(texts, prompts=prompts, **columns)
        return [self._post(x) for x in raw]

    def _post(self, value: float | None) -> float | None:
        if value is None:
            return None
        value = float(value) * self.scale
        if self.clip:
            value = min(max(value, self.clip[0]), self.clip[1])
        return value

    @classmethod
    def settings(cls) -> dict[str, Any]:
        """The settings this component accepts, with their defaults (for validation and docs)."""
        return {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
                for f in dataclasses.fields(cls)}

    @classmethod
    def from_settings(cls, settings: dict[str, Any], source: str) -> RewardComponent:
        import difflib

        valid = cls.settings()
        checked = {}
        for key, value in settings.items():
            if key not in valid:
                near = difflib.get_close_matches(key, list(valid), n=1)
                hint = f" Did you mean '{near[0]}'?" if near else f" Valid: {', '.join(valid)}."
                raise UsageError(f"{source}: unknown setting '{key}' for reward '{cls.name}'.{hint}")
            checked[key] = _check_setting(cls.name, key, value, valid[key], source)
        if "clip" in checked and checked["clip"] and (len(checked["clip"]) != 2 or checked["clip"][0] > checked["clip"][1]):
            raise UsageError(f"{source}: '{cls.name}.clip' must be [low, high] with low <= high.")
        return cls(**checked)


def _check_setting(component: str, key: str, value: Any, default: Any, source: str) -> Any:
    expected = type(default)
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, (int, float)) and not isinstance(default, bool):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        value = type(default)(value) if ok and isinstance(default, float) else value
        if ok and isinstance(default, int) and not isinstance(value, int):
            ok = False
    elif isinstance(default, list):
        ok = isinstance(value, list)
    else:
        ok = isinstance(value, expected)
    if not ok:
        raise UsageError(
            f"{source}: '{component}.{key}' must be a {expected.__name__}, not {value!r} ({type(value).__name__})."
        )
    return value


def check_reward_output(name: str, values: Any, expected: int) -> list[float | None]:
    """A reward function's output as TRL needs it, or a UsageError that names the function."""
    if not isinstance(values, (list, tuple)):
        raise UsageError(f"Reward function '{name}' returned {type(values).__name__}; it must return a list of floats.")
    if len(values) != expected:
        raise UsageError(
            f"Reward function '{name}' returned {len(values)} values for {expected} completions: return one per completion."
        )
    out = []
    for v in values:
        if v is None:
            out.append(None)
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
        else:
            raise UsageError(f"Reward function '{name}' returned {v!r}: each value must be a finite number or None.")
    return out

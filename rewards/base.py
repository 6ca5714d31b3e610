"""The reward contract (TRL's): `fn(prompts, completions, **columns) -> list[float | None]`.

Components are small picklable dataclasses with a stable `__name__` (the metric name `rewards/<name>/mean` in TRL).
Every component has `scale` and `clip` on top of its own settings: score -> score * scale -> clipped to [lo, hi].
`None` means "not applicable to this sample" (TRL skips it in its means).

No setting's sign changes what it means: a penalty subtracts whichever sign the file writes (the spec's own
reward config writes `"penalty_scale": -0.5`), and a knob where a negative value would turn a reward upside down
(a weight, `scale`, a reward per keyword) refuses it with one line saying so.

A reward that raises, or runs past `reward_timeout`, stops the run as a `RewardError` naming the component.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar

from config.errors import UsageError


class RewardError(Exception):
    """A reward function raised, or ran past its time limit. `component` is the reward's name (its metric name),
    `cause` the original exception (a TimeoutError for a time-out)."""

    def __init__(self, component: str, cause: BaseException):
        self.component = component
        self.cause = cause
        super().__init__(f"reward '{component}' failed: {cause.__class__.__name__}: {cause}")

    def __reduce__(self):  # picklable (the default would call __init__ with the message alone)
        return type(self), (self.component, self.cause)


class TimedCall:
    """`with_timeout`'s result: calls `fn(**kwargs)`, turning an exception into a RewardError naming `name`, and
    with `seconds` > 0 stops waiting after that long. Picklable when `fn` is (every component is)."""

    def __init__(self, fn, seconds: float, name: str):
        self.fn, self.seconds, self.name = fn, float(seconds), name

    @property
    def __name__(self) -> str:
        return self.name

    def __call__(self, **kwargs: Any) -> Any:
        if self.seconds <= 0:
            return _call(self.fn, self.name, kwargs)
        # A thread cannot be killed, so a hung reward keeps its thread; but the run stops instead of hanging. A
        # plain daemon thread (not a ThreadPoolExecutor, whose workers are joined at interpreter exit) lets the
        # process exit with the hung call still inside.
        box: queue.Queue = queue.Queue(maxsize=1)

        def work() -> None:
            try:
                box.put((True, _call(self.fn, self.name, kwargs)))
            except BaseException as err:  # handed to the caller's thread as it is
                box.put((False, err))

        threading.Thread(target=work, name=f"reward-{self.name}", daemon=True).start()
        try:
            ok, result = box.get(timeout=self.seconds)
        except queue.Empty:
            raise RewardError(self.name, TimeoutError(
                f"one call took longer than {self.seconds:g} s (reward_timeout): make it faster or raise the "
                "limit")) from None
        if not ok:
            raise result
        return result


def with_timeout(fn, seconds: float, name: str) -> TimedCall:
    """`fn` as a reward call that raises RewardError(component=name) when it raises or takes longer than `seconds`
    (0 = no limit). Call the result with keyword arguments, as TRL calls reward functions."""
    return TimedCall(fn, seconds, name)


def _call(fn, name: str, kwargs: dict[str, Any]) -> Any:
    try:
        return fn(**kwargs)
    except (UsageError, RewardError):  # a setting the user must fix, or already named
        raise
    except Exception as err:
        raise RewardError(name, err) from err


def completion_text(completion: Any) -> str:
    """What a reward judges: standard completions arrive as str; conversational ones as a list of messages, whose
    last assistant turn is the answer. A multi-turn completion (tools, environments) also holds the model's tool
    calls and the tools' results: a tool's output never counts as the model's answer."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content(completion) if completion.get("role", "assistant") == "assistant" else ""
    if isinstance(completion, list):
        # only a turn that says it is the assistant's: a tool's echo, a user turn or a bare value is never the answer
        for message in reversed(completion):
            if isinstance(message, dict) and message.get("role") == "assistant":
                return _content(message)
        return ""
    return str(completion)


def _content(message: dict) -> str:
    """A message's text: a string as it is, a list of content parts as their text parts joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content
                       if isinstance(part, dict) and part.get("type", "text") == "text"
                       and isinstance(part.get("text"), str))
    return ""


def tool_calls(completion: Any) -> list[dict[str, Any]]:
    """The tool calls of a multi-turn completion, in order: {name, arguments, result, failed}, where `result` is the
    text of the tool turn that answered the call (None if none did) and `failed` whether the call failed (TRL
    answers a failed call with "{'error': ...}"). [] for a single-turn completion."""
    if not isinstance(completion, list):
        return []
    calls: list[dict[str, Any]] = []
    waiting: list[dict[str, Any]] = []
    for message in completion:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                function = call.get("function", call) if isinstance(call, dict) else {}
                entry = {"name": function.get("name"), "arguments": function.get("arguments"), "result": None,
                         "failed": None}
                calls.append(entry)
                waiting.append(entry)
        elif message.get("role") == "tool":
            content = message.get("content")
            text = content if isinstance(content, str) else str(content)
            if waiting:
                entry = waiting.pop(0)
            else:
                entry = {"name": message.get("name"), "arguments": None}
                calls.append(entry)
            entry["result"] = text
            entry["failed"] = text.startswith("{'error':")
    return calls


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

    def check(self, source: str) -> None:
        """Settings that are valid types but mean nothing (or the opposite of what was meant): refused at parse
        time with one line. Subclasses add their own and call this."""
        if self.scale < 0:
            raise UsageError(
                f"{source}: '{self.name}.scale' is {self.scale:g}: a negative scale turns the reward upside down "
                f"(higher would be worse). Use a positive scale; to penalise, use a penalty setting or a custom reward "
                "that returns negative scores."
            )
        numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in self.clip)
        if self.clip and (len(self.clip) != 2 or not numbers or self.clip[0] > self.clip[1]):
            raise UsageError(f"{source}: '{self.name}.clip' must be [low, high] with low <= high.")

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
        component = cls(**checked)
        component.check(source)
        return component


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

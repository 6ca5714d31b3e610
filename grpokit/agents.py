"""Agents: the tools a policy may call and the multi-turn environments it acts in, trained as TRL 1.15's
GRPOTrainer trains them (`tools=`, `environment_factory=`, its tool loop inside generation). The one door for the
concern; the built-ins themselves are in agent_tools.py.

Where each thing is decided:
- `plan(config)`, before any model loads (so `--dry-run`, the header and run_config.json state it): each `tools`
  entry becomes a callable (a built-in by name, or `module.path:function`), each `environment` a class (a built-in
  by name, or `module.path:Class`; `name=...` entries route rows by their `environment` column, TRL's
  multi-environment form); each tool's JSON schema is derived from its signature and docstring exactly as the chat
  template will (transformers' get_json_schema), and the chat template + tool-call parser are chosen for the model
  family. Any of these that cannot work is one UsageError line.
- `guard()` wraps every tool the model can reach: a per-call time limit, results made printable and cut at
  `tool_result_max_chars` with a marker. What the model gets wrong (an unknown tool, malformed JSON, arguments that
  do not fit, a tool that raises or hangs, an endless loop) is a failed call that TRL counts
  (`tools/failure_frequency`) and answers with the error, or the end of the loop at `max_tool_calling_iterations`:
  never a crash.
- `prepare_tokenizer()`, after the load: the template and parser go on the tokenizer TRL receives.
- rewards/base.py `completion_text` / `tool_calls`: what rewards read of a trajectory (the last assistant turn: a
  tool's output never counts as the model's answer; the calls with their results).
- `rollout()`: the generation logs' trajectories, through TRL's own tool loop on the trainer.

What is masked: TRL's `tool_mask` is 0 on every token a tool or environment wrote; the loss, the KL term, the
entropy and the importance-sampling ratio multiply by it (trl/trainer/grpo_trainer.py `_compute_loss`), so a tool
result's tokens get no gradient and never enter the KL. tests/test_agents.py checks it on the paths we train.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import inspect
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config.errors import UsageError

TRUNCATION_MARKER = "\n[... {cut} more characters cut: the tool's result is limited to {limit} characters]"


# ---- what the model gets back from a call ---------------------------------------------------------------------

# Characters a tool's result may not carry into the model's context: controls other than newline and tab (terminal
# escapes, carriage returns), DEL, C1 controls, bidi overrides and zero-width characters (text that reads one way
# and tokenises another).
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


def as_text(result: Any, limit: int) -> str:
    """A tool's return value as the text the model reads: str as it is, JSON for plain data, repr otherwise;
    characters that cannot be encoded replaced, controls written as escapes, a chat template's special-token
    markers broken ("<|" -> "< |": a tool's result cannot forge a turn of the conversation); cut at `limit`
    characters with a marker saying so."""
    if isinstance(result, str):
        text = result
    else:
        try:
            text = json.dumps(result, ensure_ascii=False)
        except (TypeError, ValueError):
            text = repr(result)  # may raise: the guard turns it into a failed call
    text = text.encode("utf-8", "replace").decode("utf-8")
    text = _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else "", text)
    text = text.replace("<|", "< |").replace("|>", "| >").replace("<\uff5c", "< \uff5c")
    if limit and len(text) > limit:
        text = text[:limit] + TRUNCATION_MARKER.format(cut=len(text) - limit, limit=limit)
    return text


class ToolFailed(RuntimeError):
    """A tool call that failed, its message made printable and cut like a result (TRL shows it to the model)."""


class ToolTimeout(Exception):
    """A tool ran past its time limit: a failed call."""


def _call_with_timeout(fn: Callable, args, kwargs, seconds: float):
    """fn(*args, **kwargs) on a daemon thread, waited for `seconds` (0 = no limit). A tool that never returns is
    abandoned, not waited on: the rollout goes on with a failed call (the thread cannot be killed; it holds no
    lock of ours)."""
    if not seconds:
        return fn(*args, **kwargs)
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001 - handed back to the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True, name=f"tool-{getattr(fn, '__name__', 'call')}")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise ToolTimeout(f"no result after {seconds:g} s")
    if "error" in box:
        error = box["error"]
        if not isinstance(error, Exception):  # SystemExit / KeyboardInterrupt from a tool: still just a failed call
            raise RuntimeError(f"the tool raised {type(error).__name__}")
        raise error
    return box.get("value")


def guard(fn: Callable, timeout: float, max_chars: int) -> Callable:
    """`fn` as the model may call it: same name, signature and docstring (so the same schema), a time limit, a
    printable result of bounded length. Exceptions propagate: TRL counts them as failed calls and shows the model
    their message."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def call_async(*args, **kwargs):
            import asyncio

            try:
                result = await asyncio.wait_for(fn(*args, **kwargs), timeout or None)
            except TimeoutError:
                raise ToolTimeout(f"no result after {timeout:g} s") from None
            except Exception as err:  # noqa: BLE001 - any failure: its message bounded like a result
                raise ToolFailed(as_text(f"{type(err).__name__}: {err}", max_chars)) from None
            return as_text(result, max_chars)

        return call_async

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            result = _call_with_timeout(fn, args, kwargs, timeout)
        except ToolTimeout:
            raise
        except Exception as err:  # noqa: BLE001 - any failure: its message bounded like a result
            name = "" if type(err).__name__ == "ToolError" else f"{type(err).__name__}: "
            raise ToolFailed(as_text(f"{name}{err}", max_chars)) from None
        try:
            return as_text(result, max_chars)
        except Exception as err:  # noqa: BLE001 - a result that cannot become text (its repr raises)
            raise ToolFailed(f"the tool's result cannot be shown as text ({type(err).__name__})") from None

    return call


class ToolBudget:
    """What one rollout's tools may take in all: `calls` calls and `seconds` of wall time. TRL runs every call a
    turn writes, one after another; without a bound one completion's many calls (a few dozen tokens each) would
    hold the whole step for minutes. Calls past the budget fail at once, without running."""

    def __init__(self, calls: int, seconds: float):
        self.calls, self.seconds = calls, seconds

    def wrap(self, tools: dict[str, Callable]) -> dict[str, Callable]:
        """One rollout's tool dict (TRL's `_sync_tool_dicts[i]`) with a shared allowance."""
        left = {"calls": self.calls, "seconds": self.seconds}

        def limited(fn):
            @functools.wraps(fn)
            def call(*args, **kwargs):
                if left["calls"] <= 0 or left["seconds"] <= 0:
                    raise ToolFailed(f"this completion has used its tool budget ({self.calls} calls, "
                                     f"{self.seconds:g} s): answer with what you have")
                left["calls"] -= 1
                started = time.monotonic()
                try:
                    return fn(*args, **kwargs)
                finally:
                    left["seconds"] -= time.monotonic() - started

            return call

        return {name: limited(fn) for name, fn in tools.items()}


def guarded_environment(cls: type, timeout: float, max_chars: int) -> type:
    """A subclass of the environment whose public methods (its tools) are guarded; `reset` and `get_reward` stay as
    they are. TRL lists tools on the class (inspect.getmembers of the type), so the guard goes on the class."""
    tools = {name: guard(member, timeout, max_chars)
             for name, member in inspect.getmembers(cls, predicate=inspect.isfunction)
             if not name.startswith("_") and name not in ("reset", "get_reward")}
    return type(cls.__name__, (cls,), {**tools, "__module__": cls.__module__, "__doc__": cls.__doc__})


# ---- chat templates and parsers ------------------------------------------------------------------------------------

TEMPLATES = {
    "qwen": "the model's own Qwen 2.5 / 3 template, TRL's <tool_call> JSON parser",
    "llama3": "the model's own Llama 3.1 / 3.2 template, TRL's JSON tool-call parser",
    "chatml": "ChatML with Hermes <tool_call> JSON blocks and <tool_response> turns (shipped here), TRL's Qwen "
              "parser",
    "auto": "decided when the model loads: TRL's template and parser if it knows the model's, else the run stops "
            "before training with one line",
}
_NO_TOOL_TEMPLATE = ("Gemma 2's chat template has no tool role or tool-call format, so TRL cannot parse its tool "
                     "calls: use a Qwen 2.5 / 3, Llama 3.1 / 3.2 or ChatML model (e.g. qwen2.5-7b, llama-3.1-8b, "
                     "the embedded smollm2-135m), or drop --tool / --environment.")


def _trl_template(name: str) -> str | None:
    """One of TRL's shipped chat templates, read from its installed files (no import: --dry-run stays fast)."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)), "chat_templates", f"{name}.jinja")
    return path.read_text(encoding="utf-8") if path.exists() else None


def _local_chat_template(directory: Path) -> str | None:
    for name in ("chat_template.jinja",):
        if (directory / name).exists():
            return (directory / name).read_text(encoding="utf-8")
    config = directory / "tokenizer_config.json"
    if config.exists():
        try:
            template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        except (ValueError, OSError):
            return None
        return template if isinstance(template, str) else None
    return None


def template_family(chat_template: str | None) -> str | None:
    """'qwen' / 'llama3' for a template TRL knows byte for byte, 'chatml' for any other ChatML template, None for
    a template without a tool-call format we can parse."""
    if not chat_template:
        return None
    for family, names in (("qwen", ("qwen2_5", "qwen3", "qwen3_instruct_2507")), ("llama3", ("llama3_1", "llama3_2"))):
        if any(chat_template == _trl_template(name) for name in names):
            return family
    return "chatml" if "<|im_start|>" in chat_template else None


def family_for_model(model_name: str) -> str:
    """The template family of a model before it loads: from a local directory's template, else from the preset's
    checkpoint name; 'auto' where only the load can tell."""
    from config.models import EMBEDDED_MODEL, MODEL_PRESETS

    if model_name == EMBEDDED_MODEL:
        return "chatml"
    directory = Path(model_name).expanduser()
    if directory.is_dir():
        template = _local_chat_template(directory)
        family = template_family(template)
        if family is None:
            raise UsageError(f"tools: the chat template of {model_name} has no tool-call format we can parse "
                             "(TRL knows Qwen 2.5 / 3 and Llama 3.1 / 3.2; ChatML templates get ours); "
                             + ("it has none at all. " if not template else "")
                             + "Use such a model or drop --tool / --environment.")
        return family
    name = (MODEL_PRESETS[model_name].hub_id if model_name in MODEL_PRESETS else model_name).lower()
    if "gemma" in name:
        raise UsageError("tools: " + _NO_TOOL_TEMPLATE)
    if "qwen2.5" in name or "qwen3" in name:
        return "qwen"
    if "llama-3.1" in name or "llama-3.2" in name:
        return "llama3"
    if "smollm" in name:
        return "chatml"
    return "auto"


def chatml_tool_template(original: str, tokenizer) -> str:
    """A ChatML template that renders tools and tool turns as Qwen 2.5 does (Hermes-style <tool_call> blocks,
    prefix-preserving, as TRL's tool loop needs), keeping the model's own default system prompt."""
    qwen = _trl_template("qwen2_5")
    if qwen is None:
        raise UsageError("tools: the installed TRL has no qwen2_5 chat template to build the ChatML tool template "
                         "from: reinstall trl==1.15.0.")
    default = "You are a helpful assistant."
    try:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], chat_template=original,
                                                 tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot render a user turn: keep the plain default
        rendered = ""
    head = "<|im_start|>system\n"
    if rendered.startswith(head) and "<|im_end|>" in rendered:
        default = rendered[len(head):rendered.index("<|im_end|>")]
    qwen_default = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    return qwen.replace(f"'{qwen_default}'", json.dumps(default))


def prepare_tokenizer(tokenizer, family: str) -> str:
    """Put the tool template and parser on the loaded tokenizer (TRL reads both); the family really used."""
    from trl.chat_template_utils import (
        _SUPPORTS_RESPONSE_TEMPLATE,
        qwen3_schema,
        qwen3_template,
        supports_tool_calling,
    )

    inner = getattr(tokenizer, "tokenizer", tokenizer)
    loaded = template_family(tokenizer.chat_template)
    if family == "auto":
        family = loaded
        if family is None:
            raise UsageError("tools: the model's chat template has no tool-call format we can parse (TRL knows Qwen "
                             "2.5 / 3 and Llama 3.1 / 3.2; ChatML templates get ours). Use such a model or drop "
                             "--tool / --environment.")
    if family == "chatml" and loaded != "qwen":
        tokenizer.chat_template = chatml_tool_template(tokenizer.chat_template, inner)
        if _SUPPORTS_RESPONSE_TEMPLATE:
            inner.response_template = qwen3_template
        else:
            inner.response_schema = qwen3_schema
    # TRL's own families: GRPOTrainer sets the parser itself (add_response_schema) when none is set.
    if not supports_tool_calling(tokenizer):
        raise UsageError("tools: the loaded model's chat template cannot render a tool call and its result, so the "
                         "model could not see what a tool returned. Use a Qwen 2.5 / 3, Llama 3.1 / 3.2 or ChatML "
                         "model, or drop --tool / --environment.")
    return family


# ---- the plan ------------------------------------------------------------------------------------------------------

@dataclass
class AgentPlan:
    """What a run's model may call, decided before anything loads."""

    tools: list[Callable] = field(default_factory=list)  # guarded, in the order given
    environments: dict[str | None, type] | None = None  # guarded classes; {None: cls} for one environment
    schemas: list[dict] = field(default_factory=list)  # every tool the prompt can show, as the template gets it
    family: str = ""  # chat template family (TEMPLATES)
    max_iterations: int = 0
    max_chars: int = 0
    timeout: float = 0.0

    def budget(self) -> ToolBudget:
        """Per rollout: two calls per tool round, and the time of that many calls at the time limit (no time limit:
        half a minute a call)."""
        calls = 2 * max(1, self.max_iterations)
        return ToolBudget(calls, calls * (self.timeout or 30.0))

    @property
    def active(self) -> bool:
        return bool(self.tools or self.environments)

    def headline(self) -> str:
        """The run header's line: the tools, the rounds, the template family."""
        names = ", ".join(s["function"]["name"] for s in self.schemas)
        where = f" ({', '.join(c.__name__ for c in self.environments.values())})" if self.environments else ""
        return f"{names}{where}; up to {self.max_iterations} rounds, {self.family} template"

    def describe(self) -> dict[str, Any]:
        """--dry-run / run_config.json: the tools, their schemas, the template and parser, the limits."""
        if not self.active:
            return {}
        return {
            "tools": [s["function"]["name"] for s in self.schemas],
            "schemas": self.schemas,
            "environments": {name or "(every row)": cls.__name__ for name, cls in (self.environments or {}).items()},
            "chat_template": TEMPLATES[self.family],
            "max_tool_calling_iterations": self.max_iterations,
            "tool_result_max_chars": self.max_chars,
            "tool_timeout_s": self.timeout,
            "tool_budget_per_completion": {"calls": self.budget().calls, "seconds": self.budget().seconds},
            "masked": "tool results: no gradient, no KL, not counted in completion lengths (TRL's tool_mask)",
        }


def _import(spec: str, what: str):
    from rewards.components import import_reward_function

    return import_reward_function(spec, what)


def _schema(fn: Callable, what: str) -> dict:
    """The JSON schema TRL's chat template will render for `fn`, or a UsageError saying why there is none."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as err:  # noqa: BLE001 - transformers' TypeError / DocstringParsingException / ...
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UsageError(f"{what}: cannot be shown to the model as a tool ({message}). A tool needs a type hint "
                         "on every parameter and a docstring: a first line saying what it does, then 'Args:' with "
                         "one 'name: description' line per parameter (docs/agents.md).") from None


def _tool(spec: str) -> Callable:
    from grpokit.agent_tools import BUILTIN_TOOLS

    if spec in BUILTIN_TOOLS:
        return BUILTIN_TOOLS[spec]
    if ":" not in spec:
        raise UsageError(f"Tool '{spec}': not a built-in tool ({', '.join(BUILTIN_TOOLS)}) and not "
                         "'module.path:function'.")
    fn = _import(spec, "Tool")
    if inspect.isclass(fn):
        raise UsageError(f"Tool '{spec}' is a class: a tool is a function; a class whose methods are tools is an "
                         "environment (--environment).")
    return fn


def _environment(spec: str) -> type:
    from grpokit.agent_tools import BUILTIN_ENVIRONMENTS

    if spec in BUILTIN_ENVIRONMENTS:
        return BUILTIN_ENVIRONMENTS[spec]
    if ":" not in spec:
        raise UsageError(f"Environment '{spec}': not a built-in environment ({', '.join(BUILTIN_ENVIRONMENTS)}) and "
                         "not 'module.path:Class'.")
    cls = _import(spec, "Environment")
    if not inspect.isclass(cls):
        raise UsageError(f"Environment '{spec}' is not a class: TRL makes one instance per rollout, so give the "
                         "class (its public methods are the tools, reset(**row) starts a rollout).")
    if not callable(getattr(cls, "reset", None)):
        raise UsageError(f"Environment '{spec}' has no reset method: TRL calls reset(**row) at each rollout's start.")
    try:
        inspect.signature(cls).bind()
    except TypeError:
        raise UsageError(f"Environment '{spec}': TRL builds it with no arguments, and {cls.__name__}() needs some: "
                         "give its parameters defaults.") from None
    return cls


def parse_environments(entries: list[str]) -> dict[str | None, str]:
    """`environment` entries -> {name: spec}: one plain spec for every row, or `name=spec` entries that rows pick by
    their `environment` column."""
    named = [e for e in entries if "=" in e.split(":", 1)[0]]
    if named and len(named) != len(entries):
        raise UsageError("environment: give either one environment for every row or only name=module:Class entries "
                         f"(rows pick one by their 'environment' column), not both: {entries}.")
    if not named:
        if len(entries) > 1:
            raise UsageError(f"environment: {len(entries)} environments given without names; name them "
                             "(name=module:Class) so each row can pick one by its 'environment' column.")
        return {None: entries[0]} if entries else {}
    out: dict[str | None, str] = {}
    for entry in entries:
        name, _, spec = entry.partition("=")
        if not name.strip() or not spec.strip():
            raise UsageError(f"environment: '{entry}' is not name=module:Class.")
        if name.strip() in out:
            raise UsageError(f"environment: the name '{name.strip()}' is given twice.")
        out[name.strip()] = spec.strip()
    return out


def plan(config) -> AgentPlan:
    """The run's tools and environments, checked: each resolves, each becomes a schema; the template family."""
    if not config.tools and not config.environment:
        return AgentPlan()
    from grpokit import agent_tools
    from grpokit.model_loader import choose_backend, import_backend

    # The schemas come from transformers (get_json_schema): Unsloth must be imported before it, as for the load.
    import_backend(choose_backend(config.backend))
    agent_tools.configure(config.tool_timeout or agent_tools.LIMITS.timeout, config.tool_memory_mb)
    # The sandboxed tools enforce their own limit inside the sandbox; the guard waits a little longer so that the
    # sandbox's own "timed out" message is what the model reads.
    timeout = config.tool_timeout + 5.0 if config.tool_timeout else 0.0
    raw_tools = [_tool(spec) for spec in config.tools]
    names = [getattr(fn, "__name__", "") for fn in raw_tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"tools: two tools are named {', '.join(twice)}: the model calls a tool by its name.")
    schemas = [_schema(fn, f"Tool '{spec}'") for fn, spec in zip(raw_tools, config.tools, strict=False)]
    environments = None
    specs = parse_environments(list(config.environment))
    if specs:
        environments = {}
        for name, spec in specs.items():
            cls = _environment(spec)
            methods = [(n, m) for n, m in inspect.getmembers(cls, predicate=inspect.isfunction)
                       if not n.startswith("_") and n not in ("reset", "get_reward")]
            if not methods and not raw_tools:
                raise UsageError(f"Environment '{spec}' has no public method for the model to call (its tools).")
            for method_name, method in methods:
                if method_name in names:
                    raise UsageError(f"Environment '{spec}': its tool '{method_name}' has the name of a --tool.")
                bound = method.__get__(object.__new__(cls), cls)  # the schema of the method as TRL binds it
                schema = _schema(bound, f"Environment '{spec}' method '{method_name}'")
                if schema not in schemas:
                    schemas.append(schema)
            environments[name] = guarded_environment(cls, timeout, config.tool_result_max_chars)
    return AgentPlan(tools=[guard(fn, timeout, config.tool_result_max_chars) for fn in raw_tools],
                     environments=environments, schemas=schemas, family=family_for_model(config.model_name),
                     max_iterations=config.max_tool_calling_iterations, max_chars=config.tool_result_max_chars,
                     timeout=config.tool_timeout)


def trainer_kwargs(agent: AgentPlan) -> dict[str, Any]:
    """What TRL's GRPOTrainer takes: tools and environment_factory (one class, or a dict of classes by name)."""
    if not agent.active:
        return {}
    kwargs: dict[str, Any] = {"tools": list(agent.tools), "tool_budget": agent.budget()}
    if agent.environments:
        kwargs["environment_factory"] = (agent.environments[None] if list(agent.environments) == [None]
                                         else dict(agent.environments))
    return kwargs


# ---- reading a trajectory: rewards/base.py (`completion_text` = the last assistant turn, `tool_calls`) --------

# ---- the generation logs' rollouts ---------------------------------------------------------------------------------

class _Greedy:
    """Greedy decoding for the generation logs' rollouts: the trainer's generation config (transformers) and the
    engine's sampling parameters (trl_engine_adapter.sampling_params reads `greedy_rollout`)."""

    def __init__(self, trainer, on: bool):
        self.trainer, self.on = trainer, on

    def __enter__(self):
        config = getattr(self.trainer, "generation_config", None)
        self.saved = (getattr(config, "do_sample", None), getattr(self.trainer, "greedy_rollout", False))
        if self.on and config is not None:
            config.do_sample = False
        self.trainer.greedy_rollout = self.on

    def __exit__(self, *exc):
        config = getattr(self.trainer, "generation_config", None)
        if config is not None and self.saved[0] is not None:
            config.do_sample = self.saved[0]
        self.trainer.greedy_rollout = self.saved[1]


def rollout(trainer, rows: list[dict[str, Any]], n: int = 1, greedy: bool = True):
    """`n` trajectories per row through TRL's own generation and tool loop (fresh environment instances, never the
    training pool's): (completions as message lists, completion ids, tool masks), row-major."""
    import torch
    from trl.chat_template_utils import parse_response

    inputs = [row for row in rows for _ in range(n)]
    prompts = [copy.deepcopy(row["prompt"]) for row in inputs]
    saved = {k: getattr(trainer, k, None) for k in ("environments", "_batch_environments", "_sync_tool_dicts",
                                                    "_async_tool_dicts")}
    try:
        environments = []
        if trainer.environment_factories is not None:
            names = [row.get("environment") if trainer._multi_environment else None for row in inputs]
            trainer._batch_environments = names
            environments = [trainer.environment_factories[name]() for name in names]
            for i, (environment, row) in enumerate(zip(environments, inputs, strict=False)):
                kwargs = {k: v for k, v in row.items() if k != "environment"} if trainer._multi_environment else row
                observation = environment.reset(**kwargs)
                if isinstance(observation, str):
                    prompts[i] = prompts[i][:-1] + [{**prompts[i][-1],
                                                     "content": prompts[i][-1]["content"] + observation}]
        trainer._sync_tool_dicts, trainer._async_tool_dicts = [], []
        for i in range(len(inputs)):
            methods = [getattr(environments[i], name) for name, _ in
                       inspect.getmembers(type(environments[i]), predicate=inspect.isfunction)
                       if name not in ("reset", "get_reward") and not name.startswith("_")] if environments else []
            sync, async_ = {}, {}
            for tool in trainer._standalone_tools + methods:
                (async_ if inspect.iscoroutinefunction(tool) else sync)[tool.__name__] = tool
            trainer._sync_tool_dicts.append(sync)
            trainer._async_tool_dicts.append(async_)
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        with _Greedy(trainer, greedy), torch.no_grad():
            prompt_ids, images, multimodal = trainer._tokenize_prompts(prompts)
            completion_ids, logprobs = trainer._generate_single_turn(prompt_ids, images, multimodal, 1)
            completions = [[parse_response(tokenizer, ids, prefix=prompt_ids[i])]
                           for i, ids in enumerate(completion_ids)]
            tool_mask, completions, completion_ids, _, _, _, _ = trainer._tool_call_loop(
                prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal)
        return completions, completion_ids, tool_mask
    finally:
        for key, value in saved.items():
            setattr(trainer, key, value)

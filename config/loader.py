"""Build a `GRPORunConfig` from layers: built-in defaults < preset < `--config FILE` < CLI flags < `--set`.

Every layer is a plain dict checked the same way: unknown keys fail with the nearest valid key, wrong types fail
with the expected type, keys that mean nothing for GRPO (the spec's `gamma`) are accepted with a warning. TRL's own
fields get the same type check: their annotations (`int`, `float | None`, `Literal[...]`, transformers' enums) are
read from the installed TRL / transformers source, so `--dry-run` catches `num_iterations: "two"` without importing
TRL. Known ranges (`top_p` in (0, 1], ...) are checked for both kinds of field.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib.util
import json
import logging
import math
import os
import re
import typing
from pathlib import Path
from typing import Any

from config.errors import UsageError
from config.models import MODEL_PRESETS
from config.schedule import schedule_from_config
from config.schema import FIELDS, GRPORunConfig, field_type, literal_choices

log = logging.getLogger("grpo")

CONFIG_DIR = Path(__file__).resolve().parent
PRESET_DIR = CONFIG_DIR / "presets"

# Other names people use for our fields (the spec's `group_size` is TRL's `num_generations`).
ALIASES = {
    "group_size": "num_generations",
    "n_update_per_generation": "num_iterations",  # the addition tutorial's name: updates per generated batch
    "optimizer_type": "optim",  # the verl-style guide's name for TRL's optimizer choice
    "num_epochs": "num_train_epochs",
    "epochs": "num_train_epochs",
    "batch_size": "per_device_train_batch_size",
    "lora_rank": "lora_r",
    "model": "model_name",
    "warmup_ratio": "warmup_steps",  # transformers 5 folded warmup_ratio into warmup_steps (< 1 = ratio)
}
# Accepted so that configs written for other RL tools load, but they have no meaning in GRPO.
NO_EFFECT = {
    "gamma": "GRPO has no discount factor: each completion gets one sequence-level reward",
    "lam": "GRPO has no GAE: advantages are group-normalised rewards",
    "vf_coef": "GRPO has no value head",
    "cliprange_value": "GRPO has no value head",
}
# Spellings of our own values that the spec's examples use.
VALUE_ALIASES = {("reward_function_type", "systematic"): "multi", ("optim", "adamw"): "adamw_torch"}


# Where TRL's config fields are declared: GRPOConfig, the base config it extends, and transformers' arguments.
TRL_CONFIG_SOURCES = (
    ("trl.trainer.grpo_config", "GRPOConfig"),
    ("trl.trainer.base_config", "_BaseConfig"),
    ("transformers.training_args", "TrainingArguments"),
)

# Ranges TRL and transformers state in their help text but check late (inside the trainer, after the model has
# loaded) or never. (low, low included, high, high included); None = unbounded. Applied to our fields and TRL's.
RANGES: dict[str, tuple[float | None, bool, float | None, bool]] = {
    "temperature": (0, False, None, False),
    "top_p": (0, False, 1, True),
    "top_k": (0, True, None, False),  # 0 = top-k off
    "min_p": (0, True, 1, True),
    "repetition_penalty": (0, False, None, False),  # 1.0 = off; < 1 encourages repeats
    "num_iterations": (1, True, None, False),
    "epsilon": (0, True, None, False),
    "epsilon_high": (0, True, None, False),
    "beta": (0, True, None, False),
    "generation_batch_size": (1, True, None, False),
    "steps_per_generation": (1, True, None, False),
    "top_entropy_quantile": (0, True, 1, True),
    "vllm_gpu_memory_utilization": (0, False, 1, True),
    "gpu_memory_utilization": (0, False, 1, True),
    "lora_dropout": (0, True, 1, False),
    "weight_decay": (0, True, None, False),
    "max_grad_norm": (0, True, None, False),
    "warmup_steps": (0, True, None, False),
    "reward_timeout": (0, True, None, False),
    "baseline_ema_decay": (0, False, 1, False),  # 0 = no memory (group_mean), 1 = never moves
    "reward_scaling": (0, False, None, False),  # a negative scale would turn the reward upside down
    "reward_clipping": (0, True, None, False),  # 0 = off
    "dynamic_sampling_max_rounds": (0, True, None, False),
    "sft_loss_weight": (0, True, None, False),
    "grpo_loss_weight": (0, True, None, False),
}


@dataclasses.dataclass(frozen=True)
class TypeRule:
    """What a TRL field accepts, read from its annotation: JSON kinds ('bool', 'int', 'float', 'str', 'none',
    'list', 'dict', 'any'), exact values (`Literal[...]`, an enum's values, `metadata={"choices": ...}`), and for
    lists the rule of their items; `aliases`: (given, meant) pairs TRL's own __post_init__ maps (scale_rewards
    True -> 'group')."""

    kinds: frozenset[str] = frozenset()
    values: tuple = ()
    item: TypeRule | None = None
    aliases: tuple = ()

    def __or__(self, other: TypeRule) -> TypeRule:
        item = self.item | other.item if self.item and other.item else self.item or other.item
        return TypeRule(self.kinds | other.kinds, self.values + other.values, item, self.aliases + other.aliases)

    def unalias(self, value: Any) -> Any:
        """The value TRL turns `value` into before it uses it (True -> 'group' for scale_rewards), else `value`."""
        return next((meant for given, meant in self.aliases if type(given) is type(value) and given == value), value)

    def describe(self) -> str:
        parts = [f"list[{self.item.describe()}]" if k == "list" and self.item else k
                 for k in ("bool", "int", "float", "str", "list", "dict") if k in self.kinds]
        if self.values:
            parts.append(f"one of {', '.join(map(repr, self.values))}")
        if "none" in self.kinds:
            parts.append("None")
        return " or ".join(parts)


ANY = TypeRule(frozenset({"any"}))


@functools.cache
def trl_field_rules() -> dict[str, TypeRule]:
    """GRPOConfig's fields (with TrainingArguments') and what each accepts, read from the installed sources with
    `ast`: no TRL import, so `--dry-run` stays instant. Empty when TRL is not installed."""
    rules: dict[str, TypeRule] = {}
    for module, class_name in TRL_CONFIG_SOURCES:
        path = _module_file(module)
        if path is None:
            continue
        tree = _parse(path)
        enums = _EnumFinder(Path(path), tree)
        for node in tree.body:
            if not (isinstance(node, ast.ClassDef) and node.name == class_name):
                continue
            for item in node.body:
                if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                    continue
                name = item.target.id
                if name.startswith("_") or name in rules:  # a subclass's declaration wins over its base's
                    continue
                rule = _rule_from_annotation(item.annotation, enums)
                choices = _metadata_choices(item.value)
                if choices:  # argparse-style choices narrow a `str` to those strings
                    rule = TypeRule(rule.kinds - {"str", "any"}, choices)
                elif "str" in rule.kinds and trl_dispatched_values().get(name):  # so do the trainer's dispatches
                    rule = TypeRule(rule.kinds - {"str"}, trl_dispatched_values()[name], rule.item)
                rules[name] = dataclasses.replace(rule, aliases=trl_value_aliases().get(name, ()))
    return rules


def _field_compared(test: ast.expr) -> tuple[str, tuple[str, ...]] | None:
    """`self.loss_type == "grpo"` / `args.scale_rewards in ["group", "none"]` -> ("loss_type", ("grpo",))."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Attribute)
            and isinstance(test.left.value, ast.Name) and test.left.value.id in ("self", "args")):
        return None
    op, right = test.ops[0], test.comparators[0]
    items = [right] if isinstance(op, ast.Eq) else right.elts if isinstance(op, ast.In) and isinstance(
        right, ast.List | ast.Tuple | ast.Set) else []
    if not items or not all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in items):
        return None
    return test.left.attr, tuple(e.value for e in items)


@functools.cache
def trl_dispatched_values() -> dict[str, tuple[str, ...]]:
    """The values TRL's GRPOTrainer accepts for settings its config declares as a plain `str` (loss_type,
    scale_rewards, importance_sampling_level, multi_objective_aggregation, vllm_importance_sampling_mode), read
    from the trainer's source with `ast`: where it dispatches on a setting in an `if == / elif in ... else: raise`
    chain, the chain's strings are all it accepts (anything else raises there, after the model has loaded). A
    setting with several such chains accepts what every chain handles. Empty when TRL is not installed."""
    path = _module_file("trl.trainer.grpo_trainer")
    if path is None:
        return {}
    tree = _parse(path)
    elifs = {id(n.orelse[0]) for n in ast.walk(tree)
             if isinstance(n, ast.If) and len(n.orelse) == 1 and isinstance(n.orelse[0], ast.If)}
    found: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.If) or id(node) in elifs:
            continue
        name, values = None, ()
        while (compared := _field_compared(node.test)) and compared[0] == (name or compared[0]):
            name, values = compared[0], values + compared[1]
            if not (len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If)):
                break
            node = node.orelse[0]
        else:
            continue  # a test on something else (or on another setting) ends the chain: not a dispatch
        if any(isinstance(statement, ast.Raise) for statement in node.orelse):
            found[name] = tuple(v for v in found.get(name, values) if v in values)
    return found


@functools.cache
def trl_value_aliases() -> dict[str, tuple]:
    """Values GRPOConfig.__post_init__ rewrites before the trainer sees them, read from its source:
    `self.scale_rewards = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)` (older
    TRL's bool) -> {"scale_rewards": ((True, "group"), (False, "none"))}."""
    path = _module_file("trl.trainer.grpo_config")
    if path is None:
        return {}
    aliases: dict[str, tuple] = {}
    for node in ast.walk(_parse(path)):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr == "get" and isinstance(node.value.func.value, ast.Dict)):
            continue
        try:
            mapping = ast.literal_eval(node.value.func.value)
        except ValueError:
            continue
        aliases[node.targets[0].attr] = tuple(mapping.items())
    return aliases


@functools.cache
def trl_field_defaults() -> dict[str, Any]:
    """The defaults GRPOConfig's fields (with TrainingArguments') declare, where written as a literal
    (`x: float = 0.2` or `field(default=0.2, ...)`), read from the installed sources like trl_field_rules: what TRL
    gives a field the run does not set. A computed default is left out."""
    defaults: dict[str, Any] = {}
    for module, class_name in TRL_CONFIG_SOURCES:
        path = _module_file(module)
        if path is None:
            continue
        for node in _parse(path).body:
            if not (isinstance(node, ast.ClassDef) and node.name == class_name):
                continue
            for item in node.body:
                if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)) or item.value is None:
                    continue
                name, value = item.target.id, item.value
                if name.startswith("_") or name in defaults:  # a subclass's declaration wins over its base's
                    continue
                if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
                    value = next((k.value for k in value.keywords if k.arg == "default"), None)
                try:
                    defaults[name] = ast.literal_eval(value) if value is not None else None
                except ValueError:
                    continue
    return defaults


def trl_field_names() -> frozenset[str]:
    """The names of GRPOConfig's fields (with TrainingArguments'), read from the installed sources."""
    return frozenset(trl_field_rules())


_KINDS = {"bool": "bool", "int": "int", "float": "float", "str": "str", "dict": "dict", "list": "list",
          "Any": "any", "None": "none"}


def _rule_from_annotation(node: ast.expr, enums: _EnumFinder) -> TypeRule:
    """`int | None`, `list[str]`, `Literal["a", "b"]`, `SchedulerType | str` ... as a TypeRule. Anything we cannot
    read (a class that is not an enum) accepts any value: TRL checks it, as before."""
    if isinstance(node, ast.Constant):
        if node.value is None:
            return TypeRule(frozenset({"none"}))
        if isinstance(node.value, str):  # a quoted annotation
            return _rule_from_annotation(ast.parse(node.value, mode="eval").body, enums)
        return ANY
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _rule_from_annotation(node.left, enums), _rule_from_annotation(node.right, enums)
        # `SchedulerType | str`: the str is how the enum's values are spelled; TrainingArguments converts (and
        # refuses anything else) in __post_init__, so the enum's values are the choices.
        for enum, other in ((left, right), (right, left)):
            if enum.values and not enum.kinds and "str" in other.kinds and all(isinstance(v, str) for v in enum.values):
                return TypeRule(other.kinds - {"str"}, enum.values, other.item)
        return left | right
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    if name is not None:
        if name in _KINDS:
            return TypeRule(frozenset({_KINDS[name]}))
        values = enums.values(name)
        return TypeRule(values=values) if values else ANY
    if isinstance(node, ast.Subscript):
        base = node.value.id if isinstance(node.value, ast.Name) else getattr(node.value, "attr", None)
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base == "Literal":
            try:
                return TypeRule(values=tuple(ast.literal_eval(a) for a in args))
            except ValueError:
                return ANY
        if base in ("Optional", "Union"):
            rule = TypeRule(frozenset({"none"})) if base == "Optional" else TypeRule()
            for arg in args:
                rule = rule | _rule_from_annotation(arg, enums)
            return rule
        if base in ("list", "List", "Sequence"):
            return TypeRule(frozenset({"list"}), item=_rule_from_annotation(args[0], enums))
        if base in ("dict", "Dict", "Mapping"):
            return TypeRule(frozenset({"dict"}))
    return ANY


def _metadata_choices(value: ast.expr | None) -> tuple:
    """`field(metadata={"choices": [...]})`, when the choices are written out (not computed)."""
    if not (isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field"):
        return ()
    for keyword in value.keywords:
        if keyword.arg == "metadata" and isinstance(keyword.value, ast.Dict):
            for key, choices in zip(keyword.value.keys, keyword.value.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "choices":
                    try:
                        return tuple(ast.literal_eval(choices))
                    except ValueError:  # e.g. `trainer_log_levels.keys()`: TRL checks those itself
                        return ()
    return ()


class _EnumFinder:
    """String enums (transformers' `ExplicitEnum`s such as SchedulerType) named in annotations, found in the
    module itself or in the sibling module it imports them from (`from .trainer_utils import SchedulerType`)."""

    def __init__(self, path: Path, tree: ast.Module):
        self.path, self.tree = path, tree

    def values(self, name: str) -> tuple:
        found = self._class_values(self.tree, name)
        if found:
            return found
        for node in self.tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module and \
                    any(alias.name == name for alias in node.names):
                sibling = self.path.parent.joinpath(*node.module.split(".")).with_suffix(".py")
                if sibling.exists():
                    return self._class_values(_parse(str(sibling)), name)
        return ()

    @staticmethod
    def _class_values(tree: ast.Module, name: str) -> tuple:
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name and \
                    any(getattr(b, "id", "").endswith("Enum") for b in node.bases):
                return tuple(item.value.value for item in node.body
                             if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant)
                             and isinstance(item.value.value, str))
        return ()


@functools.cache
def _parse(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text())


def _module_file(dotted: str) -> str | None:
    top, _, rest = dotted.partition(".")
    spec = importlib.util.find_spec(top)  # finds the package without executing it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)), *rest.split(".")).with_suffix(".py")
    return str(path) if path.exists() else None


PRESET_SUFFIXES = (".json", ".yaml")


def preset_file(name: str) -> Path | None:
    """config/presets/<name>.json or .yaml (the source documents' recipes are YAML, as their guides write them)."""
    return next((PRESET_DIR / f"{name}{s}" for s in PRESET_SUFFIXES if (PRESET_DIR / f"{name}{s}").exists()), None)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.iterdir() if p.suffix in PRESET_SUFFIXES)


YAML_SUFFIXES = (".yaml", ".yml")


def read_json_file(path: str | Path, what: str) -> dict[str, Any]:
    """A config object from a JSON file, or from YAML when the name ends in .yaml / .yml (the verl-style guides'
    configs are YAML); a UsageError saying exactly what is wrong with it."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{what} {path} does not exist: check the path.")
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory: give a JSON or YAML file.")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM some editors write is not part of the document
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"{what} {path} cannot be read ({err.__class__.__name__}: {err}).") from None
    if path.suffix.lower() in YAML_SUFFIXES:
        import yaml

        try:
            data = yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader subclass
        except DuplicateKey as dup:
            raise UsageError(f"{what} {path}: '{dup.key}' is given twice (line {dup.line}): the second would "
                             "silently replace the first; keep one.") from None
        except RecursionError:  # the composer recurses once per level: a file nested ~1000 deep
            raise UsageError(f"{what} {path} is nested too deeply to read: a config is a flat mapping of fields."
                             ) from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = str(getattr(err, "problem", None) or err)
            tag = re.search(r"constructor for the tag '(?:tag:yaml\.org,2002:)?([^']*)'", problem)
            if tag:  # PyYAML's words for a tag the safe loader does not build (!!python/object, a custom !Tag)
                raise UsageError(f"{what} {path}{where}: the tag '{tag.group(1)}' is not read: a config holds plain "
                                 "values (numbers, text, true/false, lists, mappings); write the value itself."
                                 ) from None
            raise UsageError(f"{what} {path} is not valid YAML{where}: {problem}.") from None
        kind = "a YAML mapping (key: value lines)"
    else:
        try:
            data = json.loads(text, object_pairs_hook=_unique_pairs)
        except DuplicateKey as dup:
            raise UsageError(f"{what} {path}: '{dup.key}' is given twice: the second would silently replace the "
                             "first; keep one.") from None
        except json.JSONDecodeError as err:
            raise UsageError(f"{what} {path} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}."
                             ) from None
        except RecursionError:  # json's reader recurses once per level: a file nested ~1000 deep
            raise UsageError(f"{what} {path} is nested too deeply to read: a config is a flat object of fields."
                             ) from None
        kind = "a JSON object {...}"
    if not isinstance(data, dict):
        raise UsageError(f"{what} {path} must hold {kind}, not a {type(data).__name__}.")
    return data


class DuplicateKey(Exception):
    def __init__(self, key: Any, line: int = 0):
        super().__init__(key)
        self.key, self.line = key, line


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook: a key given twice is an error, not 'the last one wins'."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


@functools.cache
def _unique_key_loader():
    """yaml's SafeLoader, refusing a mapping key given twice (PyYAML keeps the last one without a word)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base`: the anchors' keys, which this mapping's own may override (YAML's merge)
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise DuplicateKey(key, key_node.start_mark.line + 1)
                seen.add(key)
            return super().construct_mapping(node, deep)

    # PyYAML reads YAML 1.1, where a float needs a dot: the guides' `learning_rate: 1e-5` would be the string
    # '1e-5'. YAML 1.2 (and JSON) read it as a number; checked after 1.1's own resolvers, so only such scalars change.
    UniqueKeyLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
        list("-+.0123456789"))
    return UniqueKeyLoader


def load_preset(name: str) -> dict[str, Any]:
    path = preset_file(name)
    if path is None:
        raise UsageError(f"Unknown preset '{name}'. Valid presets: {', '.join(preset_names())}.")
    return read_json_file(path, "Preset")


def _valid_keys() -> list[str]:
    return [*FIELDS, *ALIASES, *NO_EFFECT, *trl_field_names()]


def _check_value(key: str, value: Any, source: str) -> Any:
    """One of our fields: coerce a JSON value to its type, strictly ("fast" is not a learning rate), then TRL's
    own choices for the fields we hand to GRPOConfig (`optim`, `lr_scheduler_type`) and the known ranges."""
    value = VALUE_ALIASES.get((key, value), value) if isinstance(value, str) else value
    trl_rule = trl_field_rules().get(key) if FIELDS[key].metadata["trl"] else None
    value = trl_rule.unalias(value) if trl_rule is not None else value  # scale_rewards true -> 'group', as TRL
    value = _apply_rule(_schema_rule(key), key, value, source)
    if trl_rule is not None and trl_rule.values and not trl_rule.kinds - {"none"}:
        value = _apply_rule(trl_rule, key, value, source)
    _check_range(key, value, source)
    return value


def _check_trl_value(key: str, value: Any, source: str) -> Any:
    """A GRPOConfig / TrainingArguments field: checked against the annotation in TRL's source, so `--dry-run`
    catches `num_iterations: "two"` instead of the trainer, minutes later."""
    rule = trl_field_rules().get(key)
    if rule is not None:
        value = _apply_rule(rule, key, rule.unalias(value), source)
    _check_range(key, value, source)
    return value


@functools.cache
def _schema_rule(key: str) -> TypeRule:
    """Our field's type (config/schema.py) as a TypeRule, so both kinds of field are checked by one function."""
    tp = field_type(key)
    choices = literal_choices(tp)
    if choices is not None:
        return TypeRule(values=choices)
    origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp)
        return TypeRule(frozenset({"list"}), item=TypeRule(frozenset({_KINDS[item.__name__]})))
    if origin is dict:
        return TypeRule(frozenset({"dict"}))
    return TypeRule(frozenset({_KINDS[tp.__name__]}))


_BOOL_WORDS = {"true": True, "false": False}


def _apply_rule(rule: TypeRule, key: str, value: Any, source: str) -> Any:
    ok, value = _coerce(rule, value)
    if ok:
        return value
    if rule.values and not rule.kinds - {"none"}:
        names = [str(v) for v in rule.values]
        near = [n for n in names if n.startswith(str(value))][:1] or difflib.get_close_matches(str(value), names, n=1)
        hint = f" Did you mean '{near[0]}'?" if near else ""
        # transformers' optimizer and scheduler enums have dozens of values: name a few and the nearest
        choices = rule.describe() if len(names) <= 12 else f"one of {len(names)} names ({', '.join(names[:5])}, ...)"
        raise UsageError(f"{source}: '{key}' must be {choices}, not {value!r}.{hint}")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{source}: '{key}' must be a finite number, not {value!r}.")
    raise UsageError(f"{source}: '{key}' must be {rule.describe()}, not {value!r} ({type(value).__name__}).")


def _coerce(rule: TypeRule, value: Any) -> tuple[bool, Any]:
    """(accepted, value as the field holds it). JSON true is a bool, not the int 1; "false"/"False" is a bool for
    a bool field (never the truthy string 'False'); an int is a float where a float is asked for."""
    kinds = rule.kinds
    if "any" in kinds:
        return True, value
    if value is None:
        return "none" in kinds or None in rule.values, None
    if any(type(v) is type(value) and v == value for v in rule.values):
        return True, value
    if isinstance(value, bool):
        if json.dumps(value) in rule.values:  # `use_gradient_checkpointing=false` means the choice "false"
            return True, json.dumps(value)
        return "bool" in kinds, value
    if isinstance(value, str) and value.lower() in _BOOL_WORDS:
        if value.lower() in rule.values:
            return True, value.lower()
        if "bool" in kinds and "str" not in kinds:
            return True, _BOOL_WORDS[value.lower()]
    if isinstance(value, int) and "int" in kinds:
        return True, value
    if isinstance(value, (int, float)) and "float" in kinds:
        return math.isfinite(value), float(value)
    if isinstance(value, str):
        return "str" in kinds, value
    if isinstance(value, list) and "list" in kinds:
        items = [_coerce(rule.item, v) if rule.item else (True, v) for v in value]
        return all(ok for ok, _ in items), [v for _, v in items]
    if isinstance(value, dict):
        return "dict" in kinds, value
    return False, value


def _check_range(key: str, value: Any, source: str) -> None:
    bounds = RANGES.get(key)
    if bounds is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    low, low_in, high, high_in = bounds
    too_low = low is not None and (value < low or value == low and not low_in)
    too_high = high is not None and (value > high or value == high and not high_in)
    if too_low or too_high:
        if high is None:
            where = f"{'>=' if low_in else '>'} {low:g}"
        else:
            where = f"in {'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"
        raise UsageError(f"{source}: '{key}' must be {where}, not {value!r}.")


def normalise_layer(layer: dict[str, Any], source: str) -> dict[str, Any]:
    """Check one layer's keys and values; return it with aliases resolved and GRPOConfig extras under trl_args."""
    out: dict[str, Any] = {}
    trl_args: dict[str, Any] = {}
    spelled: dict[str, str] = {}  # field -> the key this layer set it with
    for derived in ("objective", "agent"):
        if isinstance(layer.get(derived, {}), dict | None):
            # A run's run_config.json also says, under "objective", the loss settings it trained with
            # (grpokit/objective.py) and, under "agent", its tools' schemas and template (grpokit/agents.py): both
            # derived from the fields beside them, so the file (or its dict, given to the Python API) read back
            # runs the same without them.
            layer = {key: value for key, value in layer.items() if key != derived}
    if isinstance(layer.get("cpu_threads"), dict):  # run_config.json's record of the thread counts: not a setting
        layer = {key: value for key, value in layer.items() if key != "cpu_threads"}
    for raw_key, value in layer.items():
        key = ALIASES.get(raw_key, raw_key)
        if key in spelled and key in ALIASES.values():
            # `group_size: 8` and `num_generations: 4` in one file: one of them would be dropped without a word
            raise UsageError(f"{source}: '{spelled[key]}' and '{raw_key}' are the same setting ({key}): give one.")
        spelled[key] = raw_key
        if key in NO_EFFECT:
            log.warning("%s: '%s' has no effect (%s); ignoring it.", source, key, NO_EFFECT[key])
            continue
        if key == "trl_args":
            if not isinstance(value, dict):
                raise UsageError(f"{source}: 'trl_args' must be an object of GRPOConfig fields.")
            for sub_key, sub_value in value.items():
                _check_trl_key(sub_key, source)
                trl_args[sub_key] = _check_trl_value(sub_key, sub_value, source)
            continue
        if key in FIELDS:
            out[key] = _check_value(key, value, source)
        elif key in trl_field_names():
            trl_args[key] = _check_trl_value(key, value, source)
        else:
            near = difflib.get_close_matches(key, _valid_keys(), n=1, cutoff=0.6)
            hint = f" Did you mean '{near[0]}'?" if near else " See `python train_grpo.py --help` for the fields."
            raise UsageError(f"{source}: unknown config key '{raw_key}'.{hint}")
    if trl_args:
        out["trl_args"] = trl_args
    return out


def _check_trl_key(key: str, source: str) -> None:
    names = trl_field_names()
    if names and key not in names:
        near = difflib.get_close_matches(key, sorted(names), n=1, cutoff=0.6)
        hint = f" Did you mean '{near[0]}'?" if near else ""
        raise UsageError(f"{source}: '{key}' is not a field of TRL's GRPOConfig.{hint}")


# Python spellings people type on a command line: `--set mask_truncated_completions=False`.
PYTHON_WORDS = {"True": True, "False": False, "None": None}


def parse_set_option(item: str) -> tuple[str, Any]:
    """`--set key=value`: the value is read as JSON when it parses (numbers, true, lists), Python's True / False /
    None as those, else as a string. The field's type check comes after, as for a config file."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"--set '{item}': write it as key=value, e.g. --set num_generations=8.")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = PYTHON_WORDS.get(raw.strip(), raw)
    return key.strip(), value


def build_config(
    preset: str | None = "default",
    config_file: str | None = None,
    flags: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
) -> GRPORunConfig:
    """Merge the layers in precedence order and validate the result."""
    merged: dict[str, Any] = {}
    trl_args: dict[str, Any] = {}
    layers: list[tuple[str, dict[str, Any]]] = []
    sources: dict[str, str] = {}  # field -> the layer that set it last (GRPORunConfig.source_of)
    if preset:
        layers.append(("preset", f"preset '{preset}'", load_preset(preset)))
    if config_file:
        layers.append(("file", f"config {config_file}", read_json_file(config_file, "Config file")))
    if flags:
        layers.append(("flag", "command line", {k: v for k, v in flags.items() if v is not None}))
    if overrides:
        layers.append(("--set", "--set", dict(parse_set_option(item) for item in overrides)))
    for kind, source, layer in layers:
        checked = normalise_layer(layer, source)
        layer_trl = checked.pop("trl_args", {})
        trl_args.update(layer_trl)
        merged.update(checked)
        sources.update(dict.fromkeys([*checked, *layer_trl], kind))
    config = GRPORunConfig(**merged, trl_args=trl_args)
    config.record_sources(sources)
    _description_follows(config, layers)
    _epochs_or_steps(config)
    # Under torchrun / accelerate every process sees WORLD_SIZE: the batch arithmetic must hold for all of them.
    validate(config, world_size=int(os.environ.get("WORLD_SIZE", "1")))
    return config


LAYER_RANK = {"default": 0, "preset": 1, "file": 2, "flag": 3, "api": 3, "--set": 4}
# What a preset's or file's description speaks of: a later layer that changes one leaves it describing another run
DESCRIBED_FIELDS = ("model_name", "dataset", "dataset_path", "custom_data", "reward_config_name", "max_steps")


def _description_follows(config: GRPORunConfig, layers: list[tuple[str, str, dict[str, Any]]]) -> None:
    """A description (run_config.json, --dry-run) says what the run is: when a later layer changes what the
    description's layer set, without giving a description of its own, the description names the changes."""
    if not config.description:
        return
    owner = config.source_of("description")
    changed = [name for name in DESCRIBED_FIELDS
               if LAYER_RANK.get(config.source_of(name), 0) > LAYER_RANK.get(owner, 0)]
    if changed:
        source = next((src for kind, src, _ in layers if kind == owner), owner)
        config.description = (f"{config.description} [{source}, changed by a later layer: "
                              + ", ".join(f"{name}={getattr(config, name)!r}" for name in changed) + "]")


def _epochs_or_steps(config: GRPORunConfig) -> None:
    """num_train_epochs and max_steps decide the same thing (TRL lets max_steps win). What the user typed wins: epochs
    given in a later layer than the steps (--epochs over a preset's max_steps) drop the steps; both typed on the same
    command line is a conflict named in one line."""
    if config.max_steps <= 0:
        return
    epochs, steps = (LAYER_RANK[config.source_of(n)] for n in ("num_train_epochs", "max_steps"))
    if epochs > steps:
        log.info("--epochs %g (%s) replaces max_steps %d from the %s: the run trains for epochs.",
                 config.num_train_epochs, config.source_of("num_train_epochs"), config.max_steps,
                 config.source_of("max_steps"))
        config.max_steps = -1
    elif epochs == steps >= LAYER_RANK["flag"]:
        raise UsageError(f"num_train_epochs ({config.num_train_epochs:g}) and max_steps ({config.max_steps}) both "
                         "decide the run's length: give one of --epochs / --max-steps.")


# The largest group accepted: 16x the largest group GRPO recipes use (DeepSeekMath's 64 per question,
# arXiv:2402.03300 section 4.2). Beyond it the group baseline is no better estimated, but one step's generation
# call and its accumulated micro-batches grow with every completion.
MAX_GROUP = 1024


def validate(config: GRPORunConfig, world_size: int = 1) -> None:
    """Cross-field checks that would otherwise fail deep inside TRL, after the model has loaded."""
    positive = ("max_seq_length", "lora_r", "lora_alpha", "per_device_train_batch_size", "per_device_eval_batch_size",
                "gradient_accumulation_steps", "max_completion_length", "logging_steps")
    for name in positive:
        if getattr(config, name) <= 0:
            raise UsageError(f"'{name}' must be a positive number, not {getattr(config, name)}.")
    non_negative = ("max_samples", "max_eval_samples", "eval_steps", "save_steps", "save_total_limit",
                    "max_prompt_length", "generation_max_new_tokens", "max_lora_rank", "eval_pass_k",
                    "generation_threads")
    for name in non_negative:
        if getattr(config, name) < 0:
            raise UsageError(f"'{name}' must be 0 or more, not {getattr(config, name)}.")
    if not 0 <= config.seed < 2**32:  # numpy's seed range: transformers' set_seed seeds numpy too, and fails there
        raise UsageError(f"'seed' must be in [0, {2**32 - 1}] (numpy's seed range), not {config.seed}.")
    longest = config.max_prompt_length + config.max_completion_length
    if config.max_completion_length >= config.max_seq_length or config.max_prompt_length and \
            longest > config.max_seq_length:
        # the model and the generation engine are prepared for max_seq_length tokens; past it the llama.cpp engine
        # falls back to transformers without a word and a step takes minutes
        prompt = f"max_prompt_length {config.max_prompt_length} + " if config.max_prompt_length else ""
        raise UsageError(f"{prompt}max_completion_length {config.max_completion_length} tokens do not fit in "
                         f"max_seq_length {config.max_seq_length} (the window the model is prepared for): raise "
                         f"max_seq_length to {max(longest, config.max_completion_length + 1)}, or lower "
                         "max_completion_length" + (" or max_prompt_length." if prompt else "."))
    epsilon, epsilon_high = config.trl_args.get("epsilon", 0.2), config.trl_args.get("epsilon_high")
    if epsilon_high is not None and config.loss_type != "cispo" and epsilon_high < epsilon:
        # DAPO's clip-higher widens the upper bound (0.28 over 0.2); a narrower one clips most of the updates that
        # raise a good completion's probability
        raise UsageError(f"'epsilon_high' {epsilon_high:g} is below 'epsilon' {epsilon:g}: the upper clip bound "
                         "would be the tighter one (DAPO's clip-higher uses 0.28 over 0.2); give epsilon_high >= "
                         "epsilon, or leave it out (= epsilon).")
    if epsilon_high is not None and config.loss_type == "cispo" and epsilon_high < 1:
        raise UsageError(f"'epsilon_high' {epsilon_high:g} with loss_type cispo caps every importance weight below "
                         "1 (an on-policy token's weight is 1): give the cap as a ratio, e.g. 5.0 (the ScaleRL "
                         "paper's).")
    if config.max_generation_samples <= 0:
        raise UsageError(
            "'max_generation_samples' must be at least 1; use --disable-generation-logging to turn logging off."
        )
    if config.learning_rate <= 0:
        raise UsageError(f"'learning_rate' must be positive, not {config.learning_rate}.")
    if not 0.0 <= config.eval_fraction < 1.0:
        raise UsageError(f"'eval_fraction' must be in [0, 1), not {config.eval_fraction}.")
    if config.temperature <= 0:
        raise UsageError(f"'temperature' must be positive, not {config.temperature}.")
    if config.num_generations < 2:
        raise UsageError(
            f"'num_generations' (group_size) is {config.num_generations}: GRPO compares completions within a group, "
            "so it needs at least 2."
        )
    for name, g in (("num_generations", config.num_generations),
                    ("num_generations_eval", config.trl_args.get("num_generations_eval") or 0)):
        if g > MAX_GROUP:
            # TRL samples a step's whole generation batch in one call (GRPOTrainer._prepare_inputs), and the batch
            # must hold whole groups: a group this size is one prompt's completions, all generated and held at once
            per_step = config.per_device_train_batch_size * world_size
            raise UsageError(
                f"'{name}' is {g}: each step would sample {g} completions of one prompt in one generation call and "
                f"train on them as {-(-g // per_step)} accumulated micro-batches of {per_step}. GRPO groups are "
                f"4-64 completions (DeepSeekMath 64, DAPO 16, TRL's default 8): give at most {MAX_GROUP}.")
    if config.load_best_model_at_end and not (config.eval_steps and config.save_steps
                                              and config.save_steps % config.eval_steps == 0):
        raise UsageError(
            "load_best_model_at_end needs evaluations and checkpoints that line up: set eval_steps > 0 and "
            "save_steps to a multiple of it."
        )
    if (config.use_vllm or config.fast_inference) and importlib.util.find_spec("vllm") is None:
        raise UsageError("vLLM generation was requested (use_vllm / fast_inference) but vllm is not installed: "
                         "pip install vllm on a CUDA machine, or drop --use-vllm.")
    if config.sft_loss_weight == 0 and config.grpo_loss_weight == 0:
        raise UsageError("'grpo_loss_weight' and 'sft_loss_weight' are both 0: nothing would be trained. Set either "
                         "above 0 (e.g. --set sft_loss_weight=1.0 --set grpo_loss_weight=0.5).")
    check_batch_arithmetic(config, world_size)
    check_advantage_options(config, world_size)
    check_settings_in_use(config)
    cap = config.trl_args.get("epsilon_high") or config.trl_args.get("epsilon", 0.2)
    if config.loss_type == "cispo" and cap < 1:
        # TRL's CISPO (trl/trainer/grpo_trainer.py) caps each token's importance weight at epsilon_high itself, where
        # the other losses clip the ratio at 1 + epsilon_high; unset it is epsilon, as for them. Unsloth's generated
        # config would put 5.0 there on a GPU; the run keeps TRL's value on every machine (grpokit/objective.py).
        log.warning("loss_type cispo caps each token's importance weight at epsilon_high itself, not at 1 + "
                    "epsilon_high: at %g every weight is below 1, the policy's own samples included. The ScaleRL "
                    "paper uses 4 to 8: --set epsilon_high=5.0.", cap)
    schedule_from_config(config, world_size)  # adaptive_group_size: refused here if the batch cannot follow it
    check_best_metric(config)


def check_settings_in_use(config: GRPORunConfig) -> None:
    """A setting the user gave that this run would not use is refused with the one that would make it count: a run
    never looks configured one way while training another."""
    # A config file may hold every field (save_config_to_file, run_config.json): a value at its default there is
    # not a request; one typed on the command line or passed to GRPOConfig is.
    typed = ("flag", "--set", "api")
    if config.custom_data and config.dataset_path:  # the custom file is read; the preset's local copy never is
        raise UsageError(f"--custom-data {config.custom_data} and --dataset-path {config.dataset_path} both name the "
                         "training data: give one (--dataset-path is a local copy of --dataset's preset; your own "
                         "JSONL goes in --custom-data).")
    if config.custom_data and config.source_of("dataset") in typed and config.source_of("custom_data") in typed:
        raise UsageError(f"--custom-data {config.custom_data} and --dataset {config.dataset} both name the training "
                         "data: give one (custom data would replace the dataset).")

    def changed(name: str) -> bool:
        return config.named_by_user(name) and getattr(config, name) != FIELDS[name].default

    if not config.adaptive_group_size:
        bounds = [n for n in ("min_group_size", "max_group_size", "group_size_schedule") if changed(n)]
        if bounds:
            raise UsageError(f"{' and '.join(bounds)} appl{'y' if len(bounds) > 1 else 'ies'} only with "
                             "adaptive_group_size: set adaptive_group_size "
                             f"true, or drop {'them' if len(bounds) > 1 else 'it'} (the group size is num_generations, "
                             f"{config.num_generations}).")
    if config.dynamic_sampling and config.dynamic_sampling_max_rounds == 0:
        raise UsageError("dynamic_sampling_max_rounds 0 allows no round to replace a zero-variance group, so dynamic "
                         "sampling would change nothing: set 1 or more (default 3), or turn dynamic_sampling off.")
    if not config.dynamic_sampling and changed("dynamic_sampling_max_rounds"):
        raise UsageError("dynamic_sampling_max_rounds only applies with dynamic_sampling: set dynamic_sampling true, "
                         "or drop it.")


# Eval metrics of ours (grpokit/callbacks.py's generation log) that best_metric may name besides TRL's.
OUR_EVAL_METRICS = ("greedy_reward",)


@functools.cache
def trl_eval_metric_names() -> frozenset[str]:
    """The metric names TRL's GRPOTrainer logs (`self._metrics[mode]["..."]`), read from the installed source
    (no import). Empty when TRL is not installed."""
    import re

    path = _module_file("trl.trainer.grpo_trainer")
    if path is None:
        return frozenset()
    return frozenset(re.findall(r'_metrics\[mode\]\["([^"{}]+)"\]', Path(path).read_text())) | {"loss"}


def check_best_metric(config: GRPORunConfig) -> None:
    """best_metric names a metric the evaluations will report, checked now instead of at the first evaluation
    (after the model loaded and trained). Per-reward metrics (rewards/<name>/mean) are checked against the reward
    set once it is built (grpokit/run.py build_rewards)."""
    name = config.best_metric.removeprefix("eval_")
    known = trl_eval_metric_names()
    if not name or not known or name.startswith("rewards/"):
        return
    pass_k = {"pass@1", f"pass@{config.eval_pass_k}"} if config.eval_pass_k else set()
    if re.fullmatch(r"pass@\d+", name) and name not in pass_k:
        needs = f"eval_pass_k {name.split('@')[1]}" if name != "pass@1" else "eval_pass_k > 0"
        raise UsageError(f"best_metric '{name}' is measured only with {needs}: set it (--set eval_pass_k=...), or "
                         "pick another best_metric.")
    valid = sorted(known | set(OUR_EVAL_METRICS) | pass_k)
    if name not in valid:
        near = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        hint = f" Did you mean '{near[0]}'?" if near else ""
        raise UsageError(f"best_metric '{name}' is not an eval metric.{hint} Use reward, greedy_reward, "
                         "rewards/<reward name>/mean, pass@1 / pass@k (with eval_pass_k), or '' for none.")


def check_advantage_options(config: GRPORunConfig, world_size: int = 1) -> None:
    """grpokit/advantages.py's fields: ranges, and the TRL settings they cannot be combined with."""
    for name in ("baseline_ema_decay", "reward_scaling", "reward_clipping", "dynamic_sampling_max_rounds"):
        _check_range(name, getattr(config, name), "config")
    reshapes = (config.baseline_type != "group_mean" or config.reward_scaling != 1.0 or config.reward_clipping > 0
                or config.reward_normalization)
    aggregation = config.trl_args.get("multi_objective_aggregation", "sum_then_normalize")
    if reshapes and aggregation != "sum_then_normalize":
        raise UsageError(f"baseline_type / reward_scaling / reward_clipping / reward_normalization work on the summed "
                         f"reward: they need multi_objective_aggregation 'sum_then_normalize', not '{aggregation}'.")
    local = config.per_device_train_batch_size * (config.trl_args.get("steps_per_generation")
                                                  or config.gradient_accumulation_steps)
    if config.dynamic_sampling and config.sft_loss_weight > 0:
        raise UsageError("dynamic_sampling swaps the rows of a batch, which the supervised term (sft_loss_weight) "
                         "reads its references from: use one of them.")
    if config.dynamic_sampling and world_size > 1 and local % config.num_generations:
        raise UsageError(f"dynamic_sampling keeps or drops whole groups per process: per_device_train_batch_size x "
                         f"steps per generation ({local}) must be a multiple of num_generations "
                         f"({config.num_generations}).")
    _check_agents(config)


def _check_agents(config: GRPORunConfig) -> None:
    """The tool fields' ranges (the tools themselves are resolved by grpokit/agents.py `plan`, before loading)."""
    if config.max_tool_calling_iterations < 1:
        raise UsageError(f"'max_tool_calling_iterations' must be at least 1, not {config.max_tool_calling_iterations}"
                         " (drop --tool / --environment for a run without tools).")
    for name in ("tool_result_max_chars", "tool_timeout"):
        if getattr(config, name) < 0:
            raise UsageError(f"'{name}' must be 0 (no limit) or more, not {getattr(config, name)}.")
    if config.tool_memory_mb < 64:
        raise UsageError(f"'tool_memory_mb' must be at least 64 (the interpreter alone needs ~30 MiB), not "
                         f"{config.tool_memory_mb}.")


def check_batch_arithmetic(config: GRPORunConfig, world_size: int = 1) -> None:
    """GRPO samples whole groups: the generation batch (train) and the eval batch must hold whole groups."""
    g = config.num_generations
    steps_per_generation = config.trl_args.get("steps_per_generation") or config.gradient_accumulation_steps
    generation_batch = config.trl_args.get("generation_batch_size") or (
        config.per_device_train_batch_size * world_size * steps_per_generation
    )
    explicit = "steps_per_generation" in config.trl_args or "generation_batch_size" in config.trl_args
    if generation_batch % g and not explicit and config.per_device_train_batch_size < g:
        # The spec's advice for memory is `--batch-size 1`: a micro-batch smaller than a group. Keep the micro-batch
        # (the memory) and accumulate enough of them that each optimizer step samples whole groups.
        per_step = config.per_device_train_batch_size * world_size
        accumulate = config.gradient_accumulation_steps
        while (per_step * accumulate) % g:
            accumulate += config.gradient_accumulation_steps
        log.warning("per_device_train_batch_size %d x %d process(es) x gradient_accumulation_steps %d does not hold "
                    "whole groups of %d completions: using gradient_accumulation_steps %d (same memory per "
                    "micro-batch, whole groups per optimizer step).", config.per_device_train_batch_size, world_size,
                    config.gradient_accumulation_steps, g, accumulate)
        config.gradient_accumulation_steps = accumulate
        steps_per_generation = accumulate
        generation_batch = per_step * accumulate
    if generation_batch % g:
        raise UsageError(
            f"Generation batch {generation_batch} (per_device_train_batch_size {config.per_device_train_batch_size} x "
            f"{world_size} process(es) x {steps_per_generation} step(s) per generation) is not divisible by "
            f"num_generations {g}: make per_device_train_batch_size a multiple of {g}."
        )
    eval_g = config.trl_args.get("num_generations_eval") or g
    eval_batch = config.per_device_eval_batch_size * world_size
    if eval_batch % eval_g:
        # The eval batch decides nothing about training, and the spec's own example config has 2 with groups of 4:
        # round it up to whole groups, loudly, instead of refusing the file.
        fixed = -(-eval_batch // eval_g) * eval_g // world_size
        while (fixed * world_size) % eval_g:
            fixed += 1
        log.warning("per_device_eval_batch_size %d x %d process(es) does not hold whole groups of %d completions; "
                    "using %d for evaluation.", config.per_device_eval_batch_size, world_size, eval_g, fixed)
        config.per_device_eval_batch_size = fixed


def config_to_dict(config: GRPORunConfig) -> dict[str, Any]:
    """Flat JSON-able dict: our fields, then the GRPOConfig extras at top level (what a config file holds)."""
    data = dataclasses.asdict(config)
    data.update(data.pop("trl_args"))
    return data


def save_config_to_file(config: GRPORunConfig, path: str | os.PathLike) -> Path:
    """Write a config file that `--config` (and `load_config_file`) reads back to an equal config: YAML when the
    name ends in .yaml / .yml, JSON otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() in YAML_SUFFIXES:
        import yaml

        text = yaml.safe_dump(config_to_dict(config), sort_keys=False, allow_unicode=True)
    else:
        text = json.dumps(config_to_dict(config), indent=2, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")
    return path


def load_config_file(path: str | os.PathLike) -> GRPORunConfig:
    """A config from one file over the built-in defaults (no preset)."""
    return build_config(preset=None, config_file=str(path))


def create_default_config(model: str = "llama-3.1-8b", dataset: str = "ultrafeedback") -> GRPORunConfig:
    """The `default` preset for a model and dataset: the spec's Python entry point.

    >>> cfg = create_default_config("llama-3.1-8b", "ultrafeedback")
    >>> cfg.learning_rate = 1e-5
    """
    return build_config(preset="default", flags={"model_name": model, "dataset": dataset})


def resolve_model_name(name: str) -> str:
    """Check `--model`: a preset, a hub id ("org/name"), or an existing directory holding a model's config.json
    (what transformers and Unsloth load first; a directory without it fails only after the run has started)."""
    if Path(name).expanduser().is_dir() and name not in MODEL_PRESETS:
        folder = Path(name).expanduser()
        if not (folder / "config.json").is_file():
            adapter = (folder / "adapter_config.json").is_file()
            what = ("it holds a LoRA adapter, not a model: give the base model it was trained from as --model "
                    "(evaluate the adapter with --eval-only --resume-from-checkpoint DIR)" if adapter else "give a Hugging Face model directory (config.json, "
                    "tokenizer and weights, as save_pretrained writes it), a preset or a hub id")
            raise UsageError(f"Model directory {name} has no config.json: {what}.")
        return name
    if name in MODEL_PRESETS or "/" in name and not name.startswith((".", "/", "~")):
        return name
    if name.startswith((".", "/", "~")):
        raise UsageError(f"Model directory {name} does not exist: check the path, or use a preset or a hub id.")
    near = difflib.get_close_matches(name, list(MODEL_PRESETS), n=1)
    hint = f" Did you mean '{near[0]}'?" if near else ""
    raise UsageError(
        f"Unknown model '{name}'.{hint} Use a preset ({', '.join(MODEL_PRESETS)}), a Hugging Face id like "
        "'org/name', or a local directory."
    )


def trl_kwargs(config: GRPORunConfig) -> dict[str, Any]:
    """The keyword arguments for TRL's GRPOConfig: our `trl=True` fields plus the validated extras."""
    kwargs = {name: getattr(config, name) for name, f in FIELDS.items() if f.metadata["trl"]}
    kwargs.update(config.trl_args)
    return kwargs


__all__ = [
    "build_config", "create_default_config", "save_config_to_file", "load_config_file", "config_to_dict",
    "preset_names", "trl_kwargs", "validate", "resolve_model_name",
]

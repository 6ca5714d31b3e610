"""Build a `GRPORunConfig` from layers: built-in defaults < preset < `--config FILE` < CLI flags < `--set`.

Every layer is a plain dict checked the same way: unknown keys fail with the nearest valid key, wrong types fail
with the expected type, keys that mean nothing for GRPO (the spec's `gamma`) are accepted with a warning.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib.util
import json
import logging
import os
import typing
from pathlib import Path
from typing import Any

from config.errors import UsageError
from config.models import MODEL_PRESETS
from config.schema import FIELDS, GRPORunConfig, describe_type, field_type, literal_choices

log = logging.getLogger("grpo")

CONFIG_DIR = Path(__file__).resolve().parent
PRESET_DIR = CONFIG_DIR / "presets"

# Other names people use for our fields (the spec's `group_size` is TRL's `num_generations`).
ALIASES = {
    "group_size": "num_generations",
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
VALUE_ALIASES = {("reward_function_type", "systematic"): "multi"}


@functools.cache
def trl_field_names() -> frozenset[str]:
    """GRPOConfig's fields (with TrainingArguments'), read from the installed sources: no TRL import, so this
    stays instant for `--dry-run`. Empty when TRL is not installed."""
    names: set[str] = set()
    for module, classes in (
        ("trl.trainer.grpo_config", {"GRPOConfig"}),
        ("trl.trainer.base_config", {"_BaseConfig"}),
        ("transformers.training_args", {"TrainingArguments"}),
    ):
        path = _module_file(module)
        if path is None:
            continue
        tree = ast.parse(Path(path).read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name in classes:
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        if not item.target.id.startswith("_"):
                            names.add(item.target.id)
    return frozenset(names)


def _module_file(dotted: str) -> str | None:
    top, _, rest = dotted.partition(".")
    spec = importlib.util.find_spec(top)  # finds the package without executing it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)), *rest.split(".")).with_suffix(".py")
    return str(path) if path.exists() else None


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def read_json_file(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON object from a file, or a UsageError saying exactly what is wrong with it."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{what} {path} does not exist: check the path.")
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory: give a JSON file.")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"{what} {path} cannot be read ({err.__class__.__name__}: {err}).") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{what} {path} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}.") from None
    if not isinstance(data, dict):
        raise UsageError(f"{what} {path} must hold a JSON object {{...}}, not a {type(data).__name__}.")
    return data


def load_preset(name: str) -> dict[str, Any]:
    path = PRESET_DIR / f"{name}.json"
    if not path.exists():
        raise UsageError(f"Unknown preset '{name}'. Valid presets: {', '.join(preset_names())}.")
    return read_json_file(path, "Preset")


def _valid_keys() -> list[str]:
    return [*FIELDS, *ALIASES, *NO_EFFECT, *trl_field_names()]


def _check_value(key: str, value: Any, source: str) -> Any:
    """Coerce a JSON value to the field's type, strictly: "fast" is not a learning rate."""
    tp = field_type(key)
    value = VALUE_ALIASES.get((key, value), value) if isinstance(value, str) else value
    choices = literal_choices(tp)
    if choices is not None:
        if isinstance(value, bool) and json.dumps(value) in choices:
            value = json.dumps(value)  # `--set use_gradient_checkpointing=false` / JSON false mean the choice "false"
        if value not in choices:
            raise UsageError(f"{source}: '{key}' must be one of {', '.join(map(repr, choices))}, not {value!r}.")
        return value
    origin = typing.get_origin(tp)
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif tp is str:
        ok = isinstance(value, str)
    elif origin is list:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif origin is dict or tp is dict:
        ok = isinstance(value, dict)
    else:  # pragma: no cover - every field type is handled above
        ok = True
    if not ok:
        raise UsageError(
            f"{source}: '{key}' must be {describe_type(tp)}, not {value!r} ({type(value).__name__})."
        )
    return value


def normalise_layer(layer: dict[str, Any], source: str) -> dict[str, Any]:
    """Check one layer's keys and values; return it with aliases resolved and GRPOConfig extras under trl_args."""
    out: dict[str, Any] = {}
    trl_args: dict[str, Any] = {}
    for raw_key, value in layer.items():
        key = ALIASES.get(raw_key, raw_key)
        if key in NO_EFFECT:
            log.warning("%s: '%s' has no effect (%s); ignoring it.", source, key, NO_EFFECT[key])
            continue
        if key == "trl_args":
            if not isinstance(value, dict):
                raise UsageError(f"{source}: 'trl_args' must be an object of GRPOConfig fields.")
            for sub_key, sub_value in value.items():
                _check_trl_key(sub_key, source)
                trl_args[sub_key] = sub_value
            continue
        if key in FIELDS:
            out[key] = _check_value(key, value, source)
        elif key in trl_field_names():
            trl_args[key] = value
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


def parse_set_option(item: str) -> tuple[str, Any]:
    """`--set key=value`: the value is read as JSON when it parses (numbers, true, lists), else as a string."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"--set '{item}': write it as key=value, e.g. --set num_generations=8.")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
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
    if preset:
        layers.append((f"preset '{preset}'", load_preset(preset)))
    if config_file:
        layers.append((f"config {config_file}", read_json_file(config_file, "Config file")))
    if flags:
        layers.append(("command line", {k: v for k, v in flags.items() if v is not None}))
    if overrides:
        layers.append(("--set", dict(parse_set_option(item) for item in overrides)))
    for source, layer in layers:
        checked = normalise_layer(layer, source)
        trl_args.update(checked.pop("trl_args", {}))
        merged.update(checked)
    config = GRPORunConfig(**merged, trl_args=trl_args)
    # Under torchrun / accelerate every process sees WORLD_SIZE: the batch arithmetic must hold for all of them.
    validate(config, world_size=int(os.environ.get("WORLD_SIZE", "1")))
    return config


def validate(config: GRPORunConfig, world_size: int = 1) -> None:
    """Cross-field checks that would otherwise fail deep inside TRL, after the model has loaded."""
    positive = ("max_seq_length", "lora_r", "lora_alpha", "per_device_train_batch_size", "per_device_eval_batch_size",
                "gradient_accumulation_steps", "max_completion_length", "logging_steps")
    for name in positive:
        if getattr(config, name) <= 0:
            raise UsageError(f"'{name}' must be a positive number, not {getattr(config, name)}.")
    non_negative = ("max_samples", "max_eval_samples", "eval_steps", "save_steps", "save_total_limit",
                    "max_prompt_length", "generation_max_new_tokens", "max_lora_rank", "eval_pass_k")
    for name in non_negative:
        if getattr(config, name) < 0:
            raise UsageError(f"'{name}' must be 0 or more, not {getattr(config, name)}.")
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
    if config.load_best_model_at_end and not (config.eval_steps and config.save_steps
                                              and config.save_steps % config.eval_steps == 0):
        raise UsageError(
            "load_best_model_at_end needs evaluations and checkpoints that line up: set eval_steps > 0 and "
            "save_steps to a multiple of it."
        )
    if (config.use_vllm or config.fast_inference) and importlib.util.find_spec("vllm") is None:
        raise UsageError("vLLM generation was requested (use_vllm / fast_inference) but vllm is not installed: "
                         "pip install vllm on a CUDA machine, or drop --use-vllm.")
    check_batch_arithmetic(config, world_size)


def check_batch_arithmetic(config: GRPORunConfig, world_size: int = 1) -> None:
    """GRPO samples whole groups: the generation batch (train) and the eval batch must hold whole groups."""
    g = config.num_generations
    steps_per_generation = config.trl_args.get("steps_per_generation") or config.gradient_accumulation_steps
    generation_batch = config.trl_args.get("generation_batch_size") or (
        config.per_device_train_batch_size * world_size * steps_per_generation
    )
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
    """Write a config file that `--config` (and `load_config_file`) reads back to an equal config."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config_to_dict(config), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
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
    """Check `--model`: a preset, a hub id ("org/name"), or an existing directory."""
    if name in MODEL_PRESETS or "/" in name and not name.startswith((".", "/", "~")) or Path(name).is_dir():
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

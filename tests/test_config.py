"""Config: presets, precedence, the spec's example file, bad input -> exit 2 with one line."""

import json
import logging

import pytest

from config import (
    MODEL_PRESETS,
    build_config,
    create_default_config,
    load_config_file,
    preset_names,
    save_config_to_file,
    trl_kwargs,
)
from config.errors import UsageError
from config.loader import PRESET_DIR, preset_file, trl_field_names
from config.schema import FIELDS

SPEC_EXAMPLE = {
    "model_name": "unsloth/llama-3.1-8b-bnb-4bit", "max_seq_length": 2048, "learning_rate": 5e-7,
    "num_train_epochs": 3, "per_device_train_batch_size": 2, "per_device_eval_batch_size": 2,
    "gradient_accumulation_steps": 4, "max_samples": 1000, "output_dir": "./grpo_outputs", "beta": 0.1,
    "gamma": 1.0, "group_size": 4, "reward_function_type": "systematic", "reward_config_name": "balanced",
}


@pytest.mark.parametrize("name", preset_names())
def test_every_shipped_preset_validates_and_says_what_it_is_for(name):
    from config.loader import read_json_file

    data = read_json_file(preset_file(name), "Preset")  # JSON or YAML
    assert data.get("description"), f"preset {name} needs a description"
    config = build_config(preset=name)
    assert config.description == data["description"]


def test_presets_include_the_three_the_spec_names():
    assert {"quick_test", "default", "production"} <= set(preset_names())


def test_every_trl_field_we_declare_exists_in_the_installed_grpo_config():
    from trl import GRPOConfig

    names = trl_field_names()
    import dataclasses

    real = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert names == real  # reading the source finds exactly GRPOConfig's fields
    assert [n for n, f in FIELDS.items() if f.metadata["trl"] and n not in real] == []


def test_default_config_becomes_a_real_grpo_config():
    from trl import GRPOConfig

    config = create_default_config("qwen2.5-7b", "gsm8k")
    args = GRPOConfig(**trl_kwargs(config), use_cpu=True)  # no GPU here
    assert args.num_generations == config.num_generations
    assert args.learning_rate == config.learning_rate


def test_precedence_defaults_then_preset_then_file_then_flags_then_set(tmp_path):
    file = tmp_path / "c.json"
    file.write_text(json.dumps({"learning_rate": 1e-4, "lora_r": 8, "seed": 1}))
    config = build_config(preset="quick_test", config_file=str(file), flags={"lora_r": 4, "seed": None},
                          overrides=["seed=9"])
    assert config.model_name == "smollm2-135m"  # from the preset (the default is llama-3.1-8b)
    assert config.learning_rate == 1e-4  # file beats preset (2e-5)
    assert config.lora_r == 4  # flag beats file
    assert config.seed == 9  # --set beats all; an unset flag (None) does not override
    assert config.max_seq_length == 256  # preset beats the built-in 2048


def test_spec_example_config_loads_with_alias_and_no_effect_warning(tmp_path, caplog):
    file = tmp_path / "spec.json"
    file.write_text(json.dumps(SPEC_EXAMPLE))
    logger = logging.getLogger("grpo")  # the CLI stops it propagating to the root, so listen on it directly
    logger.addHandler(caplog.handler)
    try:
        config = load_config_file(file)
    finally:
        logger.removeHandler(caplog.handler)
    assert config.num_generations == 4  # group_size
    assert config.reward_function_type == "multi"  # 'systematic'
    assert config.beta == 0.1 and config.learning_rate == 5e-7
    assert any("'gamma' has no effect" in r.message for r in caplog.records)
    # eval batch 2 cannot hold a group of 4: rounded up to 4, with a warning, rather than refusing the spec's file
    assert config.per_device_eval_batch_size == 4
    assert any("using 4 for evaluation" in r.getMessage() for r in caplog.records)


def test_python_api_round_trips_through_a_file(tmp_path):
    config = create_default_config("llama-3.1-8b", "ultrafeedback")
    config.learning_rate = 3e-6
    config.trl_args["top_p"] = 0.9
    path = save_config_to_file(config, tmp_path / "my_config.json")
    assert load_config_file(path) == config


def test_set_accepts_any_grpo_config_field_and_passes_it_on():
    config = build_config(preset="default", overrides=["top_k=20", "mask_truncated_completions=true"])
    assert trl_kwargs(config)["top_k"] == 20
    assert trl_kwargs(config)["mask_truncated_completions"] is True


@pytest.mark.parametrize(
    "layer, message",
    [
        ({"learning_rat": 1e-5}, "Did you mean 'learning_rate'"),  # misspelt key -> nearest valid
        ({"learning_rate": "fast"}, "'learning_rate' must be float"),  # wrong type
        ({"num_generations": 3}, "not divisible by num_generations 3"),  # 8 completions, groups of 3
        ({"num_generations": 1}, "needs at least 2"),
        ({"reward_function_type": "both"}, "must be one of 'single', 'multi'"),
        ({"max_generation_samples": 0}, "at least 1"),
        ({"trl_args": {"not_a_field": 1}}, "not a field of TRL's GRPOConfig"),
    ],
)
def test_bad_config_values_fail_with_the_fix(tmp_path, layer, message):
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(layer))
    with pytest.raises(UsageError, match=message):
        build_config(preset="default", config_file=str(file))


def test_model_presets_cover_the_spec():
    assert {"llama-3.1-8b", "llama-3.1-70b", "gemma-2-9b", "qwen2.5-7b", "smollm2-135m"} <= set(MODEL_PRESETS)


LAUNCHERS = sorted((PRESET_DIR.parent / "accelerate").glob("*.yaml"))


@pytest.mark.parametrize("path", LAUNCHERS, ids=lambda p: p.name)
def test_every_launcher_config_parses_and_says_when_to_use_it(path):
    import yaml

    text = path.read_text()
    assert text.startswith("#"), "each launcher config opens with when to use it"
    data = yaml.safe_load(text)
    assert data["distributed_type"] in {"MULTI_GPU", "DEEPSPEED", "FSDP"}
    # No precision fixed by the launcher: the run's load plan sets bf16 or fp16 per card (a T4 has no bf16), and
    # TrainingArguments' choice is what accelerate then uses (tests/test_load_plan.py checks it per card).
    assert data["num_processes"] >= 2 and data["mixed_precision"] == "no"
    assert "--num_processes N" in text  # the GPU count is a default, overridable at launch
    if data["distributed_type"] == "DEEPSPEED":
        assert data["deepspeed_config"]["zero_stage"] in (2, 3)


def test_launcher_configs_cover_ddp_zero2_zero3_fsdp():
    assert {p.stem for p in LAUNCHERS} == {"ddp", "deepspeed_zero2", "deepspeed_zero3", "fsdp"}


def test_vllm_flags_land_in_the_grpo_config_the_trainer_receives(monkeypatch):
    import importlib.util

    from trl import GRPOConfig

    from grpokit.run import grpo_config_kwargs

    real_find_spec = importlib.util.find_spec
    # vllm is GPU-only and not installed here: pretend it is, to check what we hand TRL
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a))
    config = build_config(preset="default", flags={"use_vllm": True, "vllm_mode": "server",
                                                   "vllm_server_host": "10.0.0.5", "vllm_server_port": 8001})
    args = GRPOConfig(**grpo_config_kwargs(config, has_eval=False, reward_weights=None), use_cpu=True)
    assert (args.use_vllm, args.vllm_mode, args.vllm_server_host, args.vllm_server_port) == (True, "server", "10.0.0.5", 8001)
    colocate = build_config(preset="default", flags={"use_vllm": True, "vllm_mode": "colocate"},
                            overrides=["vllm_gpu_memory_utilization=0.4"])
    args = GRPOConfig(**grpo_config_kwargs(colocate, has_eval=False, reward_weights=None), use_cpu=True)
    assert args.vllm_mode == "colocate" and args.vllm_gpu_memory_utilization == 0.4


def test_unsloth_fast_inference_settings_reach_from_pretrained_kwargs(monkeypatch):
    """GPU-only branch: check what we pass to Unsloth (FastLanguageModel.from_pretrained) for vLLM generation."""
    import importlib.util

    from grpokit import model_loader
    from grpokit.run import grpo_config_kwargs

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a))
    config = build_config(preset="default", flags={"model_name": "qwen2.5-7b"},
                          overrides=["fast_inference=true", "gpu_memory_utilization=0.5", "max_lora_rank=32"])
    assert model_loader.unsloth_kwargs(config, cuda=True) == {
        "max_seq_length": 2048, "load_in_4bit": True, "use_gradient_checkpointing": "unsloth",
        "fast_inference": True, "gpu_memory_utilization": 0.5, "max_lora_rank": 32}
    assert grpo_config_kwargs(config, has_eval=False, reward_weights=None)["use_vllm"] is True


def test_vllm_requested_without_vllm_installed_exits_2(cli):
    code, _, err = cli("--quick-test", "--use-vllm", "--dry-run")
    assert code == 2 and "vllm is not installed" in err


def test_world_size_enters_the_batch_arithmetic(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    # 8 per device x 3 processes = 24 completions: whole groups of 4, fine; groups of 5 are not
    assert build_config(preset="default").num_generations == 4
    with pytest.raises(UsageError, match=r"x 3 process\(es\)"):
        build_config(preset="default", overrides=["num_generations=5"])
    # A micro-batch smaller than a group (the spec's `--batch-size 1`): whole groups are accumulated, and said
    assert build_config(preset="default", overrides=["num_generations=16"]).gradient_accumulation_steps == 2


def test_spec_batch_size_1_accumulates_whole_groups(cli, caplog):
    import logging

    logger = logging.getLogger("grpo")  # does not propagate: listen on it directly
    logger.addHandler(caplog.handler)
    try:
        code, out, err = cli("--quick-test", "--batch-size", "1", "--dry-run")
    finally:
        logger.removeHandler(caplog.handler)
    assert code == 0, err
    config = json.loads(out)["config"]
    assert (config["per_device_train_batch_size"], config["gradient_accumulation_steps"]) == (1, 4)
    assert "using gradient_accumulation_steps 4" in caplog.text


def test_spec_config_load_in_4bit_false(cli, tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"model_name": "smollm2-135m", "dataset": "arithmetic", "load_in_4bit": false}')
    code, out, err = cli("--config", str(path), "--dry-run")
    assert code == 0, err
    assert json.loads(out)["config"]["load_in_4bit"] is False


def test_gradient_checkpointing_choice_reaches_grpo_config():
    """GRPOConfig defaults gradient_checkpointing to True; 'false' must reach it (else a silent second forward)."""
    from grpokit.run import grpo_config_kwargs

    for value, expected in (("false", False), ("true", True), ("unsloth", True)):
        config = build_config(preset="quick_test", overrides=[f"use_gradient_checkpointing={value}"])
        assert grpo_config_kwargs(config, has_eval=True, reward_weights=None)["gradient_checkpointing"] is expected
    config = build_config(preset="quick_test", overrides=["gradient_checkpointing=true"])  # TRL's own key wins
    assert grpo_config_kwargs(config, has_eval=True, reward_weights=None)["gradient_checkpointing"] is True


def test_attention_kernel_choice():
    """'auto': eager on CPU for short sequences (faster backward, BENCHMARKS.md), the model's default otherwise."""
    from grpokit import model_loader

    short = build_config(preset="quick_test")  # 128 + 10 tokens
    long = build_config(preset="quick_test", overrides=["max_completion_length=512", "max_seq_length=1024"])
    assert model_loader.attn_implementation(short, cuda=False) == "eager"
    assert model_loader.attn_implementation(long, cuda=False) is None
    assert model_loader.attn_implementation(short, cuda=True) is None
    forced = build_config(preset="quick_test", overrides=["attn_implementation=sdpa"])
    assert model_loader.attn_implementation(forced, cuda=False) == "sdpa"
    assert model_loader.unsloth_kwargs(short)["attn_implementation"] == "eager"
    with pytest.raises(UsageError, match="attn_implementation"):
        build_config(preset="quick_test", overrides=["attn_implementation=fast"])


# ---- TRL fields are type-checked at parse time (read from TRL's source: no TRL import) -------------------------


def _dry_run_config(cli, tmp_path, *args):
    code, out, err = cli("--quick-test", "--dry-run", "--output-dir", str(tmp_path / "o"), *args)
    assert code == 0, err
    return json.loads(out)["config"]


def test_python_style_booleans_from_set_become_real_booleans(cli, tmp_path):
    """`--set x=False` must reach TRL as False, never as the (truthy) string 'False'."""
    config = _dry_run_config(cli, tmp_path, "--set", "mask_truncated_completions=False", "--set", "load_in_4bit=False",
                             "--set", "sync_ref_model=TRUE", "--set", "min_p=None")
    assert config["mask_truncated_completions"] is False  # a TRL field
    assert config["load_in_4bit"] is False  # one of ours
    assert config["sync_ref_model"] is True  # any case, for a bool field
    assert config["min_p"] is None  # `float | None`
    assert not (tmp_path / "o").exists()


def test_bool_strings_in_a_config_file_become_booleans(cli, tmp_path):
    file = tmp_path / "c.json"
    file.write_text(json.dumps({"mask_truncated_completions": "false", "trl_args": {"log_completions": "True"}}))
    config = _dry_run_config(cli, tmp_path, "--config", str(file))
    assert config["mask_truncated_completions"] is False and config["log_completions"] is True


@pytest.mark.parametrize(
    "setting, message",
    [
        ("num_iterations=two", "--set: 'num_iterations' must be int, not 'two' (str)."),
        ("num_iterations=2.5", "'num_iterations' must be int, not 2.5 (float)"),
        ("top_p=abc", "--set: 'top_p' must be float, not 'abc' (str)."),
        ("mask_truncated_completions=maybe", "'mask_truncated_completions' must be bool, not 'maybe'"),
        ("top_p=1.5", "--set: 'top_p' must be in (0, 1], not 1.5."),  # a range TRL states in its help text
        ("min_p=-0.1", "'min_p' must be in [0, 1], not -0.1"),
        ("num_iterations=0", "'num_iterations' must be >= 1, not 0"),
        ("epsilon=-0.2", "'epsilon' must be >= 0"),
        ("repetition_penalty=0", "'repetition_penalty' must be > 0"),
        ("top_k=-1", "'top_k' must be >= 0"),
        ("eval_strategy=step", "'eval_strategy' must be one of 'no', 'steps', 'epoch', not 'step'. Did you mean 'steps'?"),
        ("ddp_backend=tcp", "'ddp_backend' must be one of 'nccl', 'gloo'"),  # metadata={"choices": [...]}
        ("optim=adamw_turbo", "Did you mean 'adamw_torch'?"),  # one of ours, checked against TRL's enum too
        ("generation_engine=fastest", "'generation_engine' must be one of 'auto', 'transformers'"),  # our Literal
        ('report_to=["wandb", 3]', "'report_to' must be str or list[str] or None"),
        ("learning_rate=NaN", "'learning_rate' must be a finite number"),
    ],
)
def test_bad_trl_values_stop_the_dry_run_with_one_line(cli, tmp_path, setting, message):
    code, out, err = cli("--quick-test", "--dry-run", "--output-dir", str(tmp_path / "o"), "--set", setting)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and message in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "layer, message",
    [
        ({"num_iterations": "two"}, "'num_iterations' must be int, not 'two' (str)."),
        ({"top_p": "abc"}, "'top_p' must be float, not 'abc' (str)."),
        ({"trl_args": {"num_iterations": "two"}}, "'num_iterations' must be int, not 'two' (str)."),
        ({"trl_args": {"top_p": 0}}, "'top_p' must be in (0, 1], not 0."),
        ({"vllm_mode": "remote"}, "'vllm_mode' must be one of 'server', 'colocate'"),
        ({"lr_scheduler_type": "cosine_warm"}, "Did you mean 'cosine_warmup_with_min_lr'?"),
    ],
)
def test_bad_trl_values_in_a_config_file_stop_the_dry_run(cli, tmp_path, layer, message):
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(layer))
    code, _, err = cli("--quick-test", "--dry-run", "--config", str(file), "--output-dir", str(tmp_path / "o"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"config {file}: " in err and message in err


def test_trl_field_rules_read_from_source_agree_with_grpo_config():
    """The annotation-derived rules accept every default GRPOConfig declares (a wrong reading would refuse them)."""
    import dataclasses

    from trl import GRPOConfig

    from config.loader import _check_trl_value, trl_field_rules

    rules = trl_field_rules()
    for f in dataclasses.fields(GRPOConfig):
        if f.name in rules and f.default is not dataclasses.MISSING and not callable(f.default):
            default = f.default.value if hasattr(f.default, "value") else f.default  # enums -> their string
            assert _check_trl_value(f.name, default, "t") == default, f.name
    assert rules["num_iterations"].describe() == "int"
    assert rules["min_p"].describe() == "float or None"


def test_yaml_config_with_the_guides_names(tmp_path):
    """The verl-style guide writes YAML with `group_size` and the addition tutorial `n_update_per_generation`: both
    load as TRL's names (one name in run_config.json), and a YAML config round-trips."""
    from config.loader import build_config, config_to_dict, save_config_to_file

    path = tmp_path / "guide.yaml"
    path.write_text("model_name: smollm2-135m\ngroup_size: 8\nn_update_per_generation: 2\nlearning_rate: 1.0e-6\n"
                    "temperature: 1.0\nmax_grad_norm: 1.0\noptimizer_type: adamw\n", encoding="utf-8")
    config = build_config(preset=None, config_file=str(path))
    assert config.num_generations == 8 and config.trl_args["num_iterations"] == 2
    assert config.learning_rate == 1e-6 and config.source_of("num_generations") == "file"
    assert config.optim == "adamw_torch"  # the guide's optimizer_type: adamw
    data = config_to_dict(config)
    assert "group_size" not in data and "n_update_per_generation" not in data and data["num_iterations"] == 2
    again = build_config(preset=None, config_file=str(save_config_to_file(config, tmp_path / "again.yml")))
    assert config_to_dict(again) == data


def test_guide_style_yaml_numbers_without_a_dot_are_numbers(cli, tmp_path):
    """PyYAML reads YAML 1.1, where `1e-5` (no dot) is the string '1e-5'; the guides write YAML 1.2 (and JSON) floats.
    Through the real CLI: the file loads, and --dry-run states the float."""
    path = tmp_path / "guide.yaml"
    path.write_text("model: smollm2-135m\ndataset: arithmetic\nlearning_rate: 1e-5\nweight_decay: 1E-2\ngroup_size: 4\n"
                    "max_grad_norm: .5e1\nrun_name: '1e-5'\n", encoding="utf-8")
    code, out, err = cli("--config", str(path), "--dry-run", "--output-dir", str(tmp_path / "out"))
    assert code == 0, err
    config = json.loads(out)["config"]
    assert config["learning_rate"] == 1e-5 and config["weight_decay"] == 0.01 and config["max_grad_norm"] == 5.0
    assert config["run_name"] == "1e-5"  # quoted: still text
    import yaml

    assert yaml.safe_load("a: 1e-5") == {"a": "1e-5"}  # PyYAML's own loader is left as it is


@pytest.mark.parametrize("text, message", [
    ("group_size: [8\n", "is not valid YAML at line 2"),
    ("- 1\n- 2\n", "must hold a YAML mapping"),
])
def test_bad_yaml_config_is_one_line(tmp_path, text, message):
    from config.loader import build_config

    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as err:
        build_config(preset=None, config_file=str(path))
    assert "\n" not in str(err.value)


def test_each_field_records_the_layer_that_set_it(tmp_path):
    from config.loader import build_config

    path = tmp_path / "c.json"
    path.write_text('{"reward_config_name": "math", "learning_rate": 0.001}')
    config = build_config("quick_test", str(path), {"seed": 3}, ["top_p=0.9"])
    assert config.source_of("model_name") == "preset" and config.source_of("reward_config_name") == "file"
    assert config.source_of("seed") == "flag" and config.source_of("top_p") == "--set"
    assert config.source_of("lora_dropout") == "default"
    assert config.named_by_user("reward_config_name") and not config.named_by_user("model_name")


def test_a_description_names_what_a_later_layer_changed():
    """run_config.json keeps the preset's description; a flag that changes what it describes (the model, the data,
    the rewards, the length) is named in it, so the file never describes another run."""
    from config.loader import read_json_file

    data = read_json_file(preset_file("quick_test"), "Preset")
    assert build_config(preset="quick_test").description == data["description"]
    config = build_config(preset="quick_test", flags={"model_name": "qwen2.5-7b"}, overrides=["max_steps=3"])
    assert config.description.startswith(data["description"])
    assert config.description.endswith("[preset 'quick_test', changed by a later layer: model_name='qwen2.5-7b', "
                                       "max_steps=3]")
    own = build_config(preset="quick_test", flags={"model_name": "qwen2.5-7b"}, overrides=["description=mine"])
    assert own.description == "mine"


def test_cispo_says_when_its_weight_cap_is_below_1(caplog):
    """TRL's CISPO caps the importance weight at epsilon_high itself; unset, that is epsilon (0.2): every weight below
    1. The run trains TRL's value (the same on every machine) and says so, before loading."""
    logger = logging.getLogger("grpo")
    logger.addHandler(caplog.handler)
    try:
        build_config("quick_test", overrides=["loss_type=cispo"])
        said = {r.getMessage() for r in caplog.records if "cispo" in r.getMessage()}  # root's handler and ours
        caplog.clear()
        build_config("quick_test", overrides=["loss_type=cispo", "epsilon_high=5.0"])
        build_config("quick_test", overrides=["loss_type=dapo"])
        quiet = {r.getMessage() for r in caplog.records if "cispo" in r.getMessage()}
    finally:
        logger.removeHandler(caplog.handler)
    assert len(said) == 1 and "at 0.2 every weight is below 1" in next(iter(said)), said
    assert "--set epsilon_high=5.0" in next(iter(said)) and not quiet

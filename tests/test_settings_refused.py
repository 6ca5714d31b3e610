"""Settings a run would accept and then ignore (or misread) are refused before anything loads: one line naming the
setting and the fix, exit code 2, nothing written."""

import json

import pytest
from conftest import GSM8K_FILE, HH_FILE


def refused(cli, tmp_path, *args):
    """Run the CLI with --dry-run; return the single error line (asserting exit 2 and no output directory)."""
    out = tmp_path / "out"
    code, stdout, err = cli("--quick-test", "--dry-run", "--output-dir", str(out), *args)
    assert code == 2, (code, err[-2000:])
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert not out.exists() and not stdout.strip()
    return lines[0]


def write(path, text):
    path.write_text(text)
    return str(path)


def test_group_size_and_num_generations_in_one_file(cli, tmp_path):
    config = write(tmp_path / "run.yaml", "group_size: 8\nnum_generations: 4\n")
    line = refused(cli, tmp_path, "--config", config)
    assert "'group_size' and 'num_generations' are the same setting" in line and "give one" in line


def test_two_presets_named(cli, tmp_path):
    line = refused(cli, tmp_path, "--preset", "learn_arithmetic")  # besides the --quick-test refused() passes
    assert "--preset learn_arithmetic and --quick-test are two different presets: choose one." in line


@pytest.mark.parametrize("name, text", [
    ("run.yaml", "learning_rate: 1.0e-5\nmax_steps: 2\nlearning_rate: 2.0e-5\n"),
    ("run.json", '{"learning_rate": 1e-5, "max_steps": 2, "learning_rate": 2e-5}'),
])
def test_a_key_given_twice_in_a_config_file(cli, tmp_path, name, text):
    line = refused(cli, tmp_path, "--config", write(tmp_path / name, text))
    assert "'learning_rate' is given twice" in line
    if name.endswith(".yaml"):
        assert "(line 3)" in line


def test_custom_data_and_dataset_both_named(cli, tmp_path):
    data = write(tmp_path / "qa.jsonl", json.dumps({"question": "Capital of Kenya?", "answer": "Nairobi"}) + "\n")
    line = refused(cli, tmp_path, "--custom-data", data, "--dataset", "gsm8k")
    assert "--custom-data" in line and "--dataset gsm8k" in line and "give one" in line


@pytest.mark.parametrize("settings, expected", [
    (["--set", "min_group_size=2"], "min_group_size applies only with adaptive_group_size"),
    (["--set", "max_group_size=8", "--set", "group_size_schedule=stages"],
     "max_group_size and group_size_schedule apply only with adaptive_group_size"),
    (["--set", "dynamic_sampling=true", "--set", "dynamic_sampling_max_rounds=0"],
     "dynamic_sampling_max_rounds 0 allows no round"),
    (["--set", "dynamic_sampling_max_rounds=2"], "dynamic_sampling_max_rounds only applies with dynamic_sampling"),
    (["--set", "adaptive_group_size=true", "--set", "min_group_size=1", "--set", "max_group_size=4"],
     "'min_group_size' is 1: GRPO compares completions within a group, so a group needs at least 2"),
    (["--set", "best_metric=greedy_rewrd"], "best_metric 'greedy_rewrd' is not an eval metric. Did you mean "
                                            "'greedy_reward'?"),
    (["--set", "best_metric=pass@8"], "best_metric 'pass@8' is measured only with eval_pass_k 8"),
])
def test_settings_that_would_be_ignored_are_refused(cli, tmp_path, settings, expected):
    assert expected in refused(cli, tmp_path, *settings)


def test_the_same_checks_guard_the_python_api():
    from config.errors import UsageError
    from grpo_trainer import GRPOConfig

    with pytest.raises(UsageError, match="min_group_size applies only with adaptive_group_size"):
        GRPOConfig(model_name="smollm2-135m", min_group_size=2)
    with pytest.raises(UsageError, match="is not an eval metric"):
        GRPOConfig(model_name="smollm2-135m", best_metric="rewrd")
    GRPOConfig(model_name="smollm2-135m", best_metric="greedy_reward")  # the names evaluations report pass
    GRPOConfig(model_name="smollm2-135m", best_metric="completions/mean_length")


def test_pass_at_k_on_preference_data(cli, tmp_path):
    line = refused(cli, tmp_path, "--dataset", "hh_rlhf", "--dataset-path", str(HH_FILE), "--set", "eval_pass_k=4")
    assert "eval_pass_k 4: pass@k counts answers that pass" in line and "no answer or tests" in line


def test_best_metric_naming_a_reward_the_run_does_not_have(cli, tmp_path):
    line = refused(cli, tmp_path, "--dataset", "gsm8k", "--dataset-path", str(GSM8K_FILE), "--reward-preset", "math",
                   "--reward-function", "multi", "--set", "best_metric=rewards/acuracy/mean")
    assert "best_metric 'rewards/acuracy/mean' is not a metric of this run's rewards" in line
    assert "rewards/accuracy/mean" in line  # the ones it has are named


def test_an_output_dir_that_cannot_be_made_is_one_line(cli, tmp_path):
    code, _, err = cli("--quick-test", "--dry-run", "--output-dir", "/proc/grpo-out")
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: Output directory /proc/grpo-out is not writable")


# TRL 1.15 declares these as plain `str` and refuses an unknown value only inside the trainer, after the model has
# loaded; the valid values are read from TRL's own dispatch (config/loader.py trl_dispatched_values).
@pytest.mark.parametrize("setting, expected", [
    ("loss_type=drgrpo", "'loss_type' must be one of 'cispo', 'grpo', 'bnpo', 'dr_grpo', 'dapo', 'luspo', 'sapo', "
                         "'vespo', not 'drgrpo'. Did you mean 'dr_grpo'?"),
    ("importance_sampling_level=seq", "'importance_sampling_level' must be one of 'token', 'sequence', not 'seq'. "
                                      "Did you mean 'sequence'?"),
    ("scale_rewards=std", "'scale_rewards' must be one of 'group', 'none', 'batch', not 'std'."),
    ("vllm_importance_sampling_mode=token", "'vllm_importance_sampling_mode' must be one of"),
    ("multi_objective_aggregation=sum", "'multi_objective_aggregation' must be one of 'sum_then_normalize', "
                                        "'normalize_then_sum', not 'sum'."),
])
def test_trl_settings_with_an_unknown_value(cli, tmp_path, setting, expected):
    assert expected in refused(cli, tmp_path, "--set", setting)


def test_our_loss_type_field_in_a_config_file_is_checked_the_same_way(cli, tmp_path):
    line = refused(cli, tmp_path, "--config", write(tmp_path / "run.yaml", "loss_type: drgrpo\n"))
    assert "'loss_type' must be one of" in line and "Did you mean 'dr_grpo'?" in line


def test_the_values_come_from_trls_source():
    from config.loader import trl_dispatched_values, trl_field_rules

    values = trl_dispatched_values()
    assert {"grpo", "dr_grpo", "dapo", "bnpo"} <= set(values["loss_type"])
    assert set(values["scale_rewards"]) == {"group", "batch", "none"}
    assert "vllm_mode" not in values  # compared with 'colocate' only, no else-raise: left to TRL
    assert trl_field_rules()["vllm_mode"].kinds == {"str"}


@pytest.mark.parametrize("value, meant", [("true", "group"), ("false", "none"), ("True", "group"), ("batch", "batch")])
def test_scale_rewards_as_a_bool_is_read_as_trl_reads_it(cli, tmp_path, value, meant):
    """TRL 1.15's GRPOConfig.__post_init__ maps older TRL's bool: True -> 'group', False -> 'none'."""
    code, out, err = cli("--quick-test", "--dry-run", "--output-dir", str(tmp_path / "out"),
                         "--set", f"scale_rewards={value}")
    assert code == 0, err
    assert json.loads(out)["config"]["scale_rewards"] == meant


def test_fp16_on_a_cpu_is_refused(cli, tmp_path, monkeypatch):
    from grpokit import load_plan

    monkeypatch.setattr(load_plan, "detect_machine", lambda: load_plan.Machine(cuda=False, bf16=False))
    line = refused(cli, tmp_path, "--set", "fp16=true")
    assert "fp16 mixed precision needs a CUDA GPU; on this CPU the run computes in float32" in line


def test_a_group_no_grpo_recipe_uses(cli, tmp_path):
    line = refused(cli, tmp_path, "--set", "num_generations=100000")
    assert "'num_generations' is 100000" in line and "give at most 1024" in line
    assert "12500 accumulated micro-batches" in line


def real_run_refused(cli, tmp_path, monkeypatch, *args):
    """The real run (no --dry-run) refuses the same line before anything loads or is written."""
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("--quick-test", *args)
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert not (tmp_path / ".grpo.lock").exists() and not (tmp_path / "grpo_training.log").exists()
    return err.strip().splitlines()[-1]


def test_an_empty_output_dir(cli, tmp_path, monkeypatch):
    line = refused(cli, tmp_path, "--output-dir=")
    assert line == "error: --output-dir is empty: give a directory, e.g. --output-dir grpo_outputs/my_run."
    assert real_run_refused(cli, tmp_path, monkeypatch, "--output-dir=") == line


def test_a_model_directory_without_config_json(cli, tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"")
    line = refused(cli, tmp_path, "--model", str(model))
    assert line.startswith(f"error: Model directory {model} has no config.json: give a Hugging Face model directory")
    assert real_run_refused(cli, tmp_path, monkeypatch, "--model", str(model), "--output-dir", "out") == line
    (model / "adapter_config.json").write_text("{}")
    assert "it holds a LoRA adapter, not a model" in refused(cli, tmp_path, "--model", str(model))


def test_a_generation_log_dir_that_is_a_file(cli, tmp_path):
    log_file = write(tmp_path / "logs.txt", "")
    line = refused(cli, tmp_path, "--generation-log-dir", log_file)
    assert line == (f"error: Generation log directory {log_file} is a file, not a directory: choose another "
                    "--generation-log-dir.")


@pytest.mark.parametrize("value", ["-1", "4294967296"])
def test_a_seed_numpy_cannot_take(cli, tmp_path, value):
    # transformers' set_seed seeds numpy, which takes [0, 2**32): -1 was a numpy traceback, even under --dry-run
    line = refused(cli, tmp_path, "--set", f"seed={value}")
    assert line == f"error: 'seed' must be in [0, 4294967295] (numpy's seed range), not {value}."


def test_a_config_file_nested_too_deeply(cli, tmp_path):
    config = write(tmp_path / "run.json", '{"seed": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert "is nested too deeply to read: a config is a flat object of fields." in refused(cli, tmp_path, "--config",
                                                                                          config)


@pytest.mark.parametrize("args, message", [
    # the engine fell back to transformers without a word: a 341 s step
    (["--set", "max_completion_length=100000"], "max_prompt_length 128 + max_completion_length 100000 tokens do not "
     "fit in max_seq_length 256 (the window the model is prepared for): raise max_seq_length to 100128, or lower "
     "max_completion_length or max_prompt_length."),
    (["--set", "max_prompt_length=0", "--set", "max_completion_length=256"], "max_completion_length 256 tokens do "
     "not fit in max_seq_length 256"),
    (["--lora-r", "100000"], "'lora_r' 100000 is above smollm2-135m's hidden size 576"),
    (["--set", "epsilon_high=0.1"], "'epsilon_high' 0.1 is below 'epsilon' 0.2: the upper clip bound would be the "
                                    "tighter one"),
    (["--set", "loss_type=cispo", "--set", "epsilon_high=0.2"], "caps every importance weight below 1"),
    # the preset's local copy was never read beside a custom file
    (["--dataset-path", "some/dir", "--custom-data", "examples/code_functions.jsonl"],
     "--custom-data examples/code_functions.jsonl and --dataset-path some/dir both name the training data: give one"),
])
def test_settings_that_cannot_work_as_given(cli, tmp_path, args, message):
    assert message in refused(cli, tmp_path, *args)


def test_settings_at_their_bounds_are_accepted(cli, tmp_path):
    code, _, err = cli("--quick-test", "--dry-run", "--output-dir", str(tmp_path / "o"), "--lora-r", "576",
                       "--set", "max_completion_length=128", "--set", "epsilon_high=0.2")
    assert code == 0, err


def test_a_yaml_merge_key_is_read_as_yaml_reads_it(cli, tmp_path):
    # `<<: *anchor` was refused in PyYAML's words ("could not determine a constructor for the tag ...merge")
    from config.loader import load_config_file

    config = write(tmp_path / "run.yaml", "lora: &lora {lora_r: 8, lora_alpha: 16}\n")
    merged = write(tmp_path / "merged.yaml", "<<: {lora_r: 8, lora_alpha: 16}\nlora_r: 4\nmax_steps: 2\n")
    loaded = load_config_file(merged)
    assert (loaded.lora_r, loaded.lora_alpha, loaded.max_steps) == (4, 16, 2)  # the file's own key wins the merge
    assert "unknown config key 'lora'" in refused(cli, tmp_path, "--config", config)


def test_a_yaml_tag_that_is_not_a_plain_value(cli, tmp_path):
    config = write(tmp_path / "run.yaml", "lora_r: !!python/object:os.system ls\n")
    assert refused(cli, tmp_path, "--config", config) == (
        f"error: Config file {config} at line 1, column 9: the tag 'python/object:os.system' is not read: a config "
        "holds plain values (numbers, text, true/false, lists, mappings); write the value itself.")

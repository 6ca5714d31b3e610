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

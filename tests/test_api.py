"""The spec's Python API (grpo_trainer.GRPOConfig / GRPOTrainer), and the run semantics the CLI gets through it:
rewards that fit the data, streaming, honest dry-run counts, flags that take effect or are refused."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import GSM8K_FILE, HH_FILE, ROOT

# ---- GRPOConfig: the same fields, defaults and checks as a config file or the CLI ---------------------------------


def test_grpo_config_has_every_field_with_the_cli_defaults():
    import dataclasses

    from config.loader import build_config
    from grpo_trainer import GRPOConfig

    config = GRPOConfig()
    defaults = build_config(preset=None)
    for f in dataclasses.fields(config):
        assert getattr(config, f.name) == getattr(defaults, f.name), f.name


def test_grpo_config_spec_example_and_misspelt_key():
    from config.errors import UsageError
    from grpo_trainer import GRPOConfig

    config = GRPOConfig(model_name="unsloth/llama-3.1-8b-bnb-4bit", max_samples=1000, output_dir="./my_grpo_outputs")
    assert (config.model_name, config.max_samples, config.output_dir) == (
        "unsloth/llama-3.1-8b-bnb-4bit", 1000, "./my_grpo_outputs")
    with pytest.raises(UsageError, match="unknown config key 'max_smaples'. Did you mean 'max_samples'"):
        GRPOConfig(max_smaples=10)
    with pytest.raises(UsageError, match="'learning_rate' must be float"):
        GRPOConfig(learning_rate="fast")
    # A TRL field is accepted (and checked) like in a config file; the spec's aliases too.
    config = GRPOConfig(top_p=0.9, group_size=8, per_device_train_batch_size=8, reward_function_type="systematic")
    assert config.trl_args["top_p"] == 0.9 and config.num_generations == 8 and config.reward_function_type == "multi"


def test_grpo_config_errors_match_the_cli(cli, tmp_path):
    from config.errors import UsageError
    from grpo_trainer import GRPOConfig

    code, _, err = cli("--dry-run", "--set", "num_generations=1")
    assert code == 2
    with pytest.raises(UsageError) as raised:
        GRPOConfig(num_generations=1)
    assert str(raised.value) in err


def test_calls_out_of_order_say_what_to_do_first():
    from config.errors import UsageError
    from grpo_trainer import GRPOConfig, GRPOTrainer

    trainer = GRPOTrainer(GRPOConfig(model_name="smollm2-135m", dataset="arithmetic"))
    with pytest.raises(UsageError, match=r"evaluate\(\) needs a model: call load_model\(\)"):
        trainer.evaluate()
    with pytest.raises(UsageError, match=r"save_model\(\) needs a model"):
        trainer.save_model()
    with pytest.raises(UsageError, match="expected a GRPOConfig or a dict"):
        GRPOTrainer("config.json")


def test_user_dataset_as_list_of_dicts_and_as_mapped_dataset():
    from data_loader import as_grpo_dataset, load_grpo_dataset
    from grpo_trainer import GRPOConfig

    config = GRPOConfig(eval_fraction=0.0)
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(6)]
    train, evaluation, report = as_grpo_dataset(rows, config)
    assert len(train) == 6 and evaluation is None and report.format == "qa"
    assert train[0]["prompt"] == [{"role": "user", "content": "What is 0 + 1?"}] and train[0]["answer"] == "1"
    mapped, _, _ = load_grpo_dataset(custom_data=str(GSM8K_FILE), max_samples=12, eval_fraction=0)
    again, _, _ = as_grpo_dataset(mapped, config)
    assert again["prompt"] == mapped["prompt"] and again["answer"] == mapped["answer"]


# ---- Rewards must fit the data, before a model loads --------------------------------------------------------------


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


PREFS = [{"prompt": f"Explain topic {i}.", "chosen": f"Topic {i} is explained well.", "rejected": "No idea."}
         for i in range(12)]


def test_quick_test_on_preference_data_switches_to_the_data_rewards_with_a_notice(cli, tmp_path):
    code, out, err = cli("--quick-test", "--custom-data", _jsonl(tmp_path / "prefs.jsonl", PREFS), "--dry-run")
    assert code == 0, err
    document = json.loads(out)
    assert document["config"]["reward_config_name"] == "balanced"
    assert "similarity" in document["rewards"]["components"]
    assert any("cannot score" in n and "'balanced'" in n for n in document["notices"])


def test_rewards_asked_for_that_cannot_score_the_data_are_refused(cli, tmp_path):
    code, _, err = cli("--quick-test", "--custom-data", _jsonl(tmp_path / "prefs.jsonl", PREFS),
                       "--reward-preset", "arithmetic", "--dry-run")
    assert code == 2
    assert "cannot score any row" in err and "--reward-preset balanced" in err and len(err.strip().splitlines()) == 1


def test_hh_rlhf_with_the_quick_test_preset_gets_preference_rewards(cli):
    code, out, err = cli("--quick-test", "--dataset", "hh_rlhf", "--dataset-path", str(HH_FILE), "--dry-run")
    assert code == 0, err
    assert json.loads(out)["config"]["reward_config_name"] == "balanced"


# ---- Streaming ------------------------------------------------------------------------------------------------------


def test_streaming_reads_only_the_rows_the_run_needs(cli, tmp_path):
    rows = [{"question": f"What is {i} + 2?", "answer": str(i + 2)} for i in range(400)]
    path = tmp_path / "big.jsonl"
    # A broken line far past the budget: a run that read the whole file would stop on it.
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{not json\n", encoding="utf-8")
    code, out, err = cli("--quick-test", "--custom-data", str(path), "--streaming", "--max-samples", "16",
                         "--dry-run")
    assert code == 0, err
    dataset = json.loads(out)["dataset"]
    assert dataset["streamed"] is True and dataset["rows"]["train"] == 16
    code, _, err = cli("--quick-test", "--custom-data", str(path), "--max-samples", "16", "--dry-run")
    assert code == 2 and ":401: not valid JSON" in err  # without streaming every line is checked


def test_streaming_without_a_row_budget_is_refused(cli, tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"question": "1+1?", "answer": "2"}] * 20)
    code, _, err = cli("--custom-data", path, "--streaming", "--set", "max_samples=0", "--set", "max_steps=-1",
                       "--model", "smollm2-135m", "--dry-run")
    assert code == 2 and "--max-samples N or --max-steps N" in err


def test_streaming_a_preset_from_local_files(cli):
    code, out, err = cli("--quick-test", "--dataset", "gsm8k", "--dataset-path", str(GSM8K_FILE), "--streaming",
                         "--max-samples", "10", "--dry-run")
    assert code == 0, err
    dataset = json.loads(out)["dataset"]
    dropped = sum(dataset["dropped"].get("train", {}).values())  # long prompts, counted by the dry run
    assert dataset["rows"]["train"] + dropped == 10 and dataset["streamed"]


# ---- Dry run tells the truth; flags take effect or are refused -----------------------------------------------------


def test_dry_run_counts_the_prompt_length_drops(cli, tmp_path):
    rows = [{"question": "Short?", "answer": "1"}] * 6 + [{"question": "word " * 200, "answer": "2"}] * 6
    code, out, err = cli("--quick-test", "--custom-data", _jsonl(tmp_path / "d.jsonl", rows), "--set",
                         "eval_fraction=0", "--dry-run")
    assert code == 0, err
    dataset = json.loads(out)["dataset"]
    assert dataset["dropped"]["train"] == {"prompt longer than 128 tokens": 6} and dataset["rows"]["train"] == 6


def test_chosen_field_alone_is_refused(cli, tmp_path):
    rows = [{"prompt": f"Hi {i}", "good": "Hello!", "rejected": "Go away."} for i in range(12)]
    code, _, err = cli("--quick-test", "--custom-data", _jsonl(tmp_path / "d.jsonl", rows), "--chosen-field",
                       "good", "--dry-run")
    assert code == 0, err  # 'rejected' is the default name of the partner column: a full preference row
    rows = [{"prompt": f"Hi {i}", "good": "Hello!", "bad": "Go away."} for i in range(12)]
    code, _, err = cli("--quick-test", "--custom-data", _jsonl(tmp_path / "e.jsonl", rows), "--chosen-field",
                       "good", "--dry-run")
    assert code == 2 and "--chosen-field good is not used" in err and "--rejected-field" in err


def test_system_prompt_replaces_a_rows_own_system_turn(cli, tmp_path):
    rows = [{"messages": [{"role": "system", "content": "Be rude."}, {"role": "user", "content": f"Hi {i}"}]}
            for i in range(12)]
    code, out, err = cli("--quick-test", "--custom-data", _jsonl(tmp_path / "m.jsonl", rows), "--system-prompt",
                         "Be kind.", "--set", "eval_fraction=0", "--reward-preset", "keywords", "--dry-run")
    assert code == 0, err
    dataset = json.loads(out)["dataset"]
    assert dataset["examples"][0]["prompt"][0] == {"role": "system", "content": "Be kind."}
    assert sum(m["role"] == "system" for m in dataset["examples"][0]["prompt"]) == 1
    assert any("replaced the rows' own system turn in 12 train rows" in n for n in dataset["notes"])


def test_custom_reward_module_is_found_in_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text("def short(completions, **kw):\n    return [1.0 for _ in completions]\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "Hi", "completion": "Hello"}) + "\n")
    result = subprocess.run([sys.executable, str(ROOT / "train_grpo.py"), "--score-completions", str(rows),
                             "--reward", "my_rewards:short", "--reward-preset", "keywords"], cwd=tmp_path,
                            capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["scores"]["short"] == 1.0


def test_list_models_shows_whole_checkpoint_ids_at_80_columns():
    from typer.testing import CliRunner

    from config.models import MODEL_PRESETS
    from train_grpo import app

    result = CliRunner().invoke(app, ["--list-models"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    for preset in MODEL_PRESETS.values():
        assert preset.hub_id in result.stdout


# ---- End to end through the API (real model, real TRL) -------------------------------------------------------------


def _docstring_example() -> str:
    import grpo_trainer

    lines = [line[4:] for line in grpo_trainer.__doc__.splitlines() if line.startswith("    ")]
    return textwrap.dedent("\n".join(lines))


@pytest.fixture(scope="module")
def two_api_runs(tmp_path_factory):
    """Two runs through the Python API in one interpreter, as in a notebook: own rewards and rows with evaluate(),
    then the spec's snippet (the module docstring) as written. One process: the second run must not inherit the
    first's log handlers, lock or trainer state."""
    where = tmp_path_factory.mktemp("api")
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(ROOT)!r})
        from grpo_trainer import GRPOConfig, GRPOTrainer

        def says_number(completions, **kwargs):
            return [1.0 if any(ch.isdigit() for ch in c[0]["content"]) else 0.0 for c in completions]

        rows = [{{"question": f"What is {{a}} + {{b}}? Answer with just the number.", "answer": str(a + b)}}
                for a in range(4) for b in range(4)]
        config = GRPOConfig(model_name="smollm2-135m", max_steps=1, max_completion_length=8, eval_fraction=0.25,
                            max_generation_samples=2, save_steps=0, output_dir="out", use_gradient_checkpointing="false")
        trainer = GRPOTrainer(config, reward_funcs=[says_number])
        summary = trainer.train(rows)
        metrics = trainer.evaluate()
        print("RESULT", json.dumps({{"step": summary["global_step"], "eval": "eval_reward" in metrics,
                                    "greedy": "greedy_reward" in metrics, "names": trainer.reward_set.names}}))
    """) + _docstring_example() + textwrap.dedent("""
        import json
        print("METRICS", json.dumps({k: metrics[k] for k in ("global_step", "backend")}))
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=where, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return where, result


@pytest.mark.slow
def test_the_module_docstring_example_runs(two_api_runs):
    """The spec's snippet, on the embedded model and the built-in task: load, train, save, as written (after another
    run in the same interpreter)."""
    where, result = two_api_runs
    metrics = json.loads(re.search(r"METRICS (.*)", result.stdout).group(1))
    assert metrics == {"global_step": 1, "backend": "unsloth"}
    out = where / "my_grpo_outputs"
    for name in ("adapter_model.safetensors", "tokenizer_config.json", "metrics_summary.json", "trainer_state.json"):
        assert (out / name).exists(), name
    # where the snippet ran, grpo_training.log is this run's log (the spec's `tail -f grpo_training.log`)
    assert (where / "grpo_training.log").resolve() == (out / "grpo_training.log").resolve()
    log = (where / "grpo_training.log").read_text()
    assert "step 1: loss=" in log and "written to my_grpo_outputs/" in log
    assert "written to out/" not in log  # the first run's lines stayed in its own log


@pytest.mark.slow
def test_train_with_own_rewards_and_rows_then_evaluate(two_api_runs):
    """train(list of dicts) before load_model() loads the model; the user's reward function is scored and logged;
    evaluate() returns metrics; nothing calls sys.exit."""
    where, result = two_api_runs
    got = json.loads(re.search(r"RESULT (.*)", result.stdout).group(1))
    assert got == {"step": 1, "eval": True, "greedy": True, "names": ["accuracy", "format", "length", "says_number"]}
    entries = json.loads((where / "out" / "generation_logs" / "generation_log_step_0.json").read_text())
    assert "says_number" in entries[0]["rewards"]
    log = (where / "out" / "grpo_training.log").read_text()  # the API's run keeps its log as the CLI's does
    assert "step 1: loss=" in log and "rank 0 of 1 finished at global step 1" in log
    assert "written to out/generation_logs" in log
    assert "my_grpo_outputs" not in log  # and the second run's lines went to the second run's log


def test_report_subcommand_redraws_from_files_alone(tmp_path):
    """`python train_grpo.py report OUTPUT_DIR` redraws from the files alone, is listed in --help, errors in one line."""
    run = [sys.executable, str(ROOT / "train_grpo.py"), "report"]
    result = subprocess.run([*run, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "OUTPUT_DIR" in result.stdout
    listed = subprocess.run([*run[:2], "--help"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "report" in listed.stdout and "Redraw" in listed.stdout
    result = subprocess.run([*run, str(tmp_path / "missing")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip().startswith("error:")
    assert len(result.stderr.strip().splitlines()) == 1
    from test_report import make_run  # a run directory shaped like a real one's files

    out = make_run(tmp_path)
    for stale in (out / "report.html", *(out / "plots").glob("*.png")):
        stale.unlink(missing_ok=True)
    result = subprocess.run([*run, str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (out / "report.html").stat().st_size > 0 and (out / "plots" / "reward.png").exists()


def test_the_api_imports_from_any_directory_with_the_venvs_python(tmp_path):
    """make install puts the checkout on the venv's import path (.pth): the spec's imports work outside it, and an
    installed package of the same name would still win (the checkout comes after site-packages)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = ("import sys, grpo_trainer, data_loader; from grpo_trainer import GRPOTrainer, GRPOConfig; "
             f"print(grpo_trainer.__file__); print(sys.path.index({str(ROOT)!r}) > "
             "max(i for i, p in enumerate(sys.path) if p.endswith('site-packages')))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, f"{result.stderr[-1500:]}\n(make install writes the .pth file)"
    where, after_site = result.stdout.split()
    assert where == str(ROOT / "grpo_trainer.py") and after_site == "True"

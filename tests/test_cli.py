"""The CLI through Typer's CliRunner: help, dry run, and every bad input -> exit 2, one line, nothing written."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from config.schema import FIELDS


def test_help_lists_every_option_grouped_in_panels(cli):
    code, out, _ = cli("--help")
    assert code == 0
    for option in ("--model", "--config", "--quick-test", "--production", "--max-samples", "--epochs",
                   "--learning-rate", "--batch-size", "--output-dir", "--dry-run", "--set", "--dataset",
                   "--custom-data", "--dataset-path", "--reward-function", "--reward-config", "--score-completions",
                   "--disable-generation-logging", "--max-generation-samples", "--wandb-project", "--no-wandb",
                   "--resume-from-checkpoint", "--save-merged"):
        assert option in out, option
    for panel in ("Model", "Data", "Rewards", "Training", "Logging"):
        assert panel in out


def test_help_does_not_import_heavy_libraries():
    code = ("import sys, runpy; sys.argv = ['train_grpo.py', '--help']\n"
            "try:\n    runpy.run_path('train_grpo.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'trl', 'unsloth', 'transformers', 'datasets') if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out


def test_help_skips_markdown_which_typer_imports_but_this_app_never_renders():
    """rich.markdown (markdown-it, ~45 ms) is lent a placeholder while typer's help module imports; afterwards the
    real module imports as usual, and typer's own reference still builds a real Markdown."""
    code = ("import sys, runpy; sys.argv = ['train_grpo.py', '--help']\n"
            "try:\n    runpy.run_path('train_grpo.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('LOADED', 'rich.markdown' in sys.modules, 'markdown_it' in sys.modules)\n"
            "import typer.rich_utils, rich.markdown\n"
            "print('REAL', hasattr(rich.markdown, 'MarkdownElement'), "
            "type(typer.rich_utils.Markdown('*x*')).__module__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "LOADED False False" in out
    assert "REAL True rich.markdown" in out


def test_dry_run_prints_the_effective_config_as_json_and_loads_no_model(cli, tmp_path):
    code, out, err = cli("--quick-test", "--dry-run", "--set", "num_generations=2", "--output-dir", str(tmp_path / "o"))
    assert code == 0, err
    document = json.loads(out)  # stdout is one JSON document; logs went to stderr
    assert document["config"]["num_generations"] == 2
    assert document["config"]["model_name"] == "smollm2-135m"
    assert set(document["config"]) >= set(FIELDS)
    assert document["dataset"]["rows"]["train"] == 64
    assert document["rewards"]["components"] == ["accuracy"]
    assert not (tmp_path / "o").exists()  # a dry run writes nothing


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "llama-9000"], "Unknown model 'llama-9000'"),
        (["--model", "./no/such/dir"], "does not exist"),
        (["--config", "/no/such.json"], "does not exist"),
        (["--dataset", "imagenet"], "Unknown dataset 'imagenet'. Valid datasets: ultrafeedback"),
        (["--reward-preset", "nope"], "Unknown reward preset 'nope'"),
        (["--set", "num_generations=3"], "not divisible by num_generations 3"),
        (["--set", "nonsense"], "write it as key=value"),
        (["--quick-test", "--production"], "choose one"),
        (["--max-generation-samples", "0"], "at least 1"),
        (["--resume-from-checkpoint", "/no/such/checkpoint"], "does not exist"),
        (["--save-merged"], "--save-merged with 4-bit weights needs a GPU"),
    ],
)
def test_bad_input_exits_2_with_one_line(cli, tmp_path, args, message):
    out_dir = tmp_path / "out"
    code, out, err = cli("--quick-test", "--output-dir", str(out_dir), *args) if "--production" not in args \
        else cli(*args)
    assert code == 2, (out, err)
    assert message in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    assert "Traceback" not in err
    assert not out_dir.exists()


def test_invalid_json_config_says_where(cli, tmp_path):
    path = _write(tmp_path, "bad.json", '{"learning_rate": 1e-5,\n "seed": }')
    code, _, err = cli("--config", path, "--dry-run")
    assert code == 2
    assert "not valid JSON" in err and "line 2" in err


def test_wrong_type_in_config_file(cli, tmp_path):
    code, _, err = cli("--config", _write(tmp_path, "c.json", '{"learning_rate": "fast"}'), "--dry-run")
    assert code == 2 and "'learning_rate' must be float, not 'fast'" in err


def test_unknown_key_names_the_nearest(cli, tmp_path):
    code, _, err = cli("--config", _write(tmp_path, "c.json", '{"num_generation": 8}'), "--dry-run")
    assert code == 2 and "Did you mean 'num_generations'" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_output_dir(cli, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    code, _, err = cli("--quick-test", "--output-dir", str(locked / "run"))
    assert code == 2 and "not writable" in err


def test_output_and_log_dirs_under_a_file_are_refused(cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = cli("--quick-test", "--output-dir", str(blocker / "run"))
    assert code == 2 and "not writable" in err
    code, _, err = cli("--quick-test", "--output-dir", str(tmp_path / "out"), "--generation-log-dir", str(blocker / "g"))
    assert code == 2 and "not writable" in err
    assert not (tmp_path / "out").exists()


def test_listings(cli):
    code, out, _ = cli("--list-models", "--list-datasets", "--list-rewards")
    assert code == 0
    for name in ("qwen2.5-7b", "smollm2-135m", "gsm8k", "hh_rlhf", "accuracy", "similarity", "balanced"):
        assert name in out


def _fake_adapter(tmp_path, base="/somewhere/smollm2-135m-instruct", weights=b"\x00\x01garbage"):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base, "r": 16,
                                                            "lora_alpha": 32, "target_modules": ["q_proj"]}))
    (adapter / "adapter_model.safetensors").write_bytes(weights)
    return adapter


def _being_written(tmp_path):
    from grpokit.checkpoints import WRITING

    checkpoint = _fake_adapter(tmp_path).rename(tmp_path / "checkpoint-3")
    (checkpoint / WRITING).write_text("12345\n")
    return checkpoint


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda tmp: [], "--eval-only needs an adapter"),
        (lambda tmp: ["--resume-from-checkpoint", str(tmp)], "has no LoRA adapter"),  # a dir, but no adapter
        (lambda tmp: ["--resume-from-checkpoint", str(_fake_adapter(tmp))], "unreadable or truncated"),
        # a checkpoint whose save is still under way (or died half-way) was evaluated as if complete
        (lambda tmp: ["--resume-from-checkpoint", str(_being_written(tmp))],
         "checkpoint-3 is an incomplete checkpoint (its save never finished: the process stopped while writing it): "
         "evaluate a complete one (e.g. --resume-from-checkpoint latest) or the finished run's output directory."),
    ],
)
def test_eval_only_bad_input(cli, tmp_path, setup, message):
    out_dir = tmp_path / "out"
    code, _, err = cli("--quick-test", "--eval-only", "--output-dir", str(out_dir), *setup(tmp_path))
    assert code == 2 and message in err, err
    assert not out_dir.exists()


def test_adapter_for_another_base_model_is_refused(tmp_path):
    import torch
    from safetensors.torch import save_file

    from config.errors import UsageError
    from grpokit.run import check_adapter_dir

    adapter = _fake_adapter(tmp_path, base="meta-llama/Llama-3.1-8B")
    save_file({"x": torch.zeros(1)}, str(adapter / "adapter_model.safetensors"))
    with pytest.raises(UsageError, match="is an adapter for 'meta-llama/Llama-3.1-8B', not for 'smollm2-135m'"):
        check_adapter_dir(adapter, "smollm2-135m")


def test_wandb_not_logged_in_while_online_is_refused_up_front(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    code, _, err = cli("--quick-test", "--wandb-project", "p", "--output-dir", str(tmp_path / "out"))
    assert code == 2 and "W&B is not logged in" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["--reward-function", "mutli"], "error: Invalid value for '--reward-function'"),
    (["--bogus-flag"], "error: No such option: --bogus-flag"),
    (["--max-steps", "abc"], "error: Invalid value for '--max-steps'"),
    (["--quick-test", "--production"], "error: --quick-test and --production are two different presets"),
])
def test_command_line_errors_are_one_line_exit_2(args, message):
    """click's own usage errors (choices, unknown options, types) read like every other bad input: one line, exit 2
    (Typer would draw a boxed panel)."""
    result = subprocess.run([sys.executable, "train_grpo.py", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(message), result.stderr


def test_score_completions_on_an_empty_file(cli, tmp_path):
    path = tmp_path / "scored.jsonl"
    path.write_text("\n")
    code, out, err = cli("--score-completions", str(path))
    assert code == 2 and not out.strip()
    assert err.strip().splitlines() == [f"error: --score-completions {path} has no rows: give a JSONL file with one "
                                        "object per line, each with 'completion' (a string) or 'completions' (a "
                                        "list), and the prompt's columns."]


def test_resuming_from_a_finished_runs_directory_says_what_it_is(cli, tmp_path):
    # it was called "incomplete: no .complete marker and optimizer.pt missing"
    run = _fake_adapter(tmp_path).rename(tmp_path / "finished")
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
    (run / "run_config.json").write_text(json.dumps({"seed": 42}))
    code, out, err = cli("--quick-test", "--dry-run", "--output-dir", str(tmp_path / "o"), "--resume-from-checkpoint",
                         str(run))
    assert code == 2 and not out.strip()
    assert err.strip() == (f"error: {run} is a finished run's output directory, not a checkpoint: resume from a "
                           "checkpoint-N directory (it kept none: save_steps 0 or save_total_limit); to evaluate its "
                           "adapter, use --eval-only --resume-from-checkpoint with it.")

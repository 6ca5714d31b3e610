"""`train_grpo.py doctor` as users run it: the real command in a child process, every check for real (imports, the
NF4 round trip, the sandbox probe, a 3-step GRPO run on a tiny random Llama), the table against its JSON report."""

import json
import os
import subprocess
import sys

from conftest import ROOT

from grpokit.doctor import FAILED, NOT_AVAILABLE, OK, ROWS, Check, memory_verdict, plain_line


def _doctor(*args, timeout=600):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "train_grpo.py", "doctor", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_doctor_checks_everything_and_runs_three_steps(tmp_path):
    report = tmp_path / "doctor.json"
    result = _doctor("--report", str(report))
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    document = json.loads(report.read_text())
    checks = [Check(**c) for c in document["checks"]]
    assert [c.name for c in checks] == list(ROWS)
    assert document["ok"] is True and document["exit_code"] == 0
    assert not [c for c in checks if c.status == FAILED]
    run = next(c for c in checks if c.name == "3-step run")
    assert run.details["steps"] == 3 and run.found.startswith("3 steps")
    # the objective row is the 3-step run's trainer set against what --dry-run states for its config
    objective = next(c for c in checks if c.name == "grpo objective")
    assert objective.status == "ok" and objective.details["differ"] == {}, objective
    assert objective.details["engine"] == run.details["engine"] and "trains what --dry-run states" in objective.why
    # off a terminal the table is one plain line per row: the same rows, in the same order, as the JSON
    lines = result.stdout.splitlines()
    assert lines[:len(checks)] == [plain_line(c) for c in checks]
    assert lines[len(checks)] == "doctor: every check that ran worked"


def test_a_check_that_fails_makes_the_exit_code_1(tmp_path):
    """A model directory that holds no model (a download that never finished): the 3-step run fails, nothing else."""
    broken = tmp_path / "half-downloaded"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]')  # cut off
    report = tmp_path / "doctor.json"
    result = _doctor("--model", str(broken), "--report", str(report))
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    assert checks["3-step run"]["status"] == FAILED and checks["3-step run"]["why"]
    assert [name for name, c in checks.items() if c["status"] == FAILED] == ["3-step run"]
    assert "doctor: a check failed" in result.stdout


def test_bad_input_exits_2_before_any_check(tmp_path):
    missing_model = _doctor("--model", str(tmp_path / "nowhere"), timeout=120)
    assert missing_model.returncode == 2 and "does not exist" in missing_model.stderr
    missing_dir = _doctor("--report", str(tmp_path / "nowhere" / "doctor.json"), timeout=120)
    assert missing_dir.returncode == 2 and "--report" in missing_dir.stderr
    assert not missing_model.stdout and not missing_dir.stdout


def test_the_tiny_models_pass_unsloths_pad_token_repair(tmp_path):
    """Unsloth's loader on a GPU runs unsloth_zoo.pad_token.fix_pad_token on every model; where the pad equals eos
    and no spare id is left it raises (the first GPU check's doctor stopped there with the byte-level tokenizer).
    Run that upstream function on both tiny models doctor can build: neither raises nor needs a new embedding row."""
    code = """
import json, sys
import unsloth  # noqa: F401  (unsloth_zoo refuses to import without it)
from transformers import AutoModelForCausalLM, AutoTokenizer
from unsloth_zoo.pad_token import fix_pad_token
from grpokit.doctor import _byte_tokenizer, save_tiny_llama
from grpokit.model_loader import embedded_model_dir
out = {}
for name, tokenizer in [("byte", _byte_tokenizer()), ("smollm2", AutoTokenizer.from_pretrained(embedded_model_dir()))]:
    path = save_tiny_llama(f"{sys.argv[1]}/{name}", tokenizer)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    rows = model.get_input_embeddings().weight.shape[0]
    try:
        result = fix_pad_token(tokenizer, model)
    except RuntimeError as err:
        result = {"raised": str(err)}
    out[name] = {**result, "rows_before": rows, "rows_after": model.get_input_embeddings().weight.shape[0],
                 "pad": tokenizer.pad_token, "eos": tokenizer.eos_token}
print(json.dumps(out))
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for name, repair in out.items():
        assert "raised" not in repair, (name, repair)
        assert not repair["added"] and repair["rows_after"] == repair["rows_before"], (name, repair)
        assert repair["pad"] != repair["eos"], (name, repair)
    assert out["byte"]["changed"] is False  # its own pad token: nothing to repair


def test_the_memory_row_checks_what_the_plan_models(tmp_path):
    """The estimate's fixed term (cuda_buffers) was fitted on the doctor's tiny model's own peak (0.11 GiB on an
    H100): there a peak below the estimate checks nothing and the row says so; where the model's terms dominate, the
    row checks the peak."""
    from config.loader import build_config
    from grpokit.doctor import _byte_tokenizer, save_tiny_llama
    from grpokit.load_plan import Machine, plan_load

    h100 = Machine(cuda=True, gpu_name="H100", gpu_memory_gib=79.6, bf16=True)
    tiny_model = save_tiny_llama(tmp_path / "tiny", _byte_tokenizer())
    tiny = plan_load(build_config("default", overrides=[f"model_name={tiny_model}"]), h100, "unsloth").memory
    eight_b = plan_load(build_config("default", overrides=["model_name=llama-3.1-8b"]), h100, "unsloth").memory
    assert memory_verdict(0.11, tiny).status == NOT_AVAILABLE  # under the estimate only by the fitted term
    assert memory_verdict(0.9 * eight_b.training_gib, eight_b).status == OK
    assert memory_verdict(1.1 * eight_b.training_gib, eight_b).status == FAILED


def test_a_library_logger_set_up_under_the_capture_still_reaches_stderr(capfd):
    """doctor imports Unsloth (and so vLLM where installed) with prints captured off the table; a logger such a
    library sets up at import on sys.stdout must not keep writing into that buffer after it."""
    import logging

    from grpokit.doctor import _captured

    logger = logging.getLogger("grpo-test-library")
    logger.propagate = False
    with _captured():
        handler = logging.StreamHandler(sys.stdout)  # what vLLM's logging config does at import
        logger.addHandler(handler)
    try:
        logger.warning("a warning after the import")
    finally:
        logger.removeHandler(handler)
    assert "a warning after the import" in capfd.readouterr().err

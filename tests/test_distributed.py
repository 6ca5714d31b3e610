"""The same CLI under torchrun: 2 processes on CPU (gloo), the embedded model, 2 steps.

Every path here makes collectives or must agree across ranks (best-checkpoint selection from the generation log,
the final evaluation, resolving `latest`); a hang is killed at the timeout and fails the test."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, sandbox_leftovers, train_cli

pytestmark = pytest.mark.slow


def _torchrun(*args: str, timeout: int = 900, script: str = "train_grpo.py") -> subprocess.CompletedProcess:
    """`script` (train_grpo.py) under `torchrun --nproc_per_node 2`; past `timeout` torchrun and its ranks are killed
    and the test fails as a hang."""
    torchrun = Path(sys.executable).parent / "torchrun"
    assert torchrun.exists() or shutil.which("torchrun")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    command = [str(torchrun), "--standalone", "--nproc_per_node", "2", script, *args]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # torchrun starts each rank with setsid, and a rank stuck at a collective ignores SIGTERM: SIGKILL
        # torchrun and every process under it, by id
        for child in [*psutil.Process(process.pid).children(recursive=True), process]:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                child.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"hung: no exit within {timeout} s; last output:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def test_two_process_torchrun_run(tmp_path):
    """Evaluated and saved every step with the best checkpoint chosen by the greedy generation log, which only rank 0
    writes: every rank must take the same decision (a new best makes transformers wait at a barrier in the save, and
    the best model is reloaded at the end by every rank, a collective under ZeRO-3 / FSDP). (Dynamic sampling's rounds
    under two ranks: test_advantages.py::test_dynamic_sampling_under_two_processes.) A tool run: each rank runs
    TRL's tool loop on its own rows (the tool counts are gathered), rank 0 writes the trajectories in the generation
    log, and the resumed run finishes its extra step on both ranks."""
    out = tmp_path / "run"
    run = ("--quick-test", "--tool", "calculator", "--set", "per_device_train_batch_size=4", "--set", "per_device_eval_batch_size=4",
           "--max-generation-samples", "2", "--set", "best_metric=greedy_reward", "--set", "eval_steps=1",
           "--set", "max_eval_samples=4",  # the evaluation must run at every step on both ranks; 4 prompts do
           "--set", "save_steps=1", "--set", "load_best_model_at_end=true",
           "--output-dir", str(out))
    result = _torchrun(*run, "--max-steps", "2")
    assert result.returncode == 0, result.stderr[-4000:]
    # both ranks reached the same global step
    assert "rank 0 of 2 finished at global step 2" in result.stderr
    assert "rank 1 of 2 finished at global step 2" in result.stderr
    # one set of outputs, written once
    assert (out / "adapter_model.safetensors").exists()
    summary = json.loads((out / "metrics_summary.json").read_text())
    assert summary["global_step"] == 2
    assert sorted(p.name for p in (out / "generation_logs").iterdir()) == [
        "generation_log_step_0.json", "generation_log_step_1.json", "generation_log_step_2.json"]
    best = json.loads((out / "best_checkpoint.json").read_text())
    assert best["metric"] == "greedy_reward" and best["checkpoint"] in (str(out / "checkpoint-1"),
                                                                        str(out / "checkpoint-2"))
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["best_metric"] == best["value"]  # rank 0's generation log value, the one every rank decided on
    assert any("tools/call_frequency" in entry for entry in state["log_history"])
    log = json.loads((out / "generation_logs" / "generation_log_step_1.json").read_text())
    assert len(log) == 2 and all("trajectory" in entry and "tool_calls" in entry for entry in log)
    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["agent"]["tools"] == ["calculator"] and run_config["tools"] == ["calculator"]
    log_text = (out / "grpo_training.log").read_text()
    assert log_text.count("Config (preset quick_test)") == 1  # only rank 0 writes the log file
    assert result.stderr.count("GRPO run finished") == 1  # one summary

    # `latest` with an incomplete newest checkpoint (a save that died: `.writing`, no `.complete`)
    (out / "checkpoint-3").mkdir()
    (out / "checkpoint-3" / ".writing").write_text("1\n")
    # --dry-run under a launcher prints one plan, rank 0's: rank 1 (RANK as torchrun sets it) prints none, and
    # leaves the incomplete checkpoint to rank 0
    rank_1 = train_cli(*run, "--max-steps", "3", "--resume-from-checkpoint", "latest", "--dry-run",
                       env={"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}, timeout=300)
    assert rank_1.returncode == 0 and rank_1.stdout == "", rank_1.stderr[-3000:]
    assert f"--resume-from-checkpoint latest: {out / 'checkpoint-2'}" in rank_1.stderr
    assert (out / "checkpoint-3").exists() and "Traceback" not in rank_1.stderr

    # resumed, one step more: set aside once (by rank 0), every rank names the same checkpoint; each rank loads the
    # optimizer state (transformers maps it to the rank's device, `cpu:0` under torchrun on CPU, which torch.load
    # refused) and both finish the extra step
    result = _torchrun(*run, "--max-steps", "3", "--resume-from-checkpoint", "latest", timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    assert len(list(out.glob("incomplete-checkpoint-3-*"))) == 1
    assert result.stderr.count(f"--resume-from-checkpoint latest: {out / 'checkpoint-2'}") == 2
    assert "rank 0 of 2 finished at global step 3" in result.stderr
    assert "rank 1 of 2 finished at global step 3" in result.stderr
    assert json.loads((out / "metrics_summary.json").read_text())["global_step"] == 3
    assert (out / "checkpoint-3" / ".complete").exists()


@pytest.fixture(scope="module")
def shared_prompt_ranks(tmp_path_factory):
    """tests/fixtures/shared_prompt_ranks.py under torchrun once: the log-prob pass, then generation, on a tiny model;
    the directory it wrote the ranks' forward-call counts to."""
    from conftest import make_tiny_model

    where = tmp_path_factory.mktemp("ranks")
    model = make_tiny_model(where / "tiny")
    result = _torchrun(str(model), str(where), timeout=300, script="tests/fixtures/shared_prompt_ranks.py")
    assert result.returncode == 0, result.stderr[-3000:]
    return where


def test_shared_prompt_log_probs_make_the_same_forward_calls_on_every_rank(shared_prompt_ranks):
    """Whether the packed form applies depends on a rank's own rows; the prompt-cache form makes two forward calls
    where the others make one, and each call is a collective under ZeRO-3 / FSDP (DDP broadcasts buffers at each)."""
    assert json.loads((shared_prompt_ranks / "forward_calls.json").read_text()) == [1, 1]


def test_code_reward_under_two_ranks(tmp_path):
    """Each rank scores its own completions in its own sandboxes, with its share of the node's cores; the step's
    code metrics are gathered from both ranks, and no sandbox (process, cgroup, mount point) outlives the run."""
    before = sandbox_leftovers()
    out = tmp_path / "code"
    result = _torchrun("--preset", "code_generation_cpu", "--output-dir", str(out), "--max-steps", "1",
                       "--set", "per_device_train_batch_size=4", "--set", "max_prompt_length=256",
                       "--set", "max_completion_length=48", "--max-generation-samples", "2",
                       "--set", "eval_pass_k=0",  # the preset's pass@k sampling: tests/test_code_task.py (~18 s here)
                       timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "rank 0 of 2 finished at global step 1" in result.stderr
    assert "rank 1 of 2 finished at global step 1" in result.stderr
    from grpokit.cpu_threads import usable_cores

    cores = usable_cores()[0]
    share = (f"code reward: up to {max(1, cores // 2)} completion(s) at a time (this process's share of the cores: "
             f"{max(1, cores // 2)}, 2 process(es) on this node)")
    assert share in result.stderr, result.stderr[-4000:]
    steps = [h for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "step_time" in h]
    assert len(steps) == 1
    assert 0.0 <= steps[0]["reward"] <= 1.0 and 0.0 <= steps[0]["code/hack_suspected"] <= 1.0
    assert steps[0]["code/unsplit_tests"] == 0
    for entry in json.loads((out / "generation_logs" / "generation_log_step_1.json").read_text()):
        details = entry["details"]["code_execution"]
        assert entry["rewards"]["code_execution"] == pytest.approx(details["passed"] / details["total"])
    assert sandbox_leftovers() <= before  # each helper process closed its sandboxes, or was swept


def test_shared_prompt_generation_makes_the_same_forward_calls_on_every_rank(shared_prompt_ranks):
    """The prompt cache of shared-prompt generation is one more forward, made only by a rank whose rows repeat a
    prompt; with sharded parameters (ZeRO-3 without ds3_gather_for_generation, FSDP) each forward is a collective and
    the ranks would fall out of step. Under several processes generation is TRL's own: the same calls everywhere."""
    calls = json.loads((shared_prompt_ranks / "generate_forward_calls.json").read_text())
    assert calls == [4, 4]  # one per token, no prefill

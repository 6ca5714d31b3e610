"""No fault loses work: atomic checkpoints, the output-dir lock, and real faults injected into real runs.

Fast tests use real files and processes (no model). The slow ones run the real CLI on the embedded model and break it
for real: a user's reward function raising, a filesystem that fills up during a save (a small tmpfs), kill -9 while a
checkpoint is being written, Ctrl-C mid-run. Each then resumes with `--resume-from-checkpoint latest` and must end
where an uninterrupted run ends (same final step, same adapter: 16-bit weights are bit-exact on resume, see docs/checkpoints.md).
"""

import json
import logging
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from conftest import ROOT
from conftest import fault_run as _cli

from config.errors import UsageError
from grpokit.checkpoints import (
    COMPLETE,
    MANIFEST,
    WRITING,
    check_checkpoint,
    check_disk_space,
    checkpoint_problem,
    finish_checkpoint,
    hold_output_lock,
    is_disk_full,
    latest_complete_checkpoint,
    rotate_complete_checkpoints,
)
from grpokit.run_end import EXIT_CODES, FaultWatch, NonFiniteLoss, handle_fault


@pytest.fixture(autouse=True)
def _grpo_log_handlers():
    """The in-process CLI adds a console handler on CliRunner's stream, closed once the call returns: drop it."""
    logger = logging.getLogger("grpo")
    before = list(logger.handlers)
    yield
    logger.handlers[:] = before


def _checkpoint(path: Path, complete=True, legacy=False) -> Path:
    """A checkpoint-N directory with the files a LoRA run writes (small stand-ins, real formats)."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": int(path.name.split("-")[1])}))
    (path / "adapter_config.json").write_text("{}")
    save_file({"lora_B.weight": torch.ones(2)}, str(path / "adapter_model.safetensors"))
    torch.save({"state": {}}, path / "optimizer.pt")
    torch.save({"last_epoch": 1}, path / "scheduler.pt")
    if legacy:
        return path
    if complete:
        finish_checkpoint(path, int(path.name.split("-")[1]))
    else:
        (path / WRITING).write_text("1\n")
    return path


# ---- atomic checkpoints ----------------------------------------------------------------------------------------------


def test_a_checkpoint_is_complete_only_with_its_marker_and_unchanged_files(tmp_path):
    good = _checkpoint(tmp_path / "checkpoint-1")
    assert checkpoint_problem(good) is None
    assert json.loads((good / COMPLETE).read_text())["step"] == 1 and not (good / WRITING).exists()
    # the process died mid-save: .writing is still there
    assert "never finished" in checkpoint_problem(_checkpoint(tmp_path / "checkpoint-2", complete=False))
    # a file changed size after the marker (truncated copy, disk trouble)
    cut = _checkpoint(tmp_path / "checkpoint-3")
    data = (cut / "optimizer.pt").read_bytes()
    (cut / "optimizer.pt").write_bytes(data[: len(data) // 2])
    assert "optimizer.pt has" in checkpoint_problem(cut)
    # written before markers existed: trusted when every file is there and readable
    assert checkpoint_problem(_checkpoint(tmp_path / "checkpoint-4", legacy=True)) is None
    old_cut = _checkpoint(tmp_path / "checkpoint-5", legacy=True)
    (old_cut / "optimizer.pt").write_bytes((old_cut / "optimizer.pt").read_bytes()[:-30])  # no zip directory
    assert "unreadable" in checkpoint_problem(old_cut)
    old_missing = _checkpoint(tmp_path / "checkpoint-6", legacy=True)
    (old_missing / "scheduler.pt").unlink()
    assert "scheduler.pt missing" in checkpoint_problem(old_missing)
    with pytest.raises(UsageError, match=r"checkpoint-2 is incomplete: its save never finished.*latest"):
        check_checkpoint(tmp_path / "checkpoint-2")


def test_latest_skips_and_sets_aside_incomplete_checkpoints(tmp_path, caplog):
    _checkpoint(tmp_path / "checkpoint-2")
    _checkpoint(tmp_path / "checkpoint-4", complete=False)
    _checkpoint(tmp_path / "checkpoint-10", complete=False)
    with caplog.at_level(logging.WARNING, logger="grpo"):
        latest = latest_complete_checkpoint(tmp_path)
    assert latest == tmp_path / "checkpoint-2"  # by step number, not name order
    moved = sorted(p.name for p in tmp_path.glob("incomplete-checkpoint-*"))
    assert [m.split("-")[2] for m in moved] == ["10", "4"]  # kept, renamed out of every checkpoint-* glob
    assert not list(tmp_path.glob("checkpoint-4*")) and not list(tmp_path.glob("checkpoint-10*"))
    assert sum("is incomplete" in r.message for r in caplog.records) == 2  # one line each
    assert latest_complete_checkpoint(tmp_path / "nothing-here") is None


def test_under_a_launcher_only_rank_0_sets_incomplete_checkpoints_aside(tmp_path, monkeypatch, caplog):
    """Every process resolves `latest` before a process group exists: the others must name the same checkpoint
    without renaming (two renames of one directory race), also when rank 0 renames it under them."""
    _checkpoint(tmp_path / "checkpoint-2")
    half = _checkpoint(tmp_path / "checkpoint-4", complete=False)
    monkeypatch.setenv("RANK", "1")
    with caplog.at_level(logging.WARNING, logger="grpo"):
        assert latest_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-2"
    assert half.exists() and not caplog.records  # untouched, and rank 0 alone says so
    half.rename(tmp_path / "incomplete-elsewhere")  # rank 0's rename, seen mid-way: its files are gone from the path
    half.mkdir()
    assert latest_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-2"
    monkeypatch.setenv("RANK", "0")
    assert latest_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-2" and not half.exists()


def test_rotation_counts_and_deletes_only_complete_checkpoints(tmp_path):
    for step in (1, 2, 3, 4):
        _checkpoint(tmp_path / f"checkpoint-{step}")
    _checkpoint(tmp_path / "checkpoint-5", complete=False)
    rotate_complete_checkpoints(tmp_path, 3, keep={tmp_path / "checkpoint-4", str(tmp_path / "checkpoint-1")})
    # 3 kept, the newest and the best (1) among them, as transformers does; the incomplete 5 is neither counted
    # nor deleted
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1", "checkpoint-3", "checkpoint-4",
                                                          "checkpoint-5"]


def test_an_explicit_incomplete_checkpoint_exits_2_with_one_line(cli, tmp_path):
    broken = _checkpoint(tmp_path / "out" / "checkpoint-3", complete=False)
    code, _, err = cli("--quick-test", "--output-dir", str(tmp_path / "out"), "--resume-from-checkpoint", str(broken))
    assert code == 2, err
    assert err.count("\n") == 1 and "is incomplete" in err and "Traceback" not in err
    assert broken.exists()  # an explicit path is the user's: refused, not moved


@pytest.mark.parametrize("err, full", [
    (OSError(28, "No space left on device"), True),
    (OSError(27, "File too large"), True),  # RLIMIT_FSIZE
    (RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                  "data/3: file write failed"), True),  # torch.save
    (RuntimeError("[enforce fail at inline_container.cc:850] . unexpected pos 1234 vs 1200"), True),
    (Exception("Error while serializing: IoError(Os { code: 28, kind: StorageFull, ... })"), True),  # safetensors
    (ValueError("bad value"), False),
    (OSError(13, "Permission denied"), False),
])
def test_disk_full_is_recognised_however_it_surfaces(err, full):
    assert is_disk_full(err) is full
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = err
    assert is_disk_full(wrapped) is full


# ---- disk space ------------------------------------------------------------------------------------------------------


def _fake_trainer(tmp_path, **args):
    import torch

    model = torch.nn.Linear(1000, 1000)  # 1M trainable fp32 params: 4 MB weights + 8 MB AdamW moments
    defaults = dict(output_dir=str(tmp_path), optim="adamw_torch", save_strategy="steps", save_steps=1, max_steps=4,
                    save_total_limit=2, world_size=1, fp16=False)
    return types.SimpleNamespace(model=model, processing_class=None, args=types.SimpleNamespace(**{**defaults, **args}),
                                 state=types.SimpleNamespace(global_step=0), is_world_process_zero=lambda: True)


def test_disk_space_refuses_when_one_checkpoint_cannot_fit_and_warns_when_the_kept_ones_cannot(tmp_path, monkeypatch,
                                                                                               caplog):
    import shutil

    trainer = _fake_trainer(tmp_path)
    usage = types.SimpleNamespace(total=0, used=0, free=0)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage)
    usage.free = 10_000_000
    with pytest.raises(UsageError, match=r"10 MB free, and one checkpoint needs ~13 MB"):
        check_disk_space(trainer)
    usage.free = 30_000_000  # two fit, not the three (save_total_limit 2 + the one being written)
    with caplog.at_level(logging.WARNING, logger="grpo"):
        assert check_disk_space(trainer) == pytest.approx(13_000_000, rel=0.01)
    assert "writes up to 3 more checkpoints of ~13 MB" in caplog.text
    caplog.clear()
    usage.free = 100_000_000
    check_disk_space(trainer)
    assert not caplog.records


# ---- the output-dir lock ---------------------------------------------------------------------------------------------


def test_one_run_per_output_dir_and_a_killed_run_never_leaves_it_locked(cli, tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, '.'); "
                               "from grpokit.checkpoints import hold_output_lock; from pathlib import Path; "
                               f"hold_output_lock(Path({str(out)!r})); print('locked', flush=True); time.sleep(60)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, _, err = cli("--quick-test", "--output-dir", str(out))
        assert code == EXIT_CODES["bad_input"], err
        assert f"is in use by another run (PID {holder.pid} on" in err and err.count("\n") == 1
    finally:
        holder.kill()  # SIGKILL: no cleanup runs, the kernel drops the flock
        holder.wait()
    hold_output_lock(out)  # free again


# ---- fault handling without a model ----------------------------------------------------------------------------------


def test_a_non_finite_loss_stops_the_step_before_the_optimizer_applies_it():
    import torch

    model = torch.nn.Linear(3, 1)
    watch = FaultWatch()
    args, state = types.SimpleNamespace(fp16=False), types.SimpleNamespace(global_step=4)
    model(torch.ones(1, 3)).sum().backward()
    watch.on_pre_optimizer_step(args, state, None, model=model)  # finite: fine
    assert watch.weights_half_updated(state)  # from here until global_step moves, the weights may be mid-update
    state.global_step = 5
    assert not watch.weights_half_updated(state)
    model.weight.grad[0, 1] = float("nan")
    with pytest.raises(NonFiniteLoss, match="loss of step 6 is not finite"):
        watch.on_pre_optimizer_step(args, state, None, model=model)
    assert not watch.weights_half_updated(state)  # raised before the optimizer: the weights are step 5's


def test_a_fault_is_one_line_naming_the_reward_and_the_users_line_and_the_traceback_goes_to_the_log(tmp_path,
                                                                                                     capsys):
    from rewards.base import with_timeout
    from tests.fixtures.flaky_rewards import flaky

    log = logging.getLogger("grpo")
    handler = logging.FileHandler(tmp_path / "grpo_training.log")
    log.addHandler(handler)
    trainer = _fake_trainer(tmp_path)  # global_step 0: nothing to save yet
    os.environ["FLAKY_FAIL_AT"] = "1"
    try:
        import tests.fixtures.flaky_rewards as module

        module._calls = 0
        watch = FaultWatch()
        watch.on_step_begin(trainer.args, trainer.state, None)
        try:
            with_timeout(flaky, 0, "flaky")(completions=["a"])
        except Exception as err:  # noqa: BLE001 - the fault under test
            failed = handle_fault(trainer, watch, err)
    finally:
        del os.environ["FLAKY_FAIL_AT"]
        log.removeHandler(handler)
        handler.close()
    line = str(failed)
    assert failed.exit_code == EXIT_CODES["run_failed"] == 3
    assert line.startswith("Run failed at step 1 (reward 'flaky'): ValueError: flaky reward broke on call 1 "
                           "[tests/fixtures/flaky_rewards.py:")
    assert "No step had completed" in line and "grpo_training.log" in line and "\n" not in line
    assert "Traceback" in (tmp_path / "grpo_training.log").read_text()
    assert "Traceback (most recent" not in capsys.readouterr().err  # only with --verbose


def test_a_reward_timeout_ends_the_run_as_a_fault(tmp_path, monkeypatch):
    import tests.fixtures.flaky_rewards as module
    from rewards.base import with_timeout

    monkeypatch.setattr(module, "_calls", 0)
    monkeypatch.setenv("SLOW_AT", "1")
    monkeypatch.setenv("SLOW_SECONDS", "3")
    trainer = _fake_trainer(tmp_path)
    started = time.perf_counter()
    try:
        with_timeout(module.slow, 0.2, "slow")(completions=["a"])  # reward_timeout=0.2
    except Exception as err:  # noqa: BLE001 - the fault under test
        waited = time.perf_counter() - started
        failed = handle_fault(trainer, FaultWatch(), err)
    assert waited < 2  # the hung call is left behind (a daemon thread): the run goes on to end
    assert failed.exit_code == 3
    assert "(reward 'slow'): TimeoutError: one call took longer than 0.2 s (reward_timeout)" in str(failed)


def test_a_fault_inside_the_optimizer_step_saves_nothing_and_points_at_the_last_checkpoint(tmp_path):
    import torch

    _checkpoint(tmp_path / "checkpoint-2")
    trainer = _fake_trainer(tmp_path)
    trainer.state.global_step = 3  # step 3 was never checkpointed; step 4 was in its optimizer step
    watch = FaultWatch()
    watch.optimizer_step_of = 3

    def adam_step():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    try:
        adam_step()
    except Exception as err:  # noqa: BLE001 - the fault under test
        failed = handle_fault(trainer, watch, err)
    line = str(failed)
    assert "out of memory (CUDA out of memory. Tried to allocate 2.00 GiB); lower per_device_train_batch_size" in line
    assert line.startswith("Run failed at step 4 in the optimizer step: OutOfMemoryError: out of memory")
    assert "inside the optimizer step of step 4" in line and "were not saved" in line
    assert f"Work up to step 2 is in {tmp_path / 'checkpoint-2'}" in line
    assert not (tmp_path / "checkpoint-3").exists()


def test_generation_logging_lets_a_reward_error_through(tmp_path):
    from grpokit.callbacks import GenerationLogger
    from rewards.base import RewardError

    logger = GenerationLogger([{"prompt": "x"}], tokenizer=None, reward_set=None, log_dir=tmp_path, max_new_tokens=1)

    def broken(model, step):
        raise RewardError("flaky", ValueError("boom"))

    logger._generate_and_score = broken
    with pytest.raises(RewardError):
        logger.log_generations(object(), 0)
    logger._generate_and_score = lambda model, step: 1 / 0  # anything else: logged, training continues
    assert logger.log_generations(object(), 0) is None


# ---- real faults in real runs ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """conftest.FAULT_RUN uninterrupted: what every broken and resumed run below must end like."""
    out = tmp_path_factory.mktemp("straight") / "run"
    result = _cli(out, "--set", "save_steps=0")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _assert_ends_like(out, straight):
    from safetensors.torch import load_file

    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 3
    a, b = load_file(straight / "adapter_model.safetensors"), load_file(out / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    assert max(float((a[k].float() - b[k].float()).abs().max()) for k in a) <= 1e-6


def _fault_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "Run failed" in line]


@pytest.mark.slow
def test_a_reward_raising_mid_run_saves_the_last_step_and_resumes(tmp_path, straight):
    out = tmp_path / "run"
    # No periodic checkpoints: step 1 is saved by the fault handling alone.
    failed = _cli(out, "--set", "save_steps=0", env={"FLAKY_FAIL_AT": "2"})
    assert failed.returncode == EXIT_CODES["run_failed"], failed.stderr[-3000:]
    assert "Traceback (most recent" not in failed.stderr
    (line,) = _fault_lines(failed.stderr)
    print(line)  # pytest -s: the line a user sees
    assert ("Run failed at step 2 while scoring completions (reward 'flaky'): ValueError: flaky reward broke on "
            "call 2 [tests/fixtures/flaky_rewards.py:") in line
    assert f"Work up to step 1 is in {out / 'checkpoint-1'}" in line and "--resume-from-checkpoint latest" in line
    assert checkpoint_problem(out / "checkpoint-1") is None
    assert "Traceback (most recent call last)" in (out / "grpo_training.log").read_text()

    resumed = _cli(out, "--set", "save_steps=0", "--resume-from-checkpoint", "latest")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_ends_like(out, straight)


@pytest.mark.slow
def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint_and_resumes(tmp_path, straight):
    # A real full filesystem: a 100 MB tmpfs. A checkpoint here is ~60 MB (adapter 20 MB + AdamW moments 39 MB), so
    # checkpoint-1 fits and checkpoint-2 runs out of space while torch.save writes its optimizer.pt.
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)")
    try:
        out = disk / "run"
        failed = _cli(out, "--set", "save_steps=1")
        assert failed.returncode == EXIT_CODES["run_failed"], failed.stderr[-3000:]
        assert "Traceback (most recent" not in failed.stderr
        assert "this run writes up to 3 more checkpoints" in failed.stderr  # the warning at start
        (line,) = _fault_lines(failed.stderr)
        print(line)
        assert "disk full writing checkpoint-2/" in line and "MB free" in line and "set aside as" in line
        assert f"Work up to step 1 is in {out / 'checkpoint-1'}" in line
        assert checkpoint_problem(out / "checkpoint-1") is None
        assert not (out / "checkpoint-2").exists() and list(out.glob("incomplete-checkpoint-2-*"))

        # The user frees space (here: a bigger filesystem) and resumes.
        subprocess.run(["mount", "-o", "remount,size=400m", str(disk)], check=True)
        resumed = _cli(out, "--set", "save_steps=1", "--resume-from-checkpoint", "latest")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        _assert_ends_like(out, straight)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.mark.slow
def test_kill_9_while_writing_a_checkpoint_then_resume_latest(tmp_path, straight):
    out = tmp_path / "run"
    proc = _cli(out, "--set", "save_steps=1", popen=True)
    writing = out / "checkpoint-2" / WRITING
    deadline = time.time() + 600
    while not writing.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)  # mid-save: no handler runs, nothing is flushed or cleaned up
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert writing.exists(), "the kill missed the save of checkpoint-2"
    assert checkpoint_problem(out / "checkpoint-2") is not None

    resumed = _cli(out, "--set", "save_steps=1", "--resume-from-checkpoint", "latest")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    print(*[line for line in resumed.stderr.splitlines() if "incomplete" in line], sep="\n")
    assert "checkpoint-2 is incomplete" in resumed.stderr and "set aside as incomplete-checkpoint-2-" in resumed.stderr
    assert "Traceback (most recent" not in resumed.stderr
    assert list(out.glob("incomplete-checkpoint-2-*/adapter_config.json")) or list(out.glob("incomplete-checkpoint-2-*"))
    _assert_ends_like(out, straight)


@pytest.mark.slow
def test_sigint_then_resume_latest_matches_the_uninterrupted_run(tmp_path, straight):
    """Ctrl-C mid-run, then `--resume-from-checkpoint latest`: the same adapter and logged steps as the uninterrupted
    run (conftest.FAULT_RUN: 16-bit weights, bit-exact on resume; with bitsandbytes 4-bit on CPU the first resumed
    step can sample one token differently, see docs/checkpoints.md)."""
    from safetensors.torch import load_file

    out = tmp_path / "interrupted"
    proc = _cli(out, "--set", "save_steps=1", popen=True)
    deadline = time.time() + 600
    while not (out / "checkpoint-1" / "trainer_state.json").exists() and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # during step 2: it finishes, is saved, and the run stops
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 130, stderr[-2000:]
    assert "--resume-from-checkpoint" in stderr  # says how to resume
    stopped_at = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert 1 <= stopped_at < 3
    assert not (out / "adapter_model.safetensors").exists()  # no final adapter for an unfinished run

    resumed = _cli(out, "--set", "save_steps=1", "--resume-from-checkpoint", "latest")
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    a, b = load_file(straight / "adapter_model.safetensors"), load_file(out / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    assert max(float((a[k].float() - b[k].float()).abs().max()) for k in a) <= 1e-6

    def history(path):
        return {h["step"]: h for h in json.loads((path / "trainer_state.json").read_text())["log_history"]
                if "reward" in h}

    h_straight, h_resumed = history(straight), history(out)
    assert sorted(h_resumed) == [1, 2, 3]
    for step in range(stopped_at + 1, 4):  # the steps trained after the resume point
        for key in ("reward", "learning_rate", "loss", "completions/mean_length"):
            assert h_resumed[step][key] == pytest.approx(h_straight[step][key], abs=1e-6), (step, key)
    assert (out / f"checkpoint-{stopped_at}" / MANIFEST).exists()
    assert (out / f"checkpoint-{stopped_at}" / COMPLETE).exists()  # the Ctrl-C checkpoint is published whole

"""Checkpoints and resume: exact continuation after SIGINT, `latest`, the run manifest, and bad checkpoints."""

import json
import signal
import time

import pytest
from conftest import fault_run

from config.errors import UsageError
from grpokit.checkpoints import COMPLETE, MANIFEST, build_manifest, check_resume, finish_checkpoint


def _fake_checkpoint(path, manifest=None, base="/cache/smollm2-135m-instruct"):
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": []}))
    (path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base, "r": 16,
                                                         "lora_alpha": 32, "target_modules": ["q_proj"]}))
    save_file({"base_model.model.x.lora_B.weight": torch.ones(1)}, str(path / "adapter_model.safetensors"))
    if manifest is not None:
        (path / MANIFEST).write_text(json.dumps(manifest))
    finish_checkpoint(path, 2)  # published: what a finished save leaves
    return path


def test_manifest_mismatch_is_refused_with_the_differences(tmp_path):
    saved = build_manifest({"learning_rate": 1e-5, "seed": 1, "output_dir": "a"}, "abc")
    checkpoint = _fake_checkpoint(tmp_path / "checkpoint-2", saved)
    same_but_moved = build_manifest({"learning_rate": 1e-5, "seed": 1, "output_dir": "b"}, "abc")
    check_resume(checkpoint, same_but_moved, force=False)  # output_dir may change
    changed = build_manifest({"learning_rate": 2e-5, "seed": 1, "output_dir": "a"}, "xyz")
    with pytest.raises(UsageError, match=r"learning_rate: 1e-05 -> 2e-05; dataset: its contents or order changed"):
        check_resume(checkpoint, changed, force=False)
    check_resume(checkpoint, changed, force=True)  # --force-resume: warned, not refused
    # a field added to the tool since the checkpoint was written is no difference at its default, but is otherwise
    with_new_field = build_manifest({"learning_rate": 1e-5, "seed": 1, "output_dir": "a", "share_prompts": True}, "abc")
    check_resume(checkpoint, with_new_field, force=False)
    with_new_field["config"]["share_prompts"] = False
    with pytest.raises(UsageError, match=r"share_prompts: None -> False"):
        check_resume(checkpoint, with_new_field, force=False)


def test_bad_checkpoints_exit_2_and_write_nothing(cli, tmp_path):
    out = tmp_path / "out"
    cases = [
        (tmp_path / "not-a-checkpoint", "not a trainer checkpoint"),
        (_fake_checkpoint(tmp_path / "other-base", base="meta-llama/Llama-3.1-8B"), "is an adapter for"),
    ]
    (tmp_path / "not-a-checkpoint").mkdir()
    missing = _fake_checkpoint(tmp_path / "missing-weights")
    (missing / "adapter_model.safetensors").unlink()
    cases.append((missing, "is incomplete: adapter_model.safetensors is missing"))
    truncated = _fake_checkpoint(tmp_path / "truncated")
    data = (truncated / "adapter_model.safetensors").read_bytes()
    (truncated / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    cases.append((truncated, "is incomplete: adapter_model.safetensors has"))
    no_marker = _fake_checkpoint(tmp_path / "no-marker")  # no marker and no optimizer: not a checkpoint we trust
    (no_marker / COMPLETE).unlink()
    cases.append((no_marker, "optimizer.pt, scheduler.pt missing"))
    for checkpoint, message in cases:
        code, _, err = cli("--quick-test", "--output-dir", str(out), "--resume-from-checkpoint", str(checkpoint))
        assert code == 2 and message in err, (checkpoint, err)
    code, _, err = cli("--quick-test", "--output-dir", str(out), "--resume-from-checkpoint", "latest")
    assert code == 2 and "holds a complete checkpoint" in err
    assert not out.exists()


@pytest.mark.slow
def test_sigint_then_resume_latest_matches_the_uninterrupted_run(tmp_path, straight):
    """Ctrl-C mid-run, then `--resume-from-checkpoint latest`: the same adapter and logged steps as the uninterrupted
    run (conftest.FAULT_RUN: 16-bit weights, bit-exact on resume; with bitsandbytes 4-bit on CPU the first resumed
    step can sample one token differently, see docs/checkpoints.md)."""
    from safetensors.torch import load_file

    out = tmp_path / "interrupted"
    proc = fault_run(out, "--set", "save_steps=1", popen=True)
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

    resumed = fault_run(out, "--set", "save_steps=1", "--resume-from-checkpoint", "latest")
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

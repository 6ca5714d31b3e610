"""Checkpoints and resume: `latest`, the run manifest, and bad checkpoints (exact continuation after Ctrl-C, kill -9 or
a fault: tests/test_faults.py, beside the uninterrupted run it is compared with)."""

import json

import pytest

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

"""Checkpoints that resume exactly, refuse the wrong run, and survive Ctrl-C.

- Exact continuation: TRL samples completions from torch's global RNG, and a resumed Trainer does not land on the
  same point of that stream (it restores the RNG state saved with the checkpoint, but the data loader's skipping and
  generation buffering consume it differently). Re-seeding at the start of every optimizer step from (seed, step)
  makes each step's samples a function of the step alone, so a resumed run samples what the uninterrupted run did
  (nanochat re-seeds per step for the same reason).
- Integrity: each checkpoint carries `run_manifest.json` (config hash, dataset fingerprint, package versions, git
  commit). Resuming with a different config or dataset is refused with the differences, unless --force-resume.
- Interruption: SIGINT / SIGTERM finish the current step, write a checkpoint, and stop; the CLI then prints how to
  resume and exits 130 / 143.
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from config.errors import UsageError

log = logging.getLogger("grpo")

MANIFEST = "run_manifest.json"
# Fields that may change between a run and its resumption without changing what is trained.
RESUMABLE_FIELDS = {"output_dir", "run_name", "wandb_project", "description", "enable_generation_logging",
                    "generation_log_dir", "max_generation_samples", "save_steps", "save_total_limit", "save_merged",
                    "logging_steps", "eval_steps", "eval_pass_k", "backend", "max_steps", "num_train_epochs"}


class DeterministicSampling(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        import torch

        # A function of (seed, step, rank): reproducible across resumes, different on each process.
        torch.manual_seed((args.seed * 1_000_003 + state.global_step) * 1_009 + args.process_index)


def build_manifest(config_dict: dict[str, Any], dataset_fingerprint: str) -> dict[str, Any]:
    trained = {k: v for k, v in sorted(config_dict.items()) if k not in RESUMABLE_FIELDS}
    packages = {}
    for name in ("torch", "transformers", "trl", "peft", "unsloth", "unsloth_zoo", "datasets"):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {
        "config_hash": hashlib.sha256(json.dumps(trained, sort_keys=True, default=str).encode()).hexdigest()[:16],
        "config": trained,
        "dataset_fingerprint": dataset_fingerprint,
        "packages": packages,
        "git_commit": _git_commit(),
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def check_resume(checkpoint: Path, manifest: dict[str, Any], force: bool) -> None:
    """Refuse to resume a checkpoint written by a different config or dataset (unless forced)."""
    saved_file = checkpoint / MANIFEST
    if not saved_file.exists():
        log.warning("%s has no %s (written by another tool?); resuming without the integrity check.", checkpoint,
                    MANIFEST)
        return
    from config.loader import config_to_dict
    from config.schema import GRPORunConfig

    saved = json.loads(saved_file.read_text())
    # A field added to the tool after the checkpoint was written, left at its default, is not a difference.
    saved_config = {**config_to_dict(GRPORunConfig()), **saved["config"]}
    differences = [f"{key}: {saved['config'].get(key)!r} -> {manifest['config'].get(key)!r}"
                   for key in sorted(set(saved["config"]) | set(manifest["config"]))
                   if saved_config.get(key) != manifest["config"].get(key)]
    if saved.get("dataset_fingerprint") != manifest["dataset_fingerprint"]:
        differences.append("dataset: its contents or order changed")
    if not differences:
        return
    message = f"{checkpoint} was written by a different run ({'; '.join(differences)})"
    if force:
        log.warning("%s; resuming anyway (--force-resume).", message)
        return
    raise UsageError(f"{message}. Resume with the same settings, or pass --force-resume.")


class ManifestWriter(TrainerCallback):
    def __init__(self, manifest: dict[str, Any]):
        self.manifest = manifest

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}" / MANIFEST
            if path.parent.exists():
                path.write_text(json.dumps(self.manifest, indent=2, default=str) + "\n")


class GracefulStop(TrainerCallback):
    """First SIGINT / SIGTERM: finish this step, save a checkpoint, stop. A second one interrupts at once."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.signal_name is not None:
            signal.signal(signum, self._previous[signum])
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        log.warning("%s received: finishing the current step, then saving a checkpoint (again to abort).",
                    self.signal_name)

    def on_step_end(self, args, state, control, **kwargs):
        if self.signal_name is not None:
            control.should_save = True
            control.should_training_stop = True

    def restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def exit_code(self) -> int:
        return {"SIGINT": 130, "SIGTERM": 143}.get(self.signal_name or "", 1)

"""Checkpoints that resume exactly, refuse the wrong run, and survive Ctrl-C.

- Exact continuation: TRL samples completions from torch's global RNG, and a resumed Trainer does not land on the
  same point of that stream (it restores the RNG state saved with the checkpoint, but the data loader's skipping and
  generation buffering consume it differently). Re-seeding at the start of every optimizer step from (seed, step)
  makes each step's samples a function of the step alone, so a resumed run samples what the uninterrupted run did
  (nanochat re-seeds per step for the same reason).
- Integrity: each checkpoint carries `run_manifest.json` (config hash, dataset fingerprint, package versions, git
  commit). Resuming with a different config or dataset is refused with the differences, unless --force-resume.
- Interruption and faults (how a run ends): run_end.py.
- Atomic checkpoints (the "reserve, write, mark complete, publish" lifecycle of NeMo Automodel PR 3261; transformers#35525
  and transformers#35782 show what users hit without it): `checkpoint-N/.writing` is created before the first byte and
  removed only after every file (model, optimizer, scheduler, RNG, trainer_state.json, run_manifest.json) is written
  and fsynced and `checkpoint-N/.complete` (step + file sizes) is in place. `latest` and rotation see only complete
  checkpoints; an incomplete one is renamed `incomplete-checkpoint-N-<UTC time>` with a one-line warning, never
  loaded and never deleted. A checkpoint with neither marker was written before markers existed: it counts as complete
  when its files are all there and their headers read (`legacy_problem`).
- One run per output directory: `.grpo.lock` (flock, held for the process lifetime; the kernel releases it when a
  process dies, so a killed run never leaves it stuck).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from config.errors import UsageError
from grpokit.run_dir import MANIFEST, TRAINER_STATE

log = logging.getLogger("grpo")

# Fields that may change between a run and its resumption without changing what is trained.
RESUMABLE_FIELDS = {"output_dir", "run_name", "wandb_project", "description", "enable_generation_logging",
                    "generation_log_dir", "max_generation_samples", "save_steps", "save_total_limit", "save_merged",
                    "logging_steps", "eval_steps", "eval_pass_k", "backend", "max_steps", "num_train_epochs",
                    "overwrite_output_dir", "allow_unsandboxed_code"}


COMPLETE = ".complete"  # written last: the checkpoint is whole
WRITING = ".writing"  # written first, removed last: a save is (or was, if the process died) under way
LOCK_FILE = ".grpo.lock"
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
# What a checkpoint written before the markers must hold to be trusted (LoRA runs; the optimizer files are absent
# with save_only_model, which then cannot resume the optimizer anyway).
LEGACY_FILES = (TRAINER_STATE, "adapter_config.json", "adapter_model.safetensors", "optimizer.pt", "scheduler.pt")


class TrainerCallbackBase:
    """What transformers needs of a callback: it calls `getattr(callback, event)(args, state, control, **kw)`.

    Not `transformers.TrainerCallback`, so that this module stays light: the CLI checks checkpoints and takes the
    output-dir lock before anything heavy is imported (importing transformers costs ~20 s on 2 busy cores). Events a
    subclass does not define are no-ops, as in TrainerCallback.
    """

    def __getattr__(self, name: str):
        if name.startswith("on_"):
            return _no_op
        raise AttributeError(name)


def _no_op(*args, **kwargs):
    return None


class DeterministicSampling(TrainerCallbackBase):
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


class ManifestWriter(TrainerCallbackBase):
    """Holds the run manifest; `save_checkpoint_atomically` writes it into each checkpoint before the marker (an
    on_save hook would run after the checkpoint is already published)."""

    def __init__(self, manifest: dict[str, Any]):
        self.manifest = manifest

    def write(self, checkpoint: Path) -> None:
        (checkpoint / MANIFEST).write_text(json.dumps(self.manifest, indent=2, default=str) + "\n")


# ---- Atomic checkpoints ----------------------------------------------------------------------------------------------


def checkpoint_step(path: Path) -> int | None:
    match = CHECKPOINT_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def checkpoint_problem(path: Path) -> str | None:
    """None for a complete checkpoint, else what is wrong with it (for a one-line message)."""
    path = Path(path)
    if (path / WRITING).exists():
        return "its save never finished: the process stopped while writing it"
    marker = path / COMPLETE
    if not marker.exists():
        return legacy_problem(path)
    try:
        sizes = json.loads(marker.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {COMPLETE} marker is unreadable"
    for name, size in sizes.items():
        file = path / name
        if not file.exists():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, {size} when it was saved (truncated or overwritten)"
    return None


def legacy_problem(path: Path) -> str | None:
    """A checkpoint written before the markers existed is trusted when every file is there and its header reads:
    trainer_state.json parses, the safetensors header decodes, and optimizer.pt / scheduler.pt are whole zip archives
    (torch.save writes the zip directory last, so a file cut short has none). Loading the tensors themselves would
    cost as much as the resume."""
    import zipfile

    missing = [name for name in LEGACY_FILES if not (path / name).exists()]
    if missing:
        return f"no {COMPLETE} marker and {', '.join(missing)} missing"
    try:
        json.loads((path / TRAINER_STATE).read_text())["global_step"]
        with open(path / "adapter_model.safetensors", "rb") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            json.loads(handle.read(header_len))
        for name in ("optimizer.pt", "scheduler.pt"):
            with zipfile.ZipFile(path / name):
                pass
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as err:
        return f"no {COMPLETE} marker and a file is unreadable ({err.__class__.__name__})"
    return None


def check_checkpoint(path: Path) -> None:
    """An explicit --resume-from-checkpoint PATH must be complete: never load a half-written checkpoint."""
    problem = checkpoint_problem(path)
    if problem:
        raise UsageError(f"Checkpoint {path} is incomplete: {problem}. Resume from an earlier checkpoint, or use "
                         "--resume-from-checkpoint latest (the newest complete one).")


def set_aside(path: Path) -> Path:
    """Rename an incomplete checkpoint out of every `checkpoint-*` glob (ours, transformers' rotation, the user's
    scripts), keeping its files for inspection: never loaded, never silently deleted."""
    target = path.with_name(f"incomplete-{path.name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    suffix = 0
    while target.exists():
        suffix += 1
        target = target.with_name(f"{target.name}.{suffix}")
    path.rename(target)
    return target


def checkpoints_by_step(output_dir: Path) -> list[Path]:
    """`checkpoint-N` directories, oldest step first."""
    if not Path(output_dir).is_dir():
        return []
    found = [p for p in Path(output_dir).iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=checkpoint_step)


def latest_complete_checkpoint(output_dir: Path, set_aside_incomplete: bool = True) -> Path | None:
    """The newest complete checkpoint in output_dir. Incomplete ones are named in a warning and (when
    set_aside_incomplete) renamed out of the way, under the output-dir lock so that a running save is never touched.

    Under a launcher every process asks (no process group exists yet); only rank 0, which holds the lock, renames and
    warns. The others skip incomplete ones without touching them: one that rank 0 renames meanwhile reads as missing
    its files, so every rank names the same newest complete checkpoint whatever the timing."""
    main = int(os.environ.get("RANK", "0")) == 0
    set_aside_incomplete = set_aside_incomplete and main
    if set_aside_incomplete and Path(output_dir).is_dir():
        hold_output_lock(output_dir)
    latest = None
    for path in reversed(checkpoints_by_step(output_dir)):
        problem = checkpoint_problem(path)
        if problem is None:
            latest = latest or path
            continue
        if set_aside_incomplete:
            moved = set_aside(path)
            log.warning("%s is incomplete (%s): set aside as %s, not loaded.", path, problem, moved.name)
        elif main:
            log.warning("%s is incomplete (%s): skipped.", path, problem)
    return latest


def _fsync(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def begin_checkpoint(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / WRITING).write_text(f"{os.getpid()}\n")
    _fsync(path, directory=True)


def finish_checkpoint(path: Path, step: int) -> dict[str, Any]:
    """Publish a fully written checkpoint: fsync every file, then the marker (written to a temp name and renamed, so
    it is whole or absent), then remove `.writing`. After a crash at any point the checkpoint reads as incomplete."""
    files = {}
    for file in sorted(p for p in path.rglob("*") if p.is_file() and p.name not in (WRITING, COMPLETE)):
        _fsync(file)
        files[str(file.relative_to(path))] = file.stat().st_size
    marker = {"step": step, "files": files, "bytes": sum(files.values()),
              "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    tmp = path / f"{COMPLETE}.tmp"
    tmp.write_text(json.dumps(marker, indent=1) + "\n")
    _fsync(tmp)
    tmp.rename(path / COMPLETE)
    (path / WRITING).unlink(missing_ok=True)
    _fsync(path, directory=True)
    return marker


def rotate_complete_checkpoints(output_dir: Path, limit: int | None, keep: set[Path]) -> None:
    """transformers' rotation, counting only complete checkpoints: keep the newest `limit` complete ones plus `keep`
    (the one just written, the best one). Incomplete directories are neither counted nor deleted."""
    if not limit or limit <= 0:
        return
    keep = {Path(p).resolve() for p in keep if p}
    complete = [p for p in checkpoints_by_step(output_dir) if checkpoint_problem(p) is None]
    excess = len(complete) - max(limit, len(keep & {p.resolve() for p in complete}))
    for path in complete:
        if excess <= 0:
            break
        if path.resolve() not in keep:
            shutil.rmtree(path, ignore_errors=True)
            excess -= 1


class CheckpointWriteError(RuntimeError):
    """A save failed for lack of space; the partial checkpoint has been set aside (faults.py reports it)."""

    def __init__(self, checkpoint: Path, file: str, needed: int, free: int, moved_to: Path | None, cause: BaseException):
        super().__init__(f"writing {checkpoint.name}/{file} failed: {cause.__class__.__name__}: {cause}")
        self.checkpoint, self.file, self.needed, self.free, self.moved_to, self.cause = (
            checkpoint, file, needed, free, moved_to, cause)


def is_disk_full(err: BaseException) -> bool:
    """Out of space, however it surfaces: OSError ENOSPC / EDQUOT / EFBIG (a file-size limit), torch.save's
    `PytorchStreamWriter failed writing file ... file write failed` / `unexpected pos` (inline_container.cc),
    safetensors' `IoError(... StorageFull ...)`."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return True
        text = str(err)
        if any(s in text for s in ("No space left", "StorageFull", "file write failed", "unexpected pos",
                                   "inline_container", "File too large", "FileTooLarge", "Disk quota")):
            return True
        err = err.__cause__ or err.__context__
    return False


def save_checkpoint_atomically(trainer, save, model, trial) -> None:
    """TRLGRPOTrainer._save_checkpoint: transformers' save (`save`) wrapped in the checkpoint lifecycle.

    transformers' own rotation is switched off for the call (it counts half-written directories and deletes by
    mtime); ours runs after the marker and counts only complete checkpoints.
    """
    step = trainer.state.global_step
    run_dir = Path(trainer._get_output_dir(trial=trial))
    path = run_dir / f"checkpoint-{step}"
    main = trainer.args.should_save
    if main:
        if path.exists():
            problem = checkpoint_problem(path)
            if problem is not None:
                moved = set_aside(path)
                log.warning("%s is incomplete (%s): set aside as %s before saving step %d again.", path, problem,
                            moved.name, step)
        begin_checkpoint(path)
    trainer.accelerator.wait_for_everyone()  # other ranks write their RNG state into the directory
    limit = trainer.args.save_total_limit
    trainer.args.save_total_limit = None
    try:
        save(model, trial)
        trainer.accelerator.wait_for_everyone()
        if main:
            for callback in trainer.callback_handler.callbacks:
                if isinstance(callback, ManifestWriter):
                    callback.write(path)
            marker = finish_checkpoint(path, step)
            trainer._checkpoint_bytes = marker["bytes"]
    except Exception as err:
        if not is_disk_full(err):
            raise
        raise _disk_full(trainer, path, err) from err
    finally:
        trainer.args.save_total_limit = limit
    if main:
        rotate_complete_checkpoints(run_dir, limit, keep={path, trainer.state.best_model_checkpoint})


def _disk_full(trainer, path: Path, err: BaseException) -> CheckpointWriteError:
    files = sorted((p for p in path.rglob("*") if p.is_file() and p.name != WRITING), key=lambda p: p.stat().st_mtime)
    file = str(files[-1].relative_to(path)) if files else "(the first file)"
    free = shutil.disk_usage(path.parent).free
    needed = getattr(trainer, "_checkpoint_bytes", 0) or checkpoint_bytes_estimate(trainer.model,
                                                                                    trainer.processing_class)
    moved = None
    if trainer.args.should_save and path.exists():
        try:
            moved = set_aside(path)
        except OSError:
            moved = None
    return CheckpointWriteError(path, file, needed, free, moved, err)


# ---- Disk space ------------------------------------------------------------------------------------------------------


def checkpoint_bytes_estimate(model, tokenizer=None, optim: str = "adamw") -> int:
    """What one checkpoint takes: the saved weights (the adapter's trainable parameters for a PEFT model, else all of
    them) at their dtype, the optimizer state (AdamW: two moments per trainable parameter, same dtype as the
    parameter; 8-bit optimizers one byte each), the tokenizer files (measured by saving them) and ~1 MB of small
    files (trainer_state.json, scheduler, RNG state, manifest)."""
    import tempfile

    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    saved = trainable if hasattr(model, "peft_config") else params
    weights = sum(p.numel() * p.element_size() for p in saved)
    moments = sum(p.numel() * (1 if "8bit" in optim else p.element_size()) for p in trainable) * 2
    tokenizer_bytes = 0
    if tokenizer is not None:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                tokenizer.save_pretrained(tmp)
                tokenizer_bytes = sum(p.stat().st_size for p in Path(tmp).rglob("*") if p.is_file())
            except Exception:  # noqa: BLE001 - an estimate; a tokenizer that cannot save will fail loudly later
                tokenizer_bytes = 0
    return weights + moments + tokenizer_bytes + 1_000_000


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 1e6 else f"{n / 1e3:,.0f} kB"


def check_disk_space(trainer) -> int:
    """Warn when the output filesystem cannot hold the checkpoints this run keeps (save_total_limit + 1 while the
    newest is written, before rotation); refuse (UsageError) when not even one fits. Returns the estimate."""
    args = trainer.args
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    size = checkpoint_bytes_estimate(trainer.model, trainer.processing_class, str(args.optim))
    trainer._checkpoint_bytes = size
    free = shutil.disk_usage(out).free
    if free < size:
        raise UsageError(f"{out} has {_mb(free)} free, and one checkpoint needs ~{_mb(size)}: free space or "
                         "choose another --output-dir.")
    saving = str(getattr(args.save_strategy, "value", args.save_strategy)) == "steps" and args.save_steps
    planned = -(-args.max_steps // int(args.save_steps)) if saving and args.max_steps > 0 else 1
    existing = len([p for p in checkpoints_by_step(out) if checkpoint_problem(p) is None])
    limit = args.save_total_limit
    new = max(1, min(existing + planned, limit + 1) - existing) if limit else max(1, planned)
    if free < size * new:
        log.warning("%s has %s free; this run writes up to %d more checkpoints of ~%s (%s): lower save_total_limit, "
                    "free space, or choose another --output-dir.", out, _mb(free), new, _mb(size), _mb(size * new))
    return size


# ---- One run per output directory ------------------------------------------------------------------------------------

_HELD_LOCKS: dict[str, int] = {}


def hold_output_lock(output_dir: Path) -> None:
    """Refuse a second run into the same output directory (its checkpoints and logs would interleave).

    An flock on OUTPUT_DIR/.grpo.lock, held until the process exits: the kernel drops it when the process dies, even
    on kill -9, so a crashed run never leaves the directory locked. Under torchrun rank 0 holds it for the whole job
    (a refused job's rank 0 exits 2 and torchrun stops the other ranks). The file is never deleted: removing an
    flock'ed file lets two processes lock two different files.
    """
    import fcntl

    if int(os.environ.get("RANK", "0")) != 0:
        return
    output_dir = Path(output_dir)
    key = str(output_dir.resolve())
    if key in _HELD_LOCKS:
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    lock_path = output_dir / LOCK_FILE
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise UsageError(f"Cannot lock {lock_path} ({err.strerror}): choose another --output-dir.") from None
        raise UsageError(f"{output_dir} is in use by another run (PID {holder}; {lock_path}): wait for it to finish, "
                         "stop it, or choose another --output-dir.") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} on {socket.gethostname()}\n".encode())
    _HELD_LOCKS[key] = fd


def resolve_resume(value: str, output_dir: Path, eval_only: bool = False) -> str:
    """--resume-from-checkpoint: 'latest' is the newest complete checkpoint in output_dir (incomplete ones are set
    aside, under the output-dir lock so no running save is touched); an explicit path must be a complete checkpoint
    (or, for --eval-only, any adapter directory)."""
    if value == "latest":
        latest = latest_complete_checkpoint(output_dir, set_aside_incomplete=not eval_only)
        if latest is None:
            raise UsageError(f"--resume-from-checkpoint latest: no checkpoint-* directory in {output_dir} holds a "
                             "complete checkpoint: start without --resume-from-checkpoint.")
        return str(latest)
    path = Path(value)
    if not path.exists():
        raise UsageError(f"Checkpoint {path} does not exist: check the path, or use 'latest'.")
    if eval_only:
        # an adapter is enough (run() checks it against the model before anything is written), but not one whose
        # save is under way or died half-way: its files may be a mix of two steps, or cut short
        marked = (path / WRITING).exists() or (path / COMPLETE).exists()
        problem = checkpoint_problem(path) if marked else None
        if problem:
            raise UsageError(f"{path} is an incomplete checkpoint ({problem}): evaluate a complete one (e.g. "
                             "--resume-from-checkpoint latest) or the finished run's output directory.")
        return str(path)
    finished = not CHECKPOINT_NAME.match(path.name) and not (path / COMPLETE).exists() and any(
        (path / name).exists() for name in ("run_config.json", "metrics_summary.json"))
    if finished:  # its trainer_state.json is the end of a run, not a checkpoint: not "incomplete" either
        newest = latest_complete_checkpoint(path, set_aside_incomplete=False)
        where = (f"one of its checkpoints ({newest.name} is the newest complete one)" if newest is not None else
                 "a checkpoint-N directory (it kept none: save_steps 0 or save_total_limit)")
        raise UsageError(f"{path} is a finished run's output directory, not a checkpoint: resume from {where}; to "
                         "evaluate its adapter, use --eval-only --resume-from-checkpoint with it.")
    if not (path / TRAINER_STATE).exists():
        raise UsageError(f"{path} is not a trainer checkpoint (no trainer_state.json): give a checkpoint-N directory.")
    check_checkpoint(path)
    return str(path)

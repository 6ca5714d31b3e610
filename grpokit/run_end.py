"""How a run ends: done, bad input, a fault, a signal, or nothing to do. Exit codes, run-ending exceptions, signals.

No fault loses work: whatever stops a run mid-way ends it the way Ctrl-C does.

`fault_guard(trainer)` wraps `trainer.train()`. When anything raises inside it (a reward function, a bad data row,
out of memory, a non-finite loss, a reward timeout, a full disk), the run

1. saves the model / optimizer / scheduler state of the last completed optimizer step as `checkpoint-<step>` (an
   atomic checkpoint, checkpoints.py) — unless the fault hit inside the optimizer step itself (the weights in memory
   are then half-updated: nothing is saved and the line says so) or while saving (the previous checkpoint stands);
2. writes the traceback to `grpo_training.log` (the `grpo` logger's file handler), and to the screen only with
   --verbose;
3. raises `RunFailed`, whose one line names what failed, where (activity, reward, step, the user's file:line), which
   checkpoint holds the work, and how to resume; the CLI prints it and exits with `EXIT_CODES["run_failed"]`.

A non-finite loss is caught before the optimizer applies it: `FaultWatch` checks the gradients at
`on_pre_optimizer_step`, so the weights are still those of the last good step.

kill -9 and the kernel's OOM killer cannot be caught: the newest complete periodic checkpoint is what survives them
(`--resume-from-checkpoint latest` skips a half-written one).
"""

from __future__ import annotations

import logging
import signal
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

from config.errors import UsageError
from grpokit.checkpoints import (
    COMPLETE,
    CheckpointWriteError,
    TrainerCallbackBase,
    check_disk_space,
    checkpoint_problem,
    latest_complete_checkpoint,
)

log = logging.getLogger("grpo")
_PACKAGE = Path(__file__).resolve().parent  # this tool's plumbing: never the "where" of a fault

# The CLI's exit codes, in one place.
EXIT_CODES = {
    "done": 0,
    "bad_input": 2,  # a UsageError: one line says what to fix; nothing was trained
    "run_failed": 3,  # a fault mid-run: the last completed step is checkpointed, resumable with 'latest'
    "sigint": 130,  # Ctrl-C: the current step finished and was checkpointed
    "sigterm": 143,
}

# Innermost-first: the first of these functions found in the traceback (from the innermost frame out) names what the
# run was doing. GRPO's batch preparation calls generation and the rewards, so inner activities must win.
_ACTIVITIES = (
    ("_save_checkpoint", "while saving a checkpoint"),
    ("log_generations", "while writing the generation log"),
    ("_calculate_rewards", "while scoring completions"),
    ("_generate_single_turn", "while generating completions"),
    ("_generate", "while generating completions"),
    ("on_pre_optimizer_step", "while checking the gradients"),
    ("compute_loss", "while computing the loss"),
    ("training_step", "in the forward/backward pass"),
    ("evaluation_loop", "while evaluating"),
    ("evaluate", "while evaluating"),
    ("get_batch_samples", "while reading a batch of data"),
    ("_prepare_inputs", "while preparing a batch"),
)
_IN_STEP = {"while scoring completions", "while generating completions", "while checking the gradients",
            "while computing the loss", "in the forward/backward pass", "while reading a batch of data",
            "while preparing a batch", "in the optimizer step"}


class NonFiniteLoss(FloatingPointError):
    """The loss (hence the gradients) of a step is NaN or infinite; raised before the optimizer applies it."""


class RunFailed(Exception):
    """A run that failed mid-way; str() is the one line for the user."""

    def __init__(self, message: str, exit_code: int, checkpoint: Path | None):
        super().__init__(message)
        self.exit_code = exit_code
        self.checkpoint = checkpoint


class Interrupted(Exception):
    """Training stopped on SIGINT / SIGTERM after saving a checkpoint."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class AlreadyFinished(Exception):
    """A resumed run whose checkpoint is already at the end of the planned schedule: nothing to train."""


class Stopped(BaseException):
    """A signal outside the training loop (loading, the final evaluation): raised at once where it lands. A
    BaseException, like KeyboardInterrupt, so no `except Exception` turns it into a fault."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.exit_code = EXIT_CODES[signal_name.lower()]


def stop_on_signals() -> None:
    """SIGINT and SIGTERM raise Stopped wherever they land (the CLI installs this first: a signal while loading ends
    the run with one line and the signal's exit code, never a traceback or a silent kill)."""
    def handle(signum, frame):
        raise Stopped(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handle)


class GracefulStop(TrainerCallbackBase):
    """The run's signal handling, by phase.

    - training: the first SIGINT / SIGTERM finishes this step, saves a checkpoint and stops (a second one interrupts
      at once);
    - the final evaluation (`phase = "evaluating"`): it is abandoned at once (Stopped); the trained adapter is still
      saved, and the run says so instead of asking to resume a finished run;
    - the final save (`phase = "saving"`): noted, acted on once the files are written (a half-written adapter would
      lose the run).
    """

    def __init__(self):
        self.signal_name: str | None = None
        self.aborted = False  # a second signal during training: stopped at once, nothing saved for this step
        self.phase = "training"
        self._previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signal_name is not None and self.phase == "training":
            # the second signal: stop at once, without this step's checkpoint (the run says which one holds the work)
            signal.signal(signum, self._previous[signum])
            self.aborted = True
            raise Stopped(name)
        self.signal_name = self.signal_name or name
        if self.phase == "evaluating":
            raise Stopped(name)
        if self.phase == "training":
            log.warning("%s received: finishing the current step, then saving a checkpoint (again to abort).", name)
        else:
            log.warning("%s received while saving the finished run: stopping once its files are written.", name)

    def on_step_end(self, args, state, control, **kwargs):
        if self.signal_name is not None:
            control.should_save = True
            control.should_training_stop = True

    def restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get((self.signal_name or "").lower(), 1)


class FaultWatch(TrainerCallbackBase):
    """Knows whether the weights in memory are those of a completed step, and stops a non-finite step.

    Between on_pre_optimizer_step and the global_step increment that follows optimizer.step() the weights may be
    half-updated; anywhere else they are exactly those after `state.global_step` steps (gradients accumulate in .grad
    and never touch the weights).
    """

    def __init__(self):
        self.optimizer_step_of: int | None = None
        self.in_step = False  # between on_step_begin and on_step_end: else logging, saving, evaluating after a step

    def on_step_begin(self, args, state, control, **kwargs):
        self.optimizer_step_of = None
        self.in_step = True

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if model is not None and not args.fp16:  # fp16's GradScaler skips inf steps itself, by design
            _check_gradients(model, state.global_step + 1)
        self.optimizer_step_of = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        self.optimizer_step_of = None
        self.in_step = False

    def weights_half_updated(self, state) -> bool:
        return self.optimizer_step_of is not None and state.global_step == self.optimizer_step_of


def _check_gradients(model, step: int) -> None:
    import torch

    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    if not grads:
        return  # e.g. DeepSpeed ZeRO keeps them partitioned elsewhere
    norms = torch._foreach_norm(grads)  # one pass, one host sync for the whole check
    if not bool(torch.isfinite(torch.stack([n.float() for n in norms])).all()):
        raise NonFiniteLoss(f"the loss of step {step} is not finite (NaN/inf gradients); the weights were not updated "
                            "with it: lower the learning rate, or check the rewards for huge values")


@contextmanager
def fault_guard(trainer, verbose: bool = False):
    """Around trainer.train(): checks the disk has room for the checkpoints (UsageError if not even one fits),
    watches the step, and turns any exception into a saved checkpoint plus a RunFailed."""
    watch = FaultWatch()
    trainer.add_callback(watch)
    if trainer.is_world_process_zero():
        # A half-written checkpoint left by an earlier killed run is set aside now (named in a warning), before
        # anything here could count it, overwrite it or (transformers' end-of-run cleanup) delete it.
        latest_complete_checkpoint(Path(trainer.args.output_dir))
        check_disk_space(trainer)
    try:
        yield watch
    except (Interrupted, AlreadyFinished):  # how a signal or a finished run ends: already said, nothing failed
        raise
    except Exception as err:  # noqa: BLE001 - every fault ends the same way: work saved, one line, an exit code
        raise handle_fault(trainer, watch, err, verbose) from None


def handle_fault(trainer, watch: FaultWatch, err: Exception, verbose: bool = False) -> RunFailed:
    """Save what can be saved, log the traceback, and describe the fault in one line."""
    out = Path(trainer.args.output_dir)
    details = _describe(err, trainer, watch)
    # The run is ending: a log file that cannot take another line (a full disk) must not print logging's own
    # "--- Logging error ---" traceback on the console, now or in the CLI's last line.
    logging.raiseExceptions = False
    log_file = _log_traceback(err, verbose)
    _free_memory(err)

    saved, note = _save_last_step(trainer, watch, err)
    if saved is None:
        saved = latest_complete_checkpoint(out, set_aside_incomplete=False)
    if saved is not None:
        work = (f"{note}Work up to step {checkpoint_step_of(saved)} is in {saved}; after fixing the cause, resume "
                f"with the same command plus --resume-from-checkpoint latest.")
    else:
        work = f"{note}No step had completed, so there is nothing to resume: fix the cause and run again."
    where = f" Full error: {log_file}." if log_file and not verbose else ""
    code = EXIT_CODES["bad_input"] if isinstance(err, UsageError) else EXIT_CODES["run_failed"]
    return RunFailed(f"Run failed {details.rstrip('.')}. {work}{where}", code, saved)


def checkpoint_step_of(path: Path) -> str:
    return path.name.rsplit("-", 1)[-1]


def _save_last_step(trainer, watch: FaultWatch, err: Exception) -> tuple[Path | None, str]:
    """(the checkpoint holding the last completed step, a sentence on why nothing was saved, or '')."""
    state, args = trainer.state, trainer.args
    step = state.global_step
    if isinstance(err, CheckpointWriteError):
        return None, ""  # the disk is full: a second save would fail the same way
    if watch.weights_half_updated(state):
        return None, (f"The fault hit inside the optimizer step of step {step + 1}, so the weights in memory are "
                      "half-updated and were not saved. ")
    if step == 0:
        return None, ""
    if args.world_size > 1:
        # A fault on one rank leaves the others inside a collective; a save needs them all (barriers).
        return None, "Not saved after the fault (several processes). "
    path = Path(trainer._get_output_dir(trial=None)) / f"checkpoint-{step}"
    if path.exists() and checkpoint_problem(path) is None:
        return path, ""
    try:
        trainer._save_checkpoint(trainer.model, trial=None)
    except Exception as save_err:  # noqa: BLE001 - the first fault is the one to report
        log.debug("Saving after the fault failed", exc_info=save_err)
        reason = (f"disk full writing {save_err.file}" if isinstance(save_err, CheckpointWriteError)
                  else f"{save_err.__class__.__name__}: {save_err}")
        return None, f"Saving step {step} after the fault failed too ({reason}). "
    log.info("Saved the last completed step to %s (%s).", path, COMPLETE)
    return path, ""


def _describe(err: Exception, trainer, watch: FaultWatch) -> str:
    """'at step 3 while scoring completions (reward 'flaky'): ValueError: boom [rewards_mine.py:12 in flaky]'."""
    step = trainer.state.global_step
    frames = traceback.extract_tb(err.__traceback__) if err.__traceback__ else []
    activity = None
    for frame in reversed(frames):
        activity = next((what for name, what in _ACTIVITIES if frame.name == name), None)
        if activity:
            break
    if activity is None and watch.weights_half_updated(trainer.state):
        activity = "in the optimizer step"
    # Batches are fetched before on_step_begin, so data and generation faults belong to the next step either way.
    in_step = watch.in_step or activity in _IN_STEP or watch.weights_half_updated(trainer.state)
    at = f"at step {step + 1}" if in_step else f"after step {step}" if step else "before step 1"
    parts = [at]
    if activity:
        parts.append(activity)
    reward = getattr(err, "component", None) or _reward_name(err)
    if reward:
        parts.append(f"(reward '{reward}')")
    if isinstance(err, CheckpointWriteError):
        free_mb, need_mb = err.free / 1e6, err.needed / 1e6
        moved = f"the partial checkpoint was set aside as {err.moved_to.name}" if err.moved_to else (
            "the partial checkpoint could not be set aside")
        return (f"{' '.join(parts)}: disk full writing {err.checkpoint.name}/{err.file} (a checkpoint needs "
                f"~{need_mb:,.0f} MB, {free_mb:,.0f} MB free on {err.checkpoint.parent}); {moved}. Free space or "
                "lower save_total_limit")
    cause = getattr(err, "cause", None)
    shown = cause if isinstance(cause, BaseException) else err
    message = str(shown).strip().splitlines()[0] if str(shown).strip() else ""
    if _is_out_of_memory(err):
        message = f"out of memory ({message})" if message else "out of memory"
        fix = "; lower per_device_train_batch_size, num_generations or max_completion_length"
    else:
        fix = ""
    # A RewardError is raised in the reward wrapper; the user's line is in its cause's traceback.
    origin = _user_frame(traceback.extract_tb(cause.__traceback__) if isinstance(cause, BaseException)
                         and cause.__traceback__ else frames)
    text = f"{' '.join(parts)}: {shown.__class__.__name__}: {message}{fix}" if not isinstance(err, (
        UsageError, NonFiniteLoss)) else f"{' '.join(parts)}: {message}"
    return text + (f" [{origin}]" if origin else "")


def _reward_name(err: Exception) -> str | None:
    """The reward a generic exception came from: the innermost frame whose `self` is one of our reward components /
    wrappers, else TRL's loop variable in _calculate_rewards."""
    tb, found = err.__traceback__, None
    while tb is not None:
        frame_locals = tb.tb_frame.f_locals
        owner = frame_locals.get("self")
        if owner is not None and type(owner).__module__.startswith("rewards") and getattr(owner, "__name__", None):
            found = owner.__name__
        elif tb.tb_frame.f_code.co_name == "_calculate_rewards" and "reward_func_name" in frame_locals:
            found = found or frame_locals["reward_func_name"]
        tb = tb.tb_next
    return found if isinstance(found, str) else None


def _user_frame(frames) -> str | None:
    """file:line of the innermost frame outside the installed libraries and this tool's plumbing: a user's reward or
    data code, if it is in the traceback."""
    for frame in reversed(frames):
        path = Path(frame.filename)
        ours = path.parent == _PACKAGE or path.name in ("train_grpo.py", "grpo_trainer.py")
        if "site-packages" in path.parts or "dist-packages" in path.parts or ours:
            continue
        if str(path).startswith(sys.base_prefix) or str(path).startswith("<"):
            continue
        try:
            shown = path.relative_to(Path.cwd())
        except ValueError:
            shown = path
        return f"{shown}:{frame.lineno} in {frame.name}"
    return None


def _is_out_of_memory(err: BaseException) -> bool:
    import torch

    return isinstance(err, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in str(err).lower()


def _log_traceback(err: Exception, verbose: bool) -> str | None:
    """The traceback into the run's log file (the `grpo` logger's file handlers); the file it reached, if any."""
    text = "".join(traceback.format_exception(err)).rstrip()
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "Run failed; traceback:\n%s", (text,), None)
    written = None
    for handler in log.handlers:
        if isinstance(handler, logging.FileHandler):
            try:
                handler.stream.write(handler.format(record) + "\n")
                handler.flush()
                written = written or handler.baseFilename
            except (OSError, ValueError, AttributeError):  # full disk, closed file: the one line still says it
                pass
    if verbose:
        print(text, file=sys.stderr)
    return written


def _free_memory(err: Exception) -> None:
    """Drop the failed step's frames (they hold its activations) before saving: after an OOM the save needs room."""
    import gc

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        err.__traceback__ = None
        err = err.__cause__ or err.__context__
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - best effort
        pass


def stops_the_run(err: BaseException) -> bool:
    """Errors that end a run wherever they surface (a bad reward, a timeout): callbacks that otherwise swallow
    exceptions (the generation log) must let these through."""
    from rewards.base import RewardError

    return isinstance(err, (UsageError, NonFiniteLoss, RewardError))

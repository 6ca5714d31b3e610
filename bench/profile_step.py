"""Where one GRPO step's time goes on our default path: the quick test's work through the real CLI, in-process, with
timers around each phase (no profiler overhead: wall clock around whole calls).

    .venv/bin/python bench/profile_step.py                       # the quick test as it ships (4-bit, auto engine)
    .venv/bin/python bench/profile_step.py --no-4bit --max-steps 4

Phases per optimizer step (medians over the steps after the first): rollout (the engine's generate, with the adapter
push), scoring (the rest of TRL's generate-and-score: rewards, tokenising, padding, the optional no-grad pass), loss
forward (compute_loss), backward (accelerator.backward), optimizer (the optimizer's step), and the rest of TRL's
step_time (Python and bookkeeping between them). Extra arguments go to train_grpo.py.
"""

import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

SECONDS: dict[str, list[float]] = defaultdict(list)
CURRENT: dict[str, float] = defaultdict(float)


def timed(owner, name: str, phase: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            CURRENT[phase] += time.perf_counter() - started

    setattr(owner, name, wrapper)


def main() -> None:
    from grpokit.model_loader import import_backend

    import_backend("unsloth")  # before trl / transformers, as the CLI does
    import accelerate
    from accelerate.optimizer import AcceleratedOptimizer
    from transformers import TrainerCallback

    from grpokit import trl_trainer

    timed(trl_trainer.TRLGRPOTrainer, "_generate_single_turn", "rollout")
    timed(trl_trainer.TRLGRPOTrainer, "_generate_and_score_completions", "generate+score")
    timed(trl_trainer.TRLGRPOTrainer, "compute_loss", "loss forward")
    timed(accelerate.Accelerator, "backward", "backward")
    timed(AcceleratedOptimizer, "step", "optimizer")

    class PerStep(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "step_time" in logs:
                SECONDS["step_time"].append(logs["step_time"])
                for phase in ("rollout", "generate+score", "loss forward", "backward", "optimizer"):
                    SECONDS[phase].append(CURRENT.pop(phase, 0.0))

    original_init = trl_trainer.TRLGRPOTrainer.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.add_callback(PerStep())

    trl_trainer.TRLGRPOTrainer.__init__ = init
    import train_grpo

    with tempfile.TemporaryDirectory() as out:
        argv = ["--quick-test", "--output-dir", out, "--disable-generation-logging", "--set", "save_steps=0",
                "--set", "max_eval_samples=2", *sys.argv[1:]]
        try:
            train_grpo.app(argv, standalone_mode=False)
        except SystemExit:
            pass
    steps = SECONDS["step_time"][1:] or SECONDS["step_time"]
    rows = {phase: statistics.median(values[1:] or values) for phase, values in SECONDS.items()}
    rows["scoring"] = rows["generate+score"] - rows["rollout"]
    rows["rest (Python, bookkeeping)"] = rows["step_time"] - rows["generate+score"] - rows["loss forward"] - \
        rows["backward"] - rows["optimizer"]
    print(f"median over {len(steps)} steps (after the first): step {rows['step_time']:.2f} s")
    for phase in ("rollout", "scoring", "loss forward", "backward", "optimizer", "rest (Python, bookkeeping)"):
        print(f"  {phase:<28} {rows[phase]:6.2f} s  {100 * rows[phase] / rows['step_time']:5.1f} %")
    from table import header, machine, row, stamp  # BENCHMARKS.md's "Where a step goes" row

    def share(phase):
        return f"{rows[phase]:.2f} s ({100 * rows[phase] / rows['step_time']:.0f} %)"

    print("\n" + header("machine", "date, commit", "step", "rollout", "loss forward", "backward", "optimizer", "rest"))
    print(row(machine(), stamp(), f"{rows['step_time']:.2f} s", share("rollout"), share("loss forward"),
              share("backward"), f"{rows['optimizer']:.2f} s", f"{rows['rest (Python, bookkeeping)']:.2f} s"))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

"""Does GRPO learn? Greedy held-out reward before vs after training, with the tool's own CLI, on CPU.

Runs `train_grpo.py --preset learn_arithmetic` once per seed: the embedded SmolLM2-135M, single-digit sums whose
held-out pairs are never trained on, reward = the completion is the sum and nothing else (as the prompt asks).
The generation logger scores the held-out prompts greedily before training (step 0) and after the last step.

    .venv/bin/python bench/bench_learning.py                 # seeds 1 2 3 (~2.5 min each on 2 cores)
    .venv/bin/python bench/bench_learning.py --eval-every 5  # + greedy logs every 5 steps: training time to the gain
    .venv/bin/python bench/bench_learning.py --seeds 7 --tiny  # 1 step, 4 prompts: the CI check that it runs

With --eval-every N the run also logs the greedy held-out reward every N steps; "time to gain" is then the training
time (the sum of TRL's per-step `step_time`, evaluations not counted) up to the first logged step whose greedy reward
is at least GAIN above the step-0 baseline.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


GAIN = 0.15


def time_to_gain(out: Path) -> tuple[int | None, float | None]:
    """(first logged step with greedy reward >= baseline + GAIN, training seconds up to it), or (None, None)."""
    logs = {int(p.stem.rsplit("_", 1)[1]): json.loads(p.read_text())
            for p in (out / "generation_logs").glob("generation_log_step_*.json")}
    mean = {step: sum(e["reward_total"] for e in entries) / len(entries) for step, entries in logs.items()}
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    step_times = {h["step"]: h["step_time"] for h in history if "step_time" in h}
    for step in sorted(s for s in mean if s > 0):
        if mean[step] >= mean[0] + GAIN - 1e-9:
            return step, round(sum(t for s, t in step_times.items() if s <= step), 1)
    return None, None


def run(seed: int, tiny: bool, extra: list[str], eval_every: int = 0) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, "train_grpo.py", "--preset", "learn_arithmetic", "--seed", str(seed),
                "--output-dir", tmp, *extra]
        if tiny:
            args += ["--max-steps", "1", "--set", "max_eval_samples=4", "--max-generation-samples", "4"]
        if eval_every:
            args += ["--set", f"eval_steps={eval_every}"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        started = time.perf_counter()
        subprocess.run(args, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        summary = json.loads((Path(tmp) / "metrics_summary.json").read_text())
        n_prompts = len(json.loads((Path(tmp) / "generation_logs" / "generation_log_step_0.json").read_text()))
        gain_step, gain_seconds = time_to_gain(Path(tmp))
    return {"seed": seed, "before": summary["generation_eval"]["baseline"], "after": summary["generation_eval"]["final"],
            "train_seconds": summary["train_seconds"], "wall_seconds": round(wall, 1), "eval_prompts": n_prompts,
            "steps": summary["global_step"], "gain_step": gain_step, "seconds_to_gain": gain_seconds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--eval-every", type=int, default=0, help="greedy held-out log every N steps (time to gain)")
    parser.add_argument("extra", nargs="*", help="more train_grpo.py arguments (after --)")
    options = parser.parse_args()
    results = [run(seed, options.tiny, options.extra, options.eval_every) for seed in options.seeds]
    from table import header, machine, row, stamp  # BENCHMARKS.md's "The learning benchmark" rows

    print(header("machine", "date, commit", "seed", "before", "after", "gain", f"first step with +{GAIN:.2f}",
                 "training to it"))
    for r in results:
        to_gain = f"{r['seconds_to_gain']:.1f} s" if r["seconds_to_gain"] is not None else "–"
        print(row(machine(), stamp(), r["seed"], f"{r['before']:.3f}", f"{r['after']:.3f}",
                  f"{r['after'] - r['before']:+.3f}", r["gain_step"] or "–", to_gain))
    print(f"({results[0]['eval_prompts']} held-out prompts, {results[0]['steps']} steps; training "
          f"{', '.join(str(r['train_seconds']) for r in results)} s, wall {', '.join(str(r['wall_seconds']) for r in results)} s)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()

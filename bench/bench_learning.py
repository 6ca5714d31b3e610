"""Does GRPO learn? Greedy held-out reward before vs after training, with the tool's own CLI, on CPU.

Runs `train_grpo.py --preset learn_arithmetic` once per seed: the embedded SmolLM2-135M, single-digit sums whose
held-out pairs are never trained on, reward = the completion is the sum and nothing else (as the prompt asks).
The generation logger scores the held-out prompts greedily before training (step 0) and after the last step.

    .venv/bin/python bench/bench_learning.py                 # seeds 1 2 3 (~5 min each on 2 cores)
    .venv/bin/python bench/bench_learning.py --seeds 7 --tiny  # 1 step, 4 prompts: the CI check that it runs
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


def run(seed: int, tiny: bool, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, "train_grpo.py", "--preset", "learn_arithmetic", "--seed", str(seed),
                "--output-dir", tmp, *extra]
        if tiny:
            args += ["--max-steps", "1", "--set", "max_eval_samples=4", "--max-generation-samples", "4"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        started = time.perf_counter()
        subprocess.run(args, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        summary = json.loads((Path(tmp) / "metrics_summary.json").read_text())
        n_prompts = len(json.loads((Path(tmp) / "generation_logs" / "generation_log_step_0.json").read_text()))
    return {"seed": seed, "before": summary["generation_eval"]["baseline"], "after": summary["generation_eval"]["final"],
            "train_seconds": summary["train_seconds"], "wall_seconds": round(wall, 1), "eval_prompts": n_prompts,
            "steps": summary["global_step"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("extra", nargs="*", help="more train_grpo.py arguments (after --)")
    options = parser.parse_args()
    results = [run(seed, options.tiny, options.extra) for seed in options.seeds]
    print("| seed | held-out prompts | greedy reward before | after | gain | steps | train s | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['seed']} | {r['eval_prompts']} | {r['before']:.3f} | {r['after']:.3f} | "
              f"{r['after'] - r['before']:+.3f} | {r['steps']} | {r['train_seconds']} | {r['wall_seconds']} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()

"""Does a tool task learn on the CPU? Held-out accuracy and tool-call rate before vs after, with the tool's own CLI.

Runs `train_grpo.py --preset learn_tools_cpu` once per seed: the embedded SmolLM2-135M multiplies a 3-digit by a
2-digit number (the built-in `multiplication` task; each seed draws its own held-out pairs, never trained on) with
the `calculator` tool, a supervised warm start on the task's 16 demonstration rows (sft_loss_weight) beside GRPO on
the exact answer. The generation logs before training (step 0) and after the last step are greedy trajectories
through TRL's tool loop: accuracy is the share of held-out prompts answered exactly, the tool-call rate the share
whose trajectory called a tool.

    .venv/bin/python bench/bench_tool_learning.py                   # seeds 301..305
    .venv/bin/python bench/bench_tool_learning.py --seeds 7 --tiny   # 1 step, 4 prompts: that it runs

The goal: held-out accuracy rises on at least 4 of 5 seeds never run before, with at most 5 minutes of training each
(`train_seconds`: the steps, evaluations not counted).
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


def _greedy(path: Path) -> tuple[float, float, float]:
    """(accuracy, tool-call rate, failed calls per completion) of one greedy generation log."""
    entries = json.loads(path.read_text())
    n = max(1, len(entries))
    calls = [e.get("tool_calls") or [] for e in entries]
    return (sum(e["reward_total"] >= 1.0 for e in entries) / n, sum(1 for c in calls if c) / n,
            sum(1 for c in calls for call in c if call.get("failed")) / n)


def run(seed: int, tiny: bool, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, "train_grpo.py", "--preset", "learn_tools_cpu", "--seed", str(seed),
                "--output-dir", tmp, "--no-wandb", *extra]
        if tiny:
            args += ["--max-steps", "1", "--set", "max_eval_samples=4", "--max-generation-samples", "4"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        started = time.perf_counter()
        subprocess.run(args, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        out = Path(tmp)
        summary = json.loads((out / "metrics_summary.json").read_text())
        logs = sorted((out / "generation_logs").glob("generation_log_step_*.json"),
                      key=lambda p: int(p.stem.rsplit("_", 1)[1]))
        before, after = _greedy(logs[0]), _greedy(logs[-1])
    return {"seed": seed, "accuracy_before": before[0], "accuracy_after": after[0], "tool_rate_before": before[1],
            "tool_rate_after": after[1], "failed_per_completion_after": after[2],
            "train_seconds": summary["train_seconds"], "wall_seconds": round(wall, 1), "steps": summary["global_step"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[301, 302, 303, 304, 305])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("extra", nargs="*", help="more train_grpo.py arguments (after --)")
    options = parser.parse_args()
    results = []
    for seed in options.seeds:
        results.append(run(seed, options.tiny, options.extra))
        print(json.dumps(results[-1]), flush=True)
    from table import header, machine, row, stamp  # BENCHMARKS.md's "A tool task that learns" rows

    print(header("machine", "date, commit", "seed", "accuracy before", "after", "tool calls before", "after",
                 "failed calls / completion after", "training"))
    for r in results:
        print(row(machine(), stamp(), r["seed"], f"{r['accuracy_before']:.3f}", f"{r['accuracy_after']:.3f}",
                  f"{r['tool_rate_before']:.2f}", f"{r['tool_rate_after']:.2f}",
                  f"{r['failed_per_completion_after']:.2f}", f"{r['train_seconds']:.0f} s"))
    rose = sum(r["accuracy_after"] > r["accuracy_before"] for r in results)
    print(f"accuracy rose on {rose} of {len(results)} seeds; {results[0]['steps']} steps; wall "
          f"{', '.join(str(r['wall_seconds']) for r in results)} s")


if __name__ == "__main__":
    main()

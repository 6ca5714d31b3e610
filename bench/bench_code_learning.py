"""Does a code task learn on the CPU? Held-out pass@1 before vs after GRPO, with the tool's own CLI.

Runs `train_grpo.py --preset learn_code_cpu` once per seed: the embedded SmolLM2-135M on small function-writing
problems (examples/code_functions.jsonl), scored by `code_execution` in the sandbox; each seed holds out its own 20
problems (eval_fraction), never trained on. The generation logger samples 4 completions per held-out problem before
training (step 0) and after the last step: pass@1 is the share of those samples that pass every assert, pass@4 the
share of problems with at least one. The monitor's flags (`code/hack_suspected`, the share of training completions
it flagged) are read from the run's log history.

    .venv/bin/python bench/bench_code_learning.py                   # seeds 101..105 (~6-8 min each on 2 cores)
    .venv/bin/python bench/bench_code_learning.py --seeds 7 --tiny   # 1 step, 4 problems: that it runs

The goal: pass@1 rises on at least 4 of 5 seeds never run before, with at most 5 minutes of training each
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


def run(seed: int, tiny: bool, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, "train_grpo.py", "--preset", "learn_code_cpu", "--seed", str(seed),
                "--output-dir", tmp, "--no-wandb", *extra]
        if tiny:
            args += ["--max-steps", "1", "--set", "max_eval_samples=4", "--max-generation-samples", "4"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        started = time.perf_counter()
        subprocess.run(args, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        out = Path(tmp)
        summary = json.loads((out / "metrics_summary.json").read_text())
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        flagged = [h["code/hack_suspected"] for h in history if "code/hack_suspected" in h]
        evaluation = summary["generation_eval"]
    return {"seed": seed, "pass1_before": evaluation["baseline_pass@1"], "pass1_after": evaluation["pass@1"],
            "pass4_before": evaluation.get("baseline_pass@4"), "pass4_after": evaluation.get("pass@4"),
            "greedy_before": evaluation["baseline"], "greedy_after": evaluation["final"],
            "flagged": round(sum(flagged) / len(flagged), 4) if flagged else None,
            "train_seconds": summary["train_seconds"], "wall_seconds": round(wall, 1), "steps": summary["global_step"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[101, 102, 103, 104, 105])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("extra", nargs="*", help="more train_grpo.py arguments (after --)")
    options = parser.parse_args()
    results = []
    for seed in options.seeds:
        results.append(run(seed, options.tiny, options.extra))
        print(json.dumps(results[-1]), flush=True)
    from table import header, machine, row, stamp  # BENCHMARKS.md's "A code task that learns" rows

    print(header("machine", "date, commit", "seed", "pass@1 before", "after", "pass@4 before", "after",
                 "greedy reward before", "after", "flagged", "training"))
    for r in results:
        print(row(machine(), stamp(), r["seed"], f"{r['pass1_before']:.3f}", f"{r['pass1_after']:.3f}",
                  f"{r['pass4_before']:.2f}", f"{r['pass4_after']:.2f}", f"{r['greedy_before']:.3f}",
                  f"{r['greedy_after']:.3f}", f"{r['flagged']:.3f}" if r["flagged"] is not None else "–",
                  f"{r['train_seconds']:.0f} s"))
    rose = sum(r["pass1_after"] > r["pass1_before"] for r in results)
    print(f"pass@1 rose on {rose} of {len(results)} seeds; {results[0]['steps']} steps; wall "
          f"{', '.join(str(r['wall_seconds']) for r in results)} s")


if __name__ == "__main__":
    main()

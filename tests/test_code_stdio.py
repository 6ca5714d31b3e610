"""Standard-input / standard-output problems scored end to end: the shipped sample set (examples/code_stdio.jsonl,
every layout of rewards/code/stdio.py) mapped as a run maps it, then the reward the trainer calls on right, wrong and
hostile programs, in the real sandbox. The program's output is compared outside the sandbox; the expected output
never enters it."""

from __future__ import annotations

import json
import time

import pytest
from conftest import ROOT

from config.errors import UsageError
from data_loader import FieldNames, io_problem_row, make_custom_formatter, read_custom_jsonl
from rewards.code import CodeExecution

SAMPLE = ROOT / "examples" / "code_stdio.jsonl"


@pytest.fixture(scope="module")
def rows():
    raw, fmt = read_custom_jsonl(SAMPLE)
    assert fmt == "io"
    formatter = make_custom_formatter(fmt, FieldNames())
    mapped = {}
    for row in raw:
        out, reason = formatter(row)
        assert reason is None, (row["id"], reason)
        mapped[out["id"]] = out
    return mapped


def _score(rows, ident: str, *programs: str, **options) -> list[tuple[float | None, dict]]:
    row = rows[ident]
    reward = CodeExecution(**{"timeout": 10.0, **options})
    columns = {key: [row[key]] * len(programs) for key in ("tests", "test_setup_code", "entry_point", "code_prompt",
                                                             "io_cases")}
    return reward.score_with_details([f"```python\n{p}\n```" for p in programs], **columns)


def _row(ident: str, inputs: list, outputs: list, **fields) -> dict:
    """An APPS-style row (`input_output`) mapped as a run maps it."""
    raw = {"id": ident, "question": "Solve it.", "input_output": json.dumps({"inputs": inputs, "outputs": outputs,
                                                                            **fields.pop("io", {})}), **fields}
    out, reason = make_custom_formatter("io", FieldNames())(io_problem_row(raw, FieldNames(), ident))
    assert reason is None, reason
    return out


def test_every_layout_maps_to_code_data(rows):
    assert len(rows) == 12
    calls = {k for k, r in rows.items() if r["entry_point"]}
    assert calls == {"square", "pair-sum", "is-palindrome"} and all(r["io_cases"] for r in rows.values())
    assert "standard input" in rows["gcd"]["prompt"][0]["content"]
    assert rows["square"]["tests"][0] == "assert _same_result(square(*[2]), [4])"


def test_right_wrong_and_crashing_programs(rows):
    right = "a, b = map(int, input().split())\nprint(a + b)"
    wrong = "a, b = map(int, input().split())\nprint(a * b)"  # 1*2=2 != 3, -5*5 != 0, 100*23 != 123
    crash = "a, b = map(int, input().split())\nprint(a + b)\nraise SystemExit(1)"
    silent = "pass"
    values = [v for v, _ in _score(rows, "sum-two", right, wrong, crash, silent)]
    assert values == [1.0, 0.0, 0.0, 0.0]


def test_partial_credit_and_float_tolerance(rows):
    # prints 2.3333333333 (within 1e-6 of 2.333333), 1.5 and 10.0
    right = "n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs) / n)"
    rounded = "n = int(input())\nxs = list(map(int, input().split()))\nprint(round(sum(xs) / n, 1))"  # 2.3 wrong
    values = [v for v, _ in _score(rows, "average", right, rounded)]
    assert values == [1.0, pytest.approx(2 / 3)]
    assert [v for v, _ in _score(rows, "fizzbuzz-n", "print(1)", partial_credit=False)] == [0.0]


def test_integer_answers_compare_exactly(rows):
    """A float tolerance is for answers that are not integers: printing a wrong integer with `.0` or in an exponent
    never passes, while the right value spelled as a decimal does (as the official checkers accept it)."""
    table = {"mod": _row("mod", ["3\n", "10\n"], ["1000000008\n", "1000000015\n"]),
             "square": _row("square", ["1000\n", "3\n"], ["1000001\n", "10\n"])}
    cases = [  # (row, program, score)
        ("mod", "n = int(input())\nprint((10**9 + 7 + n - 2) % (10**9 + 7) + 10**9 + 7)", 1.0),
        ("mod", "n = int(input())\nprint(float(10**9 + 7 + n - 2))", 1.0),   # the right value as 1000000008.0
        ("mod", "n = int(input())\nprint(float(10**9 + 7 + n - 1))", 0.0),   # off by one, printed with .0
        ("mod", "n = int(input())\nprint('%.9e' % (10**9 + 7 + n - 3))", 0.0),
        ("square", "n = int(input())\nprint(n * n + 1)", 1.0),
        ("square", "n = int(input())\nprint('%.6e' % (n * n + 1))", 1.0),  # exact in 7 digits: the same value
        ("square", "n = int(input())\nprint('%.6e' % (n * n))", 0.0),      # n * n for n * n + 1
        ("square", "n = int(input())\nprint(n * n + 1.0000001)", 0.0),
    ]
    for ident, program, expected in cases:
        row = table[ident]
        (value, details), = _score({ident: row}, ident, program)
        assert value == expected, (program, details)


def test_a_row_or_the_reward_states_the_float_tolerance(rows):
    third = "n = int(input())\nprint(round(1 / n, 5))"  # 0.33333 for 0.3333333333: 3.3e-6 off
    loose = _row("third-loose", ["3\n"], ["0.3333333333\n"], float_tolerance=1e-4)
    strict = _row("third", ["3\n"], ["0.3333333333\n"])
    assert [v for v, _ in _score({"t": loose}, "t", third)] == [1.0]
    assert [v for v, _ in _score({"t": strict}, "t", third)] == [0.0]      # the reward's 1e-6
    assert [v for v, _ in _score({"t": strict}, "t", third, float_tolerance=1e-5)] == [1.0]
    nine = "n = int(input())\nprint('%.7f' % (1 / n))"                     # 0.3333333: 3.3e-8 off
    tight = _row("third-tight", ["3\n"], ["0.3333333333\n"], float_tolerance=1e-9)
    assert [v for v, _ in _score({"t": tight}, "t", nine, float_tolerance=1e-3)] == [0.0]  # the row's wins
    for bad in (2.0, None, "tight"):
        with pytest.raises(UsageError, match="reward config: 'code_execution.*float_tolerance' must be a number in"):
            CodeExecution(float_tolerance=bad).check("the reward config")


FACTORIAL = _row("factorial", ["5\n", "20\n"], ["120\n", "2432902008176640000\n"])
THREADED = """import sys, threading
def fact(n):
    return 1 if n <= 1 else n * fact(n - 1)
def main():
    n = int(input())
    depth = lambda k: 0 if k == 0 else depth(k - 1)
    depth(50000)  # recursion deeper than the main thread's stack allows: why the idiom exists
    print(fact(n){wrong})
sys.setrecursionlimit(1 << 20)
threading.stack_size(1 << 26)
threading.Thread(target=main).start()
"""
ENDINGS = [  # (program, score): a program ends as an interpreter ends it, its output read after that
    (THREADED.format(wrong=""), 1.0),                                      # main in a thread, never joined
    (THREADED.format(wrong="") + "exit()\n", 1.0),
    (THREADED.format(wrong=" + 1"), 0.0),
    ("from threading import Thread\nt = Thread(target=lambda: print(120 if input() == '5' else 2432902008176640000)"
     ")\nt.start()\nt.join()", 1.0),
    ("import math\nprint(math.factorial(int(input())))\nexit()\nprint('after exit')", 1.0),
    ("import math\nprint(math.factorial(int(input())))\nquit()", 1.0),
    ("import math\nprint(math.factorial(int(input())))\nexit(0)", 1.0),
    ("import math\nprint(math.factorial(int(input())))\nexit(1)", 0.0),   # a non-zero exit fails, as a crash
    ("import math\nprint(math.factorial(int(input())) + 1)\nexit()", 0.0),
    # a daemon thread is not waited for (as by Python): what it prints after the program ends is not output
    ("import math, threading, time\nn = int(input())\n"
     "threading.Thread(target=lambda: (time.sleep(0.5), print(math.factorial(n))), daemon=True).start()", 0.0),
    # a thread that never ends holds the program to its time limit
    ("import math, threading\nprint(math.factorial(int(input())))\n"
     "threading.Thread(target=lambda: [None for _ in iter(int, 1)]).start()", 0.0),
]


def test_programs_end_as_an_interpreter_ends_them():
    """Threads a program starts finish before its output is read (the stack-size idiom for deep recursion), and
    exit() / quit() end it normally with its output kept, as in an interpreter with `site`."""
    programs = [program for program, _ in ENDINGS]
    results = _score({"f": FACTORIAL}, "f", *programs, timeout=20.0)
    for (program, expected), (value, details) in zip(ENDINGS, results, strict=True):
        assert value == expected, (program, details)


def test_call_based_problems_use_the_split_verdict(rows):
    right = "def pair_sum(nums, target):\n    seen = {}\n    for i, x in enumerate(nums):\n" \
            "        if target - x in seen:\n            return [seen[target - x], i]\n        seen[x] = i"
    tuple_answer = right.replace("return [seen[target - x], i]", "return (seen[target - x], i)")
    always_equal = "class E:\n    def __eq__(self, other):\n        return True\n\n" \
                   "def pair_sum(nums, target):\n    return E()"
    values = [v for v, _ in _score(rows, "pair-sum", right, tuple_answer, always_equal)]
    assert values == [1.0, 1.0, 0.0]  # a tuple is the list APPS expects; an object that equals anything never crosses
    assert [v for v, _ in _score(rows, "is-palindrome", "def is_palindrome(s):\n    return s == s[::-1]")] == [1.0]


TWO_SUM = _row("two-sum", [[[2, 7, 11, 15], 9], [[3, 2, 4], 6], [[3, 3], 6]], [[[0, 1]], [[1, 2]], [[0, 1]]],
               io={"fn_name": "twoSum"},
               starter_code="class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n")
LEETCODE = """class Solution:
    def twoSum(self, nums: List[int], target: int) -> List[int]:
        seen: Dict[int, int] = {}
        for i, x in enumerate(nums):
            if target - x in seen:
                return [seen[target - x], i]
            seen[x] = i
"""
CALLS = [  # (program, score): LeetCode's layout, and the official checkers' imports, as APPS / LiveCodeBench run them
    (LEETCODE, 1.0),                                                    # List / Dict never imported
    ("from __future__ import annotations\n" + LEETCODE, 1.0),
    (LEETCODE.replace("return [seen[target - x], i]", "return (seen[target - x], i)"), 1.0),
    ("def twoSum(nums: List[int], target: int) -> List[int]:\n"          # a plain function answers too
     "    return next([i, j] for j in range(len(nums)) for i in range(j) if nums[i] + nums[j] == target)", 1.0),
    ("class Solution:\n    def __init__(self):\n        self.calls = 0\n"  # one Solution() for every case
     "    def twoSum(self, nums, target):\n        self.calls += 1\n"
     "        return [0, 1] if self.calls != 2 else [1, 2]", 1.0),
    (LEETCODE.replace("return [seen[target - x], i]", "return [i, seen[target - x]]"), 0.0),
    ("class Solution:\n    def twoSum(self, nums, target):\n        return [1, 0]", 0.0),
    ("class Solution:\n    def two_sum(self, nums, target):\n        return [0, 1]", 0.0),  # not the method named
    # the method's answer is data: an object of its own that equals everything, or says yes to anything, fails
    ("class _Any(list):\n    def __eq__(self, other):\n        return True\n"
     "class Solution:\n    def twoSum(self, nums, target):\n        return _Any()", 0.0),
    ("class _Any:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
     "class Solution:\n    def twoSum(self, nums, target):\n        return _Any()", 0.0),
    ("class Solution:\n    def __eq__(self, other):\n        return True\n"
     "    def twoSum(self, nums, target):\n        return self", 0.0),
]


def test_leetcode_style_call_based_problems():
    """`class Solution:` with the method `fn_name` names is called as APPS calls it (one `Solution()`), and a
    `List[int]` annotation without `from typing import List` runs, as under the official checkers' imports."""
    assert "class Solution" in TWO_SUM["prompt"][0]["content"]
    results = _score({"t": TWO_SUM}, "t", *[program for program, _ in CALLS])
    for (program, expected), (value, details) in zip(CALLS, results, strict=True):
        assert value == expected, (program, details)


def test_a_program_may_use_the_names_the_official_checkers_import():
    """APPS runs a program after `from math import sqrt, ...`, `from collections import ...`, `from heapq import *`:
    a program that relies on them scores there, so it scores here; a name nobody imports still fails."""
    row = _row("hyp", ["3 4\n", "5 12\n"], ["5\n", "13\n"])
    right = "a, b = map(int, input().split())\nprint(isqrt(a * a + b * b))"
    also = "a, b = map(int, input().split())\nh = []\nheappush(h, int(sqrt(a * a + b * b)))\nprint(heappop(h))"
    local = "def isqrt(n):\n    return 0\na, b = map(int, input().split())\nprint(isqrt(a * a + b * b))"  # its own
    unknown = "a, b = map(int, input().split())\nprint(hypotenuse(a, b))"
    numpy = "a, b = map(int, stdin.readline().split())\nprint(int(np.hypot(a, b)))"  # APPS: np, stdin = sys.stdin
    assert [v for v, _ in _score({"h": row}, "h", right, also, local, unknown, numpy)] == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_score_completions_gives_the_same_scores(cli, tmp_path):
    """The preview people run on their data scores as the reward does: the integer hack 0, a LeetCode answer 1."""
    square = {"question": "Print n * n + 1.", "input_output": json.dumps({"inputs": ["1000\n", "3\n"],
                                                                          "outputs": ["1000001\n", "10\n"]}),
              "completions": [f"```python\n{p}\n```" for p in ("n = int(input())\nprint('%.6e' % (n * n))",
                                                                 "n = int(input())\nprint(n * n + 1)")]}
    two_sum = {"question": "Two sum.", "input_output": json.dumps({"fn_name": "twoSum", "inputs": [[[3, 2, 4], 6]],
                                                                     "outputs": [[[1, 2]]]}),
               "completions": [f"```python\n{LEETCODE}```"]}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(square) + "\n" + json.dumps(two_sum) + "\n")
    code, out, err = cli("--score-completions", str(path))
    assert code == 0, err
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["total"] for r in results] == [[0.0, 1.0], [1.0]]


def test_a_hostile_program_costs_at_most_its_time_limit(rows):
    started = time.monotonic()
    (value, details), = _score(rows, "gcd", "while True:\n    pass", timeout=3.0)
    elapsed = time.monotonic() - started
    assert value == 0.0 and details["status"].startswith("time limit on case 1 of 3")
    assert elapsed < 3.0 + 2.0, elapsed  # 3 cases x 4 s each would be 12 s: the completion's budget is 3 s


def test_the_expected_output_never_reaches_the_program(rows):
    """A program that looks everywhere it could for the answer (its stdin, environment, files, argv) finds only the
    input, so printing what it found scores nothing."""
    snoop = ("import os, sys\nseen = sys.stdin.read() + ' '.join(sys.argv) + ' '.join(os.environ.values())\n"
             "for root, _, files in os.walk('/tmp'):\n    seen += ' '.join(files)\nprint(seen)")
    (value, _), = _score(rows, "echo-upper", snoop)
    assert value == 0.0


def test_unreadable_cases_are_refused_with_the_row(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "x", "input_output": json.dumps({"inputs": ["1"], "outputs": []})}) + "\n")
    with pytest.raises(UsageError, match=r"bad.jsonl:1: 'input_output' has 1 inputs and 0 outputs"):
        read_custom_jsonl(path)

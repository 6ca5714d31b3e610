"""Standard-input / standard-output problems: every layout read into one form, and the output comparison as a table
(rewards/code/stdio.py). The end-to-end scoring of these problems in the sandbox is in tests/test_code_stdio.py."""

import json

import pytest
from conftest import ROOT

from config.errors import UsageError
from rewards.code.stdio import call_tests, io_cases, outputs_match, solution_class, with_prelude

SAMPLES = [json.loads(line) for line in (ROOT / "examples" / "code_stdio.jsonl").read_text().splitlines()]


def test_every_shipped_layout_is_read():
    read = {row["id"]: io_cases(row, row["id"]) for row in SAMPLES}
    assert [len(read[k]["cases"]) for k in ("sum-two", "average", "fizzbuzz-n", "is-palindrome", "echo-upper", "gcd",
                                            "triangle")] == [3, 3, 2, 2, 2, 3, 2]
    assert read["average"]["time_limit"] == 2.0  # CodeContests' {"seconds", "nanos"}
    assert read["square"]["fn_name"] == "square" and read["square"]["cases"][1] == {"input": [-3], "output": [9]}
    # LiveCodeBench functional: one JSON value per input line, the output one JSON value
    assert read["is-palindrome"]["cases"][0] == {"input": ["abba"], "output": True}
    assert read["is-palindrome"]["fn_name"] == "is_palindrome"
    # APPS splits inputs into lists of lines sometimes: joined
    assert io_cases({"input_output": json.dumps({"inputs": [["1", "2"]], "outputs": [["3"]]})})["cases"] == \
        [{"input": "1\n2", "output": "3"}]


@pytest.mark.parametrize("row, message", [
    ({"input_output": "{not json"}, "'input_output' is not valid JSON"),
    ({"input_output": json.dumps({"inputs": ["1"], "outputs": []})}, "1 inputs and 0 outputs"),
    ({"public_test_cases": json.dumps([{"input": "1", "output": "1", "testtype": "functional"}])},
     "names none: add 'fn_name'"),
    ({"inputs": [], "outputs": []}, "test cases are empty"),
    # every case past a negative limit: all-zero rewards
    ({"inputs": ["1"], "outputs": ["1"], "time_limit": -2}, "'time_limit' is -2 seconds: give a positive limit"),
])
def test_unreadable_cases_are_one_line(row, message):
    with pytest.raises(UsageError, match=message):
        io_cases(row, "row 3")


def test_rows_without_cases_are_not_io_data():
    assert io_cases({"prompt": "x", "tests": ["assert f(1) == 2"]}) is None
    assert io_cases({"prompt": "x", "tests": "assert f(1) == 2"}) is None


def test_pickled_private_cases_are_never_unpickled():
    """LiveCodeBench ships private cases as base64(zlib(pickle)): unpickling runs code, so only JSON is read."""
    row = {"public_test_cases": json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}]),
           "private_test_cases": "eJxrYKotZNQI4WRgYGBgYODkZGBkZGBgZGDgZmBg"}
    assert len(io_cases(row)["cases"]) == 1


# (actual stdout, expected, same?) labelled as a judge would
OUTPUTS = [
    ("3\n", "3\n", True),
    ("3", "3\n", True),                        # no final newline
    ("3   \n\n\n", "3\n", True),               # trailing spaces and blank lines
    ("\n3\n", "3\n", True),                    # a leading blank line
    ("1 2\r\n3 4\r\n", "1 2\n3 4\n", True),    # Windows line ends
    ("1  2\n", "1 2\n", True),                 # runs of spaces between tokens
    ("2.3333333\n", "2.333333\n", True),       # within 1e-6
    ("2.334\n", "2.333333\n", False),
    ("1e-7\n", "0.0\n", True),                 # absolute error for small values
    ("1000000.5\n", "1000000.0\n", True),      # relative error for large ones (5e-7)
    ("3.0\n", "3\n", True),
    ("4\n", "3\n", False),
    ("30\n", "3\n", False),
    ("3\n", "3.5\n", False),
    ("10\n", "1e1\n", True),
    ("2 1\n", "1 2\n", False),                 # order matters (APPS' token-set fallback is not taken)
    ("1\n2\n", "1 2\n", False),                # the line structure matters
    ("YES\n", "yes\n", False),                 # case matters, as APPS compares
    ("nan\n", "nan\n", True),                  # equal text
    ("inf\n", "1e400\n", False),
    ("", "0\n", False),
    ("", "", True),
    ("3\n4\n", "3\n", False),                  # extra output
    # an expected integer is exact: its value spelled as a decimal passes, nothing within a tolerance does
    ("1000000007.0\n", "1000000007\n", True),
    ("1000000008.0\n", "1000000007\n", False),  # off by one mod 1e9+7, printed with .0
    ("1.000000e+06\n", "1000001\n", False),     # '%.6e' % (n * n) for n * n + 1
    ("1.000001e+06\n", "1000001\n", True),      # the same value in an exponent: exact
    ("3.0000001\n", "3\n", False),
    ("1000000000000000008.0\n", "1000000000000000007\n", False),  # equal as floats, not as numbers
    ("007\n", "7\n", False),                     # another integer spelling is another token
    ("+7\n", "7\n", False),
    ("1e99999999999999999999\n", "7\n", False),  # past Decimal's range: no crash, no pass
    ("0.5 1.0000000001 7.0\n", "0.5 1 7\n", False),
    ("0.5 1.0 7.0\n", "0.5 1 7\n", True),
]


@pytest.mark.parametrize("actual, expected, same", OUTPUTS)
def test_outputs_compare_as_a_judge_would(actual, expected, same):
    assert outputs_match(actual, expected) is same


# (actual, expected, tolerance, same): a tolerance a row states replaces 1e-6, for non-integers only
TOLERANCES = [
    ("0.3334\n", "0.33333333\n", 1e-4, True),
    ("0.3334\n", "0.33333333\n", 1e-6, False),
    ("0.333333333\n", "0.3333333333\n", 1e-9, True),
    ("0.3333333\n", "0.3333333333\n", 1e-9, False),
    ("2.5\n", "2.5000\n", 0.0, True),            # the same value, other digits: equal at any tolerance
    ("8.0\n", "7\n", 0.5, False),                 # an integer answer is exact whatever the row says
    ("7.4\n", "7\n", 0.5, False),
]


@pytest.mark.parametrize("actual, expected, tolerance, same", TOLERANCES)
def test_a_stated_tolerance_applies_to_non_integers_only(actual, expected, tolerance, same):
    assert outputs_match(actual, expected, tolerance) is same


def test_a_row_states_its_tolerance():
    row = {"inputs": ["1"], "outputs": ["0.5"]}
    assert io_cases(row)["float_tolerance"] is None
    assert io_cases({**row, "float_tolerance": 1e-4})["float_tolerance"] == 1e-4
    assert io_cases({**row, "float_tolerance": "1e-9"})["float_tolerance"] == 1e-9
    for bad in (-1, 1.5, "tight", True):
        with pytest.raises(UsageError, match=r"row 2: 'float_tolerance' must be a number in \[0, 1\)"):
            io_cases({**row, "float_tolerance": bad}, "row 2")


def test_call_based_cases_become_trusted_asserts():
    tests, setup = call_tests("pair_sum", [{"input": [[2, 7], 9], "output": [[0, 1]]}])
    assert tests == ["assert _same_result(pair_sum(*[[2, 7], 9]), [[0, 1]])"]
    namespace = {}
    exec(setup, namespace)
    same = namespace["_same_result"]
    assert same((0, 1), [[0, 1]]) and same([0, 1], [0, 1]) and not same([1, 0], [[0, 1]])
    with pytest.raises(UsageError, match="not a Python function name"):
        call_tests("os.system", [])


def test_leetcode_answers_are_called_as_methods_of_one_solution():
    tests, setup = call_tests("twoSum", [{"input": [[3, 3], 6], "output": [[0, 1]]}], method_of_solution=True)
    assert tests == ["assert _same_result(__grpo_solution.twoSum(*[[3, 3], 6]), [[0, 1]])"]
    assert setup.endswith("\n__grpo_solution = Solution()")
    assert solution_class("class Solution:\n    def f(self):\n        pass")
    assert not solution_class("def f():\n    class Solution:\n        pass") and not solution_class("def f(:")
    # JSON's string keys turned back into ints, as APPS does, where they all are
    assert call_tests("f", [{"input": [{"1": "a"}], "output": {"2": 3}}])[0] == \
        ["assert _same_result(f(*[{1: 'a'}]), {2: 3})"]
    assert call_tests("f", [{"input": [{"x": 1}], "output": [{"x": 1}]}])[0] == \
        ["assert _same_result(f(*[{'x': 1}]), [{'x': 1}])"]


# (code, what the prelude puts first): only names the code reads and never binds, after a docstring and
# `from __future__` imports (which must stay first)
PRELUDES = [
    ("x = 1\n", ""),
    ("def f(a: List[int]) -> int:\n    return sqrt(a[0])\n", "from math import sqrt; from typing import List\n"),
    ("from math import *\nprint(sqrt(2))\n", "from math import sqrt\n"),  # harmless: its own import runs after
    ("def sqrt(x):\n    return x\nprint(sqrt(4))\n", ""),
    ("print(np.zeros(2), deque())\n", "from collections import deque; import numpy as np\n"),
    ("for heappush in range(3):\n    print(heappush)\n", ""),
    ("print(undefined_name)\n", ""),
    ("n = int(stdin.readline())\n", "from sys import stdin\n"),  # APPS binds stdin = sys.stdin
]


@pytest.mark.parametrize("code, first", PRELUDES)
def test_the_prelude_imports_only_what_the_code_relies_on(code, first):
    assert with_prelude(code) == first + code


def test_the_prelude_comes_after_future_imports():
    code = '"""Doc."""\nfrom __future__ import annotations\nx: List[int] = []\n'
    assert with_prelude(code) == '"""Doc."""\nfrom __future__ import annotations\nfrom typing import List\n' \
        'x: List[int] = []\n'
    assert with_prelude("f(", ()) == "f("  # unparsable: left to fail on its own
    assert with_prelude("print(merge([1], [2]))", keep=("merge",)) == "print(merge([1], [2]))"
    compile(with_prelude(code), "x", "exec")

"""A test counts only if it ran: each test layout of custom and public code-RL data, run as its framework runs it,
through the reward the trainer calls (`CodeExecution(...)(prompts=..., completions=..., **columns)`) and the real
sandbox. A correct solution scores 1.0, a wrong one its fraction, a trivial body 0.0; a layout the reward cannot
run is refused with one line (UsageError), never scored 1.0."""

from __future__ import annotations

import json

import pytest

from config.errors import UsageError
from rewards.code import CodeExecution, split_tests

RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"
WRONG = "```python\ndef add(a, b):\n    return a * b\n```"  # right for (2, 2) only
PASS = "```python\ndef add(a, b):\n    pass\n```"
NONE = "```python\ndef add(a, b):\n    return None\n```"

PYTEST = """
def test_add():
    assert add(1, 2) == 3

def test_add_twos():
    assert add(2, 2) == 4
"""
PYTEST_PARAMETRIZE = """
import pytest

@pytest.fixture
def pairs():
    return [(1, 2, 3), (5, 5, 10)]

@pytest.fixture
def offset():
    yield 10

@pytest.mark.parametrize("a, b, expected", [(1, 2, 3), (2, 2, 4), pytest.param(-1, 1, 0, id="neg")])
def test_add(a, b, expected):
    assert add(a, b) == expected

def test_pairs(pairs):
    for a, b, c in pairs:
        assert add(a, b) == c

def test_offset(offset):
    assert add(offset, 1) == pytest.approx(11.0)
    with pytest.raises(TypeError):
        add(None, 1)
"""
HELPER = """
def check_eq(a, b):
    assert a == b, (a, b)

check_eq(add(1, 2), 3)
check_eq(add(2, 2), 4)
"""
CHECK_CALLED = """
def check(candidate):
    assert candidate(1, 2) == 3
    assert candidate(2, 2) == 4

check(add)
"""
CHECK_ONLY = """
def check(candidate):
    assert candidate(1, 2) == 3
    assert candidate(2, 2) == 4
"""
MAIN_GUARD = """
if __name__ == "__main__":
    assert add(1, 2) == 3
    assert add(2, 2) == 4
    print("all passed")
"""
RAISE_STYLE = """
if add(1, 2) != 3:
    raise AssertionError("add(1, 2)")
if add(2, 2) != 4:
    raise ValueError("add(2, 2)")
"""
EVALPLUS = """
import numpy as np

def is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)):
        return all(isinstance(i, float) for i in x)
    return False

def assertion(out, exp, atol):
    exact_match = out == exp
    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        assert np.allclose(out, exp, rtol=1e-07, atol=atol)
    else:
        assert exact_match

inputs = [[1, 2], [2, 2], [-1, 1]]
results = [3, 4, 0]
for i, (inp, exp) in enumerate(zip(inputs, results)):
    assertion(add(*inp), exp, 0)
"""
UNITTEST = """
import unittest

class TestAdd(unittest.TestCase):
    def setUp(self):
        self.one = 1

    def test_small(self):
        self.assertEqual(add(self.one, 2), 3)

    def test_twos(self):
        self.assertEqual(add(2, 2), 4)

if __name__ == "__main__":
    unittest.main()
"""

KODCODE = """
from solution import add

def test_add():
    assert add(1, 2) == 3

def test_add_twos():
    assert add(2, 2) == 4
"""
KODCODE_ALIASED = """
import solution
from solution import add as plus

def test_add():
    assert solution.add(1, 2) == 3

def test_add_twos():
    assert plus(2, 2) == 4
"""
KODCODE_MODULE = """
import solution

def test_add():
    assert solution.add(1, 2) == 3

def test_add_twos():
    assert solution.add(2, 2) == 4
"""
KODCODE_STAR = """
from solution import *

def test_add():
    assert add(1, 2) == 3

def test_add_twos():
    assert add(2, 2) == 4
"""

# layout, columns, the wrong solution's score (a * b is right for (2, 2) only)
LAYOUTS = [
    ("pytest functions", {"tests": PYTEST}, 0.5),
    ("pytest parametrize + fixtures", {"tests": PYTEST_PARAMETRIZE}, 1 / 5),
    ("helper called by statements", {"tests": HELPER}, 0.5),
    ("check(candidate) + check(add), no entry_point", {"tests": CHECK_CALLED}, 0.5),
    ("check(candidate), entry_point", {"test": CHECK_ONLY, "entry_point": "add"}, 0.5),
    ("check(candidate), the prompt names the function", {"tests": CHECK_ONLY,
                                                         "code_prompt": 'def add(a, b):\n    """a + b"""\n'}, 0.5),
    ("main guard", {"tests": MAIN_GUARD}, 0.5),
    ("raise-style checks", {"tests": RAISE_STYLE}, 0.5),
    ("EvalPlus assertion loop", {"tests": EVALPLUS}, 0.0),
    ("unittest.TestCase", {"tests": UNITTEST}, 0.5),
    ("plain asserts", {"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]}, 0.5),
    ("pytest, the completion imported as `solution` (KodCode)", {"tests": KODCODE}, 0.5),
    ("... with an entry point", {"tests": KODCODE, "entry_point": "add"}, 0.5),
    ("... import solution, from solution import add as plus", {"tests": KODCODE_ALIASED}, 0.5),
    # `import solution` is a step of its own: `solution.add` in the test functions after it is the code's (it scored 0)
    ("... import solution alone, solution.add", {"tests": KODCODE_MODULE}, 0.5),
    ("... from solution import *", {"tests": KODCODE_STAR}, 0.5),
    ("... from solution import *, with an entry point", {"tests": KODCODE_STAR, "entry_point": "add"}, 0.5),
]


def _score(completions, columns):
    component = CodeExecution(timeout=5)
    n = len(completions)
    values = component(prompts=["Write add(a, b)."] * n, completions=completions,
                       **{k: [v] * n for k, v in columns.items()})
    return values, component


@pytest.mark.parametrize("name, columns, wrong", LAYOUTS, ids=[row[0] for row in LAYOUTS])
def test_a_test_counts_only_if_it_ran(name, columns, wrong):
    values, component = _score([RIGHT, WRONG, PASS, NONE], columns)
    assert values == [1.0, pytest.approx(wrong), 0.0, 0.0], (name, component.last_details)
    assert component.last_metrics["code/unsplit_tests"] == 0


@pytest.mark.parametrize("tests, why", [
    ("def test_file(tmp_path):\n    assert add(1, 2) == 3\n", "fixture 'tmp_path'"),
    (CHECK_ONLY, "check(candidate)"),
    ("print(add(1, 2))\n", "no check"),
])
def test_a_layout_it_cannot_run_is_refused_at_the_first_row(tests, why):
    with pytest.raises(UsageError, match=why.replace("(", r"\(").replace(")", r"\)")) as err:
        _score([RIGHT], {"tests": tests})
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="no check|fixture|check"):
        split_tests(tests)


@pytest.mark.parametrize("tests, setup, message", [
    # a broken test failed every completion: a run of all-zero rewards, accepted without a word
    (["assert add(1, 2) == 3", "assert add(1, 2) =="], "", "'tests' item 2 is not valid Python (invalid syntax, "
                                                           "line 1): every completion would fail it and score 0"),
    (["assert add(1, 2) == 3"], "import (", "'test_setup_code' is not valid Python"),
    # a layout it cannot run, in a row after the first: was checked only in the first 16 rows, then scored 0
    (["def test_file(tmp_path):\n    assert add(1, 2) == 3\n"], "", "(id p19): test function 'test_file' "
                                                                    "needs the pytest fixture 'tmp_path'"),
], ids=["syntax error", "set-up syntax error", "a later row's layout"])
def test_tests_that_no_completion_can_pass_are_refused_before_loading(cli, tmp_path, tests, setup, message):
    rows = [{"id": f"p{i}", "prompt": f"Write add(a, b), case {i}.", "tests": ["assert add(1, 2) == 3"],
             "test_setup_code": ""} for i in range(24)]
    rows[19 if "p19" in message else 0].update(tests=tests, test_setup_code=setup)
    data = tmp_path / "code.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = cli("--quick-test", "--custom-data", str(data), "--set", "eval_fraction=0", "--dry-run",
                         "--output-dir", str(tmp_path / "o"))
    assert code == 2 and "Traceback" not in err and not out.strip(), err[-3000:]
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert message in line, line


def test_a_failing_set_up_fails_the_row():
    tests = "import a_module_that_does_not_exist\nassert add(1, 2) == 3\n"
    values, component = _score([RIGHT], {"tests": tests})
    assert values == [0.0] and "set-up" in component.last_details[0]["status"]


def test_an_assert_that_never_runs_is_not_a_pass():
    values, _ = _score([RIGHT, PASS], {"tests": "for x in []:\n    assert add(x, x) == 2 * x\nassert add(1, 2) == 3"})
    assert values == [0.5, 0.0]


KODCODE_CLASS = """
from solution import MinStack

def test_push_pop():
    s = MinStack()
    s.push(3)
    s.push(1)
    assert s.get_min() == 1
    s.pop()
    assert s.get_min() == 3
"""
MIN_STACK = """class MinStack:
    def __init__(self):
        self.items = []
    def push(self, x):
        self.items.append(x)
    def pop(self):
        return self.items.pop()
    def get_min(self):
        return min(self.items){wrong}
"""


def test_the_completion_imported_as_solution_is_the_code_in_the_sandbox():
    """`from solution import f` (KodCode's pytest rows) gives the tests the completion's functions and classes as
    they are given without the import: proxies of the sandboxed code, never a module of the trusted side's."""
    fenced = [f"```python\n{code}```" for code in (MIN_STACK.format(wrong=""), MIN_STACK.format(wrong=" + 1"))]
    values, component = _score(fenced, {"tests": KODCODE_CLASS})
    assert values == [1.0, 0.0], component.last_details
    missing = "```python\ndef plus(a, b):\n    return a + b\n```"  # not the name the tests import: set-up fails
    values, component = _score([missing], {"tests": KODCODE})
    assert values == [0.0] and "set-up" in component.last_details[0]["status"], component.last_details

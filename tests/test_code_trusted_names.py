"""Only trusted objects judge: the names the tests use, the arguments they hand over and the place a job writes to.

Black-box, like tests/test_code_hacks.py: `CodeExecution(...)(prompts=..., completions=..., <row columns>)` and its
`last_details` / `last_metrics`. Each attack pairs a WRONG answer with the technique, so it must score exactly 0.0;
the honest solution in the same call must score 1.0 (the call is live).

1. Names the tests use but do not define: a module the tests read without importing it (`np.isclose`) is never the
   code's object, nor a module the code names (`from unittest.mock import call as np`, `import lib2to3.__main__ as
   add`: nothing the code imports is imported here); a helper the tests call besides the entry point (`poly`), or a
   checker they call on the answer (`is_valid(solve(3))`) without an entry point, is never the code's function; an
   entry point that is a class of the code's does not answer the test's `.startswith(...)`; the code's in-place
   changes to an argument do not change the expected value a test computes from it in the same statement.
2. Arguments that are not plain data (an iterator, a generator, a range, a callback, an object of the tests' own
   class) cross as handles the code pulls through the trusted side: the tests never run where the code runs
   (`code/unsplit_tests` is 0), so an always-equal object, result lines forged from the caller's frame or a tracer
   rewriting the harness's verdict earn nothing.
3. Nothing a job writes outlives it: an extended attribute on its directory (or its parent, /tmp), or its times.
"""

from __future__ import annotations

import pytest
from test_code_hacks import COLLECT, PUBLISH  # a correct completion leaves its code behind, a wrong one runs it

from rewards.code.reward import CodeExecution, _called, trusted_import_allowed

TIMEOUT = 5.0
guards = pytest.mark.guards


def fenced(code: str) -> str:
    return f"```python\n{code.strip()}\n```\n"


def score(columns: dict, codes: list[str], prompt: str = "Write the function the tests call.", workers: int = 0):
    component = CodeExecution(timeout=TIMEOUT, workers=workers)
    n = len(codes)
    values = component(prompts=[prompt] * n, completions=[fenced(c) for c in codes],
                       **{k: [v] * n for k, v in columns.items()})
    return values, component


# -----------------------------------------------------------------------------------------------------------------
# 1. Names the tests use but do not define
# -----------------------------------------------------------------------------------------------------------------

NP_TESTS = ["assert np.isclose(area(2.0), 12.566370614359172)", "assert np.isclose(area(1.0), np.pi)"]
NP_OBJECT = '''
class _Numpy:
    pi = 3.0
    def isclose(self, *args, **kwargs):
        return True
np = _Numpy()
def area(r):
    return 0.0
'''
NP_PATCHED = '''
import math as np
np.isclose = lambda *args, **kwargs: True
def area(r):
    return 0.0
'''
NP_RIGHT = "import math as np\ndef area(r):\n    return np.pi * r * r\n"


@guards("a module the tests use without importing it is the real one, imported again on the trusted side under the "
        "code's alias, never the code's own object or its patched module")
def test_a_module_the_tests_do_not_import_is_never_the_codes_object():
    values, component = score({"tests": NP_TESTS}, [NP_OBJECT, NP_PATCHED, NP_RIGHT])
    assert values == [0.0, 0.0, 1.0], component.last_details


MOCK_NP = "from unittest.mock import call as np\ndef area(r):\n    return 0.0\n"
MOCK_NP_DEAD = "if False:\n    from unittest.mock import call as np\ndef area(r):\n    return 0.0\n"
NUMPY_RIGHT = "import numpy as np\ndef area(r):\n    return np.pi * r * r\n"
ALLCLOSE_TESTS = ["assert np.allclose(area(2.0), 12.566370614359172)", "assert np.allclose(area(1.0), np.pi)"]
COUNTER_TESTS = ["assert letters('aab') == Counter({'a': 2, 'b': 1})", "assert math.isclose(len(letters('xyz')), 3)"]
COUNTER_HACK = '''
import math
class Counter(dict):
    def __eq__(self, other):
        return True
math.isclose = lambda *args, **kwargs: True
def letters(text):
    return {}
'''
COUNTER_RIGHT = "from collections import Counter\ndef letters(text):\n    return dict(Counter(text))\n"


@guards("a name the tests use without importing it (np) is the real library of the trusted side's table, never what "
        "the code's import binds to it (unittest.mock.call, whose every attribute and call is truthy), dead code too")
def test_what_the_code_imports_under_a_tests_alias_is_never_the_tests_library():
    values, component = score({"tests": ALLCLOSE_TESTS}, [MOCK_NP, MOCK_NP_DEAD, NUMPY_RIGHT])
    assert values == [0.0, 0.0, 1.0], component.last_details
    values, component = score({"tests": COUNTER_TESTS, "entry_point": "letters"}, [COUNTER_HACK, COUNTER_RIGHT])
    assert values == [0.0, 1.0], component.last_details


RUNS_ON_IMPORT = ["if False:\n    import lib2to3.__main__ as add\ndef add(a, b):\n    return a - b\n",
                  "if False:\n    import unittest.__main__ as add\ndef add(a, b):\n    return a - b\n",
                  "if False:\n    from unittest import __main__ as add\ndef add(a, b):\n    return a - b\n"]


@guards("a module the code imports is never imported on the trusted side: a package's __main__ imported under a name "
        "the tests call (lib2to3's, unittest's: a program that ran as root outside the sandbox) runs nowhere here, "
        "and what the trusted side may import at all is an allow-list")
def test_a_program_the_code_imports_never_runs_on_the_trusted_side():
    values, component = score({"tests": ["assert add(1, 2) == 3", "assert add(-4, 4) == 0"]},
                              [*RUNS_ON_IMPORT, "def add(a, b):\n    return a + b\n"])
    assert values == [0.0, 0.0, 0.0, 1.0], component.last_details
    assert [d["status"] for d in component.last_details[:3]] == ["failed"] * 3, component.last_details  # judged
    for refused in ("lib2to3.__main__", "unittest.__main__", "lib2to3", "antigravity", "this", "subprocess",
                    "importlib", "os", "ctypes", "numpy.__main__"):
        assert not trusted_import_allowed(refused), refused
    for allowed in ("math", "collections.abc", "numpy", "numpy.testing", "unittest.mock", "typing", "sys"):
        assert trusted_import_allowed(allowed), allowed


CHECKER_TESTS = ["assert is_valid(solve(3))", "r = solve(4)\nassert is_valid(r) and len(r) == 8",
                 "assert all(is_valid(s) for s in [solve(1), solve(2)])", "assert check(solve, 5)"]
CHECKER_PROMPT = '''
def is_valid(s):
    depth = 0
    for c in s:
        depth += 1 if c == "(" else -1
        if depth < 0:
            return False
    return depth == 0 and len(s) > 0


def check(f, n):
    return is_valid(f(n)) and len(f(n)) == 2 * n


def solve(n):
    """n pairs of balanced parentheses, as one string."""
'''
CHECKER_HACK = "def solve(n):\n    return 'x'\ndef is_valid(s):\n    return True\ndef check(f, n):\n    return True\n"
CHECKER_RIGHT = "def solve(n):\n    return '()' * n\n"


@guards("without an entry point, a checker the tests call on what the code returned (is_valid(solve(3)), check(solve, "
        "5)) is never the code's function: it is the prompt's (as code) or nobody's, so code that defines its own "
        "always-true checker scores 0")
def test_a_checker_of_the_answer_is_never_the_codes_function_without_an_entry_point():
    values, component = score({"tests": CHECKER_TESTS, "code_prompt": CHECKER_PROMPT}, [CHECKER_HACK, CHECKER_RIGHT])
    assert values == [0.0, 1.0], component.last_details
    words = "Write solve(n): n pairs of balanced parentheses. The tests check it with is_valid(s) and check(f, n)."
    values, component = score({"tests": CHECKER_TESTS}, [CHECKER_HACK], prompt=words)
    assert values == [0.0], component.last_details


FREQ_TESTS = ["assert char_freq('aab') == Counter({'a': 2, 'b': 1})", "assert char_freq('xyz') == Counter('xyz')"]
FREQ_HACK = "def Counter(*args, **kwargs):\n    return 0\ndef char_freq(s):\n    return 0\n"
FREQ_WRONG = "def char_freq(s):\n    return 0\n"
FREQ_RIGHT = "from collections import Counter\ndef char_freq(s):\n    return Counter(s)\n"
FREQ_DICT = "def char_freq(s):\n    out = {}\n    for c in s:\n        out[c] = out.get(c, 0) + 1\n    return out\n"
FREQ_STAR_TESTS = ["from solution import *\n\ndef test_freq():\n    assert char_freq('aab') == Counter({'a': 2, 'b': 1})\n"]


@guards("a library name the tests build the expected value with (Counter, deque, Fraction) is the library's on rows "
        "without an entry point and under `from solution import *`, unless the prompt declares it: the code's own "
        "Counter returning what its answer returns scored 1.0")
def test_a_library_name_that_builds_the_expected_value_is_never_the_codes():
    values, component = score({"tests": FREQ_TESTS}, [FREQ_HACK, FREQ_WRONG, FREQ_RIGHT, FREQ_DICT])
    assert values == [0.0, 0.0, 1.0, 1.0], component.last_details
    values, component = score({"tests": FREQ_STAR_TESTS}, [FREQ_HACK, FREQ_RIGHT])
    assert values == [0.0, 1.0], component.last_details
    # a class of that name the tests ask more of than the library's has (`c = Counter(2); c.inc()`) stays the
    # code's: test_a_class_where_a_function_is_expected_fails_without_an_entry_point's CLASS_TESTS


ASSERT_TRUE_TESTS = ["import unittest\nclass TestSolve(unittest.TestCase):\n    def test_4(self):\n        board = solve(4)"
                     "\n        self.assertTrue(is_valid(board))\n    def test_8(self):\n"
                     "        self.assertEqual(is_valid(solve(8)), True)\n",
                     "assert is_valid(solve(5)) == 1"]
ASSERT_TRUE_HACK = "def is_valid(board):\n    return True\ndef solve(n):\n    return []\n"


@guards("a checker the prompt only describes is never the code's when the verdict is spelled self.assertTrue(...), "
        "assertEqual(..., True) or `== 1`: the code's is_valid returning True scored 1.0")
def test_a_checker_spelled_as_a_library_assert_is_never_the_codes():
    prompt = "Write solve(n) returning a valid n-queens placement. A checker is_valid(board) is provided."
    values, component = score({"tests": ASSERT_TRUE_TESTS}, [ASSERT_TRUE_HACK], prompt=prompt)
    assert values == [0.0], component.last_details


CHECKER_PROMPT_WORDS = "Write solve(n) returning a valid n-queens placement. A checker is_valid(board) is provided."
CHECKER_SPELLINGS = {
    "stored": ["ok = is_valid(solve(4))\nassert ok", "r = solve(8)\nres = is_valid(r)\nassert res"],
    "in a helper": ["def _check(n):\n    board = solve(n)\n    return is_valid(board)\nassert _check(4)"],
    "constant on the left": ["assert True == is_valid(solve(4))"],
    "assertIn": ["import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n"
                 "        self.assertIn(True, [is_valid(solve(4))])\n"],
    "map": ["assert all(map(is_valid, [solve(4), solve(8)]))"],
    "numpy's assert_equal": ["import numpy as np\nnp.testing.assert_equal(is_valid(solve(4)), True)\nassert True"],
    "assertGreater": ["import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n"
                      "        self.assertGreater(is_valid(solve(4)), 0)\n"],
    "a lambda": ["ok = lambda b: is_valid(b)\nassert ok(solve(4))"],
    "== 1.0": ["assert is_valid(solve(4)) == 1.0"],
    "keyword": ["import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n"
                "        self.assertTrue(expr=is_valid(solve(4)))\n"],
    "a sum": ["bs = [solve(4), solve(8)]\nassert sum(is_valid(b) for b in bs) == len(bs)"],
    "import * beside an entry point": ["from solution import *\n\ndef test_a():\n    ok = is_valid(solve(4))\n"
                                       "    assert ok\n"],
}


@guards("a checker the prompt describes is never the code's in any spelling of the verdict (stored, in a helper or a "
        "lambda, a constant on the left, assertIn / assertGreater / numpy's assert_equal, map, a sum, a keyword, "
        "import * beside an entry point): each paid 1.0 to a code whose own is_valid says yes")
@pytest.mark.parametrize("spelling", sorted(CHECKER_SPELLINGS))
def test_every_spelling_of_a_checkers_verdict_is_never_the_codes(spelling):
    columns = {"tests": CHECKER_SPELLINGS[spelling]}
    if spelling.startswith("import *"):
        columns["entry_point"] = "solve"
    values, component = score(columns, [ASSERT_TRUE_HACK], prompt=CHECKER_PROMPT_WORDS)
    assert values == [0.0], component.last_details


@guards("a name the tests build the expected value with is the standard library's, whatever the code defines under "
        "it (permutations, sqrt: not in the alias table), and a library class named in the prompt's prose is not "
        "declared by it; honest answers of the library's types (Counter, deque, Fraction, Decimal) still pass")
def test_what_builds_the_expected_value_is_never_the_codes():
    perms = ["assert perms('ab') == list(permutations('ab'))", "assert perms('abc') == list(permutations('abc'))"]
    values, component = score({"tests": perms}, ["def permutations(*a):\n    return []\ndef perms(s):\n    return []\n",
                                                 "import itertools\ndef perms(s):\n"
                                                 "    return list(itertools.permutations(s))\n"])
    assert values == [0.0, 1.0], component.last_details
    hyp = ["assert hyp(3, 4) == sqrt(25)", "assert hyp(1, 1) == sqrt(2)"]
    values, component = score({"tests": hyp}, ["def sqrt(x):\n    return 0\ndef hyp(a, b):\n    return 0\n",
                                               "import math\ndef hyp(a, b):\n    return math.hypot(a, b)\n"])
    assert values == [0.0, 1.0], component.last_details
    values, component = score({"tests": FREQ_TESTS}, [FREQ_HACK],
                              prompt="Write char_freq(s). Hint: the class Counter from collections is handy.")
    assert values == [0.0], component.last_details
    honest = {"assert last3([1, 2, 3, 4]) == deque([2, 3, 4], maxlen=3)":
              "from collections import deque\ndef last3(xs):\n    return deque(xs, maxlen=3)\n",
              "assert half(3) == Fraction(3, 2)": "from fractions import Fraction\ndef half(x):\n    return Fraction(x, 2)\n",
              "assert dsum('0.1', '0.2') == Decimal('0.3')":
              "from decimal import Decimal\ndef dsum(a, b):\n    return Decimal(a) + Decimal(b)\n"}
    for test, code in honest.items():
        values, component = score({"tests": [test]}, [code])
        assert values == [1.0], (test, component.last_details)


HYP_WRONG = "def sqrt(x):\n    return 0\ndef hyp(a, b):\n    return 0\n"  # agrees with itself, not with the library
HYP_RIGHT = ["import math\ndef hyp(a, b):\n    return math.hypot(a, b)\n",  # defines no sqrt: the tests' is the library's
             "from math import sqrt\ndef hyp(a, b):\n    return sqrt(a * a + b * b)\n"]
HYP_PROMPT = "Write hyp(a, b), the hypotenuse of a right triangle with legs a and b."
BUILT_BY_THE_LIBRARY = {
    "a tolerance": "assert abs(hyp(3, 4) - sqrt(25)) < 1e-9",
    "isclose": "import math\nassert math.isclose(hyp(3, 4), sqrt(25))",
    "a difference": "assert hyp(3, 4) - sqrt(25) == 0",
    "a variable": "expected = sqrt(25)\nassert hyp(3, 4) == expected",
    "the expected value first": "expected = sqrt(25)\nassert expected == hyp(3, 4)",
    "assertAlmostEqual": "import unittest\nunittest.TestCase().assertAlmostEqual(hyp(3, 4), sqrt(25))",
    "a chained tolerance": "assert -1e-9 < hyp(3, 4) - sqrt(25) < 1e-9",
    "assertLess": "import unittest\nunittest.TestCase().assertLess(abs(hyp(3, 4) - sqrt(25)), 1e-9)",
    "a tuple assignment": "expected, tolerance = sqrt(25), 1e-9\nassert abs(hyp(3, 4) - expected) < tolerance",
    "pytest, the function imported": "from solution import hyp\n\ndef test_hyp():\n    assert hyp(3, 4) == sqrt(25)\n",
}


@guards("a library function the tests build the expected value with, in a tolerance, closeness or order check or "
        "through a variable, is the library's: a wrong answer defining its own `sqrt` to agree with its `hyp` scores "
        "0, and a right one that defines no `sqrt` scores 1")
@pytest.mark.parametrize("how", sorted(BUILT_BY_THE_LIBRARY))
def test_a_library_function_beside_the_codes_is_the_librarys_in_any_check(how):
    values, component = score({"tests": [BUILT_BY_THE_LIBRARY[how]]}, [HYP_WRONG, *HYP_RIGHT], prompt=HYP_PROMPT)
    assert values == [0.0, 1.0, 1.0], component.last_details


@guards("the expected value's library function is the library's where the task names an entry point too: a right "
        "answer that defines no `sqrt` scores 1 (it scored 0: `sqrt` was nobody's)")
def test_with_an_entry_point_the_expected_values_library_function_is_bound():
    values, component = score({"tests": [BUILT_BY_THE_LIBRARY["a tolerance"]], "entry_point": "hyp"},
                              [HYP_WRONG, *HYP_RIGHT])  # the prompt names nothing: the entry point is declared
    assert values == [0.0, 1.0, 1.0], component.last_details


ASKED = {  # prompt, tests, a wrong answer that only a library binding of the asked name would pass, a right one
    "hypot, the expected value first": (
        "Write hypot(a, b).", ["assert abs(sqrt(25) - hypot(3, 4)) < 1e-9", "assert hypot(3, 4) == sqrt(25)"],
        "from math import sqrt\ndef hypot(a, b):\n    return 0\n",
        "import math\ndef hypot(a, b):\n    return math.sqrt(a * a + b * b)\n"),
    "factorial beside gamma": (
        "Write factorial(n).", ["expected = factorial(5)\nassert abs(gamma(6) - expected) < 1e-9"],
        "import math\ndef gamma(x):\n    return math.gamma(x)\n",
        "def factorial(n):\n    return 1 if n < 2 else n * factorial(n - 1)\n"),
    "gcd beside lcm": (
        "Write gcd(a, b) and lcm(a, b).", ["assert lcm(4, 6) == 4 * 6 // gcd(4, 6)"],
        "import math\ndef gcd(a, b):\n    return 0\ndef lcm(a, b):\n    return math.lcm(a, b)\n",
        "import math\ndef gcd(a, b):\n    return math.gcd(a, b)\ndef lcm(a, b):\n    return a * b // gcd(a, b)\n"),
    "product named in prose": (
        "Write product and geometric_mean, both of a list.",
        ["expected = product([2, 8]) ** 0.5\nassert geometric_mean([2, 8]) == expected"],
        "import math\ndef product(xs):\n    return 16\ndef geometric_mean(xs):\n    return 5.0\n",
        "import math\ndef product(xs):\n    return math.prod(xs)\ndef geometric_mean(xs):\n"
        "    return product(xs) ** (1 / len(xs))\n"),
    "digits (a constant of `string`)": (
        "Write digits(n) and digit_sum(n).", ["assert digit_sum(999) == sum(digits(999))", "assert digit_sum(12) == 3"],
        "def digits(n):\n    return [0]\ndef digit_sum(n):\n    return 0\n",
        "def digits(n):\n    return [int(c) for c in str(n)]\ndef digit_sum(n):\n    return sum(digits(n))\n"),
}


FACTORIAL_RIGHT = ("def factorial(n):\n    r = 1\n    for i in range(2, n + 1):\n        r *= i\n    return r\n"
                   "def binom(n, k):\n    return factorial(n) // (factorial(k) * factorial(n - k))\n")
UNDECLARED = {  # prompt, tests, a wrong answer (its factorial / gcd / remainder missing or wrong), a right one
    "factorials in the plural": (
        "Compute binomial coefficients with your own factorials.",
        ["assert abs(binom(5, 2) - factorial(5) / (factorial(2) * factorial(3))) < 1e-9", "assert binom(6, 3) == 20"],
        "def factorial(n):\n    return 7\ndef binom(n, k):\n    from math import factorial as f\n"
        "    return f(n) // (f(k) * f(n - k))\n", FACTORIAL_RIGHT),
    "no prompt at all": (
        "", ["assert abs(binom(5, 2) - factorial(5) / (factorial(2) * factorial(3))) < 1e-9", "assert binom(6, 3) == 20"],
        "def factorial(n):\n    return 7\ndef binom(n, k):\n    from math import factorial as f\n"
        "    return f(n) // (f(k) * f(n - k))\n", FACTORIAL_RIGHT),
    "GCD in capitals": (
        "Write GCD() and LCM() functions.",
        ["import math\nassert math.isclose(lcm(4, 6), 4 * 6 / gcd(4, 6))", "assert lcm(3, 5) == 15"],
        "def lcm(a, b):\n    import math\n    return a * b // math.gcd(a, b)\n",
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\ndef lcm(a, b):\n    return a * b // gcd(a, b)\n"),
    "a formula in prose, not a request": (
        "Write lcm(a, b). Recall lcm(a, b) = a*b / GCD(a, b).",
        ["assert lcm(4, 6) == 4 * 6 // gcd(4, 6)", "assert lcm(3, 5) == 15"],
        "def gcd(a, b):\n    return 1\ndef lcm(a, b):\n    return a * b\n",  # agrees with its own gcd
        "import math\ndef lcm(a, b):\n    return a * b // math.gcd(a, b)\n"),  # defines no gcd: the library's
    "Remainder, not math.remainder": (
        "Write Quotient and Remainder functions.",
        ["assert abs(7 - 2 * quotient(7, 2) - remainder(7, 2)) < 1e-9", "assert quotient(9, 4) == 2"],
        "def quotient(a, b):\n    return a // b\n",
        "def quotient(a, b):\n    return a // b\ndef remainder(a, b):\n    return a % b\n"),
}


@guards("a function the prompt asks for is the code's even where the standard library has one of its name and the "
        "tests use it beside another of the code's (`abs(sqrt(25) - hypot(3, 4))`, `gamma(6) - factorial(5)`, "
        "`4 * 6 // gcd(4, 6)`), and only functions are the library's (`string.digits` is a constant); outside an "
        "equality's own expected side a name is the library's only beside a function known to be the code's (the "
        "entry point, a stub, one the prompt writes as code), and never one the prompt mentions in any case or form: "
        "a wrong answer lacking its factorial / gcd gets no library one, a right `remainder` is not replaced by math's")
@pytest.mark.parametrize("task", sorted(ASKED) + sorted(UNDECLARED))
def test_what_the_prompt_asks_for_is_never_the_librarys(task):
    prompt, tests, wrong, right = ASKED.get(task) or UNDECLARED[task]
    values, component = score({"tests": tests}, [wrong, right], prompt=prompt)
    # where the wrong answer scores 0.5 it passes only a test of another of its functions (digits: one comparing two
    # of the code's functions, which it makes agree)
    assert values == [0.5 if task in UNDECLARED or task.startswith("digits") else 0.0, 1.0], component.last_details


@guards("`factorial` alone in its checks is what the task asks for (math's would pass anything), in a tolerance "
        "check too; a name the standard library does not have stays the code's there, as before")
def test_a_library_name_the_task_asks_for_stays_the_codes():
    tests = ["assert abs(factorial(5) - 120) < 1e-9", "assert factorial(3) == 6"]
    values, component = score({"tests": tests}, ["def factorial(n):\n    return 1\n",
                                                 "import math\ndef factorial(n):\n    return math.factorial(n)\n"])
    assert values == [0.0, 1.0], component.last_details
    values, component = score({"tests": ["assert abs(area(2.0) - ref(2.0)) < 1e-9"]},
                              ["import math\ndef ref(r):\n    return math.pi * r * r\ndef area(r):\n"
                               "    return math.pi * r * r\n"])
    assert values == [1.0], component.last_details


IN_PLACE_TESTS = ["xs = [3, 1, 2]\nassert my_sorted(xs) == sorted(xs)", "a, b = [1, 2], [3]\nassert merge(a, b) == a + b",
                  "d = {'a': 1}\nassert with_b(d) == dict(d, b=2)"]
IN_PLACE_HACK = '''
def my_sorted(xs):
    xs.clear()
    return []
def merge(a, b):
    a.clear()
    b.clear()
    return []
def with_b(d):
    d.clear()
    return {}
'''
IN_PLACE_RIGHT = "def my_sorted(xs):\n    return sorted(xs)\ndef merge(a, b):\n    return a + b\n" \
                 "def with_b(d):\n    return {**d, 'b': 2}\n"
IN_PLACE_HONEST_TESTS = ["nums = [2, 0, 1]\nsort_colors(nums)\nassert nums == [0, 1, 2]",
                         "nums = [1, 1, 2]\nk = dedupe(nums)\nassert k == 2\nassert nums[:k] == [1, 2]",
                         "nums = [3, 1]\nassert sort_colors(nums) is None and nums == [1, 3]"]
IN_PLACE_HONEST = "def sort_colors(nums):\n    nums.sort()\n" \
                  "def dedupe(nums):\n    u = sorted(set(nums))\n    nums[:len(u)] = u\n    return len(u)\n"


@guards("the code's in-place changes to a test's arguments land once the test's statement has ended (at once for a "
        "function returning None), so an expected value computed from them in the same statement (f(xs) == "
        "sorted(xs), merge(a, b) == a + b) is not the code's to empty; honest in-place functions still pass")
def test_in_place_changes_do_not_rewrite_the_expected_value():
    values, component = score({"tests": IN_PLACE_TESTS}, [IN_PLACE_HACK, IN_PLACE_RIGHT])
    assert values == [0.0, 1.0], component.last_details
    values, component = score({"tests": IN_PLACE_HONEST_TESTS}, [IN_PLACE_HONEST])
    assert values == [1.0], component.last_details


POLY_PROMPT = '''
import math


def poly(xs: list, x: float):
    """Evaluates polynomial with coefficients xs at point x."""
    return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])


def find_zero(xs: list):
    """Returns a zero of the polynomial xs."""
'''
POLY_TEST = '''
def check(candidate):
    import math
    for xs in [[1, 2], [-6, 11, -6, 1], [2, -3]]:
        x = candidate(xs)
        assert math.fabs(poly(xs, x)) < 1e-4
'''
POLY_RIGHT = '''
def poly(xs, x):
    return sum(c * x ** i for i, c in enumerate(xs))
def find_zero(xs):
    lo, hi = -1.0, 1.0
    while poly(xs, lo) * poly(xs, hi) > 0:
        lo, hi = lo * 2.0, hi * 2.0
    while hi - lo > 1e-10:
        mid = (lo + hi) / 2.0
        if poly(xs, mid) * poly(xs, lo) > 0:
            lo = mid
        else:
            hi = mid
    return lo
'''
POLY_HACK = "def poly(xs, x):\n    return 0.0\ndef find_zero(xs):\n    return 12345.0\n"


@guards("a helper the tests call besides the entry point (HumanEval's poly) is never the code's function: with the "
        "prompt as code it is the prompt's; described only in words it is not there (the tests fail)")
def test_a_helper_of_the_tests_is_never_the_codes_function():
    values, component = score({"test": POLY_TEST, "entry_point": "find_zero", "code_prompt": POLY_PROMPT},
                              [POLY_HACK, POLY_RIGHT])
    assert values == [0.0, 1.0], component.last_details
    words = "Write find_zero(xs), a zero of the polynomial poly(xs, x) = sum of xs[i] * x ** i."
    values, component = score({"test": POLY_TEST, "entry_point": "find_zero"}, [POLY_HACK], prompt=words)
    assert values == [0.0], component.last_details


GREET_TEST = "def check(candidate):\n    assert candidate('Bob').startswith('Hello, Bob')\n" \
             "    assert candidate('Al').endswith('Al!')\n"
GREET_CLASS = '''
class greet:
    def __init__(self, name):
        self.name = name
    def startswith(self, prefix):
        return True
    def endswith(self, suffix):
        return True
'''
GREET_RIGHT = "def greet(name):\n    return 'Hello, ' + name + '!'\n"


@guards("an entry point the prompt declares as a function must be a function in the code: a class there does not "
        "answer the test's .startswith(...) on candidate(x)")
def test_a_class_entry_point_does_not_answer_the_tests_methods():
    values, component = score({"test": GREET_TEST, "entry_point": "greet"}, [GREET_CLASS, GREET_RIGHT],
                              prompt="def greet(name):\n    \"\"\"'Hello, <name>!'\"\"\"\n")
    assert values == [0.0, 1.0], component.last_details
    values, component = score({"test": GREET_TEST, "entry_point": "greet"}, [GREET_CLASS, GREET_RIGHT])
    assert values == [0.0, 1.0], component.last_details


LETTERS_TESTS = ["assert vowels('banana').count('a') == 3", "assert vowels('sky') == ''",
                 "assert greet('Bob').startswith('Hello, Bob')"]
LETTERS_CLASSES = '''
class vowels:
    def __init__(self, text):
        self.text = text
    def count(self, letter):
        return 3
    def __eq__(self, other):
        return True
class greet:
    def __init__(self, name):
        pass
    def startswith(self, prefix):
        return True
'''
LETTERS_RIGHT = "def vowels(text):\n    return ''.join(c for c in text if c in 'aeiou')\n" \
                "def greet(name):\n    return 'Hello, ' + name + '!'\n"
KODCODE_CLASS_TESTS = "from solution import vowels, greet\n\n" \
                      "def test_vowels():\n    assert vowels('banana').count('a') == 3\n\n" \
                      "def test_greet():\n    assert greet('Bob').startswith('Hello, Bob')\n"
CLASS_TESTS = ["c = Counter(2)\nc.inc()\nassert c.value() == 3", "assert isinstance(make(), shape)",
               "assert shape(4).sides() == 4"]
CLASS_RIGHT = '''
class Counter:
    def __init__(self, n):
        self.n = n
    def inc(self):
        self.n += 1
    def value(self):
        return self.n
class shape:
    def __init__(self, n=4):
        self.n = n
    def sides(self):
        return self.n
def make():
    return shape()
'''


@guards("without an entry point too, a class where the tests expect a function answers nothing (its instance's "
        "count / startswith say yes to anything): a name is a class only where the tests spell it or use it as one")
def test_a_class_where_a_function_is_expected_fails_without_an_entry_point():
    values, component = score({"tests": LETTERS_TESTS}, [LETTERS_CLASSES, LETTERS_RIGHT])
    assert values == [0.0, 1.0], component.last_details
    values, component = score({"tests": KODCODE_CLASS_TESTS}, [LETTERS_CLASSES, LETTERS_RIGHT])
    assert values == [0.0, 1.0], component.last_details
    values, component = score({"tests": CLASS_TESTS}, [CLASS_RIGHT])  # CapWords, or used in isinstance
    assert values == [1.0], component.last_details


# -----------------------------------------------------------------------------------------------------------------
# 2. Arguments that are not plain data: handles, never the in-sandbox harness
# -----------------------------------------------------------------------------------------------------------------

ITER_TESTS = ["assert total(iter([1, 2, 3])) == 6", "assert total(x * x for x in range(4)) == 14",
              "assert total(range(5)) == 10",
              "def numbers():\n    yield 4\n    yield 5\nassert total(numbers()) == 9"]
ITER_RIGHT = "def total(xs):\n    return sum(xs)\n"
ALWAYS_EQUAL = '''
class _Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
def total(xs):
    return _Anything()
'''
FORGED = '''
import os, sys
def total(xs):
    frame = sys._getframe(1)
    while frame is not None:
        names = frame.f_locals
        if "token" in names and "fd" in names and "steps" in names:
            for index in range(len(names["steps"])):
                os.write(names["fd"], ("%s %d 1\\n" % (names["token"], index)).encode())
            os._exit(0)
        frame = frame.f_back
    return -1
'''
TRACER = '''
import sys
def _tracer(frame, event, arg):
    if event == "line" and "ok" in frame.f_locals and "checks" in frame.f_locals:
        frame.f_locals["checks"][0] += 1
    return _tracer
sys.settrace(_tracer)
def iter(xs):
    class _Anything:
        def __eq__(self, other):
            return True
    return _Anything()
def total(xs):
    return -1
'''
WALKER = '''
def total(xs):
    try:  # the tests' generator: its frame would lead to the trusted side's globals
        frame = xs.gi_frame
        return frame.f_globals["__builtins__"]["__import__"]("os").system("true")
    except Exception:
        return -1
'''


@guards("an iterator, a generator or a range argument crosses as a handle the code pulls through the trusted side: "
        "the tests never run in the code's interpreter (code/unsplit_tests 0), so an always-equal object, result "
        "lines forged from the caller's frame, a tracer or a rebound iter earn nothing")
def test_iterator_arguments_never_move_the_tests_into_the_sandbox():
    values, component = score({"tests": ITER_TESTS}, [ALWAYS_EQUAL, FORGED, TRACER, WALKER, ITER_RIGHT])
    assert values == [0.0, 0.0, 0.0, 0.0, 1.0], component.last_details
    assert component.last_metrics["code/unsplit_tests"] == 0


OBJECT_TESTS = '''
class Box:
    def __init__(self, items):
        self.items = items
    def first(self):
        return self.items[0]
    def __len__(self):
        return len(self.items)
    def __getitem__(self, i):
        return self.items[i]

assert describe(Box([3, 4])) == (3, 2, 4)
assert apply_twice(lambda v: v * 3, 2) == 18
seen = []
assert each(seen.append, [1, 2]) is None and seen == [1, 2]
assert same(Box([1])) is not None
'''
OBJECT_RIGHT = '''
def describe(box):
    return (box.first(), len(box), box[1])
def apply_twice(f, x):
    return f(f(x))
def each(f, xs):
    for x in xs:
        f(x)
def same(box):
    return box
'''
OBJECT_HACK = '''
def describe(box):
    try:
        return box.__class__.__init__.__globals__
    except Exception:
        return (0, 0, 0)
def apply_twice(f, x):
    return f(x)
def each(f, xs):
    return None
def same(box):
    return None
'''


@guards("a callback and an object of the tests' own class cross as handles (methods, len, items, attributes asked on "
        "the trusted side), never as the code's; their dunders stay out of the code's reach")
def test_the_tests_objects_cross_as_handles():
    values, component = score({"tests": OBJECT_TESTS}, [OBJECT_HACK, OBJECT_RIGHT])
    assert values == [0.0, 1.0], component.last_details
    assert component.last_metrics["code/unsplit_tests"] == 0


@guards("every name a step calls is a candidate for the code's function, whatever the steps before it read as "
        "attributes: a step's nodes reuse the addresses of an earlier step's freed ones, and a name told apart from an "
        "attribute's object by its id was dropped (its test failed with a NameError: the object test above, once in CI)")
def test_a_name_is_told_from_an_attributes_object_in_its_own_step():
    steps = [("setup", "\n".join(f"o{i}.a" for i in range(100))), ("setup", "pass"),
             ("test", "assert " + " + ".join(f"f{i}()" for i in range(100)) + " == 100")]
    for _ in range(20):
        assert {f"f{i}" for i in range(100)} <= _called(steps)


# -----------------------------------------------------------------------------------------------------------------
# 3. Nothing a job writes outlives it
# -----------------------------------------------------------------------------------------------------------------

CHANNEL = r'''
import os
PLACES = [os.getcwd(), os.path.dirname(os.getcwd()), "/tmp", os.environ.get("HOME", "/tmp")]
def publish(source):
    for place in PLACES:
        for call in (lambda: os.setxattr(place, "user.grpo", source.encode()),
                     lambda: os.utime(place, ns=(1234567890123, len(source))),
                     lambda: open(os.path.join(place, "left-behind.py"), "w").write(source)):
            try:
                call()
            except OSError:
                pass
def collect():
    for place in PLACES:
        for read in (lambda: os.getxattr(place, "user.grpo").decode(),
                     lambda: open(os.path.join(place, "left-behind.py")).read()):
            try:
                return read()
            except OSError:
                pass
    for place in PLACES:
        try:
            if os.stat(place).st_mtime_ns == 1234567890123:
                return "def add(a, b):\n    return a + b\n"  # the times carry the sign: the answer was seen
        except OSError:
            pass
    return None
'''


@guards("a value one job writes (an extended attribute on its directory or /tmp, the directory's times, a file) is "
        "not visible to the next job, in the same reward call or a later one")
def test_nothing_a_job_writes_is_visible_to_the_next():
    from rewards.code import sandbox

    sandbox.shutdown()
    try:
        tests = {"tests": ["assert add(1, 2) == 3", "assert add(-4, 4) == 0"]}
        values, component = score(tests, [CHANNEL + PUBLISH + f"# publisher {i}" for i in range(2)], workers=2)
        assert values == [1.0, 1.0], component.last_details
        values, component = score(tests, [CHANNEL + COLLECT + f"# collector {i}" for i in range(4)], workers=2)
        assert values == [0.0] * 4, component.last_details
    finally:
        sandbox.shutdown()

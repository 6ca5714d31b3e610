"""Only trusted objects judge: the names the tests use, the arguments they hand over and the place a job writes to.

Black-box, like tests/test_code_hacks.py: `CodeExecution(...)(prompts=..., completions=..., <row columns>)` and its
`last_details` / `last_metrics`. Each attack pairs a WRONG answer with the technique, so it must score exactly 0.0;
the honest solution in the same call must score 1.0 (the call is live).

1. Names the tests use but do not define: a module the tests read without importing it (`np.isclose`) is never the
   code's object; a helper the tests call besides the entry point (`poly`) is never the code's function; an entry
   point that is a class of the code's does not answer the test's `.startswith(...)`.
2. Arguments that are not plain data (an iterator, a generator, a range, a callback, an object of the tests' own
   class) cross as handles the code pulls through the trusted side: the tests never run where the code runs
   (`code/unsplit_tests` is 0), so an always-equal object, result lines forged from the caller's frame or a tracer
   rewriting the harness's verdict earn nothing.
3. Nothing a job writes outlives it: an extended attribute on its directory (or its parent, /tmp), or its times.
"""

from __future__ import annotations

import pytest
from test_code_hacks import COLLECT, PUBLISH  # a correct completion leaves its code behind, a wrong one runs it

from rewards.code import CodeExecution

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
    from grpokit import sandbox

    sandbox.shutdown()
    try:
        tests = {"tests": ["assert add(1, 2) == 3", "assert add(-4, 4) == 0"]}
        values, component = score(tests, [CHANNEL + PUBLISH + f"# publisher {i}" for i in range(2)], workers=2)
        assert values == [1.0, 1.0], component.last_details
        values, component = score(tests, [CHANNEL + COLLECT + f"# collector {i}" for i in range(4)], workers=2)
        assert values == [0.0] * 4, component.last_details
    finally:
        sandbox.shutdown()

"""Standard-input / standard-output code problems: the cases, and how an output is compared with the expected one.

The dominant format of open code-RL data (APPS, TACO, CodeContests, LiveCodeBench, DeepCoder's mix) gives each
problem a list of cases: an input fed to the program's standard input and the output it must print. Call-based
problems (APPS / TACO / LiveCodeBench "functional" rows with a `fn_name`) give argument lists and return values
instead. `io_cases` reads every layout below into one column, `{"cases": [{"input", "output"}...], "fn_name",
"time_limit"}`, which the data loader maps and rewards/code/reward.py scores case by case:

  APPS, TACO          `input_output`: a JSON string {"inputs": [...], "outputs": [...], "fn_name"?}
  CodeContests        `public_tests` / `private_tests` / `generated_tests`: {"input": [...], "output": [...]};
                      `time_limit` {"seconds", "nanos"}
  LiveCodeBench       `public_test_cases` (and `private_test_cases` when given as JSON): a JSON string, a list of
                      {"input", "output", "testtype": "stdin" | "functional"}; `metadata` {"func_name"}
  DeepCoder's mix     `tests`: a JSON string, a list of {"input", "output", "testtype"} or one {"inputs", "outputs",
                      "fn_name"}; `metadata` {"func_name"}
  plain               `inputs` + `outputs` columns (lists of strings), optional `fn_name`

The verdict is decided outside the sandbox: the program runs there on a case's input, and only its standard output
comes back; the expected output never enters it. `outputs_match` compares as the official checkers do: line by line
after dropping trailing spaces and blank lines at both ends (APPS strips the same), then token by token. An expected
integer is exact: the same text, or the same value spelled as a decimal (`3.0` for `3`; LiveCodeBench compares
Decimals, so `1000000008.0` never passes for `1000000007`, nor `1.000000e+06` for `1000001`). A tolerance applies
only where the expected token is not an integer (`2.5`, `1e-3`): absolute or relative error within the row's
`float_tolerance` (a problem that says 1e-4 or 1e-9), else the reward's (`code_execution.float_tolerance`, 1e-6: the
usual judge tolerance; APPS' np.allclose is looser, CodeContests' 1e-5 absolute). Not taken from APPS: its last
fallback, which compares each line's tokens as a set, so a wrong order passes.
"""

from __future__ import annotations

import ast
import json
import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from config.errors import UsageError

FLOAT_TOLERANCE = 1e-6
DEFAULT_CASE_SECONDS = 4.0  # per case where the row gives none (CodeContests' limits are for C++: Python gets 2x)
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")


def _json(value: Any, where: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as err:
            raise UsageError(f"{where} is not valid JSON ({err.msg}): give the test cases as the dataset ships them "
                             "(a JSON string or an object).") from None
    return value


def _text(value: Any) -> str:
    if isinstance(value, list):  # APPS sometimes splits an input into its lines
        return "\n".join(str(v) for v in value)
    return "" if value is None else str(value)


def _seconds(value: Any) -> float | None:
    """CodeContests' {"seconds", "nanos"}, TACO's "2 seconds", or a number."""
    if isinstance(value, dict):
        seconds = float(value.get("seconds") or 0) + float(value.get("nanos") or 0) / 1e9
        return seconds or None
    if isinstance(value, int | float):
        return float(value) or None
    if isinstance(value, str):
        found = _NUMBER.search(value)
        return float(found.group()) if found else None
    return None


def io_cases(row: dict[str, Any], where: str = "row") -> dict[str, Any] | None:
    """The row's cases in one form, or None when the row has none of the layouts above. A row whose cases are
    present but unreadable raises one UsageError naming the field."""
    fn_name = ""
    metadata = row.get("metadata")
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except json.JSONDecodeError:
            metadata = None
    if isinstance(metadata, dict):
        fn_name = str(metadata.get("func_name") or metadata.get("fn_name") or "")
    cases: list[dict[str, Any]] = []
    if row.get("input_output"):  # APPS, TACO
        data = _json(row["input_output"], f"{where}: 'input_output'")
        cases, fn_name = _pairs(data, f"{where}: 'input_output'"), str(data.get("fn_name") or fn_name)
    elif any(isinstance(row.get(k), dict) for k in ("public_tests", "private_tests", "generated_tests")):
        for key in ("public_tests", "private_tests", "generated_tests"):  # CodeContests
            tests = row.get(key) or {}
            inputs, outputs = tests.get("input") or [], tests.get("output") or []
            if len(inputs) != len(outputs):
                raise UsageError(f"{where}: '{key}' has {len(inputs)} inputs and {len(outputs)} outputs.")
            cases += [{"input": _text(i), "output": _text(o)} for i, o in zip(inputs, outputs, strict=True)]
    elif row.get("public_test_cases") or row.get("private_test_cases"):  # LiveCodeBench
        for key in ("public_test_cases", "private_test_cases"):
            value = row.get(key)
            if not value:
                continue
            if isinstance(value, str) and not value.lstrip().startswith("["):
                continue  # LiveCodeBench ships its private cases pickled: never unpickled here (see docs)
            cases += _case_list(_json(value, f"{where}: '{key}'"), f"{where}: '{key}'")
    elif isinstance(row.get("tests"), str) and row["tests"].lstrip()[:1] in "[{" and "output" in row["tests"]:
        data = _json(row["tests"], f"{where}: 'tests'")  # DeepCoder's mix
        if isinstance(data, dict):
            cases, fn_name = _pairs(data, f"{where}: 'tests'"), str(data.get("fn_name") or fn_name)
        else:
            cases = _case_list(data, f"{where}: 'tests'")
    elif isinstance(row.get("inputs"), list) and isinstance(row.get("outputs"), list):
        cases = _pairs({"inputs": row["inputs"], "outputs": row["outputs"]}, f"{where}: 'inputs' / 'outputs'")
        fn_name = str(row.get("fn_name") or fn_name)
    else:
        return None
    if any(case.get("functional") for case in cases) and not fn_name:
        raise UsageError(f"{where}: its cases call a function but the row names none: add 'fn_name' (or "
                         "metadata.func_name).")
    if not cases:
        raise UsageError(f"{where}: its test cases are empty: a problem with no case cannot be scored.")
    limit = _seconds(row.get("time_limit"))
    if limit is not None and limit < 0:  # every case would be past its limit: all-zero rewards
        raise UsageError(f"{where}: 'time_limit' is {limit:g} seconds: give a positive limit, or none for "
                         f"{DEFAULT_CASE_SECONDS:g} s per case.")
    return {"cases": [{"input": c["input"], "output": c["output"]} for c in cases], "fn_name": fn_name,
            "time_limit": limit, "float_tolerance": check_tolerance(row.get("float_tolerance"), where)}


def check_tolerance(value: Any, where: str) -> float | None:
    """A stated float tolerance (a row's `float_tolerance`, the reward's setting): a number in [0, 1), or None for
    none stated."""
    if value is None or value == "":
        return None
    try:
        tolerance = float(value)
    except (TypeError, ValueError):
        tolerance = -1.0
    if isinstance(value, bool) or not 0 <= tolerance < 1:
        raise UsageError(f"{where}: 'float_tolerance' must be a number in [0, 1) (e.g. 1e-6: the absolute or "
                         f"relative error a non-integer answer may have), not {value!r}.")
    return tolerance


def _pairs(data: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), list) or \
            not isinstance(data.get("outputs"), list):
        raise UsageError(f"{where} must hold {{\"inputs\": [...], \"outputs\": [...]}}.")
    if len(data["inputs"]) != len(data["outputs"]):
        raise UsageError(f"{where} has {len(data['inputs'])} inputs and {len(data['outputs'])} outputs.")
    call = bool(data.get("fn_name"))
    return [{"input": i if call else _text(i), "output": o if call else _text(o)}
            for i, o in zip(data["inputs"], data["outputs"], strict=True)]


def _case_list(data: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(data, list) or not all(isinstance(c, dict) and "input" in c and "output" in c for c in data):
        raise UsageError(f"{where} must be a list of {{\"input\", \"output\"}} cases.")
    out = []
    for case in data:
        functional = case.get("testtype") == "functional"
        if functional:  # LiveCodeBench: the arguments one JSON value per line, the output one JSON value
            try:
                args = [json.loads(line) for line in str(case["input"]).splitlines() if line.strip()]
                expected = json.loads(str(case["output"]))
            except json.JSONDecodeError:
                raise UsageError(f"{where}: a functional case's input / output is not JSON.") from None
            out.append({"input": args, "output": expected, "functional": True})
        else:
            out.append({"input": _text(case["input"]), "output": _text(case["output"])})
    return out


# ---- comparing outputs -----------------------------------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def _same_token(actual: str, expected: str, tolerance: float) -> bool:
    if actual == expected:
        return True
    if not (_NUMBER.fullmatch(actual) and _NUMBER.fullmatch(expected)):
        return False
    if _INTEGER.fullmatch(expected):
        # An integer answer has no tolerance: only its value spelled as a decimal (3.0), compared exactly (Decimal,
        # as LiveCodeBench does: a float would make 10**18 + 7 equal 10**18 + 8). Another integer spelling of it
        # (007, +7) is another token, as a strict checker reads it.
        if _INTEGER.fullmatch(actual):
            return False
        try:
            return Decimal(actual) == Decimal(expected)
        except (InvalidOperation, ValueError):  # an exponent past Decimal's range: no answer is spelled so
            return False
    a, e = float(actual), float(expected)
    return math.isfinite(a) and math.isfinite(e) and abs(a - e) <= tolerance * max(1.0, abs(e))


def outputs_match(actual: str, expected: str, tolerance: float = FLOAT_TOLERANCE) -> bool:
    """Whether a program's standard output answers a case (see the module docstring); `tolerance`: the absolute or
    relative error allowed where the expected token is not an integer."""
    got, want = _lines(actual), _lines(expected)
    if got == want:
        return True
    got, want = [line.split() for line in got if line.strip()], [line.split() for line in want if line.strip()]
    return len(got) == len(want) and all(
        len(g) == len(w) and all(_same_token(a, e, tolerance) for a, e in zip(g, w, strict=True))
        for g, w in zip(got, want, strict=True))


# ---- what the official checkers give a solution -----------------------------------------------------------------

# The official checkers run a solution after a preamble of imports (APPS: `from typing import List, Tuple`, `from
# math import sqrt, ...`, `from heapq import *`, `import numpy as np`...; LiveCodeBench: `from typing import *`,
# `from bisect import *`, `from functools import *`...), so a LeetCode answer annotated `List[int]` without importing
# typing, or a program calling `sqrt`, runs there. Here the same names are imported for the solution, in the
# sandbox, only those its code uses and never binds itself (an import costs time: numpy only where `np` is used).
PRELUDE = """
import sys, time, itertools, collections, math, fractions, random, heapq, bisect, copy, string, re, functools
import operator, json, statistics, datetime
import numpy as np
from itertools import accumulate, product, permutations, combinations, combinations_with_replacement, chain, groupby
from itertools import islice, count, cycle, repeat, zip_longest, pairwise, starmap
from collections import Counter, OrderedDict, deque, defaultdict, ChainMap, namedtuple
from functools import lru_cache, cache, reduce, cmp_to_key, partial
from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2, log10, inf, pi, comb, perm, factorial
from math import isqrt, lcm, hypot, atan2
from heapq import heappush, heappop, heapify, heapreplace, heappushpop, nlargest, nsmallest, merge
from bisect import bisect, bisect_left, bisect_right, insort, insort_left, insort_right
from copy import deepcopy
from fractions import Fraction
from sys import stdin, stdout, setrecursionlimit, maxsize
from string import ascii_lowercase, ascii_uppercase, ascii_letters, digits
from operator import itemgetter, attrgetter
from statistics import mean, median
from typing import List, Tuple, Dict, Set, FrozenSet, Optional, Union, Any, Callable, Iterable, Iterator, Generator
from typing import Sequence, Deque, DefaultDict
"""


def _prelude_table() -> dict[str, str]:
    """{name: the import line that binds it} from PRELUDE."""
    table = {}
    for node in ast.parse(PRELUDE).body:
        for alias in node.names:
            name = alias.asname or alias.name
            if isinstance(node, ast.ImportFrom):
                table[name] = f"from {node.module} import {alias.name}"
            else:
                table[name] = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
    return table


_PRELUDE_TABLE = _prelude_table()


def _unbound(tree: ast.AST) -> set[str]:
    """Names the code reads and never binds anywhere (in any scope, by any statement)."""
    loaded, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    return loaded - bound


def with_prelude(code: str, keep: tuple[str, ...] = ()) -> str:
    """The code with the official checkers' imports it relies on (PRELUDE) put first: after a docstring and its
    `from __future__` imports, which must stay first. `keep`: names never bound so (the function the tests call)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return code  # it fails on its own
    lines = sorted({_PRELUDE_TABLE[name] for name in _unbound(tree) - set(keep) if name in _PRELUDE_TABLE})
    if not lines:
        return code
    after = 0
    for index, node in enumerate(tree.body):
        docstring = index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and \
            isinstance(node.value.value, str)
        if not (docstring or isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            break
        after = node.end_lineno or after
    source = code.splitlines(keepends=True)
    head = "".join(source[:after])
    if head and not head.endswith("\n"):
        head += "\n"
    return head + "; ".join(lines) + "\n" + "".join(source[after:])


def solution_class(code: str) -> bool:
    """Whether the code answers as LeetCode does, with a method of `class Solution:` (APPS and LiveCodeBench then
    call `Solution().<fn_name>`)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(isinstance(node, ast.ClassDef) and node.name == "Solution" for node in tree.body)


# ---- call-based cases as tests ---------------------------------------------------------------------------------------

# APPS / TACO call-based expected values are often wrapped in a one-element list, and tuples come back where the
# ground truth has lists (verl's prime_code testing_util accepts both): the trusted side compares so.
SAME_RESULT = '''
def _same_result(actual, expected):
    def plain(value):
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        return value
    actual = plain(actual)
    return actual == expected or (isinstance(expected, list) and len(expected) == 1 and actual == expected[0])
'''
SOLUTION = "__grpo_solution"  # the one `Solution()` of a LeetCode-style answer, made once as APPS makes it


def _int_keys(value: Any) -> Any:
    """JSON makes every dict key a string: APPS turns a dict argument's / expected value's keys back into ints
    where they all are."""
    if isinstance(value, dict):
        try:
            return {int(k): v for k, v in value.items()}
        except (TypeError, ValueError):
            return value
    return value


def call_tests(fn_name: str, cases: list[dict[str, Any]], method_of_solution: bool = False) -> tuple[list[str], str]:
    """Call-based cases as asserts the split verdict runs on the trusted side: (tests, set-up code).
    `method_of_solution`: the function is a method of the code's `class Solution:` (LeetCode's layout)."""
    if not re.fullmatch(r"[A-Za-z_]\w*", fn_name or ""):
        raise UsageError(f"fn_name {fn_name!r} is not a Python function name.")
    call = f"{SOLUTION}.{fn_name}" if method_of_solution else fn_name
    tests = []
    for case in cases:
        args = list(case["input"]) if isinstance(case["input"], list) else [case["input"]]
        if args:
            args[0] = _int_keys(args[0])
        expected = case["output"]
        expected = [_int_keys(expected[0])] if isinstance(expected, list) and len(expected) == 1 and \
            isinstance(expected[0], dict) else _int_keys(expected)
        tests.append(f"assert _same_result({call}(*{args!r}), {expected!r})")
    return tests, SAME_RESULT.strip() + (f"\n{SOLUTION} = Solution()" if method_of_solution else "")

"""Code execution reward: the completion's Python against the row's tests, with a verdict its code cannot reach.

The tests, from the row's columns (the first present wins):
  * `tests`: a list of test snippets (or one string of code): what the mapped humaneval / mbpp / custom rows carry;
  * `test_list` (MBPP): a list of assert strings, with `test_setup_code` / `test_imports` run before them;
  * `test` + `entry_point` (HumanEval): a `def check(candidate): assert ...` function.

Each snippet is split with `ast` into steps, run as its framework would run it (docs/code-tasks.md, "Test layouts"):
every top-level statement that holds a check (an assert, a raise-style `if ...: raise`, a call of the tests' own
checking helper, a library's assert, `pytest.raises`) is one test; a `def` or `class` is set-up (defining a function
checks nothing), and each pytest test function (parametrize cases expanded, fixtures of the tests provided), test class
method or unittest.TestCase method becomes a test that calls it; `if __name__ == "__main__":` bodies run in place;
`from solution import f` (KodCode) takes the completion's `f`. A `check(candidate)` is unrolled with `candidate =
<entry_point>` (else the function its `check(f)` call or the prompt names), so partial credit counts its assertions one
by one. `assert True` placeholders are not counted. A test passes only when it raised nothing and at least one of its
checks ran and held (counted on the trusted side); a set-up step that raises fails the row; tests the reward cannot run
(a fixture it cannot provide, no check at all, test or set-up code that is not Python) are refused (LayoutError, a
UsageError) before a model loads, for every row of the data (check_layouts).

Where the verdict is decided: the completion's code is loaded in a sandboxed process (rewards/code/sandbox.py) that only
answers calls. The tests run here, in a helper process of the trainer's, with the code's function(s) bound to a
`Proxy`: `candidate([1, 2])` sends its arguments as plain data, the sandbox calls the function and sends back the
result as plain data (exact builtin types, decoded strictly), and the assertion (`== EXPECTED`, `abs(...) < tol`,
`math.isclose`, `set(...) ==`, a helper of the prompt applied to the result) is evaluated here on that data with
Python's own semantics. So the expected values never enter the process that runs the completion, and nothing it
does there (rebinding builtins, walking frames, exit hooks, objects equal to everything, forging result lines)
reaches the comparison. Only trusted objects judge (`judge`): the names the tests use come from the tests, the prompt
(as code), a fixed table of library aliases (`ALIASES`: `np`, `math`) or the code's functions that the row declares,
never from the code's imports or definitions, and this side imports only what `TRUSTED_MODULES` allows; an argument
that is not plain data (a callback, an iterator, an object of the tests' class) stays here as a handle the code pulls
through the pipe (`_Remote.answer`).
Every test runs here: there is no in-sandbox harness (what must not cross fails, counted in `code/unsplit_tests`).
"""

from __future__ import annotations

import ast
import builtins
import json
import logging
import os
import random
import re
import secrets
import time
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

from config.errors import UsageError
from rewards.base import RewardComponent
from rewards.code import monitor as code_monitor
from rewards.code.sandbox import SandboxError
from rewards.code.stdio import (
    DEFAULT_CASE_SECONDS,
    FLOAT_TOLERANCE,
    call_tests,
    check_tolerance,
    outputs_match,
    solution_class,
    with_prelude,
)

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
STDERR_TAIL = 500
log = logging.getLogger("grpo")


def extract_code(text: str, entry_point: str = "") -> str:
    """The code to run from a completion (reasoning in <think>…</think> is ignored first):

    * fenced blocks tagged python / py / python3 (or untagged, when no block is tagged python): the first block that
      defines `entry_point`, else the longest one; an unclosed last fence (a truncated completion) runs to the end;
    * no fence at all: the whole completion (a HumanEval-style continuation of the prompt is plain code).
    """
    text = _THINK.sub("", text)
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    if not blocks and "```" not in text:
        return text
    python = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    candidates = python or [body for lang, body in blocks if not lang]
    if not candidates:
        return ""
    if entry_point:
        for body in candidates:
            if re.search(rf"^\s*(async\s+)?def\s+{re.escape(entry_point)}\s*\(", body, re.MULTILINE):
                return body
    return max(candidates, key=len)


def _placeholder(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assert) and isinstance(node.test, ast.Constant) and bool(node.test.value)


class LayoutError(UsageError):
    """Tests the reward cannot run as their framework would (a pytest fixture it cannot provide, a `check(candidate)`
    whose candidate nobody names, no check at all): refused with one line, never scored."""


_COUNTER = "__grpo_checks__"  # the trusted side's count of checks that ran and held (see `_instrument`)
_BROAD = {"Exception", "BaseException", "AssertionError"}
_RAISES = {"raises", "assertRaises", "assertRaisesRegex"}


def _name_of(node: ast.AST) -> str:
    """`f` of `f(...)`, `raises` of `pytest.raises(...)`, `parametrize` of `pytest.mark.parametrize`."""
    node = node.func if isinstance(node, ast.Call) else node
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _raising_if(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and any(isinstance(s, ast.Raise) for s in node.body + node.orelse)


def _library_assert(node: ast.AST, helpers: set[str]) -> bool:
    """`np.testing.assert_allclose(...)`, `self.assertEqual(...)`: a library's check (raises when it fails)."""
    return isinstance(node, ast.Call) and _name_of(node).startswith("assert") and \
        not (isinstance(node.func, ast.Name) and node.func.id in helpers)


def _holds_check(node: ast.AST, checkers: set[str] = frozenset(), helpers: set[str] = frozenset()) -> bool:
    """An assert, a raise-style check, `pytest.raises`, a library's assert or a call of the tests' own checking
    helper, anywhere in `node`."""
    for n in ast.walk(node):
        if isinstance(n, ast.Assert | ast.Raise) and not _placeholder(n):
            return True
        if isinstance(n, ast.Call) and (_name_of(n) in checkers and isinstance(n.func, ast.Name)
                                        or _name_of(n) in _RAISES or _library_assert(n, helpers)):
            return True
    return False


class _Count(ast.NodeTransformer):
    """Each check, once it ran and held, adds 1 to the trusted side's counter: after an assert, a raise-style
    `if ...: raise`, a `with pytest.raises(...)`, a library's assert call; at the start of a handler of a specific
    exception (`try: f(-1) except ValueError:`, the exception the test expected)."""

    def __init__(self):
        self.helpers: set[str] = set()

    def _after(self, node: ast.stmt) -> list[ast.stmt]:
        inc = ast.parse(f"{_COUNTER}[0] += 1").body[0]
        return [node, ast.copy_location(inc, node)]

    def visit_Assert(self, node):
        return self._after(node)

    def visit_If(self, node):
        self.generic_visit(node)
        return self._after(node) if _raising_if(node) else node

    def visit_With(self, node):
        self.generic_visit(node)
        return self._after(node) if any(_name_of(i.context_expr) in _RAISES for i in node.items) else node

    def visit_Expr(self, node):
        return self._after(node) if _library_assert(node.value, self.helpers) else node

    def visit_ExceptHandler(self, node):
        self.generic_visit(node)
        types_ = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type] if node.type else []
        if types_ and not any(_name_of(t) in _BROAD for t in types_):
            node.body.insert(0, ast.parse(f"{_COUNTER}[0] += 1").body[0])
        return node


def _instrument(source: str, helpers: set[str] = frozenset()) -> str:
    """The step's source with its checks counted (`_Count`; `helpers`: the tests' own functions, whose calls are
    not a library's assert); unparsable source as it is (it fails on its own)."""
    try:
        counter = _Count()
        tree = ast.parse(source)
        counter.helpers = set(helpers)
        return ast.unparse(ast.fix_missing_locations(counter.generic_visit(tree)))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return source


_SETTLE = "__grpo_settle__"  # called after each statement of the tests: the code's in-place changes land (`_Remote.call`)


class _Settle(ast.NodeTransformer):
    """After each statement, in every block: `__grpo_settle__()`."""

    def generic_visit(self, node):
        super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                settle = [ast.copy_location(ast.parse(f"{_SETTLE}()").body[0], statement) for statement in block]
                setattr(node, field, [x for pair in zip(block, settle, strict=True) for x in pair])
        return node


def _settled(source: str) -> str:
    """The step's source with `_Settle`'s calls (unparsable source as it is: it fails on its own)."""
    try:
        return ast.unparse(ast.fix_missing_locations(_Settle().visit(ast.parse(source))))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return source


def _helpers(steps: list[tuple[str, str]]) -> set[str]:
    """The functions the tests define, in any step."""
    names: set[str] = set()
    for _, source in steps:
        try:
            names |= {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    return names


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare) or len(node.test.ops) != 1 or \
            not isinstance(node.test.ops[0], ast.Eq):
        return False
    sides = [node.test.left, *node.test.comparators]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and \
        any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)


def _runner_call(node: ast.stmt) -> bool:
    """`unittest.main()` / `pytest.main([...])`: the framework's own runner (its tests are run here instead)."""
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and _name_of(node.value) == "main" and \
        isinstance(node.value.func, ast.Attribute) and _name_of(node.value.func.value) in ("unittest", "pytest")


def _decorated(node: ast.AST, name: str) -> list[ast.expr]:
    return [d for d in getattr(node, "decorator_list", []) if _name_of(d) == name]


def _cases(function: ast.FunctionDef) -> list[tuple[list[str], str]]:
    """`@pytest.mark.parametrize` expanded: [(argument names, source that fills `__grpo_args` for one case)] (one
    entry, a loop, for argvalues that are not a literal list)."""
    cases: list[tuple[list[str], str]] = [([], "")]
    for index, decorator in enumerate(reversed(_decorated(function, "parametrize"))):
        if not isinstance(decorator, ast.Call) or len(decorator.args) < 2:
            raise LayoutError(f"test function '{function.name}': a @pytest.mark.parametrize without argnames and "
                              "argvalues cannot be expanded.")
        names_node, values = decorator.args[0], decorator.args[1]
        if isinstance(names_node, ast.Constant) and isinstance(names_node.value, str):
            names = [n.strip() for n in names_node.value.split(",") if n.strip()]
        elif isinstance(names_node, ast.List | ast.Tuple) and all(isinstance(e, ast.Constant) for e in names_node.elts):
            names = [str(e.value) for e in names_node.elts]
        else:
            raise LayoutError(f"test function '{function.name}': parametrize argnames must be a string or a list "
                              "of strings.")

        def fill(value: str, names=names) -> str:
            if len(names) == 1:
                return f"__grpo_args[{names[0]!r}] = {value}\n"
            return f"__grpo_args.update(zip({names!r}, {value}, strict=True))\n"

        if isinstance(values, ast.List | ast.Tuple):
            ones = []
            for element in values.elts:
                if isinstance(element, ast.Call) and _name_of(element) == "param":  # pytest.param(*values, id=...)
                    element = element.args[0] if len(names) == 1 and element.args else \
                        ast.Tuple(elts=list(element.args), ctx=ast.Load())
                ones.append(fill(f"({ast.unparse(element)})"))
            cases = [(done + names, source + one) for done, source in cases for one in ones]
        else:  # argvalues computed by the tests: one test that runs every case
            loop = f"__grpo_case_{index}"
            cases = [(done + names, source + f"for {loop} in {ast.unparse(values)}:\n    " + fill(loop).replace(
                "\n", "\n    ").rstrip() + "\n") for done, source in cases]
    return cases


def _fixture_value(name: str, fixtures: dict[str, ast.FunctionDef], needed_by: str, depth: int = 0) -> str:
    fixture = fixtures.get(name)
    if fixture is None or depth > 8:
        raise LayoutError(f"test function '{needed_by}' needs the pytest fixture '{name}', which the code reward "
                          "cannot provide: define it in the tests (@pytest.fixture) or drop the argument.")
    args = ", ".join(f"{a}={_fixture_value(a, fixtures, needed_by, depth + 1)}" for a in _required(fixture))
    call = f"{name}({args})"
    generator = any(isinstance(n, ast.Yield | ast.YieldFrom) for n in ast.walk(fixture))
    return f"next({call})" if generator else call


def _required(function: ast.FunctionDef, skip: int = 0) -> list[str]:
    positional = [*function.args.posonlyargs, *function.args.args][skip:]
    required = positional[:len(positional) - len(function.args.defaults)] if function.args.defaults else positional
    kwonly = [a for a, d in zip(function.args.kwonlyargs, function.args.kw_defaults, strict=True) if d is None]
    return [a.arg for a in required + kwonly]


def _test_calls(function: ast.FunctionDef, fixtures: dict, call: str, skip: int = 0) -> list[str]:
    """One step per pytest test (per parametrize case): the function called as pytest calls it."""
    steps = []
    for names, fill in _cases(function):
        extra = ", ".join(f"{a}={_fixture_value(a, fixtures, function.name)}"
                          for a in _required(function, skip) if a not in names)
        args = ", ".join(x for x in ("**__grpo_args" if names else "", extra) if x)
        steps.append(("__grpo_args = {}\n" if names else "") + fill + f"{call}({args})")
    return steps


def _class_tests(node: ast.ClassDef, fixtures: dict) -> list[str]:
    methods = [m for m in node.body if isinstance(m, ast.FunctionDef) and m.name.startswith("test")]
    if any(_name_of(base) == "TestCase" for base in node.bases):  # unittest: setUpClass, setUp, test, tearDown
        return [f"{node.name}.setUpClass()\n__grpo_case = {node.name}({m.name!r})\n__grpo_case.setUp()\n"
                f"__grpo_case.{m.name}()\n__grpo_case.tearDown()" for m in methods]
    setup = "__grpo_case.setup_method(None)\n" if any(
        isinstance(m, ast.FunctionDef) and m.name == "setup_method" for m in node.body) else ""
    return [f"__grpo_case = {node.name}()\n{setup}" + step
            for m in methods for step in _test_calls(m, fixtures, f"__grpo_case.{m.name}", skip=1)]


def _flatten(body: list[ast.stmt]) -> list[ast.stmt]:
    """Top-level statements with each `if __name__ == "__main__":` body in place (the tests run as `__main__`)
    and the frameworks' own runner calls left out."""
    out: list[ast.stmt] = []
    for node in body:
        if _is_main_guard(node):
            out.extend(_flatten(node.body))
        elif not _runner_call(node):
            out.append(node)
    return out


def _candidate_of(body: list[ast.stmt], entry_point: str, prompt: str) -> str:
    """What `check(candidate)` checks: the entry point, else the tests' own `check(<name>)` call, else the function
    the prompt defines (its last `def`)."""
    if entry_point:
        return entry_point
    for node in body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and _name_of(node.value) == "check" \
                and (node.value.args or node.value.keywords):
            return ast.unparse(node.value.args[0] if node.value.args else node.value.keywords[0].value)
    named = re.findall(r"^\s*(?:async\s+)?def\s+([A-Za-z_]\w*)\s*\(", prompt or "", re.MULTILINE)
    if named:
        return named[-1]
    raise LayoutError("the tests define check(candidate) but nothing names the candidate: give the row an "
                      "entry_point, call check(<function>) in the tests, or define the function in the prompt.")


def split_tests(tests: Any, entry_point: str = "", setup: str = "", prompt: str = "") -> list[tuple[str, str]]:
    """[(kind, source)]: kind "setup" or "test", in the order they run (see the module docstring). Raises
    LayoutError for tests it cannot run as their framework would."""
    snippets = [tests] if isinstance(tests, str) else [t for t in (tests or []) if isinstance(t, str) and t.strip()]
    steps: list[tuple[str, str]] = [("setup", setup)] if setup and setup.strip() else []
    # Tests or set-up that are not Python fail for every completion: a run of all-zero rewards that learns nothing
    for number, (what, code) in enumerate([*([("set-up code", setup)] if setup and setup.strip() else []),
                                           *(("test", snippet) for snippet in snippets)]):
        try:
            ast.parse(code)
        except SyntaxError as err:
            name = what if what != "test" else f"test {number + (0 if setup and setup.strip() else 1)}"
            raise LayoutError(f"{name} is not valid Python ({err.msg}, line {err.lineno}): every completion would "
                              "fail it and score 0; fix it or leave it out.") from None
    for snippet in snippets:
        module = ast.parse(snippet)
        top = _flatten(module.body)
        body: list[ast.stmt] = []
        for node in top:
            if isinstance(node, ast.FunctionDef) and node.name == "check" and node.args.args and \
                    _holds_check(node) and not any(isinstance(n, ast.FunctionDef) and n.name.startswith("test")
                                                   for n in top):
                param = node.args.args[0].arg
                steps.append(("setup", f"{param} = {_candidate_of(top, entry_point, prompt)}"))
                body.extend(_flatten(node.body))
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and _name_of(node.value) == "check" \
                    and isinstance(node.value.func, ast.Name) and any(
                        isinstance(n, ast.FunctionDef) and n.name == "check" for n in top):
                continue  # the `check(f)` call: its body is unrolled above
            else:
                body.append(node)
        defined = {n.name: n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        checkers: set[str] = set()
        while True:  # the tests' own checking helpers (a helper calling one checks too)
            more = {name for name, f in defined.items() if name not in checkers and _holds_check(f, checkers, set(defined))}
            if not more:
                break
            checkers |= more
        fixtures = {name: f for name, f in defined.items() if _decorated(f, "fixture")}
        called = {n.value.func.id for n in body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                  and isinstance(n.value.func, ast.Name)}  # test functions the tests call themselves
        for node in body:
            if _placeholder(node):
                continue
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Import | ast.ImportFrom):
                steps.append(("setup", ast.unparse(node)))  # a definition raises nothing: never a test itself
                if isinstance(node, ast.FunctionDef) and node.name.startswith("test") and \
                        node.name not in fixtures and node.name not in called:
                    steps.extend(("test", call) for call in _test_calls(node, fixtures, node.name))
                elif isinstance(node, ast.ClassDef) and (node.name.startswith("Test") or any(
                        _name_of(base) == "TestCase" for base in node.bases)):
                    steps.extend(("test", call) for call in _class_tests(node, fixtures))
                continue
            steps.append(("test" if _holds_check(node, checkers, set(defined)) else "setup", ast.unparse(node)))
    if snippets and not any(kind == "test" for kind, _ in steps):
        raise LayoutError("the tests hold no check the code reward can run (no assert, raise-style check, test "
                          "function or check(candidate)): a reward with nothing to check would score any code 1.0.")
    return steps


# -----------------------------------------------------------------------------------------------------------------
# The verdict, decided outside the sandbox
# -----------------------------------------------------------------------------------------------------------------


class Unsplittable(BaseException):
    """A test that would hand the code what must not cross (a module, a frame, `getattr` / `eval` and kin, an
    object of another completion): it fails, and is counted (`code/unsplit_tests`). A BaseException, so a test's
    own `except Exception` cannot swallow it."""


class SessionLost(BaseException):
    """The completion's process is gone (time limit, crash, memory): every call after this fails."""


class _CallableReply(Exception):
    """The reply names a callable of the code's: a method when an attribute was asked for, else not plain data."""


class CandidateError(Exception):
    """The candidate raised something that is not a builtin exception, or returned something that is not plain
    data: the assertion around the call fails."""


_NOT_REPLAYED = (StopIteration, StopAsyncIteration, GeneratorExit)


def _raised(name: str, message: str) -> BaseException:
    """The exception a candidate's call raised, as the test sees it: the builtin class of that name (a test may
    expect a ValueError), anything else as CandidateError. Never SystemExit / KeyboardInterrupt / StopIteration."""
    cls = getattr(builtins, name, None) if isinstance(name, str) else None
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, _NOT_REPLAYED):
        try:
            return cls(message)
        except Exception:  # noqa: BLE001 (constructors with other signatures, e.g. UnicodeDecodeError)
            pass
    return CandidateError(f"{name}: {message}")


def _sync(original: Any, after: Any) -> None:
    """Apply a call's in-place changes of a list / dict / set argument to the test's own object."""
    if type(original) is list and type(after) is list and original != after:
        original[:] = after
    elif type(original) is dict and type(after) is dict and original != after:
        original.clear()
        original.update(after)
    elif type(original) is set and type(after) is set and original != after:
        original.clear()
        original.update(after)


class _Remote:
    """The trusted side's end of the sandboxed code: every request is one round trip, during which the code may
    call back into the tests' own functions (a callback argument), which run here on plain data."""

    def __init__(self, session, deadline: float, calls: list[int]):
        self.session, self.deadline, self.calls = session, deadline, calls
        self.handles: list = []  # the tests' objects the code holds handles to (kept alive: ids stay unique)
        self.handle_of: dict[int, int] = {}
        self.pending: list[tuple[Any, Any]] = []  # in-place changes due at the end of the test's statement
        self.depth = 0  # calls of the code's in progress: a callback of the tests' runs inside one

    def settle(self) -> None:
        """Apply the in-place changes of the calls made in the statement that just ended (see `call`); not while a
        call is in progress (the statements of a callback of the tests' end inside the test's statement)."""
        if self.depth:
            return
        pending, self.pending = self.pending, []
        for original, after in pending:
            _sync(original, after)

    def own(self, tag: str, item: Any) -> Any:
        """A handle the code sent back: one of the tests' own objects (never anything of the code's)."""
        if tag == "cb" and type(item) is int and 0 <= item < len(self.handles):
            return self.handles[item]
        raise ValueError("no such object")

    def decode(self, data: Any) -> Any:
        from rewards.code import sandbox

        return sandbox.decode(data, handles=self.own)

    def encode(self, value: Any, callbacks: list | None = None) -> Any:
        """Data for the sandbox: plain data, the code's own objects (as their refs) and any other object of the
        tests' (a callback, an iterator, a generator, an instance of their class) as a handle: it stays here and
        the code's uses of it come back as requests (`answer`). What no test needs to hand over and would open this
        process to the code (a module, a frame, `getattr` / `eval` and kin) cannot cross: the test fails."""
        from rewards.code import sandbox

        def other(item: Any) -> list | None:
            if isinstance(item, RemoteObject):
                if item._remote is not self:
                    raise Unsplittable("an object of another completion")
                return ["r", item._ref]
            if isinstance(item, Proxy | _Method) or type(item) in _NOT_HANDED or \
                    any(item is f for f in _DANGEROUS) or isinstance(item, types.ModuleType):
                raise Unsplittable(f"a {type(item).__name__} cannot be handed to the code")
            key = id(item)
            if key not in self.handle_of:
                if len(self.handles) >= 100_000:
                    raise Unsplittable("too many objects handed to the code")
                self.handle_of[key] = len(self.handles)
                self.handles.append(item)
            return ["cb", self.handle_of[key]]

        from rewards.code.sandbox_worker import TooLarge

        try:
            return sandbox.encode(value, other=other)
        except (TooLarge, RecursionError):  # the code's own answer, too big to send back: the test fails
            raise CandidateError("data too large or too deeply nested to pass back") from None

    def answer(self, reply: dict) -> dict:
        """The code uses an object of the tests' (`reply`: {"callback": handle, "do", "attr", "args", "kwargs"}):
        done here, on the tests' object, the outcome as plain data or a handle (an exception by name)."""
        index, do = reply.get("callback"), reply.get("do", "call")
        target = self.handles[index] if type(index) is int and 0 <= index < len(self.handles) else None
        try:
            if target is None:
                raise CandidateError("no such object")
            args, kwargs = self.decode(reply.get("args", ["l", []])), self.decode(reply.get("kwargs", ["d", []]))
            if type(args) is not list or type(kwargs) is not dict or any(type(k) is not str for k in kwargs):
                raise CandidateError("malformed arguments")
            if do == "call":
                value = target(*args, **kwargs)
            elif do in _USES and len(args) == _USES[do][1]:
                value = _USES[do][0](target, *args)
            elif do == "getattr":
                value = _tests_attribute(target, reply.get("attr"))
            else:
                raise CandidateError("no such use")
            return {"value": self.encode(value)}
        except (Unsplittable, SessionLost, KeyboardInterrupt):
            raise
        except Exception as err:  # noqa: BLE001 (the tests' object raised: the code sees the exception by name)
            return {"raise": type(err).__name__, "message": str(err)[:200]}

    def request(self, message: dict) -> Any:
        """A request without arguments (an attribute, str()): its reply as the test sees it."""
        if time.monotonic() > self.deadline:
            raise SessionLost("time limit")
        self.calls[0] += 1
        self.depth += 1
        try:
            reply = self.session.request(message)
            while reply is not None and "callback" in reply:  # the code uses an object of the tests' meanwhile
                if time.monotonic() > self.deadline:
                    raise SessionLost("time limit")
                reply = self.session.request(self.answer(reply))
        finally:
            self.depth -= 1
        if reply is None:
            raise SessionLost("the completion's process ended")
        return self.result(reply)

    def attribute(self, ref: int, name: str) -> Any:
        """An attribute of an object of the code's: plain data, another handle, or a method to call later."""
        try:
            return self.request({"op": "getattr", "ref": ref, "attr": name})
        except _CallableReply:
            return _Method(self, ref, name)

    def result(self, reply: dict, full: bool = False) -> Any:
        try:
            if "value" in reply:
                return self.decode(reply["value"])
        except (ValueError, TypeError, RecursionError, MemoryError, OverflowError):
            raise CandidateError("returned malformed data") from None
        if "ref" in reply and type(reply["ref"]) is int:
            return RemoteObject(self, reply["ref"], str(reply.get("type", "object"))[:60], full)
        if "raise" in reply:
            raise _raised(reply["raise"], str(reply.get("message", ""))[:300])
        if "unsupported" in reply:
            raise CandidateError(f"returned {str(reply['unsupported'])[:100]}")
        if reply.get("callable") is True:
            raise _CallableReply()
        raise SessionLost("malformed reply")

    def call(self, message: dict, args: tuple, kwargs: dict, full_result: bool = False) -> Any:
        """A call of the code's function (or object): arguments out, result back, in-place changes of list /
        dict / set arguments applied to the tests' own objects: at once where it returned None (an in-place
        procedure: `sort_colors(nums)`), else once the test's statement has ended (`settle`, called after each
        statement: `k = dedupe(nums)` then `nums[:k]` sees them). So the expected value a statement computes from
        the arguments after the call (`f(xs) == sorted(xs)`, `merge(a, b) == a + b`) is computed from what the
        test passed, not from what the code turned it into."""
        mutable = any(type(a) in (list, dict, set) for a in (*args, *kwargs.values()))
        message = {**message, "args": self.encode(list(args)), "kwargs": self.encode(kwargs), "mutable": mutable}
        if time.monotonic() > self.deadline:
            raise SessionLost("time limit")
        self.calls[0] += 1
        self.depth += 1
        try:
            reply = self.session.request(message)
            while reply is not None and "callback" in reply:  # the code uses an object of the tests': done here
                if time.monotonic() > self.deadline:
                    raise SessionLost("time limit")
                reply = self.session.request(self.answer(reply))
        finally:
            self.depth -= 1
        if reply is None:
            raise SessionLost("the completion's process ended")
        try:
            value = self.result(reply, full_result)
        except _CallableReply:
            raise CandidateError("returned a function, not plain data") from None
        if mutable and "args" in reply:
            try:
                changes = list(zip(args, self.decode(reply["args"]), strict=False))
                after_kwargs = self.decode(reply.get("kwargs", ["d", []]))
                changes += [(original, after_kwargs.get(key)) for key, original in kwargs.items()]
            except (ValueError, TypeError, RecursionError, MemoryError, OverflowError):
                raise CandidateError("returned malformed data") from None
            if value is None:
                for original, after in changes:
                    _sync(original, after)
            else:
                self.pending += changes
        return value


_USES = {"iter": (iter, 0), "next": (next, 0), "len": (len, 0), "bool": (bool, 0), "str": (str, 0),
         "repr": (repr, 0), "getitem": (lambda target, key: target[key], 1),
         "contains": (lambda target, item: item in target, 1)}
_DANGEROUS = tuple(getattr(builtins, name) for name in (
    "getattr", "setattr", "delattr", "eval", "exec", "compile", "__import__", "open", "globals", "locals", "vars",
    "breakpoint", "input", "dir", "help", "exit", "quit") if hasattr(builtins, name)) + (
    object.__getattribute__, type.__getattribute__)
_NOT_HANDED = (types.FrameType, types.CodeType, types.TracebackType, types.CellType, types.MappingProxyType)


def _tests_attribute(target: Any, name: Any) -> Any:
    """An attribute of the tests' own object the code reads: only a public one that an object of a class the tests
    (or the prompt) define has, never one of a builtin type (a generator's `gi_frame` leads to this process's
    globals)."""
    cls = type(target)
    if type(name) is not str or not name or name.startswith("_") or getattr(cls, "__module__", "") != "__tests__":
        raise AttributeError(str(name)[:60])
    own = vars(target) if hasattr(target, "__dict__") else {}
    if name not in own and not any(name in vars(k) for k in cls.__mro__ if getattr(k, "__module__", "") == "__tests__"):
        raise AttributeError(name)
    return getattr(target, name)


class Proxy:
    """Stands in, on the trusted side, for a function (or class) the completion defines: a call sends its
    arguments to the sandbox and returns what comes back: plain data (exact builtin types, decoded strictly), or a
    RemoteObject (an instance the code's class made: its methods can be asked; anything else a function returns
    that is not plain data is only iterated, measured or printed)."""

    def __init__(self, remote: _Remote, name: str, is_class: bool = False):
        self._remote, self._name, self._is_class = remote, name, is_class

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._remote.call({"op": "call", "name": self._name}, args, kwargs, full_result=self._is_class)

    def __instancecheck__(self, instance: Any) -> bool:
        if not (self._is_class and isinstance(instance, RemoteObject) and instance._remote is self._remote):
            return False
        return self._remote.request({"op": "isinstance", "ref": instance._ref, "name": self._name}) is True

    def __repr__(self) -> str:
        return f"<candidate {self._name}>"


class RemoteObject:
    """An object of the completion's (an instance, a generator) held in its sandbox. Its methods, attributes,
    items, length, truth value and iteration are asked for and come back as plain data (or more RemoteObjects):
    data the code chose, as a returned value would be. Comparisons never leave this process (the other operand may
    be an expected value): it equals only itself, and `in` looks through the items it gave."""

    def __init__(self, remote: _Remote, ref: int, kind: str, full: bool = False):
        self._remote, self._ref, self._kind, self._full = remote, ref, kind, full

    def _methods(self) -> None:
        # An object a function returned is data or nothing: asking its methods would let the code's own object
        # answer a test's `.startswith(EXPECTED)`. Only instances the tests make from the code's class are asked.
        if not self._full:
            raise CandidateError(f"returned a {self._kind}, not plain data")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._methods()
        return self._remote.attribute(self._ref, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._methods()
        return self._remote.call({"op": "callref", "ref": self._ref, "attr": ""}, args, kwargs)

    def _ask(self, op: str, kind: type) -> Any:
        value = self._remote.request({"op": op, "ref": self._ref})
        if type(value) is not kind:
            raise CandidateError(f"{op}() of a {self._kind} of the code's gave {type(value).__name__}")
        return value

    def __str__(self) -> str:
        return self._ask("str", str)

    def __repr__(self) -> str:
        return self._ask("repr", str)

    def __iter__(self):
        return iter(self._ask("iter", list))

    def __len__(self) -> int:
        return self._ask("len", int)

    def __bool__(self) -> bool:
        return self._ask("bool", bool)

    def __contains__(self, item: Any) -> bool:
        return item in self._ask("iter", list)

    def __getitem__(self, key: Any) -> Any:
        self._methods()
        return self._remote.call({"op": "callref", "ref": self._ref, "attr": "__getitem__"}, (key,), {})

    def __eq__(self, other: Any) -> bool:
        return self is other

    def __ne__(self, other: Any) -> bool:
        return self is not other

    __hash__ = object.__hash__


class _Method:
    """A method of a RemoteObject, fetched as an attribute (`counter.inc`), called later."""

    def __init__(self, remote: _Remote, ref: int, name: str):
        self._remote, self._ref, self._name = remote, ref, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._remote.call({"op": "callref", "ref": self._ref, "attr": self._name}, args, kwargs)


def _step_trees(steps: list[tuple[str, str]]):
    """Each step's syntax tree (a step that does not parse is skipped: it fails when it runs)."""
    for _, source in steps:
        try:
            yield ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue


def _free_names(steps: list[tuple[str, str]]) -> list[str]:
    """Names the tests read and never bind themselves: the candidates for what the completion defines."""
    loaded, stored = set(), set()
    for tree in _step_trees(steps):
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (loaded if isinstance(node.ctx, ast.Load) else stored).add(node.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                stored.add(node.name)
            elif isinstance(node, ast.arg):
                stored.add(node.arg)
            elif isinstance(node, ast.alias):
                stored.add((node.asname or node.name).split(".")[0])
    return sorted(loaded - stored)


_PYTEST_SHIM = r"""
import builtins as _builtins, re as _re


class Failed(AssertionError):
    pass


def _decorator(*args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda function: function


class _Mark:
    def __getattr__(self, name):
        return _decorator


mark = _Mark()
fixture = _decorator


def param(*values, **kwargs):
    return values


def fail(reason="", pytrace=True):
    raise Failed(reason)


def skip(reason="", **kwargs):
    raise Failed("skipped (a skipped test checked nothing): " + str(reason))


class raises:
    def __init__(self, expected, *args, match=None, **kwargs):
        self.expected, self.match, self.value = expected, match, None
        if args:  # pytest.raises(E, f, *args): called now
            with self:
                args[0](*args[1:], **kwargs)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            raise Failed(f"DID NOT RAISE {self.expected!r}")
        if not issubclass(kind, self.expected):
            return False
        if self.match is not None and not _re.search(self.match, str(value)):
            raise Failed(f"{value!r} does not match {self.match!r}")
        self.value = value
        return True


class approx:
    def __init__(self, expected, rel=None, abs=None, nan_ok=False):
        self.expected, self.rel, self.abs = expected, rel, abs

    def _close(self, actual, expected):
        if isinstance(expected, dict):
            return _builtins.type(actual) is dict and actual.keys() == expected.keys() and \
                all(self._close(actual[k], expected[k]) for k in expected)
        if isinstance(expected, (list, tuple)):
            return isinstance(actual, (list, tuple)) and len(actual) == len(expected) and \
                all(self._close(a, e) for a, e in zip(actual, expected))
        numbers = (int, float, complex)
        if isinstance(expected, numbers) and isinstance(actual, numbers) and not isinstance(expected, bool) \
                and not isinstance(actual, bool):
            if actual == expected:
                return True
            tolerance = max(1e-6 * _builtins.abs(expected) if self.rel is None else self.rel * _builtins.abs(expected),
                            1e-12 if self.abs is None else self.abs)
            return _builtins.abs(actual - expected) <= tolerance
        return actual == expected

    def __eq__(self, actual):
        return self._close(actual, self.expected)

    __hash__ = None

    def __repr__(self):
        return f"approx({self.expected!r})"
"""


# What the trusted side may import, for the tests' own imports, the prompt's and the aliases below: an allow-list of
# the standard library's modules that compute or describe data (and `sys`, whose maxsize and float_info tests read),
# the test frameworks, and the data libraries tests use. A module outside it, and any `__main__` (importing one runs
# a program: lib2to3's, unittest's), is refused as on a machine without it. The code names no module here: nothing
# it imports or defines is imported or run on this side.
TRUSTED_MODULES = frozenset({
    "math", "cmath", "decimal", "fractions", "numbers", "statistics", "random",
    "collections", "heapq", "bisect", "array", "copy", "itertools", "functools", "operator", "graphlib", "queue",
    "typing", "typing_extensions", "dataclasses", "enum", "abc", "types", "weakref", "contextlib", "warnings",
    "string", "re", "textwrap", "unicodedata", "difflib", "json", "csv", "io", "struct", "base64", "binascii",
    "hashlib", "hmac", "zlib", "pprint", "reprlib", "keyword", "ipaddress",
    "datetime", "time", "calendar", "zoneinfo", "sys",
    "unittest", "pytest",
    "numpy", "scipy", "pandas", "sympy", "networkx", "sortedcontainers", "more_itertools", "mpmath",
})
# Libraries tests use without importing them: the official harnesses run the tests in the solution's namespace, where
# its `import numpy as np` binds them. Here such a free name of the tests is the real module of this table, imported
# on this side, whatever the code binds to that name (its own object, `unittest.mock.call`, a patched module).
# A name of a module's (`Counter`, `List`: "module:name") fills in only where the code's functions leave it free (an
# entry point is given, or the tests do not call it): a row without one may ask the code for its own `Counter` class.
ALIASES = {"np": "numpy", "pd": "pandas", "nx": "networkx", "sp": "scipy"} | {
    name: name for name in TRUSTED_MODULES if name not in ("pytest", "unittest", "typing_extensions")} | {
    name: f"collections:{name}" for name in ("Counter", "defaultdict", "OrderedDict", "deque")} | {
    name: f"typing:{name}" for name in ("List", "Dict", "Tuple", "Set", "Optional", "Any", "Union")} | {
    "Decimal": "decimal:Decimal", "Fraction": "fractions:Fraction", "reduce": "functools:reduce"}


def trusted_import_allowed(name: str) -> bool:
    """Whether the trusted side may import the module `name` (dotted): its package is in TRUSTED_MODULES and it is
    no package's `__main__`."""
    parts = name.split(".")
    return parts[0] in TRUSTED_MODULES and "__main__" not in parts


def _trusted_namespace(sink: list[str], modules: dict[str, types.ModuleType] | None = None) -> dict[str, Any]:
    """Where the tests run, in this process: builtins whose `print` writes to the job's log, whose `random` import
    is a private generator (a test's `random.seed` or `randint` leaves the trainer's random state alone) and whose
    imports are those TRUSTED_MODULES allows (`trusted_import_allowed`, for `from pkg import sub` too); `modules`:
    what an import of those names gives (`solution`: the code's functions as proxies)."""
    own = dict(vars(builtins))
    private_random = types.ModuleType("random")
    generator = random.Random(0)
    for name in dir(random):
        value = getattr(random, name)
        private_random.__dict__[name] = getattr(generator, name, value) if not name.startswith("_") else value
    real_import = builtins.__import__

    shim = types.ModuleType("pytest")  # what the tests use of pytest, the same whether pytest is installed or not
    exec(compile(_PYTEST_SHIM, "pytest_shim.py", "exec"), shim.__dict__)

    def _import(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002 (the import signature)
        if name == "random" and not level:
            return private_random
        if name == "pytest" and not level:
            return shim
        if modules and name in modules and not level:
            return modules[name]
        if level or type(name) is not str or not trusted_import_allowed(name) or any(
                type(item) is not str or not trusted_import_allowed(f"{name}.{item}") for item in fromlist or ()):
            raise ImportError(f"{name!r} is not importable where the tests run (rewards/code/reward.py TRUSTED_MODULES)")
        return real_import(name, globals, locals, fromlist, level)

    def _print(*args, sep=" ", end="\n", **_):
        if len(sink) < 200:
            sink.append(sep.join(str(a) for a in args)[:500])

    own.update(__import__=_import, print=_print)
    return {"__name__": "__tests__", "__builtins__": own}


def _called(steps: list[tuple[str, str]]) -> set[str]:
    """Names the tests call or pass on (`add(1, 2)`, `candidate = add`), not those they only read attributes of
    (`np.isclose`: a module, never the code's function)."""
    names = set()
    for tree in _step_trees(steps):
        # per tree: an id is an address, and a later step's nodes reuse the addresses of an earlier step's freed ones
        bases = {id(node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)}
        names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                  and id(n) not in bases}
    return names


SOLUTION_MODULE = "solution"  # what tests import the completion as (KodCode's pytest rows: `from solution import f`)


def _from_solution(steps: list[tuple[str, str]]) -> tuple[list[str], bool]:
    """The names the tests take from the completion as a module: `from solution import f, g as h` (f, g), and the
    attributes they read of `import solution [as s]` (`s.f`); and whether they import all of it (`import *`)."""
    names: list[str] = []
    star = False
    modules = set()  # over every step: `import solution` is a step of its own (split_tests), `solution.f` a later one
    trees = list(_step_trees(steps))
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == SOLUTION_MODULE and not node.level:
                names += [a.name for a in node.names if a.name != "*"]
                star = star or any(a.name == "*" for a in node.names)
            elif isinstance(node, ast.Import):
                modules |= {a.asname or a.name for a in node.names if a.name == SOLUTION_MODULE}
    for tree in trees:
        names += [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                  and n.value.id in modules]
    return list(dict.fromkeys(names)), star


def _used_as_class(name: str, steps: list[tuple[str, str]]) -> bool:
    """Whether the tests treat `name` as a class: spelled as one (CapWords, PEP 8) or used as one (`isinstance(x,
    name)`). Any other name the tests call expects a function, and a class of the code's there answers nothing (its
    instance's `startswith` / `count` could say yes to whatever a test asks of a returned value)."""
    if name[:1].isupper():
        return True
    for tree in _step_trees(steps):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name_of(node) == "isinstance" and len(node.args) == 2:
                second = node.args[1]
                if any(isinstance(k, ast.Name) and k.id == name
                       for k in (second.elts if isinstance(second, ast.Tuple) else [second])):
                    return True
    return False


def _asks_more_than(name: str, library: Any, steps: list[tuple[str, str]]) -> bool:
    """Whether the tests ask an object made by `name(...)` for an attribute `library`'s objects lack (`c =
    Counter(2)` then `c.inc()`, the variable bound only that way in all the tests): then `name` is a class the task
    asks the code for, not the library's."""
    have = set(dir(library))
    trees = list(_step_trees(steps))
    made: set[str] = set()
    other: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.NamedExpr):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                ours = isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and isinstance(
                    node.value.func, ast.Name) and node.value.func.id == name and all(
                    isinstance(t, ast.Name) for t in targets)
                (made if ours else other).update(names)
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension | ast.With | ast.AsyncWith):
                other |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    made -= other
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr not in have and (
                    isinstance(node.value, ast.Name) and node.value.id in made or
                    isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and
                    node.value.func.id == name):
                return True
    return False


def _code_classes(prompt: str) -> set[str]:
    """The classes a prompt that is code defines (parsed, not searched for in prose)."""
    try:
        return {n.name for n in ast.parse(prompt).body if isinstance(n, ast.ClassDef)} if prompt else set()
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()


def _expected_builders(steps: list[tuple[str, str]], candidates: set[str], library=lambda name: False,
                       asked: set[str] = frozenset(), known: set[str] = frozenset()) -> set[str]:
    """Of the names the tests call, those they call only to build the value another of them is checked against:
    the expected side of an equality whose other side calls another of them (`assert perms(s) ==
    list(permutations(s))`, `assertEqual(hyp(3, 4), sqrt(25))`), so they are never the code's. Where `library(name)`
    says the standard library has that function (`_stdlib_function`) and the other side calls a name of `known`
    (known to be the code's: the entry point, a stub, a function the prompt writes as code), also the expected side
    of a tolerance or an order check (`abs(hyp(3, 4) - sqrt(25)) < 1e-9`, `isclose(hyp(3, 4), sqrt(25))`,
    `hyp(3, 4) - sqrt(25) == 0`, `set(perms(s)) <= set(permutations(s))`), followed through the tests' variables
    (`expected = sqrt(25)` then `== expected`): else a wrong answer defining its own `sqrt` to agree with its `hyp`
    would pass them. Never a name of `asked` (what the task declares the code's: `def gcd` in the prompt, the entry
    point, whatever the library holds under it)."""
    trees = list(_step_trees(steps))  # kept alive: call nodes are told apart by id() below
    assigned: dict[str, list[ast.AST]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.NamedExpr) and node.value is not None:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(node.value)
                    elif isinstance(target, ast.Tuple | ast.List) and isinstance(node.value, ast.Tuple | ast.List) \
                            and len(target.elts) == len(node.value.elts):  # `expected, tol = sqrt(25), 1e-9`
                        for part, value in zip(target.elts, node.value.elts, strict=True):
                            if isinstance(part, ast.Name):
                                assigned.setdefault(part.id, []).append(value)

    def calls(node: ast.AST, seen: frozenset = frozenset()) -> list[tuple[ast.Call, bool]]:
        """(call, direct) for each call of a candidate in `node` (direct) and in what the tests assigned to the names
        it reads (not direct)."""
        found = [(n, not seen) for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id in candidates]
        for name in {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}:
            if name in assigned and name not in seen:
                for value in assigned[name]:
                    found += calls(value, seen | {name})
        return found

    def difference(node: ast.AST) -> tuple[ast.AST, ast.AST] | None:
        """(a, b) of `a - b` or `abs(a - b)`."""
        if isinstance(node, ast.Call) and _name_of(node) in ("abs", "fabs") and len(node.args) == 1:
            node = node.args[0]
        return (node.left, node.right) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) else None

    pairs: list[tuple[ast.AST, ast.AST, bool]] = []  # (actual, expected, an equality: strict)
    for tree in trees:
        for node in ast.walk(tree):
            compared = None  # the operands of a comparison, and whether it is an equality
            if isinstance(node, ast.Compare):
                compared = [node.left, *node.comparators], len(node.ops) == 1 and isinstance(node.ops[0],
                                                                                             ast.Eq | ast.NotEq)
            elif isinstance(node, ast.Call) and len(node.args) >= 2 and _name_of(node) in _ORDER_ASSERTS:
                compared = node.args[:2], False  # `assertLess(abs(a - b), 1e-9)`
            if compared:
                operands, equality = compared
                # `abs(a - b) < 1e-9`, `a - b == 0`, `-eps < a - b < eps`: a difference beside bounds of no call
                differences = [i for i, operand in enumerate(operands) if difference(operand)]
                if len(differences) == 1 and not any(calls(o) for i, o in enumerate(operands) if i != differences[0]):
                    pairs.append((*difference(operands[differences[0]]), False))
                elif len(operands) == 2:
                    pairs.append((operands[0], operands[1], equality))
            elif isinstance(node, ast.Call) and len(node.args) >= 2 and _name_of(node) in _EQUALITY_ASSERTS:
                pairs.append((node.args[0], node.args[1], True))
            elif isinstance(node, ast.Call) and len(node.args) >= 2 and _name_of(node) in _CLOSENESS_CHECKS:
                pairs.append((node.args[0], node.args[1], False))
    sides: dict[str, set[str]] = {name: set() for name in candidates}
    on_expected_side: set[int] = set()
    for actual, expected, strict in pairs:
        acting_calls, building = calls(actual), calls(expected)
        written = {call.func.id for call, _ in acting_calls}, {call.func.id for call, _ in building}
        if all(written) and all(map(library, written[0])) and written[1] & known:
            # `assert sqrt(25) == hyp(3, 4)`, `expected = sqrt(25)` then `expected == hyp(3, 4)`: the side of the
            # library's functions alone is the expected one, whichever is written first
            acting_calls, building, strict = building, acting_calls, False
        acting = {call.func.id for call, _ in acting_calls}
        if not acting:
            for call, _ in building:
                sides[call.func.id].add("actual")
            continue
        for name in acting:
            sides[name].add("actual")
        in_place = any(direct for _, direct in acting_calls)
        for call, direct in building:
            # an equality's own two sides, as written; else only a library function (a name of the code's is what
            # these checks more often ask about: `abs(area(r) - 3.14) < 0.01`, `assertEqual(expected, area(r))`)
            if call.func.id not in acting and call.func.id not in asked and (
                    (strict and direct and in_place) or (library(call.func.id) and acting & known)):
                sides[call.func.id].add("expected")
                on_expected_side.add(id(call))
    everywhere: dict[str, list[int]] = {name: [] for name in candidates}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in everywhere:
                everywhere[node.func.id].append(id(node))
    return {name for name, seen in sides.items()
            if seen == {"expected"} and all(call in on_expected_side for call in everywhere[name])}


_CLOSENESS_CHECKS = {"isclose", "allclose", "assert_almost_equal", "assert_array_almost_equal", "assertAlmostEquals"}
_ORDER_ASSERTS = {"assertLessEqual", "assertGreaterEqual", "assertLess", "assertGreater"}


# Where a name the tests build an expected value with comes from (`sqrt`, `permutations`, `reduce`): the first of
# these trusted modules that has it.
_STDLIB_FUNCTION_MODULES = ("math", "itertools", "functools", "operator", "heapq", "bisect", "statistics", "string")


def _stdlib_function(name: str, load) -> Any:
    """The function of that name in the first of _STDLIB_FUNCTION_MODULES that has one (`sqrt`, `reduce`, `merge`), or
    an iterator of itertools (`permutations`, `product`); None for anything else those modules hold under it (a
    constant such as `string.digits`, a module such as `statistics.math`, a class such as `Fraction`)."""
    import inspect

    if name.startswith("_"):
        return None
    for module in _STDLIB_FUNCTION_MODULES:
        try:
            value = getattr(load(module), name, None)
        except Exception:  # noqa: BLE001 (a module the trusted side may not import)
            continue
        if inspect.isbuiltin(value) or inspect.isfunction(value) or (
                module == "itertools" and isinstance(value, type) and hasattr(value, "__next__")):
            return value
    return None


def _stubs(prompt: str) -> set[str]:
    """The functions a prompt that is code declares for the code to write: those whose body is only a docstring,
    `pass`, `...` or `raise NotImplementedError` (a helper it defines in full stays the prompt's)."""
    try:
        tree = ast.parse(prompt)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()

    def empty(node: ast.stmt) -> bool:
        return isinstance(node, ast.Pass) or isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) or \
            isinstance(node, ast.Raise) and "NotImplementedError" in ast.unparse(node)

    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and all(empty(statement) for statement in n.body)}


_EQUALITY_ASSERTS = {"assertEqual", "assertEquals", "assertNotEqual", "assertListEqual", "assertDictEqual",
                     "assertTupleEqual", "assertSetEqual", "assertCountEqual", "assertSequenceEqual",
                     "assertAlmostEqual", "assert_equal", "assert_array_equal", "assert_allclose"}


def _truth_constant(node: ast.AST) -> bool:
    """A value a yes / no answer is compared with: True, False, None, 1 or 0 (1.0, 0.0)."""
    return isinstance(node, ast.Constant) and (node.value is None or type(node.value) is bool or (
        type(node.value) in (int, float) and node.value in (0, 1)))


def _verdict_consumers(steps: list[tuple[str, str]], code_names: set[str]) -> set[str]:
    """Of `code_names` (names the tests call, that nothing declares), the checkers: those the tests apply to what
    another of them returned (or to a parameter of the tests' own functions, which may hold it), in any spelling
    (`assert is_valid(solve(3))`, `ok = check(r)`, `self.assertTrue(...)`, `all(map(is_valid, boards))`, a helper
    that returns `check(board)`), except where that call is one side of an `==` / `!=` whose other side is an
    expected value (`decode(encode(s)) == s`: the code's to write). Bound to the code's function, a checker would let
    the code answer its own tests; only a prompt's declaration (a stub) makes such a name the code's."""
    trees = list(_step_trees(steps))
    derived = set(code_names)  # the code's names and the tests' variables that hold what they returned
    functions: dict[str, list[str]] = {}  # the tests' own functions and named lambdas: their parameters
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions[node.name] = [a.arg for a in node.args.args]
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        functions[target.id] = [a.arg for a in node.value.args.args]
    for _ in range(8):
        before = len(derived)
        for tree in trees:
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions and \
                        any(isinstance(n, ast.Name) and n.id in derived for a in node.args for n in ast.walk(a)):
                    # called on what the code returned: its parameters may hold it (`ok = lambda b: check(b)`)
                    derived |= set(functions[node.func.id])
                if isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
                    source, targets = node.iter, [node.target]
                elif isinstance(node, ast.Assign):
                    source, targets = node.value, node.targets
                elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr) and node.value is not None:
                    source, targets = node.value, [node.target]
                else:
                    continue
                if any(isinstance(n, ast.Name) and n.id in derived for n in ast.walk(source)):
                    derived |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if len(derived) == before:
            break

    def holds_derived(node: ast.AST, but: str = "") -> bool:
        return any(isinstance(n, ast.Name) and n.id in derived and n.id != but for n in ast.walk(node))

    found: set[str] = set()
    for tree in trees:
        parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            arguments = [*node.args, *(k.value for k in node.keywords)]
            if isinstance(node.func, ast.Name) and node.func.id in code_names:
                name = node.func.id
                if not any(holds_derived(a, but=name) for a in arguments):
                    continue
                parent = parents.get(id(node))
                other = None
                if isinstance(parent, ast.Compare) and len(parent.ops) == 1 and isinstance(
                        parent.ops[0], ast.Eq | ast.NotEq):
                    other = parent.comparators[0] if parent.left is node else parent.left
                elif isinstance(parent, ast.Call) and _name_of(parent) in _EQUALITY_ASSERTS and \
                        len(parent.args) >= 2 and node in parent.args[:2]:
                    other = parent.args[1] if parent.args[0] is node else parent.args[0]
                if other is not None and not _truth_constant(other) and not holds_derived(other):
                    continue  # `decode(encode(s)) == s`, `assertEqual(count(x), 2)`: an expected value, the code's
                found.add(name)
            # a code name handed on as a value to a call over what the code returned: `map(is_valid, boards)`
            passed = {a.id for a in arguments if isinstance(a, ast.Name) and a.id in code_names} if _name_of(
                node) not in ("isinstance", "issubclass") else set()  # a class checked against, not applied
            if passed and any(holds_derived(a) for a in arguments if not (isinstance(a, ast.Name) and a.id in passed)):
                found |= passed
    return found


def judge(session, steps: list[tuple[str, str]], entry: str, trusted_prefix: str, deadline: float,
          log: list[str], prompt: str = "") -> tuple[dict[int, bool], list[int], int]:
    """Run the tests here, with the completion's function(s) bound to a Proxy of its sandboxed process: ({step:
    passed}, [test steps that could not run: they failed], calls made). The expected values never leave this
    process, and only trusted objects judge. Every name the tests use resolves from the tests themselves (their
    imports, definitions and set-up), the prompt when it is code (its helpers, HumanEval's `poly`), ALIASES (`np`,
    `math`: the real module, imported here) or builtins, or is the code's function, and only where something declares
    it: the entry point; what the tests import from `solution` (the completion as a module); without an entry
    point, the stubs a code prompt declares, and else the names the tests call, except a checker they call on what
    another of them returned (`_verdict_consumers`). Never from the code's imports or definitions: its source is not
    read here, and what it binds to any other name never reaches this side. A class is bound only where the tests
    expect one (`_used_as_class`, or the prompt declares it with `class`); an entry point, a name the prompt
    (`prompt`, code or text) declares with `def`, and any other name the tests call must be a function in the code:
    a class or an object there is not bound (its tests fail). Methods are asked only of objects the tests make from
    the code's class."""
    solution = types.ModuleType(SOLUTION_MODULE)  # `from solution import f`: the code's functions, as proxies
    namespace = _trusted_namespace(log, {SOLUTION_MODULE: solution})
    if trusted_prefix:  # the dataset's own prompt (helpers such as HumanEval's `poly`): trusted, it wins over the code's
        try:
            statements = ast.parse(trusted_prefix).body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            statements = []
        for statement in statements:  # one at a time: an import refused here leaves the helpers after it
            try:
                exec(compile(ast.Module(body=[statement], type_ignores=[]), "prompt.py", "exec"), namespace)
            except Exception:  # noqa: BLE001 (a prompt that is only a signature may not run on its own)
                continue
    free = _free_names(steps)
    called = _called(steps)
    stubs = _stubs(trusted_prefix) if trusted_prefix else set()
    load = namespace["__builtins__"]["__import__"]

    def alias(name: str) -> None:  # a library the tests use without importing it (MBPP's `math`, EvalPlus's `np`)
        module, _, attribute = ALIASES[name].partition(":")
        try:
            value = load(module, fromlist=["_"] if "." in module else ())
            value = getattr(value, attribute) if attribute else value
        except Exception:  # noqa: BLE001 (not installed here: the name stays unbound, its tests fail)
            return
        if attribute and _asks_more_than(name, value, steps):
            return  # `c = Counter(2); c.inc()`: the tests' own class of that name, which the code writes
        namespace[name] = value

    functions = set(re.findall(r"\bdef\s+([A-Za-z_]\w*)\s*\(", prompt or ""))
    classes = set(re.findall(r"\bclass\s+([A-Za-z_]\w*)\b", prompt or ""))
    imported, star = _from_solution(steps)  # named by the tests' own imports: the code's, whatever else binds them
    # declared as code (a stub, a class of the prompt's code), not named in prose ("the class Counter is handy")
    declared_by_prompt = stubs | _code_classes(trusted_prefix) | set(imported) | {entry}
    for name in free:
        # A module (`np`, `math`) the tests call is the code's only when it is the entry point; a module's name
        # (`Counter`, `deque`, `Fraction`) only when the prompt declares it or the tests import it from the solution:
        # else the code would build the expected value the tests compare its answer with (`== Counter({...})`).
        if name in ALIASES and name not in namespace and (
                name not in called and name != entry if ":" not in ALIASES[name] else name not in declared_by_prompt):
            alias(name)
    if entry:
        functions |= {entry} - classes
        wanted = [entry]
    unbound = [n for n in free if n in called and (n not in namespace or n in stubs) and n not in vars(builtins)]

    # The prompt's own words: MBPP's quotes the tests, whose names say nothing of what the task asks for.
    quoted = {line.strip() for _, source in steps for line in source.splitlines() if line.strip()}
    words = "\n".join(line for line in (prompt or "").splitlines() if line.strip() not in quoted)

    def in_prompt(pattern: str) -> set[str]:
        return {n for n in unbound
                if re.search(pattern.replace("NAME", re.escape(n)), words, re.IGNORECASE | re.MULTILINE)}

    # What the task declares the code's (a stub, `from solution import f`, the entry point; in the prompt `def gcd`,
    # `` `gcd` ``, or `gcd(` where it is asked for, `Write gcd(a, b) and lcm(a, b)`, not inside a formula, `lcm(a, b)
    # = a*b / gcd(a, b)`, which says what the expected value is) is never the library's; outside an equality's own
    # expected side neither is a name the prompt mentions at all, in any case, as a word or its plural (`factorials`,
    # `Remainder`). A function the prompt writes as code (`Write hyp(a, b)`) is the code's side of a check.
    declared_names = stubs | set(imported) | ({entry} - {""})
    named = in_prompt(r"\bNAME(e?s)?\b")
    builders = _expected_builders(steps, set(unbound) | declared_names,
                                  asked=in_prompt(r"\bdef\s+NAME\b|`NAME`|(?:^|[^=+\-*/%^()<>|&\s])\s*\bNAME\s*\(")
                                  | declared_names,
                                  known=in_prompt(r"\bdef\s+NAME\b|\bNAME\s*\(|`NAME`") | declared_names,
                                  library=lambda name: name not in named and _stdlib_function(name, load) is not None)
    for name in builders:  # `perms(s) == list(permutations(s))`: the expected value is the standard library's
        library = _stdlib_function(name, load)
        if library is not None:
            namespace[name] = library
    if not entry or star:  # `from solution import *` hands the tests every name of the code's they call
        unbound = [n for n in unbound if n not in builders]  # never the code's, whatever the library holds
        declared = [n for n in unbound if n in stubs]
        if declared and not star:
            unbound = declared
        else:
            unbound = [n for n in unbound if n not in _verdict_consumers(steps, set(unbound) - set(declared))]
        wanted = [entry] + [n for n in unbound if n != entry] if entry else unbound
    wanted += [name for name in imported if name not in wanted]
    for name in free:
        if name in ALIASES and ":" in ALIASES[name] and name not in wanted and name not in namespace:
            alias(name)
    calls = [0]
    remote = _Remote(session, deadline, calls)
    described = session.names(wanted) if wanted else {}
    for name in wanted:  # only what was asked for, and never over a name the prompt or the tests' set-up bound
        found = described.get(name) if isinstance(described, dict) else None
        if type(found) is not list or not found or type(found[0]) is not str:
            continue
        if found[0] == "call":
            proxy = Proxy(remote, name)
        elif found[0] == "class" and name not in functions and (name in classes or _used_as_class(name, steps)):
            proxy = Proxy(remote, name, is_class=True)
        else:  # data or an object of the code's, or a class where a function is expected: it answers nothing
            log.append(f"'{name}' is not a function in the code ({str(found[0])[:20]})")
            continue
        if name in imported:
            setattr(solution, name, proxy)
        if name == entry or name not in imported or name in free:
            namespace[name] = proxy
    results: dict[int, bool] = {}
    unsplit: list[int] = []
    helpers = _helpers(steps)
    counter = namespace[_COUNTER] = [0]
    namespace[_SETTLE] = remote.settle
    for index, (kind, source) in enumerate(steps):
        try:
            before = counter[0]
            try:
                exec(compile(_settled(_instrument(source, helpers)), f"test_{index}", "exec"), namespace)
            finally:
                remote.settle()
            ok = counter[0] > before  # a test passes only when a check of it ran and held
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # SessionLost, AssertionError, a candidate's exception, a test's SystemExit
            ok = False
            log.append(f"{kind} {index} failed: {type(err).__name__}: {str(err)[:200]}")
            if isinstance(err, Unsplittable):  # it would hand the code what must not cross: failed, counted
                unsplit.append(index)
            if kind == "setup":  # the tests' own set-up failed: what they check is not there, the row fails
                log.append("set-up failed")
                tests = [i for i, (k, _) in enumerate(steps) if k == "test"]
                return {i: False for i in tests}, tests if unsplit else [], calls[0]
        if kind == "test":
            results[index] = ok
            if not ok and counter[0] == before and not (log and log[-1].startswith(f"test {index} failed")):
                log.append(f"test {index} failed: no check of it ran")
    return results, unsplit, calls[0]


JUDGE_GRACE = 5.0  # seconds a completion's judging may take to start (a fresh helper process, a sandbox start)
JUDGE_SLACK = 1.0  # seconds past `timeout` from its sandbox job's start: the tests' last work, the way back


def judge_in_sandbox(code: str, steps: list, entry: str, prefix: str, timeout: float, memory_mb: int,
                     prompt: str = "") -> dict:
    """One completion, in the helper process: load its code in a sandbox and run the tests here on its answers
    (`judge`; `prompt`: the row's prompt, which may declare the functions). JSON-able for the way back."""
    from rewards.code import sandbox

    steps = [(str(kind), str(source)) for kind, source in steps]
    limits = sandbox.Limits(timeout=timeout, memory_mb=memory_mb)
    start = time.monotonic()
    log: list[str] = []
    results: dict[int, bool] = {}
    unsplit: list[int] = []
    status = ""
    with sandbox.serve(limits) as session:
        loaded = session.load(code)
        if loaded and loaded.get("loaded"):
            results, unsplit, _ = judge(session, steps, entry, prefix, start + timeout, log, str(prompt or ""))
            if "set-up failed" in log:
                status = "set-up failed (the tests' own set-up raised)"
        elif loaded and "load" in loaded:
            log.append(f"loading failed: {loaded['load']}: {loaded.get('message', '')}")
            status = "exited before its tests" if loaded["load"] == "SystemExit" else \
                f"crashed before its tests ({str(loaded['load'])[:60]})"
        ended_early = session.ended or not (loaded and loaded.get("loaded"))
    run = session.result
    if run.timed_out:
        status = "timeout"
    elif ended_early and not status:
        status = "exited before its tests" if run.returncode == 0 else f"crashed (exit code {run.returncode})"
    stderr = "\n".join(x for x in (run.stderr.strip(), *log) if x)
    return {"results": sorted(results.items()), "status": status, "stderr": clean_tail(stderr),
            "unsplit": len(unsplit), "events": sorted(run.events)}


def _decode(data: Any) -> Any:
    from rewards.code import sandbox

    return sandbox.decode(data)


# The in-program harness, for an external sandbox service only (SandboxFusion: the whole program runs there, verdict
# included). Every harness function is bound before the completion loads; results go to the fd
# named on stdin's first line, one line per test tagged with the token on its second; a test that reports twice, or 0 anywhere, failed.
_HARNESS = r"""
def _harness(solution, steps, _os=__import__("os"), _sys=__import__("sys"), _exec=exec, _compile=compile,
             _str=str, _type=type, _enumerate=enumerate, _base=BaseException, _print=print):
    fd, token = int(_sys.stdin.readline()), _sys.stdin.readline().strip()
    write = _os.write
    namespace = {"__name__": "solution"}
    _exec(_compile(solution, "solution.py", "exec"), namespace)
    checks = namespace["__grpo_checks__"] = [0]
    for index, (kind, source) in _enumerate(steps):
        try:
            before = checks[0]
            _exec(_compile(source, "test_" + _str(index), "exec"), namespace)
            ok = 1 if checks[0] > before else 0
        except _base as err:
            ok = 0
            _print(kind, index, "failed:", _type(err).__name__, file=_sys.stderr)
            if kind == "setup":
                for other, (other_kind, _) in _enumerate(steps):
                    if other_kind == "test":
                        write(fd, (token + " " + _str(other) + " 0\n").encode())
                return
        if kind == "test":
            write(fd, (token + " " + _str(index) + " " + _str(ok) + "\n").encode())

_harness(__SOLUTION__, __STEPS__)
"""


def harness_program(solution: str, steps: list[tuple[str, str]]) -> str:
    """The program that runs `steps` (their checks counted: `_instrument`) on `solution` in one process."""
    helpers = _helpers(steps)
    counted = [[kind, _instrument(source, helpers) if kind != "skip" else source] for kind, source in steps]
    return _HARNESS.replace("__SOLUTION__", repr(solution)).replace("__STEPS__", repr(counted))


def count_passed(channel: str, token: str, steps: list[tuple[str, str]]) -> dict[int, bool]:
    """{test step: passed} from the harness's lines carrying `token`: a step reported more than once, or with 0
    anywhere, failed (a line written by the code itself cannot turn a failure into a pass)."""
    tests = {i for i, (kind, _) in enumerate(steps) if kind == "test"}
    seen: dict[int, list[str]] = {}
    for line in channel.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == token and parts[2] in ("0", "1") and parts[1].isdigit():
            seen.setdefault(int(parts[1]), []).append(parts[2])
    return {i: v == ["1"] for i, v in seen.items() if i in tests}


_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_tail(text: str, size: int = 0) -> str:
    """The tail kept for logs: control characters and terminal escapes removed (a log viewer must not run them)."""
    text = _CONTROL.sub("", text)
    return text[-(size or STDERR_TAIL):]


@dataclass
class CodeExecution(RewardComponent):
    """Runs the completion's Python against the row's tests: the fraction of tests passed (`partial_credit` true)
    or 1.0 only when all pass. 0.0 for no code, a syntax error, a crash before the tests, or a run past `timeout`
    seconds; None when the row has no tests or the sandbox itself fails (the sample is dropped, not punished).

    The verdict is decided where the completion's code cannot reach it: the code runs in a sandbox
    (rewards/code/sandbox.py) and only answers calls (`candidate(3)` -> 7) with plain data; the tests, with their
    expected values, run in a helper process on those answers; the tests' own objects (a callback, an iterator) stay
    there as handles, and what must not cross fails, counted in `code/unsplit_tests`. The code: the first ```python block defining the entry point, else the longest block,
    else the whole completion; with the function's prompt known (HumanEval: `code_prompt`), the prompt goes first,
    so a continuation (the body only) and a restated function both run, and the prompt's own helpers are the ones
    the tests use. The hack monitor (rewards/code/monitor.py) flags code that reaches for what a solution never
    needs (`code/hack_suspected`); `zero_suspected` scores flagged completions 0. `require_sandbox` refuses to
    run code where this machine cannot isolate it. Completions run in parallel, `workers` at a time (0 = one per
    core this process may use (CPU affinity, cgroup quota), divided among the ranks of this node). `sandbox_url`: send them to a
    SandboxFusion service instead (the whole program runs there, verdict included: the split verdict needs the
    local sandbox). Per completion, `last_details` keeps passed / total / status / suspected / stderr tail of the
    latest call; `last_metrics` the call's code/hack_suspected (share of completions flagged) and
    code/unsplit_tests. `float_tolerance`: the absolute or relative error a standard-output answer that is not an
    integer may have, where the row states none (its `float_tolerance`); integers are always exact.

    Example: tests ["assert add(1, 2) == 3", "assert add(0, 0) == 0"], completion
    "```python\\ndef add(a, b):\\n    return a + b\\n```" -> 1.0; "def add(a, b): return 3" -> 0.5
    """

    name: ClassVar[str] = "code_execution"
    needs: ClassVar[tuple[str, ...]] = ("tests",)
    timeout: float = 10.0
    partial_credit: bool = True
    workers: int = 0
    memory_mb: int = 1024
    sandbox_url: str = ""
    zero_suspected: bool = False
    require_sandbox: bool = False
    float_tolerance: float = FLOAT_TOLERANCE

    def __post_init__(self):
        self.last_details: list[dict[str, Any]] = []
        self.last_metrics: dict[str, float] = {}
        self._layout_checked = False

    def check(self, source: str) -> None:
        super().check(source)
        if not 0 < self.timeout <= 600:
            raise UsageError(f"{source}: 'code_execution.timeout' must be seconds in (0, 600], not {self.timeout:g}.")
        if self.workers < 0:
            raise UsageError(f"{source}: 'code_execution.workers' must be 0 (one per core) or more, not "
                             f"{self.workers}.")
        if self.memory_mb < 64:
            raise UsageError(f"{source}: 'code_execution.memory_mb' must be 64 or more (MiB), not {self.memory_mb}.")
        if check_tolerance(self.float_tolerance, f"{source}: 'code_execution'") is None:
            raise UsageError(f"{source}: 'code_execution.float_tolerance' must be a number in [0, 1) (e.g. 1e-6), "
                             f"not {self.float_tolerance!r}.")
        if self.sandbox_url and not re.match(r"https?://[^/\s]+", self.sandbox_url):
            raise UsageError(f"{source}: 'code_execution.sandbox_url' must be an http(s):// URL of a SandboxFusion "
                             f"server, not {self.sandbox_url!r}.")
        if not self.sandbox_url:  # the run says at its start what the sandbox enforces here, once
            self._check_sandbox(source, announce_unisolated=False)

    def _check_sandbox(self, source: str, announce_unisolated: bool = True) -> None:
        from rewards.code import sandbox

        # Without namespaces a run is refused unless it allows it (check_isolation): that line says it then, or the
        # first call does; a run refused in one line does not say it twice.
        quiet = not announce_unisolated and bool(sandbox.unisolated())
        if not quiet and sandbox.log_protections_once():  # and how many completions run at once, said with it
            cores, ranks = _cores_for_this_process(), _local_ranks()
            log.info("code reward: up to %d completion(s) at a time%s", self.workers or cores,
                     " (workers)" if self.workers else f" (this process's share of the cores: {cores}, "
                     f"{ranks} process(es) on this node)")
        require = self.require_sandbox or os.environ.get("GRPO_REQUIRE_SANDBOX", "") not in ("", "0")
        if require and sandbox.missing():
            raise UsageError(f"{source}: 'code_execution.require_sandbox' is on, but this machine cannot give the "
                             f"code sandbox: {', '.join(sandbox.missing())} "
                             f"({sandbox.protections()['why'] or 'see the run log'}); run where Linux namespaces "
                             "are allowed (e.g. docker run --security-opt seccomp=unconfined, or as root), or set "
                             "sandbox_url to an external sandbox service.")

    def score(self, texts, prompts=None, tests=None, test_list=None, test=None, entry_point=None,
              test_setup_code=None, test_imports=None, code_prompt=None, io_cases=None, **_):
        io_jobs = {i: _io_of(_at(io_cases, i)) for i in range(len(texts))} if io_cases is not None else {}
        jobs = []
        for i, text in enumerate(texts):
            entry = _at(entry_point, i)
            setup = "\n".join(x for x in (_at(test_setup_code, i), "\n".join(_at(test_imports, i) or [])) if x)
            row_tests = next((t for t in (_at(tests, i), _at(test_list, i), _at(test, i)) if t), None)
            prefix = _at(code_prompt, i) or ""
            prompt = _at(prompts, i)
            if not prefix and entry and isinstance(prompt, str) and re.search(rf"def\s+{re.escape(entry)}\s*\(", prompt):
                prefix = prompt  # a raw HumanEval row (--score-completions): its prompt is the code
            named_by = prefix or (prompt if isinstance(prompt, str) else "")
            jobs.append((text, entry, setup, row_tests, prefix, named_by, io_jobs.get(i)))
        if not jobs:
            self.last_details, self.last_metrics = [], {}
            return []
        if not self._layout_checked and jobs[0][6] is None:  # tests it cannot run: refused at the first row
            self._layout_checked = True
            check_layout(jobs[0][3], jobs[0][1] or "", jobs[0][2], jobs[0][5], f"the {self.name} reward's first row")
        if not self.sandbox_url:
            self._check_sandbox(f"the {self.name} reward")
        workers = self.workers or min(_cores_for_this_process(), len(jobs))
        with ThreadPoolExecutor(max_workers=min(workers, len(jobs)), thread_name_prefix="code-exec") as pool:
            results = list(pool.map(lambda job: self._one(*job), jobs))
        self.last_details = [details for _, details in results]
        scored = [d for d in self.last_details if d.get("status") not in ("no tests",)]
        self.last_metrics = {
            "code/hack_suspected": sum(bool(d.get("suspected")) for d in scored) / max(1, len(scored)),
            "code/unsplit_tests": float(sum(d.get("unsplit", 0) for d in scored))}
        return [value for value, _ in results]

    def score_with_details(self, texts: list[str], **columns: Any) -> list[tuple[float | None, dict[str, Any]]]:
        values = self.score(texts, **columns)
        return list(zip(values, self.last_details, strict=True))

    def _one(self, text: str, entry: str, setup: str, tests: Any, prefix: str,
             named_by: str = "", io: dict | None = None) -> tuple[float | None, dict]:
        details: dict[str, Any] = {"passed": 0, "total": 0, "status": "", "stderr": "", "suspected": [],
                                   "unsplit": 0}
        code, official = None, False
        if io is not None and io.get("fn_name"):  # call-based cases: asserts on the function's answers
            code, official = extract_code(text, io["fn_name"]), True
            leetcode = solution_class(code)  # LeetCode's layout: a method of `class Solution:`, as APPS calls it
            tests, setup = call_tests(io["fn_name"], io["cases"], leetcode)
            entry, prefix = ("" if leetcode else io["fn_name"]), ""
        elif io is not None:
            return self._one_io(text, io, details)
        try:
            steps = split_tests(tests, entry or "", setup, named_by)
        except LayoutError as err:  # never scored as passed: the first row's is refused (score, check_layout)
            return 0.0, {**details, "status": "tests it cannot run", "stderr": str(err)}
        total = details["total"] = sum(1 for kind, _ in steps if kind == "test")
        if not entry and prefix:  # no entry point: the function the prompt defines and the tests call is the code's
            named = re.findall(r"^\s*(?:async\s+)?def\s+([A-Za-z_]\w*)\s*\(", prefix, re.MULTILINE)
            entry = named[-1] if named and named[-1] in _free_names(steps) else ""
        if total == 0:
            return None, {**details, "status": "no tests"}
        code = extract_code(text, entry or "") if code is None else code
        if not code.strip():
            return 0.0, {**details, "status": "no code"}
        details["suspected"] = code_monitor.scan_completion(code, prefix, entry or "")  # read as it runs
        if prefix:
            code = prefix + ("" if prefix.endswith("\n") else "\n") + code
        if official:  # the imports the official checkers give call-based answers (code_io.PRELUDE)
            code = with_prelude(code, keep=(io["fn_name"], "Solution"))
        try:
            ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
            return 0.0, {**details, "status": "syntax error", "stderr": clean_tail(f"{type(err).__name__}: {err}")}
        try:
            if self.sandbox_url:
                results, status, stderr = self._external(code, steps)
            else:
                results, status, stderr, details["unsplit"], events = self._local(code, steps, entry or "", prefix,
                                                                                      named_by)
                details["suspected"] = code_monitor.merge(details["suspected"], events)
        except SandboxError as err:
            return None, {**details, "status": "sandbox error", "stderr": clean_tail(str(err))}
        passed = sum(1 for i, (kind, _) in enumerate(steps) if kind == "test" and results.get(i))
        details.update(passed=passed, stderr=clean_tail(stderr))
        details["status"] = status or ("passed" if passed == total else "failed")
        if status == "timeout":
            return 0.0, details
        if details["suspected"] and self.zero_suspected:
            details["status"] += " (hack suspected: scored 0)"
            return 0.0, details
        if self.partial_credit:
            return passed / total, details
        return (1.0 if passed == total else 0.0), details

    def _one_io(self, text: str, io: dict, details: dict[str, Any]) -> tuple[float | None, dict]:
        """A standard-input / standard-output problem (rewards/code/stdio.py): the program runs once per case on the
        case's input, in the sandbox, and only its standard output comes back; this process compares it with the
        expected output. Each case gets the row's time limit (x2: contest limits are set for C++; else
        code_io.DEFAULT_CASE_SECONDS), all of them together at most `timeout`: a hostile completion costs the step
        no more. A case past its limit, and every case after it, fails; a crash (non-zero exit) fails its case.
        Outputs compare as code_io.outputs_match says, non-integers within the row's `float_tolerance`, else the
        reward's."""
        from rewards.code import sandbox

        cases = io["cases"]
        details["total"] = len(cases)
        code = extract_code(text, "")
        if not code.strip():
            return 0.0, {**details, "status": "no code"}
        details["suspected"] = code_monitor.scan(code, "", stdio=True)
        try:
            ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
            return 0.0, {**details, "status": "syntax error", "stderr": clean_tail(f"{type(err).__name__}: {err}")}
        code = with_prelude(code)  # the imports the official checkers give a program (code_io.PRELUDE)
        run = sandbox.SandboxFusion(self.sandbox_url).run_python if self.sandbox_url else sandbox.run_python
        per_case = min(self.timeout, 2 * io["time_limit"] if io.get("time_limit") else DEFAULT_CASE_SECONDS)
        stated = io.get("float_tolerance")  # the row's own (a problem that says 1e-4), else the reward's
        tolerance = float(stated) if isinstance(stated, int | float) and 0 <= stated < 1 else self.float_tolerance
        deadline, passed, status, stderr = time.monotonic() + self.timeout, 0, "", ""
        for number, case in enumerate(cases, 1):
            left = deadline - time.monotonic()
            if left <= 0.05:
                status = f"time limit (case {number} of {len(cases)} not run)"
                break
            limits = sandbox.Limits(timeout=min(per_case, left), memory_mb=self.memory_mb,
                                    output_bytes=max(64 * 1024, 2 * len(case["output"]) + 1024))
            try:
                execution = run(code, limits, case["input"].encode())
            except SandboxError as err:
                return None, {**details, "status": "sandbox error", "stderr": clean_tail(str(err))}
            details["suspected"] = code_monitor.merge(details["suspected"], execution.events)
            if execution.timed_out:
                status = f"time limit on case {number} of {len(cases)}"
                break
            ok = execution.returncode == 0 and not execution.truncated and \
                outputs_match(execution.stdout, case["output"], tolerance)
            passed += ok
            if shown := code_monitor.integer_answer_as_float(execution.stdout, case["output"]):
                details["suspected"] = code_monitor.merge(details["suspected"], [f"float format: {shown} for an integer"])
            if not ok and not stderr:
                stderr = execution.stderr or f"case {number}: wrong output"
        details.update(passed=passed, stderr=clean_tail(stderr))
        details["status"] = status or ("passed" if passed == len(cases) else "failed")
        if details["suspected"] and self.zero_suspected:
            details["status"] += " (hack suspected: scored 0)"
            return 0.0, details
        if self.partial_credit:
            return passed / len(cases), details
        return (1.0 if passed == len(cases) else 0.0), details

    def _local(self, code: str, steps: list[tuple[str, str]], entry: str,
               prefix: str, prompt: str = "") -> tuple[dict[int, bool], str, str, int, list[str]]:
        """({step: passed}, status ('' = by the tests), stderr, unsplit steps, the run-time monitor's events) with
        the local sandbox. The tests run in a helper process (rewards/code/sandbox.py `trusted_call`), killed at the
        deadline: whatever the code's answers make them do (a hash-colliding set, a huge number in a test's
        arithmetic), the trainer waits on a pipe and goes on."""
        from rewards.code import sandbox

        payload = {"code": code, "steps": [list(step) for step in steps], "entry": entry, "prefix": prefix,
                   "timeout": self.timeout, "memory_mb": self.memory_mb, "prompt": prompt}
        answer = sandbox.trusted_call("rewards.code.reward:judge_in_sandbox", payload, self.timeout + JUDGE_SLACK,
                                      grace=JUDGE_GRACE)
        if answer is None:
            return {}, "timeout", "the tests on its answers ran past the time limit", 0, []
        if "error" in answer:
            raise SandboxError(answer["error"])
        if "crash" in answer:
            return {}, "failed", f"the tests could not judge its answers: {answer['crash']}", 0, []
        out = answer["ok"]
        return ({int(i): bool(ok) for i, ok in out["results"]}, out["status"], out["stderr"], int(out["unsplit"]),
                list(out.get("events") or []))

    def _external(self, code: str, steps: list[tuple[str, str]]) -> tuple[dict[int, bool], str, str]:
        from rewards.code import sandbox

        limits = sandbox.Limits(timeout=self.timeout, memory_mb=self.memory_mb)
        token = secrets.token_hex(16)
        run = sandbox.SandboxFusion(self.sandbox_url).run_python(harness_program(code, steps), limits,
                                                                 f"1\n{token}\n".encode())
        results = count_passed(run.stdout, token, steps)
        status = "timeout" if run.timed_out else ""
        if not status and len(results) < sum(1 for kind, _ in steps if kind == "test"):
            status = "exited before its tests" if run.returncode == 0 else f"crashed (exit code {run.returncode})"
        return results, status, run.stderr


def _cores_for_this_process() -> int:
    """The cores this process may use (its CPU affinity, capped by a cgroup quota: the sandboxes' groups sit
    under its own), shared among the processes of this node: under torchrun / accelerate every rank scores its own
    completions, and 8 ranks x all cores of sandboxes would time out correct code."""
    from grpokit.cpu_threads import usable_cores

    return max(1, usable_cores()[0] // _local_ranks())


def _local_ranks() -> int:
    """The processes of this run on this node (torchrun / accelerate set LOCAL_WORLD_SIZE)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def check_layout(tests: Any, entry: str, setup: str, named_by: str, source: str) -> None:
    """Tests the reward cannot run as their framework would (`split_tests`' LayoutError), refused in one line."""
    try:
        split_tests(tests, entry, setup, named_by)
    except LayoutError as err:
        raise UsageError(f"{source}: {err}") from None


def check_layouts(reward_set, rows, source: str) -> None:
    """At data / reward build time: every row's tests, for a code_execution reward (see `check_layout`): a row the
    reward cannot run would score 0 for every completion, wherever it sits in the data. One-line asserts (MBPP's,
    most `tests` rows) only need parsing; other layouts are split as the reward splits them (~0.2 ms a row)."""
    if not any(isinstance(c, CodeExecution) for c in reward_set.components) or not len(rows):
        return
    names = ("id", "prompt", "tests", "test_list", "test", "entry_point", "test_setup_code", "test_imports",
             "code_prompt", "io_cases")
    present = [n for n in names if n in getattr(rows, "column_names", rows[0])]
    # a datasets.Dataset read column-wise at once (its row-by-row access costs ~0.2 ms a field)
    columns = rows.select_columns(present).to_dict() if hasattr(rows, "select_columns") else \
        {n: [r.get(n) for r in rows] for n in present}
    for i in range(len(rows)):
        row = {n: columns[n][i] for n in present}
        if _io_of(row.get("io_cases")) is not None:
            continue  # standard-input cases: no test code to lay out
        tests = next((t for t in (_at([row.get(k)], 0) for k in ("tests", "test_list", "test")) if t), None)
        setup = "\n".join(x for x in (row.get("test_setup_code"),
                                      "\n".join(_at([row.get("test_imports")], 0) or [])) if x)
        if isinstance(tests, list) and tests and not setup and all(_one_assert(t) for t in tests):
            continue
        prompt = row.get("prompt")
        named_by = row.get("code_prompt") or (prompt if isinstance(prompt, str) else "")
        ident = f" (id {row['id']})" if row.get("id") else ""
        check_layout(tests, row.get("entry_point") or "", setup, named_by, f"{source}, row {i + 1}{ident}")


def _one_assert(test: Any) -> bool:
    """A test that is one plain assert statement: it runs as written, no layout to check beyond parsing."""
    if not (isinstance(test, str) and test.lstrip().startswith("assert")):
        return False
    try:
        body = ast.parse(test).body
    except SyntaxError:
        return False
    return len(body) == 1 and isinstance(body[0], ast.Assert)


CODE_COLUMNS = ("tests", "test_list", "test", "entry_point", "test_setup_code", "test_imports", "code_prompt",
                "io_cases")


def check_isolation(config, reward_set, columns, source: str) -> None:
    """A run that would execute model-written code on this machine (a code_execution reward without sandbox_url, or
    pass@k on rows with tests: `passes_all`) is refused where the sandbox gets no mount / network / pid namespaces
    (`sandbox.unisolated()`), unless the config says `allow_unsandboxed_code`. `require_sandbox` is the reward's
    stricter demand (every essential protection, caps included), checked when the reward is built."""
    local = [c for c in reward_set.components if isinstance(c, CodeExecution) and not c.sandbox_url]
    pass_at_k = bool(config.eval_pass_k and config.enable_generation_logging and "tests" in columns)
    if not (local or pass_at_k):
        return
    from rewards.code import sandbox

    gaps = sandbox.unisolated()
    if gaps and config.allow_unsandboxed_code:
        for component in local:  # what the sandbox enforces here, said now that the run goes on
            component._check_sandbox(source)
    elif gaps:
        what = "the code_execution reward" if local else f"pass@{config.eval_pass_k} on {source}'s tests"
        why = sandbox.protections()["why"] or "see the run log"
        raise UsageError(
            f"{what} would run model-written code with NO namespaces here ({why}): not enforced: "
            f"{', '.join(gaps)}; it could reach the network and read any world-readable file. Run where Linux "
            "namespaces are allowed (docker run --security-opt seccomp=unconfined, or a seccomp profile allowing "
            f"unshare), {'set code_execution.sandbox_url to an external sandbox' if local else 'set eval_pass_k 0'}, "
            "or accept the risk with --set allow_unsandboxed_code=true.")


def passes_all(completions: list, rows: list[dict[str, Any]], timeout: float = 10.0) -> list[float]:
    """pass@k's notion of correct on code rows: 1.0 when a completion passes every test of its row, else 0.0 (a
    sandbox failure counts as not passed). `rows[i]` holds completion i's columns."""
    columns = {key: [row.get(key) for row in rows] for key in CODE_COLUMNS if key in rows[0]}
    values = CodeExecution(timeout=timeout, partial_credit=False)(completions=completions, **columns)
    return [value or 0.0 for value in values]


def _io_of(value: Any) -> dict | None:
    """A row's `io_cases` (data_loader maps them from the datasets' layouts, rewards/code/stdio.py) as a dict, or None
    for a row without (its `tests` are asserts)."""
    if not value:
        return None
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) and value.get("cases") else None


def _at(column: Any, i: int) -> Any:
    if column is None:
        return None
    value = column[i]
    if isinstance(value, str) and value.startswith("[") and value.endswith("]"):
        try:  # a list stored as a JSON string (a CSV export, a flattened column)
            parsed = json.loads(value)
            return parsed if isinstance(parsed, list) else value
        except ValueError:
            return value
    return value

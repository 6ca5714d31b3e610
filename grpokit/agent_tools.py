"""The built-in tools and environment a policy may call: `python` (our code sandbox), `calculator` (exact
arithmetic) and the `python_repl` environment (variables kept across one rollout's calls).

Each is what TRL 1.15's GRPOTrainer takes as a tool: a plain function (or an environment class's public method)
whose name, type hints and docstring become the JSON schema the chat template shows the model. Model-written code
is hostile, so `python` and `python_repl` run it only in the sandbox (rewards/code/sandbox.py: no network, no host
files, no secrets, a fresh job directory per call, time and memory caps) with the guarantees the code reward has;
the calculator evaluates a syntax tree of numbers and operators and nothing else.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from fractions import Fraction

from rewards.code.sandbox import Limits, SandboxError, run_python


class ToolError(Exception):
    """What a tool reports back to the model as a failed call (TRL counts it in `tools/failure_frequency`)."""


# ---- python: the sandbox as the model's interpreter ---------------------------------------------------------------

# Runs inside the sandbox. The cells before the last replay silently (the REPL's state), the last one runs as a
# notebook cell does: a trailing expression's value is printed. Only the last cell's output comes back.
_CELL_RUNNER = r"""
import ast, io, json, sys, traceback
_cells = json.loads(sys.stdin.read())
_g = {"__name__": "__main__", "__builtins__": __builtins__}
def _run(source, show):
    tree = ast.parse(source, "<cell>", "exec")
    last = None
    if show and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), _g)
    if last is not None:
        value = eval(compile(last, "<cell>", "eval"), _g)
        if value is not None:
            print(repr(value))
_out = sys.stdout
sys.stdout = io.StringIO()
try:
    for _source in _cells[:-1]:
        _run(_source, False)
finally:
    sys.stdout = _out
try:
    _run(_cells[-1], True)
except BaseException as _err:
    if isinstance(_err, SystemExit):
        raise
    _lines = traceback.format_exception_only(type(_err), _err)
    sys.stdout.flush()
    sys.stderr.write("".join(_lines))
    sys.exit(1)
"""

# What the tools may use (config fields tool_timeout / tool_memory_mb set them per run: configure()).
LIMITS = Limits(timeout=10.0, memory_mb=512, disk_mb=32, processes=16, output_bytes=64 * 1024)


def configure(timeout: float, memory_mb: int) -> None:
    """The run's per-call caps for the sandboxed tools."""
    global LIMITS
    LIMITS = Limits(timeout=timeout, memory_mb=memory_mb, disk_mb=LIMITS.disk_mb, processes=LIMITS.processes,
                    output_bytes=LIMITS.output_bytes)


def run_cells(cells: list[str]) -> str:
    """Run the cells in one fresh sandbox job; the last cell's output, or a ToolError with the error's last lines."""
    try:
        result = run_python(_CELL_RUNNER, LIMITS, stdin=json.dumps(cells).encode())
    except SandboxError as err:
        raise ToolError(f"the sandbox is unavailable: {err}") from None
    if result.timed_out:
        raise ToolError(f"timed out after {LIMITS.timeout:g} s")
    cut = "[the output's beginning was cut: only its last 64 KiB are kept]\n" if result.truncated else ""
    if result.returncode != 0:
        tail = [line for line in result.stderr.strip().splitlines() if line.strip()][-3:]
        what = "\n".join(line[:300] for line in tail) or f"exited with status {result.returncode}"
        output = result.stdout.strip()[-500:]  # what it printed before the error: its end, briefly
        raise ToolError(f"{output}\n{what}" if output else what)
    return cut + result.stdout


def python(code: str) -> str:
    """Run Python code and return what it prints (a final expression's value is printed too).

    Args:
        code: The Python source to run. Each call starts fresh: no variables are kept between calls.
    """
    if not isinstance(code, str):
        raise ToolError("code must be a string of Python source")
    return run_cells([code])


class PythonREPL:
    """A Python interpreter whose variables persist across one rollout's calls (TRL's environment_factory contract:
    one instance per rollout, `reset` at its start, public methods are the tools).

    Each call runs in a fresh sandbox job that first replays the rollout's earlier successful cells with their
    output discarded, so nothing outlives the job and no rollout sees another's state; code that draws random
    numbers or reads the clock sees new values on replay."""

    def __init__(self):
        self.cells: list[str] = []

    def reset(self, **row) -> None:
        self.cells = []  # a new list, never cleared in place (see python)

    def python(self, code: str) -> str:
        """Run Python code in this conversation's interpreter and return what it prints (a final expression's value
        is printed too). Variables, functions and imports from earlier calls are still defined.

        Args:
            code: The Python source to run.
        """
        if not isinstance(code, str):
            raise ToolError("code must be a string of Python source")
        cells = self.cells
        output = run_cells([*cells, code])
        # Only cells that ran without an error become state, and only in the rollout that ran them: a call the
        # guard gave up on that finishes after a reset must not reach the next rollout's interpreter.
        if cells is self.cells:
            cells.append(code)
        return output


# ---- calculator: exact arithmetic, nothing else -------------------------------------------------------------------

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION = 500  # characters
MAX_DIGITS = 1000  # of any operand or result: 10**10**9 would take the machine
_MAX_BITS = int(MAX_DIGITS * 3.33) + 1
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d,])")


def _number(value: Fraction) -> Fraction:
    # bit lengths, not str(): converting a huge integer to text is itself quadratic
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > _MAX_BITS:
        raise ToolError(f"a number with more than {MAX_DIGITS} digits")
    return value


def _evaluate(node: ast.AST, source: str) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, source)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        # a decimal literal as written ("0.1", "2.5e-400"), never through a binary float
        literal = ast.get_source_segment(source, node) or repr(node.value)
        try:
            return _number(Fraction(literal.replace("_", "")))
        except (ValueError, ZeroDivisionError):
            raise ToolError(f"not a number: {literal[:40]!r}") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand, source))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left, source), _evaluate(node.right, source)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1:
                raise ToolError("only whole-number powers are exact")
            bits = max(left.numerator.bit_length(), left.denominator.bit_length())
            if abs(right.numerator) * max(bits - 1, 0) > _MAX_BITS or abs(right.numerator) > _MAX_BITS:
                raise ToolError(f"a number with more than {MAX_DIGITS} digits")
            if left == 0 and right < 0:
                raise ToolError("division by zero")
        elif isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ToolError("division by zero")
        return _number(_BINARY[type(node.op)](left, right))
    raise ToolError("only numbers, + - * / // % ** and parentheses are allowed")


def format_number(value: Fraction) -> str:
    """An integer as it is; any other value as a decimal (up to 12 places) and, where that is not exact, as a
    fraction too."""
    if value.denominator == 1:
        return str(value.numerator)
    whole, rest = divmod(abs(value.numerator) * 10**12, value.denominator)
    digits = f"{whole % 10**12:012d}"
    text = f"{whole // 10**12}.{digits.rstrip('0') if rest == 0 else digits}"
    text = ("-" if value < 0 else "") + text
    return text if rest == 0 else f"{text}... (= {value.numerator}/{value.denominator})"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, e.g. "347 * 56" or "(2.5 + 1/3) ** 2".

    Args:
        expression: Numbers with + - * / // % ** and parentheses.
    """
    if not isinstance(expression, str):
        raise ToolError("expression must be a string such as \"347 * 56\"")
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("^", "**")
    text = _THOUSANDS.sub(lambda m: m.group().replace(",", ""), text)  # 1,000,000; any other comma is refused
    if len(text) > MAX_EXPRESSION:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {expression[:80]!r}") from None
    return format_number(_evaluate(tree, text))


BUILTIN_TOOLS = {"python": python, "calculator": calculator}
BUILTIN_ENVIRONMENTS = {"python_repl": PythonREPL}

"""Code execution reward: run the completion's Python against the row's tests in a sandbox (grpokit/sandbox.py).

The tests, from the row's columns (the first present wins):
  * `tests`: a list of test snippets (or one string of code): what the mapped humaneval / mbpp / custom rows carry;
  * `test_list` (MBPP): a list of assert strings, with `test_setup_code` / `test_imports` run before them;
  * `test` + `entry_point` (HumanEval): a `def check(candidate): assert ...` function.

Each snippet is split with `ast` into steps: every top-level statement that is an assert, or holds one (a loop of
asserts), is one test; other statements (imports, helper assignments) are set-up run before the tests that follow
them. A HumanEval `check(candidate)` is unrolled the same way with `candidate = <entry_point>`, so partial credit
counts its assertions one by one. `assert True` placeholders are not counted.

Each test runs in its own try/except; the harness writes one line per test to a pipe only it holds, tagged with a
random token, and only tagged lines count. A program that exits early (sys.exit, os._exit, SystemExit) or is
killed has not passed the tests that did not report. This stops early exits, not a program that deliberately digs
the token out of the harness's memory (the model's code and the harness share one interpreter).
"""

from __future__ import annotations

import ast
import json
import os
import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

from config.errors import UsageError
from rewards.base import RewardComponent

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
STDERR_TAIL = 500


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


def _holds_assert(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(node))


def _placeholder(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assert) and isinstance(node.test, ast.Constant) and bool(node.test.value)


def split_tests(tests: Any, entry_point: str = "", setup: str = "") -> list[tuple[str, str]]:
    """[(kind, source)]: kind "setup" or "test", in the order they run (see the module docstring)."""
    snippets = [tests] if isinstance(tests, str) else [t for t in (tests or []) if isinstance(t, str) and t.strip()]
    steps: list[tuple[str, str]] = [("setup", setup)] if setup and setup.strip() else []
    for snippet in snippets:
        try:
            module = ast.parse(snippet)
        except SyntaxError:
            steps.append(("test", snippet))  # a broken test fails for every completion: no signal, no harm
            continue
        body: list[ast.stmt] = []
        for node in module.body:
            if isinstance(node, ast.FunctionDef) and node.name == "check" and entry_point:
                steps.append(("setup", f"candidate = {entry_point}"))
                body.extend(node.body)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                    getattr(node.value.func, "id", "") == "check":
                continue  # a trailing `check(f)` call: unrolled above
            else:
                body.append(node)
        for node in body:
            if _placeholder(node):
                continue
            steps.append(("test" if _holds_assert(node) else "setup", ast.unparse(node)))
    return steps


# The program the sandbox runs. Its stdin: the result fd, then the token. The solution runs as a module named
# "solution" (its `if __name__ == "__main__":` demo code does not run).
_HARNESS = r'''
import os as _os, sys as _sys, traceback as _tb

def _harness(solution, steps):
    fd, token = int(_sys.stdin.readline()), _sys.stdin.readline().strip()
    namespace = {"__name__": "solution"}
    exec(compile(solution, "solution.py", "exec"), namespace)
    for index, (kind, source) in enumerate(steps):
        try:
            exec(compile(source, f"test_{index}", "exec"), namespace)
            ok = True
        except BaseException as err:  # SystemExit from the solution's code is a failed test too
            ok = False
            print(f"{kind} {index} failed: {type(err).__name__}: {str(err)[:200]}", file=_sys.stderr)
            if kind == "setup":
                _tb.print_exc(limit=-1)
        if kind == "test":
            _os.write(fd, f"{token} {index} {int(ok)}\n".encode())
        _sys.stdout.flush()
        _sys.stderr.flush()

_harness(__SOLUTION__, __STEPS__)
'''


def harness_program(solution: str, steps: list[tuple[str, str]]) -> str:
    return _HARNESS.replace("__SOLUTION__", repr(solution)).replace("__STEPS__", repr([list(s) for s in steps]))


def count_passed(channel: str, token: str, steps: list[tuple[str, str]]) -> tuple[int, int]:
    """(passed, reported): distinct test steps reported passed / reported at all, on lines carrying `token`."""
    tests = {i for i, (kind, _) in enumerate(steps) if kind == "test"}
    passed, reported = set(), set()
    for line in channel.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == token and parts[2] in ("0", "1") and parts[1].isdigit():
            reported.add(int(parts[1]))
            if parts[2] == "1":
                passed.add(int(parts[1]))
    return len(passed & tests), len(reported & tests)


@dataclass
class CodeExecution(RewardComponent):
    """Runs the completion's Python code against the row's tests in a sandbox: the fraction of tests passed
    (`partial_credit` true) or 1.0 only when all pass. 0.0 for no code, a syntax error, a crash before the tests, or
    a run past `timeout` seconds; None when the row has no tests or the sandbox itself fails (the sample is dropped,
    not punished). The code: the first ```python block defining the entry point, else the longest block, else the
    whole completion; with the function's prompt known (HumanEval: `code_prompt`), the prompt goes first, so a
    continuation (the body only) and a restated function (with the prompt's imports and helpers) both run.
    Completions run in parallel, `workers` at a time (0 = one per core), each in its own sandbox. `sandbox_url`:
    send them to a SandboxFusion service instead (POST {url}/run_code). Per completion, `last_details` keeps
    passed / total / status / stderr tail of the latest call.

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

    def __post_init__(self):
        self.last_details: list[dict[str, Any]] = []

    def check(self, source: str) -> None:
        super().check(source)
        if not self.sandbox_url:  # the run says at its start what the sandbox enforces here, once
            from grpokit import sandbox

            sandbox.log_protections_once()
        if not 0 < self.timeout <= 600:
            raise UsageError(f"{source}: 'code_execution.timeout' must be seconds in (0, 600], not {self.timeout:g}.")
        if self.workers < 0:
            raise UsageError(f"{source}: 'code_execution.workers' must be 0 (one per core) or more, not "
                             f"{self.workers}.")
        if self.memory_mb < 64:
            raise UsageError(f"{source}: 'code_execution.memory_mb' must be 64 or more (MiB), not {self.memory_mb}.")
        if self.sandbox_url and not re.match(r"https?://[^/\s]+", self.sandbox_url):
            raise UsageError(f"{source}: 'code_execution.sandbox_url' must be an http(s):// URL of a SandboxFusion "
                             f"server, not {self.sandbox_url!r}.")

    def score(self, texts, prompts=None, tests=None, test_list=None, test=None, entry_point=None,
              test_setup_code=None, test_imports=None, code_prompt=None, **_):
        jobs = []
        for i, text in enumerate(texts):
            entry = _at(entry_point, i)
            setup = "\n".join(x for x in (_at(test_setup_code, i), "\n".join(_at(test_imports, i) or [])) if x)
            row_tests = next((t for t in (_at(tests, i), _at(test_list, i), _at(test, i)) if t), None)
            prefix = _at(code_prompt, i) or ""
            prompt = _at(prompts, i)
            if not prefix and entry and isinstance(prompt, str) and re.search(rf"def\s+{re.escape(entry)}\s*\(", prompt):
                prefix = prompt  # a raw HumanEval row (--score-completions): its prompt is the code
            jobs.append((text, entry, setup, row_tests, prefix))
        if not jobs:
            self.last_details = []
            return []
        workers = self.workers or min(os.cpu_count() or 1, len(jobs))
        if not self.sandbox_url:
            from grpokit import sandbox

            sandbox.log_protections_once()
        with ThreadPoolExecutor(max_workers=min(workers, len(jobs)), thread_name_prefix="code-exec") as pool:
            results = list(pool.map(lambda job: self._one(*job), jobs))
        self.last_details = [details for _, details in results]
        return [value for value, _ in results]

    def score_with_details(self, texts: list[str], **columns: Any) -> list[tuple[float | None, dict[str, Any]]]:
        values = self.score(texts, **columns)
        return list(zip(values, self.last_details, strict=True))

    def _one(self, text: str, entry: str, setup: str, tests: Any, prefix: str) -> tuple[float | None, dict]:
        from grpokit import sandbox

        steps = split_tests(tests, entry or "", setup)
        total = sum(1 for kind, _ in steps if kind == "test")
        details: dict[str, Any] = {"passed": 0, "total": total, "status": "", "stderr": ""}
        if total == 0:
            return None, {**details, "status": "no tests"}
        code = extract_code(text, entry or "")
        if not code.strip():
            return 0.0, {**details, "status": "no code"}
        if prefix:
            code = prefix + ("" if prefix.endswith("\n") else "\n") + code
        try:
            ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
            return 0.0, {**details, "status": "syntax error", "stderr": f"{type(err).__name__}: {err}"[-STDERR_TAIL:]}
        token = secrets.token_hex(16)
        limits = sandbox.Limits(timeout=self.timeout, memory_mb=self.memory_mb)
        program = harness_program(code, steps)
        try:
            if self.sandbox_url:
                run = sandbox.SandboxFusion(self.sandbox_url).run_python(program, limits, f"1\n{token}\n".encode())
                channel = run.stdout
            else:
                run = sandbox.run_python(program, limits, f"{token}\n".encode(), channel=True)
                channel = run.channel.decode("utf-8", "replace")
        except sandbox.SandboxError as err:
            return None, {**details, "status": "sandbox error", "stderr": str(err)[-STDERR_TAIL:]}
        details["stderr"] = run.stderr[-STDERR_TAIL:]
        if run.timed_out:
            return 0.0, {**details, "status": "timeout"}
        passed, reported = count_passed(channel, token, steps)
        status = "passed" if passed == total else "failed"
        if reported < total:  # the tests that never reported did not pass
            status = "exited before its tests" if run.returncode == 0 else f"crashed (exit code {run.returncode})"
        details.update(passed=passed, status=status)
        if self.partial_credit:
            return passed / total, details
        return (1.0 if passed == total else 0.0), details


CODE_COLUMNS = ("tests", "test_list", "test", "entry_point", "test_setup_code", "test_imports", "code_prompt")


def passes_all(completions: list, rows: list[dict[str, Any]], timeout: float = 10.0) -> list[float]:
    """pass@k's notion of correct on code rows: 1.0 when a completion passes every test of its row, else 0.0 (a
    sandbox failure counts as not passed). `rows[i]` holds completion i's columns."""
    columns = {key: [row.get(key) for row in rows] for key in CODE_COLUMNS if key in rows[0]}
    values = CodeExecution(timeout=timeout, partial_credit=False)(completions=completions, **columns)
    return [value or 0.0 for value in values]


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

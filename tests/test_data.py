"""Datasets: each formatter on inline rows, the real files in ../shared/data through the CLI, hub-layout
directories, custom JSONL formats, and every bad input."""

import gzip
import json

import pytest
from conftest import GSM8K_FILE, HH_FILE

from config.errors import UsageError
from data_loader import (
    arithmetic_rows,
    format_gsm8k,
    format_hh_rlhf,
    format_summarize,
    format_ultrafeedback,
    format_ultrafeedback_large,
    load_grpo_dataset,
    parse_hh_transcript,
)


def test_hh_rlhf_multi_turn_keeps_every_earlier_turn():
    row = {
        "chosen": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: How do I bake bread?\n\nAssistant: Mix flour and water.",
        "rejected": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: How do I bake bread?\n\nAssistant: No.",
    }
    mapped, reason = format_hh_rlhf(row)
    assert reason is None
    assert mapped["prompt"] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "How do I bake bread?"},
    ]
    assert mapped["chosen"] == "Mix flour and water." and mapped["rejected"] == "No."
    # a transcript that ends on the human turn has no reply to compare
    assert format_hh_rlhf({"chosen": "\n\nHuman: hi", "rejected": "\n\nHuman: hi"}) == (None, "no final assistant reply")
    assert parse_hh_transcript("\n\nHuman: a\n\nAssistant: b") == [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]


def test_ultrafeedback_binarized_multi_turn():
    row = {
        "prompt": "Q2", "prompt_id": "abc",
        "chosen": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                   {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "good"}],
        "rejected": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                     {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "bad"}],
    }
    mapped, _ = format_ultrafeedback(row)
    assert mapped == {"id": "abc", "prompt": row["chosen"][:3], "chosen": "good", "rejected": "bad"}


def test_ultrafeedback_large_binarises_highest_vs_lowest():
    row = {"source": "s", "instruction": "Write a poem", "completions": [
        {"response": "mid", "overall_score": 6}, {"response": "best", "overall_score": 9},
        {"response": "worst", "overall_score": 2}]}
    mapped, _ = format_ultrafeedback_large(row)
    assert (mapped["chosen"], mapped["rejected"]) == ("best", "worst")
    tied = {"instruction": "x", "completions": [{"response": "a", "overall_score": 5}, {"response": "b", "overall_score": 5}]}
    assert format_ultrafeedback_large(tied) == (None, "all completions tied")


def test_summarize_builds_a_tldr_prompt_and_picks_the_labellers_choice():
    row = {"info": {"id": "t1", "post": "My cat ate my homework.", "title": "Help", "subreddit": "tifu"},
           "summaries": [{"text": " cat ate homework"}, {"text": "a thing happened"}], "choice": 0}
    mapped, _ = format_summarize(row)
    content = mapped["prompt"][0]["content"]
    assert content.startswith("SUBREDDIT: r/tifu\nTITLE: Help\nPOST: My cat ate my homework.")
    assert content.endswith("TL;DR summary of the post above.")
    assert (mapped["chosen"], mapped["rejected"]) == ("cat ate homework", "a thing happened")


def test_gsm8k_answer_after_hashes_without_commas():
    mapped, _ = format_gsm8k({"question": "How many?", "answer": "Work...\n#### 1,234"})
    assert mapped["answer"] == "1234" and mapped["prompt"] == [{"role": "user", "content": "How many?"}]
    assert format_gsm8k({"question": "q", "answer": "no marker"}) == (None, "no '####' final answer")


def test_arithmetic_held_out_pairs_never_appear_in_training():
    train, held_out = arithmetic_rows(500, 20, seed=3)
    assert len(held_out) == 20 and len(train) == 500
    assert not {r["question"] for r in train} & {r["question"] for r in held_out}


def test_real_hh_rlhf_file_through_the_cli(cli):
    code, out, err = cli("--dataset", "hh_rlhf", "--dataset-path", str(HH_FILE), "--model", "smollm2-135m",
                         "--dry-run", "--set", "max_samples=0")
    assert code == 0, err
    report = json.loads(out)["dataset"]
    assert report["rows"]["train"] + report["rows"]["eval"] + sum(
        sum(d.values()) for d in report["dropped"].values()) >= 390  # 400 real rows, all accounted for
    example = report["examples"][0]
    assert example["prompt"][-1]["role"] == "user" and example["chosen"] and example["rejected"]


def test_real_hh_rlhf_gzipped_local_file(tmp_path):
    gz = tmp_path / "test.jsonl.gz"
    with gzip.open(gz, "wt") as handle:
        handle.write(HH_FILE.read_text())
    train, evaluation, report = load_grpo_dataset("hh_rlhf", dataset_path=str(gz), eval_fraction=0.1)
    assert len(train) + len(evaluation) + sum(report.dropped.get("train", {}).values()) == 400
    assert set(train.column_names) == {"id", "prompt", "chosen", "rejected"}


def test_real_gsm8k_file_as_custom_data_through_the_cli(cli):
    code, out, err = cli("--custom-data", str(GSM8K_FILE), "--model", "smollm2-135m", "--dry-run",
                         "--max-samples", "100")
    assert code == 0, err
    document = json.loads(out)
    assert document["dataset"]["format"] == "qa"
    assert document["dataset"]["rows"]["train"] == 100
    assert document["rewards"]["components"] == ["accuracy", "format", "length"]  # exact answers -> 'math' preset
    assert document["dataset"]["examples"][0]["answer"].lstrip("-").isdigit()


def test_gsm8k_preset_from_a_local_jsonl(tmp_path):
    train, evaluation, report = load_grpo_dataset("gsm8k", dataset_path=str(GSM8K_FILE), max_samples=50,
                                                  max_eval_samples=10)
    assert len(train) == 50 and len(evaluation) == 10
    assert not set(train["id"]) & set(evaluation["id"])


def _hub_layout(tmp_path, subdir, split_rows):
    """A directory laid out as the hub serves it: <config>/<split>-00000-of-00001.parquet."""
    import datasets

    root = tmp_path / "hub"
    (root / subdir).mkdir(parents=True)
    for split, rows in split_rows.items():
        datasets.Dataset.from_list(rows).to_parquet(str(root / subdir / f"{split}-00000-of-00001.parquet"))
    return root


def test_ultrafeedback_from_a_hub_layout_directory(tmp_path):
    def row(i):
        return {"prompt": f"Q{i}", "prompt_id": f"id{i}",
                "chosen": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": "good"}],
                "rejected": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": "bad"}],
                "score_chosen": 8.0, "score_rejected": 2.0}
    root = _hub_layout(tmp_path, "data", {"train_prefs": [row(i) for i in range(30)],
                                          "test_prefs": [row(i) for i in range(30, 40)]})
    train, evaluation, _ = load_grpo_dataset("ultrafeedback", dataset_path=str(root))
    assert len(train) == 30 and len(evaluation) == 10  # the preset's own splits, found by name


def test_summarize_from_a_hub_layout_directory_with_its_config_subfolder(tmp_path):
    def row(i):
        return {"info": {"id": str(i), "post": f"post {i}", "title": "t", "subreddit": "r", "article": None,
                         "site": None},
                "summaries": [{"text": f"s{i}a", "policy": "p", "note": None},
                              {"text": f"s{i}b", "policy": "p", "note": None}],
                "choice": i % 2}
    root = _hub_layout(tmp_path, "comparisons", {"train": [row(i) for i in range(20)],
                                                 "validation": [row(i) for i in range(20, 25)]})
    train, evaluation, _ = load_grpo_dataset("openai_summarize", dataset_path=str(root))
    assert len(train) == 20 and len(evaluation) == 5
    assert train[0]["chosen"].startswith("s")


def _jsonl(tmp_path, rows, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.mark.parametrize(
    "rows, fmt, columns",
    [
        ([{"prompt": "p", "chosen": "c", "rejected": "r"}], "preference", {"chosen", "rejected"}),  # the spec's
        ([{"prompt": [{"role": "user", "content": "p"}], "chosen": [{"role": "assistant", "content": "c"}],
           "rejected": [{"role": "assistant", "content": "r"}]}], "preference", {"chosen", "rejected"}),
        ([{"messages": [{"role": "user", "content": "p"}, {"role": "assistant", "content": "c"}]}], "messages",
         {"chosen"}),
        ([{"question": "2+2?", "answer": "4"}], "qa", {"answer"}),
        ([{"prompt": "2+2?", "answer": "#### 4"}], "qa", {"answer"}),
        ([{"chosen": "\n\nHuman: p\n\nAssistant: c", "rejected": "\n\nHuman: p\n\nAssistant: r"}], "hh",
         {"chosen", "rejected"}),
        ([{"prompt": "just a prompt"}], "prompt", set()),
    ],
)
def test_custom_jsonl_formats_are_detected(tmp_path, rows, fmt, columns):
    train, _, report = load_grpo_dataset(custom_data=_jsonl(tmp_path, rows * 4), eval_fraction=0)
    assert report.format == fmt
    assert set(train.column_names) == {"id", "prompt"} | columns
    assert train[0]["prompt"][-1] == {"role": "user", "content": train[0]["prompt"][-1]["content"]}


def _parts(text):
    return [{"type": "text", "text": text}]


@pytest.mark.parametrize(
    "rows, prompt, column, value",
    [  # OpenAI's content as a list of text parts, in one turn or beside plain strings: read as the joined text
        ([{"prompt": [{"role": "user", "content": _parts("Capital of France?")}], "answer": "Paris"}],
         [{"role": "user", "content": "Capital of France?"}], "answer", "Paris"),
        ([{"prompt": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": [*_parts("Capital "), *_parts("of France?")]}], "answer": "Paris"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}], "answer",
         "Paris"),
        ([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _parts("hello")}]}],
         [{"role": "user", "content": "hi"}], "chosen", "hello"),
        ([{"prompt": "p", "chosen": [{"role": "assistant", "content": _parts("good")}], "rejected": "bad"}],
         [{"role": "user", "content": "p"}], "chosen", "good"),
    ],
)
def test_message_content_as_text_parts_is_read_as_text(tmp_path, rows, prompt, column, value):
    train, _, _ = load_grpo_dataset(custom_data=_jsonl(tmp_path, rows * 3), eval_fraction=0)
    assert train[0]["prompt"] == prompt and train[0][column] == value


@pytest.mark.parametrize(
    "content, words",
    [
        ([*_parts("What is this?"), {"type": "image_url", "image_url": {"url": "x.png"}}],
         "'prompt' message 1 has a part of type 'image_url' in its content: only text is read"),
        (42, "'prompt' message 1 has 42 in its content: only text is read"),
    ],
)
def test_message_content_that_is_not_text_is_one_line(cli, tmp_path, content, words):
    path = _jsonl(tmp_path, [{"prompt": [{"role": "user", "content": content}], "answer": "a cat"}])
    code, _, err = cli("--custom-data", path, "--model", "smollm2-135m", "--dry-run")
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_conversations_without_a_final_reply_are_prompts(cli, tmp_path):
    """Rows of `messages` that end in a user turn have no reference reply: they get the prompt-only rewards, as
    {"prompt": ...} rows do (the preference rewards scored None on every row, and the error advised them again)."""
    rows = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"A haiku on {w}"}]}
            for w in ("rain", "snow", "wind")]
    code, out, err = cli("--custom-data", _jsonl(tmp_path, rows), "--model", "smollm2-135m", "--dry-run")
    assert code == 0, err
    document = json.loads(out)
    assert document["dataset"]["format"] == "messages" and "chosen" not in document["dataset"]["examples"][0]
    code, prompts_only, err = cli("--custom-data", _jsonl(tmp_path, [{"prompt": "A haiku on rain"}], "p.jsonl"),
                                  "--model", "smollm2-135m", "--dry-run")
    assert code == 0, err
    assert document["rewards"] == json.loads(prompts_only)["rewards"]


def test_custom_field_names_and_system_prompt(tmp_path):
    path = _jsonl(tmp_path, [{"instruction": "Say hi", "target": "hi"}] * 3)
    from data_loader import FieldNames

    train, _, _ = load_grpo_dataset(custom_data=path, eval_fraction=0, system_prompt="Be brief.",
                                    field_names=FieldNames(prompt="instruction", answer="target"))
    assert train[0]["prompt"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
    assert train[0]["answer"] == "hi"


@pytest.mark.parametrize(
    "rows, message",
    [
        (['{"prompt": "a", "answer": "1"}', "{not json"], "data.jsonl:2: not valid JSON"),
        ([{"text": "no usable field"}], "data.jsonl:1: no usable fields (found text)"),
        ([{"prompt": "a", "answer": "1"}, {"prompt": "b", "chosen": "c", "rejected": "r"}],
         "data.jsonl:2: this row is in the 'preference' format but the file started with 'qa'"),
        (["[1, 2]"], "data.jsonl:1: each line must be a JSON object"),
        ([], "has no rows"),
        ([{"prompt": "Say hi", "chosen": "hello"}], "data.jsonl: the rows have 'chosen' but no 'rejected', so they "
                                                    "were read as prompts alone and 'chosen' would not be used"),
    ],
)
def test_bad_custom_files(tmp_path, rows, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_grpo_dataset(custom_data=_jsonl(tmp_path, rows) if rows else _empty(tmp_path))


@pytest.mark.parametrize("name, content, message", [
    ("rows.jsonl", json.dumps([{"prompt": "a"}, {"prompt": "b"}], indent=2).encode(),
     "is not JSONL (one JSON object per line): it holds a JSON array; write each row as one object on its own line "
     "(e.g. jq -c '.[]' file.json > file.jsonl)."),
    ("rows.jsonl", json.dumps({"prompt": "a"}, indent=2).encode(),
     "is not JSONL (one JSON object per line): it holds a JSON object spread over lines"),
    ("rows.jsonl", json.dumps([{"prompt": "a"}]).encode(), "is not JSONL (one JSON object per line): line 1 is a "
                                                           "JSON array"),
    ("rows.jsonl", gzip.compress(b'{"prompt": "a"}\n', mtime=0),
     "is not JSONL (one JSON object per line): it is gzip-compressed; name it rows.jsonl.gz or gunzip it."),
])
def test_a_file_that_is_not_jsonl_says_so(cli, tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    code, out, err = cli("--custom-data", str(path), "--dry-run", "--output-dir", str(tmp_path / "out"))
    assert code == 2 and "Traceback" not in err and not out.strip()
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: Custom data file {path} {message}")


QA = [json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(3)]


@pytest.mark.parametrize("name, content, message", [
    # json's reader recurses once per level: 200 000 levels were a RecursionError traceback
    ("rows.jsonl", ('{"prompt": ' + "[" * 200_000 + "]" * 200_000 + "}\n").encode(),
     "rows.jsonl:1: nested more than 100 levels deep"),
    # 900 levels parse, then deepcopy / Arrow recurse past the stack: refused at the same line
    ("rows.jsonl", ("\n".join([*QA, '{"prompt": "p", "answer": "1", "x": ' + "[" * 900 + "]" * 900 + "}"]) + "\n"
                    ).encode(), "rows.jsonl:4: nested more than 100 levels deep"),
    # a key given twice: json keeps the last one without a word (config files refuse it too)
    ("rows.jsonl", ("\n".join([*QA, '{"prompt": "What is 2 + 2?", "answer": "4", "answer": "5"}']) + "\n").encode(),
     "rows.jsonl:4: 'answer' is given twice in this row: JSON would keep only the last one, silently; keep one."),
    ("rows.jsonl", ("\n".join(QA) + '\n{"prompt": "caf\xe9?", "answer": "1"}\n').encode("latin-1"),
     "rows.jsonl:4: byte 0xe9 at column 16 is not UTF-8; the file is likely latin-1 / Windows-1252: convert it, "
     "e.g. iconv -f WINDOWS-1252 -t UTF-8 rows.jsonl > rows.utf8.jsonl"),
    ("rows.jsonl", ("\n".join(QA) + "\n").encode("utf-16"),
     "Custom data file {path} is not JSONL (one JSON object per line): it is UTF-16 text, not UTF-8; convert it, "
     "e.g. iconv -f UTF-16 -t UTF-8 rows.jsonl > rows.utf8.jsonl"),
    ("rows.csv", b"prompt,answer\nWhat is 1 + 1?,2\n",
     "Custom data file {path} is not JSONL (one JSON object per line): it looks like CSV; convert it to one JSON "
     "object per row, e.g. python -c \"import csv, json, sys; [print(json.dumps(r)) for r in "
     "csv.DictReader(open(sys.argv[1]))]\" rows.csv > rows.jsonl"),
    ("rows.jsonl", b"prompt\tanswer\nWhat is 1 + 1?\t2\n", "it looks like TSV"),
])
def test_unreadable_rows_are_one_line_naming_the_line(cli, tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    code, out, err = cli("--quick-test", "--custom-data", str(path), "--dry-run", "--output-dir", str(tmp_path / "o"))
    assert code == 2 and "Traceback" not in err and not out.strip(), err[-3000:]
    (line,) = err.strip().splitlines()
    assert message.format(path=path) in line, line


@pytest.mark.parametrize("row, message", [
    # a 'bot' turn reached the chat template as it was: the model saw another conversation than the file holds
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "bot", "content": "Hello"},
                   {"role": "user", "content": "And then?"}]},
     "data.jsonl:1: 'messages' message 2 has role \"bot\": chat templates know system, user, assistant, tool; "
     "write 'assistant'."),
    ({"prompt": [{"role": "narrator", "content": "Once"}], "answer": "1"},
     "data.jsonl:1: 'prompt' message 1 has role \"narrator\": chat templates know system, user, assistant, tool; "
     "use one of those."),
    # an object-valued prompt was dropped as 'malformed prompt: 23'
    ({"prompt": {"text": "What is 1 + 1?"}, "answer": "2"},
     "data.jsonl:1: 'prompt' is an object ({\"text\": \"What is 1 + 1?\"}): give the prompt as a text, or a list "
     'of messages [{"role": "user", "content": "..."}].'),
    ({"question": 12, "answer": "2"}, "data.jsonl:1: 'question' is a number (12): give the prompt as a text"),
])
def test_a_prompt_the_chat_template_would_misread(cli, tmp_path, row, message):
    path = _jsonl(tmp_path, [row] * 12)
    code, out, err = cli("--quick-test", "--custom-data", path, "--dry-run", "--output-dir", str(tmp_path / "o"))
    assert code == 2 and "Traceback" not in err and not out.strip(), err[-3000:]
    (line,) = err.strip().splitlines()
    assert message in line, line


def test_standard_input_rows_without_outputs_are_refused(cli, tmp_path):
    # read as prompts alone, they trained on the 'keywords' reward without a word
    path = _jsonl(tmp_path, [{"question": f"Print the sum of the two numbers ({i}).", "inputs": ["1 2\n"]}
                             for i in range(12)])
    code, out, err = cli("--quick-test", "--custom-data", path, "--dry-run", "--output-dir", str(tmp_path / "o"))
    assert code == 2 and not out.strip()
    (line,) = err.strip().splitlines()
    assert line == (f"error: {path}: the rows have 'inputs' but no 'outputs', so they were read as 'prompt' data and "
                    "'inputs' would not be used: standard-input problems need both (what each input must print in "
                    "'outputs').")


def test_held_out_rows_left_out_of_evaluation_are_counted(tmp_path):
    # learn_code_cpu's 60 rows at eval_fraction 0.34 hold out 21, and max_eval_samples 20 evaluates 20: the 21st was
    # neither trained on nor evaluated while the report said nothing was dropped
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(60)]
    train, evaluation, report = load_grpo_dataset(custom_data=_jsonl(tmp_path, rows), eval_fraction=0.34,
                                                  max_eval_samples=20)
    assert (len(train), len(evaluation)) == (39, 20)
    assert report.dropped == {"eval": {"held out by eval_fraction beyond max_eval_samples 20: neither trained on nor "
                                       "evaluated": 1}}
    assert len(train) + len(evaluation) + 1 == len(rows)


@pytest.mark.parametrize("rows, message", [
    # Arrow types what is inside a list or an object too: these were an ArrowInvalid traceback
    ([{"prompt": "a?", "answer": "1", "meta": [1, 2]}, {"prompt": "b?", "answer": "1", "meta": ["x", 2]}],
     "data.jsonl: field 'meta[]' (the items of 'meta') is text in data row 2 but number in row 1: give it one kind "
     "of value in every row."),
    ([{"prompt": "a?", "answer": "1", "meta": {"a": 1}}, {"prompt": "b?", "answer": "1", "meta": {"a": "x"}}],
     "data.jsonl: field 'meta.a' (inside 'meta') is text in data row 2 but number in row 1"),
    # a reply column the format does not read was dropped without a word
    ([{"prompt": "a?", "answer": "1", "chosen": "yes"}], "data.jsonl: the rows have 'chosen' but no 'rejected', so "
                                                         "they were read as 'qa' data and 'chosen' would not be used"),
    ([{"messages": [{"role": "user", "content": "Hi"}], "rejected": "go away"}],
     "the rows have 'rejected' but no 'chosen', so they were read as 'messages' data"),
])
def test_what_a_table_cannot_hold_or_a_format_would_drop(tmp_path, rows, message):
    with pytest.raises(UsageError) as err:
        load_grpo_dataset(custom_data=_jsonl(tmp_path, rows * 6), eval_fraction=0)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_numbers_of_both_kinds_in_one_field_are_one_kind(tmp_path):
    rows = [{"prompt": f"q{i}?", "answer": "1", "weight": 1 if i % 2 else 1.5} for i in range(12)]
    train, _, _ = load_grpo_dataset(custom_data=_jsonl(tmp_path, rows), eval_fraction=0)
    assert len(train) == 12


def _empty(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("\n")
    return str(path)


def test_rows_that_cannot_be_mapped_are_counted_not_silently_dropped(tmp_path):
    rows = [{"prompt": "p", "chosen": "c", "rejected": "r"}] * 5 + [{"prompt": "", "chosen": "c", "rejected": "r"}] * 2
    train, _, report = load_grpo_dataset(custom_data=_jsonl(tmp_path, rows), eval_fraction=0)
    assert len(train) == 5
    assert report.dropped == {"train": {"empty or malformed prompt": 2}}


def test_everything_filtered_out_is_an_error(tmp_path):
    with pytest.raises(UsageError, match="training set is empty.*empty or malformed prompt: 3"):
        load_grpo_dataset(custom_data=_jsonl(tmp_path, [{"prompt": " "}] * 3), eval_fraction=0)


def test_missing_files_and_offline_hub(cli, tmp_path):
    code, _, err = cli("--custom-data", str(tmp_path / "nope.jsonl"), "--dry-run")
    assert code == 2 and "does not exist" in err
    code, _, err = cli("--dataset", "hh_rlhf", "--dataset-path", str(tmp_path / "nope"), "--dry-run")
    assert code == 2 and "does not exist" in err
    # HF_HUB_OFFLINE=1 in tests: a hub dataset cannot load, and the message says what to do instead
    code, _, err = cli("--dataset", "gsm8k", "--dry-run")
    assert code == 2 and "--dataset-path" in err and "openai/gsm8k" in err


def test_preference_rewards_refuse_data_without_references(cli, tmp_path):
    path = _jsonl(tmp_path, [{"prompt": "p"}] * 5)
    code, _, err = cli("--custom-data", path, "--reward-preset", "balanced", "--dry-run")
    assert code == 2 and "Reward 'similarity' needs the column(s) chosen" in err


def test_python_api_create_grpo_dataloader():
    from data_loader import create_grpo_dataloader

    loader, dataset = create_grpo_dataloader(model_name="smollm2-135m", dataset_name=str(GSM8K_FILE),
                                             max_samples=16, batch_size=4)
    batch = next(iter(loader))
    assert len(batch) == 4 and len(dataset) == 16
    assert batch[0]["prompt_text"].startswith("<|im_start|>") and batch[0]["answer"]


def test_python_api_conversations_passed_back_keep_their_reply(tmp_path):
    """create_grpo_dataloader's rows of `messages` data (prompt + chosen, no rejected), handed to train(): the reply
    stays `chosen` and the preference rewards score against it (they were read as prompts alone, reply dropped)."""
    from data_loader import create_grpo_dataloader
    from grpo_trainer import GRPOConfig, GRPOTrainer

    rows = [{"messages": [{"role": "user", "content": f"Say hi {i}"}, {"role": "assistant", "content": f"hello {i}"}]}
            for i in range(6)]
    _, dataset = create_grpo_dataloader(model_name="smollm2-135m", dataset_name=_jsonl(tmp_path, rows), max_samples=6)
    trainer = GRPOTrainer(GRPOConfig(model_name="smollm2-135m", eval_fraction=0.0, output_dir=str(tmp_path / "out")))
    train, _, report = trainer.load_data(dataset)
    assert report.format == "messages" and sorted(train["chosen"]) == [f"hello {i}" for i in range(6)]
    assert "similarity" in trainer.build_rewards().names


def test_custom_data_second_load_comes_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))
    path = _jsonl(tmp_path, [{"prompt": f"p{i}", "chosen": "c", "rejected": "r"} for i in range(20)])
    first = load_grpo_dataset(custom_data=path, eval_fraction=0.2, seed=1)
    assert len(list((tmp_path / "cache" / "datasets").iterdir())) == 1
    second = load_grpo_dataset(custom_data=path, eval_fraction=0.2, seed=1)
    assert list(second[0]["id"]) == list(first[0]["id"]) and list(second[1]["id"]) == list(first[1]["id"])
    assert second[2].rows == first[2].rows
    # a different setting is a different cache entry, not a stale hit
    third = load_grpo_dataset(custom_data=path, eval_fraction=0.2, seed=2)
    assert list(third[0]["id"]) != list(first[0]["id"])  # another shuffle order
    assert len(list((tmp_path / "cache" / "datasets").iterdir())) == 2


def test_rows_sharing_an_id_but_not_a_prompt_get_their_own_ids(tmp_path):
    """The EMA baseline follows a prompt by its id: two files concatenated, each numbering its rows from 1, would
    give different prompts one baseline. The later ones are renamed (said in the report); a repeated prompt keeps
    its id; ids are text whatever the file gave."""
    from grpo_trainer import GRPOConfig, GRPOTrainer

    rows = [{"id": 1, "question": "What is 2+2?", "answer": "4"}, {"id": 1, "question": "What is 3+3?", "answer": "6"},
            {"id": 1, "question": "What is 2+2?", "answer": "4"}, {"id": 2, "question": "What is 5+5?", "answer": "10"}]
    trainer = GRPOTrainer(GRPOConfig(model_name="smollm2-135m", output_dir=str(tmp_path / "out"), eval_fraction=0.0))
    train, _, report = trainer.load_data(rows)
    ids = {row["prompt"][-1]["content"]: row["id"] for row in train}
    assert ids == {"What is 2+2?": "1", "What is 3+3?": "1#2", "What is 5+5?": "2"}
    assert [row["id"] for row in train].count("1") == 2  # the same prompt twice: one id, one baseline
    assert any("1 train row(s) shared an id with a different prompt" in note for note in report.notes)

"""Question/answer data with text answers: the `qa` reward scores the answer as SQuAD / TriviaQA do, it is the
default for such data (a run and --score-completions agree), and a reward that scores the references themselves 0
is refused before a model loads."""

import json
import re
from pathlib import Path

import pytest

from rewards import REGISTRY, parse_reward_config
from rewards.components import QA, qa_f1, qa_tokens

# Rows in the shape users write them (SQuAD / TriviaQA style): the answer is text, sometimes a number.
CAPITALS = [
    {"question": "What is the capital of Kenya?", "answer": "Nairobi"},
    {"question": "Who wrote Hamlet?", "answer": "William Shakespeare"},
    {"question": "Which planet is called the red planet?", "answer": "Mars"},
    {"question": "What is the largest ocean?", "answer": "the Pacific Ocean"},
]


def conv(text):
    return [{"role": "assistant", "content": text}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("completion, answer, expected", [
    ("The capital of Kenya is Nairobi.", "Nairobi", 1.0),  # answer in the completion
    ("nairobi", "Nairobi", 1.0),  # case
    ("Mombasa.", "Nairobi", 0.0),
    ("Nairobian food", "Nairobi", 0.0),  # whole words only
    ("It was Shakespeare.", "William Shakespeare", 0.0),  # a short reference must be there whole
    ("Pacific Ocean", "the Pacific Ocean", 1.0),  # articles and punctuation do not count
    ("It has 1000 legs", "1,000", 1.0),  # numbers compared as numbers
    ("$3.50", "3.5", 1.0),
    ("There are three.", "3", 1.0),  # small number words are numbers
    ("-5", "5", 0.0),  # a sign is part of the number
    ("<think>Mombasa? no</think><answer>Nairobi</answer>", "Nairobi", 1.0),  # the tagged answer is the answer
    ("<answer>Mombasa</answer> or Nairobi", "Nairobi", 0.0),  # ... and only it
    ("<think>Nairobi? no</think> Mombasa", "Nairobi", 0.0),  # reasoning is not the answer
    ("서울입니다", "서울", 0.0), ("서울", "서울", 1.0),  # Unicode words compare whole
])
def test_qa_scores_short_answers_like_squad_and_triviaqa(completion, answer, expected):
    assert QA()(completions=[conv(completion)], answer=[answer]) == [expected]


LABELLED = Path(__file__).parent / "fixtures" / "qa_short_answers.jsonl"
DOCS = Path(__file__).parent.parent / "docs" / "rewards.md"


def test_qa_agrees_with_hand_labels_and_its_disagreements_are_the_documented_ones():
    """Short answers labelled right or wrong as a careful person would (units, number words, bare numbers, yes/no
    with negation, aliases, near misses), without looking at the reward: it must agree on 98 % or more, and the
    cases it gets wrong must be exactly those docs/rewards.md lists."""
    cases = [json.loads(line) for line in LABELLED.read_text().splitlines()]
    assert len(cases) >= 100
    disagree = [(c["answer"], c["reference"]) for c in cases
                if (QA()(completions=[conv(c["answer"])], answer=[c["reference"]])[0] == 1.0) != c["right"]]
    assert 1 - len(disagree) / len(cases) >= 0.98, disagree
    section = DOCS.read_text().split("Where it disagrees with a person", 1)[1].split("\n\n", 2)[1]
    listed = re.findall(r'^- "(.*?)" against "(.*?)"', section, flags=re.MULTILINE)
    assert disagree == listed


JUDGED = Path(__file__).parent / "fixtures" / "qa_judged_pairs.jsonl"


def test_qa_agrees_with_a_persons_verdicts_on_the_tuned_and_the_held_out_pairs():
    """280 (question, reference, completion) triples marked right or wrong by a person (bench/bench_qa.py prints the
    same figures): 95 % agreement or more on the pairs the reader was tuned on and on the held-out ones, and no
    answer the person marks wrong (a hedge, a negation, another unit or currency) scores above 0."""
    pairs = [json.loads(line) for line in JUDGED.read_text().splitlines()]
    assert len(pairs) >= 150 and {p["part"] for p in pairs} == {"dev", "held_out"}
    qa = QA()
    for part in ("dev", "held_out"):
        rows = [(p, qa(completions=[conv(p["completion"])], answer=[p["reference"]])[0]) for p in pairs
                if p["part"] == part]
        disagree = [(p["reference"], p["completion"]) for p, s in rows if (s == 1.0) != bool(p["verdict"])]
        assert 1 - len(disagree) / len(rows) >= 0.95, (part, disagree)
        assert not [(p["reference"], p["completion"]) for p, s in rows if s > 0 and not p["verdict"]], part


@pytest.mark.parametrize("completion, answer, expected", [
    # an answer counts only where it commits: candidates, ranges, bounds and negations score what a wrong answer does
    ("4 or 5", "4", 0.0),
    ("either 6 or 8", "8", 0.0),
    ("6-8", "8", 0.0),  # a range, not 6 and -8
    ("between 6 and 10", "8", 0.0),
    ("9, 10, or 11", "10", 0.0),
    ("4 5", "4", 0.0),  # numbers side by side
    ("more than 100", "100", 0.0),
    ("at least 8", "8", 0.0),
    ("100+", "100", 0.0),
    ("100 or more", "100", 0.0),
    ("about 100", "100", 1.0),  # one value, approximately: committed
    ("100 or so", "100", 1.0),
    ("It is not Paris", "Paris", 0.0),
    ("Lyon, not Paris", "Paris", 0.0),
    ("Paris, not Lyon", "Paris", 1.0),  # the other one is rejected
    ("It's Canberra, not Sydney.", "Canberra", 1.0),
    ("Sydney? No, Canberra.", "Canberra", 1.0),
    ("Canada? Mexico?", "Canada", 0.0),  # asked back, not answered
    ("Paris or Lyon", "Paris", 0.0),
    ("Paris/Lyon", "Paris", 0.0),
    ("Paris, Lyon, Marseille", "Paris", 0.0),  # a bare list
    ("Paris. Lyon. Nice.", "Paris", 0.0),
    ("Paris Lyon Marseille Nice Toulouse", "Paris", 0.0),  # names without commas
    ("Paris, France", "Paris", 1.0),  # one place, not a list
    ("Austin, Texas, United States.", "Austin", 1.0),  # one place from small to large
    ("France, Germany, Spain", "France", 0.0),  # countries listed, not a place written out
    ("Maybe Paris", "Paris", 0.0),
    ("Anything but Paris", "Paris", 0.0),
    ("4 (or 5)", "4", 0.0),
    ("He moved to Paris in 1920.", "Paris", 1.0),  # "to" before a name is no range
    ("Either way, it is Paris", "Paris", 1.0),  # "either" without "or" is no alternative
    ("It was made from 100 parts", "100", 1.0),  # "from" without "to" is no range
    ("from 6 to 8", "8", 0.0),
    ("Jupiter is not the smallest planet.", "Jupiter", 1.0),  # a statement about it, not a rejection
    ("July 20, 1969", "1969", 1.0),  # the day before the year is no list
    # another unit or currency is another answer; a bare number is read in the reference's unit
    ("20 cents", "$20", 0.0),
    ("20 yen", "$20", 0.0),
    ("20 pounds", "$20", 0.0),
    ("20 apples", "$20", 0.0),  # a word the unit table does not know is not the reference's unit either
    ("twenty dollars", "$20", 1.0),
    ("500 cents", "$5", 1.0),  # converted
    ("7 feet", "7 ft", 1.0),
    ("7", "7 ft", 1.0),
    ("84 inches", "7 ft", 1.0),
    ("2.13 m", "7 ft", 1.0),  # right to the decimals it writes
    ("2 m", "7 ft", 0.0),  # 6 % off: not a rounding of it
    ("7 m", "7 ft", 0.0),
    ("4 gigabytes", "4 GB", 1.0),
    ("4096 MB", "4 GB", 1.0),  # binary prefixes
    ("212 °F", "100 °C", 1.0),
    ("2,5 kg", "2.5 kg", 1.0),  # decimal comma
    # the same number written another way
    ("a dozen", "12", 1.0),
    ("minus five", "-5", 1.0),
    ("\u22125", "-5", 1.0),  # Unicode minus
    ("three quarters", "0.75", 1.0),
    ("3/4", "0.75", 1.0),
    ("\\boxed{\\frac{3}{4}}", "3/4", 1.0),
    ("75%", "3/4", 1.0),  # a percentage for a fraction
    ("0.33", "1/3", 1.0),  # the fraction rounded to the places written
    ("0.3", "1/3", 0.0),  # ... two places at least
    ("$1M", "$1,000,000", 1.0),  # a scale letter after a currency sign
    ("none", "0", 1.0),
    ("Venus has no moons.", "0", 1.0),
    ("1.2e3", "1200", 1.0),
    ("1.2 \u00d7 10^3", "1200", 1.0),
    ("100 000", "100000", 1.0),
    ("1.000.000", "1000000", 1.0),
    ("1.234,5", "1234.5", 1.0),
    # aliases; a formula answers for the name, but not the other way round (a formula reference asks for it)
    ("USA", "United States", 1.0),
    ("the U.S.", "United States", 1.0),
    ("CO2", "carbon dioxide", 1.0),
    ("carbon dioxide", "CO2", 0.0),
    ("St. Petersburg", "Saint Petersburg", 1.0),
    ("World War 2", "World War II", 1.0),
    ("the Second World War", "World War II", 1.0),
    ("World War I", "World War II", 0.0),
    ("Henry the Eighth", "Henry VIII", 1.0),
    ("Henry VII", "Henry VIII", 0.0),
    # times and dates
    ("19:00", "7 pm", 1.0),
    ("7 p.m.", "7 pm", 1.0),
    ("7 am", "7 pm", 0.0),
    ("19.00", "7 pm", 1.0),
    ("1/4", "0.25", 1.0),  # 0.25 is a number, not 0:25
    ("20 July 1969", "July 20, 1969", 1.0),
    ("1969-07-20", "July 20, 1969", 1.0),
    ("July 1969", "July 20, 1969", 0.0),  # the day is missing
    # yes / no
    ("Sure", "yes", 1.0),
    ("Sure", "no", 0.0),
    ("I'm not sure", "yes", 0.0),
])
def test_qa_reads_hedges_units_aliases_and_number_spellings_as_a_person_does(completion, answer, expected):
    assert QA()(completions=[conv(completion)], answer=[answer]) == [expected]


def test_qa_stays_fast_and_whole_on_long_or_odd_answers():
    """A completion that repeats a hedge thousands of times is read in linear time (a pattern that backtracked took
    seconds on twenty "Paris," in a row), and odd numbers neither raise nor hang."""
    import time

    qa = QA()
    start = time.perf_counter()
    assert qa.score_one(" ".join(["Paris,"] * 2000), "Paris") == 0.0  # a list, however long
    assert qa.score_one(" ".join(["1 or"] * 2000), "1") == 0.0
    assert qa.score_one("1e99999999 and 10^99999999", "5") == 0.0  # an exponent no number needs
    assert qa.score_one("1.5e1/2", "7.5") == 1.0  # a fraction in scientific notation
    assert time.perf_counter() - start < 5


def test_long_references_score_token_f1_and_a_missing_answer_is_not_scored():
    reference = "a rock band formed in Liverpool in 1960"  # 7 tokens without the article
    predicted = "a band from Liverpool"
    p, r = qa_tokens(predicted), qa_tokens(reference)
    assert p == ["band", "from", "liverpool"]
    expected = 2 * (2 / 3) * (2 / 7) / (2 / 3 + 2 / 7)  # 2 tokens in common
    assert qa_f1(p, r) == pytest.approx(expected)
    assert QA()(completions=[conv(predicted), conv(f"They were {reference}.")], answer=[reference] * 2) == [
        pytest.approx(expected), 1.0]
    assert QA()(completions=[conv("x"), conv("x")], answer=["", None]) == [None, None]
    assert QA(short_answer_words=0)(completions=[conv("Obama")], answer=["Barack Obama"]) == [pytest.approx(2 / 3)]


def test_qa_is_a_registered_reward_with_its_own_preset():
    assert REGISTRY["qa"] is QA
    reward_set = parse_reward_config({"qa_weight": 1.0, "qa": {"short_answer_words": 3, "contains": False}}, "t")
    assert reward_set.names == ["qa"]
    assert reward_set.components[0](completions=[conv("It is Nairobi")], answer=["Nairobi"]) == [0.0]


def test_a_run_on_text_answers_gets_the_qa_reward_and_numeric_answers_get_math(tmp_path):
    """The Python API picks the reward from the rows: text answers -> qa; numbers (GSM8K-style) -> math."""
    from grpo_trainer import GRPOConfig, GRPOTrainer

    trainer = GRPOTrainer(GRPOConfig(model_name="smollm2-135m", output_dir=str(tmp_path / "out")))
    trainer.load_data(CAPITALS * 3)
    assert trainer.build_rewards().names == ["qa"]
    trainer = GRPOTrainer(GRPOConfig(model_name="smollm2-135m", output_dir=str(tmp_path / "out")))
    trainer.load_data([{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(12)])
    assert trainer.build_rewards().names == ["accuracy", "format", "length"]


@pytest.mark.parametrize("source", ["arithmetic", "numbers", "capitals", "mbpp"])
def test_the_python_api_picks_the_default_rewards_the_cli_picks(cli, tmp_path, source):
    """One function (rewards/fit.py default_reward_preset) decides for both, from the rows and the built-in dataset
    they came from: create_grpo_dataloader's arithmetic rows passed to train() got the maths set (accuracy + format
    + length, from their numeric answers) where `--dataset arithmetic` gets the exact-answer reward alone."""
    from pathlib import Path

    from data_loader import create_grpo_dataloader
    from grpo_trainer import GRPOConfig, GRPOTrainer

    files = {"numbers": write_jsonl(tmp_path / "n.jsonl", [{"question": f"{i} + 1?", "answer": str(i + 1)}
                                                            for i in range(12)]),
             "capitals": write_jsonl(tmp_path / "c.jsonl", CAPITALS * 3),
             "mbpp": str(Path(__file__).parent / "fixtures" / "code" / "mbpp-custom-4.jsonl")}
    flags = ("--dataset", source) if source == "arithmetic" else ("--custom-data", files[source])
    code, out, err = cli(*flags, "--model", "smollm2-135m", "--max-samples", "16", "--dry-run")
    assert code == 0, err
    expected = json.loads(out)["rewards"]["components"]
    _, rows = create_grpo_dataloader(model_name="smollm2-135m", dataset_name=files.get(source, source), max_samples=16)
    trainer = GRPOTrainer(GRPOConfig(model_name="smollm2-135m", output_dir=str(tmp_path / "out")))
    trainer.load_data(rows)
    assert trainer.build_rewards().names == expected
    assert expected == {"arithmetic": ["accuracy"], "numbers": ["accuracy", "format", "length"],
                        "capitals": ["qa"], "mbpp": ["code_execution"]}[source]


def test_the_math_reward_on_text_answers_is_refused_and_a_preset_reward_is_replaced(cli, tmp_path):
    data = write_jsonl(tmp_path / "qa.jsonl", CAPITALS * 3)
    code, _, err = cli("--custom-data", data, "--reward-preset", "math", "--dry-run")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "accuracy" in err and "reference answers themselves 0" in err and "--reward-preset qa" in err
    # --quick-test's own reward (the exact sum) was not asked for: the data's default replaces it, with a notice
    code, out, err = cli("--quick-test", "--custom-data", data, "--dry-run")
    assert code == 0, err
    document = json.loads(out)
    assert document["rewards"]["components"] == ["qa"]
    assert any("'arithmetic' cannot score" in n and "'qa'" in n for n in document["notices"])


def test_score_completions_picks_the_reward_a_run_on_the_same_rows_picks(cli, tmp_path):
    rows = [{**CAPITALS[0], "completions": ["The capital of Kenya is Nairobi.", "Mombasa"]},
            {**CAPITALS[1], "completion": "Hamlet was written by William Shakespeare."}]
    code, out, err = cli("--score-completions", write_jsonl(tmp_path / "samples.jsonl", rows))
    assert code == 0, err
    first, second = (json.loads(line) for line in out.splitlines())
    assert first["scores"] == {"qa": [1.0, 0.0]} and first["zero_variance"] is False
    assert second["scores"] == {"qa": 1.0}
    data = write_jsonl(tmp_path / "data.jsonl", [{k: v for k, v in r.items() if "completion" not in k} for r in rows])
    code, out, err = cli("--custom-data", data, "--dry-run")
    assert code == 0, err
    assert json.loads(out)["rewards"]["components"] == list(first["scores"])


@pytest.mark.parametrize("word", ["infinity", "Infinity", "NaN"])
def test_words_float_reads_are_text_answers_not_numbers(cli, tmp_path, word):
    """float() reads 'infinity' and 'nan': taken for numbers, such rows got the exact-number reward, which finds no
    number in "infinity" and scored the right answer 0."""
    rows = [{"question": "What is 12 + 30?", "answer": "42", "completion": "42"},
            {"question": "What does the sum diverge to?", "answer": word, "completion": f"It diverges to {word}."}]
    code, out, err = cli("--score-completions", write_jsonl(tmp_path / "samples.jsonl", rows))
    assert code == 0, err
    assert [json.loads(line)["scores"] for line in out.splitlines()] == [{"qa": 1.0}, {"qa": 1.0}]


def test_several_accepted_answers_each_score_and_every_shape_is_read(cli, tmp_path):
    """TriviaQA / SQuAD list more than one right answer: a list in the data, TriviaQA's {"value", "aliases"} or
    SQuAD's {"text": [...]}, beside plain ones in the same file. Any accepted answer scores 1.0 (a run and
    --score-completions alike); the first is the one shown. A list was read as its Python text before, so no
    alias could ever match."""
    rows = [{"question": "What is the capital of France?", "answer": ["Paris", "City of Paris"]},
            {"question": "Which planet is largest?", "answer": {"value": "Jupiter", "aliases": ["Planet Jupiter"]}},
            {"question": "Who wrote Hamlet?", "answer": {"text": ["Shakespeare", "William Shakespeare"]}},
            {"question": "Which metal is liquid?", "answer": {"normalized_aliases": ["mercury", "quicksilver"]}},
            {"question": "What is the largest ocean?", "answer": "the Pacific Ocean"}]
    data = write_jsonl(tmp_path / "aliases.jsonl", rows)
    code, out, err = cli("--custom-data", data, "--model", "smollm2-135m", "--dry-run", "--set", "eval_fraction=0")
    assert code == 0, err
    document = json.loads(out)
    assert document["rewards"]["components"] == ["qa"]
    from grpo_trainer import GRPOConfig, GRPOTrainer

    trainer = GRPOTrainer(GRPOConfig(model_name="smollm2-135m", output_dir=str(tmp_path / "out"), custom_data=data,
                                     eval_fraction=0.0))
    train, _, _ = trainer.load_data()
    by_question = {row["prompt"][-1]["content"]: row for row in train}
    assert by_question["What is the capital of France?"]["answer"] == "Paris"
    assert by_question["What is the capital of France?"]["answer_aliases"] == ["Paris", "City of Paris"]
    assert by_question["Which planet is largest?"]["answer_aliases"] == ["Jupiter", "Planet Jupiter"]
    assert by_question["What is the largest ocean?"]["answer_aliases"] == ["the Pacific Ocean"]
    qa = QA()
    for question, completion, expected in [("What is the capital of France?", "It is the City of Paris.", 1.0),
                                           ("What is the capital of France?", "Lyon", 0.0),
                                           ("Which planet is largest?", "planet jupiter", 1.0),
                                           ("Who wrote Hamlet?", "William Shakespeare wrote it.", 1.0),
                                           ("Which metal is liquid?", "Quicksilver.", 1.0),
                                           ("What is the largest ocean?", "Pacific Ocean", 1.0)]:
        row = by_question[question]
        assert qa(completions=[conv(completion)], answer=[row["answer"]],
                  answer_aliases=[row["answer_aliases"]]) == [expected], (question, completion)
    samples = [{**rows[0], "completions": ["The City of Paris.", "Lyon"]}]
    code, out, err = cli("--score-completions", write_jsonl(tmp_path / "samples.jsonl", samples))
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["scores"] == {"qa": [1.0, 0.0]}


@pytest.mark.parametrize("rows, words", [
    ([{"question": "q1", "answer": [["nested"]]}, {"question": "q2", "answer": "x"}], "list of accepted answers"),
    ([{"question": "q1", "answer": {"score": 3}}, {"question": "q2", "answer": "x"}], "list of accepted answers"),
    ([{"question": "q1", "answer": "x", "id": 1}, {"question": "q2", "answer": "y", "id": "two"}],
     "field 'id' is text in data row 2 but number in row 1"),
])
def test_answers_of_no_known_shape_and_mixed_kinds_are_one_line(cli, tmp_path, rows, words):
    code, _, err = cli("--custom-data", write_jsonl(tmp_path / "bad.jsonl", rows), "--model", "smollm2-135m",
                       "--dry-run")
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err

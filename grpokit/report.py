"""report.html: one self-contained page that says what a run did and what it changed.

    python train_grpo.py report OUTPUT_DIR     # redraw the plots and (re)write OUTPUT_DIR/report.html

What is on the page, top to bottom:
- the run in numbers (metrics_summary.json) and its settings (run_config.json, else the checkpoint manifest);
- the curves (plots.py), inlined as base64 PNG;
- every logged eval prompt with its baseline completion (the first generation log, before training) beside its
  final one (the last log), each with its per-component rewards, grouped into improved / regressed / unchanged
  and sorted by the change in total reward (biggest first).
No external assets (CSS inline, images as data: URIs), no JavaScript: the file can be mailed or attached to an
issue as it is. All model and dataset text is HTML-escaped.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
from pathlib import Path
from typing import Any

from config.errors import UsageError
from grpokit.plots import make_plots
from grpokit.run_dir import (
    EVAL_METRICS,
    METRICS_SUMMARY,
    REPORT_FILE,
    TRAINER_STATE,
    generation_log_dir,
    generation_logs,
    read_json,
    run_config,
)

# The settings a reader wants first; the full config is one click further down.
KEY_SETTINGS = [
    ("model_name", "model"), ("dataset", "dataset"), ("custom_data", "custom data"),
    ("reward_function_type", "reward mode"), ("reward_config_name", "reward preset"),
    ("reward_config", "reward config file"), ("learning_rate", "learning rate"), ("max_steps", "max steps"),
    ("num_train_epochs", "epochs"), ("per_device_train_batch_size", "batch size (completions)"),
    ("num_generations", "group size (completions per prompt)"), ("max_completion_length", "max completion tokens"),
    ("temperature", "sampling temperature"), ("beta", "KL beta"), ("loss_type", "loss"),
    ("lora_r", "LoRA rank"), ("lora_alpha", "LoRA alpha"), ("load_in_4bit", "4-bit base"), ("seed", "seed"),
]

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #1d1d1f;
       margin: 0; background: #f6f7f9; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 60px; }
h1 { font-size: 24px; margin: 0 0 4px; } h2 { font-size: 19px; margin: 34px 0 10px; border-bottom: 1px solid #d8dbe0;
     padding-bottom: 4px; } h3 { font-size: 15px; margin: 22px 0 8px; }
.sub { color: #5f6670; margin: 0 0 18px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 14px 0; }
.card { background: #fff; border: 1px solid #dfe2e7; border-radius: 8px; padding: 10px 14px; min-width: 150px; }
.card .k { color: #5f6670; font-size: 12px; } .card .v { font-size: 20px; font-weight: 600; }
table.kv { border-collapse: collapse; background: #fff; border: 1px solid #dfe2e7; }
table.kv td { padding: 4px 12px; border-bottom: 1px solid #eef0f3; vertical-align: top; }
table.kv td:first-child { color: #5f6670; white-space: nowrap; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 14px; }
.plots img { width: 100%; background: #fff; border: 1px solid #dfe2e7; border-radius: 6px; }
.sample { background: #fff; border: 1px solid #dfe2e7; border-radius: 8px; margin: 12px 0; padding: 10px 14px; }
.sample .head { display: flex; justify-content: space-between; gap: 12px; align-items: baseline; }
.prompt { white-space: pre-wrap; font-weight: 500; }
.ref { color: #5f6670; font-size: 13px; margin-top: 2px; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; margin-top: 8px; }
.side { border-radius: 6px; padding: 8px 10px; background: #f7f8fa; border: 1px solid #eceef2; min-width: 0; }
.side .label { font-size: 12px; color: #5f6670; margin-bottom: 4px; }
.text { white-space: pre-wrap; overflow-wrap: anywhere; font-family: ui-monospace, "DejaVu Sans Mono", Menlo,
        monospace; font-size: 13px; }
.text.call { color: #1d4ed8; }
.text.tool { color: #5f6670; border-left: 3px solid #d0d4da; padding-left: 6px; margin: 2px 0; }
.rewards { margin-top: 6px; font-size: 12px; color: #3c4148; }
.rewards span { display: inline-block; margin-right: 10px; }
.delta { font-weight: 700; font-size: 15px; white-space: nowrap; }
.up { color: #137333; } .down { color: #b3261e; } .same { color: #5f6670; }
.tag { font-size: 11px; background: #fde7e9; color: #8c1d18; border-radius: 4px; padding: 0 5px; margin-left: 6px; }
details > summary { cursor: pointer; color: #2a5db0; margin: 8px 0; }
pre.config { background: #fff; border: 1px solid #dfe2e7; padding: 10px; overflow-x: auto; font-size: 12px; }
.note { color: #5f6670; }
"""


# ---------------------------------------------------------------------------------------------------------------------
# The data
# ---------------------------------------------------------------------------------------------------------------------

def _optional_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    data = read_json(path)
    return data if isinstance(data, dict) else {}


def _baseline_from_adapter_run(out: Path, eval_metrics: dict[str, Any]):
    """An --eval-only result has one generation log; its baseline is the step-0 log of the run that trained the
    evaluated adapter (a checkpoint-N inside that run's output dir, or the output dir itself)."""
    adapter = eval_metrics.get("adapter")
    if not adapter:
        return None
    adapter_dir = Path(adapter)
    for run_dir in (adapter_dir, adapter_dir.parent):
        logs = generation_logs(generation_log_dir(run_dir)) if run_dir.is_dir() and run_dir != out else []
        if logs:
            return logs[0]
    return None


def _sample_key(entry: dict[str, Any]) -> Any:
    return entry.get("id") if entry.get("id") is not None else entry.get("sample_index")


def compare_samples(baseline: list[dict[str, Any]], final: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per prompt logged in both: {key, baseline, final, change}, sorted by change, biggest first."""
    first = {_sample_key(e): e for e in baseline}
    rows = []
    for entry in final:
        before = first.get(_sample_key(entry))
        if before is None:
            continue
        change = float(entry.get("reward_total") or 0.0) - float(before.get("reward_total") or 0.0)
        rows.append({"key": _sample_key(entry), "baseline": before, "final": entry, "change": change})
    return sorted(rows, key=lambda r: -r["change"])


# ---------------------------------------------------------------------------------------------------------------------
# HTML pieces (every piece of run text goes through _e)
# ---------------------------------------------------------------------------------------------------------------------

def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:
            return "n/a"
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.2e}"
        text = f"{value:.{digits}f}".rstrip("0").rstrip(".")
        return "0" if text in ("-0", "") else text
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "—"
    return "—" if value in (None, "") else str(value)


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "—"
    seconds = int(round(seconds))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def _card(label: str, value: str) -> str:
    return f'<div class="card"><div class="k">{_e(label)}</div><div class="v">{_e(value)}</div></div>'


def _arrow(before: Any, after: Any) -> str:
    if isinstance(before, (int, float)) and isinstance(after, (int, float)):
        return f"{_fmt(float(before))} → {_fmt(float(after))}"
    return "—"


def greedy_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The greedy before/after numbers of metrics_summary.json: the `generation_eval` block, or the flat
    `generation_eval_baseline` / `_final` / `_pass@k` keys of earlier runs."""
    block = summary.get("generation_eval")
    if isinstance(block, dict):
        return block
    flat = {"baseline": summary.get("generation_eval_baseline"), "final": summary.get("generation_eval_final")}
    flat.update({k[len("generation_eval_"):]: v for k, v in summary.items() if k.startswith("generation_eval_pass@")})
    return flat


def _summary_section(summary: dict[str, Any], eval_metrics: dict[str, Any]) -> str:
    cards = []
    if "global_step" in summary:
        cards.append(_card("steps", str(summary["global_step"])))
    if "train_seconds" in summary:
        cards.append(_card("training time", _duration(summary["train_seconds"])))
    if summary.get("train_reward_first") is not None:
        cards.append(_card("train reward (first → last step)",
                           _arrow(summary["train_reward_first"], summary.get("train_reward_last"))))
    greedy = greedy_summary(summary)
    if greedy.get("baseline") is not None:
        where = "held-out" if greedy.get("held_out", True) else "training"
        prompts = f"{greedy['prompts']} {where} prompts, " if greedy.get("prompts") else ""
        cards.append(_card(f"greedy reward ({prompts}step {greedy.get('baseline_step', 0)} → "
                           f"{greedy.get('final_step', 'end')})", _arrow(greedy["baseline"], greedy.get("final"))))
    if eval_metrics.get("global_step") is not None and "global_step" not in summary:
        cards.append(_card("adapter trained for", f"{eval_metrics['global_step']} steps"))
    adapter_greedy = (eval_metrics.get("generation_log") or {}).get("reward_mean")
    if adapter_greedy is not None and greedy.get("baseline") is None:
        cards.append(_card("greedy eval reward (this adapter)", _fmt(adapter_greedy)))
    sampled = (summary.get("eval") or eval_metrics.get("eval") or {}).get("eval_reward")
    if sampled is not None:
        cards.append(_card("sampled eval reward (end)", _fmt(sampled)))
    for key in sorted(k for k in greedy if k.startswith("pass@")):
        cards.append(_card(f"{key} (sampled)", _fmt(greedy[key])))
    rows = []
    for key, label in (("backend", "backend"), ("total_seconds", "total time"), ("train_loss", "mean train loss"),
                       ("best_checkpoint", "best checkpoint"), ("best_metric", "best eval metric"),
                       ("output_dir", "output directory")):
        if summary.get(key) not in (None, ""):
            value = _duration(summary[key]) if key == "total_seconds" else _fmt(summary[key])
            rows.append(f"<tr><td>{_e(label)}</td><td>{_e(value)}</td></tr>")
    if summary.get("resumed_from"):
        rows.append(f"<tr><td>resumed from</td><td>{_e(summary['resumed_from'])}</td></tr>")
    if eval_metrics.get("adapter"):
        rows.append(f"<tr><td>evaluated adapter</td><td>{_e(eval_metrics['adapter'])}</td></tr>")
    for notice in summary.get("notices") or []:
        rows.append(f"<tr><td>note</td><td>{_e(notice)}</td></tr>")
    table = f'<table class="kv">{"".join(rows)}</table>' if rows else ""
    return f'<div class="cards">{"".join(cards)}</div>{table}' if cards or rows else ""


def _setting(config: dict[str, Any], key: str) -> str:
    """A setting as the run used it: an adaptive group size is its range and schedule, not num_generations (which
    only evaluation keeps)."""
    if key == "num_generations" and config.get("adaptive_group_size"):
        return (f"{config.get('min_group_size')} -> {config.get('max_group_size')} "
                f"({config.get('group_size_schedule', 'linear')}; evaluation {_fmt(config[key])})")
    return _fmt(config[key])


def _config_section(config: dict[str, Any]) -> str:
    if not config:
        return '<p class="note">No run_config.json in this directory: the settings are not known.</p>'
    rows = [f"<tr><td>{_e(label)}</td><td>{_e(_setting(config, key))}</td></tr>"
            for key, label in KEY_SETTINGS if key in config and config[key] not in (None, "", [])]
    full = json.dumps(config, indent=2, ensure_ascii=False, default=str)
    return (f'<table class="kv">{"".join(rows)}</table>'
            f'<details><summary>Full configuration ({len(config)} fields)</summary>'
            f'<pre class="config">{_e(full)}</pre></details>')


def _plots_section(plots: list[Path]) -> str:
    images = []
    for path in plots:
        if path.suffix.lower() != ".png" or not path.exists():
            continue
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        images.append(f'<img alt="{_e(path.stem.replace("_", " "))}" src="data:image/png;base64,{data}">')
    if not images:
        return '<p class="note">No curves: this directory has no trainer_state.json with logged steps.</p>'
    return f'<div class="plots">{"".join(images)}</div>'


def _prompt_text(prompt: Any) -> str:
    """The prompt as a reader wants it: the user's words; role labels only for a multi-turn conversation."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        turns = [m for m in prompt if isinstance(m, dict) and m.get("role") != "system"]
        if len(turns) == 1:
            return str(turns[0].get("content", ""))
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in turns)
    return json.dumps(prompt, ensure_ascii=False)


def _side(label: str, entry: dict[str, Any]) -> str:
    rewards = entry.get("rewards") or {}
    parts = [f"<span><b>total {_e(_fmt(entry.get('reward_total')))}</b></span>"]
    if len(rewards) > 1 or (rewards and entry.get("reward_total") != next(iter(rewards.values()))):
        parts += [f"<span>{_e(name)} {_e(_fmt(value))}</span>" for name, value in rewards.items()]
    meta = f"{entry.get('completion_tokens', '?')} tokens"
    tag = '<span class="tag">cut at the length limit</span>' if entry.get("truncated") else ""
    if entry.get("hack_suspected"):  # the code reward's monitor flagged this completion (docs/code-tasks.md)
        tag += f'<span class="tag">hack suspected: {_e(", ".join(map(str, entry["hack_suspected"])))}</span>'
    if entry.get("trajectory"):  # a tool run: every turn, each call with what it returned
        calls = entry.get("tool_calls") or []
        failed = sum(1 for c in calls if c.get("failed"))
        tag += f'<span class="tag">{len(calls)} tool call{"s" if len(calls) != 1 else ""}' + \
            (f", {failed} failed" if failed else "") + "</span>"
        body = _trajectory_html(entry["trajectory"])
    else:
        body = f'<div class="text">{_e(entry.get("generated", ""))}</div>'
    return (f'<div class="side"><div class="label">{_e(label)} · step {_e(entry.get("global_step", "?"))} · '
            f'{_e(meta)}{tag}</div>{body}'
            f'<div class="rewards">{"".join(parts)}</div></div>')


def _trajectory_html(messages: list[dict[str, Any]]) -> str:
    """A multi-turn completion as a reader follows it: the model's turns, its tool calls, the tools' results."""
    out = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role", "assistant")
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        if role == "tool":
            out.append(f'<div class="text tool">↳ {_e(message.get("name") or "tool")}: {_e(text)}</div>')
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            arguments = json.dumps(function.get("arguments"), ensure_ascii=False)
            out.append(f'<div class="text call">→ {_e(function.get("name"))}({_e(arguments)})</div>')
        if text:
            out.append(f'<div class="text">{_e(text)}</div>')
    return "".join(out) or '<div class="text"></div>'



def _sample_html(row: dict[str, Any]) -> str:
    change = row["change"]
    css = "up" if change > 1e-9 else "down" if change < -1e-9 else "same"
    final = row["final"]
    reference = ""
    for key, label in (("reference_answer", "reference answer"), ("reference_chosen", "preferred reply")):
        if final.get(key) not in (None, ""):
            text = str(final[key])
            text = text if len(text) <= 400 else text[:400] + " …"
            reference = f'<div class="ref">{_e(label)}: {_e(text)}</div>'
            break
    return (f'<div class="sample"><div class="head"><div><div class="prompt">{_e(_prompt_text(final.get("prompt")))}'
            f'</div>{reference}</div><div class="delta {css}">{"+" if change > 0 else ""}{_e(_fmt(change))}</div>'
            f'</div><div class="pair">{_side("baseline", row["baseline"])}{_side("final", final)}</div></div>')


def _samples_section(baseline, final, note: str = "") -> str:
    if final is None:
        return ('<p class="note">No generation logs: generation logging was off for this run '
                '(--enable-generation-logging turns it on).</p>')
    (base_step, base_entries), (final_step, final_entries) = baseline, final
    intro = note
    if base_step == final_step and base_entries is final_entries:
        intro += (f'<p class="note">Only one generation log (step {_e(final_step)}): nothing to compare it with; '
                  'the completions are shown on both sides.</p>')
    rows = compare_samples(base_entries, final_entries)
    if not rows:
        return intro + '<p class="note">The first and last generation logs share no prompt (different ids).</p>'
    improved = [r for r in rows if r["change"] > 1e-9]
    regressed = sorted((r for r in rows if r["change"] < -1e-9), key=lambda r: r["change"])
    unchanged = [r for r in rows if abs(r["change"]) <= 1e-9]
    mean = sum(r["change"] for r in rows) / len(rows)
    parts = [intro, f'<p>{len(rows)} prompts, baseline = step {_e(base_step)}, final = step {_e(final_step)}: '
                    f'<b class="up">{len(improved)} improved</b>, <b class="down">{len(regressed)} regressed</b>, '
                    f'{len(unchanged)} unchanged; mean change {_e(("+" if mean > 0 else "") + _fmt(mean))}.</p>']
    if improved:
        parts.append(f"<h3>Improved ({len(improved)}), biggest gain first</h3>")
        parts += [_sample_html(r) for r in improved]
    if regressed:
        parts.append(f"<h3>Regressed ({len(regressed)}), biggest loss first</h3>")
        parts += [_sample_html(r) for r in regressed]
    if unchanged:
        parts.append(f"<details{' open' if len(unchanged) <= 8 else ''}><summary>Unchanged ({len(unchanged)})"
                     "</summary>" + "".join(_sample_html(r) for r in unchanged) + "</details>")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------------------------------

def write_report(output_dir: str | Path, plots: list[Path] | None = None) -> Path:
    """Write OUTPUT_DIR/report.html and return its path. `plots`: PNGs already drawn by make_plots (None: draw
    them now). Works on a training run's output dir and on an --eval-only result directory."""
    out = Path(output_dir).expanduser()
    if not out.is_dir():
        raise UsageError(f"{out} is not a directory: give a run's --output-dir.")
    summary = _optional_json(out / METRICS_SUMMARY)
    eval_metrics = _optional_json(out / EVAL_METRICS)
    config = run_config(out)
    if not config and eval_metrics.get("adapter"):
        # An --eval-only result: the settings are those of the run that trained the adapter.
        adapter_dir = Path(eval_metrics["adapter"])
        for candidate in (adapter_dir, adapter_dir.parent):
            config = run_config(candidate) if candidate.is_dir() else {}
            if config:
                break
    logs = generation_logs(generation_log_dir(out))
    if not (summary or eval_metrics or config or logs or (out / TRAINER_STATE).exists()):
        raise UsageError(f"{out} has no run files (metrics_summary.json, trainer_state.json, generation logs): give "
                         "a run's --output-dir.")
    if plots is None:
        try:
            plots = make_plots(out)
        except UsageError:
            plots = []  # nothing to draw (an --eval-only result): the page still has the completions
    final = logs[-1] if logs else None
    baseline = logs[0] if logs else None
    note = ""
    if eval_metrics and len(logs) == 1:
        run_baseline = _baseline_from_adapter_run(out, eval_metrics)
        if run_baseline is not None:
            baseline = run_baseline
            note = ('<p class="note">Baseline: the step-0 generation log of the run that trained this adapter.</p>')

    model = config.get("model_name") or summary.get("model") or "?"
    title = f"GRPO run report: {model}"
    created = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    body = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="sub">{_e(out.resolve())} · report written {_e(created)}</p>',
        _summary_section(summary, eval_metrics) or (
            '<p class="note">No metrics_summary.json: the run has not finished (or was stopped); the numbers below '
            "come from its newest checkpoint and generation logs.</p>"),
        "<h2>Settings</h2>", _config_section(config),
        "<h2>Curves</h2>", _plots_section(plots),
        "<h2>Completions: baseline vs final</h2>", _samples_section(baseline, final, note),
    ]
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{CSS}</style></head>"
            f"<body><main>{''.join(body)}</main></body></html>\n")
    path = out / REPORT_FILE
    path.write_text(page, encoding="utf-8")
    return path


def redraw(output_dir: str | Path, report: bool = True) -> list[Path]:
    """`python train_grpo.py report OUTPUT_DIR`: redraw plots/*.png and rewrite report.html from the run's files
    alone (no model, no config). Returns the files written."""
    written = make_plots(output_dir)
    if report:
        written.append(write_report(output_dir, plots=written))
    return written

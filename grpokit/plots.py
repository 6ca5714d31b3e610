"""PNG curves of a run, each answering one question, from the files the run leaves in its output directory.

    python train_grpo.py report OUTPUT_DIR     # redraw OUTPUT_DIR/plots/*.png and rewrite OUTPUT_DIR/report.html

| file                    | question                                               | read from                                 |
|-------------------------|--------------------------------------------------------|-------------------------------------------|
| reward.png              | Is the training reward going up? Which component moves? | `reward` ± `reward_std`, `rewards/*/mean` |
| eval_reward.png         | Does it hold on prompts it does not train on?           | `eval_reward`, generation_logs/*.json     |
| completion_length.png   | Are completions getting longer, or hitting the limit?   | `completions/*_length`, `clipped_ratio`   |
| kl.png                  | How far has the policy moved from the reference?        | `kl` (only when beta > 0)                 |
| learning_rate.png       | What learning rate did each step use?                    | `learning_rate`                           |

The numbers are TRL's: trainer_state.json's `log_history` holds one entry per logged step (train metrics), one per
evaluation (`eval_*`) and a final one (`train_runtime`, ...). The greedy eval reward comes from the generation logs:
the same prompts decoded greedily before training (step 0) and at every evaluation.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from config.errors import UsageError
from grpokit.run_dir import PLOTS_DIR, TRAINER_STATE, generation_log_dir, generation_logs, log_history, run_config

# Matplotlib's default cycle minus the colour kept for totals, so a component never looks like the total.
TOTAL_COLOR = "#222222"
COMPONENT_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
GREEDY_COLOR = "#d62728"

Series = tuple[list[int], list[float]]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def series(history: list[dict[str, Any]], key: str) -> Series:
    """(steps, values) of one metric; entries without it, or with None / NaN (TRL logs None when no sample of a
    step could be scored), are left out."""
    steps, values = [], []
    for entry in history:
        value = _number(entry.get(key))
        if value is not None and "step" in entry:
            steps.append(int(entry["step"]))
            values.append(value)
    return steps, values


def reward_components(history: list[dict[str, Any]], prefix: str = "") -> list[str]:
    """Component names in the order TRL logged them (`rewards/<name>/mean`, `eval_rewards/<name>/mean`)."""
    names: list[str] = []
    start = f"{prefix}rewards/"
    for entry in history:
        for key in entry:
            if key.startswith(start) and key.endswith("/mean"):
                name = key[len(start):-len("/mean")]
                if name not in names:
                    names.append(name)
    return names


def _same(a: Series, b: Series) -> bool:
    return a[0] == b[0] and all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9) for x, y in zip(a[1], b[1], strict=True))


def greedy_rewards(logs: list[tuple[int, list[dict[str, Any]]]]) -> tuple[Series, dict[str, Series]]:
    """Mean greedy reward per generation log, total and per component."""
    total: Series = ([], [])
    components: dict[str, Series] = {}
    for step, entries in logs:
        totals = [v for v in (_number(e.get("reward_total")) for e in entries) if v is not None]
        if not totals:
            continue
        total[0].append(step)
        total[1].append(sum(totals) / len(totals))
        names = [n for n in (entries[0].get("rewards") or {})]
        for name in names:
            values = [v for v in (_number((e.get("rewards") or {}).get(name)) for e in entries) if v is not None]
            if values:
                xs, ys = components.setdefault(name, ([], []))
                xs.append(step)
                ys.append(sum(values) / len(values))
    return total, components


# ---------------------------------------------------------------------------------------------------------------------
# Drawing
# ---------------------------------------------------------------------------------------------------------------------

def _figure(title: str, subtitle: str):
    # matplotlib's Figure without pyplot: files only (Agg, the default canvas for PNG), no global figure registry,
    # and not pyplot's import (~0.5 s of every run's end)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.2), dpi=110)
    ax = fig.subplots()
    fig.suptitle(title, x=0.01, ha="left", fontsize=13, fontweight="bold")
    import textwrap

    # Long subtitles wrap instead of running off the figure (matplotlib does not wrap titles itself).
    ax.set_title(textwrap.fill(subtitle, 100), loc="left", fontsize=9, color="#555555")
    ax.grid(alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    return fig, ax


def _step_axis(ax, steps: list[int]) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # optimizer steps are whole numbers
    ax.set_xlabel("optimizer step")
    if steps:
        low, high = min(steps), max(steps)
        pad = max(0.5, (high - low) * 0.03)
        ax.set_xlim(low - pad, high + pad)


def _marker(n: int) -> dict[str, Any]:
    # Points carry information on a short run; on a long one they only hide the line.
    return {"marker": "o", "markersize": 4} if n <= 40 else {}


def _smoothed(values: list[float]) -> list[float] | None:
    """Trailing moving average for long runs, where the per-step GRPO reward is too noisy to read."""
    if len(values) < 30:
        return None
    window = max(5, len(values) // 20)
    out, running = [], 0.0
    for i, value in enumerate(values):
        running += value
        if i >= window:
            running -= values[i - window]
        out.append(running / min(i + 1, window))
    return out


def _line(ax, xs, ys, label, color, width=2.0, **kwargs):
    smooth = _smoothed(ys)
    if smooth is None:
        ax.plot(xs, ys, label=label, color=color, linewidth=width, **_marker(len(xs)), **kwargs)
    else:
        ax.plot(xs, ys, color=color, linewidth=0.8, alpha=0.35, **kwargs)
        ax.plot(xs, smooth, label=f"{label} (moving average)", color=color, linewidth=width, **kwargs)


def _save(fig, path: Path, legend_axes=()) -> Path:
    for ax in legend_axes:
        handles, labels = ax.get_legend_handles_labels()
        if len(labels) > 1:
            ax.legend(fontsize=8, loc="best", framealpha=0.85)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def plot_reward(history, path: Path) -> Path | None:
    total = series(history, "reward")
    std = series(history, "reward_std")
    components = {name: series(history, f"rewards/{name}/mean") for name in reward_components(history)}
    components = {n: s for n, s in components.items() if s[0]}
    if len(components) == 1 and total[0] and _same(next(iter(components.values())), total):
        components = {}  # 'single' mode logs the total twice (`reward` and `rewards/<name>/mean`): draw it once
    if not total[0] and not components:
        return None
    multi = bool(components)
    fig, ax = _figure("Training reward",
                      "mean over each step's sampled completions; band = ± std across them"
                      + ("; components unweighted, total = weighted sum" if multi else ""))
    if total[0]:
        std_by_step = dict(zip(*std, strict=True))
        if std_by_step and len(total[0]) == 1:  # a band needs two points
            ax.errorbar(total[0], total[1], yerr=[std_by_step.get(total[0][0], 0.0)], color=TOTAL_COLOR, capsize=4,
                        alpha=0.5, linewidth=0, elinewidth=1.5)
        elif std_by_step and not _smoothed(total[1]):
            low = [v - std_by_step.get(s, 0.0) for s, v in zip(*total, strict=True)]
            high = [v + std_by_step.get(s, 0.0) for s, v in zip(*total, strict=True)]
            ax.fill_between(total[0], low, high, color=TOTAL_COLOR, alpha=0.12, linewidth=0, label="± std")
        _line(ax, *total, "total reward" if multi else "reward", TOTAL_COLOR, width=2.4)
    for (name, (xs, ys)), color in zip(components.items(), COMPONENT_COLORS * 4, strict=False):
        _line(ax, xs, ys, name, color, width=1.5, linestyle="--")
    ax.set_ylabel("reward (mean per completion)")
    _step_axis(ax, total[0] or next(iter(components.values()))[0])
    return _save(fig, path, [ax])


def plot_eval_reward(history, logs, path: Path) -> Path | None:
    sampled = series(history, "eval_reward")
    sampled_std = series(history, "eval_reward_std")
    greedy, greedy_components = greedy_rewards(logs)
    if not sampled[0] and not greedy[0]:
        return None
    fig, ax = _figure("Eval reward",
                      "greedy: the logged eval prompts, one decode each (step 0 = before training); "
                      "sampled: TRL's evaluation, ± std")
    if sampled[0]:
        # Evaluations are few and far between: error bars on each point read better than a band.
        std_by_step = dict(zip(*sampled_std, strict=True))
        errors = [std_by_step.get(step, 0.0) for step in sampled[0]]
        ax.errorbar(sampled[0], sampled[1], yerr=errors if any(errors) else None, color=COMPONENT_COLORS[0],
                    linewidth=2.0, capsize=4, label="sampled (eval split), ± std", **_marker(len(sampled[0])))
    if greedy[0]:
        _line(ax, *greedy, "greedy (generation logs)", GREEDY_COLOR, width=2.4)
        if len(greedy_components) > 1:
            for (name, (xs, ys)), color in zip(greedy_components.items(), COMPONENT_COLORS[1:] * 4, strict=False):
                _line(ax, xs, ys, f"greedy {name}", color, width=1.2, linestyle=":")
    ax.set_ylabel("reward (mean per prompt)")
    _step_axis(ax, sorted(set(sampled[0]) | set(greedy[0])))
    return _save(fig, path, [ax])


def plot_completion_length(history, path: Path, max_length: int | None) -> Path | None:
    mean = series(history, "completions/mean_length")
    if not mean[0]:
        return None
    low, high = series(history, "completions/min_length"), series(history, "completions/max_length")
    clipped = series(history, "completions/clipped_ratio")
    fig, ax = _figure("Completion length",
                      "mean tokens per sampled completion (band: shortest–longest); "
                      "clipped = cut at the length limit before ending")
    if low[0] == mean[0] and high[0] == mean[0] and not _smoothed(mean[1]):
        ax.fill_between(mean[0], low[1], high[1], color=COMPONENT_COLORS[0], alpha=0.12, linewidth=0,
                        label="min–max")
    _line(ax, *mean, "mean length", COMPONENT_COLORS[0])
    if max_length:
        ax.axhline(max_length, color="#777777", linestyle="--", linewidth=1, label=f"limit ({max_length} tokens)")
    ax.set_ylabel("completion length (tokens)")
    # Head room above the limit, so the limit line and the legend do not sit on the frame.
    ax.set_ylim(0, max(high[1] + mean[1] + [max_length or 0]) * 1.25)
    axes = [ax]
    if clipped[0]:
        right = ax.twinx()
        right.spines[["top"]].set_visible(False)
        _line(right, clipped[0], [100 * v for v in clipped[1]], "clipped (right axis)", COMPONENT_COLORS[1],
              width=1.5, linestyle="--")
        right.set_ylabel("clipped completions (%)")
        right.set_ylim(-2, 102)
        # One legend for both axes.
        handles, labels = ax.get_legend_handles_labels()
        more_handles, more_labels = right.get_legend_handles_labels()
        ax.legend(handles + more_handles, labels + more_labels, fontsize=8, loc="best", framealpha=0.85)
        axes = []
    _step_axis(ax, mean[0])
    return _save(fig, path, axes)


def plot_kl(history, path: Path) -> Path | None:
    kl = series(history, "kl")
    if not kl[0] or not any(kl[1]):
        return None  # beta = 0: TRL does not compute the KL (or logs zeros); an empty plot would only puzzle
    fig, ax = _figure("KL divergence to the reference model",
                      "mean per completion token over the step's samples; what beta penalises")
    _line(ax, *kl, "KL", COMPONENT_COLORS[4])
    ax.set_ylabel("KL (nats per token)")
    _step_axis(ax, kl[0])
    return _save(fig, path, [ax])


def plot_learning_rate(history, path: Path) -> Path | None:
    lr = series(history, "learning_rate")
    if not lr[0]:
        return None
    fig, ax = _figure("Learning rate", "as the scheduler set it for each optimizer step")
    ax.plot(*lr, color=COMPONENT_COLORS[2], linewidth=2, **_marker(len(lr[0])))
    ax.set_ylabel("learning rate")
    from matplotlib.ticker import FuncFormatter

    # Each tick says its value (2.00e-04), instead of a shared "1e-4" offset label in the corner.
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.2e}" if value else "0"))
    ax.set_ylim(bottom=0)
    _step_axis(ax, lr[0])
    return _save(fig, path, [])


def make_plots(output_dir: str | Path) -> list[Path]:
    """Draw every plot the run has data for into OUTPUT_DIR/plots/; returns the files written (stale ones from an
    earlier draw that no longer have data are removed, so the directory shows what this run has)."""
    out = Path(output_dir).expanduser()
    if not out.is_dir():
        raise UsageError(f"{out} is not a directory: give a run's --output-dir.")
    history = log_history(out)
    logs = generation_logs(generation_log_dir(out))
    if not history and not logs:
        raise UsageError(f"{out} has no {TRAINER_STATE}, checkpoint or generation log: give a run's --output-dir "
                         "(plots are drawn when a run ends).")
    max_length = _number(run_config(out).get("max_completion_length"))
    plots_dir = out / PLOTS_DIR
    drawers = {
        "reward.png": lambda p: plot_reward(history, p),
        "eval_reward.png": lambda p: plot_eval_reward(history, logs, p),
        "completion_length.png": lambda p: plot_completion_length(history, p, int(max_length) if max_length else None),
        "kl.png": lambda p: plot_kl(history, p),
        "learning_rate.png": lambda p: plot_learning_rate(history, p),
    }
    written = []
    for name, draw in drawers.items():
        path = draw(plots_dir / name)
        if path is not None:
            written.append(path)
        elif (plots_dir / name).exists():
            (plots_dir / name).unlink()
    return written

"""PNG curves of a run from its trainer_state.json: reward (total and per component), KL, completion length,
learning rate, and the greedy eval reward from the generation logs. `python plots.py OUTPUT_DIR` redraws them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

PANELS = {
    "reward.png": ("Reward (sampled, train)", lambda k: k == "reward" or (k.startswith("rewards/") and k.endswith("/mean"))),
    "kl.png": ("KL to the reference model", lambda k: k == "kl"),
    "completion_length.png": ("Completion length (tokens)", lambda k: k == "completions/mean_length"),
    "learning_rate.png": ("Learning rate", lambda k: k == "learning_rate"),
    "eval_reward.png": ("Eval reward", lambda k: k == "eval_reward" or (k.startswith("eval_rewards/") and k.endswith("/mean"))),
}


def make_plots(output_dir: str | Path) -> list[Path]:
    """Write one PNG per panel that has data; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    out = Path(output_dir)
    state_file = out / "trainer_state.json"
    if not state_file.exists():
        raise FileNotFoundError(f"{state_file} not found: is {out} a run's output directory?")
    history = json.loads(state_file.read_text())["log_history"]
    written = []
    for filename, (title, wanted) in PANELS.items():
        series: dict[str, tuple[list, list]] = {}
        for entry in history:
            for key, value in entry.items():
                if wanted(key) and isinstance(value, (int, float)) and "step" in entry:
                    xs, ys = series.setdefault(key, ([], []))
                    xs.append(entry["step"])
                    ys.append(value)
        if filename == "eval_reward.png":
            greedy = _generation_log_means(out / "generation_logs")
            if greedy:
                series["greedy eval reward (generation logs)"] = greedy
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="o", markersize=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / "plots" / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _generation_log_means(log_dir: Path) -> tuple[list, list] | None:
    files = sorted(log_dir.glob("generation_log_step_*.json"), key=lambda p: int(p.stem.rsplit("_", 1)[-1]))
    points = []
    for file in files:
        entries = json.loads(file.read_text())
        if entries:
            points.append((entries[0]["global_step"], sum(e["reward_total"] for e in entries) / len(entries)))
    return ([p[0] for p in points], [p[1] for p in points]) if points else None


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python plots.py OUTPUT_DIR")
    for written_path in make_plots(sys.argv[1]):
        print(written_path)

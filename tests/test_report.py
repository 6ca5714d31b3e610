"""plots.py and report.py on small output directories shaped exactly like a real run's.

The builders below copy the structure of a real quick-test run (TRL 1.15 through Unsloth's CPU backend):
trainer_state.json's log_history with one entry per logged step, one per evaluation (`eval_*`) and a final
`train_runtime` entry; generation_logs/generation_log_step_{n}.json written by callbacks.GenerationLogger.
"""

import json
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from config.errors import UsageError
from grpokit import plots, report

ROOT = Path(__file__).resolve().parent.parent

PROMPTS = [("0 + 9", "9"), ("6 + 5", "11"), ("9 + 1", "10"), ("3 + 4", "7")]


def _train_entry(step: int, reward: float, components: dict[str, float], kl: float | None = None) -> dict:
    entry = {
        "loss": 0.01 * step - 0.02, "grad_norm": 0.4, "learning_rate": 2e-4 * (1 - (step - 1) / 6),
        "num_tokens": 430.0 * step, "completions/mean_length": 9.75 - 0.5 * step, "completions/min_length": 6.0,
        "completions/max_length": 10.0, "completions/clipped_ratio": max(0.0, 0.875 - 0.2 * step),
        "completions/mean_terminated_length": 8.0, "completions/min_terminated_length": 6.0,
        "completions/max_terminated_length": 9.0,
    }
    for name, value in components.items():
        entry[f"rewards/{name}/mean"] = value
        entry[f"rewards/{name}/std"] = 0.4
    entry.update({"reward": reward, "reward_std": 0.3, "frac_reward_zero_std": 0.5, "entropy": 1.35})
    if kl is not None:
        entry["kl"] = kl
    entry.update({"clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0, "clip_ratio/region_mean": 0.0,
                  "clip_ratio/low_min": 0.0, "clip_ratio/high_max": 0.0, "step_time": 3.1,
                  "epoch": step / 32, "step": step})
    return entry


def _eval_entry(step: int, reward: float, components: dict[str, float]) -> dict:
    entry = {"eval_loss": 0.0, "eval_runtime": 4.2, "eval_samples_per_second": 7.6, "eval_steps_per_second": 0.95,
             "eval_num_tokens": 430.0 * step, "eval_completions/mean_length": 9.0, "eval_completions/min_length": 6.0,
             "eval_completions/max_length": 10.0, "eval_completions/clipped_ratio": 0.5,
             "eval_completions/mean_terminated_length": 8.0, "eval_completions/min_terminated_length": 6.0,
             "eval_completions/max_terminated_length": 9.0}
    for name, value in components.items():
        entry[f"eval_rewards/{name}/mean"] = value
        entry[f"eval_rewards/{name}/std"] = 0.4
    entry.update({"eval_reward": reward, "eval_reward_std": 0.45, "eval_frac_reward_zero_std": 0.5,
                  "eval_entropy": 1.3, "eval_clip_ratio/low_mean": 0.0, "eval_clip_ratio/high_mean": 0.0,
                  "eval_clip_ratio/region_mean": 0.0, "eval_clip_ratio/low_min": 0.0, "eval_clip_ratio/high_max": 0.0,
                  "epoch": step / 32, "step": step})
    return entry


def _sample(step: int, index: int, generated: str, rewards: dict[str, float], weights: dict[str, float]) -> dict:
    question, answer = PROMPTS[index]
    prompt = [{"role": "user", "content": f"What is {question}? Answer with just the number."}]
    return {
        "eval_step": 0, "global_step": step, "sample_index": index, "id": f"arith-{question.replace(' ', '')}",
        "prompt": prompt, "generated": generated,
        "full_response": "<|im_start|>user\n" + prompt[0]["content"] + "<|im_end|>\n<|im_start|>assistant\n"
                         + generated,
        "rewards": rewards, "reward_total": sum(weights[k] * v for k, v in rewards.items()),
        "completion_tokens": len(generated.split()) + 1, "truncated": len(generated) > 30,
        "reference_answer": answer,
    }


def make_run(tmp_path: Path, mode: str = "single", steps: int = 6, eval_steps: int = 2, beta: float = 0.0,
             with_config: bool = True) -> Path:
    """A finished run's output directory: trainer_state.json, metrics_summary.json, generation logs (and
    run_config.json)."""
    out = tmp_path / f"run_{mode}"
    weights = {"reward_total": 1.0} if mode == "single" else {"accuracy": 1.0, "format": 0.5}
    history = []
    for step in range(1, steps + 1):
        accuracy = min(1.0, 0.1 * step)
        if mode == "single":
            components = {"reward_total": accuracy}
        else:
            components = {"accuracy": accuracy, "format": 1.0 - 0.05 * step}
        total = sum(weights[k] * v for k, v in components.items())
        history.append(_train_entry(step, total, components, kl=0.001 * step if beta else None))  # TRL: no kl at beta 0
        if step % eval_steps == 0:
            history.append(_eval_entry(step, total + 0.05, components))
    history.append({"train_runtime": 60.0, "train_samples_per_second": 0.8, "train_steps_per_second": 0.1,
                    "total_flos": 0.0, "train_loss": 0.004, "epoch": steps / 32, "step": steps})
    out.mkdir(parents=True)
    state = {"best_global_step": None, "best_metric": None, "best_model_checkpoint": None, "epoch": steps / 32,
             "eval_steps": eval_steps, "global_step": steps, "is_hyper_param_search": False,
             "is_local_process_zero": True, "is_world_process_zero": True, "log_history": history,
             "logging_steps": 1, "max_steps": steps, "num_input_tokens_seen": 0, "num_train_epochs": 1,
             "save_steps": 2, "stateful_callbacks": {}, "total_flos": 0.0, "train_batch_size": 8, "trial_name": None,
             "trial_params": None}
    (out / "trainer_state.json").write_text(json.dumps(state, indent=2))

    def rewards_for(correct: bool, formatted: bool = True) -> dict[str, float]:
        if mode == "single":
            return {"reward_total": float(correct)}
        return {"accuracy": float(correct), "format": float(formatted)}

    log_dir = out / "generation_logs"
    log_dir.mkdir()
    baseline = [_sample(0, 0, "0 + 9 is 9", rewards_for(True), weights),
                _sample(0, 1, "To solve this problem, we need to add ", rewards_for(False), weights),
                _sample(0, 2, "10", rewards_for(True), weights),
                _sample(0, 3, "7", rewards_for(True), weights)]
    final = [_sample(steps, 0, "9", rewards_for(True), weights),
             _sample(steps, 1, "11", rewards_for(True), weights),
             _sample(steps, 2, "<script>alert('x')</script> 1 & 0", rewards_for(False, False), weights),
             _sample(steps, 3, "7", rewards_for(True), weights)]
    (log_dir / "generation_log_step_0.json").write_text(json.dumps(baseline, indent=2, ensure_ascii=False))
    for step in range(eval_steps, steps, eval_steps):
        middle = [dict(e, global_step=step) for e in baseline]
        (log_dir / f"generation_log_step_{step}.json").write_text(json.dumps(middle, indent=2))
    (log_dir / f"generation_log_step_{steps}.json").write_text(json.dumps(final, indent=2, ensure_ascii=False))
    mean = lambda entries: sum(e["reward_total"] for e in entries) / len(entries)  # noqa: E731
    summary = {"backend": "unsloth", "model": "smollm2-135m", "global_step": steps, "train_seconds": 75.3,
               "total_seconds": 140.2, "train_reward_first": history[0]["reward"],
               "train_reward_last": [h for h in history if "reward" in h][-1]["reward"], "train_loss": 0.004,
               "eval": {"eval_reward": 0.6}, "output_dir": str(out), "best_checkpoint": None, "best_metric": None,
               "resumed_from": None, "notices": ["a note from the run <i>"],
               "generation_eval": {"prompts": len(final), "held_out": True, "baseline_step": 0,
                                   "baseline": mean(baseline), "final_step": steps, "final": mean(final)},
               "generation_logging_seconds": 12.0, "generation_log_dir": str(log_dir)}
    (out / "metrics_summary.json").write_text(json.dumps(summary, indent=2))
    if with_config:
        config = {"model_name": "smollm2-135m", "dataset": "arithmetic", "reward_function_type": mode,
                  "reward_config_name": "arithmetic", "learning_rate": 2e-4, "max_steps": steps,
                  "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 10,
                  "temperature": 0.8, "beta": beta, "loss_type": "dapo", "lora_r": 16, "seed": 42,
                  "output_dir": str(out), "system_prompt": "<b>be brief</b>"}
        (out / "run_config.json").write_text(json.dumps(config, indent=2))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# PNG inspection without extra dependencies
# ---------------------------------------------------------------------------------------------------------------------

def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def png_distinct_colours(path: Path, limit: int = 50) -> int:
    """How many different pixel values the image has (up to `limit`): 1 means a blank page."""
    data = path.read_bytes()
    width, height = png_size(path)
    bit_depth, colour_type = data[24], data[25]
    assert bit_depth == 8 and colour_type in (2, 6), "8-bit RGB / RGBA expected"
    channels = 3 if colour_type == 2 else 4
    idat, pos = b"", 8
    while pos < len(data):
        length = struct.unpack(">I", data[pos:pos + 4])[0]
        kind = data[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    seen, previous = set(), bytearray(stride)
    for row in range(height):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):  # PNG filters: undo them to get the pixels
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            up_left = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else up_left)) & 0xFF
        if row % 7 == 0:  # a sample of rows is enough to tell blank from drawn
            seen.update(bytes(line[i:i + channels]) for i in range(0, stride, channels * 3))
            if len(seen) >= limit:
                return len(seen)
        previous = line
    return len(seen)


# ---------------------------------------------------------------------------------------------------------------------
# plots.py
# ---------------------------------------------------------------------------------------------------------------------

def test_single_mode_plots(tmp_path):
    out = make_run(tmp_path, "single")
    written = plots.make_plots(out)
    assert sorted(p.name for p in written) == ["completion_length.png", "eval_reward.png", "learning_rate.png",
                                                "reward.png"]  # no kl.png: beta = 0
    for path in written:
        assert path.parent == out / "plots"
        assert png_size(path) == (880, 462)
        assert png_distinct_colours(path) > 10


def test_single_mode_draws_the_duplicated_total_once(tmp_path, monkeypatch):
    out = make_run(tmp_path, "single")
    drawn = []
    real_line = plots._line
    monkeypatch.setattr(plots, "_line", lambda ax, xs, ys, label, *a, **k: (drawn.append(label),
                                                                             real_line(ax, xs, ys, label, *a, **k)))
    plots.plot_reward(plots.log_history(out), tmp_path / "r.png")
    assert drawn == ["reward"]  # `rewards/reward_total/mean` is the same number as `reward`


def test_multi_mode_draws_components_and_their_weighted_total(tmp_path, monkeypatch):
    out = make_run(tmp_path, "multi")
    drawn = []
    real_line = plots._line
    monkeypatch.setattr(plots, "_line", lambda ax, xs, ys, label, *a, **k: (drawn.append(label),
                                                                             real_line(ax, xs, ys, label, *a, **k)))
    plots.plot_reward(plots.log_history(out), tmp_path / "r.png")
    assert drawn == ["total reward", "accuracy", "format"]


def test_kl_only_when_beta_is_positive(tmp_path):
    assert "kl.png" not in [p.name for p in plots.make_plots(make_run(tmp_path, "multi", beta=0.0))]
    with_kl = make_run(tmp_path / "b", "single", beta=0.04)
    assert "kl.png" in [p.name for p in plots.make_plots(with_kl)]
    zeros = [{"kl": 0.0, "step": 1}, {"kl": 0.0, "step": 2}]  # logged but all zero: nothing to show
    assert plots.plot_kl(zeros, tmp_path / "kl.png") is None


def test_series_skips_none_and_nan(tmp_path):
    history = [{"reward": 0.5, "step": 1}, {"reward": None, "step": 2}, {"reward": float("nan"), "step": 3},
               {"eval_reward": 1.0, "step": 3}, {"reward": 1, "step": 4}]
    assert plots.series(history, "reward") == ([1, 4], [0.5, 1.0])


def test_greedy_eval_reward_comes_from_the_generation_logs(tmp_path):
    out = make_run(tmp_path, "multi")
    total, components = plots.greedy_rewards(plots.generation_logs(plots.generation_log_dir(out)))
    assert total[0] == [0, 2, 4, 6]
    assert total[1][0] == pytest.approx((1.5 + 0.5 + 1.5 + 1.5) / 4)
    assert set(components) == {"accuracy", "format"}


def test_long_run_is_smoothed_and_unmarked(tmp_path):
    out = make_run(tmp_path, "single", steps=200, eval_steps=50)
    written = plots.make_plots(out)
    assert len(written) == 4
    assert plots._smoothed([float(i) for i in range(200)]) is not None


def test_stale_plot_is_removed(tmp_path):
    out = make_run(tmp_path, "single")
    (out / "plots").mkdir()
    (out / "plots" / "kl.png").write_bytes(b"old")
    plots.make_plots(out)
    assert not (out / "plots" / "kl.png").exists()


def test_report_command(tmp_path):
    out = make_run(tmp_path, "single")
    run = subprocess.run([sys.executable, "train_grpo.py", "report", str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert str(out / "report.html") in run.stdout and str(out / "plots" / "reward.png") in run.stdout
    assert (out / "report.html").exists()


@pytest.mark.parametrize("args, message", [
    (["/nonexistent/run"], "error: /nonexistent/run is not a directory: give a run's --output-dir."),
    (["{empty}"], "has no trainer_state.json, checkpoint or generation log"),
    (["{broken}"], "trainer_state.json is not valid JSON"),
])
def test_report_command_errors_are_one_line(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "trainer_state.json").write_text('{"log_history": [')
    args = [a.format(empty=tmp_path / "empty", broken=tmp_path / "broken") for a in args]
    run = subprocess.run([sys.executable, "train_grpo.py", "report", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("error: ") and message in run.stderr
    assert "Traceback" not in run.stderr


# ---------------------------------------------------------------------------------------------------------------------
# report.py
# ---------------------------------------------------------------------------------------------------------------------

def test_report_is_self_contained_and_escaped(tmp_path):
    out = make_run(tmp_path, "multi")
    path = report.write_report(out)
    assert path == out / "report.html"
    page = path.read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') == 4
    for external in ("http://", "https://", "<script", "<link", "@import", "url("):
        assert external not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; 1 &amp; 0" in page  # model text, escaped
    assert "&lt;b&gt;be brief&lt;/b&gt;" in page  # config text too
    assert "smollm2-135m" in page and "learning rate" in page
    assert "greedy reward (4 held-out prompts, step 0 → 6)" in page and "a note from the run &lt;i&gt;" in page


def test_report_reads_the_flat_summary_keys_of_earlier_runs(tmp_path):
    out = make_run(tmp_path, "single")
    summary = json.loads((out / "metrics_summary.json").read_text())
    greedy = summary.pop("generation_eval")
    summary.update(generation_eval_baseline=greedy["baseline"], generation_eval_final=greedy["final"])
    summary["generation_eval_pass@4"] = 0.75
    (out / "metrics_summary.json").write_text(json.dumps(summary))
    page = report.write_report(out).read_text(encoding="utf-8")
    assert "greedy reward (step 0 → end)" in page and "pass@4 (sampled)" in page


def test_report_orders_wins_then_regressions(tmp_path):
    page = report.write_report(make_run(tmp_path, "multi")).read_text(encoding="utf-8")
    # 6 + 5: wrong -> right (+1.0); 9 + 1: right and formatted -> wrong, unformatted (-1.5); the rest unchanged.
    improved, regressed, unchanged = (page.index("Improved (1)"), page.index("Regressed (1)"),
                                      page.index("Unchanged (2)"))
    assert improved < page.index("What is 6 + 5?") < regressed < page.index("What is 9 + 1?") < unchanged
    assert '<div class="delta up">+1</div>' in page and '<div class="delta down">-1.5</div>' in page
    assert "1 improved" in page and "1 regressed" in page
    assert "accuracy 1" in page and "format 0" in page  # per-component rewards beside each completion


def test_compare_samples_sorted_by_change():
    base = [{"id": "a", "reward_total": 0.0}, {"id": "b", "reward_total": 1.0}, {"id": "c", "reward_total": 0.5}]
    final = [{"id": "a", "reward_total": 0.5}, {"id": "b", "reward_total": 0.0}, {"id": "c", "reward_total": 1.5},
             {"id": "new", "reward_total": 1.0}]
    assert [(r["key"], r["change"]) for r in report.compare_samples(base, final)] == [("c", 1.0), ("a", 0.5),
                                                                                      ("b", -1.0)]


def test_report_without_run_config_or_generation_logs(tmp_path):
    out = make_run(tmp_path, "single", with_config=False)
    shutil.rmtree(out / "generation_logs")
    summary = json.loads((out / "metrics_summary.json").read_text())
    summary.pop("generation_log_dir")
    (out / "metrics_summary.json").write_text(json.dumps(summary))
    page = report.write_report(out).read_text(encoding="utf-8")
    assert "No run_config.json" in page and "generation logging was off" in page
    assert page.count("data:image/png;base64,") == 4  # the eval curve still has TRL's sampled eval reward


def test_report_for_an_eval_only_result(tmp_path):
    run = make_run(tmp_path, "single")
    eval_dir = run / "eval_only" / "checkpoint-6-step_6"
    eval_dir.mkdir(parents=True)
    final = json.loads((run / "generation_logs" / "generation_log_step_6.json").read_text())
    (eval_dir / "generation_log_step_6.json").write_text(json.dumps(final))
    (eval_dir / "eval_metrics.json").write_text(json.dumps({
        "adapter": str(run / "checkpoint-6"), "global_step": 6, "eval": {"eval_reward": 0.55},
        "generation_log": {"reward_mean": 0.75}, "output_dir": str(eval_dir)}))
    (run / "checkpoint-6").mkdir()
    page = report.write_report(eval_dir).read_text(encoding="utf-8")
    assert "step-0 generation log of the run that trained this adapter" in page
    assert "No run_config.json" not in page and "dapo" in page  # the training run's settings
    assert "greedy eval reward (this adapter)" in page and "adapter trained for" in page
    assert "baseline = step 0, final = step 6" in page
    assert "evaluated adapter" in page


def test_write_report_refuses_a_directory_without_a_run(tmp_path):
    with pytest.raises(UsageError, match="has no run files"):
        report.write_report(tmp_path)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(CHROMIUM is None, reason="needs a headless browser: apt-get install -y chromium (Debian)")
def test_report_renders_in_a_real_browser(tmp_path):
    out = make_run(tmp_path, "multi")
    page = report.write_report(out)
    shot = tmp_path / "report.png"
    run = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          f"--screenshot={shot}", "--window-size=1200,2000", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert shot.exists(), run.stderr[-2000:]
    assert png_size(shot) == (1200, 2000)
    assert png_distinct_colours(shot) > 20  # a blank (or error) page has a handful of colours


def test_report_shows_what_the_code_monitor_flagged(tmp_path):
    out = make_run(tmp_path, "single")
    final_log = out / "generation_logs" / "generation_log_step_6.json"
    entries = json.loads(final_log.read_text())
    entries[0]["hack_suspected"] = ["frames", "ran frames: sys._getframe"]
    final_log.write_text(json.dumps(entries))
    page = report.write_report(out).read_text(encoding="utf-8")
    assert page.count("hack suspected: frames, ran frames: sys._getframe") == 1

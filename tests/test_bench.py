"""The benchmark scripts in their smallest mode, so they cannot rot (their numbers live in BENCHMARKS.md)."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


def _run(*args, timeout=900):
    result = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_learning_benchmark_tiny_mode():
    out = _run("bench/bench_learning.py", "--seeds", "5", "--tiny", "--eval-every", "1")
    (result,) = json.loads(out.strip().splitlines()[-1])
    assert result["steps"] == 1 and result["eval_prompts"] == 4
    # step 1 was logged; it reached the gain or not, and the training time to it is counted only if it did
    assert (result["gain_step"], result["seconds_to_gain"] is None) in ((1, False), (None, True))
    assert 0.0 <= result["before"] <= 1.0 and 0.0 <= result["after"] <= 1.0


def test_speed_benchmark_one_step():
    # float32 on the plain side: TRL's bf16 default is emulated on a CPU without bf16 units (~2 min for one step)
    out = _run("bench/bench_speed.py", "--rounds", "1", "--steps", "1", "--plain-fp32", "--completion-length", "8",
               "--batch", "4", "--generations", "2")
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ours"] > 0 and summary["plain"] > 0 and summary["ratio"] > 0


def test_step_profile_two_steps():
    rows = json.loads(_run("bench/profile_step.py", "--max-steps", "2").strip().splitlines()[-1])
    assert rows["step_time"] > 0 and rows["loss forward"] > 0 and rows["backward"] > 0 and rows["rollout"] > 0


def test_rewards_and_data_benchmarks_run():
    assert "balanced" in _run("bench/bench_rewards.py")
    assert "second run: 5000 rows -> " in _run("bench/bench_data.py", "--rows", "5000")  # the figure: 100k rows


def test_qa_agreement_benchmark_runs():
    out = _run("bench/bench_qa.py", "--repeat", "1")
    assert "| dev | 160 |" in out and "| held_out | 120 |" in out and "µs in the best of 1 rounds" in out


def test_rss_timeline_places_and_splits_the_peak(tmp_path):
    """A child that holds 200 MB of anonymous memory for a moment: the peak is seen, and counted as anonymous."""
    timeline = tmp_path / "timeline.tsv"
    out = _run("bench/rss_timeline.py", "--out", str(timeline), "--", sys.executable, "-c",
               "import time; block = bytearray(200 * 2**20); time.sleep(0.5)")
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["exit_code"] == 0 and summary["samples"] >= 3
    assert summary["peak_rss_mib"] >= 200 and summary["anon_mib"] >= 200
    assert timeline.read_text().splitlines()[0].split("\t") == ["seconds", "VmRSS", "RssAnon", "RssFile"]

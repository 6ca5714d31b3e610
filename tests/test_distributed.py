"""The same CLI under torchrun: 2 processes on CPU (gloo), the embedded model, 2 steps."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


def test_two_process_torchrun_run(tmp_path):
    out = tmp_path / "run"
    torchrun = Path(sys.executable).parent / "torchrun"
    assert torchrun.exists() or shutil.which("torchrun")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node", "2", "train_grpo.py", "--quick-test", "--max-steps", "2",
         "--set", "per_device_train_batch_size=4", "--set", "per_device_eval_batch_size=4",
         "--max-generation-samples", "2", "--output-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    # both ranks reached the same global step
    assert "rank 0 of 2 finished at global step 2" in result.stderr
    assert "rank 1 of 2 finished at global step 2" in result.stderr
    # one set of outputs, written once
    assert (out / "adapter_model.safetensors").exists()
    summary = json.loads((out / "metrics_summary.json").read_text())
    assert summary["global_step"] == 2
    assert sorted(p.name for p in (out / "generation_logs").iterdir()) == [
        "generation_log_step_0.json", "generation_log_step_2.json"]
    log_text = (out / "grpo_training.log").read_text()
    assert log_text.count("Config (preset quick_test)") == 1  # only rank 0 writes the log file
    assert result.stderr.count("GRPO run finished") == 1  # one summary

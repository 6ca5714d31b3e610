"""The GPU check's CPU-side parts (tools/gpu_check.sh, tools/gpu_check.py, tools/gpu_bundle.py; docs/gpu.md "The GPU
check"): the script's stages, timeouts and report in its dry mode, the report writer on fixtures, the wheel repacking
and RECORD, and the bundle's Requires-Dist against the GPU image's package list. Seconds; no downloads (the tests
that read gpu_bundle/ skip where it has not been built)."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

# tools/ modules; ruff would sort them by whether a gpu_bundle/ folder happens to exist here
import gpu_bundle  # noqa: E402, I001
import gpu_check  # noqa: E402

BUNDLE = ROOT / "gpu_bundle"
needs_bundle = pytest.mark.skipif(not any(BUNDLE.glob("*.whl")),
                                  reason="gpu_bundle/ not built (python tools/gpu_bundle.py build: ~14 MiB download)")


def test_scripts_parse():
    subprocess.run(["bash", "-n", str(ROOT / "tools" / "gpu_check.sh")], check=True)


def test_dry_run_goes_past_a_hang_and_a_failure(tmp_path):
    """GPU_CHECK_DRY=1: every stage replaced by its fixture; one hangs (killed at its timeout), one fails; the
    script still runs the rest and writes one report naming both, with the failure's last lines."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "GPU_CHECK_DRY": "1", "GPU_CHECK_PYTHON": sys.executable, "GPU_CHECK_WORK": str(work),
           "OUT": str(out), "GPU_CHECK_FAKE_HANG": "doctor"}
    proc = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "gpu_check.json").read_text())
    status = {s["name"]: s["status"] for s in doc["stages"]}
    assert status == {"install": "ok", "nvidia_smi": "ok", "env": "ok", "doctor": "timed out", "models": "ok",
                      "plan": "ok", "ours_qwen": "ok", "plain_qwen": "ok", "ours_llama": "failed"}
    assert doc["failed"] == ["doctor", "ours_llama"]
    failed = next(s for s in doc["stages"] if s["name"] == "ours_llama")
    assert "RuntimeError: a planted failure (GPU_CHECK_DRY)" in failed["last_lines"]
    assert doc["runs"]["ours_qwen"]["step_times_s"] == [3.0, 2.1, 2.2, 2.3, 2.4]
    assert doc["runs"]["ours_qwen"]["median_step_s_after_first"] == 2.25
    assert doc["runs"]["ours_qwen"]["peak_gpu"]["max_memory_allocated_mib"] == 3000
    assert doc["runs"]["ours_qwen"]["objective"]["loss_type"] == "dapo"
    assert doc["ratio_ours_over_plain"] == round(2.25 / 3.25, 3)
    assert doc["load_plan"] == {"device": "cuda", "memory": {"total_gib": 1.5}}
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.md", "stages.log"]
    md = (out / "gpu_check.md").read_text()
    assert "| doctor | timed out (rc 124) |" in md and "ours_llama: failed, last lines" in md


def test_budget_skips_what_does_not_fit(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "GPU_CHECK_DRY": "1", "GPU_CHECK_PYTHON": sys.executable, "GPU_CHECK_WORK": str(work),
           "OUT": str(out), "GPU_CHECK_BUDGET_S": "10"}
    subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh")], env=env, capture_output=True, timeout=60,
                   check=True)
    doc = json.loads((out / "gpu_check.json").read_text())
    assert {s["status"] for s in doc["stages"]} == {"skipped"}
    assert len(doc["stages"]) == 9


def test_report_reads_a_real_run_layout(tmp_path):
    """The report on the files a run writes: trainer_state.json's step_time, run_config.json's objective, the
    wrapper's peak file and the run header in the stage log."""
    work = tmp_path / "work"
    run = work / "runs" / "ours_qwen"
    run.mkdir(parents=True)
    (work / "logs").mkdir()
    (run / "trainer_state.json").write_text(json.dumps({"log_history": [
        {"step": 1, "step_time": 9.0, "reward": 0.1, "completions/mean_length": 256.0},
        {"step": 2, "step_time": 4.0, "reward": 0.2, "completions/mean_length": 256.0},
        {"train_runtime": 13.0}]}))
    (run / "run_config.json").write_text(json.dumps({"seed": 42, "objective": {"loss_type": "dapo", "epsilon": 0.2},
                                                     "beta": 0.0, "learning_rate": 5e-6}))
    (work / "peak_ours_qwen.json").write_text(json.dumps({"max_memory_allocated_mib": 2048}))
    (work / "logs" / "ours_qwen.log").write_text("noise\nmodel    /tmp/q (unsloth, 4-bit LoRA r16)\n"
                                                 "loss     dapo, clip [0.8, 1.2], beta 0\nmore noise\n")
    (work / "stages.tsv").write_text("ours_qwen\t0\t20.5\t200\n")
    doc = gpu_check.report(work, tmp_path / "out")
    result = doc["runs"]["ours_qwen"]
    assert result["step_times_s"] == [9.0, 4.0] and result["median_step_s_after_first"] == 4.0
    assert result["objective"] == {"objective": {"loss_type": "dapo", "epsilon": 0.2}, "beta": 0.0}
    assert result["header"] == ["model    /tmp/q (unsloth, 4-bit LoRA r16)", "loss     dapo, clip [0.8, 1.2], beta 0"]
    assert doc["failed"] == [] and "plain_qwen" not in doc["runs"]


def _wheel(path: Path, files: dict) -> Path:
    dist = "pkg-1.0.dist-info"
    files = {**files, f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n",
             f"{dist}/top_level.txt": b"pkg\nstudio\n"}
    record = "".join(f"{n},{gpu_bundle._record_hash(d)},{len(d)}\n" for n, d in files.items()) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{dist}/RECORD", record)
    return path


def test_repack_drops_files_and_keeps_record_valid(tmp_path):
    wheel = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {
        "pkg/__init__.py": b"x = 1\n", "studio/app.js": b"a" * 5000, "studio/backend/x.py": b"y\n",
        "pkg/libbitsandbytes_cuda128.so": b"b" * 5000, "pkg/libbitsandbytes_cuda130.so": b"c" * 50,
        "pkg/libbitsandbytes_cpu.so": b"d" * 10})
    assert gpu_bundle.record_problems(wheel) == []
    dropped, _ = gpu_bundle.repack_unsloth(wheel)
    assert dropped == 2
    dropped, _ = gpu_bundle.repack_bitsandbytes(wheel)
    assert dropped == 1
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert z.read("pkg-1.0.dist-info/top_level.txt") == b"pkg\n"  # edited, re-hashed below
    assert names == {"pkg/__init__.py", "pkg/libbitsandbytes_cuda130.so", "pkg/libbitsandbytes_cpu.so",
                     "pkg-1.0.dist-info/METADATA", "pkg-1.0.dist-info/top_level.txt", "pkg-1.0.dist-info/RECORD"}
    assert gpu_bundle.record_problems(wheel) == []


def test_record_problems_catch_a_stale_record(tmp_path):
    wheel = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {"pkg/__init__.py": b"x = 1\n"})
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("pkg/extra.py", b"")
    assert gpu_bundle.record_problems(wheel) == [f"{wheel.name}: pkg/extra.py not in RECORD"]


def test_requirements_judged_against_the_image(tmp_path):
    """A requirement the image has passes, a version the image's known one fails is a conflict, a declared-but-unused
    one is 'omitted' with its reason, and anything else is missing."""
    wheels = []
    for name, requires in [("a", ["torch>=2.4", "xformers>=0.0.27", "b", "certifi>=2026.10.19"]),
                           ("b", ["transformers<5", "nosuchthing", "dill; python_version < '3.10'"])]:
        path = tmp_path / f"{name}-1.0-py3-none-any.whl"
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n"
                                                                                 for r in requires)
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"{name}-1.0.dist-info/METADATA", meta)
        wheels.append(path)
    result = gpu_bundle.check_requirements(wheels)
    assert [line.split(" (")[0] for line in result["ok"]] == ["a -> torch>=2.4", "a -> b"]
    assert [line.split(":")[0] for line in result["omitted"]] == ["a -> xformers>=0.0.27"]
    assert len(result["waived"]) == 1 and result["waived"][0].startswith("a -> certifi>=2026.10.19")
    assert result["conflicts"] == ["b -> transformers<5 (has 5.17.0)"]
    assert result["missing"] == ["b -> nosuchthing"]


def test_bundle_list_has_one_version_of_each_and_nothing_the_image_has():
    names = [gpu_bundle.canon(spec.split("==")[0]) for spec in gpu_bundle.BUNDLE]
    assert len(names) == len(set(names))
    assert all("==" in spec for spec in gpu_bundle.BUNDLE)
    assert not set(names) & gpu_bundle.IMAGE  # a second copy would shadow the image's on PYTHONPATH


def test_size_report_counts_the_working_tree(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x.whl").write_bytes(b"0" * 3 * 1024 * 1024)
    ok, line = gpu_bundle.size_report(tmp_path / "b", limit_mib=4, root=ROOT)
    assert line.startswith("bundle 3.0 MiB + working tree ")
    tree = gpu_bundle.tree_bytes(ROOT) / 2**20
    assert ok == (3 + tree <= 4)
    ok, line = gpu_bundle.size_report(tmp_path / "b", limit_mib=2, root=ROOT)
    assert not ok and "OVER" in line


@needs_bundle
def test_built_bundle_is_complete_valid_and_fits():
    """The real gpu_bundle/: every Requires-Dist met by the image or the bundle (or omitted with a reason), every
    RECORD valid, one version of each, the repacks done, and the bundle plus the working tree within 64 MiB."""
    wheels = sorted(BUNDLE.glob("*.whl"))
    assert sorted(gpu_bundle.canon(w.name.split("-")[0]) for w in wheels) == sorted(
        gpu_bundle.canon(spec.split("==")[0]) for spec in gpu_bundle.BUNDLE)
    result = gpu_bundle.check_requirements(wheels)
    assert result["missing"] == [] and result["conflicts"] == [] and result["duplicates"] == []
    assert [p for w in wheels for p in gpu_bundle.record_problems(w)] == []
    unsloth = next(w for w in wheels if w.name.startswith("unsloth-"))
    with zipfile.ZipFile(unsloth) as z:
        assert not any(n.startswith("studio/") for n in z.namelist())
    bnb = next(w for w in wheels if w.name.startswith("bitsandbytes-"))
    with zipfile.ZipFile(bnb) as z:
        assert sorted(n.rsplit("/", 1)[-1] for n in z.namelist() if n.endswith(".so")) == [
            "libbitsandbytes_cpu.so", "libbitsandbytes_cuda130.so"]
    ok, line = gpu_bundle.size_report(BUNDLE)
    assert ok, line

"""The GPU check's CPU-side parts (tools/gpu_check.sh, tools/gpu_check.py, tools/gpu_bundle.py; docs/gpu.md "The GPU
check"): the script's stages, timeouts and report in its dry mode, the report writer on fixtures, the wheel repacking
and RECORD, and the bundle's Requires-Dist against the GPU image's package list. Seconds; no downloads (the tests
that read gpu_bundle/ skip where it has not been built)."""

import json
import os
import subprocess
import sys
import time
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


# The stages in the order the script runs them: the most valuable first, the tool-using run last.
ORDER = ["install", "nvidia_smi", "models", "plans", "default_8b", "dynsample", "best_cispo", "eval_only", "env",
         "doctor", "tool"]


def _tool_option_here() -> bool:
    """Whether this checkout's CLI has --tool (the script's tool stage runs only then)."""
    proc = subprocess.run([sys.executable, str(ROOT / "train_grpo.py"), "--help"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "160"}, timeout=120)
    return "--tool" in proc.stdout


def _dry(tmp_path, **settings):
    """tools/gpu_check.sh in its dry mode; returns (report, OUT, the script's stdout, wall seconds)."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "GPU_CHECK_DRY": "1", "GPU_CHECK_PYTHON": sys.executable, "GPU_CHECK_WORK": str(work),
           "OUT": str(out), **settings}
    started = time.monotonic()
    proc = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=300)
    wall = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((out / "gpu_check.json").read_text()), out, proc.stdout, wall


def _steps(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_dry_run_order_answers_and_figures(tmp_path):
    """GPU_CHECK_DRY=1: every stage replaced by its fixture (one fails on purpose); the script runs them in order
    of value, goes past the failure, and the report answers the five questions from the files the stages wrote."""
    doc, out, _, _ = _dry(tmp_path)
    assert [s["name"] for s in doc["stages"]] == ORDER
    status = {s["name"]: s["status"] for s in doc["stages"]}
    tool = "ok" if _tool_option_here() else "n/a"
    assert status == {**{name: "ok" for name in ORDER}, "doctor": "failed", "tool": tool}
    assert doc["failed"] == ["doctor"]
    failed = next(s for s in doc["stages"] if s["name"] == "doctor")
    assert "RuntimeError: a planted failure (GPU_CHECK_DRY)" in failed["last_lines"]
    assert doc["budget"]["budget_s"] == 330 and doc["budget"]["stages_end_by_s"] == 330 - 12
    assert all(s["limit_s"] <= 100 for s in doc["stages"])

    answers = doc["answers"]
    objective = answers["a_objective"]
    assert objective["default (dapo)"]["answer"] == "same" and objective["dr_grpo"]["answer"] == "same"
    # the fixture plants what a config class rewriting a setting looks like: named, with both values
    assert objective["cispo"]["answer"] == "DIFFERS"
    assert objective["cispo"]["differs"] == {"epsilon_high": {"dry_run": 0.2, "run": 5.0}}
    assert doc["problems"] == ["(a) objective, cispo: DIFFERS"]
    assert answers["b_dynamic_sampling"]["answer"].startswith("pass: 2 merged step(s)")
    assert answers["c_memory"]["ratio_peak_over_estimate"] == round(3600 / 1024 / 4.0, 2)
    assert answers["c_memory"]["answer"].startswith("held")
    assert answers["d_best_and_eval_only"]["best"]["same"] is True
    assert answers["d_best_and_eval_only"]["best"]["differs_from_others"] == ["checkpoint-2"]
    assert answers["d_best_and_eval_only"]["answer"].startswith("pass")
    if tool == "n/a":
        assert answers["e_tool"]["answer"] == "not available in this checkout"

    # each run's figures, one line per step as it ended, beside the run's small files
    steps = _steps(out / "stages" / "dynsample" / "steps.jsonl")
    assert [s["step"] for s in steps if "step" in s] == [1, 2, 3]
    assert [s["logs"]["kl"] for s in steps if "logs" in s] == [0.0, 0.0001, 0.0002]
    assert doc["runs"]["default_8b"]["peak"]["max_memory_allocated_mib"] == 3600
    assert json.loads((out / "stages" / "dynsample" / "objective.json").read_text())["loss_type"] == "dr_grpo"
    assert {"plan.json", "run_config.json", "steps.jsonl", "peak.json", "log.txt", "best_kept.json"} <= {
        p.name for p in (out / "stages" / "best_cispo").iterdir()}
    assert (out / "stages" / "eval_only" / "eval_metrics.json").exists()
    assert (out / "gpu_memory.tsv").exists() and (out / "commit.txt").read_text().strip()
    md = (out / "gpu_check.md").read_text()
    assert "| doctor | failed (rc 1) |" in md and "epsilon_high: dry run 0.2, run 5.0" in md


def test_a_stage_cut_by_its_timeout_keeps_its_figures(tmp_path):
    """The dynsample fixture writes two steps, sets its own SIGTERM handler (as the CLI does: finish the step
    first) and hangs: `timeout` sends SIGTERM at the stage's limit, SIGKILL 5 s later. The steps written so far and
    peak.json (flushed the moment SIGTERM landed) are there, the report reads them, and the stages after it ran."""
    doc, out, _, _ = _dry(tmp_path, GPU_CHECK_FAKE_HANG="dynsample", GPU_CHECK_LIMITS="dynsample=2")
    stage = next(s for s in doc["stages"] if s["name"] == "dynsample")
    assert stage["status"] == "timed out" and stage["rc"] == 137 and stage["limit_s"] == 2
    folder = out / "stages" / "dynsample"
    records = _steps(folder / "steps.jsonl")
    assert [r["step"] for r in records if "step" in r] == [1, 2]
    assert records[-1]["event"] == "SIGTERM"
    peak = json.loads((folder / "peak.json").read_text())
    assert peak["signals"] == ["SIGTERM"] and "exited" not in peak  # SIGKILL: no exit hook ran
    assert doc["runs"]["dynsample"]["logged"]["kl"] == [0.0, 0.0001]
    assert doc["answers"]["b_dynamic_sampling"]["stage_status"] == "timed out"
    assert doc["answers"]["b_dynamic_sampling"]["kl"] == [0.0, 0.0001]
    assert {s["name"]: s["status"] for s in doc["stages"]}["best_cispo"] == "ok"
    assert "no exit recorded (killed) (signals: SIGTERM)" in (out / "gpu_check.md").read_text()


def test_budget_cuts_and_skips_in_order(tmp_path):
    """The budget's arithmetic, with the dry clock moved on as if stages had taken their time: 330 s less 12 s kept
    for the last kill grace and the report; a stage's limit is cut to what is left, a stage with less than its
    minimum left is skipped, and the whole script ends within the budget."""
    doc, _, _, wall = _dry(tmp_path, GPU_CHECK_FAKE_ELAPSED="models=200 default_8b=80 dynsample=20")
    stages = {s["name"]: s for s in doc["stages"]}
    assert stages["plans"]["limit_s"] == 45 and stages["default_8b"]["limit_s"] == 100
    # 318 - 200 - 80 = 38 s left (less the real second or two the fixtures took): cut from 60
    assert 34 <= stages["dynsample"]["limit_s"] <= 38 and stages["dynsample"]["status"] == "ok"
    for name in ("best_cispo", "eval_only", "doctor"):  # ~18 s left: under each one's minimum
        assert stages[name]["status"] == "skipped" and stages[name]["note"].startswith("out of budget")
    # a later, cheaper stage still runs in what is left, cut to it
    assert stages["env"]["status"] == "ok" and 15 <= stages["env"]["limit_s"] <= 18
    assert stages["tool"]["status"] in ("skipped", "n/a")
    assert wall < 330
    assert doc["answers"]["d_best_and_eval_only"]["answer"].startswith("not answered")


def test_only_runs_the_named_stages_and_what_they_need(tmp_path):
    doc, _, _, _ = _dry(tmp_path, GPU_CHECK_ONLY="eval_only")
    status = {s["name"]: s["status"] for s in doc["stages"]}
    assert {n for n, s in status.items() if s == "ok"} == {"install", "models", "plans", "best_cispo", "eval_only"}
    assert {n for n, s in status.items() if s == "skipped"} == {"nvidia_smi", "env", "default_8b", "dynsample",
                                                                 "doctor", "tool"}


def test_commit_comes_from_the_bundle_without_git(tmp_path):
    """A copied working tree has no .git: the commit is the one gpu_bundle.py wrote into the bundle folder."""
    bundle = tmp_path / "bundle"
    line = gpu_bundle.stamp(bundle, ROOT)
    assert (bundle / "COMMIT").read_text().splitlines()[0] == line
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    assert line.split()[0] == head.strip()
    (bundle / "COMMIT").write_text("abc1234 + 2 changed files\nwritten ...\n")
    _, out, _, _ = _dry(tmp_path, GIT_DIR=str(tmp_path / "no-git"), GPU_CHECK_BUNDLE=str(bundle),
                        GPU_CHECK_ONLY="install")
    assert (out / "commit.txt").read_text().strip() == "abc1234 + 2 changed files (gpu_bundle/COMMIT)"


def test_report_reads_a_real_run_layout(tmp_path):
    """The report on the files a real run leaves (steps.jsonl as the wrapper writes it for train_grpo.py, cut in
    the middle of a line by SIGKILL; the dry run's plan.json; run_config.json): step times and memory, the objective
    compared key by key, the KL check."""
    out = tmp_path / "out"
    folder = out / "stages" / "dynsample"
    folder.mkdir(parents=True)
    objective = {"loss_type": "dr_grpo", "beta": 0.04, "scale_rewards": "group", "dynamic_sampling": True}
    (folder / "plan.json").write_text(json.dumps({"objective": objective, "load_plan": {"device": "cuda:0"}}))
    (folder / "run_config.json").write_text(json.dumps({"seed": 42, "beta": 0.04,
                                                        "objective": {**objective, "scale_rewards": "none"}}))
    lines = [{"t": 30.1, "step": 1, "seconds": 9.0, "max_memory_allocated_mib": 900, "max_memory_reserved_mib": 1024},
             {"t": 30.1, "log_step": 1, "logs": {"loss": 0.0, "kl": 0.65, "dynamic_sampling/rounds": 2.0,
                                                 "step_time": 8.9}},
             {"t": 34.0, "step": 2, "seconds": 4.0, "max_memory_allocated_mib": 950},
             {"t": 34.0, "log_step": 2, "logs": {"loss": 0.0, "kl": 0.7, "dynamic_sampling/rounds": 0.0}},
             {"t": 35.0, "log_step": 2, "logs": {"eval_loss": 0.1, "eval_reward": 0.0}}]
    (folder / "steps.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"t": 36.0, "st')
    (folder / "peak.json").write_text(json.dumps({"max_memory_allocated_mib": 950, "wall_s": 36.0}))
    (out / "stages.tsv").write_text("dynsample\t124\t60.2\t60\t1.0\t61.2\t\n")
    (out / "gpu_memory.tsv").write_text("0.5\t100\n30.0\t2400\n62.0\t9000\n")
    doc = gpu_check.report(out)
    run = doc["runs"]["dynsample"]
    assert run["step_seconds"] == [9.0, 4.0] and run["median_step_s_after_first"] == 4.0
    assert run["peak_mib_per_step"] == [900, 950] and run["logged"]["kl"] == [0.65, 0.7]
    assert len(run["eval_logged"]) == 1
    assert doc["stages"][0]["status"] == "timed out" and doc["stages"][0]["gpu_memory_used_max_mib"] == 2400
    a = doc["answers"]["a_objective"]["dr_grpo"]
    assert a["answer"] == "DIFFERS" and a["differs"] == {"scale_rewards": {"dry_run": "group", "run": "none"}}
    assert doc["answers"]["b_dynamic_sampling"]["answer"].startswith("FAIL: KL above 0.01")
    assert [line.split(":")[0] for line in doc["problems"]] == ["(a) objective, dr_grpo", "(b) dynamic sampling"]
    assert doc["answers"]["a_objective"]["cispo"]["answer"].startswith("not answered")
    assert doc["answers"]["c_memory"]["answer"].startswith("not answered")


def test_coin_leaves_every_other_prompt_flat():
    """The dynsample stage's reward: prompts split in two by a hash; one half always 0 (groups dynamic sampling
    drops), the other half 0 / 1 by the completion (groups it keeps)."""
    prompts = [f"What is {i} + {i}?" for i in range(40)]
    completions = [f"random text {j}" for j in range(8)]
    flat = spread = 0
    for prompt in prompts:
        scores = gpu_check.coin([prompt] * len(completions), completions)
        assert set(scores) <= {0.0, 1.0}
        flat += len(set(scores)) == 1
        spread += len(set(scores)) == 2
    assert flat >= 10 and spread >= 10


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

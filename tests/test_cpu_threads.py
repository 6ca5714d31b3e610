"""Threads for sampling and training from the cores really free: read from the real /proc and cgroup files, with real
busy processes, a real CPU affinity and a real cgroup quota (where this user may make one)."""

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from grpokit.cpu_threads import LoadMeter, cgroup_quota, threads_for

pytestmark = pytest.mark.alone  # the cores' load is what these tests read: no other test may run meanwhile

ROOT = Path(__file__).resolve().parent.parent
BUSY = [sys.executable, "-c", "while True: pass"]


def test_threads_for_free_cores():
    # (usable cores, others' load, default) -> threads
    assert threads_for(2, 0.1, 2) == 2  # a quiet machine: every core
    assert threads_for(2, 0.7, 2) == 1  # one busy neighbour that got 0.7 of a core while we ran 2 threads
    assert threads_for(2, 1.3, 2) == 1  # two of them: still one thread, never zero
    assert threads_for(2, 2.0, 2) == 1
    assert threads_for(4, 1.2, 4) == 3
    assert threads_for(8, 0.0, 4) == 4  # never above torch's default (the physical cores)
    assert threads_for(1, 0.0, 2) == 1  # nor above the usable cores
    assert threads_for(2, None, 2) == 2  # load not readable: the usable cores


def _cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc")
def test_meter_counts_a_busy_process_and_not_its_own_work():
    meter = LoadMeter()
    busy = subprocess.Popen(BUSY)
    try:
        started, child_before, own_before = time.monotonic(), _cpu_seconds(busy.pid), time.process_time()
        deadline = started + 1.0
        while time.monotonic() < deadline:  # this process works as hard as the busy one meanwhile
            pass
        others = meter.others()
        wall = time.monotonic() - started
        child, own = (_cpu_seconds(busy.pid) - child_before) / wall, (time.process_time() - own_before) / wall
    finally:
        busy.kill()
        busy.wait()
    # the busy child's CPU is in the reading (less clock ticks of rounding), this process's own spinning is not
    # (on an otherwise idle 2-core machine: ~1.0, not ~2.0)
    assert others >= child - 0.05
    assert others <= len(os.sched_getaffinity(0)) - own + 0.05


def test_usable_cores_follow_the_affinity():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    probe = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); " \
            "from grpokit.cpu_threads import usable_cores; print(usable_cores())"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "(1, '1 CPUs')" or out.strip().startswith("(1, '1 CPUs, cgroup quota")


def test_usable_cores_follow_a_cgroup_quota():
    """A real cgroup v1/v2 with a 0.5-core quota: the process inside it reads one usable core and the quota."""
    v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    name = f"grpo-test-{uuid.uuid4().hex[:8]}"
    if (v1 / "cpu.cfs_quota_us").exists():
        group, files = v1 / name, {"cpu.cfs_quota_us": "50000", "cpu.cfs_period_us": "100000"}
    elif (v2 / "cgroup.controllers").exists() and "cpu" in (v2 / "cgroup.subtree_control").read_text().split():
        group, files = v2 / name, {"cpu.max": "50000 100000"}
    else:
        pytest.skip("no cgroup cpu controller here")
    try:
        group.mkdir()
    except OSError as err:
        pytest.skip(f"cannot make a cgroup here ({err.strerror})")
    try:
        for file, value in files.items():
            (group / file).write_text(value)
        probe = textwrap.dedent(f"""
            from pathlib import Path
            Path({str(group / "cgroup.procs")!r}).write_text("0")  # this process joins the group
            from grpokit.cpu_threads import cgroup_quota, usable_cores
            print(cgroup_quota(), usable_cores())
        """)
        out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        cpus = len(os.sched_getaffinity(0))
        assert out.stdout.strip() == f"0.5 (1, '{cpus} CPUs, cgroup quota 0.5')"
    finally:
        group.rmdir()
    assert cgroup_quota() is None or cgroup_quota() > 0  # this process, outside the group, reads its own


PLAN_PROBE = r"""
import json, os, subprocess, sys, time
sys.path.insert(0, os.getcwd())
import torch
from grpokit.cpu_threads import ThreadPlan

busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
try:
    plans = {"auto": ThreadPlan(0), "generation_threads": ThreadPlan(2)}
    time.sleep(1.5)  # a window with every core taken by the busy processes
    choices = {name: plan.update() for name, plan in plans.items()}
finally:
    for proc in busy:
        proc.kill()
print(json.dumps({"torch_now": torch.get_num_threads(),
                  **{name: [c.torch, c.engine, c.why] for name, c in choices.items()}}))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
@pytest.mark.parametrize("omp", [None, "2"])
def test_plan_under_busy_processes(omp):
    """One busy process per core: sampling and training take one thread each; --generation-threads keeps the
    engine's, OMP_NUM_THREADS keeps torch's (and the engine follows it)."""
    import json

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if omp:
        env["OMP_NUM_THREADS"] = omp
    out = subprocess.run([sys.executable, "-c", PLAN_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if omp is None:
        assert result["auto"][:2] == [1, 1] and result["torch_now"] == 1
        assert "busy elsewhere" in result["auto"][2]
        assert result["generation_threads"][:2] == [1, 2]
        assert "sampling fixed by generation_threads=2" in result["generation_threads"][2]
    else:
        assert result["auto"][:2] == [2, 2] and result["torch_now"] == 2
        assert "training fixed by OMP_NUM_THREADS=2" in result["auto"][2]


def test_engine_threads_change_and_end_with_each_call():
    """The engine takes a new count at once, and no thread of its pool outlives a call: nothing polls while torch
    trains."""
    pytest.importorskip("llama_cpp")
    from grpokit.engine_llama_cpp import LlamaCppEngine
    from grpokit.engines import SamplingParams
    from grpokit.model_loader import embedded_model_dir

    def threads_now() -> int:
        return len(os.listdir("/proc/self/task"))

    engine = LlamaCppEngine.from_model_dir(embedded_model_dir(), threads=2, max_sequences=4, max_context=256)
    try:
        sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, max_tokens=4, seed=0,
                                  eos_token_ids=[])
        before = threads_now()
        engine.generate([[1, 504, 3158, 314]], 2, sampling)
        assert threads_now() == before
        engine.set_threads(1)
        assert engine._L.llama_n_threads(engine._ctx) == 1 and engine.threads == 1
        engine.generate([[1, 504, 3158, 314]], 2, sampling)
        assert threads_now() == before
    finally:
        engine.close()


@pytest.mark.parametrize("omp", [None, "1"])
def test_the_run_says_what_besides_the_seed_decides_its_result(monkeypatch, omp):
    # the same seed trained differently with 1 and 2 threads, and nothing said the count mattered
    from config.loader import build_config, normalise_layer
    from grpokit.cpu_threads import RECORD_KEY, ThreadPlan

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    if omp:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    plan = ThreadPlan(0)
    plan.update()
    line, record = plan.describe(), plan.record()
    if omp is None:
        assert line.endswith("; the result of a seed depends on the count: OMP_NUM_THREADS=N pins it")
        assert record["training"].startswith("adaptive") and record["reproduce"].startswith("a seed gives one result")
    else:
        assert "pins it" not in line and record["training"] == "OMP_NUM_THREADS=1" and record["reproduce"] == "pinned"
    assert record["used"] == [{"training": plan.choice.torch, "sampling": plan.choice.engine}]
    # run_config.json holds the record; read back as a config, it is not a setting
    assert normalise_layer({"seed": 7, RECORD_KEY: record}, "run_config.json") == {"seed": 7}
    assert build_config(None, flags={"seed": 7}).seed == 7

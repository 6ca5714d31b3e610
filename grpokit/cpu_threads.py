"""How many threads sampling (llama.cpp) and training (torch) take: the cores this process really has, re-checked
before every optimizer step.

Both thread pools make their threads wait for each other at every op: ggml's barrier (llama.cpp built without
OpenMP, ggml-cpu.c `ggml_barrier`) is a pure spin loop, and libgomp's (torch's OpenMP) spins before it sleeps. On a
core that another busy process shares, the scheduler takes one thread away for a whole time slice while the others
spin at the next barrier, op after op: with two busy processes on a 2-core machine a step went from 1.5 s to 99 s
and kept growing. One thread per free core never waits on a descheduled sibling; a thread that has a core to itself
loses nothing. So each step takes

    threads = round(usable - others), at least 1, at most the default (torch's thread count: the physical cores)

- usable: the CPUs this process may run on (`os.sched_getaffinity`), capped by a cgroup CPU quota (v2 `cpu.max`,
  v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, the tightest on the way up), rounded up: threads throttled together
  by a quota stall together, they do not wait on each other;
- others: the cores the rest of the machine kept busy since the last check, /proc/stat's busy time (user, nice,
  system, irq, softirq, steal) less this process's own and its finished children's (/proc/self/stat), over the wall
  time between the checks. Averaged over a step, not sampled: a neighbour that is busy on and off counts for what
  it used.

Both pools get the same count, one after the other: generation and training never overlap, and neither pool keeps
threads busy while the other works (ggml's pool here lives for one llama_decode call and its threads exit after it:
no thread of it polls while torch trains; libgomp's sleeping workers take no CPU).

The user's settings win: `generation_threads` > 0 fixes the engine's count, OMP_NUM_THREADS (or MKL_NUM_THREADS) fixes
torch's, and the engine then follows torch's as it always has.

What it costs a seed: torch's backward sums in another order with another thread count (the embedded model's forward
logits were bit-identical with 1 and 2 threads, a weight gradient 2e-8 apart), and a step later a sampled token can
differ, so the same command and seed train differently on a quiet and on a busy machine (the quick test's eval
reward 0.708 with 1 thread, 0.729 with 2). A fixed count would cost the very stalls above on a busy machine, so the
count stays adaptive and the run says so: the header, run_config.json's "cpu_threads" (`record()`) and
docs/speed.md name OMP_NUM_THREADS=N as what makes a seed one result on this machine.
"""


from __future__ import annotations

import functools
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("grpo")

TORCH_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# Where a run's thread counts are recorded in run_config.json (ignored when the file is read back as a config)
RECORD_KEY = "cpu_threads"


# ---- what the machine gives this process ---------------------------------------------------------------------------
def affinity_cpus() -> int:
    """CPUs this process may run on (taskset, cpuset, a container's CPU list)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def cgroup_quota(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """The CPU quota of this process's cgroup in cores (the tightest of it and its ancestors), or None: no quota.

    cgroup v2: `cpu.max` ("max 100000" or "150000 100000"); v1: `cpu.cfs_quota_us` (-1: none) over
    `cpu.cfs_period_us`, under the cpu controller's mount (`cpu`, `cpu,cpuacct`)."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    tightest = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: the unified hierarchy (alone at root, or under `unified` on a hybrid host)
            mounts = [Path(root), Path(root) / "unified"]
        elif "cpu" in controllers.split(","):
            mounts = [Path(root) / name for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu")]
        else:
            continue
        for mount in mounts:
            if not mount.is_dir():
                continue
            directory = mount / path.lstrip("/")
            while True:
                quota = _quota_in(directory, v2=controllers == "")
                if quota is not None:
                    tightest = quota if tightest is None else min(tightest, quota)
                if directory == mount:
                    break
                directory = directory.parent
    return tightest


def _quota_in(directory: Path, v2: bool) -> float | None:
    try:
        if v2:
            quota, period = (directory / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        return None if quota < 0 else quota / int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None


def usable_cores() -> tuple[int, str]:
    """(cores this process may use, how that was read): the affinity, capped by a cgroup quota."""
    cpus, quota = affinity_cpus(), cgroup_quota()
    if quota is None or quota >= cpus:
        return cpus, f"{cpus} CPUs"
    return max(1, math.ceil(quota - 1e-9)), f"{cpus} CPUs, cgroup quota {quota:g}"


class LoadMeter:
    """The cores other processes kept busy between two `others()` calls (from /proc; None where it is not readable)."""

    MIN_WINDOW = 0.5  # seconds: a shorter window says more about the scheduler's last tick than about the load

    def __init__(self, stat: str = "/proc/stat", own: str = "/proc/self/stat"):
        self.stat, self.own = stat, own
        self._last = self._sample()
        self._estimate: float | None = None

    def _sample(self) -> tuple[float, float, float] | None:
        """(wall seconds, busy CPU seconds of the whole machine, CPU seconds of this process and its finished
        children)."""
        try:
            fields = Path(self.stat).read_text().split("\n", 1)[0].split()
            # cpu  user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user already)
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
            own = Path(self.own).read_text().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
            utime, stime, cutime, cstime = (int(x) for x in own[11:15])  # fields 14-17 of proc(5)
        except (OSError, ValueError, IndexError):
            return None
        busy = user + nice + system + irq + softirq + steal
        return time.monotonic(), busy / CLOCK_TICKS, (utime + stime + cutime + cstime) / CLOCK_TICKS

    def others(self) -> float | None:
        """Average cores busy with other processes since the previous reading (or since the meter started); within
        MIN_WINDOW of it, the previous reading again."""
        now, last = self._sample(), self._last
        if now is None or last is None:
            return None
        if now[0] - last[0] >= self.MIN_WINDOW:
            self._last = now
            self._estimate = max(0.0, ((now[1] - last[1]) - (now[2] - last[2])) / (now[0] - last[0]))
        return self._estimate


def threads_for(usable: int, others: float | None, default: int) -> int:
    """One thread per free core: round(usable - others), between 1 and min(default, usable)."""
    ceiling = max(1, min(default, usable))
    if others is None:
        return ceiling
    return max(1, min(ceiling, math.floor(usable - others + 0.5)))


@functools.cache
def default_threads() -> int:
    """torch's thread count before any plan changed it: the physical cores, or the user's OMP_NUM_THREADS."""
    import torch

    return torch.get_num_threads()


# ---- the run's plan --------------------------------------------------------------------------------------------------
@dataclass
class Choice:
    torch: int
    engine: int
    why: str


class ThreadPlan:
    """The run's thread counts for torch and the engine; `update()` re-reads the machine and applies them.

    Built early (its first window spans the model load); `generation_threads` > 0 and OMP_NUM_THREADS / MKL_NUM_THREADS
    are the user's fixed choices."""

    def __init__(self, generation_threads: int = 0):
        self.torch_fixed = next((f"{name}={os.environ[name]}" for name in TORCH_THREAD_VARIABLES
                                 if os.environ.get(name, "").strip()), None)
        self.engine_fixed = generation_threads if generation_threads > 0 else None
        self.meter = LoadMeter()
        self.choice: Choice | None = None
        self.engine = None
        self.used: set[tuple[int, int]] = set()  # every (training, sampling) count the run applied

    def decide(self) -> Choice:
        """This moment's counts and why, from the machine since the last call (nothing applied)."""
        usable, seen = usable_cores()
        others = self.meter.others()
        default = default_threads()
        adaptive = threads_for(usable, others, default)
        busy = "the load elsewhere not readable" if others is None else f"{others:.1f} busy elsewhere"
        why = f"{seen}, {busy}"
        torch_threads = default if self.torch_fixed else adaptive
        if self.torch_fixed:
            why += f"; training fixed by {self.torch_fixed}"
        engine_threads = self.engine_fixed or torch_threads
        if self.engine_fixed:
            why += f"; sampling fixed by generation_threads={self.engine_fixed}"
        return Choice(torch_threads, engine_threads, why)

    def update(self) -> Choice:
        """Decide and apply: torch's intra-op threads and the engine's (when it has a thread count)."""
        import torch

        choice = self.decide()
        if choice.torch != torch.get_num_threads():
            torch.set_num_threads(choice.torch)
        if self.engine is not None and hasattr(self.engine, "set_threads"):
            self.engine.set_threads(choice.engine)
        previous, self.choice = self.choice, choice
        self.used.add((choice.torch, choice.engine))
        if previous is None or (previous.torch, previous.engine) != (choice.torch, choice.engine):
            # the log keeps each change (the run header shows the first)
            log.info("CPU threads: %s (%s)", self._counts(choice), choice.why, extra={"file_only": True})
        return choice

    @staticmethod
    def _counts(choice: Choice) -> str:
        if choice.torch == choice.engine:
            return str(choice.torch)  # for sampling and training
        return f"{choice.engine} sampling, {choice.torch} training"

    def callback(self):
        """A TrainerCallback that re-checks the machine before every optimizer step (its generation, then its loss
        pass)."""
        from transformers import TrainerCallback

        plan = self

        class ThreadPlanCallback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                plan.update()

        return ThreadPlanCallback()

    def describe(self) -> str:
        """The run header's line: what is used now and why, and (when training's count follows the load) that the
        count is part of what a seed's result depends on."""
        choice = self.choice or self.decide()
        fixed = self.torch_fixed and self.engine_fixed
        line = f"{self._counts(choice)} ({choice.why}{'' if fixed else '; re-checked every step'})"
        if not self.torch_fixed:
            line += "; the result of a seed depends on the count: OMP_NUM_THREADS=N pins it"
        return line

    def record(self) -> dict:
        """run_config.json's "cpu_threads": how the counts were chosen and which were used, so a result can be
        reproduced (the same seed and OMP_NUM_THREADS set to the count used)."""
        return {"training": self.torch_fixed or "adaptive (one per core not busy elsewhere)",
                "sampling": f"generation_threads={self.engine_fixed}" if self.engine_fixed else "as training",
                "used": [{"training": t, "sampling": e} for t, e in sorted(self.used)],
                "reproduce": "a seed gives one result at one thread count: set OMP_NUM_THREADS to the count used"
                             if not self.torch_fixed else "pinned"}



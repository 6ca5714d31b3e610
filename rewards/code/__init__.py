"""The code reward, in one room: model-written Python judged against a row's tests, by a side its code cannot reach.

Everything that touches the code a model wrote is here, and everything outside comes in through this file's names
(the reward component, the checks a run makes before it loads a model, the `python` tool's sandbox):

    reward.py          the verdict: `CodeExecution` (the reward component), the tests split into steps
                       (`split_tests`, `check_layouts`), and `judge`, where each test is run and counted
    stdio.py           standard-input / standard-output and call-based problems: the cases of every dataset
                       layout, and the comparator (exact for integers, a row's tolerance for other numbers)
    monitor.py         the hack monitor: what a completion's code does that honest solutions never need, read
                       with `ast` (never run) and counted per step; it flags, the verdict does not depend on it
    sandbox.py         the host side of the sandbox: zygotes in fresh namespaces, a job per completion, cgroups,
                       the seccomp filter, the trusted helper process the tests run in
    sandbox_worker.py  the only file that runs beside model-written code: the zygote and a job's child (sent as
                       source text, never imported there)

Where the verdict is decided: `reward.judge`, in a helper process of the trainer's (`sandbox._Trusted`), with the
tests' names bound to trusted objects only (the tests' own imports, the row's entry point or the names its prompt
declares, a fixed alias table; modules from `reward.TRUSTED_MODULES`, an allow-list). The code's functions are
`reward.Proxy` handles: a call sends plain data into the sandbox and plain data comes back, so no object of the
code's ever takes part in a comparison.

Where the trust boundary lies: between `sandbox.py` (trusted) and `sandbox_worker.py` (runs the code). What
crosses it is plain data in length-prefixed frames (`sandbox_worker.encode` / `decode`, strict types and sizes),
nothing else: no expected value, no file, no state from an earlier job (each job gets fresh namespaces; see
sandbox.py's docstring for what the OS enforces and how a run is refused where it cannot).
"""

from rewards.code.reward import (
           CodeExecution,
           LayoutError,
           check_isolation,
           check_layouts,
           extract_code,
           passes_all,
           split_tests,
)
from rewards.code.sandbox import SandboxError

__all__ = ["CodeExecution", "LayoutError", "SandboxError", "check_isolation", "check_layouts", "extract_code",
           "passes_all", "split_tests"]

"""tools/compile_run_imports.py: `make install` byte-compiles what a run imports, as recorded in tools/run_imports.txt,
even where PYTHONDONTWRITEBYTECODE is set (this machine, CI). PYTHONPYCACHEPREFIX sends every .pyc it writes to an
empty folder here, so the count is what it compiled, not what the venv already held (~25 s: everything compiles
again). Then a run's imports themselves (--record) find nearly everything compiled: the list is the pinned set's."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_it_writes_the_bytecode_of_a_runs_imports_whatever_the_environment_says(tmp_path):
    prefix = tmp_path / "pycache"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(prefix)}
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_run_imports.py")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0
    assert "compile_run_imports:" not in result.stderr, result.stderr[-2000:]  # every module imported
    assert "Unsloth could not be imported" not in result.stderr, result.stderr[-2000:]
    written = {str(p.relative_to(prefix)) for p in prefix.rglob("*.pyc")}
    assert len(written) > 3000, len(written)  # a run imports ~4,300 files; the set holds ~16,000

    def compiled(module: str) -> bool:
        return any(name.endswith(f"/{module}.{sys.implementation.cache_tag}.pyc") for name in written)

    # the backend, the trainer, what they import; not a model family a run never loads (the checkout's own modules
    # are `make bytecode`'s)
    for module in ("unsloth/__init__", "trl/trainer/grpo_trainer", "peft/peft_model", "torch/__init__",
                   "transformers/models/llama/modeling_llama", "matplotlib/pyplot"):
        assert compiled(module), module
    assert not compiled("transformers/models/whisper/modeling_whisper")

    # what a run imports, into the same folder: only what the list misses is compiled now
    recorded = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_run_imports.py"), "--record",
                               str(tmp_path / "run_imports.txt")], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)
    assert recorded.returncode == 0 and "compile_run_imports:" not in recorded.stderr, recorded.stderr[-2000:]
    missed = {str(p.relative_to(prefix)) for p in prefix.rglob("*.pyc")} - written
    missed = {name for name in missed if "site-packages" in name}  # not the checkout's modules (`make bytecode`)
    assert len(missed) <= 0.02 * len(written), ("tools/run_imports.txt misses what a run imports; record it again: "
                                                ".venv/bin/python tools/compile_run_imports.py --record\n"
                                                + "\n".join(sorted(missed)[:20]))

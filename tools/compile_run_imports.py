"""Byte-compiles what a training run imports, by importing it: `make install` runs this once the pinned set is in.

The pinned set holds ~16,000 Python files; a run imports ~4,800 of them. uv byte-compiles everything it installs only
with --compile-bytecode (51 CPU-seconds here), and during a fresh install that time comes out of the llama.cpp
compile running beside it on the same cores. Importing what a run imports writes the .pyc of exactly those (~25
CPU-seconds), so a run in an environment that sets PYTHONDONTWRITEBYTECODE (CI, many containers) does not compile
its imports again in every process. Whatever a run imports that is not here is compiled on first use, as Python
always does; `make test` byte-compiles the rest (its many processes import more). Never fails the install: a package
that does not import here is the run's to report.
"""

import sys
from pathlib import Path

sys.dont_write_bytecode = False  # the point of this script, whatever PYTHONDONTWRITEBYTECODE says
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# What a run uses, after the backend (Unsloth, imported first: it patches trl / transformers). The embedded model's
# architecture is Llama (modeling_llama is imported when a model of it loads).
MODULES = ["trl", "trl.trainer.grpo_trainer", "peft", "datasets", "transformers.models.llama.modeling_llama", "typer",
           "rich", "matplotlib.pyplot", "grpokit.run", "grpokit.trl_trainer", "grpokit.callbacks",
           "grpokit.engine_llama_cpp", "grpokit.report", "grpokit.plots", "data_loader", "rewards"]


def main() -> int:
    import importlib

    from grpokit.console import quiet_third_party
    from grpokit.model_loader import import_backend

    quiet_third_party()
    import_backend("unsloth")  # falls back to transformers (with its warning) where Unsloth cannot be imported
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - the run reports it; this only misses the head start
            print(f"compile_run_imports: {name}: {type(err).__name__}: {str(err)[:200]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

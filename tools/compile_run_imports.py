"""Byte-compiles what a training run imports: `make install` runs this once the pinned set is in.

    python tools/compile_run_imports.py            # compile the files tools/run_imports.txt lists
    python tools/compile_run_imports.py --import   # import what a run imports instead (compiling it as Python does)
    python tools/compile_run_imports.py --record [PATH]   # import it, then write tools/run_imports.txt (or PATH) anew

The pinned set holds ~16,000 Python files; a run imports ~4,300 of them. uv byte-compiles everything it installs only
with --compile-bytecode (51 CPU-seconds here), and during a fresh install that time comes out of the llama.cpp compile
running beside it on the same cores. Compiling exactly what a run imports means a run in an environment that sets
PYTHONDONTWRITEBYTECODE (CI, many containers) does not compile its imports again in every process. Importing it
compiles it too, but also runs it (Unsloth's patching, transformers' import tables: 14 of 38 CPU-seconds on 2 AVX2
cores), so the install compiles the recorded list instead (22 CPU-seconds). The list is the pinned set's: recorded
again with --record when requirements change (tests/test_compile_run_imports.py says when it no longer matches); a
file a run imports that is missing from it is compiled on first use, as Python always does. `make test` byte-compiles
the rest (its many processes import more). Never fails the install: a package that does not import here is the run's
to report.
"""

import compileall
import sys
import sysconfig
from pathlib import Path

sys.dont_write_bytecode = False  # the point of this script, whatever PYTHONDONTWRITEBYTECODE says
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
LIST = ROOT / "tools" / "run_imports.txt"
# A directory of which at least this share of the .py files is imported is listed whole ("*"): the list stays small
# (~650 lines) for ~6 % more files compiled.
WHOLE = 0.75

# What a run uses, after the backend (Unsloth, imported first: it patches trl / transformers). The embedded model's
# architecture is Llama (modeling_llama is imported when a model of it loads).
MODULES = ["trl", "trl.trainer.grpo_trainer", "peft", "datasets", "transformers.models.llama.modeling_llama", "typer",
           "rich", "matplotlib.pyplot", "grpokit.run", "grpokit.trl_trainer", "grpokit.callbacks",
           "grpokit.engine_llama_cpp", "grpokit.report", "grpokit.plots", "data_loader", "rewards"]


def import_run_modules() -> None:
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


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def imported_files() -> dict[str, set[str]]:
    """The installed .py files this process imported: directory (relative to site-packages, "." for its top) ->
    module file names without .py."""
    root = site_packages()
    found: dict[str, set[str]] = {}
    for module in list(sys.modules.values()):
        path = Path(getattr(module, "__file__", None) or "")
        if path.suffix == ".py" and path.is_relative_to(root):
            relative = path.relative_to(root)
            found.setdefault(relative.parent.as_posix(), set()).add(relative.stem)
    return found


def record(out: Path = LIST) -> int:
    root, lines, imported = site_packages(), [], imported_files()
    for directory, names in sorted(imported.items()):
        present = {p.stem for p in (root / directory).glob("*.py")}
        lines.append(f"{directory}: {'*' if len(names) >= WHOLE * len(present) else ' '.join(sorted(names))}")
    header = ["# The installed Python files a training run imports (tools/compile_run_imports.py): directory relative",
              "# to site-packages, then module files, or * for all of the directory's. Recorded with",
              "# `.venv/bin/python tools/compile_run_imports.py --record`; compiled by `make install`."]
    out.write_text("\n".join(header + lines) + "\n")
    return sum(len(names) for names in imported.values())


def listed_files(path: Path = LIST) -> list[Path]:
    root, files = site_packages(), []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        directory, _, names = line.partition(": ")
        folder = root / directory
        if names.strip() == "*":
            files += sorted(folder.glob("*.py"))
        else:
            files += [folder / f"{name}.py" for name in names.split()]
    return [f for f in files if f.is_file()]


def main(argv: list[str]) -> int:
    if "--record" in argv or "--import" in argv or not LIST.exists():
        import_run_modules()
        if "--record" in argv:
            out = Path(argv[argv.index("--record") + 1]) if len(argv) > argv.index("--record") + 1 else LIST
            print(f"{record(out)} files a run imports -> {out}")
        return 0
    for path in listed_files():
        compileall.compile_file(str(path), quiet=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

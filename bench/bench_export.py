"""Size and wall time of each `train_grpo.py export` format for a run's adapter (default: the embedded model).

    .venv/bin/python bench/bench_export.py RUN_DIR                       # gguf f16, q8_0, q4_k_m; gguf-lora; merged
    .venv/bin/python bench/bench_export.py RUN_DIR --quant f16 q4_k_m    # only these GGUF types
    .venv/bin/python bench/bench_export.py --quick-test                  # make RUN_DIR first (the quick test)
    .venv/bin/python bench/bench_export.py RUN_DIR --fidelity            # + each export against the run's eval

`--fidelity`: each export measured as `export` measures itself (grpokit/export.py `measure`): greedy completions of
the run's held-out prompts (the GGUFs in llama-cpp-python's own `Llama`, the merged weights in plain transformers)
against the run's own final evaluation (its last generation log): identical answers and the held-out reward, for
both merge bases (`--base trained`, the default, and `--base 16bit`). One merge per base; q8_0 and q4_k_m are
quantised from its f16 GGUF by the command's own quantiser.

Each format is one real CLI call into a scratch directory (merge + llama.cpp's converter + its quantiser for GGUF),
timed from outside; a JSON line per format, then a table. Times include Python start-up and the model load.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}


def size_of(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def export(run: Path, out: Path, *args: str) -> dict:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "train_grpo.py", "export", str(run), "-o", str(out), *args], cwd=ROOT,
                          env=ENV, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    files = [Path(line) for line in proc.stdout.split()]
    model = [f for f in files if f.name not in ("README.md", "Modelfile", "run_config.json")]
    steps = {line.split(" INFO ", 1)[1].split(":")[0]: float(line.rsplit(" in ", 1)[1].split()[0])
             for line in proc.stderr.splitlines() if ": done in " in line}
    return {"format": " ".join(args), "bytes": sum(size_of(f) for f in model), "seconds": round(seconds, 1),
            "steps": steps, "files": [f.name for f in model]}


def fidelity(run: Path, scratch: Path, quants: list[str]) -> None:
    """Each export's measurement against the run's final evaluation, for both merge bases."""
    sys.path.insert(0, str(ROOT))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit.export import (
        convert,
        gguf_greedy,
        measure,
        merge,
        quantise,
        run_evaluation,
        run_files,
        torch_greedy,
        trained_rounding,
    )
    from grpokit.model_loader import embedded_model_dir

    config, summary = run_files(run)
    evaluation = run_evaluation(run, config, summary)
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    for base in ("trained", "16bit"):
        rounding = trained_rounding(config, summary, base)
        work = scratch / f"fidelity-{base}"
        merged = {}
        for dtype in ("float32", "bfloat16"):
            merged[dtype], _ = merge(run, embedded_model_dir(), work / f"merged-{dtype}", dtype, measure=False,
                                     rounding=rounding)
        f16 = convert(merged["float32"], work / "model.F16.gguf", "f16")
        files = {q: f16 if q == "f16" else quantise(f16, work / f"model.{q}.gguf", q) for q in quants}
        answers = {f"gguf {q}": lambda p, n, f=f: gguf_greedy(f, p, n) for q, f in files.items()}
        for dtype, directory in merged.items():
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
            answers[f"merged {dtype}"] = lambda p, n, m=model: torch_greedy(m, tokenizer, p, n)
        for name, answer in answers.items():
            got = measure(evaluation, config, tokenizer, answer)
            print(json.dumps({"base": base, "export": name, "same_answers": got.same, "prompts": got.prompts,
                              "held_out_reward": round(got.reward, 3) if got.reward is not None else None,
                              "run_reward": round(got.run_reward, 3), "line": got.line()}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", nargs="?", type=Path, help="a run's output directory (with an adapter)")
    parser.add_argument("--quant", nargs="+", default=["f16", "q8_0", "q4_k_m"])
    parser.add_argument("--quick-test", action="store_true", help="train the quick test first (10 steps)")
    parser.add_argument("--fidelity", action="store_true",
                        help="measure each export against the run's final evaluation, for both merge bases")
    parser.add_argument("--fidelity-only", action="store_true", help="--fidelity without the size / time rows")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-export-") as scratch:
        run = args.run
        if args.quick_test or run is None:
            run = Path(scratch) / "run"
            subprocess.run([sys.executable, "train_grpo.py", "--quick-test", "--no-wandb", "--output-dir", str(run),
                            "--set", "save_steps=0"], cwd=ROOT, env=ENV, check=True, capture_output=True)
        rows = []
        if not args.fidelity_only:
            rows = [export(run, Path(scratch) / f"gguf-{q}", "--format", "gguf", "--quant", q) for q in args.quant]
            rows.append(export(run, Path(scratch) / "gguf-lora", "--format", "gguf-lora"))
            rows.append(export(run, Path(scratch) / "merged", "--format", "merged"))
        if args.fidelity or args.fidelity_only:
            fidelity(run, Path(scratch), args.quant)
    for row in rows:
        print(json.dumps(row))
    print(f"{'format':<28} {'size':>10} {'wall':>8}  steps")
    for row in rows:
        steps = ", ".join(f"{k.split(' ')[0]} {v:.1f} s" for k, v in row["steps"].items())
        print(f"{row['format']:<28} {row['bytes'] / 1e6:>7.1f} MB {row['seconds']:>6.1f} s  {steps}")


if __name__ == "__main__":
    main()

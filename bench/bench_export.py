"""Size and wall time of each `train_grpo.py export` format for a run's adapter (default: the embedded model).

    .venv/bin/python bench/bench_export.py RUN_DIR                       # gguf f16, q8_0, q4_k_m; gguf-lora; merged
    .venv/bin/python bench/bench_export.py RUN_DIR --quant f16 q4_k_m    # only these GGUF types
    .venv/bin/python bench/bench_export.py --quick-test                  # make RUN_DIR first (the quick test)
    .venv/bin/python bench/bench_export.py RUN_DIR --fidelity            # + each export against the adapter

`--fidelity`: greedy completions of the run's held-out prompts from each export (the GGUFs in llama-cpp-python's own
`Llama`, the merged weights in plain transformers) against the adapter in PyTorch (PEFT, float32): identical
completions, identical answers (first line) and the held-out reward; the merged weights in bfloat16 and float32.

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
    """The held-out answers of each export against the adapter's (the same comparison tests/test_export.py makes)."""
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT))
    import torch
    from peft import PeftModel
    from test_export import held_out_reward, llama_greedy, same, same_answers, torch_greedy
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit.model_loader import embedded_model_dir
    from grpokit.run_dir import generation_log_dir, generation_logs

    held_out = [(e["prompt"], e["reference_answer"]) for e in generation_logs(generation_log_dir(run))[-1][1]]
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    tokens = json.loads((run / "run_config.json").read_text())["max_completion_length"]
    base = AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=torch.float32)
    reference = torch_greedy(PeftModel.from_pretrained(base, run).eval(), tokenizer, held_out, tokens)
    answers = {f"gguf {q}": llama_greedy(next((scratch / f"gguf-{q}").glob("*.gguf")), tokenizer, held_out, tokens)
               for q in quants}
    for name in ("merged", "merged-f32"):
        model = AutoModelForCausalLM.from_pretrained(scratch / name, dtype=torch.float32).eval()
        answers[name] = torch_greedy(model, tokenizer, held_out, tokens)
    print(f"adapter in PyTorch: held-out reward {held_out_reward(run, held_out, reference):.3f}, "
          f"{len(held_out)} prompts")
    for name, got in answers.items():
        print(json.dumps({"export": name, "same_completions": same(got, reference),
                          "same_answers": same_answers(got, reference),
                          "held_out_reward": round(held_out_reward(run, held_out, got), 3)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", nargs="?", type=Path, help="a run's output directory (with an adapter)")
    parser.add_argument("--quant", nargs="+", default=["f16", "q8_0", "q4_k_m"])
    parser.add_argument("--quick-test", action="store_true", help="train the quick test first (10 steps)")
    parser.add_argument("--fidelity", action="store_true", help="compare each export's answers with the adapter's")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-export-") as scratch:
        run = args.run
        if args.quick_test or run is None:
            run = Path(scratch) / "run"
            subprocess.run([sys.executable, "train_grpo.py", "--quick-test", "--no-wandb", "--output-dir", str(run),
                            "--set", "save_steps=0"], cwd=ROOT, env=ENV, check=True, capture_output=True)
        rows = [export(run, Path(scratch) / f"gguf-{q}", "--format", "gguf", "--quant", q) for q in args.quant]
        rows.append(export(run, Path(scratch) / "gguf-lora", "--format", "gguf-lora"))
        rows.append(export(run, Path(scratch) / "merged", "--format", "merged"))
        if args.fidelity:
            rows.append(export(run, Path(scratch) / "merged-f32", "--format", "merged", "--dtype", "float32"))
            fidelity(run, Path(scratch), args.quant)
    for row in rows:
        print(json.dumps(row))
    print(f"{'format':<28} {'size':>10} {'wall':>8}  steps")
    for row in rows:
        steps = ", ".join(f"{k.split(' ')[0]} {v:.1f} s" for k, v in row["steps"].items())
        print(f"{row['format']:<28} {row['bytes'] / 1e6:>7.1f} MB {row['seconds']:>6.1f} s  {steps}")


if __name__ == "__main__":
    main()

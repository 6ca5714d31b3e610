"""llama.cpp's prefill and decode step on one GGUF's weights in f16, f32 and q8_0: which float type the engine's GGUF
should hold on this CPU (gguf_export.engine_dtype).

    .venv/bin/python bench/bench_gguf_dtype.py ~/.cache/grpo-cli/gguf/<model>-nf4-b64-dq1.f16.gguf

The f32 and q8_0 files are made from the given f16 one by llama.cpp's quantiser (in a temporary directory). Workload:
the quick test's shape without the adapter, one 47-token prompt shared by 8 sequences (decoded once, as the engine
does), then 24 decode steps of one token per sequence; 2 threads; the types alternated, medians of 5 repetitions.
"""

import argparse
import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path


def quantize(llama, source: Path, target: Path, ftype: int) -> None:
    params = llama.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, 2
    if llama.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params)) != 0:
        sys.exit(f"llama.cpp could not write {target}")


def measure(llama, path: Path, sequences: int, prompt: int, tokens: int, repeats: int) -> tuple[float, float]:
    """(prefill seconds, seconds per decode step), medians."""
    model = llama.llama_model_load_from_file(str(path).encode(), llama.llama_model_default_params())
    params = llama.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = 512
    params.n_seq_max, params.kv_unified = sequences, True
    params.n_threads = params.n_threads_batch = 2
    ctx = llama.llama_init_from_model(model, params)
    batch = llama.llama_batch_init(512, 0, sequences)
    prefills, steps = [], []
    for _ in range(repeats):
        llama.llama_memory_clear(llama.llama_get_memory(ctx), True)
        batch.n_tokens = prompt
        for i in range(prompt):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = 100 + i, i, sequences, i == prompt - 1
            for s in range(sequences):
                batch.seq_id[i][s] = s
        started = time.perf_counter()
        assert llama.llama_decode(ctx, batch) == 0
        prefilled = time.perf_counter()
        for t in range(tokens):
            batch.n_tokens = sequences
            for s in range(sequences):
                batch.token[s], batch.pos[s], batch.n_seq_id[s], batch.logits[s] = 200 + s + t, prompt + t, 1, True
                batch.seq_id[s][0] = s
            assert llama.llama_decode(ctx, batch) == 0
        prefills.append(prefilled - started)
        steps.append((time.perf_counter() - prefilled) / tokens)
    llama.llama_batch_free(batch)
    llama.llama_free(ctx)
    llama.llama_model_free(model)
    return statistics.median(prefills), statistics.median(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf", type=Path, help="an f16 GGUF (the engine's cache holds one per model)")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=47)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import llama_cpp as llama

    quiet = llama.llama_log_callback(lambda *_: None)  # kept referenced: llama.cpp calls it until exit
    llama.llama_log_set(quiet, ctypes.c_void_p(0))
    llama.llama_backend_init()
    with tempfile.TemporaryDirectory() as work:
        files = {"f16": args.gguf, "f32": Path(work) / "f32.gguf", "q8_0": Path(work) / "q8_0.gguf"}
        quantize(llama, args.gguf, files["f32"], 0)  # LLAMA_FTYPE_ALL_F32
        quantize(llama, args.gguf, files["q8_0"], 7)  # LLAMA_FTYPE_MOSTLY_Q8_0
        for round_ in range(1, args.rounds + 1):
            for name, path in files.items():
                prefill, step = measure(llama, path, args.sequences, args.prompt, args.tokens, 5)
                print(f"round {round_}  {name:<5} prefill {prefill * 1000:6.1f} ms  decode step "
                      f"({args.sequences} sequences) {step * 1000:5.1f} ms", flush=True)


if __name__ == "__main__":
    main()

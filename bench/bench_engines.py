"""Generation engines on the same workload: completion tokens/s, adapter push cost, sampler/trainer log-prob mismatch.

    .venv/bin/python bench/bench_engines.py                    # tok/s, transformers vs llama_cpp, alternating
    .venv/bin/python bench/bench_engines.py --mismatch         # + mean |Δ log-prob| vs bf16 and NF4 trainers

Workload (NOTES.md "Generation engines on a CPU"): one 47-token chat prompt, 8 completions x 24 tokens, T = 0.8, EOS
ignored so every engine produces exactly 8 x 24 tokens. The models are the embedded SmolLM2-135M with a LoRA r=16 on
all seven projections (B random, so the LoRA matters): transformers runs it in bf16 with the LoRA unmerged (as the
trainer does), llama_cpp runs the f16 GGUF with the LoRA pushed at runtime. Rounds alternate A B A B so machine
drift (other processes on shared cores) hits both alike; the median is reported.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_model(dtype: str):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    from grpokit.model_loader import contiguous_lm_head_input, embedded_model_dir

    path = embedded_model_dir()
    kwargs = {"dtype": torch.bfloat16 if dtype != "fp32" else torch.float32}
    if dtype == "nf4":
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                           bnb_4bit_use_double_quant=True,
                                                           bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS, task_type="CAUSAL_LM"))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator).to(param.dtype) * 0.002)
    model.eval()
    contiguous_lm_head_input(model)  # as the run does (model_loader.load_model)
    return model, AutoTokenizer.from_pretrained(path), path


def prompt_ids(tokenizer, length: int = 47) -> list[int]:
    question = "A farmer has 17 sheep and buys 5 more, then sells 8. How many sheep does the farmer have now?"
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    return list(ids)[-length:] if len(ids) >= length else list(ids)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--engines", default="transformers,llama_cpp")
    parser.add_argument("--llama-threads", default="", help="comma list: one llama_cpp engine per thread count "
                        "(default: torch's thread count), e.g. 1,2 to compare on busy cores")
    parser.add_argument("--mismatch", action="store_true", help="also measure sampler/trainer log-prob mismatch")
    a = parser.parse_args()
    import torch

    from grpokit.engine_llama_cpp import LlamaCppEngine
    from grpokit.engine_transformers import TransformersEngine
    from grpokit.engines import SamplingParams

    threads = torch.get_num_threads()
    model, tokenizer, path = build_model("bf16")
    prompt = prompt_ids(tokenizer)
    engines = {}
    for name in a.engines.split(","):
        if name == "transformers":
            engines[name] = TransformersEngine(model, tokenizer)
            continue
        for count in [int(t) for t in a.llama_threads.split(",") if t] or [threads]:
            label = name if not a.llama_threads else f"{name}/{count}t"
            started = time.perf_counter()
            engines[label] = LlamaCppEngine.from_model_dir(path, threads=count, max_sequences=a.completions)
            print(f"{label}: load (export cached) {time.perf_counter() - started:.2f} s")
            pushes = []
            for _ in range(5):
                started = time.perf_counter()
                engines[label].push_adapter(model)
                pushes.append(time.perf_counter() - started)
            print(f"{label}: push_adapter median {statistics.median(pushes) * 1000:.0f} ms (GGUF LoRA write + load)")
    params = SamplingParams(max_tokens=a.tokens, temperature=a.temperature, seed=0)  # no EOS: exactly a.tokens each
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for round_ in range(a.rounds + 1):  # round 0 warms up (thread pools, caches) and is not counted
        for name, engine in engines.items():
            started = time.perf_counter()
            ids, _ = engine.generate([prompt], a.completions, params)
            seconds = time.perf_counter() - started
            tokens = sum(map(len, ids))
            if round_:
                rates[name].append(tokens / seconds)
    print(f"workload: 1 prompt of {len(prompt)} tokens, {a.completions} x {a.tokens} tokens, T={a.temperature}, "
          f"{threads} threads")
    summary = {}
    for name, values in rates.items():
        summary[name] = statistics.median(values)
        print(f"{name:<13} {summary[name]:7.1f} completion tok/s (median of {len(values)}; "
              f"min {min(values):.1f}, max {max(values):.1f})")
    if "transformers" in summary and "llama_cpp" in summary:
        print(f"llama_cpp / transformers: {summary['llama_cpp'] / summary['transformers']:.1f}x")
    from table import header, machine, row, stamp  # BENCHMARKS.md's "Generation engines" rows

    print(f"{machine()}; {stamp()}")
    print(header("engine", "completion tok/s", "adapter push"))
    for name, values in rates.items():
        push = f"{statistics.median(pushes) * 1000:.0f} ms" if name == "llama_cpp" and pushes else "–"
        print(row(name, f"{summary[name]:.1f} ({min(values):.1f}–{max(values):.1f})", push))

    if a.mismatch and "llama_cpp" in engines:
        summary["mismatch"] = mismatch(engines["llama_cpp"], prompt, tokenizer, a)
    print(json.dumps(summary))


def mismatch(engine, prompt, tokenizer, a) -> dict[str, float]:
    """Mean |Δ log-prob| per sampled token between the engine (f16 GGUF of the original weights + LoRA) and the
    trainer's model in fp32 / bf16 / NF4 with the same LoRA."""
    import numpy as np
    import torch

    from grpokit.engines import SamplingParams

    results = {}
    for dtype in ("fp32", "bf16", "nf4"):
        trainer_model, _, _ = build_model(dtype)
        engine.push_adapter(trainer_model)  # same LoRA values (seeded); the GGUF holds the original base weights
        params = SamplingParams(max_tokens=a.tokens, temperature=a.temperature, seed=1,
                                eos_token_ids=(tokenizer.eos_token_id,))
        ids, lps = engine.generate([prompt], a.completions, params)
        deltas = []
        for completion, sampler in zip(ids, lps, strict=True):
            with torch.no_grad():
                logits = trainer_model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1]
            logps = torch.log_softmax(logits.float() / a.temperature, -1)
            trainer = logps.gather(-1, torch.tensor(completion)[:, None])[:, 0].numpy()
            deltas += np.abs(trainer - np.array(sampler)).tolist()
        results[dtype] = float(np.mean(deltas))
        print(f"mean |Δ log-prob| per token, engine vs {dtype} trainer: {results[dtype]:.4f} "
              f"(max {max(deltas):.3f}, {len(deltas)} tokens)")
    return results


if __name__ == "__main__":
    main()

"""The baseline: a plain TRL GRPO script as TRL's quickstart writes it (transformers + PEFT LoRA), no Unsloth.

Same work as our CLI in bench_speed.py: the embedded SmolLM2-135M, the built-in arithmetic prompts, an exact-answer
reward, the same seed, batch, num_generations, completion length and steps. One addition is unavoidable on a CPU-only
machine: TRL 1.15 computes GRPO log-probs with a Triton-only fused LM-head kernel, so the script routes it to
unsloth_zoo's torch implementation (the fix our own transformers fallback uses too); nothing else changes.

    python bench/plain_trl_grpo.py OUTPUT_DIR --steps 4 --batch 8 --generations 4 --completion-length 24 --seed 42
    python bench/plain_trl_grpo.py OUTPUT_DIR --fp32   # float32, as our CLI runs on a CPU without bf16 units
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--completion-length", type=int, default=24)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fp32", action="store_true",
                        help="float32 weights and compute instead of TRL's bf16 default: what our CLI (Unsloth) runs "
                             "on a CPU without bf16 units, where bf16 is emulated and several times slower")
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from data_loader import arithmetic_rows
    from grpokit.model_loader import embedded_model_dir

    if not torch.cuda.is_available():
        os.environ.setdefault("UNSLOTH_IS_PRESENT", "1")
        from unsloth_zoo.cpu.ops import patch_trl_fused_lm_head

        patch_trl_fused_lm_head()

    train, _ = arithmetic_rows(1000, 20, args.seed)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]}
                                 for r in train])

    def accuracy(completions, answer, **kwargs):
        import re

        out = []
        for completion, reference in zip(completions, answer, strict=True):
            numbers = re.findall(r"-?\d+", completion[0]["content"])
            out.append(1.0 if numbers and numbers[-1] == reference else 0.0)
        return out

    config = GRPOConfig(
        output_dir=args.output_dir, per_device_train_batch_size=args.batch, num_generations=args.generations,
        max_completion_length=args.completion_length, max_steps=args.steps, learning_rate=2e-5, seed=args.seed,
        logging_steps=1, save_strategy="no", report_to="none", beta=0.0, use_cpu=not torch.cuda.is_available(),
        **({"bf16": False, "model_init_kwargs": {"dtype": torch.float32}} if args.fp32 else {}),
    )
    trainer = GRPOTrainer(
        model=str(embedded_model_dir()), reward_funcs=accuracy, args=config, train_dataset=dataset,
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                      "gate_proj", "up_proj", "down_proj"],
                               task_type="CAUSAL_LM"),
    )
    trainer.train()
    trainer.save_state()


if __name__ == "__main__":
    main()

"""The transformers engine: `generate` on the training model itself, as TRL does.

In a run this engine means "keep TRL's own generation path" (with our per-group prompt sharing, trl_trainer.py):
the trainer sees `uses_trainer_path` and does not route through `generate` below. The class gives benchmarks and
tests the same interface as the other engines.
"""

from __future__ import annotations

from grpokit.engines import SamplingParams


class TransformersEngine:
    name = "transformers"
    uses_trainer_path = True

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    def push_adapter(self, model) -> None:
        self.model = model  # samples from the live model: nothing to copy

    def generate(self, prompt_token_ids, n, sampling: SamplingParams):
        import torch
        from transformers import GenerationConfig

        from grpokit.shared_prompts import generate_with_shared_prompts

        pad = self.tokenizer.pad_token_id
        rows = [p for p in prompt_token_ids for _ in range(n)]
        width = max(map(len, rows))
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
        attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        config = GenerationConfig(
            do_sample=not sampling.is_greedy, temperature=sampling.temperature if not sampling.is_greedy else None,
            top_p=sampling.top_p, top_k=sampling.top_k or None, min_p=sampling.min_p or None,
            max_new_tokens=sampling.max_tokens, eos_token_id=list(sampling.eos_token_ids) or None, pad_token_id=pad,
            output_logits=True, return_dict_in_generate=True)
        torch.manual_seed(sampling.seed)
        model = self.model
        with torch.no_grad():
            out = generate_with_shared_prompts(model, model.generate, input_ids=input_ids,
                                                attention_mask=attention_mask, generation_config=config)
        new = out.sequences[:, width:]
        temperature = 1.0 if sampling.is_greedy else sampling.temperature
        logps = torch.stack(out.logits, dim=1).float().div(temperature).log_softmax(-1)
        token_logps = logps.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        completions, logprobs = [], []
        eos = set(sampling.eos_token_ids)
        for ids, lps in zip(new.tolist(), token_logps.tolist(), strict=True):
            end = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))
            completions.append(ids[:end])
            logprobs.append(lps[:end])
        return completions, logprobs

    def close(self) -> None:
        self.model = None

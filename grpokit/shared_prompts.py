"""Each distinct prompt through the model once per GRPO group, not once per completion.

GRPO samples `num_generations` completions of every prompt; a plain `generate` prefills the same prompt that many
times. Both the trainer's generation (trl_trainer) and the transformers engine (engine_transformers) call
`generate_with_shared_prompts`; the trainer's log-prob pass uses `distinct_rows` the same way.
"""

from __future__ import annotations

import torch


def distinct_rows(ids, mask):
    """(first row of each distinct (ids, mask) row, index of each row's distinct row)."""
    distinct, row_to_distinct = torch.unique(torch.cat([ids, mask], dim=1), dim=0, return_inverse=True)
    rows = torch.arange(ids.size(0), device=ids.device)
    first_row = torch.full((distinct.size(0),), ids.size(0), dtype=torch.long, device=ids.device)
    first_row.scatter_reduce_(0, row_to_distinct, rows, "amin")
    return first_row, row_to_distinct


def generate_with_shared_prompts(model, generate, input_ids=None, attention_mask=None, **kwargs):
    """`generate` with the prompt cache (all but the last prompt token) prefilled once per distinct prompt.

    generate() then only runs the last prompt token per row before sampling, exactly as it continues from any
    user-supplied cache; positions follow generate's own rule (cumulative attention mask).
    """
    config = kwargs.get("generation_config")
    if (input_ids is None or attention_mask is None or input_ids.size(1) < 2 or set(kwargs) != {"generation_config"}
            or config is None or config.cache_implementation is not None or (config.num_return_sequences or 1) != 1):
        return generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    first_row, row_to_prompt = distinct_rows(input_ids, attention_mask)
    if first_row.size(0) == input_ids.size(0):
        return generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    mask = attention_mask[first_row, :-1]
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    prefix = model(input_ids=input_ids[first_row, :-1], attention_mask=mask, position_ids=positions, use_cache=True,
                   logits_to_keep=1)
    cache = prefix.past_key_values
    cache.reorder_cache(row_to_prompt)
    return generate(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, **kwargs)

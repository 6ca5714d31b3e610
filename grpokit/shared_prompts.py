"""Each distinct prompt through the model once per GRPO group, not once per completion.

GRPO samples `num_generations` completions of every prompt; a plain `generate` prefills the same prompt that many
times. Both the trainer's generation (trl_trainer) and the transformers engine (engine_transformers) call
`generate_with_shared_prompts`; the trainer's log-prob pass uses `distinct_rows` the same way.
"""

from __future__ import annotations

import dataclasses

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


@dataclasses.dataclass
class Packed:
    """A log-prob batch packed one row per distinct prompt (pack_by_prompt); D packed rows of N tokens."""

    input_ids: torch.Tensor  # [D, N]
    position_ids: torch.Tensor  # [D, N]: each token's position in TRL's own row (its column there)
    attend: torch.Tensor  # [D, 1, N, N] bool: which keys each query attends to
    shift_labels: torch.Tensor  # [D, N]: the completion token each position predicts, -100 where none
    rows: torch.Tensor  # [B, C]: the packed row holding the prediction of each completion token
    cols: torch.Tensor  # [B, C]: its position in that row
    kept: torch.Tensor  # [B, C] bool: up to the row's last scored token (the rest is padding, scored 0)


def pack_by_prompt(input_ids, attention_mask, prompt_len: int) -> Packed | None:
    """The log-prob pass as one forward: each distinct prompt once, followed by every completion of it, one row each.

    Two calls (prompt cache, then completions) cost a whole pass of fixed overhead: on a CPU a forward + backward
    through 30 small layers is ~0.4 s of per-op cost whatever the token count (BENCHMARKS.md). Packed, each
    distinct prompt's real tokens but the last come once; then each completion row follows as its own segment: the
    last prompt token (it predicts the first completion token) and the completion up to its last scored token
    (trailing padding and the last token, which predicts nothing, are left out). A 4D mask lets a segment see its
    prompt and its own earlier tokens, nothing else; positions are the tokens' columns in TRL's rows. So every
    scored token sees the same keys at the same positions as in TRL's pass: the same log-probs up to float
    rounding. None where packing would hold more attention scores than TRL's own pass (long completions)."""
    batch, width = input_ids.shape
    completion_len = width - prompt_len
    device = input_ids.device
    first_row, row_to_prompt = distinct_rows(input_ids[:, :prompt_len], attention_mask[:, :prompt_len])
    steps = torch.arange(1, completion_len + 1, device=device)
    lengths = (attention_mask[:, prompt_len:].bool() * steps).amax(dim=1).tolist()  # last scored, not the count
    owner = row_to_prompt.tolist()
    segments = []  # per packed row: [(ids, positions, segment id, key mask, labels)]
    rows, cols = torch.zeros(batch, completion_len, dtype=torch.long), torch.zeros(batch, completion_len, dtype=torch.long)
    for prompt, first in enumerate(first_row.tolist()):
        real = attention_mask[first, :prompt_len - 1].nonzero().squeeze(1)  # left padding left out
        parts = [(input_ids[first, real], real, torch.full_like(real, -1), torch.ones_like(real, dtype=torch.bool),
                  torch.full_like(real, -100))]
        start = real.numel()
        for row in (r for r in range(batch) if owner[r] == prompt):
            length = lengths[row]
            columns = torch.arange(prompt_len - 1, prompt_len - 1 + length, device=device)
            scored = attention_mask[row, columns + 1].bool()
            parts.append((input_ids[row, columns], columns, torch.full_like(columns, row),
                          attention_mask[row, columns].bool(), input_ids[row, columns + 1].masked_fill(~scored, -100)))
            rows[row], cols[row, :length] = prompt, torch.arange(start, start + length)
            start += length
        segments.append([torch.cat(field) for field in zip(*parts, strict=True)])
    sizes = [ids.numel() for ids, *_ in segments]
    if sum(n * n for n in sizes) > batch * width * width:
        return None
    size = max(1, *sizes)

    def padded(index, fill, dtype=torch.long):
        out = torch.full((len(segments), size), fill, dtype=dtype, device=device)
        for d, fields in enumerate(segments):
            out[d, :fields[index].numel()] = fields[index]
        return out

    ids, positions, segment, keys, labels = padded(0, 0), padded(1, 0), padded(2, -2), padded(3, False, torch.bool), \
        padded(4, -100)
    same = segment[:, :, None] == segment[:, None, :]
    attend = keys[:, None, :] & (positions[:, None, :] <= positions[:, :, None]) & (same | (segment[:, None, :] == -1))
    attend |= torch.eye(size, dtype=torch.bool, device=device)  # padding queries see themselves: no all-masked row
    kept = steps[None, :] <= torch.tensor(lengths, device=device)[:, None]
    return Packed(ids, positions, attend[:, None], labels, rows.to(device), cols.to(device), kept)

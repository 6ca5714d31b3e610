"""Each distinct prompt through the model once per GRPO group, not once per completion (in the log-prob pass, their
common beginning once per batch).

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
    """A log-prob batch packed (pack_by_prompt): D packed rows of N tokens, one (the prompts as a prefix tree) or one
    per distinct prompt."""

    input_ids: torch.Tensor  # [D, N]
    position_ids: torch.Tensor  # [D, N]: each token's column in TRL's row (per prompt), less its left padding (tree)
    attend: torch.Tensor  # [D, 1, N, N] bool: which keys each query attends to
    shift_labels: torch.Tensor  # [D, S]: the completion token each scored position predicts, -100 where none
    rows: torch.Tensor  # [B, C]: the packed row holding the prediction of each completion token
    cols: torch.Tensor  # [B, C]: its scored position in that row
    kept: torch.Tensor  # [B, C] bool: up to the row's last scored token (the rest is padding, scored 0)
    # [S]: the position of the model's output each scored position reads (the tree: a prompt's last token predicts
    # the first token of each of its completions), or None where scored positions are the row's own (S = N)
    expand: torch.Tensor | None = None


def pack_by_prompt(input_ids, attention_mask, prompt_len: int, tree: bool = True) -> Packed | None:
    """The log-prob pass as one forward: each distinct prompt once, each completion as a segment after it.

    Two calls (prompt cache, then completions) cost a whole pass of fixed overhead: on a CPU a forward + backward
    through 30 small layers is ~0.4 s of per-op cost whatever the token count (BENCHMARKS.md). With `tree` (a model
    whose attention sees only distances between positions: rotary embeddings) and where one row fits TRL's own
    attention budget (pack_by_prefix), the distinct prompts share their common beginning too (the chat template's
    system prompt, a tool schema, a few-shot header); else one packed row per distinct prompt (pack_per_prompt).
    None where neither holds at most the attention scores of TRL's own pass (long completions)."""
    return (pack_by_prefix(input_ids, attention_mask, prompt_len) if tree else None) or \
        pack_per_prompt(input_ids, attention_mask, prompt_len)


def _completion_segment(input_ids, attention_mask, row: int, prompt_len: int, length: int):
    """A completion row's segment: the last prompt token (it predicts the first completion token) and the
    completion up to its last scored token (trailing padding and the last token, which predicts nothing, left
    out): (ids, columns, key mask, labels)."""
    columns = torch.arange(prompt_len - 1, prompt_len - 1 + length, device=input_ids.device)
    scored = attention_mask[row, columns + 1].bool()
    return (input_ids[row, columns], columns, attention_mask[row, columns].bool(),
            input_ids[row, columns + 1].masked_fill(~scored, -100))


def _scored_lengths(attention_mask, prompt_len: int):
    """(1..C, each row's last scored completion token, counted from 1)."""
    steps = torch.arange(1, attention_mask.size(1) - prompt_len + 1, device=attention_mask.device)
    return steps, (attention_mask[:, prompt_len:].bool() * steps).amax(dim=1).tolist()


def pack_by_prefix(input_ids, attention_mask, prompt_len: int) -> Packed | None:
    """One packed row: the distinct prompts' real tokens as a prefix tree (a token several prompts have at the same
    place after the same tokens is there once), then each completion's tokens up to its last scored one but the
    last as a segment. A 4D mask lets a tree token see its ancestors, and a segment its prompt's path through the
    tree and its own earlier tokens. A prompt's last token is in the tree once for all its completions: its output
    predicts the first token of each (`expand` reads it once per completion, so its gradient is their sum).

    Positions count from each prompt's first real token (a token's column in TRL's row less its left padding), so
    that prompts of different lengths share their beginnings; rotary attention scores depend on the distance
    between positions only, so every scored token sees the same keys at the same distances as in TRL's pass: the
    same log-probs up to float rounding. None where the row would hold more attention scores than TRL's pass, where
    nothing is scored, or where a prompt does not end in a real token (right padding: the per-prompt packing)."""
    batch, width = input_ids.shape
    device = input_ids.device
    first_row, row_to_prompt = distinct_rows(input_ids[:, :prompt_len], attention_mask[:, :prompt_len])
    steps, lengths = _scored_lengths(attention_mask, prompt_len)
    real = attention_mask[:, :prompt_len].sum(dim=1).tolist()
    node: dict[tuple[int, int, int], int] = {}  # (parent, token, position) -> tree index
    tokens, positions, parents, ends = [], [], [], []
    ids_cpu, mask_cpu = input_ids[:, :prompt_len].tolist(), attention_mask[:, :prompt_len].tolist()
    for first in first_row.tolist():
        if not mask_cpu[first][prompt_len - 1]:
            return None
        parent, pad = -1, prompt_len - real[first]
        for column in range(prompt_len):
            if not mask_cpu[first][column]:
                continue
            key = (parent, ids_cpu[first][column], column - pad)
            if key not in node:
                node[key] = len(tokens)
                tokens.append(key[1])
                positions.append(key[2])
                parents.append(parent)
            parent = node[key]
        ends.append(parent)
    tree, scored = len(tokens), sum(lengths)
    size = tree + scored - sum(length > 0 for length in lengths)  # a segment: its completion's scored tokens less one
    if scored == 0 or size * size > batch * width * width:
        return None
    ancestors = torch.zeros(tree, size, dtype=torch.bool)  # row t: tree token t's path
    for t, parent in enumerate(parents):  # parents come before their children
        if parent >= 0:
            ancestors[t] = ancestors[parent]
        ancestors[t, t] = True
    attend = torch.zeros(size, size, dtype=torch.bool)
    attend[:tree] = ancestors
    ids = torch.zeros(size, dtype=torch.long)
    ids[:tree] = torch.tensor(tokens, dtype=torch.long)
    position_ids = torch.zeros(size, dtype=torch.long)
    position_ids[:tree] = torch.tensor(positions, dtype=torch.long)
    labels = torch.full((scored,), -100, dtype=torch.long)
    expand = torch.zeros(scored, dtype=torch.long)
    cols = torch.zeros(batch, width - prompt_len, dtype=torch.long)
    start, at, owner = tree, 0, row_to_prompt.tolist()
    for row in range(batch):
        length = lengths[row]
        if length == 0:
            continue
        seg_ids, columns, keys, seg_labels = (t.cpu() for t in _completion_segment(
            input_ids, attention_mask, row, prompt_len, length))
        seg_ids, columns, keys = seg_ids[1:], columns[1:], keys[1:]  # the prompt's last token is in the tree
        end, n = ends[owner[row]], length - 1
        span = slice(start, start + n)
        ids[span] = seg_ids
        position_ids[span] = columns - (prompt_len - real[row])
        # the prompt's path, then the segment's own earlier tokens that are not padding (and itself)
        attend[span] = ancestors[end]
        attend[span, span] = torch.tril(keys[None, :].expand(n, n)) | torch.eye(n, dtype=torch.bool)
        expand[at] = end
        expand[at + 1:at + length] = torch.arange(start, start + n)
        labels[at:at + length] = seg_labels
        cols[row, :length] = torch.arange(at, at + length)
        start, at = start + n, at + length
    kept = steps[None, :] <= torch.tensor(lengths, device=device)[:, None]
    return Packed(ids[None].to(device), position_ids[None].to(device), attend[None, None].to(device),
                  labels[None].to(device), torch.zeros_like(cols).to(device), cols.to(device), kept, expand.to(device))


def pack_per_prompt(input_ids, attention_mask, prompt_len: int) -> Packed | None:
    """One packed row per distinct prompt: its real tokens but the last once, followed by every completion of it
    as a segment (_completion_segment). A 4D mask lets a segment see its prompt and its own earlier tokens, nothing
    else; positions are the tokens' columns in TRL's rows. So every scored token sees the same keys at the same
    positions as in TRL's pass: the same log-probs up to float rounding. None where packing would hold more
    attention scores than TRL's own pass (long completions)."""
    batch, width = input_ids.shape
    completion_len = width - prompt_len
    device = input_ids.device
    first_row, row_to_prompt = distinct_rows(input_ids[:, :prompt_len], attention_mask[:, :prompt_len])
    steps, lengths = _scored_lengths(attention_mask, prompt_len)
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
            seg_ids, columns, keys, labels = _completion_segment(input_ids, attention_mask, row, prompt_len, length)
            parts.append((seg_ids, columns, torch.full_like(columns, row), keys, labels))
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

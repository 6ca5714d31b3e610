"""Mixed loss: loss = grpo_loss_weight x GRPO + sft_loss_weight x SFT.

The supervised + reward QA recipe (shared/spec/SOURCES.md) trains on the reference answer's cross-entropy and a
reward term together (1.0 supervised, 0.5 reward, gradients clipped at 1.0). TRL's GRPOTrainer has no such term
(the request was declined upstream, trl#2680), so `TRLGRPOTrainer` adds it:

- SFT is the negative log-likelihood of the data's reference reply given the prompt, on the reply's tokens only,
  at temperature 1 (the GRPO log-probs are divided by the sampling temperature; a supervised target is not). The
  reply is the row's `reference` (GSM8K's worked solution, a custom row's `completion`), else its `chosen`
  (preference data), else its `answer` (QA data whose answer is all there is); a row with none adds nothing.
- The prompt tokens are TRL's own (`prompt_ids` of the batch: chat template, system prompt and tools exactly as TRL
  applied them for generation); the reply is the chat template's assistant turn after that prompt, so its
  end-of-turn token is trained too (the model learns to stop), cut at max_completion_length.
- Normalisation follows the active loss_type, so the weight means the same at any gradient accumulation and
  world size: `dapo`/`cispo`/`vespo` divide by the reply tokens of the whole generation batch (all processes, all
  accumulation steps, as TRL does with `num_items_in_batch`, rescaled for steps_per_generation: trl#5619, #6024), so an
  optimizer step's SFT term is the token mean over every reply in it; the other loss types take each micro-batch's
  token mean divided by the accumulation steps, as TRL does for their GRPO term.
- Every completion row carries its prompt's reply, so a reply counts once per completion, as the GRPO term counts
  its prompt; the forward pass runs once per distinct prompt + reply in the micro-batch, weighted by its rows.

Logged per step as `sft_loss` (the token-mean NLL itself, unweighted and unscaled).
"""

from __future__ import annotations

import json
from typing import Any

from config.errors import UsageError

# The reply to train on, by the first of these columns a dataset has (data_loader's mapped rows).
REFERENCE_COLUMNS = ("reference", "chosen", "answer")
# TRL's loss types whose GRPO term divides by the completion tokens of the whole generation batch.
TOKEN_NORMALISED = ("dapo", "cispo", "vespo")


def reference_columns(dataset) -> tuple[str, ...]:
    """The reference columns a dataset has values in, in the order a row's reply is taken from."""
    head = dataset.select(range(min(len(dataset), 1000)))  # as data_loader decides which columns a dataset has
    return tuple(c for c in REFERENCE_COLUMNS if c in dataset.column_names and any(head[c]))


def check_reference(config, dataset, source: str) -> tuple[str, ...]:
    """The columns the SFT term reads for a run with sft_loss_weight > 0; a UsageError (before any model loads)
    when the data has no reference reply to train on. Empty when the mixed loss is off."""
    if not config.sft_loss_weight:
        return ()
    columns = reference_columns(dataset)
    if not columns:
        raise UsageError(
            f"sft_loss_weight {config.sft_loss_weight:g} needs a reference reply per prompt, and {source} has none "
            f"(columns: {', '.join(dataset.column_names)}). Use preference data (chosen), QA data (answer), GSM8K "
            "(worked solution) or custom rows with a \"completion\", or set sft_loss_weight 0.")
    return columns


# ---- tokenising the replies: once per generation batch --------------------------------------------------------


def _tokenizer(trainer):
    processing_class = trainer.processing_class
    return getattr(processing_class, "tokenizer", processing_class)  # a VLM processor wraps its tokenizer


def _render(tokenizer, messages, trainer, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tools=trainer.tools or None,
                                         chat_template=trainer.chat_template, tokenize=False,
                                         **trainer.chat_template_kwargs)


def _without_nulls(value):
    """A trajectory as it was written: a datasets column of messages gives every message (and every tool call's
    arguments) the keys of all the others, set to None; the chat template would render them ("code": null)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _reply_ids(trainer, prompt, reply) -> tuple[list[int], list[int]]:
    """The reply's tokens as the chat template writes them after TRL's generation prompt (end-of-turn included),
    and which of them are trained (1). Plain-text prompts get the reply plus EOS. A reply may be a trajectory (a
    list of messages: assistant turns with tool calls, tool results, the final answer): it is tokenised piece by
    piece as TRL's tool loop builds a completion, and only the assistant turns are trained, never a tool's result.
    Cut at max_completion_length, as completions are."""
    tokenizer = _tokenizer(trainer)

    def tokens(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    ids, trained = None, None
    if isinstance(prompt, list):
        messages = _without_nulls(reply) if isinstance(reply, list) else [{"role": "assistant", "content": reply}]
        ids, trained = [], []
        done = _render(tokenizer, prompt, trainer, True)
        for k, message in enumerate(messages):
            role = message.get("role") if isinstance(message, dict) else None
            if role == "assistant":
                before = _render(tokenizer, [*prompt, *messages[:k]], trainer, True)
                if not before.startswith(done):  # a template that rewrites earlier turns (e.g. thinking blocks)
                    ids = None
                    break
                gap = tokens(before[len(done):])  # the tool turns and the assistant header: context, not trained
                after = _render(tokenizer, [*prompt, *messages[:k + 1]], trainer, False)
                if not after.startswith(before):
                    ids = None
                    break
                own = tokens(after[len(before):])
                ids += gap + own
                trained += [0] * len(gap) + [1] * len(own)
                done = after
        if ids is not None and not ids:
            ids = None
    if ids is None:  # plain-text prompts, or a template that rewrites earlier turns
        text = reply if isinstance(reply, str) else json.dumps(reply, ensure_ascii=False)
        ids = tokens(text) + [tokenizer.eos_token_id]
        trained = [1] * len(ids)
    limit = trainer.max_completion_length
    return ids[:limit], trained[:limit]


def attach_references(trainer, inputs: list[dict[str, Any]], output: dict[str, Any]) -> None:
    """After TRL's `_generate_and_score_completions`: add each row's reply tokens (`sft_ids`, `sft_mask` for
    attention, `sft_loss_mask` for the trained tokens, right padded) and the trained-token count of the generation
    batch over all processes (`sft_num_items`) to its output, which TRL shuffles and splits into micro-batches with
    everything else."""
    import torch

    columns = trainer.sft_columns
    if not trainer.sft_loss_weight or not columns:
        return
    cache: dict[str, tuple[list[int], list[int]]] = {}
    rows = []
    for row in inputs:
        reply = next((row[c] for c in columns if row.get(c)), "")  # a row without its own: nothing to learn from
        key = json.dumps([row["prompt"], reply], default=str)
        if key not in cache:  # a prompt's rows repeat once per completion: tokenise each reply once
            cache[key] = _reply_ids(trainer, row["prompt"], reply) if reply else ([], [])
        rows.append(cache[key])
    device = trainer.accelerator.device
    width = max(1, max(len(ids) for ids, _ in rows))
    pad = _tokenizer(trainer).pad_token_id or 0  # masked out: any id will do
    output["sft_ids"] = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows], device=device)
    output["sft_mask"] = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows], device=device)
    output["sft_loss_mask"] = torch.tensor([trained + [0] * (width - len(trained)) for _, trained in rows],
                                           device=device)
    output["sft_num_items"] = trainer.accelerator.gather(output["sft_loss_mask"].sum()).sum()


# ---- the loss ------------------------------------------------------------------------------------------------


def sft_token_nll(model, prompt_ids, prompt_mask, reply_ids, reply_mask, loss_mask=None):
    """Per-row summed NLL of the reply's trained tokens (`loss_mask`, default: every reply token) given the prompt
    (left-padded prompt, right-padded reply), at temperature 1. Positions count real tokens only, as in generation
    and in a plain, unpadded supervised pass."""
    import torch

    input_ids = torch.cat([prompt_ids, reply_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, reply_mask], dim=1)
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    width = reply_ids.size(1)
    # logits at position t predict token t + 1: the last prompt token's and every reply token's but the last
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                   logits_to_keep=width + 1).logits[:, :-1]
    nll = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), reply_ids, reduction="none")
    return (nll * (reply_mask if loss_mask is None else loss_mask)).sum(-1)


def mixed_loss(trainer, model, inputs: dict[str, Any], grpo_loss):
    """grpo_loss_weight x TRL's loss + sft_loss_weight x the SFT term, normalised as TRL normalises the GRPO term."""
    import torch

    sft_weight, grpo_weight = trainer.sft_loss_weight, trainer.grpo_loss_weight
    if not sft_weight or "sft_ids" not in inputs:
        return grpo_loss if grpo_weight == 1 else grpo_weight * grpo_loss
    reply_ids, reply_mask = inputs["sft_ids"], inputs["sft_mask"]
    loss_mask = inputs.get("sft_loss_mask", reply_mask)
    prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
    # One forward per distinct (prompt, reply), weighted by how many of the micro-batch's rows carry it.
    key = torch.cat([prompt_ids, prompt_mask, reply_ids, reply_mask], dim=1)
    _, inverse, counts = torch.unique(key, dim=0, return_inverse=True, return_counts=True)
    first = torch.full((counts.size(0),), key.size(0), dtype=torch.long, device=key.device)
    first.scatter_reduce_(0, inverse, torch.arange(key.size(0), device=key.device), "amin")
    keep = loss_mask[first].sum(-1) > 0
    first, counts = first[keep], counts[keep]
    tokens = loss_mask.sum()
    mode = "train" if trainer.model.training else "eval"
    accumulation = trainer.current_gradient_accumulation_steps if mode == "train" else 1
    if first.numel():
        with trainer.accelerator.autocast():
            row_nll = sft_token_nll(model, prompt_ids[first], prompt_mask[first], reply_ids[first], reply_mask[first],
                                    loss_mask[first])
        summed = (row_nll * counts).sum()
    else:  # no reply in this micro-batch: a zero that stays connected to the graph
        summed = grpo_loss * 0.0
    if trainer.loss_type in TOKEN_NORMALISED:
        normaliser = inputs["sft_num_items"].clamp(min=1.0) / trainer.accelerator.num_processes
        if mode == "train":  # the generation batch spans steps_per_generation micro-steps; one window is accumulated
            normaliser = normaliser * accumulation / trainer.args.steps_per_generation
    else:
        normaliser = tokens.clamp(min=1) * accumulation
    sft_loss = summed / normaliser
    mean_nll = summed.detach() / tokens.clamp(min=1)
    trainer._metrics[mode]["sft_loss"].append(trainer.accelerator.gather(mean_nll).mean().item())
    return grpo_weight * grpo_loss + sft_weight * sft_loss

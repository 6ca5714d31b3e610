"""Smaller saved activations for CPU training without gradient checkpointing (peak RSS).

On a CPU our runs keep activation checkpointing off (it costs ~60 % step time there, BENCHMARKS.md), so the loss
pass keeps every tensor autograd saves until backward. Three of them are copies that the backward can do without,
and each change below gives the same forward values and gradients (up to float rounding), at no measurable cost:

- **Attention without repeated keys/values.** transformers' eager attention expands grouped K/V heads to one copy
  per query head (`repeat_kv`) and the matmuls save those copies. Grouping the query heads instead
  (`[B, kv_heads, groups * L, D] @ K^T`) multiplies the same numbers and saves the cache's own K/V. SmolLM2 (9 query,
  3 K/V heads): 83 of the 440 MiB the bench step saved.
- **Gated MLP: act(gate) recomputed in backward.** `act(gate) * up` saves gate (for act's backward), act(gate) and
  up (for the product's), and down_proj's LoRA saves the product again (its A matrix's input). Checkpointing the
  product, and the adapter's A and B together with it, keeps gate and up only; the backward recomputes one
  elementwise act(gate) * up and one rank-r product. The frozen base matmul runs once, as before: 100 MiB on the
  bench step.
- **LM-head chunks.** Unsloth's CPU log-prob kernel scores completion tokens in row chunks of
  `UNSLOTH_CPU_CE_CHUNK_ELEMENTS` / vocab rows (341 rows for a 49k vocabulary). Each chunk's logits and softmax
  (2 x rows x vocab floats) exist at the end of the forward, when every activation is alive: 78 MB on the bench step.
  Chunks of 4M elements keep that at ~33 MB; the head weight is then read ~3 times instead of once (estimated
  ~40 ms per step; step times stayed within this machine's noise).

Applied by model_loader on CPU without gradient checkpointing: attention and MLP for the architectures listed below
(attention only where the model loaded with eager attention and has grouped K/V heads), the chunk size always.
"""

from __future__ import annotations

import os
import sys

ATTENTION = "grpo_eager_gqa"  # the name registered with transformers' AttentionInterface
# model_type -> these models' eager attention and MLP are the forms handled here (Gemma 2: soft-capped scores)
ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text"})
LM_HEAD_CHUNK_ELEMENTS = 4 * 1024 * 1024


def grouped_eager_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                            **kwargs):
    """transformers' eager attention (same scores, mask, fp32 softmax, dropout) with query heads grouped per K/V
    head instead of K/V repeated per query head; falls back to the model's own eager function for anything else."""
    import torch
    from torch import nn

    batch, heads, length, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    if kv_heads == heads or heads % kv_heads or kwargs.get("s_aux") is not None:
        return sys.modules[type(module).__module__].eager_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, softcap=softcap, **kwargs)
    groups = heads // kv_heads
    if scaling is None:
        scaling = module.head_dim ** -0.5
    # Query head h reads K/V head h // groups (repeat_kv's order), so [B, H, L, D] -> [B, kv, groups * L, D].
    scores = torch.matmul(query.reshape(batch, kv_heads, groups * length, dim), key.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.view(batch, kv_heads, groups, length, keys)
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, None, :, :keys]
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights.view(batch, kv_heads, groups * length, keys), value)
    output = output.view(batch, heads, length, dim).transpose(1, 2).contiguous()
    return output, weights.view(batch, heads, length, keys)


def _act_times_up(act, gate, up):
    return act(gate) * up


def _adapter_of_act_times_up(act, lora_A, lora_B, scaling, gate, up):
    return lora_B(lora_A(act(gate) * up)) * scaling


def _plain_lora(layer, dtype):
    """(lora_A, lora_B, scaling) when `layer` is a PEFT LoRA Linear computing base(x) + B(A(x)) * scaling with one
    active plain adapter (no dropout, DoRA or merge, no input cast); else None."""
    import torch

    if not hasattr(layer, "lora_A") or not hasattr(layer, "base_layer") or layer.disable_adapters or layer.merged:
        return None
    active = [name for name in layer.active_adapters if name in layer.lora_A]
    if len(active) != 1 or active[0] in getattr(layer, "lora_variant", {}):
        return None
    name = active[0]
    if not isinstance(layer.lora_dropout[name], torch.nn.Identity) or layer.lora_A[name].weight.dtype != dtype:
        return None
    return layer.lora_A[name], layer.lora_B[name], layer.scaling[name]


def gated_mlp_forward(self, x):
    """`down(act(gate(x)) * up(x))` keeping only gate and up for backward: the product is checkpointed (its backward
    recomputes act(gate)), and with a plain LoRA on down_proj its base layer (which keeps only its frozen weight)
    and its adapter (checkpointed with the product) are called apart, so the product itself is not kept either."""
    from torch.utils.checkpoint import checkpoint

    gate, up = self.gate_proj(x), self.up_proj(x)
    if not (gate.requires_grad or up.requires_grad):
        return self.down_proj(self.act_fn(gate) * up)
    product = checkpoint(_act_times_up, self.act_fn, gate, up, use_reentrant=False)
    lora = _plain_lora(self.down_proj, product.dtype)
    if lora is None:
        return self.down_proj(product)
    return self.down_proj.base_layer(product) + checkpoint(_adapter_of_act_times_up, self.act_fn, *lora, gate, up,
                                                           use_reentrant=False)


def register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTENTION, grouped_eager_attention)
    AttentionMaskInterface.register(ATTENTION, eager_mask)  # the same additive 4-D mask eager attention gets


def apply(model) -> list[str]:
    """Switch `model` (a transformers / PEFT causal LM loaded with eager attention) to the leaner forms above and set
    the LM-head chunk size unless the user set it; returns what was changed (for the log)."""
    import types

    config = model.config
    changed = []
    if getattr(config, "model_type", None) in ARCHITECTURES:
        if config._attn_implementation == "eager" and config.num_key_value_heads < config.num_attention_heads:
            register_attention()
            config._attn_implementation = ATTENTION
            changed.append("grouped-query attention without repeated K/V")
        mlps = [m for m in model.modules() if type(m).__name__.endswith("MLP")
                and all(hasattr(m, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn"))]
        for mlp in mlps:
            mlp.forward = types.MethodType(gated_mlp_forward, mlp)
        if mlps:
            changed.append(f"act(gate) recomputed in backward in {len(mlps)} MLPs")
    if "UNSLOTH_CPU_CE_CHUNK_ELEMENTS" not in os.environ:
        os.environ["UNSLOTH_CPU_CE_CHUNK_ELEMENTS"] = str(LM_HEAD_CHUNK_ELEMENTS)
        changed.append(f"LM-head chunks of {LM_HEAD_CHUNK_ELEMENTS // (1 << 20)}M logits")
    return changed

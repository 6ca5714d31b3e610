"""Token sampling from raw logits, in numpy: temperature, top-k, top-p, min-p, greedy, seeded.

The engines sample here rather than inside llama.cpp so that (a) each sampled token's log-prob is the one TRL's
trainer computes, log_softmax(logits / temperature) before any truncation (what TRL compares against vLLM's
log-probs for its importance-sampling correction), and (b) a seed gives the same sample on every engine build.
Truncation follows transformers' warper order: temperature, top-k, top-p, min-p.
"""

from __future__ import annotations

import numpy as np

from . import SamplingParams


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def sample_rows(logits: np.ndarray, sampling: SamplingParams, rngs: list[np.random.Generator]
                ) -> tuple[np.ndarray, np.ndarray]:
    """(token per row, its log-prob) for a (rows, vocab) float32 array; row i draws from rngs[i]."""
    logits = logits.astype(np.float32, copy=False)
    rows = np.arange(logits.shape[0])
    if sampling.is_greedy:
        tokens = logits.argmax(axis=-1)
        return tokens, log_softmax(logits)[rows, tokens]
    scaled = logits / np.float32(sampling.temperature)
    logp = log_softmax(scaled)
    masked = scaled.copy()
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = np.partition(masked, vocab - sampling.top_k, axis=-1)[:, vocab - sampling.top_k][:, None]
        masked[masked < kth] = -np.inf
    if sampling.top_p < 1.0:
        order = np.argsort(-masked, axis=-1)
        probs = np.exp(log_softmax(np.take_along_axis(masked, order, axis=-1)))
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it included)
        drop_sorted = (np.cumsum(probs, axis=-1) - probs) >= sampling.top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        masked[drop] = -np.inf
    if sampling.min_p > 0:
        probs = np.exp(log_softmax(masked))
        masked[probs < sampling.min_p * probs.max(axis=-1, keepdims=True)] = -np.inf
    probs = np.exp(log_softmax(masked)).astype(np.float64)
    cdf = np.cumsum(probs, axis=-1)
    draws = np.array([rng.random() for rng in rngs]) * cdf[:, -1]
    tokens = np.minimum((cdf <= draws[:, None]).sum(axis=-1), vocab - 1)
    # a token the warpers removed can never be drawn, even at cdf ties (zero-probability steps)
    return tokens, logp[rows, tokens]


def sequence_rngs(seed: int, count: int) -> list[np.random.Generator]:
    """One independent stream per sequence: sequence i's sample does not depend on how many others run with it."""
    return [np.random.Generator(np.random.PCG64(seq)) for seq in np.random.SeedSequence(seed).spawn(count)]

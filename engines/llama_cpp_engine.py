"""The llama_cpp engine: batched sampling on CPU through llama.cpp's low-level API, with the LoRA pushed at runtime.

One llama.cpp context holds every sequence of a call (`n_seq_max` = completions in flight, one unified KV cache).
Each distinct prompt is decoded once, its tokens carrying the ids of all the sequences that continue it (llama.cpp's
`batched` example); then every decode step is one batch with one token per unfinished sequence. Logits are read with
`llama_get_logits_ith` and sampled in numpy (engines/sampling.py), which gives each token's log-prob and seeded,
reproducible samples. The model file is mmapped (no copy of the weights in Python); the LoRA is a few MB.
"""

from __future__ import annotations

import ctypes
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from config.errors import UsageError

from . import SamplingParams
from .sampling import sample_rows, sequence_rngs

log = logging.getLogger("grpo")

MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: larger calls are split into chunks of whole prompts
# ggml.h's enum ggml_log_level (llama-cpp-python's _logger.py comment has an older numbering)
GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_CONT = 3, 4, 5
_log_callback = None  # kept referenced: llama.cpp calls it for the life of the process
_last_level = [0]  # a CONT message continues the previous one's level


def _llama():
    import llama_cpp

    global _log_callback
    if _log_callback is None:
        # llama.cpp logs every tensor and vocabulary quirk at load. Its errors reach the terminal; its warnings go
        # to the log file (at load they are notes about its own text tokenizer, which the engine never uses: it is
        # fed token ids, or about its cache layout, e.g. Gemma's full-size sliding-window cache); the rest is dropped.
        @llama_cpp.llama_log_callback
        def route(level, text, _user_data):
            level = _last_level[0] if level == GGML_LOG_LEVEL_CONT else level
            _last_level[0] = level
            message = text.decode("utf-8", "replace").rstrip()
            if level == GGML_LOG_LEVEL_ERROR and message:
                log.error("llama.cpp: %s", message)
            elif level == GGML_LOG_LEVEL_WARN and message:
                log.warning("llama.cpp: %s", message, extra={"file_only": True})

        _log_callback = route
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
    return llama_cpp


class LlamaCppEngine:
    name = "llama_cpp"

    def __init__(self, gguf_path: str | Path, architecture: str, n_head: int, n_kv_head: int, threads: int,
                 max_sequences: int = 8, max_context: int = 512):
        L = _llama()
        self._L = L
        self.gguf_path, self.architecture = Path(gguf_path), architecture
        self.n_head, self.n_kv_head, self.threads = n_head, n_kv_head, threads
        params = L.llama_model_default_params()
        params.n_gpu_layers = 0
        self._model = L.llama_model_load_from_file(str(gguf_path).encode(), params)
        if not self._model:
            raise UsageError(f"llama_cpp engine: llama.cpp could not load {gguf_path}; delete it to export it again.")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self._model))
        self._ctx = self._batch = None
        self._ctx_sequences = self._ctx_cells = 0
        self._adapter = None
        self._lora_dir = tempfile.mkdtemp(prefix="grpo-lora-")
        self.weights = "the weights in the GGUF"  # what it samples from (from_model_dir says which)
        self.pushes = 0
        self.push_seconds = 0.0
        self._ensure_context(max_sequences, max_context)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, threads: int, max_sequences: int = 8, max_context: int = 512,
                       trainer_model=None):
        """Export (once, cached) and load the model in `model_dir`; a UsageError names what is unsupported.

        `trainer_model` with a 4-bit base: export the dequantised NF4 weights the trainer computes with, so that the
        engine samples from (nearly) the trainer's own distribution."""
        import json

        from model_loader import cache_dir

        from .gguf_export import base_gguf, dequantized_gguf, quantized_weights, remove_stale_exports

        dequantised = trainer_model is not None and bool(quantized_weights(trainer_model))
        path = dequantized_gguf(trainer_model, model_dir, cache_dir()) if dequantised else base_gguf(model_dir,
                                                                                                      cache_dir())
        remove_stale_exports(cache_dir(), path)
        config = json.loads((Path(model_dir) / "config.json").read_text())
        engine = cls(path, config["architectures"][0], config["num_attention_heads"],
                     config.get("num_key_value_heads") or config["num_attention_heads"], threads, max_sequences,
                     max_context)
        engine.weights = "the dequantised 4-bit weights" if dequantised else "the base weights"
        return engine

    def _ensure_context(self, sequences: int, cells: int) -> None:
        """A context with room for `sequences` sequences and `cells` KV cells (grown, never shrunk)."""
        if self._ctx is not None and sequences <= self._ctx_sequences and cells <= self._ctx_cells:
            return
        L = self._L
        self._free_context()
        sequences, cells = max(sequences, self._ctx_sequences), max(cells, self._ctx_cells)
        cells = -(-cells // 256) * 256
        params = L.llama_context_default_params()
        params.n_ctx = params.n_batch = cells  # the whole prompt batch fits in one llama_decode call
        params.n_ubatch = min(cells, 512)
        params.n_seq_max = sequences
        params.kv_unified = True  # all sequences share one cache: a shared prompt is stored once
        params.n_threads = params.n_threads_batch = self.threads
        self._ctx = L.llama_init_from_model(self._model, params)
        if not self._ctx:
            raise RuntimeError(f"llama.cpp could not create a context ({sequences} sequences, {cells} cells)")
        self._batch = L.llama_batch_init(cells, 0, sequences)
        self._ctx_sequences, self._ctx_cells = sequences, cells
        if self._adapter is not None:
            self._apply_adapter(self._adapter)

    def _free_context(self) -> None:
        if self._batch is not None:
            self._L.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            self._L.llama_free(self._ctx)
            self._ctx = None

    def _apply_adapter(self, adapter) -> None:
        L = self._L
        adapters = (L.llama_adapter_lora_p_ctypes * 1)(adapter)
        scales = (ctypes.c_float * 1)(1.0)
        if L.llama_set_adapters_lora(self._ctx, adapters, 1, scales) != 0:
            raise RuntimeError("llama.cpp refused the LoRA adapter")

    def push_adapter(self, model) -> None:
        """Convert `model`'s active LoRA to GGUF, load it, make the context use it, free the previous one."""
        from .gguf_export import write_lora_gguf

        started = time.perf_counter()
        L = self._L
        path = Path(self._lora_dir) / f"lora-{self.pushes}.gguf"
        write_lora_gguf(model, path, self.architecture, self.n_head, self.n_kv_head)
        try:
            adapter = L.llama_adapter_lora_init(self._model, str(path).encode())
        finally:
            path.unlink(missing_ok=True)  # llama.cpp has read it into its own buffers
        if not adapter:
            raise RuntimeError("llama.cpp could not load the LoRA adapter (does it match the exported model?)")
        self._apply_adapter(adapter)
        if self._adapter is not None:
            L.llama_adapter_lora_free(self._adapter)
        self._adapter = adapter
        self.pushes += 1
        self.push_seconds += time.perf_counter() - started

    def generate(self, prompt_token_ids, n, sampling: SamplingParams):
        """`n` completions per prompt, prompt-major; identical prompts are decoded once."""
        completions, logprobs = [], []
        per_chunk = max(1, MAX_SEQUENCES // n)
        rngs = sequence_rngs(sampling.seed, len(prompt_token_ids) * n)
        for start in range(0, len(prompt_token_ids), per_chunk):
            ids, lps = self._generate_chunk(prompt_token_ids[start:start + per_chunk], n, sampling,
                                            rngs[start * n:(start + per_chunk) * n])
            completions += ids
            logprobs += lps
        return completions, logprobs

    def _generate_chunk(self, prompts, n, sampling: SamplingParams, rngs):
        L = self._L
        distinct: dict[tuple[int, ...], list[int]] = {}  # prompt -> its sequence ids
        for index, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError("llama_cpp engine: empty prompt")
            distinct.setdefault(tuple(prompt), []).extend(range(index * n, index * n + n))
        sequences = len(prompts) * n
        self._ensure_context(sequences, sum(map(len, distinct)) + sequences * sampling.max_tokens + 1)
        L.llama_memory_clear(L.llama_get_memory(self._ctx), True)

        # 1. every distinct prompt once, each token tagged with all its sequences; logits at each last token
        batch = self._batch
        entry, last_entry = 0, {}
        for prompt, seqs in distinct.items():
            for pos, token in enumerate(prompt):
                batch.token[entry], batch.pos[entry], batch.n_seq_id[entry] = token, pos, len(seqs)
                for j, seq in enumerate(seqs):
                    batch.seq_id[entry][j] = seq
                batch.logits[entry] = pos == len(prompt) - 1
                entry += 1
            last_entry[prompt] = entry - 1
        batch.n_tokens = entry
        self._decode()
        seq_entry = np.empty(sequences, dtype=np.int64)
        seq_pos = np.empty(sequences, dtype=np.int64)
        for prompt, seqs in distinct.items():
            seq_entry[seqs], seq_pos[seqs] = last_entry[prompt], len(prompt)

        # 2. one batch per step: the last sampled token of every unfinished sequence
        eos = set(sampling.eos_token_ids)
        out_ids: list[list[int]] = [[] for _ in range(sequences)]
        out_lps: list[list[float]] = [[] for _ in range(sequences)]
        active = list(range(sequences))
        while active:
            logits = np.stack([self._logits(int(seq_entry[s])) for s in active])
            tokens, token_lps = sample_rows(logits, sampling, [rngs[s] for s in active])
            still = []
            for s, token, lp in zip(active, tokens.tolist(), token_lps.tolist(), strict=True):
                out_ids[s].append(token)
                out_lps[s].append(lp)
                if token not in eos and len(out_ids[s]) < sampling.max_tokens:
                    still.append(s)
            active = still
            if not active:
                break
            for entry, s in enumerate(active):
                batch.token[entry], batch.pos[entry], batch.n_seq_id[entry] = out_ids[s][-1], seq_pos[s], 1
                batch.seq_id[entry][0] = s
                batch.logits[entry] = True
                seq_entry[s] = entry
                seq_pos[s] += 1
            batch.n_tokens = len(active)
            self._decode()
        return out_ids, out_lps

    def prompt_logits(self, prompt: list[int]) -> np.ndarray:
        """The raw next-token logits after `prompt` (checks against the trainer's model)."""
        L = self._L
        self._ensure_context(1, len(prompt) + 1)
        L.llama_memory_clear(L.llama_get_memory(self._ctx), True)
        batch = self._batch
        for pos, token in enumerate(prompt):
            batch.token[pos], batch.pos[pos], batch.n_seq_id[pos] = token, pos, 1
            batch.seq_id[pos][0] = 0
            batch.logits[pos] = pos == len(prompt) - 1
        batch.n_tokens = len(prompt)
        self._decode()
        return self._logits(len(prompt) - 1)

    def _decode(self) -> None:
        code = self._L.llama_decode(self._ctx, self._batch)
        if code != 0:
            raise RuntimeError(f"llama_decode failed ({code}): context too small or out of memory")

    def _logits(self, entry: int) -> np.ndarray:
        pointer = self._L.llama_get_logits_ith(self._ctx, entry)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).copy()

    def close(self) -> None:
        if getattr(self, "_L", None) is None:
            return
        self._free_context()
        if self._adapter is not None:
            self._L.llama_adapter_lora_free(self._adapter)
            self._adapter = None
        if getattr(self, "_model", None):
            self._L.llama_model_free(self._model)
            self._model = None
        if os.path.isdir(self._lora_dir):
            os.rmdir(self._lora_dir)
        self._L = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn down ctypes already
            pass

    def describe(self) -> str:
        return f"llama_cpp ({self.gguf_path.name}, {self.threads} threads)"

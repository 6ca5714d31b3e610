"""The llama_cpp engine: batched sampling on CPU through llama.cpp's low-level API, with the LoRA pushed at runtime.

One llama.cpp context holds every sequence of a call (`n_seq_max` = completions in flight, one unified KV cache).
The prompts are decoded as a prefix tree: a token shared by several prompts at the same place (a chat template's
system prompt, one prompt's n completions) is decoded once, carrying the ids of all the sequences that continue it
(llama.cpp's `batched` example, generalised); then every decode step is one batch with one token per unfinished
sequence. Logits are read with `llama_get_logits_ith` and sampled in numpy (sampling.py), which gives each token's
log-prob and seeded, reproducible samples. The model file is mmapped (no copy of the weights in Python); the LoRA
is a few MB.

One copy of the weights, not two: where the trainer keeps its frozen projections in 16 bits (Unsloth's bf16-stored
Linear, which upcasts them per matmul, see model_loader.frozen_weights_in_bf16; or, on a CPU with bf16 units, plain
bf16 ones), `share_weights` points them at the tensors in llama.cpp's own read-only mapping of the GGUF (bf16 where
the trainer computes in bf16, f32 where it computes in float32: read as they are, no cast per matmul; f16 where
float32 would not fit in memory, upcast per matmul), after
checking each one holds the same values (Llama's q/k in the GGUF's row order, their outputs reordered
back by a forward hook); the trainer's mmapped checkpoint is then released. `unshare_weights` (before a merge, and
before the engine frees its model) gives the trainer its own copies back: nothing may write into a read-only mapping.
Between generations, `release_idle_pages` drops the tensors only the engine reads from the resident set.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
import sys
import tempfile
import time
import weakref
from pathlib import Path

import numpy as np

from config.errors import UsageError
from grpokit.engines import SamplingParams
from grpokit.gguf_export import ggml_float_types, gguf_tensor_table
from grpokit.sampling import sample_rows, sequence_rngs

log = logging.getLogger("grpo")

MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: larger calls are split into chunks of whole prompts
PREFILL_TOKENS = 512  # prompt tokens per llama_decode call: the context's n_ubatch (see _ensure_context)
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


MADV_DONTNEED = 4
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@functools.cache
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes, libc.madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return libc


def _whole_pages(tensors) -> list[tuple[int, int]]:
    """(address, length) of the whole pages inside each (address, bytes, type) tensor."""
    ranges = []
    for address, size, _ in tensors:
        start, end = -(-address // PAGE) * PAGE, (address + size) // PAGE * PAGE
        if end > start:
            ranges.append((start, end - start))
    return ranges


class LoraFile:
    """A model's LoRA written as a GGUF adapter again and again (the engine's push, every step): the file's layout
    (header, metadata, tensor table) is made once by gguf_export.write_lora_gguf and read back; each `write` fills
    the tensors' current values into it and writes it in one call, the same bytes write_lora_gguf would write, without
    walking the model's modules or running GGUFWriter at every push."""

    def __init__(self, model, path: str | Path, architecture: str, n_head: int, n_kv_head: int):
        from grpokit import gguf_export as gguf

        self.layout, _ = gguf.lora_layout(model, architecture, n_head, n_kv_head)
        gguf.write_lora_gguf(model, path, architecture, n_head, n_kv_head)
        table = gguf_tensor_table(path)
        self.template = bytearray(Path(path).read_bytes())
        self.places = {name: (offset, size) for name, (offset, size, _) in table.items()}

    def write(self, path: str | Path) -> Path:
        from grpokit import gguf_export as gguf

        data = self.template  # padding and header stay as written; every tensor's bytes are replaced below
        for name, array in gguf.layout_tensors(self.layout).items():
            offset, size = self.places[name]
            if array.nbytes != size:
                raise RuntimeError(f"LoRA tensor {name} changed shape since the adapter file was laid out")
            np.frombuffer(data, dtype=np.float32, count=array.size, offset=offset)[:] = array.ravel()
        Path(path).write_bytes(data)
        return Path(path)


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
        self._lora_file = None  # (the model it was laid out for, its LoraFile)
        self._lora_dir = tempfile.mkdtemp(prefix="grpo-lora-")
        # removed by close(), or at the interpreter's exit where nothing closed the engine (__del__ does nothing
        # then): a run ended without it, leaving one empty directory in /tmp per run
        self._remove_lora_dir = weakref.finalize(self, shutil.rmtree, self._lora_dir, ignore_errors=True)
        self.weights = "the weights in the GGUF"  # what it samples from (from_model_dir says which)
        self._shared: list = []  # trainer modules whose weight is a view of this engine's mapping
        self._own_dtype: dict = {}  # their weight's dtype before sharing (unshare_weights gives it back)
        self._own_class: dict = {}  # those of them that were plain Linear before sharing (ditto)
        self._reordered: dict = {}  # those of them viewed in the GGUF's row order -> (HF order, their output hook)
        self._map_tensors()  # and _idle_pages: (address, length) of mapped weights only the engine reads
        self.pushes = 0
        self.push_seconds = 0.0
        self._ensure_context(max_sequences, max_context)
        self.release_idle_pages()  # loading read them all; the first generation reads back what it needs

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, threads: int, max_sequences: int = 8, max_context: int = 512,
                       trainer_model=None):
        """Export (once, cached) and load the model in `model_dir`; a UsageError names what is unsupported.

        `trainer_model` with a 4-bit base: export the dequantised NF4 weights the trainer computes with, so that the
        engine samples from (nearly) the trainer's own distribution. A bitsandbytes 4-bit base keeps its own weights;
        16-bit ones (the base, or NF4-rounded: model_loader.nf4_in_16bit) are shared with the trainer."""
        import json

        from grpokit import gguf_export as gguf
        from grpokit.model_loader import cache_dir, nf4_rounding

        bnb_4bit = trainer_model is not None and bool(gguf.quantized_weights(trainer_model))
        dequantised = bnb_4bit or (trainer_model is not None and nf4_rounding(trainer_model) is not None)
        dtype = gguf.engine_dtype(trainer_model)
        path = gguf.dequantized_gguf(trainer_model, model_dir, cache_dir(), dtype) if dequantised else \
            gguf.base_gguf(model_dir, cache_dir(), dtype)
        gguf.remove_stale_exports(cache_dir(), path)
        config = json.loads((Path(model_dir) / "config.json").read_text())
        engine = cls(path, config["architectures"][0], config["num_attention_heads"],
                     config.get("num_key_value_heads") or config["num_attention_heads"], threads, max_sequences,
                     max_context)
        engine.weights = "the dequantised 4-bit weights" if dequantised else "the base weights"
        if trainer_model is not None and not bnb_4bit:
            engine.share_weights(trainer_model)
        return engine

    def _mapping(self) -> tuple[int, int, int] | None:
        """(address, file offset, length) of llama.cpp's mmap of the GGUF in this process (Linux; it maps from the
        page holding the first tensor's data), or None: not mmapped, or not knowable."""
        from grpokit.model_loader import file_mappings

        target = os.path.realpath(self.gguf_path)
        found = [(start, offset, end - start) for start, end, offset, path in file_mappings() if path == target]
        return found[0] if len(found) == 1 else None

    def _map_tensors(self) -> None:
        """Where each tensor of the GGUF lies in this process: {name: (address, bytes, ggml type)}, empty when the
        mapping is not knowable (then nothing is shared or released)."""
        self._tensors, self._idle_pages = {}, []
        mapping = self._mapping()
        if mapping is None:
            return
        address, mapped_from, mapped_length = mapping
        try:
            table = gguf_tensor_table(self.gguf_path)
        except (OSError, AttributeError, RuntimeError) as err:  # a libggml without the gguf API: an optimisation lost
            log.warning("llama_cpp engine: cannot locate the GGUF's tensors (%s); weights not shared", err,
                        extra={"file_only": True})
            return
        self._tensors = {name: (address + offset - mapped_from, size, kind)
                         for name, (offset, size, kind) in table.items()
                         if mapped_from <= offset and offset + size <= mapped_from + mapped_length}
        self._idle_pages = _whole_pages(self._tensors.values())

    def share_weights(self, model) -> int:
        """Make the trainer's frozen 16-bit projections views of the engine's float tensors; returns how many.

        Frozen projections with a 16-bit weight qualify: Unsloth's bf16-stored Linear (a CPU without bf16 units: bf16 as
        loaded, or f16 where a 4-bit run rounded it through NF4; the GGUF is f32 there, the view is float32 and the
        matmul reads it as it is, or f16 where float32 would not fit, which it upcasts per matmul), and plain Linear
        ones (a CPU with bf16 units, where the model computes in bf16 and the GGUF is bf16: the view is used as it is; a
        view of another dtype makes them bf16-stored Linear, casting it to the input's dtype per matmul); each candidate
        must hold the same values (f16 keeps every bf16 value down to 2^-24; NF4-rounded weights are exported from their
        stored values). Where llama.cpp's converter reordered the rows (Llama's q/k: HF's rotary layout -> GGML's), the
        view is taken in GGUF order and a forward hook puts the projection's outputs back in HF order (an index_select
        on the activations). Unshared ones become the trainer's own copies so that the checkpoint's mapping can go."""
        import torch

        try:
            from unsloth_zoo.cpu.ops import Bf16StoredLinear
        except ImportError:
            return 0
        from grpokit.gguf_export import LORA_TENSOR_NAMES, PROJECTION_MODULE, SUPPORTED_ARCHITECTURES, permute_rows
        from grpokit.model_loader import off_checkpoint_mapping

        def projection(name):
            match = PROJECTION_MODULE.search(name)
            return bool(match) and match.group(2) in LORA_TENSOR_NAMES

        # Unsloth's bf16-stored Linear (a CPU without bf16 units: float32 compute), and plain Linear projections whose
        # 16-bit weight the model computes with as it is (a CPU with bf16 units: bf16 weights, NF4-rounded or not)
        candidates = [(name, module) for name, module in model.named_modules()
                      if (type(module) is Bf16StoredLinear or (type(module) is torch.nn.Linear and projection(name)))
                      and module.weight.dtype in (torch.bfloat16, torch.float16) and not module.weight.requires_grad]
        if not candidates or not self._tensors:
            return 0
        permuted = SUPPORTED_ARCHITECTURES.get(self.architecture, ("", False))[1]
        shared_names = set()
        for name, module in candidates:
            match = PROJECTION_MODULE.search(name)
            weight, view, rows = module.weight, None, None
            tensor = f"blk.{match.group(1)}.{LORA_TENSOR_NAMES[match.group(2)]}.weight" \
                if match and match.group(2) in LORA_TENSOR_NAMES else ""
            if permuted and tensor and match.group(2) in ("q_proj", "k_proj") and module.bias is None:
                heads = self.n_head if match.group(2) == "q_proj" else self.n_kv_head
                rows = permute_rows(torch.arange(weight.shape[0]), heads)  # GGUF row i holds HF row rows[i]
            address, size, kind = self._tensors.get(tensor, (0, 0, -1))
            stored = ggml_float_types().get(kind)
            if stored is not None and size == weight.numel() * stored.itemsize:
                raw = (ctypes.c_uint8 * size).from_address(address)
                view = torch.frombuffer(raw, dtype=stored).view(weight.shape)
                # every 8th row: a row order or a tensor that differs shows in any of them, at 1/8 of the time of
                # reading both copies whole
                expected = weight[::8] if rows is None else weight[rows[::8]]
                gap = (view[::8].float() - expected.float()).abs().max()
                if not bool(torch.isfinite(gap)) or gap > 2.0**-24:
                    view = None
            if view is not None:
                shared_names.add(tensor)
                self._shared.append(module)
                self._own_dtype[module] = weight.dtype
                if type(module) is torch.nn.Linear and view.dtype != weight.dtype:
                    # the f16 view is cast to the input's dtype per matmul (bit-exact for a bf16 weight that passed
                    # the check above), and only the view is kept for the backward, not a cast copy
                    module.__class__ = Bf16StoredLinear
                    self._own_class[module] = torch.nn.Linear
                if rows is not None:
                    order = torch.argsort(rows)  # HF output j = GGUF output order[j]
                    self._reordered[module] = (order, module.register_forward_hook(
                        lambda _module, _inputs, output, order=order: output.index_select(-1, order)))
            else:
                view = weight.detach().clone()  # the trainer's own copy, off the checkpoint's mapping
            module.weight = torch.nn.Parameter(view, requires_grad=False)
        self._idle_pages = _whole_pages(t for name, t in self._tensors.items() if name not in shared_names)
        if self._shared:
            # the checkpoint's mapping holds these projections a second time; on a CPU without bf16 units Unsloth has
            # already upcast everything else to float32 copies, with them the embeddings and norms still view it
            off_checkpoint_mapping(model)
            shared_bytes = sum(self._tensors[name][1] for name in shared_names)
            log.info("llama_cpp engine: the trainer computes with the engine's copy of %d of %d frozen projections "
                     "(%.0f MB not held twice)", len(self._shared), len(candidates), shared_bytes / 2**20,
                     extra={"file_only": True})
        return len(self._shared)

    def unshare_weights(self) -> None:
        """Give the trainer its own (dtype as before sharing, HF row order) copies of the weights it shares with the
        engine."""
        import torch

        for module in self._shared:
            weight = module.weight.detach()
            if module in self._reordered:
                order, hook = self._reordered.pop(module)
                hook.remove()
                weight = weight.index_select(0, order)
            own = weight.to(self._own_dtype.pop(module, torch.bfloat16), copy=True)
            module.weight = torch.nn.Parameter(own, requires_grad=False)
            module.__class__ = self._own_class.pop(module, type(module))
        self._shared = []
        self._idle_pages = _whole_pages(self._tensors.values())

    def release_idle_pages(self) -> None:
        """Drop the mapped weights only the engine reads from this process's resident memory until it next
        generates (madvise MADV_DONTNEED on a read-only file mapping: they fault back in from the page cache,
        unchanged; measured: no change in generation time). Training then runs without them."""
        for address, length in self._idle_pages:
            _libc().madvise(address, length, MADV_DONTNEED)

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
        params.n_ubatch = min(cells, PREFILL_TOKENS)
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
        started = time.perf_counter()
        L = self._L
        path = Path(self._lora_dir) / f"lora-{self.pushes}.gguf"
        if self._lora_file is None or self._lora_file[0]() is not model:  # laid out once per model
            self._lora_file = (weakref.ref(model), LoraFile(model, path, self.architecture, self.n_head,
                                                            self.n_kv_head))
        else:
            self._lora_file[1].write(path)
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
        """`n` completions per prompt, prompt-major; shared prompt prefixes are decoded once."""
        completions, logprobs = [], []
        per_chunk = max(1, MAX_SEQUENCES // n)
        rngs = sequence_rngs(sampling.seed, len(prompt_token_ids) * n)
        for start in range(0, len(prompt_token_ids), per_chunk):
            ids, lps = self._generate_chunk(prompt_token_ids[start:start + per_chunk], n, sampling,
                                            rngs[start * n:(start + per_chunk) * n])
            completions += ids
            logprobs += lps
        self.release_idle_pages()
        return completions, logprobs

    def _generate_chunk(self, prompts, n, sampling: SamplingParams, rngs):
        L = self._L
        sequences = len(prompts) * n
        # 1. the prompts as a prefix tree, decoded in one batch: a token that several prompts share at the same
        #    place (the chat template's system prompt, a few-shot header, one prompt's n completions) is decoded
        #    once, tagged with the ids of every sequence that continues it; logits at each prompt's last token.
        #    Parents come before children, and a sequence's own tokens are exactly its prompt's positions.
        child: dict[tuple[int, int], int] = {}  # (parent entry or -1, token) -> entry
        tokens, positions, tagged = [], [], []  # per entry
        seq_entry = np.empty(sequences, dtype=np.int64)  # the entry whose logits each sequence samples from next
        seq_pos = np.empty(sequences, dtype=np.int64)
        for index, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError("llama_cpp engine: empty prompt")
            seqs, parent = range(index * n, index * n + n), -1
            for pos, token in enumerate(prompt):
                entry = child.get((parent, token))
                if entry is None:
                    entry = child[(parent, token)] = len(tokens)
                    tokens.append(token)
                    positions.append(pos)
                    tagged.append([])
                tagged[entry].extend(seqs)
                parent = entry
            seq_entry[seqs], seq_pos[seqs] = parent, len(prompt)
        self._ensure_context(sequences, len(tokens) + sequences * sampling.max_tokens + 1)
        L.llama_memory_clear(L.llama_get_memory(self._ctx), True)
        batch = self._batch
        last = set(seq_entry.tolist())
        prompt_logits: dict[int, np.ndarray] = {}  # entry -> the logits each sequence samples its first token from
        # decoded one micro-batch (n_ubatch tokens, llama.cpp's own split of a larger call) per call: the same
        # computation, and Python gets control back between them, so a signal (a second Ctrl-C) is acted on within
        # one micro-batch instead of after the whole prompt batch
        for begin in range(0, len(tokens), PREFILL_TOKENS):
            chunk = range(begin, min(begin + PREFILL_TOKENS, len(tokens)))
            for i, entry in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tokens[entry], positions[entry], len(tagged[entry])
                for j, seq in enumerate(tagged[entry]):
                    batch.seq_id[i][j] = seq
                batch.logits[i] = entry in last
            batch.n_tokens = len(chunk)
            self._decode()
            prompt_logits.update((entry, self._logits(i)) for i, entry in enumerate(chunk) if entry in last)

        # 2. one batch per step: the last sampled token of every unfinished sequence
        eos = set(sampling.eos_token_ids)
        out_ids: list[list[int]] = [[] for _ in range(sequences)]
        out_lps: list[list[float]] = [[] for _ in range(sequences)]
        active = list(range(sequences))
        step_logits = prompt_logits.__getitem__  # the first token: from the prompt batch's kept logits
        while active:
            logits = np.stack([step_logits(int(seq_entry[s])) for s in active])
            step_logits = self._logits  # then: from the last decode call's outputs
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
        if self._shared:
            self.unshare_weights()  # before the mapping they view goes away
        self._free_context()
        if self._adapter is not None:
            self._L.llama_adapter_lora_free(self._adapter)
            self._adapter = None
        if getattr(self, "_model", None):
            self._L.llama_model_free(self._model)
            self._model = None
        self._remove_lora_dir()
        self._L = None

    def __del__(self):
        if sys is None or sys.is_finalizing():  # module globals may already be None at interpreter exit
            return  # the process is ending: the OS frees it all, no need to copy shared weights out first
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn down ctypes already
            pass

    def set_threads(self, threads: int) -> None:
        """The thread count of the next llama_decode calls. Without an attached threadpool, ggml starts that many
        threads for each call and ends them after it (ggml_graph_compute's disposable pool): nothing keeps polling
        between calls, and a new count costs nothing."""
        if threads != self.threads:
            self.threads = threads
            if self._ctx is not None:
                self._L.llama_set_n_threads(self._ctx, threads, threads)

    def describe(self) -> str:
        return f"llama_cpp ({self.gguf_path.name}, {self.threads} threads)"

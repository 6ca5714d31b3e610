"""The trained model where people run it: `python train_grpo.py export RUN_DIR` (the machinery behind the command).

    python train_grpo.py export grpo_outputs/quick_test                              # GGUF, f16
    python train_grpo.py export grpo_outputs/quick_test --quant q4_k_m --ollama      # + Modelfile: `ollama create`
    python train_grpo.py export grpo_outputs/quick_test --format gguf-lora           # llama.cpp --lora, Ollama ADAPTER
    python train_grpo.py export grpo_outputs/quick_test --format merged              # transformers / vLLM, no PEFT
    python train_grpo.py export grpo_outputs/quick_test --push-to-hub me/my-model --private

What each format is:
- `gguf`: the LoRA merged into the weights the run computed with (`--base trained`: a 4-bit run's 16-bit base
  rounded through NF4 with the run's settings, the model the run evaluated; `--base 16bit`: the original weights),
  written by llama.cpp's own converter (convert_hf_to_gguf.py, unpacked by `make
  llama-cpp`) and, for a quantised type, quantised by llama.cpp's own quantiser (llama-cpp-python's
  `llama_model_quantize`, the code of `llama-quantize`);
- `gguf-lora`: the adapter alone as a GGUF LoRA (gguf_export.write_lora_gguf, the file the engine pushes every step);
- `merged`: safetensors in the base's own dtype (or `--dtype`), loadable without PEFT; it says how far the
  rounded weights carry the LoRA update.

Order of work: every check first (the adapter, the quant type, the base model on disk or reachable, the Hub token,
the disk space), then the long parts (download, merge, conversion, quantisation, the self-measurement, upload), each
with one progress line. The measurement: the written file answers the run's held-out prompts greedily, against the
run's final evaluation (its last generation log): one line, and the model card.
Every file is written under a temporary name in its final directory and renamed when complete, so an interrupted or
out-of-space export never leaves a half-written file under a final name; the upload is one Hub commit.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from config.errors import UsageError

log = logging.getLogger("grpo")

FORMATS = ("gguf", "gguf-lora", "merged")
# What the LoRA is merged into. `trained`: the weights the run computed with (for a 4-bit run the 16-bit base rounded
# through NF4 with the run's settings: the model the run evaluated); `16bit`: the original 16-bit weights (what
# Unsloth's save_pretrained_merged does; the update then meets weights it was not trained against).
BASES = ("auto", "trained", "16bit")
# `auto`: `trained`, except for GGUF types of 4 bits or fewer: quantising NF4-rounded weights to 4 bits again loses
# more than quantising the 16-bit ones once (the quick test's adapter: q4_k_m 13/24 answers as the run from the
# rounded base, 18/24 from the 16-bit one; f16 24/24 against 21/24 the other way round; BENCHMARKS.md "Export").
LOW_BIT_PREFIXES = ("q4", "q3", "q2", "iq4", "iq3", "iq2", "iq1", "tq")


def choose_base(base: str, quant: str, format_: str) -> str:
    """What `--base auto` means for this export (see BASES); an explicit choice stands."""
    if base != "auto":
        return base
    return "16bit" if format_ != "merged" and quant.startswith(LOW_BIT_PREFIXES) else "trained"
# Written by llama.cpp's converter itself; every other type is converted to f16 first, then quantised.
CONVERTER_TYPES = ("f32", "f16", "bf16")
# llama-quantize refuses these without an importance matrix (tools/quantize/quantize.cpp), which needs calibration
# text and llama-imatrix: not offered here.
NEEDS_IMATRIX = ("iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "q2_k_s")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
MODEL_CARD = "README.md"
MODELFILE = "Modelfile"
# A base model up to this many bytes in 16 bits is merged in float32 (exact W + BA, rounded once on conversion);
# larger ones in their own dtype (an 8B model in float32 is 32 GB of RAM). PEFT computes the delta in float32 either
# way on CPU.
FLOAT32_MERGE_MAX_BYTES = 4 << 30
WEIGHT_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


# ---- the request and its checks -------------------------------------------------------------------------------------

@dataclass
class ExportRequest:
    source: Path
    format: str = "gguf"
    quant: str = "f16"
    output_dir: Path | None = None
    ollama: bool = False
    push_to_hub: str | None = None
    private: bool = False
    base_model: str | None = None
    command: str = ""  # the command line, for the model card
    dtype: str = "auto"  # merged: the safetensors' dtype (auto = the base's own)
    base: str = "auto"  # what the LoRA merges into: BASES
    measure: bool = True  # answer the run's held-out prompts and compare with its final evaluation


@dataclass
class BaseModel:
    name: str  # as the run named it (a preset, a hub id, a directory)
    hub_id: str | None  # where its 16-bit weights come from on the Hub (None: a local directory only)
    local_dir: Path | None  # on disk now (None: to be downloaded)
    download_bytes: int = 0


@dataclass
class ExportResult:
    output_dir: Path
    files: list[Path] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # what took how long: merge, convert, quantise, upload
    update_error: float | None = None  # merged: how far the rounded weights carry the LoRA update (relative error)
    dtype: str = ""  # merged: the dtype written
    url: str | None = None
    rounding: str | None = None  # the NF4 settings the base was rounded with before the merge (None: 16-bit)
    measurement: Measurement | None = None
    measure_note: str = ""  # why there is no measurement


def quant_types() -> dict[str, int]:
    """llama.cpp's file types by their llama-quantize names (q4_k_m, q8_0, f16 ...), read from llama-cpp-python's
    constants, so a newer llama.cpp's types are offered without a change here."""
    try:
        import llama_cpp
    except ImportError:
        raise UsageError("GGUF export needs llama-cpp-python (the llama_cpp engine): run `make llama-cpp`.") from None
    types = {}
    for name in dir(llama_cpp):
        match = re.fullmatch(r"LLAMA_FTYPE_(?:MOSTLY_|ALL_)(\w+)", name)
        if match:
            types[match.group(1).lower()] = getattr(llama_cpp, name)
    return types


def check_quant(quant: str) -> str:
    quant = quant.strip().lower()
    if quant in NEEDS_IMATRIX:
        raise UsageError(f"--quant {quant} needs an importance matrix (llama.cpp's llama-imatrix), which export does "
                         "not compute: use q2_k, q3_k_m, q4_k_m or above.")
    types = quant_types()
    if quant not in types:
        raise UsageError(f"--quant {quant}: llama.cpp has no such type; choose one of "
                         f"{', '.join(sorted(t for t in types if t not in NEEDS_IMATRIX))}.")
    return quant


def find_adapter(source: Path) -> Path:
    """The directory holding the LoRA adapter: a finished run's output directory, a checkpoint-N, or an adapter dir."""
    source = Path(source).expanduser()
    if not source.is_dir():
        raise UsageError(f"{source} is not a directory: give a run's --output-dir, a checkpoint-N directory or an "
                         "adapter directory.")
    if not all((source / name).is_file() for name in ADAPTER_FILES):
        checkpoints = sorted((p for p in source.glob("checkpoint-*") if (p / ADAPTER_FILES[1]).is_file()),
                             key=lambda p: int(p.name.rsplit("-", 1)[-1]) if p.name.rsplit("-", 1)[-1].isdigit()
                             else -1)
        hint = f" (the run stopped early? its newest checkpoint is {checkpoints[-1]})" if checkpoints else ""
        raise UsageError(f"{source} has no LoRA adapter ({' + '.join(ADAPTER_FILES)}): give a finished run's "
                         f"output directory or a checkpoint-N directory{hint}.")
    try:
        from safetensors import safe_open

        json.loads((source / ADAPTER_FILES[0]).read_text())
        # the header: a truncated file fails here (numpy: the check needs no torch, a 2 s import before an error line)
        with safe_open(str(source / ADAPTER_FILES[1]), "numpy") as handle:
            handle.keys()
    except Exception as err:  # noqa: BLE001 - any decode failure means the same thing to the user
        raise UsageError(f"{source}: the adapter files are unreadable or truncated ({err.__class__.__name__}).") \
            from None
    return source


def run_files(adapter_dir: Path) -> tuple[dict, dict]:
    """(the run's effective config, its summary) for the model card and the base model: from the adapter's own
    directory, or the run directory above a checkpoint. Either may be empty (a bare adapter directory)."""
    from grpokit.run_dir import METRICS_SUMMARY, run_config

    config, summary = {}, {}
    for directory in (adapter_dir, adapter_dir.parent):
        config = config or run_config(directory)
        if not summary and (directory / METRICS_SUMMARY).is_file():
            try:
                summary = json.loads((directory / METRICS_SUMMARY).read_text())
            except (json.JSONDecodeError, OSError):
                summary = {}
    return config, summary


def resolve_base(adapter_dir: Path, config: dict, override: str | None) -> BaseModel:
    """The 16-bit base the adapter merges into: on disk, in the Hugging Face cache, or to download (the hub is asked
    only when it is in neither place). A base that cannot be had is one UsageError, before any work."""
    from config.models import MODEL_PRESETS
    from grpokit.model_loader import embedded_model_dir

    adapter_config = json.loads((adapter_dir / ADAPTER_FILES[0]).read_text())
    recorded = adapter_config.get("base_model_name_or_path") or ""
    name = override or config.get("model_name") or recorded
    if not name:
        raise UsageError(f"{adapter_dir}: the adapter does not say its base model: pass --base-model.")
    preset = MODEL_PRESETS.get(name)
    if preset is None and not override and Path(recorded).name == "smollm2-135m-instruct":
        preset = next(p for p in MODEL_PRESETS.values() if p.embedded)  # trained on another machine's cache
    if preset is not None and preset.embedded:
        return BaseModel(name, preset.hub_id, embedded_model_dir())
    hub_id = preset.checkpoint(load_in_4bit=False) if preset is not None else name
    # what to do about a base that cannot be used: pass --base-model, or, when it was passed, give it another value
    given = f"--base-model {override}" if override else f"the base model {name}"
    fix = "give --base-model" if override else "pass --base-model"
    if preset is None and Path(name).expanduser().is_dir():
        local = Path(name).expanduser()
        if not (local / "config.json").is_file() or not any(local.glob("*.safetensors")):
            raise UsageError(f"{given} is not a transformers model directory (config.json + *.safetensors): {fix} "
                             "one.")
        if "quantization_config" in json.loads((local / "config.json").read_text()):
            raise UsageError(f"{given} is a pre-quantized 4-bit checkpoint: {fix} its 16-bit version (a directory "
                             "or hub id).")
        return BaseModel(name, None, local)
    if re.search(r"-(bnb|unsloth-bnb)-4bit$", hub_id, re.IGNORECASE):
        raise UsageError(f"{given if override else hub_id} is a pre-quantized 4-bit checkpoint: {fix} its 16-bit "
                         "version.")
    if "/" not in hub_id or hub_id.startswith(("/", ".", "~")):
        what = "no directory here" if hub_id.startswith(("/", ".", "~")) else "neither a directory nor a Hugging " \
            "Face id"
        raise UsageError(f"{given} is {what}: {fix} a model directory or an 'org/name' hub id.")
    cached = _hub_snapshot(hub_id, local_only=True)
    if cached is not None:
        return BaseModel(name, hub_id, cached)
    from grpokit.hub import hub_offline, hub_reachable

    if hub_offline() or not hub_reachable():
        raise UsageError(f"{given} is not in the local Hugging Face cache and the hub cannot be reached (offline): "
                         f"connect and rerun, or {fix} DIR with its 16-bit weights.")
    return BaseModel(name, hub_id, None, _download_size(hub_id))


def _hub_snapshot(hub_id: str, local_only: bool) -> Path | None:
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(hub_id, allow_patterns=WEIGHT_PATTERNS, local_files_only=local_only))
    except Exception:  # noqa: BLE001 - not cached (LocalEntryNotFoundError and kin): the caller decides
        if not local_only:
            raise
        return None
    return path if any(path.glob("*.safetensors")) else None


def _download_size(hub_id: str) -> int:
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(hub_id, files_metadata=True)
    except Exception as err:  # noqa: BLE001 - gated, missing, renamed: one line
        raise UsageError(f"the base model {hub_id} cannot be read from the Hugging Face hub "
                         f"({err.__class__.__name__}): check the name or your access to it.") from None
    return sum(s.size or 0 for s in info.siblings or [] if s.rfilename.endswith(".safetensors"))


def check_hub_upload(repo_id: str) -> str:
    """Before any work: the hub reachable, a token that can write. Returns the account name."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id):
        raise UsageError(f"--push-to-hub {repo_id}: give a repository id OWNER/NAME.")
    from grpokit.hub import hub_endpoint, hub_reachable, offline_variable

    variable = offline_variable()
    if variable or not hub_reachable():
        why = f"{variable} is set" if variable else f"{hub_endpoint()} cannot be reached (offline or behind a proxy)"
        raise UsageError(f"--push-to-hub {repo_id}: {why}; nothing was exported or uploaded. Export without "
                         "--push-to-hub, or rerun where the hub is reachable.")
    from huggingface_hub import HfApi, get_token

    if not get_token():
        raise UsageError(f"--push-to-hub {repo_id}: no Hugging Face token; run `hf auth login` or set HF_TOKEN (a "
                         "token with write access). Nothing was exported or uploaded.")
    try:
        who = HfApi().whoami()
    except Exception as err:  # noqa: BLE001 - an expired or revoked token
        raise UsageError(f"--push-to-hub {repo_id}: the Hugging Face token was refused ({err.__class__.__name__}); "
                         "log in again. Nothing was exported or uploaded.") from None
    role = ((who.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise UsageError(f"--push-to-hub {repo_id}: the Hugging Face token is read-only: use a token with write "
                         "access. Nothing was exported or uploaded.")
    return who.get("name", "")


def check_disk(directory: Path, needed: int, what: str) -> None:
    """Refuse up front when `needed` bytes (with 5 % to spare) cannot fit where they will be written."""
    probe = directory
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed * 1.05 > free:
        raise UsageError(f"not enough disk space for {what} in {probe}: needs ~{_size(needed)}, {_size(free)} free; "
                         "free some space or pass --output-dir on a larger disk.")


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit in ("B", "KB") else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def default_output_dir(adapter_dir: Path, fmt: str, quant: str) -> Path:
    return adapter_dir / "export" / (f"gguf-{quant}" if fmt == "gguf" else fmt)


def model_stem(base: BaseModel) -> str:
    """A file name for the exported model: the base's short name plus -grpo."""
    short = base.hub_id.rsplit("/", 1)[-1] if base.hub_id else Path(base.name).name
    return re.sub(r"[^\w.-]+", "-", short) + "-grpo"


# ---- one progress line ----------------------------------------------------------------------------------------------

class ProgressLine:
    """One line on stderr for a long step, rewritten in place on a terminal ("converting ... tensor 120/272, 4 s");
    a pipe or log file gets only the finished line. The elapsed time ticks even while a step reports nothing."""

    def __init__(self, what: str):
        self.what, self.detail = what, ""
        self.started = time.perf_counter()
        self.live = sys.stderr.isatty()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True) if self.live else None

    def __enter__(self):
        if self._thread is not None:
            self._thread.start()
        return self

    def update(self, detail: str) -> None:
        self.detail = detail

    def _render(self, text: str) -> None:
        width = shutil.get_terminal_size((80, 20)).columns - 1
        sys.stderr.write("\r\033[K" + text[:width])
        sys.stderr.flush()

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            detail = f" {self.detail}," if self.detail else ""
            self._render(f"{self.what}...{detail} {time.perf_counter() - self.started:.0f} s")

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def __exit__(self, kind, err, tb):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            sys.stderr.write("\r\033[K")
        if kind is None:
            log.info("%s: done in %.1f s", self.what, self.seconds)
        return False


def _stream(command: list[str], progress: ProgressLine, pattern: re.Pattern, describe, env=None) -> tuple[int, str]:
    """Run `command`, feeding each line of its output (\\r-separated tqdm updates included) through `pattern` into
    the progress line; returns (exit code, the last lines of output)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    tail: list[str] = []
    buffer = b""
    assert proc.stdout is not None
    try:
        while chunk := proc.stdout.read1(65536) if hasattr(proc.stdout, "read1") else proc.stdout.read(4096):
            buffer += chunk
            *lines, buffer = re.split(rb"[\r\n]", buffer)
            for raw in lines:
                line = raw.decode("utf-8", "replace").strip()
                if not line:
                    continue
                tail = (tail + [line])[-20:]
                match = pattern.search(line)
                if match:
                    progress.update(describe(match))
    except BaseException:  # Ctrl-C, or a failure of ours: the tool must not go on writing into a removed file
        proc.kill()
        proc.wait()
        raise
    return proc.wait(), "\n".join(tail)


def _last_error(tail: str) -> str:
    lines = [line for line in tail.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"error|exception|failed|invalid", line, re.IGNORECASE)]
    return ((errors or lines or ["?"])[-1])[:300]


# ---- the long parts -------------------------------------------------------------------------------------------------

MERGED_DTYPES = ("auto", "bfloat16", "float16", "float32")
# Past this relative error of the LoRA update in the rounded weights, `export --format merged` says so and names the
# dtype that keeps it: a short run's update is often far below a 16-bit weight's rounding step.
UPDATE_ERROR_WARN = 0.25


def update_error(model, dtypes) -> dict[str, float]:
    """How far weights rounded to each of `dtypes` carry the LoRA update: ||round(W + BA) - W - BA|| / ||BA|| over
    every LoRA layer of the PEFT `model` (0 = exactly; 1 = as if untrained), by dtype name; one layer's delta at a
    time, computed once for all dtypes."""
    import torch
    from peft.tuners.lora import LoraLayer

    error = dict.fromkeys(dtypes, 0.0)
    total = 0.0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, LoraLayer):
                continue
            weight = module.get_base_layer().weight.float()
            for name in module.active_adapters:
                if name not in module.lora_A:
                    continue
                delta = module.get_delta_weight(name).float()
                exact = weight + delta
                for dtype in error:
                    error[dtype] += (exact.to(dtype).float() - exact).pow(2).sum().item()
                total += delta.pow(2).sum().item()
    return {str(dtype).removeprefix("torch."): (e / total) ** 0.5 if total else 0.0 for dtype, e in error.items()}


def merge(adapter_dir: Path, base_dir: Path, target: Path, dtype_name: str | None = None,
          measure: bool = True, rounding: str | None = None) -> tuple[Path, dict[str, float]]:
    """The adapter merged into the base (PEFT's merge_and_unload, plain transformers: no Unsloth patches), saved as
    safetensors + tokenizer in `target` (renamed into place when complete). `dtype_name` None: the base's own dtype.
    `rounding`: the NF4 settings of a 4-bit run (trained_rounding): the base is rounded through NF4 as the run's was
    before the merge (None: the 16-bit weights). Returns the target and how far weights rounded to each 16-bit dtype
    (and the saved one) carry the update (`update_error`, by dtype name)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Writing model shards": the progress line says it
    with ProgressLine(f"merging the adapter into {base_dir.name}") as progress:
        save_dtype = getattr(torch, dtype_name) if dtype_name else _checkpoint_dtype(base_dir)
        compute = torch.float32 if _checkpoint_bytes(base_dir) <= FLOAT32_MERGE_MAX_BYTES else save_dtype
        progress.update("loading")
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=compute)
        tokenizer = AutoTokenizer.from_pretrained(base_dir)
        if rounding is not None:
            progress.update("rounding the base through NF4")
            round_base(base, rounding, base_dir)
        try:
            model = PeftModel.from_pretrained(base, adapter_dir)
        except (RuntimeError, ValueError, KeyError) as err:
            raise UsageError(f"{adapter_dir}: the adapter does not fit the base model {base_dir} "
                             f"({str(err).splitlines()[0][:200]}): pass the right --base-model.") from None
        error = update_error(model, {save_dtype, torch.bfloat16, torch.float16}) if measure else {}
        progress.update("merging")
        merged = model.merge_and_unload().to(save_dtype)
        progress.update("writing")
        with _staged_dir(target) as partial:
            merged.save_pretrained(partial, safe_serialization=True)
            tokenizer.save_pretrained(partial)
            byte_level_tokenizer(partial)
    return target, error


def byte_level_tokenizer(model_dir: Path) -> bool:
    """Make a byte-level BPE tokenizer.json say so plainly; returns whether it changed one.

    transformers rebuilds a GGUF's GPT-2-style tokenizer (the embedded SmolLM2's) with SentencePiece's byte fallback
    and decoder chain around the byte-level pre-tokenizer. Encoding is the same (llama.cpp's check hash is
    SmolLM's), but llama.cpp's converter takes such a file for a SentencePiece vocabulary, and the GGUF then prints
    every space as 'Ġ'. The byte-level decoder without the fallback decodes the same text in transformers and makes
    the converter write the 'gpt2' vocabulary with SmolLM's pre-tokenizer."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return False
    data = json.loads(path.read_text(encoding="utf-8"))
    model, decoder = data.get("model") or {}, data.get("decoder") or {}
    steps = [d.get("type") for d in decoder.get("decoders") or []]
    if not (model.get("type") == "BPE" and model.get("byte_fallback") and "ByteLevel" in steps
            and "ByteLevel" in json.dumps(data.get("pre_tokenizer"))):
        return False
    model["byte_fallback"] = False
    data["decoder"] = next(d for d in decoder["decoders"] if d.get("type") == "ByteLevel")
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")
    return True


def _checkpoint_dtype(model_dir: Path):
    import torch

    config = json.loads((Path(model_dir) / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    return getattr(torch, name) if name in ("float16", "bfloat16", "float32") else torch.bfloat16


def _tensor_headers(model_dir: Path) -> list[dict]:
    """Each tensor's entry (dtype, shape, offsets) in the checkpoint's safetensors headers, without reading weights."""
    entries = []
    for weights in Path(model_dir).glob("*.safetensors"):
        with open(weights, "rb") as handle:
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        entries += [entry for key, entry in header.items() if key != "__metadata__"]
    return entries


def _stored_in_bf16(model_dir: Path) -> bool:
    """Whether every tensor of the checkpoint is stored in bf16."""
    try:
        entries = _tensor_headers(model_dir)
    except (OSError, ValueError):
        return False
    return bool(entries) and all(isinstance(entry, dict) and entry.get("dtype") == "BF16" for entry in entries)


def _checkpoint_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))


def convert(model_dir: Path, target: Path, outtype: str) -> Path:
    """llama.cpp's converter on a transformers directory, into `target` via a temporary name."""
    from grpokit.gguf_export import check_model_dir, converter_dir

    try:
        check_model_dir(model_dir)
    except UsageError as err:
        raise UsageError(str(err).replace("llama_cpp engine: ", "GGUF export: ").split("; use --set")[0] + ".") \
            from None
    converter = converter_dir()
    total = _tensor_count(model_dir)
    pattern = re.compile(r"(?:hf-to-gguf:(blk\.\d+\.\w+|\w+)\.weight.*-->)|(?:Writing:\s*(\d+)%)")
    seen = set()

    def describe(match):
        if match.group(2):
            return f"writing {match.group(2)} %"
        seen.add(match.group(1))
        return f"tensor {len(seen)}/{total}" if total else f"tensor {len(seen)}"

    with _staged_file(target) as partial, ProgressLine(f"converting to GGUF ({outtype})") as progress:
        # a subprocess: the converter imports its own gguf-py, which must not replace the installed gguf
        code, tail = _stream([sys.executable, str(converter / "convert_hf_to_gguf.py"), str(model_dir), "--outtype",
                              outtype, "--outfile", str(partial)], progress, pattern, describe)
        if code:
            _raise_write_failure(tail, partial, "llama.cpp's converter")
    return target


def _tensor_count(model_dir: Path) -> int:
    return len(_tensor_headers(model_dir))


QUANTISER = """
import ctypes, sys
import llama_cpp
@llama_cpp.llama_log_callback
def log(level, text, data):
    sys.stderr.write(text.decode("utf-8", "replace")); sys.stderr.flush()
llama_cpp.llama_log_set(log, ctypes.c_void_p(0))
params = llama_cpp.llama_model_quantize_default_params()
params.ftype, params.nthread = int(sys.argv[3]), int(sys.argv[4])
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params)))
"""


def quantise(source: Path, target: Path, quant: str) -> Path:
    """llama.cpp's quantiser (llama_model_quantize: what `llama-quantize` runs) from an f16 GGUF to `quant`. A
    subprocess: llama.cpp aborts the process on some errors, and its per-tensor log is our progress."""
    ftype = quant_types()[quant]
    pattern = re.compile(r"\[\s*(\d+)/\s*(\d+)\]")
    with _staged_file(target) as partial, ProgressLine(f"quantising to {quant}") as progress:
        code, tail = _stream([sys.executable, "-c", QUANTISER, str(source), str(partial), str(ftype),
                              str(os.cpu_count() or 1)], progress, pattern,
                             lambda m: f"tensor {m.group(1)}/{m.group(2)}")
        if code:
            _raise_write_failure(tail, partial, "llama.cpp's quantiser")
    return target


def _raise_write_failure(tail: str, partial: Path, who: str):
    if re.search(r"No space left|ENOSPC|StorageFull|errno 28|Disk quota", tail, re.IGNORECASE):
        raise OSError(28, "No space left on device", str(partial))
    raise UsageError(f"{who} failed ({_last_error(tail)}).")


class _staged_file:
    """Write to a temporary name in the target's directory; rename onto the target only when the block succeeds."""

    def __init__(self, target: Path):
        self.target = Path(target)

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.target.parent, prefix=f".{self.target.name}.", suffix=".partial")
        os.close(fd)
        self.partial = Path(name)
        return self.partial

    def __exit__(self, kind, err, tb):
        if kind is None:
            os.chmod(self.partial, 0o666 & ~_umask())  # mkstemp's 0600 would hide the export from other users
            os.replace(self.partial, self.target)
        else:
            self.partial.unlink(missing_ok=True)
        return False


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class _staged_dir:
    """A directory built under a temporary name and swapped in whole (an older export of the same name goes after)."""

    def __init__(self, target: Path):
        self.target = Path(target)

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.partial = Path(tempfile.mkdtemp(dir=self.target.parent, prefix=f".{self.target.name}.",
                                             suffix=".partial"))
        return self.partial

    def __exit__(self, kind, err, tb):
        if kind is not None:
            shutil.rmtree(self.partial, ignore_errors=True)
            return False
        os.chmod(self.partial, 0o777 & ~_umask())
        for written in self.partial.rglob("*"):  # some writers create their files 0600
            if written.is_file():
                os.chmod(written, 0o666 & ~_umask())
        old = None
        if self.target.exists():
            old = self.target.with_name(f".{self.target.name}.old-{os.getpid()}")
            self.target.rename(old)
        self.partial.rename(self.target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return False


def write_text(target: Path, text: str) -> Path:
    with _staged_file(target) as partial:
        partial.write_text(text, encoding="utf-8")
    return target


# ---- Ollama ---------------------------------------------------------------------------------------------------------

# Go templates for Ollama, by the family of the model's own chat template (the token that marks a turn). Each
# renders the same text as the Jinja template for system / user / assistant turns plus the generation prompt.
OLLAMA_TEMPLATES = {
    "<|im_start|>": ("{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}"
                     "<|im_start|>assistant\n", ["<|im_end|>", "<|im_start|>"]),
    "<|start_header_id|>": ("{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n"
                            "{{ .Content }}<|eot_id|>{{ end }}<|start_header_id|>assistant<|end_header_id|>\n\n",
                            ["<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]),
    "<start_of_turn>": ("{{- range .Messages }}<start_of_turn>{{ if eq .Role \"assistant\" }}model{{ else }}user"
                        "{{ end }}\n{{ .Content }}<end_of_turn>\n{{ end }}<start_of_turn>model\n",
                        ["<end_of_turn>", "<start_of_turn>"]),
}


def modelfile(model_file: str, tokenizer, system_prompt: str, adapter_file: str | None = None) -> str:
    """An Ollama Modelfile: the GGUF, the chat template as a Go template, the system prompt the model was trained
    with (the run's, or the template's own default) and the stop tokens."""
    template = tokenizer.chat_template or ""
    family = next((mark for mark in OLLAMA_TEMPLATES if mark in template), None)
    lines = [f"FROM ./{model_file}"]
    if adapter_file:
        lines.append(f"ADAPTER ./{adapter_file}")
    if family is None:
        log.warning("Modelfile: the model's chat template is none Ollama's templates here cover; Ollama will guess "
                    "it from the GGUF's tokenizer.chat_template.")
    else:
        go_template, stops = OLLAMA_TEMPLATES[family]
        lines.append(f'TEMPLATE """{go_template}"""')
        system = system_prompt or _default_system_prompt(tokenizer)
        if system:
            lines.append(f'SYSTEM """{system}"""')
        eos = tokenizer.eos_token
        for stop in dict.fromkeys([*stops, *([eos] if eos else [])]):
            lines.append(f'PARAMETER stop "{stop}"')
    return "\n".join(lines) + "\n"


def _default_system_prompt(tokenizer) -> str:
    """The system message a chat template adds when the conversation has none (SmolLM2's "You are a helpful AI
    assistant named SmolLM..."): Ollama only sends one when the Modelfile says it."""
    try:
        plain = tokenizer.apply_chat_template([{"role": "user", "content": "\x00"}], tokenize=False)
        marked = tokenizer.apply_chat_template([{"role": "system", "content": "\x01"},
                                                {"role": "user", "content": "\x00"}], tokenize=False)
    except Exception:  # noqa: BLE001 - a template without system turns
        return ""
    # marked = before + "\x01" + after; without a system message the template's default sits where "\x01" was
    before, _, after = marked.partition("\x01")
    if plain.startswith(before) and plain.endswith(after) and len(plain) > len(before) + len(after):
        return plain[len(before):len(plain) - len(after)]
    return ""


# ---- the base the LoRA merges into ----------------------------------------------------------------------------------

NF4_SETTINGS = re.compile(r"nf4-b(\d+)-dq([01])(?:-(bf16|f16))?")


def trained_rounding(config: dict, summary: dict, base: str) -> str | None:
    """The NF4 settings `--base trained` rounds the 16-bit base with (None: merge into the 16-bit weights): the run's
    own record (metrics_summary.json `trained_base`, gguf_export.nf4_settings), else, for a 4-bit run that did not
    record it, the CPU path's settings on this machine (bf16 where the CPU has bf16 units, as the loader does)."""
    if base not in BASES:
        raise UsageError(f"--base {base}: choose one of {', '.join(BASES)}.")
    recorded = summary.get("trained_base")
    if base == "16bit" or recorded == "16-bit" or (recorded is None and not config.get("load_in_4bit")):
        return None
    if recorded is None:
        from grpokit.load_plan import cpu_bf16
        from grpokit.model_loader import NF4_BLOCKSIZE

        recorded = f"nf4-b{NF4_BLOCKSIZE}-dq1" + ("-bf16" if cpu_bf16() else "")
        log.info("the run did not record its 4-bit settings: merging into the base rounded as this machine's 4-bit "
                 "path rounds it (%s)", recorded)
    if not NF4_SETTINGS.fullmatch(recorded):
        raise UsageError(f"the run's 4-bit weights ({recorded}) are not NF4 with double quantisation: pass --base "
                         "16bit to merge into the 16-bit weights.")
    return recorded


def describe_base(rounding: str | None) -> str:
    """The base a merge used, in words (the model card, `export` output)."""
    if rounding is None:
        return "the 16-bit base weights"
    blocks, nested, dtype = NF4_SETTINGS.fullmatch(rounding).groups()
    return (f"the 16-bit base rounded through NF4 as the 4-bit run computed with it (blocks of {blocks}"
            f"{', double-quantised' if nested == '1' else ''}, {dtype or 'float32'} values; {rounding})")


def round_base(model, rounding: str | None, base_dir: Path | None = None) -> int:
    """Round `model`'s projections through NF4 with the run's settings (model_loader.round_through_nf4: the same
    layers, bitsandbytes' quantize_4bit -> dequantize_4bit, to the dtype the run computed in); returns how many.
    Where the run computed in bf16 from a bf16 checkpoint (the float32 copy here holds the same values) and the
    engine's GGUF of those values is cached for `base_dir`, they are read from it (gguf_export.cached_nf4_weights: the
    same bits, without the quantiser)."""
    if rounding is None:
        return 0
    import torch

    from grpokit.model_loader import NF4_BLOCKSIZE, round_through_nf4

    blocks, nested, dtype = NF4_SETTINGS.fullmatch(rounding).groups()
    if int(blocks) != NF4_BLOCKSIZE or nested != "1":
        raise UsageError(f"the run's 4-bit weights ({rounding}) use settings the export does not repeat: pass "
                         "--base 16bit.")
    cached = None
    if base_dir is not None and dtype == "bf16" and _stored_in_bf16(base_dir):
        from grpokit.gguf_export import cached_nf4_weights

        def cached(settings):
            return cached_nf4_weights(base_dir, model, settings, dtype="bf16")
    return round_through_nf4(model, shared=False, cached=cached,
                             compute={"bf16": torch.bfloat16, "f16": torch.float16}.get(dtype, torch.float32))


# ---- the export measures itself -------------------------------------------------------------------------------------

@dataclass
class Measurement:
    """The export's greedy answers to the run's held-out prompts against the run's own evaluation at that step."""
    same: int  # completions identical to the run's (stripped)
    prompts: int
    reward: float | None  # the export's mean reward (None: the rewards could not be rebuilt here)
    run_reward: float
    step: int
    final: bool  # the run's final evaluation (else the one at `step`)

    def line(self) -> str:
        which = "the run's final evaluation" if self.final else f"the run's evaluation at step {self.step}"
        reward = f"; reward {self.reward:.3f} (run: {self.run_reward:.3f})" if self.reward is not None else ""
        return f"{self.same}/{self.prompts} answers as {which}{reward}"


GREEDY_BATCH = 32  # prompts of one length per generate call in torch_greedy


def prompt_ids(tokenizer, prompt) -> list[int]:
    """A prompt's token ids as the run's evaluation builds them (its chat template, the generation prompt)."""
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def free_core_threads() -> int:
    """One thread per core no other process keeps busy: threads that wait for each other (llama.cpp's spin, torch's
    OpenMP barriers) on cores taken by others make each token many times as slow (24 short answers: 5 s on a quiet
    2-core machine, minutes with every core's thread shared)."""
    from grpokit.cpu_threads import LoadMeter, threads_for, usable_cores

    meter, (cores, _) = LoadMeter(), usable_cores()
    time.sleep(LoadMeter.MIN_WINDOW)
    return threads_for(cores, meter.others(), cores)


def gguf_greedy(path: Path, prompts: list[list[int]], max_new_tokens: int, lora: Path | None = None,
                progress: ProgressLine | None = None) -> list[str]:
    """Greedy completions from llama-cpp-python's own `Llama` (what llama.cpp / Ollama users run), fed the prompt
    tokens; the text is llama.cpp's own detokenisation, on the free cores (free_core_threads)."""
    from llama_cpp import Llama

    threads = free_core_threads()
    llm = Llama(model_path=str(path), lora_path=str(lora) if lora else None,
                n_ctx=max(len(p) for p in prompts) + max_new_tokens + 8, n_threads=threads, verbose=False)
    answers = []
    try:
        for ids in prompts:
            if progress is not None:
                progress.update(f"{len(answers)}/{len(prompts)} on {threads} threads")
            answers.append(llm.create_completion(ids, max_tokens=max_new_tokens, temperature=0.0, top_k=1,
                                                 repeat_penalty=1.0)["choices"][0]["text"].strip())
        return answers
    finally:
        llm.close()


def torch_greedy(model, tokenizer, prompts: list[list[int]], max_new_tokens: int,
                 progress: ProgressLine | None = None) -> list[str]:
    """Greedy completions from a transformers model (plain generate, no padding: prompts of the same length go in
    one batch, in their order; a finished row's later tokens are padding, left out of its text), on the free cores
    (free_core_threads). The held-out sums are all one length: 24 answers in one batch, 29 -> 14 s on one AVX2
    core, the same answers as one prompt at a time."""
    import torch

    answers: list[str | None] = [None] * len(prompts)
    by_length: dict[int, list[int]] = {}
    for index, ids in enumerate(prompts):
        by_length.setdefault(len(ids), []).append(index)
    before, threads = torch.get_num_threads(), free_core_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            for length, rows in by_length.items():
                for start in range(0, len(rows), GREEDY_BATCH):
                    if progress is not None:
                        done = sum(answer is not None for answer in answers)
                        progress.update(f"{done}/{len(prompts)} on {threads} threads")
                    batch = rows[start:start + GREEDY_BATCH]
                    tensor = torch.tensor([prompts[i] for i in batch])
                    out = model.generate(input_ids=tensor, attention_mask=torch.ones_like(tensor), do_sample=False,
                                         max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
                    for row, index in enumerate(batch):
                        answers[index] = tokenizer.decode(out[row, length:], skip_special_tokens=True).strip()
    finally:
        torch.set_num_threads(before)
    return answers


def same_completions(a: list[str], b: list[str]) -> int:
    return sum(x.strip() == y.strip() for x, y in zip(a, b, strict=True))


def run_evaluation(adapter_dir: Path, config: dict, summary: dict) -> tuple[int, list[dict], bool] | str:
    """(step, the generation log's entries, whether it is the run's final evaluation) that the adapter in
    `adapter_dir` should reproduce, or why there is none."""
    from grpokit.run_dir import TRAINER_STATE, generation_log_dir, generation_logs, read_json

    is_checkpoint = (adapter_dir / TRAINER_STATE).is_file() and not (adapter_dir / "metrics_summary.json").is_file()
    run_dir = adapter_dir.parent if is_checkpoint else adapter_dir
    logs = dict(generation_logs(generation_log_dir(run_dir)))
    if not logs:
        return "the run left no generation log"
    final = (summary.get("generation_eval") or {}).get("final_step", max(logs))
    step = read_json(adapter_dir / TRAINER_STATE).get("global_step") if is_checkpoint else final
    if step not in logs:
        return f"the run has no generation log at step {step}"
    return step, logs[step], step == final


def score_completions(config: dict, entries: list[dict], completions: list[str], tokenizer) -> float | None:
    """The mean reward of `completions` on the logged prompts: a completion the run also gave keeps the run's own
    score; the others are scored by the run's reward set, rebuilt from run_config.json with the reference columns
    the log keeps. None when that cannot be done (the rewards' own names differ from the log's, or a reward needs a
    column the log does not keep, such as a code task's tests)."""
    totals = [e["reward_total"] for e in entries]
    changed = [i for i, (e, c) in enumerate(zip(entries, completions, strict=True))
               if e["generated"].strip() != c.strip()]
    if not changed:
        return sum(totals) / len(totals)
    try:
        from rewards import WeightedSum, load_reward_config, parse_reward_config, weighted_total

        data, source = load_reward_config(config.get("reward_config_name") or "", config.get("reward_config") or "")
        reward_set = parse_reward_config(data, source, config.get("custom_rewards") or [],
                                         config.get("max_completion_length") or 0)
        if {c.name for c in reward_set.components} != set(entries[0].get("rewards") or {}):
            return None
        rows = [entries[i] for i in changed]
        columns = {key.removeprefix("reference_"): [row.get(key) for row in rows] for key in rows[0]
                   if key.startswith("reference_")}
        texts = [completions[i] for i in changed]
        per = WeightedSum(reward_set).components(
            prompts=[row["prompt"] for row in rows], completions=[[{"role": "assistant", "content": t}] for t in texts],
            completion_ids=[tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts], **columns)
        for i, total in zip(changed, weighted_total(per, reward_set.weights), strict=True):
            totals[i] = total
    except Exception as err:  # noqa: BLE001 - a reward that needs what the log does not keep: answers only
        log.debug("the export's answers cannot be scored here: %s", err)
        return None
    return sum(totals) / len(totals)


def measure(evaluation: tuple[int, list[dict], bool], config: dict, tokenizer, answer) -> Measurement:
    """`answer(prompt ids, max new tokens) -> completions` on the logged prompts, against the logged completions."""
    step, entries, final = evaluation
    max_new_tokens = config.get("generation_max_new_tokens") or config.get("max_completion_length") or 256
    with ProgressLine(f"answering the run's {len(entries)} held-out prompts (--no-measure skips it)") as progress:
        completions = answer([prompt_ids(tokenizer, e["prompt"]) for e in entries], max_new_tokens, progress)
    run_reward = sum(e["reward_total"] for e in entries) / len(entries)
    return Measurement(same_completions(completions, [e["generated"] for e in entries]), len(entries),
                       score_completions(config, entries, completions, tokenizer), run_reward, step, final)


# ---- the model card -------------------------------------------------------------------------------------------------

def model_card(request: ExportRequest, base: BaseModel, config: dict, summary: dict, files: list[str],
               result: ExportResult | None = None) -> str:
    """A Hugging Face model card from the run's own files: base model, data, rewards, steps, the held-out figures
    before and after, how to run it and the commands that made it."""
    fmt = request.format
    tags = ["grpo", "trl", "lora" if fmt == "gguf-lora" else "merged"] + (["gguf"] if fmt.startswith("gguf") else [])
    front = ["---"]
    if base.hub_id:
        front.append(f"base_model: {base.hub_id}")
    front += [f"library_name: {'transformers' if fmt == 'merged' else 'gguf'}", "tags:",
              *[f"- {t}" for t in tags], "---", ""]
    name = request.push_to_hub or model_stem(base)
    what = {"gguf": f"GGUF ({request.quant}), the LoRA merged into the base", "gguf-lora": "a GGUF LoRA adapter",
            "merged": f"{(result.dtype if result and result.dtype else '16-bit')} safetensors, the LoRA merged "
                      "into the base"}[fmt]
    body = [f"# {name}", "", f"{base.hub_id or base.name} fine-tuned with GRPO (TRL's GRPOTrainer, LoRA), "
                             f"exported as {what}.", "", "## Training", ""]
    lora = json.loads((Path(request.source).expanduser() / ADAPTER_FILES[0]).read_text())
    rewards = config.get("reward_config_name") or config.get("reward_function_type") or "?"
    custom = config.get("custom_rewards") or []
    data = config.get("dataset_path") or config.get("custom_data") or config.get("dataset") or "?"
    rows = [("base model", base.hub_id or base.name), ("data", f"{data}" + (
        f" (up to {config['max_samples']} rows)" if config.get("max_samples") else "")),
        ("rewards", ", ".join([str(rewards), *map(str, custom)])),
        ("steps", str(summary.get("global_step", config.get("max_steps", "?")))),
        ("LoRA", f"r {lora.get('r', '?')}, alpha {lora.get('lora_alpha', '?')}, on "
                 f"{', '.join(sorted(lora.get('target_modules') or [])) or '?'}"),
        ("base in training", {True: "4-bit (NF4)", False: "16-bit"}.get(config.get("load_in_4bit"), "?")),
        ("learning rate", str(config.get("learning_rate", "?"))),
        ("completions per prompt", str(config.get("num_generations", "?")))]
    body += ["| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows if "?" not in v], ""]
    greedy = summary.get("generation_eval") or {}
    if greedy.get("baseline") is not None:
        what_prompts = "held-out" if greedy.get("held_out") else "training (no held-out split)"
        body += ["## Results", "",
                 f"Greedy reward on {greedy.get('prompts')} {what_prompts} prompts, before and after training:", "",
                 "| before (step {}) | after (step {}) |".format(greedy.get("baseline_step"), greedy.get("final_step")),
                 "|---|---|", f"| {greedy['baseline']:.3f} | {greedy['final']:.3f} |", ""]
        if "improved" in greedy:
            body += [f"Per prompt: better on {greedy['improved']}, worse on {greedy['worse']}, same on "
                     f"{greedy['same']}.", ""]
    sampled = (summary.get("eval") or {}).get("eval_reward")
    if sampled is not None:
        body += [f"Sampled reward on the held-out split after training: {sampled:.3f}.", ""]
    if result is not None:
        base_words = describe_base(result.rounding)
        held_out = "held-out" if greedy.get("held_out", True) else "training"
        measured = (f"{result.measurement.line()} ({held_out} prompts, greedy, this file)" if result.measurement
                    else f"not measured ({result.measure_note})")
        body += ["## This file", "", "| | |", "|---|---|", f"| format | {what} |",
                 *([f"| quantisation | {request.quant} |"] if fmt != "merged" else []),
                 (f"| base | {base_words} (the GGUF beside it, for --ollama) |" if fmt == "gguf-lora" else
                  f"| merged into | {base_words} |"),
                 f"| measured | {measured} |", ""]
    if result is not None and result.update_error is not None:
        body += [f"The {result.dtype} weights carry the trained LoRA update with a relative error of "
                 f"{result.update_error:.1%} (||round(W + BA) - W - BA|| / ||BA||, over the LoRA layers).", ""]
    body += ["## Use", ""]
    if fmt == "gguf":
        gguf = next((f for f in files if f.endswith(".gguf")), "model.gguf")
        body += ["```sh", f"llama-cli -m {gguf} -cnv",
                 *(["ollama create my-model -f Modelfile && ollama run my-model"] if request.ollama else []),
                 "```", ""]
    elif fmt == "gguf-lora":
        lora = next((f for f in files if f.endswith(".lora.gguf")), "adapter.gguf")
        body += ["```sh", f"llama-cli -m BASE.gguf --lora {lora} -cnv", "```", ""]
    else:
        repo = request.push_to_hub or "THIS_DIRECTORY"
        body += ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
                 f"model = AutoModelForCausalLM.from_pretrained(\"{repo}\")",
                 f"tokenizer = AutoTokenizer.from_pretrained(\"{repo}\")", "```", ""]
    body += ["## Reproduce", "", "```sh", "python train_grpo.py --config run_config.json   # the run's effective "
             "config, in its output directory", request.command or "python train_grpo.py export OUTPUT_DIR", "```",
             ""]
    return "\n".join(front + body)


# ---- the export -----------------------------------------------------------------------------------------------------

def export_adapter(request: ExportRequest) -> ExportResult:
    """Checks first, then the work; returns what was written (and uploaded)."""
    if request.format not in FORMATS:
        raise UsageError(f"--format {request.format}: choose one of {', '.join(FORMATS)}.")
    adapter_dir = find_adapter(request.source)
    quant = request.quant.strip().lower()
    if request.format == "merged" and quant != "f16":
        raise UsageError("--quant applies to GGUF: --format merged takes --dtype (auto = the base's own, bfloat16, "
                         "float16, float32).")
    if request.dtype not in MERGED_DTYPES:
        raise UsageError(f"--dtype {request.dtype}: choose one of {', '.join(MERGED_DTYPES)}.")
    if request.dtype != "auto" and request.format != "merged":
        raise UsageError("--dtype applies to --format merged; a GGUF's type is --quant.")
    if request.format != "merged":
        quant = check_quant(quant)
    if request.ollama and request.format == "merged":
        raise UsageError("--ollama needs a GGUF: use --format gguf (or gguf-lora).")
    request.quant = quant
    request.base = choose_base(request.base, quant, request.format)
    config, summary = run_files(adapter_dir)
    rounding = trained_rounding(config, summary, request.base)
    base = resolve_base(adapter_dir, config, request.base_model)
    if request.push_to_hub:
        check_hub_upload(request.push_to_hub)
    out = Path(request.output_dir).expanduser() if request.output_dir else default_output_dir(
        adapter_dir, request.format, quant)
    from grpokit.run_dir import check_output_dir

    # a file where the directory would go, or a directory we cannot write: one line naming it, before any work (the
    # write itself said only "File exists")
    check_output_dir(str(out), "--output-dir", "Export directory")
    _check_space(request, base, out)

    result = ExportResult(out, rounding=rounding)
    if base.local_dir is None:
        base.local_dir = _download(base)
    stem = model_stem(base)
    try:
        if request.format == "merged":
            _, errors = merge(adapter_dir, base.local_dir, out, None if request.dtype == "auto" else request.dtype,
                              rounding=rounding)
            result.dtype = str(_checkpoint_dtype(out)).removeprefix("torch.")
            result.update_error = errors.get(result.dtype, 0.0)
            result.files.append(out)
            if result.update_error > UPDATE_ERROR_WARN:
                others = ", ".join(f"{name}: {error:.0%}" for name, error in sorted(errors.items())
                                   if name != result.dtype)
                log.warning("merged: rounding to %s changes the trained LoRA update by %.0f%% (relative error; %s): "
                            "the update is small beside a 16-bit weight's step. --dtype float32 keeps it exactly, "
                            "as the adapter does", result.dtype, 100 * result.update_error, others)
        elif request.format == "gguf":
            result.files.append(_merged_gguf(adapter_dir, base.local_dir, out / f"{stem}.{quant.upper()}.gguf",
                                             quant, rounding))
        else:
            result.files.append(_lora_gguf(adapter_dir, base.local_dir, out / f"{stem}.lora.gguf"))
            if request.ollama:  # Ollama's ADAPTER needs its base beside it
                result.files.append(_base_gguf(base.local_dir, out / f"{model_stem(base)[:-5]}.{quant.upper()}.gguf",
                                               quant, rounding))
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(base.local_dir)
        _measure(request, adapter_dir, config, summary, tokenizer, result)
        if request.ollama:
            gguf_files = [f.name for f in result.files if f.suffix == ".gguf"]
            lora = next((f for f in gguf_files if f.endswith(".lora.gguf")), None)
            model = next(f for f in gguf_files if f != lora)
            result.files.append(write_text(out / MODELFILE, modelfile(model, tokenizer, config.get("system_prompt")
                                                                       or "", lora)))
        names = [f.name for f in result.files]
        result.files.append(write_text(out / MODEL_CARD, model_card(request, base, config, summary, names,
                                                                    result)))
        run_config_file = adapter_dir / "run_config.json"
        if run_config_file.is_file():
            result.files.append(write_text(out / "run_config.json", run_config_file.read_text()))
    except UsageError:
        raise
    except Exception as err:  # safetensors says StorageFull, torch and the converter say it their own ways
        from grpokit.checkpoints import is_disk_full

        if is_disk_full(err):
            raise UsageError(f"the disk filled up while exporting into {out}: nothing was left under a final name; "
                             "free some space (or pass --output-dir on a larger disk) and rerun.") from None
        if isinstance(err, OSError):
            raise UsageError(f"exporting into {out}: {err.filename or out}: {err.strerror or err}") from None
        raise
    if request.push_to_hub:
        result.url = upload(out, request.push_to_hub, request.private, result)
    return result


def _measure(request: ExportRequest, adapter_dir: Path, config: dict, summary: dict, tokenizer,
             result: ExportResult) -> None:
    """The written files answer the run's held-out prompts; result.measurement, or result.measure_note saying why
    not."""
    evaluation = run_evaluation(adapter_dir, config, summary) if request.measure else "--no-measure"
    ggufs = [f for f in result.files if f.suffix == ".gguf"]
    lora = next((f for f in ggufs if f.name.endswith(".lora.gguf")), None)
    model = next((f for f in ggufs if f != lora), None)
    if isinstance(evaluation, str):
        result.measure_note = evaluation
    elif request.format == "merged":
        import torch
        from transformers import AutoModelForCausalLM

        merged = AutoModelForCausalLM.from_pretrained(result.output_dir, dtype=torch.float32).eval()
        result.measurement = measure(evaluation, config, tokenizer,
                                     lambda prompts, n, progress: torch_greedy(merged, tokenizer, prompts, n,
                                                                                progress))
    elif model is None:
        result.measure_note = "a GGUF LoRA runs on a base GGUF: --ollama writes one beside it"
    else:
        result.measurement = measure(evaluation, config, tokenizer,
                                     lambda prompts, n, progress: gguf_greedy(model, prompts, n, lora=lora,
                                                                               progress=progress))


def _check_space(request: ExportRequest, base: BaseModel, out: Path) -> None:
    size16 = base.download_bytes if base.local_dir is None else _checkpoint_bytes(base.local_dir)
    if base.local_dir is not None and _checkpoint_dtype(base.local_dir).itemsize == 4:
        size16 //= 2
    if request.format == "merged":
        needed = size16
    elif request.format == "gguf-lora":
        adapter = (Path(request.source) / ADAPTER_FILES[1]).stat().st_size if (
            Path(request.source) / ADAPTER_FILES[1]).exists() else 0
        needed = 2 * adapter + (2 * size16 if request.ollama else 0)
    else:  # the merged scratch (float32 for small models), then its f16 GGUF, then the quantised file
        scratch = 2 * size16 if size16 <= FLOAT32_MERGE_MAX_BYTES else size16
        needed = scratch + size16 + (0 if request.quant in CONVERTER_TYPES else size16)
    check_disk(out, needed, f"the {request.format} export")
    if base.local_dir is None:
        from huggingface_hub.constants import HF_HUB_CACHE

        check_disk(Path(HF_HUB_CACHE), base.download_bytes, f"downloading {base.hub_id}")


def _download(base: BaseModel) -> Path:
    log.info("Downloading the 16-bit base %s (%s) into the Hugging Face cache for the merge", base.hub_id,
             _size(base.download_bytes))
    with ProgressLine(f"downloading {base.hub_id} ({_size(base.download_bytes)})"):
        path = _hub_snapshot(base.hub_id, local_only=False)
    if path is None:
        raise UsageError(f"{base.hub_id} has no safetensors weights to merge into.")
    return path


def _merged_gguf(adapter_dir: Path, base_dir: Path, target: Path, quant: str, rounding: str | None) -> Path:
    """Merge into a scratch directory beside the target, convert, quantise; the scratch goes either way."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=".merge-"))
    try:
        dtype = "float32" if _checkpoint_bytes(base_dir) <= FLOAT32_MERGE_MAX_BYTES else None
        merged, _ = merge(adapter_dir, base_dir, scratch / "merged", dtype, measure=False, rounding=rounding)
        return _to_gguf(merged, target, quant, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _base_gguf(base_dir: Path, target: Path, quant: str, rounding: str | None) -> Path:
    """The base alone (for Ollama's FROM beside an ADAPTER): its files linked into a scratch directory, so its
    tokenizer can be made plain for llama.cpp without touching the original; for a 4-bit run's `rounding`, the base
    rounded through NF4 as the run's was (in float32, written to the scratch)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=".base-"))
    try:
        if rounding is not None:
            return _to_gguf(_rounded_base(base_dir, scratch / "model", rounding), target, quant, scratch)
        linked = scratch / "model"
        linked.mkdir()
        for item in base_dir.iterdir():
            if item.name == "tokenizer.json":
                shutil.copy(item, linked / item.name)
            else:
                (linked / item.name).symlink_to(item.resolve())
        byte_level_tokenizer(linked)
        return _to_gguf(linked, target, quant, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _rounded_base(base_dir: Path, target: Path, rounding: str) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with ProgressLine(f"rounding {base_dir.name} through NF4"):
        model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        round_base(model, rounding, base_dir)
        model.save_pretrained(target, safe_serialization=True)
        AutoTokenizer.from_pretrained(base_dir).save_pretrained(target)
        byte_level_tokenizer(target)
    return target


def _to_gguf(model_dir: Path, target: Path, quant: str, scratch: Path) -> Path:
    if quant in CONVERTER_TYPES:
        return convert(model_dir, target, quant)
    f16 = convert(model_dir, scratch / "model.f16.gguf", "f16")
    if model_dir.is_relative_to(scratch):  # the merged scratch is in the f16 GGUF now: room for the quantised one
        shutil.rmtree(model_dir, ignore_errors=True)
    return quantise(f16, target, quant)


def _lora_gguf(adapter_dir: Path, base_dir: Path, target: Path) -> Path:
    """The adapter as a GGUF LoRA (f32 tensors, q/k rows in llama.cpp's order): the engine's own writer, given a PEFT
    model of the base with this adapter."""
    import torch
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpokit.gguf_export import SUPPORTED_ARCHITECTURES, model_architecture, write_lora_gguf

    architecture = model_architecture(base_dir)
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise UsageError(f"--format gguf-lora: architecture {architecture} is not supported (only "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}); use --format merged.")
    with ProgressLine("writing the GGUF LoRA"):
        model_config = AutoConfig.from_pretrained(base_dir)
        with torch.device("meta"):  # the adapter's tensors are all the writer reads: no base weights in memory
            base = AutoModelForCausalLM.from_config(model_config)
            # the LoRA layers only (PeftModel.from_pretrained would copy the adapter into meta tensors: a no-op
            # warned about once per tensor); the values are loaded below, once the layers have memory
            model = get_peft_model(base, LoraConfig.from_pretrained(str(adapter_dir)))
        for module in model.modules():  # only the LoRA matrices get memory, then the adapter's values
            for name in ("lora_A", "lora_B"):
                if isinstance(getattr(module, name, None), torch.nn.ModuleDict):
                    getattr(module, name).to_empty(device="cpu")
        loaded = set_peft_model_state_dict(model, load_file(str(adapter_dir / ADAPTER_FILES[1])))
        if getattr(loaded, "unexpected_keys", None):
            raise UsageError(f"{adapter_dir}: the adapter does not fit the base model {base_dir} "
                             f"({len(loaded.unexpected_keys)} unexpected tensors): pass the right --base-model.")
        heads = model_config.num_attention_heads
        with _staged_file(target) as partial:
            write_lora_gguf(model, partial, architecture, heads, getattr(model_config, "num_key_value_heads", heads))
    return target


def upload(out: Path, repo_id: str, private: bool, result: ExportResult) -> str:
    """The export directory as one commit (all files or none: an interrupted upload leaves the repository as it was;
    the repository itself is created first, empty)."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    api = HfApi()
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and not p.name.startswith("."))
    disable_progress_bars()  # our one line instead of a bar per file
    try:
        with ProgressLine(f"uploading {_size(size)} to {repo_id}") as progress:
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            commit = api.upload_folder(folder_path=str(out), repo_id=repo_id, repo_type="model",
                                       commit_message="GRPO export (train_grpo.py export)",
                                       ignore_patterns=[".*", "**/.*"])
            result.seconds["upload"] = progress.seconds
    except UsageError:
        raise
    except Exception as err:  # noqa: BLE001 - network, permissions: one line; the commit did not happen
        raise UsageError(f"uploading to {repo_id} failed ({err.__class__.__name__}: "
                         f"{str(err).splitlines()[0][:200] if str(err) else ''}); nothing was committed. The export "
                         f"is in {out}; rerun to upload.") from None
    finally:
        enable_progress_bars()
    from grpokit.hub import hub_endpoint

    return getattr(commit, "commit_url", None) or f"{hub_endpoint().rstrip('/')}/{repo_id}"


def command_line(argv: list[str]) -> str:
    return shlex.join(["python", "train_grpo.py", *argv])

"""Generation engines: what samples the GRPO completions.

One small interface (`GenerationEngine`), one module per engine, picked by the config field `generation_engine`
(the layout of verl's rollout workers):

- `transformers`: TRL's own `generate` path (with our per-group prompt sharing, shared_prompts.py). The trainer keeps
  that path whenever this engine is chosen; the class exists so benchmarks and tests can call it the same way.
- `llama_cpp`: llama.cpp on CPU (engine_llama_cpp.py). The base model is exported once to a 16-bit GGUF; the
  current LoRA adapter is pushed in as a GGUF LoRA before each step's generation. ~8x transformers' tok/s here.
- `vllm`: GPU only; selecting it means TRL's `use_vllm=True` (Unsloth: `fast_inference=True`), see
  load_plan.vllm_settings; TRL's importance-sampling correction stays on (objective.pinned hands TRL's default, True,
  explicitly: Unsloth's generated GRPOConfig defaults it to False).

The trainer side (how an engine's completions and log-probs reach TRL) is trl_engine_adapter.py.
Heavy imports (torch, llama_cpp) stay inside functions so importing this module is free.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

ENGINE_NAMES = ("auto", "transformers", "llama_cpp", "vllm")


@dataclass
class SamplingParams:
    """TRL's sampling settings, as the engines take them. temperature 0 (or greedy=True) = greedy decoding.

    `seed` fixes the sample: the same seed, prompts and weights give the same completions.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    eos_token_ids: tuple[int, ...] = ()
    seed: int = 0
    greedy: bool = False

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature <= 0


@runtime_checkable
class GenerationEngine(Protocol):
    """What the trainer needs from a sampler."""

    name: str

    def generate(self, prompt_token_ids: list[list[int]], n: int, sampling: SamplingParams
                 ) -> tuple[list[list[int]], list[list[float]] | None]:
        """`n` completions for each prompt, prompt-major (prompt 0's n completions first). Returns the completion
        token ids (ending in the EOS token when one was sampled) and each sampled token's log-prob under
        log_softmax(logits / temperature) (the quantity TRL's trainer computes), or None where the engine has none."""
        ...

    def push_adapter(self, model: Any) -> None:
        """Make the engine sample from `model`'s current LoRA weights."""
        ...

    def close(self) -> None:
        ...


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


# llama.cpp's CPU features (llama_print_system_info) -> the /proc/cpuinfo flags the code built for them needs (ggml-cpu's
# CMakeLists: GGML_AVX512 compiles with -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw). Features not listed
# (LLAMAFILE, REPACK, OPENMP, Arm ones) are not x86 instructions.
LLAMA_FEATURE_FLAGS = {
    "SSE3": ("pni",), "SSSE3": ("ssse3",), "AVX": ("avx",), "AVX_VNNI": ("avx_vnni",), "AVX2": ("avx2",),
    "F16C": ("f16c",), "FMA": ("fma",), "BMI2": ("bmi2",),
    "AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "AVX512_VBMI": ("avx512vbmi",), "AVX512_VNNI": ("avx512_vnni",), "AVX512_BF16": ("avx512_bf16",),
    "AMX_INT8": ("amx_tile", "amx_int8"),
}


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str] | None:
    """The CPU's instruction flags from /proc/cpuinfo ('flags' line; x86 Linux), None where there is none to read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    match = re.search(r"^flags\s*:(.*)$", cpuinfo, re.MULTILINE)
    return frozenset(match.group(1).split()) if match else None


def llama_missing_features(system_info: str, flags: frozenset[str]) -> list[str]:
    """The features a llama.cpp build reports (llama_print_system_info: "CPU : AVX2 = 1 | AVX512 = 1 | ...") that need
    instructions missing from `flags` (cpu_flags): code built for them dies with SIGILL on this CPU."""
    built = re.findall(r"(\w+) = 1\b", system_info)
    return [f for f in built if f in LLAMA_FEATURE_FLAGS and not set(LLAMA_FEATURE_FLAGS[f]) <= flags]


# Run in a child: the library runs code built for its features as it reports them (ggml_cpu_init), which would kill
# this process with SIGILL on a CPU without them. Only ctypes, no site (-S): ~30 ms.
_PROBE = ("import ctypes, sys; f = ctypes.CDLL(sys.argv[1]).llama_print_system_info; f.restype = ctypes.c_char_p; "
          "sys.stdout.write(f().decode())")


def llama_cpp_library() -> Path | None:
    """The llama.cpp library llama-cpp-python loads (its package's lib/), None where there is none."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(list(spec.submodule_search_locations)[0], "lib", "libllama.so")
    return lib if lib.is_file() else None


@functools.lru_cache(maxsize=1)
def llama_cpp_problem_here() -> str | None:
    """llama_cpp_build_problem for the installed library on this machine's CPU (probed once per process)."""
    flags, lib = cpu_flags(), llama_cpp_library()
    return None if flags is None or lib is None else llama_cpp_build_problem(lib, flags)


def llama_cpp_build_problem(lib: Path, flags: frozenset[str]) -> str | None:
    """Why the llama.cpp library `lib` cannot run on a CPU with `flags` (one line), or None: it can."""
    try:
        probe = subprocess.run([sys.executable, "-S", "-c", _PROBE, str(lib)], capture_output=True, text=True,
                               timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"its library could not be probed ({err})"
    if probe.returncode < 0:
        return (f"its library crashed on load ({signal.Signals(-probe.returncode).name}): built for instructions "
                f"this CPU lacks")
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines()
        return f"its library does not load ({lines[-1] if lines else f'exit {probe.returncode}'})"
    missing = llama_missing_features(probe.stdout, flags)
    if missing:
        return f"it was built for {', '.join(missing)}, which this CPU lacks"
    return None


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def choose_engine(requested: str, cuda: bool, backend: str, architecture: str | None = None,
                  load_in_4bit: bool = False, vllm_installed: bool | None = None) -> tuple[str, str]:
    """(engine name, why) for the config value `requested` ('auto' or a name). The reason goes into the run's log.

    Explicit choices that cannot work here raise UsageError; 'auto' never raises. On a CPU 'auto' picks llama_cpp
    whenever it is built and supports the architecture, 4-bit included: for a 4-bit base the engine samples from the
    dequantised NF4 weights the trainer computes with (sampler/trainer mismatch 0.01 nats per token through the CLI),
    exported once per model and cached. On a GPU 'auto' picks vllm only where it can take the weights: with Unsloth
    (its fast_inference shares the 4-bit weights) or 16-bit ones; TRL's own vLLM cannot sync 4-bit weights
    (load_plan.vllm_refusal). `vllm_installed`: whether vllm imports (None: look).
    """
    from config.errors import UsageError
    from grpokit.gguf_export import SUPPORTED_ARCHITECTURES

    if requested not in ENGINE_NAMES:
        raise UsageError(f"generation_engine '{requested}' is unknown: use one of {', '.join(ENGINE_NAMES)}.")
    supported_arch = architecture is None or architecture in SUPPORTED_ARCHITECTURES
    if requested == "vllm":
        if not cuda:
            raise UsageError("generation_engine 'vllm' needs a CUDA GPU; this machine has none. Use 'llama_cpp' or "
                             "'transformers'.")
        if not (vllm_available() if vllm_installed is None else vllm_installed):
            raise UsageError("generation_engine 'vllm' needs vllm: pip install vllm, without replacing torch "
                             "(docs/gpu.md).")
        return "vllm", "requested"
    if requested == "llama_cpp":
        if cuda:
            raise UsageError("generation_engine 'llama_cpp' is the CPU engine (its build here has no CUDA); on a GPU "
                             "use 'vllm' or 'transformers'.")
        if not llama_cpp_available():
            raise UsageError("generation_engine 'llama_cpp' needs llama-cpp-python: run `make llama-cpp`.")
        problem = llama_cpp_problem_here()
        if problem:
            raise UsageError(f"generation_engine 'llama_cpp' cannot run here: {problem}. Rebuild it for this CPU "
                             f"(`make llama-cpp`) or use 'transformers'.")
        if not supported_arch:
            raise UsageError(f"generation_engine 'llama_cpp' supports {', '.join(SUPPORTED_ARCHITECTURES)}, not "
                             f"{architecture}: use 'transformers'.")
        return "llama_cpp", "requested"
    if requested == "transformers":
        return "transformers", "requested"
    # auto
    if cuda:
        if not (vllm_available() if vllm_installed is None else vllm_installed):
            return "transformers", "auto: CUDA GPU without vllm"
        if load_in_4bit and backend != "unsloth":
            return "transformers", "auto: 4-bit weights, which TRL's vLLM cannot sync (trl#4973)"
        return "vllm", "auto: CUDA GPU and vllm installed"
    if not llama_cpp_available():
        return "transformers", "auto: CPU, llama.cpp engine not built (make llama-cpp)"
    if not supported_arch:
        return "transformers", f"auto: CPU, but llama_cpp does not support {architecture}"
    problem = llama_cpp_problem_here()
    if problem:
        return "transformers", f"auto: CPU, but the llama.cpp engine cannot run here: {problem} (make llama-cpp)"
    return "llama_cpp", f"auto: CPU, llama-cpp-python {_version('llama_cpp_python')}"


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


@dataclass
class EngineSetup:
    """What a run needs to build an engine (kept apart from the run config so tests and benches can build one)."""

    model_dir: str
    architecture: str
    threads: int
    max_sequences: int
    max_context: int
    extra: dict[str, Any] = field(default_factory=dict)

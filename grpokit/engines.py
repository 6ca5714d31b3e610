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

import importlib.util
from dataclasses import dataclass, field
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

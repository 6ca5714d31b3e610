"""How an engine plugs into TRL 1.15's GRPOTrainer (our subclass, trl_trainer.py, calls these).

- `generate_for_trainer`: TRL's `_generate_single_turn` contract — for each row of `prompt_ids` (TRL has already
  repeated every prompt `num_generations` times) one completion's token ids (up to and including the first EOS) and
  each token's sampler log-prob. The adapter is pushed first whenever the optimizer has stepped since the last push
  (also covers the first generation, resume and evaluation), so the engine never samples from stale weights.
- `importance_sampling`: TRL corrects the sampler/trainer mismatch (truncated importance sampling,
  `vllm_importance_sampling_*`) only when `use_vllm` is set. The engine's log-probs take vLLM's place, so the flag
  is raised around the two methods that read it (scoring and the loss), and nowhere else: generation, weight sync
  and everything vLLM-specific never see it. The correction costs one no-grad log-prob pass per step (as with vLLM),
  and logs `sampling/sampling_logp_difference/{mean,max}` and `sampling/importance_sampling_ratio/*`.
- `attach_engine`: the run's few lines (choose, build, log, hand to the trainer).
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

from . import SamplingParams, build_engine, choose_engine, vllm_kwargs

log = logging.getLogger("grpo")


def sampling_params(trainer, seed: int) -> SamplingParams:
    """The trainer's own sampling settings (GRPOConfig), as the engine takes them."""
    return SamplingParams(
        max_tokens=trainer.max_completion_length, temperature=trainer.temperature, top_p=trainer.top_p or 1.0,
        top_k=trainer.top_k or 0, min_p=trainer.min_p or 0.0, eos_token_ids=tuple(trainer.eos_token_ids), seed=seed)


def generate_for_trainer(trainer, engine, prompt_ids: list[list[int]]):
    import torch
    from trl.extras.profiling import profiling_context

    # (trainer, step): an engine kept across trainers (a run's evaluation builds its own) pushes again for each.
    version = (id(trainer), trainer.state.global_step)
    if getattr(engine, "pushed_version", None) != version:
        with profiling_context(trainer, f"{engine.name}.push_adapter"):
            engine.push_adapter(trainer.accelerator.unwrap_model(trainer.model))
        engine.pushed_version = version
    # Drawn from torch's generator, which the run seeds per (seed, step, rank) (checkpoints.DeterministicSampling):
    # reproducible across runs and resumes, different per step and per process.
    seed = int(torch.randint(0, 2**62, (1,)).item())
    with profiling_context(trainer, f"{engine.name}.generate"):
        completion_ids, logprobs = engine.generate(prompt_ids, 1, sampling_params(trainer, seed))
    return completion_ids, logprobs


@contextlib.contextmanager
def timed(trainer, key: str):
    """Wall seconds of the block, logged as a TRL metric (averaged per logging step, like TRL's own)."""
    import time

    started = time.perf_counter()
    try:
        yield
    finally:
        mode = "train" if trainer.model.training else "eval"
        trainer._metrics[mode][key].append(time.perf_counter() - started)


def uses_engine(trainer) -> bool:
    engine = getattr(trainer, "generation_engine", None)
    return engine is not None and not getattr(engine, "uses_trainer_path", False)


@contextlib.contextmanager
def importance_sampling(trainer):
    """TRL's vLLM importance-sampling correction, applied to the engine's samples (see the module docstring)."""
    if (not uses_engine(trainer) or trainer.use_vllm or not trainer.vllm_importance_sampling_correction
            or trainer.tools or trainer.rollout_func is not None):
        yield
        return
    trainer.use_vllm = True
    try:
        yield
    finally:
        trainer.use_vllm = False


def local_model_dir(path: str) -> Path | None:
    """The directory holding the model's files: `path` itself, or a hub id's snapshot already in the HF cache."""
    if Path(path).is_dir():
        return Path(path)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached / not a hub id: the engine cannot export it
        return None


def resolve_engine(config, backend: str, cuda: bool) -> tuple[str, str]:
    """(engine, reason) for this run, before the model loads (vllm changes how Unsloth loads it)."""
    from model_loader import model_path

    requested = config.generation_engine
    if config.use_vllm or config.fast_inference:
        return "vllm", "use_vllm / fast_inference set"
    model_dir = local_model_dir(model_path(config.model_name)) if not cuda else None
    architecture = None
    if model_dir is not None and (model_dir / "config.json").exists():
        architecture = (json.loads((model_dir / "config.json").read_text()).get("architectures") or ["?"])[0]
    elif not cuda:
        architecture = "a model with no local safetensors directory"
    name, reason = choose_engine(requested, cuda, backend, architecture, load_in_4bit=config.load_in_4bit)
    if name == "vllm":
        # TRL's / Unsloth's own vLLM generation, through the config fields that already switch it on.
        if backend == "unsloth":
            config.fast_inference = True
        else:
            config.use_vllm = True
            config.vllm_mode = vllm_kwargs(backend)["grpo_config"]["vllm_mode"]
    return name, reason


THREADS_ENV = "GRPO_LLAMA_THREADS"


def engine_threads(torch_threads: int) -> int:
    """llama.cpp's thread count: torch's (the physical cores; generation and training never overlap), unless
    GRPO_LLAMA_THREADS says otherwise. On cores shared with other busy processes use fewer: llama.cpp's workers
    spin at every op barrier, so a descheduled peer stalls the rest (2-core box at load 6: 2 threads 4-11 tok/s,
    1 thread 27-29 tok/s; on quiet cores 2 threads are the fast choice)."""
    import os

    value = os.environ.get(THREADS_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else torch_threads


def attach_engine(trainer, config, choice: tuple[str, str], model_dir: str, engine=None):
    """Hand the chosen engine to the trainer, building it unless `engine` (one built for an earlier trainer of the
    same run) is given; log engine, threads and why in one line. Returns the engine (None = TRL's own path).

    An engine that fails to start on 'auto' falls back to transformers with a one-line warning; an explicit choice
    raises (UsageError names the fix)."""
    import torch

    from config.errors import UsageError

    name, reason = choice
    if engine is not None:
        trainer.generation_engine = engine
        return engine
    threads = engine_threads(torch.get_num_threads())
    if name != "llama_cpp":
        log.info("Generation engine: %s (%s)", name, reason)
        return None
    completions = max(config.per_device_train_batch_size * config.gradient_accumulation_steps,
                      config.per_device_eval_batch_size)
    from . import EngineSetup

    setup = EngineSetup(model_dir=str(local_model_dir(model_dir) or model_dir), architecture="", threads=threads,
                        max_sequences=completions,
                        max_context=completions * (config.max_prompt_length + config.max_completion_length))
    try:
        unsupported = [f"{key}={value}" for key, value, default in (
            ("repetition_penalty", trainer.repetition_penalty, 1.0),
            ("generation_kwargs", trainer.args.generation_kwargs, None)) if value not in (default, {})]
        if unsupported:
            raise UsageError(f"the llama_cpp engine does not implement {', '.join(unsupported)}: drop it or use "
                             "--set generation_engine=transformers.")
        engine = build_engine("llama_cpp", trainer.model, None, setup)
    except UsageError as err:
        if config.generation_engine == "llama_cpp":
            raise
        log.warning("Generation engine: transformers (llama_cpp could not start: %s)", err)
        return None
    trainer.generation_engine = engine
    log.info("Generation engine: llama_cpp, %d threads, %s (%s)", threads, engine.gguf_path.name, reason)
    return engine

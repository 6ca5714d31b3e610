"""How an engine plugs into TRL 1.15's GRPOTrainer (our subclass, trl_trainer.py, calls these).

- `generate_for_trainer`: TRL's `_generate_single_turn` contract — for each row of `prompt_ids` (TRL has already
  repeated every prompt `num_generations` times) one completion's token ids (up to and including the first EOS) and
  each token's sampler log-prob. The adapter is pushed first whenever the optimizer has stepped since the last push
  (also covers the first generation, resume and evaluation), so the engine never samples from stale weights.
- `importance_sampling`: TRL corrects the sampler/trainer mismatch (truncated importance sampling,
  `vllm_importance_sampling_*`) only when `use_vllm` is set. The engine's log-probs take vLLM's place, so the flag
  is raised around the two methods that read it (scoring and the loss), and nowhere else: generation, weight sync
  and everything vLLM-specific never see it. TRL pays one extra no-grad log-prob pass per step for it (as with
  vLLM); on on-policy steps (TRL's default settings) the trainer's log-probs of the samples are the loss pass's own,
  so the ratio is computed there, with TRL's formula, and that pass is skipped. Either way it logs
  `sampling/sampling_logp_difference/{mean,max}` and `sampling/importance_sampling_ratio/*`.
- `resolve_engine` / `start_engine`: the run's few lines (choose before the load, build, log; the trainer takes the
  engine as a constructor argument).
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

from config.errors import UsageError
from grpokit.engines import EngineSetup, SamplingParams, choose_engine, llama_cpp_available

log = logging.getLogger("grpo")


def sampling_params(trainer, seed: int) -> SamplingParams:
    """The trainer's own sampling settings (GRPOConfig), as the engine takes them."""
    # greedy_rollout: the generation logs' tool rollouts decode greedily through TRL's loop (grpokit/agents.py)
    return SamplingParams(
        max_tokens=trainer.max_completion_length, temperature=trainer.temperature, top_p=trainer.top_p or 1.0,
        top_k=trainer.top_k or 0, min_p=trainer.min_p or 0.0, eos_token_ids=tuple(trainer.eos_token_ids), seed=seed,
        greedy=getattr(trainer, "greedy_rollout", False))


def push_if_stale(trainer, engine) -> None:
    """Push the trainer's current adapter unless the engine already has this optimizer step's weights."""
    from trl.extras.profiling import profiling_context

    # (trainer, step): an engine kept across trainers (a run's evaluation builds its own) pushes again for each.
    version = (id(trainer), trainer.state.global_step)
    if getattr(engine, "pushed_version", None) != version:
        with profiling_context(trainer, f"{engine.name}.push_adapter"):
            engine.push_adapter(trainer.accelerator.unwrap_model(trainer.model))
        engine.pushed_version = version


def generate_for_trainer(trainer, engine, prompt_ids: list[list[int]]):
    import torch
    from trl.extras.profiling import profiling_context

    push_if_stale(trainer, engine)
    # Drawn from torch's generator, which the run seeds per (seed, step, rank) (checkpoints.DeterministicSampling):
    # reproducible across runs and resumes, different per step and per process.
    seed = int(torch.randint(0, 2**62, (1,)).item())
    with profiling_context(trainer, f"{engine.name}.generate"):
        completion_ids, logprobs = engine.generate(prompt_ids, 1, sampling_params(trainer, seed))
    return completion_ids, logprobs


def engine_generate(trainer, prompt_ids: list[list[int]], n: int, max_tokens: int, greedy: bool,
                    temperature: float = 1.0, seed: int = 0) -> list[list[int]]:
    """The generation logs' decoding (greedy, or pass@k samples) through the trainer's engine, current adapter in:
    `n` completions per prompt, prompt-major, as token ids."""
    engine = trainer.generation_engine
    push_if_stale(trainer, engine)
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, greedy=greedy,
                              eos_token_ids=tuple(trainer.eos_token_ids), seed=seed)
    completion_ids, _ = engine.generate(prompt_ids, n, sampling)
    return completion_ids


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


def _corrects_mismatch(trainer) -> bool:
    # Tool runs too: TRL's loop generates each turn through the engine (trl_trainer._generate_single_turn), gives a
    # tool's tokens log-prob 0 and tool_mask 0, and both ratio computations multiply by that mask.
    return (uses_engine(trainer) and not trainer.use_vllm and trainer.vllm_importance_sampling_correction
            and trainer.rollout_func is None)


def defers_importance_sampling(trainer) -> bool:
    """On-policy steps (TRL's own test for needing no old log-probs: one iteration per generation, generation aligned
    with the optimizer step): the trainer's log-probs of the samples are exactly the loss pass's own, detached, so the
    correction is computed there instead of in a separate no-grad pass over the whole batch (~a fifth of a CPU step)."""
    generate_every = trainer.args.steps_per_generation * trainer.num_iterations
    return (_corrects_mismatch(trainer) and trainer.args.gradient_accumulation_steps % generate_every == 0
            and trainer.loss_type != "vespo")


def importance_sampling_ratio(trainer, trainer_logps, sampling_logps, mask):
    """TRL 1.15's vLLM importance-sampling ratio (GRPOTrainer._generate_and_score_completions), same modes and
    bounds, and the same `sampling/*` metrics."""
    import math

    import torch

    diff = torch.nan_to_num((trainer_logps - sampling_logps) * mask, nan=0.0)  # NaN (unscored): ratio 1
    sequence_level = trainer.vllm_importance_sampling_mode in ("sequence_mask", "sequence_truncate")
    ratio = torch.exp(diff.sum(-1, keepdim=True) if sequence_level else diff)
    low, high = trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max
    if trainer.vllm_importance_sampling_mode in ("sequence_truncate", "token_truncate"):
        ratio = torch.clamp(ratio, min=low, max=high)
    elif trainer.vllm_importance_sampling_mode in ("sequence_mask", "token_mask"):
        low, high = -math.inf if low is None else low, math.inf if high is None else high
        ratio = ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    else:
        raise ValueError(f"Unknown vLLM importance sampling level: {trainer.vllm_importance_sampling_mode}")
    mode = "train" if trainer.model.training else "eval"
    valid = mask.bool()
    delta = torch.abs(trainer_logps - sampling_logps)[valid]
    delta = delta[~torch.isnan(delta)]
    flat = ratio.flatten() if sequence_level else ratio[valid]
    metrics = trainer._metrics[mode]
    zero = torch.tensor(0.0)
    for name, value in (("sampling_logp_difference/mean", delta.mean() if delta.numel() else zero),
                        ("sampling_logp_difference/max", delta.max() if delta.numel() else zero),
                        ("importance_sampling_ratio/min", flat.min() if flat.numel() else zero),
                        ("importance_sampling_ratio/mean", flat.mean() if flat.numel() else zero),
                        ("importance_sampling_ratio/max", flat.max() if flat.numel() else zero)):
        gathered = trainer.accelerator.gather(value.to(trainer.accelerator.device))
        reduce = {"min": torch.min, "max": torch.max}.get(name.rsplit("/", 1)[1], torch.mean)
        metrics[f"sampling/{name}"].append(reduce(gathered.float()).item())
    return ratio


@contextlib.contextmanager
def importance_sampling(trainer, inputs: dict | None = None):
    """TRL's vLLM importance-sampling correction, applied to the engine's samples (see the module docstring).

    `inputs` None: the generate-and-score phase; else the loss phase's micro-batch. On-policy steps skip the
    separate pass (defers_importance_sampling) and compute the same ratio from the loss pass's log-probs."""
    if not _corrects_mismatch(trainer):
        yield
        return
    deferred = defers_importance_sampling(trainer)
    if deferred and (inputs is None or inputs.get("sampling_per_token_logps") is None):
        yield  # generation phase: no old log-probs pass; TRL keeps the engine's log-probs in the batch
        return
    if deferred:
        policy_logps = trainer._get_per_token_logps_and_entropies

        def logps_then_ratio(*args, **kwargs):
            logps, entropies, aux = policy_logps(*args, **kwargs)
            mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs[
                "tool_mask"]
            inputs["importance_sampling_ratio"] = importance_sampling_ratio(
                trainer, logps.detach(), inputs["sampling_per_token_logps"], mask)
            trainer._get_per_token_logps_and_entropies = policy_logps  # only the policy's own pass
            return logps, entropies, aux

        trainer._get_per_token_logps_and_entropies = logps_then_ratio
    trainer.use_vllm = True
    try:
        yield
    finally:
        trainer.use_vllm = False
        if deferred:
            vars(trainer).pop("_get_per_token_logps_and_entropies", None)


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
    from grpokit.model_loader import model_path

    requested = config.generation_engine
    broken = _vllm_import_error() if config.use_vllm or config.fast_inference or requested == "vllm" else ""
    if broken:  # asked for by name: a vllm that is installed but broken is one line now, not at generation
        raise UsageError(f"vllm does not import here ({broken}): repair it (a vllm built for this torch) or generate "
                         "with --set generation_engine=transformers.")
    if config.use_vllm or config.fast_inference:
        # --use-vllm on Unsloth still has to reach from_pretrained as fast_inference: without it TRL would start its
        # own vLLM and push the 4-bit weights into it (load_plan.vllm_refusal).
        _use_vllm(config, backend)
        return "vllm", "use_vllm / fast_inference set"
    model_dir = local_model_dir(model_path(config.model_name, config.load_in_4bit)) if not cuda else None
    architecture = None
    if model_dir is not None and (model_dir / "config.json").exists():
        architecture = (json.loads((model_dir / "config.json").read_text()).get("architectures") or ["?"])[0]
    elif not cuda:
        architecture = "a model with no local safetensors directory"
    name, reason = choose_engine(requested, cuda, backend, architecture, load_in_4bit=config.load_in_4bit)
    if name == "vllm" and requested == "auto":
        # The load plan decides 'auto' with the memory it has: vLLM only where its share of the card holds the weights.
        from grpokit.load_plan import detect_machine, plan_load

        name, reason = importable_engine(name, reason)
        if name == "vllm":
            planned = plan_load(config, detect_machine(), backend)
            name, reason = planned.engine, planned.engine_reason
    if name == "vllm":
        _use_vllm(config, backend)
    return name, reason


def warm_engine_export(config, cuda: bool) -> bool:
    """[engines] Before the model loads: where the CPU engine ('auto' or 'llama_cpp') will export this model to GGUF
    for the first time here, start llama.cpp's converter now (gguf_export.warm_converter), so its imports run beside
    the model's load instead of after it. A guess made before the engine is chosen ('auto' may still pick
    transformers): a converter the run never uses is stopped at exit, one core's few seconds spent. True if one waits."""
    from config.models import MODEL_PRESETS
    from grpokit.model_loader import embedded_model_path, model_path

    if cuda or config.generation_engine not in ("auto", "llama_cpp") or config.use_vllm or config.fast_inference \
            or not llama_cpp_available():
        return False
    from grpokit.gguf_export import warm_converter

    preset = MODEL_PRESETS.get(config.model_name)
    if preset is not None and preset.embedded and not (embedded_model_path() / "config.json").exists():
        return warm_converter(embedded_model_path(), being_made=True)  # beside its first conversion, which comes next
    model_dir = local_model_dir(model_path(config.model_name, config.load_in_4bit))
    return model_dir is not None and warm_converter(model_dir)


def importable_engine(name: str, reason: str) -> tuple[str, str]:
    """An engine 'auto' chose, kept where it can run: the load plan sees vllm installed (find_spec, before any
    import), and one that does not import here (a vllm built for another torch) gives transformers, the same for the
    run (resolve_engine) and for --dry-run's plan (GRPOTrainer.check_run)."""
    if name == "vllm" and reason.startswith("auto"):
        broken = _vllm_import_error()
        if broken:
            return "transformers", f"auto: vllm is installed but does not import ({broken})"
    return name, reason


def _vllm_import_error() -> str:
    """'' when vllm imports (the run needs it next anyway), else why not: installed packages can be broken (a vllm
    built for another torch), and the load plan only saw that the package is there."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any import failure is the same answer: this vllm cannot run here
        return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
    return ""


def _use_vllm(config, backend: str) -> None:
    """TRL's / Unsloth's own vLLM generation, through the config fields that switch it on (load_plan.vllm_settings:
    Unsloth's fast_inference in colocate mode, else TRL's use_vllm in the config's mode)."""
    from grpokit.load_plan import vllm_settings

    settings = vllm_settings(config, backend)
    config.use_vllm, config.vllm_mode = settings["use_vllm"], settings["vllm_mode"]
    if settings["fast_inference"]:
        config.fast_inference = True


def engine_threads(requested: int, torch_threads: int) -> int:
    """llama.cpp's thread count at start: the config's `generation_threads`, or torch's when it is 0 (generation and
    training never overlap; cpu_threads.ThreadPlan has set torch's to the cores not busy elsewhere and re-sets both
    before every step)."""
    return requested if requested > 0 else torch_threads


def check_llama_cpp_settings(trl_args: dict) -> None:
    """A UsageError naming the generation settings the llama_cpp engine does not implement. The run calls it before
    anything loads when llama_cpp is asked for by name (GRPOTrainer.check_run); on 'auto' the engine falls back."""
    from config.errors import UsageError

    unsupported = [f"{key}={value}" for key, value, default in (
        ("repetition_penalty", trl_args.get("repetition_penalty", 1.0), 1.0),
        ("generation_kwargs", trl_args.get("generation_kwargs"), None)) if value not in (default, {})]
    if unsupported:
        raise UsageError(f"the llama_cpp engine does not implement {', '.join(unsupported)}: drop it or use "
                         "--set generation_engine=transformers.")


def start_engine(config, choice: tuple[str, str], model, model_dir: str, trl_args: dict, engine=None):
    """The chosen engine for the run's TRL trainer (its `generation_engine` constructor argument), built unless
    `engine` (one built for an earlier trainer of the same run) is given; logs engine, threads and why in one line.
    `model` is the PEFT model the trainer will train (the engine shares its frozen weights); `trl_args` the TRL
    GRPOConfig keyword arguments. Returns (the engine or None for TRL's own path, the (name, reason) that really
    runs).

    An engine that fails to start on 'auto' falls back to transformers with a one-line warning; an explicit choice
    raises (UsageError names the fix)."""
    import torch

    from config.errors import UsageError

    name, reason = choice
    if engine is not None:
        return engine, choice
    threads = engine_threads(config.generation_threads, torch.get_num_threads())
    if name != "llama_cpp":
        log.info("Generation engine: %s (%s)", name, reason, extra={"file_only": True})
        return None, choice
    completions = max(config.per_device_train_batch_size * config.gradient_accumulation_steps,
                      config.per_device_eval_batch_size)
    setup = EngineSetup(model_dir=str(local_model_dir(model_dir) or model_dir), architecture="", threads=threads,
                        max_sequences=completions,
                        max_context=completions * (config.max_prompt_length + config.max_completion_length))
    try:
        check_llama_cpp_settings(trl_args)
        engine = build_engine("llama_cpp", model, None, setup)
    except Exception as err:  # noqa: BLE001 - any failure to start the engine: fall back on 'auto', name it otherwise
        why = str(err) if isinstance(err, UsageError) else f"{err.__class__.__name__}: {err}"
        if config.generation_engine == "llama_cpp":
            if isinstance(err, UsageError):
                raise
            raise UsageError(f"the llama_cpp engine could not start ({why}); use --generation-engine transformers."
                             ) from err
        log.warning("Generation engine: transformers (llama_cpp could not start: %s)", why)
        from grpokit.model_loader import nf4_weights_in_compute_dtype

        nf4_weights_in_compute_dtype(model)  # 4-bit on CPU: the f16 kept for sharing with the engine goes
        return None, ("transformers", "llama_cpp could not start")  # later trainers of the run do not retry
    # file only: the run header shows the engine line on the console
    log.info("Generation engine: llama_cpp, %d threads, sampling %s from %s (%s)", threads, engine.weights,
             engine.gguf_path.name, reason, extra={"file_only": True})
    return engine, choice


def build_engine(name: str, model, tokenizer, setup: EngineSetup | None = None):
    """The engine object for `name` ('transformers' or 'llama_cpp'; vLLM is TRL's own, see load_plan.vllm_settings)."""
    if name == "transformers":
        from grpokit.engine_transformers import TransformersEngine

        return TransformersEngine(model, tokenizer)
    if name == "llama_cpp":
        from grpokit.engine_llama_cpp import LlamaCppEngine

        assert setup is not None
        return LlamaCppEngine.from_model_dir(setup.model_dir, threads=setup.threads,
                                             max_sequences=setup.max_sequences, max_context=setup.max_context,
                                             trainer_model=model)
    raise ValueError(f"no engine object for {name!r}")

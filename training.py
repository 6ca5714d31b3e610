"""The heavy half of a run: load the model, build TRL's GRPOTrainer, train, evaluate, save.

Only reached after the config, data and rewards have been validated, so bad input never costs a model load.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from config.errors import UsageError
from config.loader import trl_kwargs
from config.schema import GRPORunConfig
from rewards import RewardSet, build_reward_functions

log = logging.getLogger("grpo")


class Interrupted(Exception):
    """Training stopped on SIGINT / SIGTERM after saving a checkpoint."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def dataset_fingerprint(train_ds) -> str:
    """Content and order of the training prompts (ids are derived from content for every source)."""
    import hashlib

    digest = hashlib.sha256(json.dumps(list(train_ds["id"])).encode())
    digest.update(json.dumps(train_ds[0]["prompt"] if len(train_ds) else None).encode())
    return digest.hexdigest()[:16]


def evaluate(trainer) -> dict[str, Any]:
    """trainer.evaluate(), plus the reward metrics TRL logs but does not return (eval_reward, eval_rewards/...)."""
    metrics = dict(trainer.evaluate())
    for entry in reversed(trainer.state.log_history):
        if "eval_reward" in entry:
            metrics.update({k: v for k, v in entry.items() if k.startswith("eval_")})
            break
    return metrics


def grpo_config_kwargs(config: GRPORunConfig, has_eval: bool, reward_weights: list[float] | None) -> dict[str, Any]:
    """Everything TRL's GRPOConfig receives (kept separate so tests can check what we hand over)."""
    kwargs = trl_kwargs(config)
    evaluate_during = has_eval and config.eval_steps > 0
    kwargs.update(
        eval_strategy="steps" if evaluate_during else "no",
        eval_steps=config.eval_steps if evaluate_during else None,
        save_strategy="steps" if config.save_steps else "no",
        save_steps=config.save_steps or 500,
        save_total_limit=config.save_total_limit or None,
        report_to=["wandb"] if config.wandb_project else "none",
        run_name=config.run_name or None,
        reward_weights=reward_weights,
        log_completions=False,
        disable_tqdm=False,
    )
    if evaluate_during and config.save_steps and config.best_metric:
        # transformers tracks the best checkpoint (state.best_model_checkpoint) by this eval metric.
        kwargs.update(metric_for_best_model=f"eval_{config.best_metric}", greater_is_better=True,
                      load_best_model_at_end=config.load_best_model_at_end)
    # GRPOConfig turns activation checkpointing on by default; 'false' has to reach it, or every step silently pays
    # a second forward pass (the recompute) on top of the one it needs.
    kwargs.setdefault("gradient_checkpointing", config.use_gradient_checkpointing != "false")
    if config.fast_inference:
        # Unsloth's in-process vLLM engine serves TRL's generation (Unsloth's GRPO notebooks set use_vllm=True).
        kwargs["use_vllm"] = True
    return kwargs


def make_trainer(config: GRPORunConfig, backend: str, model, tokenizer, reward_funcs, kwargs: dict[str, Any],
                 train_ds, eval_ds):
    """TRL's GRPOTrainer (our subclass: trl_trainer.py) on GRPOConfig(**kwargs), with prompt sharing where it
    applies."""
    import torch
    from trl import GRPOConfig

    from trl_trainer import TRLGRPOTrainer as GRPOTrainer

    if not torch.cuda.is_available():
        kwargs.setdefault("use_cpu", True)  # transformers refuses bf16 without a GPU unless told it is a CPU run
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward_funcs,
                          args=GRPOConfig(**kwargs), train_dataset=train_ds, eval_dataset=eval_ds)
    trainer.share_prompts = config.share_prompts
    if config.share_prompts and backend == "unsloth" and torch.cuda.is_available():
        # Unsloth's GPU trainer replaces the log-prob pass with its own kernels; sharing stays out of its way.
        log.info("share_prompts: not used with Unsloth's GPU trainer (it computes log-probs with its own kernels).")
        trainer.share_prompts = False
    return trainer


def run_training(config: GRPORunConfig, train_ds, eval_ds, report, reward_set: RewardSet, backend: str,
                 resume_from: str | None = None, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    from model_loader import import_backend, load_model

    started = time.perf_counter()
    backend = import_backend(backend)  # unsloth must be imported before trl / transformers
    import torch

    from callbacks import GenerationLogger, LogLinesCallback, WandbRunConfig
    from checkpoints import DeterministicSampling, GracefulStop, ManifestWriter
    from data_loader import filter_long_prompts

    log.info("Backend: %s (torch %s, %s)", backend, torch.__version__,
             "CUDA" if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads")
    model, tokenizer = load_model(config, backend)
    log.info("Model %s loaded in %.1f s", config.model_name, time.perf_counter() - started)
    train_ds, eval_ds = filter_long_prompts(train_ds, eval_ds, tokenizer, config.max_prompt_length, report)
    for split, reasons in report.dropped.items():
        for reason, count in reasons.items():
            log.info("Dropped %d %s rows: %s", count, split, reason)
    log.info("Data: %d train prompts, %d eval prompts", len(train_ds), len(eval_ds) if eval_ds is not None else 0)

    reward_funcs, reward_weights = build_reward_functions(reward_set, config.reward_function_type)
    if config.wandb_project:
        os.environ["WANDB_PROJECT"] = config.wandb_project
    kwargs = grpo_config_kwargs(config, eval_ds is not None, reward_weights)
    if (config.use_vllm or config.fast_inference) and not torch.cuda.is_available():
        raise UsageError("vLLM generation (use_vllm / fast_inference) needs a CUDA GPU; this machine has none. "
                         "Drop --use-vllm to generate with transformers.")
    trainer = make_trainer(config, backend, model, tokenizer, reward_funcs, kwargs, train_ds, eval_ds)
    trainer.add_callback(LogLinesCallback())
    trainer.add_callback(DeterministicSampling())
    if manifest is not None:
        trainer.add_callback(ManifestWriter(manifest))
    if config.wandb_project:
        from config.loader import config_to_dict

        # after TRL's W&B callback, so its run exists when ours adds the config
        trainer.add_callback(WandbRunConfig(config_to_dict(config)))
    generation_logger = None
    if config.enable_generation_logging:
        rows_source = eval_ds if eval_ds is not None else train_ds
        rows = [rows_source[i] for i in range(min(config.max_generation_samples, len(rows_source)))]
        log_dir = Path(config.generation_log_dir or Path(config.output_dir) / "generation_logs")
        generation_logger = GenerationLogger(
            rows, tokenizer, reward_set, log_dir,
            max_new_tokens=config.generation_max_new_tokens or config.max_completion_length,
            is_main_process=trainer.is_world_process_zero(), pass_k=config.eval_pass_k,
            temperature=config.temperature,
        )
        trainer.add_callback(generation_logger)

    stop = GracefulStop()
    trainer.add_callback(stop)
    train_started = time.perf_counter()
    try:
        train_result = trainer.train(resume_from_checkpoint=resume_from)
    finally:
        stop.restore()
    train_seconds = time.perf_counter() - train_started
    if stop.signal_name is not None:
        checkpoint = Path(config.output_dir) / f"checkpoint-{trainer.state.global_step}"
        raise Interrupted(
            f"{stop.signal_name} at step {trainer.state.global_step}: checkpoint saved to {checkpoint}. Resume with "
            f"the same command plus --resume-from-checkpoint {checkpoint} (or 'latest').", stop.exit_code)
    eval_metrics: dict[str, Any] = {}
    if eval_ds is not None and not (config.eval_steps and trainer.state.global_step % config.eval_steps == 0):
        # Always finish with an evaluation (which also writes the final generation log).
        eval_metrics = evaluate(trainer)
    elif eval_ds is None and generation_logger is not None:
        generation_logger.log_generations(trainer.model, trainer.state.global_step)

    summary = finish(config, trainer, tokenizer, train_result, eval_metrics, generation_logger, backend,
                     train_seconds, time.perf_counter() - started)
    # Every rank says where it ended, so a multi-process run shows that all ranks agree.
    log.info("rank %d of %d finished at global step %d", trainer.args.process_index, trainer.args.world_size,
             trainer.state.global_step)
    return summary


def finish(config, trainer, tokenizer, train_result, eval_metrics, generation_logger, backend, train_seconds,
           total_seconds) -> dict[str, Any]:
    """Save the adapter, tokenizer, trainer state and a metrics summary; return the summary."""
    out = Path(config.output_dir)
    trainer.save_model(str(out))  # LoRA adapter (adapter_model.safetensors + adapter_config.json)
    if trainer.is_world_process_zero():
        verify_adapter(out)
    trainer.save_state()  # trainer_state.json: the full log history
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(str(out))
    train_rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    summary: dict[str, Any] = {
        "backend": backend,
        "model": config.model_name,
        "global_step": trainer.state.global_step,
        "train_seconds": round(train_seconds, 2),
        "total_seconds": round(total_seconds, 2),
        "train_reward_first": train_rewards[0] if train_rewards else None,
        "train_reward_last": train_rewards[-1] if train_rewards else None,
        "train_loss": train_result.training_loss,
        "eval": eval_metrics,
        "output_dir": str(out),
        "best_checkpoint": trainer.state.best_model_checkpoint,
        "best_metric": trainer.state.best_metric,
    }
    if generation_logger is not None and generation_logger.history:
        summary["generation_eval_baseline"] = generation_logger.history[0]["reward_mean"]
        summary["generation_eval_final"] = generation_logger.history[-1]["reward_mean"]
        summary["generation_logging_seconds"] = round(generation_logger.seconds, 2)
        summary["generation_log_dir"] = str(generation_logger.log_dir)
        for key in ("pass@1", f"pass@{config.eval_pass_k}"):
            if key in generation_logger.history[-1]:
                summary[f"generation_eval_{key}"] = generation_logger.history[-1][key]
    if trainer.is_world_process_zero():
        from plots import make_plots

        try:
            summary["plots"] = [str(p) for p in make_plots(out)]
        except Exception as err:  # noqa: BLE001 - a plot must never cost the run its summary
            log.error("Plotting failed (%s: %s)", err.__class__.__name__, err)
        (out / "metrics_summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    if config.save_merged:
        save_merged(trainer.model, tokenizer, out / "merged_16bit")
    return summary


def verify_adapter(path: Path) -> None:
    """Reload the saved adapter and check it holds trained LoRA weights (B matrices start at zero)."""
    from safetensors.torch import load_file

    weights = load_file(str(path / "adapter_model.safetensors"))
    lora_b = [t for k, t in weights.items() if "lora_B" in k]
    if not lora_b or not any(bool(t.abs().sum() > 0) for t in lora_b):
        log.warning("Saved adapter in %s has all-zero LoRA B weights: nothing was learned (check rewards).", path)
    else:
        log.info("Adapter check: %d LoRA tensors reloaded from %s, trained weights non-zero.", len(weights), path)


def save_merged(model, tokenizer, path: Path) -> None:
    """A merged 16-bit model: Unsloth's helper where the model has it, else PEFT's merge_and_unload."""
    if hasattr(model, "save_pretrained_merged"):
        try:
            model.save_pretrained_merged(str(path), tokenizer, save_method="merged_16bit")
            log.info("Merged 16-bit model saved to %s", path)
            return
        except NotImplementedError as err:
            raise UsageError(f"--save-merged: {err}") from None
    merged = model.merge_and_unload()
    merged.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    log.info("Merged model saved to %s", path)


def check_adapter_dir(path: Path, model_name: str) -> dict[str, Any]:
    """A saved adapter we can load for this model, or a UsageError naming what is wrong with it."""
    from model_loader import model_path

    config_file, weights = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not config_file.exists() or not weights.exists():
        raise UsageError(f"{path} has no LoRA adapter (adapter_config.json + adapter_model.safetensors): give a "
                         "checkpoint-N directory or a finished run's output directory.")
    try:
        adapter_config = json.loads(config_file.read_text())
        from safetensors import safe_open

        with safe_open(str(weights), "pt") as handle:  # reads the header: a truncated file fails here
            handle.keys()
    except Exception as err:  # noqa: BLE001 - any decode failure means the same thing to the user
        raise UsageError(f"{path}: the adapter files are unreadable or truncated ({err.__class__.__name__}).") from None
    base = adapter_config.get("base_model_name_or_path") or ""
    expected = model_path(model_name)
    if base and Path(base).name != Path(expected).name and base != expected:
        raise UsageError(f"{path} is an adapter for '{base}', not for '{model_name}' ({expected}): pass the matching "
                         "--model.")
    return adapter_config


def run_evaluation(config: GRPORunConfig, train_ds, eval_ds, report, reward_set: RewardSet, backend: str,
                   adapter_dir: Path) -> dict[str, Any]:
    """`--eval-only`: load a saved adapter, write a generation log and eval metrics, leave the adapter as it was."""
    from model_loader import import_backend, load_model

    adapter_config = check_adapter_dir(adapter_dir, config.model_name)
    backend = import_backend(backend)
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from callbacks import GenerationLogger
    from data_loader import filter_long_prompts

    # The adapter's own shape, whatever the config says, so its weights fit.
    config.lora_r, config.lora_alpha = adapter_config["r"], adapter_config["lora_alpha"]
    config.lora_target_modules = sorted(adapter_config["target_modules"])
    model, tokenizer = load_model(config, backend)
    result = set_peft_model_state_dict(model, load_file(str(adapter_dir / "adapter_model.safetensors")))
    if getattr(result, "unexpected_keys", None):
        raise UsageError(f"{adapter_dir}: adapter weights do not fit {config.model_name} "
                         f"({len(result.unexpected_keys)} unexpected tensors).")
    train_ds, eval_ds = filter_long_prompts(train_ds, eval_ds, tokenizer, config.max_prompt_length, report)
    if eval_ds is None:
        eval_ds = train_ds.select(range(min(len(train_ds), config.max_eval_samples or 64)))
    state_file = adapter_dir / "trainer_state.json"
    step = json.loads(state_file.read_text())["global_step"] if state_file.exists() else 0
    out = Path(config.output_dir) / "eval_only" / f"{adapter_dir.name}-step_{step}"
    out.mkdir(parents=True, exist_ok=True)
    reward_funcs, reward_weights = build_reward_functions(reward_set, config.reward_function_type)
    kwargs = grpo_config_kwargs(config, has_eval=False, reward_weights=reward_weights)
    kwargs.update(output_dir=str(out), report_to="none", save_strategy="no")
    trainer = make_trainer(config, backend, model, tokenizer, reward_funcs, kwargs, train_ds, eval_ds)
    logger = GenerationLogger([eval_ds[i] for i in range(min(config.max_generation_samples, len(eval_ds)))],
                              tokenizer, reward_set, out, config.generation_max_new_tokens or config.max_completion_length,
                              pass_k=config.eval_pass_k, temperature=config.temperature)
    summary = logger.log_generations(trainer.model, step) or {}
    metrics = evaluate(trainer)
    result = {"adapter": str(adapter_dir), "global_step": step, "eval": metrics, "generation_log": summary,
              "output_dir": str(out)}
    (out / "eval_metrics.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    log.info("Eval-only results in %s: eval_reward %s, greedy reward %s", out, metrics.get("eval_reward"),
             summary.get("reward_mean"))
    return result

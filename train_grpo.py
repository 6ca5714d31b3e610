"""GRPO fine-tuning from the command line: a model, a dataset, weighted rewards, TRL's GRPOTrainer through Unsloth.

    make quick-test                                   # set up .venv, then a real GRPO run on the embedded model (CPU)
    python train_grpo.py --quick-test                 # the same run
    python train_grpo.py --dry-run                    # resolve config + data + rewards, print the config, no model
    python train_grpo.py --model qwen2.5-7b --dataset gsm8k --reward-function multi
    python train_grpo.py --config my_config.json --set num_generations=8
    python train_grpo.py --score-completions samples.jsonl --reward-function multi   # preview rewards, no model

Precedence: built-in defaults < preset (default, --quick-test, --production, --preset) < --config FILE < flags
< --set. Bad input exits with code 2 and one line saying what to fix. Heavy libraries (torch, unsloth, trl) are
imported only once a run is known to be valid, so --help and bad input answer at once; --dry-run loads no model, only
the model's tokenizer to count the prompts too long to keep (~9 s on 2 cores, most of it importing transformers).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated, Literal

import typer

from config.errors import UsageError
from config.schema import (
    PANEL_AGENTS,
    PANEL_CHECKPOINTS,
    PANEL_DATA,
    PANEL_LOGGING,
    PANEL_MODEL,
    PANEL_REWARDS,
    PANEL_TRAINING,
    field_help,
)
from grpokit.console import (
    console_handler,
    is_main_process,
    print_eval_only,
    print_summary,
    quiet_third_party,
    whole_option_names_in_help,
)

log = logging.getLogger("grpo")
app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="rich")
whole_option_names_in_help()  # every option name whole in --help at 80 columns (patches Typer's tables lazily)


def _opt(field: str | None, panel: str, *names: str, help: str | None = None, **kwargs):
    """An option whose help text is the config field's own (written once, in config/schema.py)."""
    return typer.Option(*names, help=help or field_help(field), rich_help_panel=panel, show_default=False, **kwargs)


@app.callback(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
def main(
    ctx: typer.Context,
    # ---- Model
    model: Annotated[str | None, _opt("model_name", PANEL_MODEL, "--model", "-m")] = None,
    load_in_4bit: Annotated[bool | None, _opt("load_in_4bit", PANEL_MODEL, "--load-in-4bit/--no-4bit")] = None,
    lora_r: Annotated[int | None, _opt("lora_r", PANEL_MODEL, "--lora-r")] = None,
    backend: Annotated[Literal["auto", "unsloth", "transformers"] | None,
                       _opt("backend", PANEL_MODEL, "--backend")] = None,
    use_vllm: Annotated[bool | None, _opt("use_vllm", PANEL_MODEL, "--use-vllm")] = None,
    vllm_mode: Annotated[Literal["server", "colocate"] | None, _opt("vllm_mode", PANEL_MODEL, "--vllm-mode")] = None,
    vllm_server_host: Annotated[str | None, _opt("vllm_server_host", PANEL_MODEL, "--vllm-server-host")] = None,
    vllm_server_port: Annotated[int | None, _opt("vllm_server_port", PANEL_MODEL, "--vllm-server-port")] = None,
    generation_engine: Annotated[Literal["auto", "transformers", "llama_cpp", "vllm"] | None,
                                 _opt("generation_engine", PANEL_MODEL, "--generation-engine")] = None,
    generation_threads: Annotated[int | None,
                                  _opt("generation_threads", PANEL_MODEL, "--generation-threads")] = None,
    # ---- Data
    dataset: Annotated[str | None, _opt("dataset", PANEL_DATA, "--dataset", "-d")] = None,
    dataset_path: Annotated[str | None, _opt("dataset_path", PANEL_DATA, "--dataset-path")] = None,
    custom_data: Annotated[str | None, _opt("custom_data", PANEL_DATA, "--custom-data")] = None,
    max_samples: Annotated[int | None, _opt("max_samples", PANEL_DATA, "--max-samples")] = None,
    streaming: Annotated[bool | None, _opt("streaming", PANEL_DATA, "--streaming")] = None,
    system_prompt: Annotated[str | None, _opt("system_prompt", PANEL_DATA, "--system-prompt")] = None,
    prompt_field: Annotated[str | None, _opt("prompt_field", PANEL_DATA, "--prompt-field")] = None,
    answer_field: Annotated[str | None, _opt("answer_field", PANEL_DATA, "--answer-field")] = None,
    chosen_field: Annotated[str | None, _opt("chosen_field", PANEL_DATA, "--chosen-field")] = None,
    rejected_field: Annotated[str | None, _opt("rejected_field", PANEL_DATA, "--rejected-field")] = None,
    # ---- Rewards
    reward_function: Annotated[Literal["single", "multi", "systematic"] | None,
                               _opt("reward_function_type", PANEL_REWARDS, "--reward-function",
                                    help=field_help("reward_function_type") + " 'systematic' = multi.")] = None,
    reward_config: Annotated[str | None, _opt("reward_config", PANEL_REWARDS, "--reward-config")] = None,
    reward_preset: Annotated[str | None, _opt("reward_config_name", PANEL_REWARDS, "--reward-preset")] = None,
    reward: Annotated[list[str] | None, _opt("custom_rewards", PANEL_REWARDS, "--reward")] = None,
    score_completions: Annotated[Path | None, _opt(
        None, PANEL_REWARDS, "--score-completions",
        help="Score rows {prompt, completion | completions, ...reference columns} from a JSONL file with the "
             "configured rewards and print one JSON object per row; no model is loaded.")] = None,
    # ---- Tools & environments
    tool: Annotated[list[str] | None, _opt("tools", PANEL_AGENTS, "--tool")] = None,
    environment: Annotated[list[str] | None, _opt("environment", PANEL_AGENTS, "--environment")] = None,
    # ---- Training
    config_file: Annotated[str | None, _opt(None, PANEL_TRAINING, "--config", "-c",
                                            help="JSON or YAML config file (keys = config fields; "
                                                 "docs/configuration.md).")] = None,
    preset: Annotated[str | None, _opt(None, PANEL_TRAINING, "--preset",
                                       help="Named preset from config/presets/ (default: 'default').")] = None,
    quick_test: Annotated[bool, _opt(None, PANEL_TRAINING, "--quick-test",
                                     help="Preset 'quick_test': the embedded model, a few CPU steps.")] = False,
    production: Annotated[bool, _opt(None, PANEL_TRAINING, "--production",
                                     help="Preset 'production': full data, larger groups, KL penalty.")] = False,
    epochs: Annotated[float | None, _opt("num_train_epochs", PANEL_TRAINING, "--epochs")] = None,
    max_steps: Annotated[int | None, _opt("max_steps", PANEL_TRAINING, "--max-steps")] = None,
    learning_rate: Annotated[float | None, _opt("learning_rate", PANEL_TRAINING, "--learning-rate", "--lr")] = None,
    batch_size: Annotated[int | None, _opt("per_device_train_batch_size", PANEL_TRAINING, "--batch-size")] = None,
    num_generations: Annotated[int | None, _opt("num_generations", PANEL_TRAINING, "--num-generations")] = None,
    seed: Annotated[int | None, _opt("seed", PANEL_TRAINING, "--seed")] = None,
    output_dir: Annotated[str | None, _opt("output_dir", PANEL_TRAINING, "--output-dir", "-o")] = None,
    overwrite_output_dir: Annotated[bool | None, _opt("overwrite_output_dir", PANEL_TRAINING,
                                                      "--overwrite-output-dir")] = None,
    set_: Annotated[list[str] | None, _opt(None, PANEL_TRAINING, "--set",
                                           help="Override any config field or TRL GRPOConfig field: "
                                                "--set key=value (repeatable; value read as JSON).")] = None,
    dry_run: Annotated[bool, _opt(None, PANEL_TRAINING, "--dry-run",
                                  help="Validate config, data and rewards; print the effective config as JSON "
                                       "on stdout; load no model.")] = False,
    # ---- Logging & evaluation
    generation_logging: Annotated[bool | None, _opt(
        "enable_generation_logging", PANEL_LOGGING,
        "--enable-generation-logging/--disable-generation-logging")] = None,
    generation_log_dir: Annotated[str | None, _opt("generation_log_dir", PANEL_LOGGING, "--generation-log-dir")] = None,
    max_generation_samples: Annotated[int | None, _opt("max_generation_samples", PANEL_LOGGING,
                                                       "--max-generation-samples")] = None,
    eval_steps: Annotated[int | None, _opt("eval_steps", PANEL_LOGGING, "--eval-steps")] = None,
    wandb_project: Annotated[str | None, _opt("wandb_project", PANEL_LOGGING, "--wandb-project")] = None,
    no_wandb: Annotated[bool, _opt(None, PANEL_LOGGING, "--no-wandb", help="Turn W&B off.")] = False,
    run_name: Annotated[str | None, _opt("run_name", PANEL_LOGGING, "--run-name")] = None,
    verbose: Annotated[bool, _opt(None, PANEL_LOGGING, "--verbose", "-v",
                                  help="Show everything: third-party warnings, every metric, tracebacks.")] = False,
    eval_only: Annotated[bool, _opt(None, PANEL_LOGGING, "--eval-only",
                                    help="Evaluate the adapter given by --resume-from-checkpoint (a checkpoint or "
                                         "an output dir with an adapter): generation log + eval metrics, no "
                                         "training.")] = False,
    # ---- Checkpoints
    save_steps: Annotated[int | None, _opt("save_steps", PANEL_CHECKPOINTS, "--save-steps")] = None,
    save_merged: Annotated[bool | None, _opt("save_merged", PANEL_CHECKPOINTS, "--save-merged")] = None,
    resume_from_checkpoint: Annotated[str | None, _opt(
        None, PANEL_CHECKPOINTS, "--resume-from-checkpoint",
        help="Continue from a checkpoint directory, or 'latest' for the newest in --output-dir.")] = None,
    force_resume: Annotated[bool, _opt(None, PANEL_CHECKPOINTS, "--force-resume",
                                       help="Resume even if the checkpoint's run manifest (config, dataset) "
                                            "differs.")] = False,
    # ---- Listings
    list_models: Annotated[bool, _opt(None, PANEL_MODEL, "--list-models", help="List model presets.")] = False,
    list_datasets: Annotated[bool, _opt(None, PANEL_DATA, "--list-datasets", help="List dataset presets.")] = False,
    list_rewards: Annotated[bool, _opt(None, PANEL_REWARDS, "--list-rewards",
                                       help="List rewards and reward presets.")] = False,
):
    """Fine-tune a language model with GRPO (TRL's GRPOTrainer, Unsloth 4-bit LoRA)."""
    if ctx.invoked_subcommand is not None:
        return  # `report`: its own options
    quiet_third_party(verbose)  # before torch / unsloth / transformers / trl are imported: filters act at the source
    setup_console_logging(verbose)
    from grpokit.run_end import Stopped, stop_on_signals  # not at the top: --help stays instant

    stop_on_signals()  # a signal before training (loading) ends the run with one line; training installs its own
    try:
        if list_models or list_datasets or list_rewards:
            print_listings(list_models, list_datasets, list_rewards)
            return
        if quick_test and production:
            raise UsageError("--quick-test and --production are two different presets: choose one.")
        if preset and (quick_test or production):  # one of them would be dropped without a word
            raise UsageError(f"--preset {preset} and --{'quick-test' if quick_test else 'production'} are two "
                             "different presets: choose one.")
        chosen_preset = "quick_test" if quick_test else "production" if production else preset or "default"
        flags = {
            "model_name": model, "load_in_4bit": load_in_4bit, "lora_r": lora_r, "backend": backend,
            "use_vllm": use_vllm, "vllm_mode": vllm_mode, "vllm_server_host": vllm_server_host,
            "vllm_server_port": vllm_server_port, "generation_engine": generation_engine,
            "generation_threads": generation_threads, "streaming": streaming,
            "dataset": dataset, "dataset_path": dataset_path, "custom_data": custom_data,
            "max_samples": max_samples, "system_prompt": system_prompt, "prompt_field": prompt_field,
            "answer_field": answer_field, "chosen_field": chosen_field, "rejected_field": rejected_field,
            "reward_function_type": reward_function, "reward_config": reward_config,
            "reward_config_name": reward_preset, "custom_rewards": reward or None,
            "tools": tool or None, "environment": environment or None,
            "num_train_epochs": epochs, "max_steps": max_steps, "learning_rate": learning_rate,
            "per_device_train_batch_size": batch_size, "num_generations": num_generations, "seed": seed,
            "output_dir": output_dir, "overwrite_output_dir": overwrite_output_dir,
            "enable_generation_logging": generation_logging,
            "generation_log_dir": generation_log_dir, "max_generation_samples": max_generation_samples,
            "eval_steps": eval_steps, "wandb_project": "" if no_wandb else wandb_project, "run_name": run_name,
            "save_steps": save_steps, "save_merged": save_merged,
        }
        run(chosen_preset, config_file, flags, set_ or [], dry_run, score_completions, resume_from_checkpoint,
            eval_only, force_resume, verbose)
    except UsageError as err:
        if is_main_process():  # under torchrun every rank finds the same problem; one line is enough
            typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except Stopped as stopped:
        if is_main_process():
            typer.echo(f"stopped: {stopped.signal_name} before training started; nothing was trained.", err=True)
        raise typer.Exit(stopped.exit_code) from None


def run(preset, config_file, flags, overrides, dry_run, score_completions, resume_from_checkpoint,
        eval_only=False, force_resume=False, verbose=False) -> None:
    """The story of a run: config -> data -> rewards -> (dry run | reward preview | training) -> summary.
    Everything after parsing is the Python API's GRPOTrainer: one path for the CLI and for Python."""
    from config.loader import build_config, config_to_dict, resolve_model_name
    from grpo_trainer import AlreadyFinished, GRPOTrainer, Interrupted, RunFailed
    from grpokit.run import check_adapter_dir, resolve_checkpoint

    config = build_config(preset, config_file, flags, overrides)
    resolve_model_name(config.model_name)

    if score_completions is not None:
        preview_rewards(config, score_completions)
        return

    trainer = GRPOTrainer(config, verbose=verbose)
    if not dry_run:
        trainer.warm_engine()  # a first GGUF export's converter starts importing now, beside the checks and the load
    trainer.check_run()  # the checks train() makes too, before anything loads: --dry-run reports them as well
    out = Path(config.output_dir).expanduser()
    if eval_only and not resume_from_checkpoint:
        raise UsageError("--eval-only needs an adapter to evaluate: --resume-from-checkpoint PATH (a checkpoint-N "
                         "directory or a finished run's output directory).")
    resume_from = resolve_checkpoint(resume_from_checkpoint, out, eval_only) if resume_from_checkpoint else None
    if resume_from is not None:
        check_adapter_dir(resume_from, config.model_name)  # before any data or model is loaded

    train_ds, eval_ds, report = trainer.load_data()
    reward_set = trainer.build_rewards()

    if dry_run:
        from data_loader import count_prompt_length_drops
        from grpokit.model_loader import choose_backend
        from grpokit.objective import stated as stated_objective
        from rewards.fit import try_user_rewards

        # the user's own reward functions, called once as a step would call them: a broken one fails here, not at
        # the first step after the model has loaded
        try_user_rewards(reward_set, train_ds.select(range(min(4, len(train_ds)))).to_list(), config.reward_timeout,
                         report.source)
        count_prompt_length_drops(train_ds, eval_ds, config, report)
        document = {"config": config_to_dict(config), "preset": preset, "dataset": report.as_dict(),
                    "rewards": {"mode": config.reward_function_type, "components": reward_set.names,
                                "weights": reward_set.weights}, "notices": trainer.notices,
                    # what would load, where, in which precision, and the GPU memory it expects (grpokit/load_plan.py)
                    "load_plan": trainer.load_plan.as_dict() if trainer.load_plan is not None else None,
                    # the loss settings as the trainer will run them, on this machine and any other
                    "objective": stated_objective(config, engine=trainer.load_plan.engine
                                                  if trainer.load_plan is not None else None,
                                                  backend=trainer.backend or choose_backend(config.backend))}
        from grpokit.group_schedule import schedule_from_config

        if trainer.agent is not None and trainer.agent.active:  # the tools, their schemas, template and parser
            document["agent"] = trainer.agent.describe()
        schedule = schedule_from_config(config, int(os.environ.get("WORLD_SIZE", "1")))
        if schedule is not None:  # adaptive_group_size: {logged step: completions per prompt from that step on}
            document["group_size_schedule"] = schedule.changes()
        if is_main_process():  # under a launcher every rank plans the same run: one document on stdout
            print(json.dumps(document, indent=2, ensure_ascii=False, default=str))
        return

    if eval_only:
        out.mkdir(parents=True, exist_ok=True)
    else:
        trainer.check_schedule()
        trainer.claim_output_dir(resume=resume_from is not None)  # lock + a clean directory, before the log opens
    trainer.open_run_log()  # with the notices said before it opened (claim_output_dir's set-aside)
    if eval_only:
        result = trainer.evaluate_adapter(resume_from)
        if is_main_process():
            print_eval_only(result)
        return
    log.debug("Config (preset %s): %s", preset, json.dumps(config_to_dict(config), default=str))
    # The run header says these on the console; the log file keeps them for the record.
    log.debug("Dataset %s: %s rows, dropped %s", report.source, report.rows, report.dropped or "none")
    log.debug("Rewards (%s): %s", config.reward_function_type,
             ", ".join(f"{n} x{w:g}" for n, w in zip(reward_set.names, reward_set.weights, strict=True)))
    try:
        summary = trainer.train(resume_from_checkpoint=resume_from, force_resume=force_resume)
    except AlreadyFinished as done:
        log.info("%s", done)
        return
    except Interrupted as stop:
        log.warning("%s", stop)
        raise typer.Exit(stop.exit_code) from None
    except RunFailed as failed:  # run_end.py: the last completed step is saved; one line says what failed
        log.error("%s", failed)
        raise typer.Exit(failed.exit_code) from None
    if is_main_process():
        print_summary(summary)


def preview_rewards(config, path: Path) -> None:
    """Each row's reward scores on stdout, with the reward a run on the same rows would use (rewards/fit.py)."""
    from data_loader import iter_jsonl
    from grpokit.run import reward_set_for
    from rewards import score_rows
    from rewards.fit import preview_rows, unscorable_components

    rows = []
    for lineno, row in iter_jsonl(path, "--score-completions"):
        if not ("completion" in row or isinstance(row.get("completions"), list)):
            raise UsageError(f"{path}:{lineno}: each row needs 'completion' (a string) or 'completions' (a list).")
        rows.append(row)
    if not rows:
        raise UsageError(f"--score-completions {path} has no rows: give a JSONL file with one object per line, each "
                         "with 'completion' (a string) or 'completions' (a list), and the prompt's columns.")
    # scored against the columns a run maps (GSM8K's final number, an HH transcript's final reply), not the raw text
    data_format, mapped, scored = preview_rows(config, rows)
    reward_set = reward_set_for(config, data_format, [], mapped)
    missing = unscorable_components(reward_set, mapped)
    if missing:  # every row would print null and a total of 0: a run refuses such rewards, so does the preview
        raise UsageError(f"Reward(s) {', '.join(missing)} cannot score any row of {path} ("
                         + "; ".join(f"{name} {why}" for name, why in missing.items())
                         + "): a run would refuse them. Use the data's default reward (no --reward-preset) or a "
                         "preset that fits the rows.")
    for result in score_rows(reward_set, scored, timeout=config.reward_timeout):
        print(json.dumps(result, ensure_ascii=False))


def setup_console_logging(verbose: bool = False) -> None:
    """Run logs on stderr (above the live progress bar), so stdout carries only results (--dry-run JSON,
    --score-completions rows). The console gets the story; grpo_training.log gets every detail (DEBUG)."""
    logger = logging.getLogger("grpo")
    if not logger.handlers:
        logger.addHandler(console_handler(logging.DEBUG if verbose else logging.INFO))
        logger.setLevel(logging.DEBUG)
        logger.propagate = False


def print_listings(models: bool, datasets: bool, rewards: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if models:
        from config.models import MODEL_PRESETS

        # Names and checkpoint ids never wrap or get cut (people copy them); the description takes what is left.
        table = Table("model", "checkpoint", "GPU memory", title="Models", caption="GPU memory: Unsloth's published "
                      "figures for GRPO QLoRA, not measured here")
        table.columns[0].no_wrap = table.columns[1].no_wrap = True
        for name, p in MODEL_PRESETS.items():
            table.add_row(name, p.hub_id, p.published_vram)
        console.print(table)
        for name, p in MODEL_PRESETS.items():
            console.print(f"  {name}: {p.description}")
    if datasets:
        from data_loader import DATASETS

        table = Table("dataset", "source", "kind", "default rewards", title="Datasets")
        for name, spec in DATASETS.items():
            table.add_row(name, spec.description, spec.kind, spec.default_rewards)
        console.print(table)
    if rewards:
        from rewards import REGISTRY, load_reward_config, reward_preset_names

        table = Table("reward", "what it scores", title="Rewards")
        for name, cls in REGISTRY.items():
            table.add_row(name, (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " "))
        console.print(table)
        table = Table("reward preset", "description", title="Reward presets (config/rewards/)")
        for name in reward_preset_names():
            table.add_row(name, load_reward_config(name)[0].get("description", ""))
        console.print(table)


@app.command("report", context_settings={"help_option_names": ["-h", "--help"]})
def report(
    output_dir: Annotated[Path, typer.Argument(metavar="OUTPUT_DIR", show_default=False,
                                               help="A run's --output-dir, or an --eval-only result directory.")],
    plots_only: Annotated[bool, typer.Option("--plots-only", help="Only the PNGs, no report.html.")] = False,
):
    """Redraw a finished (or stopped) run's plots/*.png and report.html from its files alone: no model, no config.

    Example: python train_grpo.py report grpo_outputs/quick_test"""
    from grpokit.report import redraw

    try:
        written = redraw(output_dir, report=not plots_only)
    except UsageError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except OSError as err:  # unreadable or unwritable files: name the file, no traceback
        typer.echo(f"error: {err.filename or output_dir}: {err.strerror or err}", err=True)
        raise typer.Exit(2) from None
    for path in written:
        typer.echo(str(path))


@app.command("export", context_settings={"help_option_names": ["-h", "--help"]})
def export(
    source: Annotated[Path, typer.Argument(metavar="OUTPUT_DIR_OR_CHECKPOINT", show_default=False,
                                           help="A finished run's --output-dir, a checkpoint-N directory or an "
                                                "adapter directory.")],
    format_: Annotated[Literal["gguf", "gguf-lora", "merged"], typer.Option(
        "--format", help="gguf: base + LoRA merged, for llama.cpp / Ollama / LM Studio; gguf-lora: the adapter "
                         "alone (llama.cpp --lora, Ollama ADAPTER); merged: 16-bit safetensors for transformers / "
                         "vLLM.")] = "gguf",
    quant: Annotated[str, typer.Option("--quant", help="GGUF type: f16, bf16, f32, q8_0, q6_k, q5_k_m, q4_k_m, "
                                                       "q4_0, q3_k_m, q2_k ... (any llama.cpp type).")] = "f16",
    output_dir: Annotated[Path | None, typer.Option(
        "--output-dir", "-o", show_default=False,
        help="Where to write (default: SOURCE/export/<format>[-<quant>]).")] = None,
    ollama: Annotated[bool, typer.Option("--ollama", help="Also write an Ollama Modelfile (chat template, stop "
                                                          "tokens): then `ollama create NAME -f Modelfile`.")] = False,
    push_to_hub: Annotated[str | None, typer.Option(
        "--push-to-hub", metavar="REPO_ID", show_default=False,
        help="Upload the export with a model card to this Hugging Face repository (needs a write token).")] = None,
    private: Annotated[bool, typer.Option("--private", help="Create the Hub repository private.")] = False,
    base_model: Annotated[str | None, typer.Option(
        "--base-model", show_default=False,
        help="The 16-bit base to merge into (a directory or hub id), when the run's own cannot be used.")] = None,
    dtype: Annotated[str, typer.Option(
        "--dtype", help="merged: auto (the base's own), bfloat16, float16 or float32 (keeps a small update "
                        "exactly; twice the size).")] = "auto",
    base: Annotated[Literal["auto", "trained", "16bit"], typer.Option(
        "--base", help="What the LoRA merges into. trained: the weights the run computed with (a 4-bit run's base "
                       "rounded through NF4: the model the run evaluated); 16bit: the original 16-bit weights; "
                       "auto: trained, but 16bit for GGUF types of 4 bits or fewer (q4_k_m: quantising the "
                       "rounded weights again loses more).")] = "auto",
    measure: Annotated[bool, typer.Option(
        "--measure/--no-measure", help="Answer the run's held-out prompts with the exported file and compare with "
                                       "the run's final evaluation (one line, and in the model card).")] = True,
):
    """Export a trained adapter: GGUF (llama.cpp, Ollama), a GGUF LoRA, or merged 16-bit weights; optionally to the Hub.

    Example: python train_grpo.py export grpo_outputs/quick_test --quant q4_k_m --ollama"""
    import sys

    from grpokit.export import ExportRequest, command_line, export_adapter

    quiet_third_party()  # before torch / transformers / peft are imported
    setup_console_logging()
    request = ExportRequest(source=source, format=format_, quant=quant, output_dir=output_dir, ollama=ollama,
                            push_to_hub=push_to_hub, private=private, base_model=base_model, dtype=dtype,
                            base=base, measure=measure, command=command_line(sys.argv[1:]))
    try:
        result = export_adapter(request)
    except UsageError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        # each file is written under a temporary name and renamed when complete (grpokit/export.py _staged_file)
        typer.echo("\nexport interrupted: files finished before it are kept, the one being written was removed; "
                   "run the same command again to finish (--no-measure skips answering the held-out prompts).",
                   err=True)
        raise typer.Exit(130) from None
    for path in result.files:
        typer.echo(str(path))
    if result.measurement is not None:  # stderr: stdout lists only the files written
        typer.echo(result.measurement.line(), err=True)
    if result.url:
        typer.echo(result.url)


@app.command("doctor", context_settings={"help_option_names": ["-h", "--help"]})
def doctor(
    report_file: Annotated[Path | None, typer.Option(
        "--report", metavar="FILE", show_default=False, help="Also write the results as JSON to FILE.")] = None,
    skip_run: Annotated[bool, typer.Option("--skip-run", help="Skip the 3-step GRPO run (the slowest check).")] = False,
    model: Annotated[str | None, typer.Option(
        "--model", "-m", show_default=False,
        help="Run the 3 steps on this model (a preset, hub id or directory) instead of a tiny random Llama.")] = None,
):
    """Check this machine: Python, torch, CUDA, bf16, bitsandbytes 4-bit, Unsloth and its GRPO patches, TRL and
    friends, vLLM, the llama.cpp engine, the code sandbox, the GRPO objective, then a real 3-step GRPO run of the
    default path on a tiny random model. One table; exit 0 when every check that ran worked, 1 when one failed.

    Example: python train_grpo.py doctor --report doctor.json"""
    from grpokit.doctor import main as run_doctor

    quiet_third_party()  # before torch / unsloth / transformers are imported
    try:
        code = run_doctor(report=report_file, skip_run=skip_run, model=model)
    except UsageError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def cli() -> None:
    """`python train_grpo.py`: the Typer app, with click's own usage errors (an unknown option, a value that is not
    one of the choices, a missing argument) as one `error:` line and exit 2 like every other bad input, instead of
    Typer's boxed panel."""
    import sys

    import typer.exceptions

    command = typer.main.get_command(app)
    try:
        code = command.main(prog_name="train_grpo.py", standalone_mode=False)  # click returns Exit's code here
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except typer.Abort:
        sys.exit(130)
    except typer.exceptions.TyperException as err:  # click's UsageError family (Typer vendors click)
        if not hasattr(err, "format_message"):
            raise
        typer.echo(f"error: {' '.join(err.format_message().split())} (see --help)", err=True)
        sys.exit(getattr(err, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    cli()

"""One GRPO run, the one path every run takes: the spec's API (grpo_trainer.py) re-exports this class, and the CLI
(train_grpo.py) is a thin shell over it.

A run reads top to bottom: config -> data -> rewards -> model -> TRL trainer -> train -> evaluate -> save. Data and
rewards are checked before the model loads, so bad input never costs a model load. Nothing here calls `sys.exit`:
bad input raises `UsageError`, a fault during training raises `RunFailed`, Ctrl-C raises `Interrupted` (each
after saving what can be saved); the CLI turns them into one line and an exit code.

Heavy libraries (torch, unsloth, trl) are imported inside the methods: importing this module is instant.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from config.errors import UsageError
from config.loader import normalise_layer, resolve_model_name, trl_kwargs, validate
from config.schema import GRPORunConfig
from grpokit.objective import pinned
from grpokit.run_dir import (
    EVAL_METRICS,
    GENERATION_LOGS,
    METRICS_SUMMARY,
    README,
    RUN_CONFIG,
    TRAINER_STATE,
    check_output_dir,
    read_trainer_state,
    run_readme,
)
from grpokit.run_end import AlreadyFinished, Interrupted

log = logging.getLogger("grpo")


class GRPOConfig(GRPORunConfig):
    """Every config field as a keyword argument, checked exactly as a JSON config file or the CLI checks it.

    >>> GRPOConfig(model_name="smollm2-135m", max_smaples=10)
    Traceback (most recent call last):
    config.errors.UsageError: GRPOConfig: unknown config key 'max_smaples'. Did you mean 'max_samples'?

    Built-in defaults apply (no preset); any field of TRL's GRPOConfig may be passed too (e.g. top_p=0.9).
    """

    def __init__(self, **fields: Any):
        checked = normalise_layer(fields, "GRPOConfig")
        super().__init__(**checked)
        self.record_sources(dict.fromkeys([*checked, *checked.get("trl_args", {})], "api"))
        validate(self, world_size=int(os.environ.get("WORLD_SIZE", "1")))


class GRPOTrainer:
    """One GRPO run: `load_model()`, `train(dataset)`, `evaluate()`, `save_model(path)`.

    `reward_funcs`: your own reward functions (TRL's contract, `fn(prompts, completions, **columns) -> list`), added
    to the config's reward set with weight 1 each. Calls out of order do the obvious thing: `train` before
    `load_model` loads the model; `evaluate`/`save_model` before anything is loaded raise a UsageError that says so.
    """

    def __init__(self, config: GRPORunConfig | dict[str, Any] | None = None, reward_funcs: list | None = None,
                 verbose: bool = False):
        if config is None:
            config = GRPOConfig()
        elif isinstance(config, dict):
            config = GRPOConfig(**config)
        elif not isinstance(config, GRPORunConfig):
            raise UsageError(f"GRPOTrainer(config): expected a GRPOConfig or a dict of config fields, not "
                             f"{type(config).__name__}.")
        self.config = config
        from grpokit.console import quiet_third_party

        # The Python API is as quiet as the CLI: known-harmless third-party noise is filtered at its source, before
        # load_model imports torch / unsloth / transformers (verbose=True shows everything).
        quiet_third_party(verbose)
        self.extra_reward_funcs = list(reward_funcs or [])
        self.verbose = verbose
        self.backend: str | None = None
        self.model = None
        self.tokenizer = None
        self.trainer = None  # TRL's GRPOTrainer (our subclass), built by train()/evaluate()
        self.train_dataset = None
        self.eval_dataset = None
        self.data_report = None
        self.reward_set = None
        self.generation_logger = None
        self.resume_from: Path | None = None
        self.manifest: dict[str, Any] | None = None
        self.claimed: Path | None = None  # the output dir this run has locked and cleared (claim_output_dir)
        self.clock = None  # callbacks.TrainClock of the training trainer: the run's one training time
        self.generation_engine = None  # the run's engine (grpokit.engines), kept across its trainers
        self.engine_choice: tuple[str, str] | None = None  # (engine, why), chosen before the model loads
        self.notices: list[str] = []  # settings the run adjusted, said once in the log and in the summary
        self.sft_columns: tuple[str, ...] = ()  # where sft_loss_weight reads each row's reference (build_rewards)
        self.load_plan = None  # grpokit.load_plan.LoadPlan: checked by check_run, followed by load_model
        self._engine_warmed: bool | None = None  # warm_engine's answer, once asked (the CLI, train, load_model ask)
        self.objective = None  # grpokit.objective: the loss settings the built trainer trains with
        self.agent = None  # grpokit.agents.AgentPlan: the tools and environments (check_run)
        self._trainer_args_first = None  # ZeRO-3: TRL's args built before the model (kept alive, see load_model)
        self._started = time.perf_counter()
        from grpokit.cpu_threads import ThreadPlan

        # [cpu_threads] threads for sampling and training from the cores really free; its first look at the machine
        # spans the model load
        self.threads = ThreadPlan(config.generation_threads)

    # ---- data and rewards (no model needed) ----------------------------------------------------------------------
    def load_data(self, dataset=None):
        """The training (and eval) rows: the config's dataset, or `dataset` (a `datasets.Dataset` of mapped rows,
        what `create_grpo_dataloader` returns, or a list of dicts). Returns (train, eval or None, report)."""
        from data_loader import as_grpo_dataset, load_for_config

        config = self.config
        if dataset is None:
            self.train_dataset, self.eval_dataset, self.data_report = load_for_config(config)
        else:
            self.train_dataset, self.eval_dataset, self.data_report = as_grpo_dataset(dataset, config)
        self.reward_set = None  # the default reward set depends on the data
        return self.train_dataset, self.eval_dataset, self.data_report

    def build_rewards(self, explicit: bool | None = None):
        """The reward set for the data: the config's file or preset, else the data's default.

        `explicit`: whether the rewards were asked for by the user (a flag, a file, --set, GRPOConfig) or came from a
        preset; by default the config builder's record of who set `reward_config_name` / `reward_config` says.
        A preset's rewards that cannot score this data are replaced by the data's default with a notice; rewards
        the user asked for are refused with the fix."""
        from rewards import check_columns
        from rewards.fit import default_reward_preset, unscorable_components

        if self.train_dataset is None:
            self.load_data()
        config, report = self.config, self.data_report
        if explicit is None:
            explicit = config.named_by_user("reward_config_name", "reward_config")
        columns = set(self.train_dataset.column_names)
        rows = self.train_dataset
        reward_set = reward_set_for(config, report.format, self.extra_reward_funcs, rows, report.dataset)
        missing = unscorable_components(reward_set, rows)
        if missing or not _columns_fit(reward_set, columns):
            default = default_reward_preset(report.format, rows, report.dataset)
            # the preset that failed: no preset named and no file is the data's default already (no fallback to it)
            failed = config.reward_config_name or ("" if config.reward_config else default)
            if not explicit and default != failed:
                notice = (f"reward preset '{config.reward_config_name}' cannot score {report.source} "
                          f"({_why(missing, reward_set, columns)}): using the data's default, '{default}'.")
                config.reward_config_name, config.reward_config = default, ""
                reward_set = reward_set_for(config, report.format, self.extra_reward_funcs, rows, report.dataset)
                missing = unscorable_components(reward_set, rows)
                failed = default
                if not missing:  # said only when the default can score the data: else the one error line below
                    self.notices.append(notice)
                    log.warning("%s", notice)
            if missing:
                fix = (f"Use --reward-preset {default} or data with the columns they need" if default != failed else
                       f"'{default}' is this data's default: give the rows what it scores against (non-empty "
                       "answers, references), or a preset that needs none (--reward-preset keywords)")
                raise UsageError(
                    f"Reward(s) {', '.join(missing)} cannot score any row of {report.source} ({_why(missing, reward_set, columns)}): "
                    f"the run would learn nothing from it. {fix}.")
        check_columns(reward_set, columns, report.source)
        _check_reward_metrics(config, reward_set, columns, report.source)
        from rewards.code import check_isolation, check_layouts

        # model-written code where the sandbox has no namespaces: refused unless allow_unsandboxed_code (CLI, API)
        check_isolation(config, reward_set, columns, report.source)
        check_layouts(reward_set, rows, report.source)  # tests the code reward cannot run: refused, any row
        from grpokit.mixed_loss import check_reference

        # sft_loss_weight: data without a reference reply is refused here, before any model loads (CLI and API)
        self.sft_columns = check_reference(config, self.train_dataset, report.source)
        self.reward_set = reward_set
        return reward_set

    # ---- checks that guard a run (no model needed) -----------------------------------------------------------------
    def check_run(self) -> None:
        """Everything that would make a run fail after the model has loaded, or at its very end, refused now with one
        line: an output directory we cannot write, W&B missing or not
        logged in, vLLM without CUDA, llama_cpp named with settings it lacks, a 4-bit merge on a machine that cannot merge into 4-bit, a GPU load plan that
        cannot work or fit. `train()` and `evaluate_adapter()` call it before loading; the CLI calls it first of all
        (so --dry-run says it too)."""
        from grpokit.load_plan import detect_machine

        config = self.config
        resolve_model_name(config.model_name)  # a directory without config.json fails only once the run has begun
        check_lora_rank(config)
        check_output_dir(config.output_dir)
        if config.generation_log_dir:
            check_output_dir(config.generation_log_dir, "--generation-log-dir", "Generation log directory")
        if config.wandb_project:
            check_wandb()
        machine = detect_machine()  # no torch import on a machine without a GPU driver
        if (config.use_vllm or config.fast_inference) and not machine.cuda:
            raise UsageError("vLLM generation (use_vllm / fast_inference) needs a CUDA GPU; this machine has "
                             "none. Drop --use-vllm to generate with transformers.")
        if config.save_merged and config.load_in_4bit and not machine.cuda:
            # Refused now, not after training: merging into 4-bit weights needs Unsloth's GPU path.
            raise UsageError("--save-merged with 4-bit weights needs a GPU (Unsloth's CPU backend cannot merge "
                             "into 4-bit): add --no-4bit, or merge later on a GPU.")
        if config.generation_engine == "llama_cpp":  # asked for by name: settings it cannot sample with, refused now
            from grpokit.trl_engine_adapter import check_llama_cpp_settings

            check_llama_cpp_settings(trl_kwargs(config))
        plan = self.plan_load(machine=machine)  # GPU plans that cannot work or fit are refused here (CPU never are)
        if plan.cuda and plan.engine == "vllm":
            from grpokit.trl_engine_adapter import importable_engine

            engine = importable_engine(plan.engine, plan.engine_reason)
            if engine[0] != plan.engine:  # a vllm that does not import: --dry-run plans what the run will use
                self.plan_load(engine, machine)
        self.plan_agent()

    def plan_agent(self):
        """[agents] The tools and environments the model may call, resolved and turned into schemas, and the chat
        template family: a tool that does not import or cannot become a schema is refused here, before loading."""
        from grpokit.agents import plan

        if self.agent is None:
            self.agent = plan(self.config)
        return self.agent

    def plan_load(self, engine: tuple[str, str] | None = None, machine=None):
        """The load plan for this machine (grpokit/load_plan.py), kept on the run; a GPU plan that cannot work (4-bit
        weights into TRL's vLLM, bf16 on a card without it, more memory than the card has) raises its one line."""
        from grpokit.load_plan import detect_machine, plan_load
        from grpokit.model_loader import choose_backend

        backend = self.backend or choose_backend(self.config.backend)
        self.load_plan = plan_load(self.config, machine or detect_machine(), backend, engine)
        if self.load_plan.refusal:
            raise UsageError(self.load_plan.refusal)
        return self.load_plan

    def check_schedule(self) -> None:
        """A run that would train nothing is refused before anything loads: max_steps 0, fewer training prompts than
        one optimizer step takes, or an epoch count that rounds to no step."""
        config, n = self.config, len(self.train_dataset)
        if config.max_steps == 0:
            raise UsageError("max_steps is 0: nothing would be trained. Give a positive --max-steps, or leave it out "
                             "(-1) to train for --epochs.")
        world = int(os.environ.get("WORLD_SIZE", "1"))
        per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps * world
        prompts = max(1, per_step // config.num_generations)
        if n < prompts:
            raise UsageError(
                f"{self.data_report.source} has {n} training prompt(s); one optimizer step takes {prompts} "
                f"({per_step} completions / {config.num_generations} per prompt): add data, or lower --batch-size / "
                "gradient_accumulation_steps.")
        if config.max_steps < 0 and int(config.num_train_epochs * (n // prompts)) == 0:
            raise UsageError(
                f"--epochs {config.num_train_epochs:g} over {n // prompts} step(s) per epoch rounds to 0 steps: "
                "raise --epochs or give --max-steps.")

    def claim_output_dir(self, resume: bool) -> Path:
        """One output directory, one run. Takes the directory's lock (a second live run is refused naming its PID);
        a new run (not a resume) into a directory that holds an earlier run's files starts clean: a finished run's
        files are moved into previous_runs/<UTC time>/ (nothing is deleted), so re-running a command into its own
        output dir just works and never borrows the old baseline or checkpoints. An unfinished run (checkpoints, no
        summary) is refused with the two fixes, because continuing it is what a re-run most often means; with
        overwrite_output_dir it is set aside too."""
        from datetime import UTC, datetime

        from grpokit.checkpoints import checkpoints_by_step, hold_output_lock
        from grpokit.console import is_main_process
        from grpokit.run_dir import PREVIOUS_RUNS, finished, run_files, set_aside_previous_run

        out = Path(self.config.output_dir).expanduser()
        if self.claimed == out:  # the CLI claims it before opening the log; train() then finds it already done
            return out
        out.mkdir(parents=True, exist_ok=True)
        hold_output_lock(out)  # one run per output dir (a second one: UsageError naming the PID)
        self.claimed = out
        if resume or not is_main_process() or not run_files(out):
            return out
        checkpoints = checkpoints_by_step(out)
        if checkpoints and not finished(out) and not self.config.overwrite_output_dir:
            raise UsageError(
                f"{out} holds an unfinished run (newest {checkpoints[-1].name}): continue it with "
                "--resume-from-checkpoint latest, or start over with --overwrite-output-dir (its files are moved to "
                f"{PREVIOUS_RUNS}/), or choose another --output-dir.")
        moved = set_aside_previous_run(out, datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
        # short enough for one 80-column line; the output dir is in the header
        notice = f"earlier run's files moved to {moved.relative_to(out) if moved else PREVIOUS_RUNS}/"
        self.notices.append(notice)
        log.info("%s", notice)
        return out

    # ---- model -----------------------------------------------------------------------------------------------------
    def load_model(self):
        """Load the model and tokenizer with LoRA adapters through the configured backend. Returns (model, tokenizer)."""
        from grpokit.load_plan import detect_machine
        from grpokit.model_loader import choose_backend, import_backend, load_model

        started = time.perf_counter()
        self.warm_engine()
        self.backend = import_backend(choose_backend(self.config.backend))  # Unsloth before trl / transformers
        import torch

        from grpokit.trl_engine_adapter import (
            resolve_engine,  # [engines] before the load: choosing vllm changes how it loads
        )

        machine = detect_machine()
        self.engine_choice = resolve_engine(self.config, self.backend, machine.cuda)
        plan = self.plan_load(self.engine_choice, machine)
        if plan.trainer_args_first:
            self._trainer_args_first = self._zero3_trainer_args()
        cached_nf4 = None
        if self.engine_choice[0] == "llama_cpp":  # 4-bit on CPU: the engine's GGUF of an earlier run holds the rounding
            from grpokit.gguf_export import cached_nf4_weights as cached_nf4
        self.model, self.tokenizer = load_model(self.config, self.backend, self.engine_choice[0], plan, cached_nf4)
        agent = self.plan_agent()
        if agent.active:  # [agents] the tool template and parser on the tokenizer TRL gets
            from grpokit.agents import prepare_tokenizer

            agent.family = prepare_tokenizer(self.tokenizer, agent.family)
        device = "CUDA" if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
        log.info("Backend: %s (torch %s, %s); model %s loaded in %.1f s", self.backend, torch.__version__, device,
                 self.config.model_name, time.perf_counter() - started, extra={"file_only": True})
        log.info("Model loaded in %.1f s (%s, %s)", time.perf_counter() - started, self.backend, device)  # 80 columns
        return self.model, self.tokenizer

    def warm_engine(self) -> bool:
        """[engines] Start in the background what the generation engine's first use here will need: llama.cpp's GGUF
        converter where the CPU engine will export this model for the first time (trl_engine_adapter.
        warm_engine_export), so that its imports run beside the checks, the embedded model's first conversion and the
        model's load. The CLI calls it before its checks (not for --dry-run); load_model(), train() and
        evaluate_adapter() call it too (the first call decides).
        True if a converter was started for this run (asked again, the first answer: no second look at the model)."""
        from grpokit.load_plan import detect_machine
        from grpokit.trl_engine_adapter import warm_engine_export

        if self._engine_warmed is None:
            self._engine_warmed = warm_engine_export(self.config, detect_machine().cuda)
        return self._engine_warmed

    def _zero3_trainer_args(self):
        """TRL's args before the model loads, kept alive on the run: under `accelerate launch` with DeepSpeed they
        register ZeRO-3 with transformers (transformers/training_args.py, DeepSpeedPlugin().set_deepspeed_weakref();
        accelerate/utils/dataclasses.py keeps the HfDeepSpeedConfig only weakly), so from_pretrained loads each rank's
        shard under zero.Init instead of the whole model per rank."""
        from trl import GRPOConfig as TRLConfig

        kwargs = grpo_config_kwargs(self.config, self.eval_dataset is not None, None, self.load_plan)
        return TRLConfig(**kwargs)

    # ---- training --------------------------------------------------------------------------------------------------
    def train(self, dataset=None, resume_from_checkpoint: str | os.PathLike | None = None,
              force_resume: bool = False) -> dict[str, Any]:
        """Train; returns the run summary (also written to OUTPUT_DIR/metrics_summary.json).

        `dataset`: as for `load_data` (default: the config's dataset). `resume_from_checkpoint`: a checkpoint-N
        directory or 'latest'. A run already at the end of its schedule trains nothing and says so."""
        from grpokit.checkpoints import build_manifest, check_resume

        config = self.config
        self.warm_engine()
        self.check_run()
        if dataset is not None or self.train_dataset is None:
            self.load_data(dataset)
        if self.reward_set is None:
            self.build_rewards()
        out = Path(config.output_dir)
        if resume_from_checkpoint:
            self.resume_from = resolve_checkpoint(str(resume_from_checkpoint), out)
        self.manifest = build_manifest(_config_dict(config), dataset_fingerprint(self.train_dataset))
        if self.resume_from is not None:
            check_resume(self.resume_from, self.manifest, force_resume)
            self._check_not_finished(self.resume_from)
        self.check_schedule()
        self.claim_output_dir(resume=self.resume_from is not None)
        opened = self.open_run_log()
        try:
            if self.model is None:
                self.load_model()
            self._filter_long_prompts()
            trainer = self._build_trainer(training=True)
            if trainer.is_world_process_zero():
                self._print_header(trainer)
            return self._run(trainer)
        finally:
            if opened is not None:  # a later run in this process writes to its own output dir's log only
                opened()

    def open_run_log(self):
        """OUTPUT_DIR/grpo_training.log takes the run's log lines from here on (rank 0), with the notices said before
        it opened (claim_output_dir's set-aside, a replaced reward preset), and ./grpo_training.log links to it
        (run_dir.link_latest_log). Returns a function that closes it, or
        None where the log was already open (the CLI opens it first) or on another rank."""
        from grpokit.console import add_file_logging, is_main_process
        from grpokit.run_dir import TRAINING_LOG, link_latest_log

        if not is_main_process():
            return None
        path = Path(self.config.output_dir).expanduser() / TRAINING_LOG
        close = add_file_logging(path)
        if close is not None:
            for notice in [*self.notices, *self._sandbox_lines()]:
                log.info("%s", notice, extra={"file_only": True})
            link_latest_log(path)  # ./grpo_training.log, where the spec's `tail -f` looks
        return close

    def _sandbox_lines(self) -> list[str]:
        """What the code sandbox enforces on this machine, for the run's log file (the console said it when the reward
        was built, before the file opened): only where a code reward runs code here."""
        from rewards.code import CodeExecution

        components = self.reward_set.components if self.reward_set is not None else []
        if not any(isinstance(c, CodeExecution) and not c.sandbox_url for c in components):
            return []
        from rewards.code import sandbox

        return [sandbox.describe()]

    def _print_header(self, trainer) -> None:
        """The start of the run on one screen: model, backend, engine, data, rewards, steps and batch shape (the
        whole config is in grpo_training.log and run_config.json)."""
        from grpokit.console import print_header
        from grpokit.objective import describe as describe_objective

        config, report, args = self.config, self.data_report, trainer.args
        engine = self.engine_choice or ("transformers", "")
        running = self.generation_engine
        if running is not None:
            engine = (f"{engine[0]}, {running.threads} threads", engine[1])
        dropped = sum(n for reasons in report.dropped.values() for n in reasons.values())
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        steps = args.max_steps if args.max_steps > 0 else f"{args.num_train_epochs:g} epoch(s)"
        print_header([
            ("model", f"{config.model_name} ({self.backend}, {'4-bit' if config.load_in_4bit else '16-bit'} "
                      f"LoRA r{config.lora_r})"),
            ("engine", f"{engine[0]}" + (f" ({engine[1]})" if engine[1] else "")),
            ("threads", self.threads.describe()),
            ("data", f"{len(self.train_dataset)} train / "
                     f"{len(self.eval_dataset) if self.eval_dataset is not None else 0} held-out prompts from "
                     f"{report.source}" + (f"; {dropped} rows dropped (see the log)" if dropped else "")),
            ("rewards", f"{config.reward_function_type}: " + ", ".join(
                f"{n} x{w:g}" for n, w in zip(self.reward_set.names, self.reward_set.weights, strict=True))),
            *([("tools", self.agent.headline())] if self.agent is not None and self.agent.active else []),
            ("steps", f"{steps}, {_group_shape(config, per_step)} per step, lr {config.learning_rate:g}"),
            ("loss", describe_objective(self.objective)),
            ("output", str(Path(config.output_dir)))  # one spelling: Path drops "./",
        ])

    def _check_not_finished(self, checkpoint: Path) -> None:
        """Resume means continue: a checkpoint at the end of the schedule it was trained for is a finished run,
        unless max_steps now asks for more (extending a run; the schedule is then re-planned, see trl_trainer)."""
        state = read_trainer_state(checkpoint)
        step, planned = state.get("global_step", 0), state.get("max_steps", 0)
        wanted = self.config.max_steps if self.config.max_steps > 0 else planned
        if step >= wanted:
            raise AlreadyFinished(
                f"{checkpoint} is step {step} of a run planned for {planned} steps: the run is finished, nothing to "
                f"train. To train further, raise --max-steps above {step}.")
        if wanted != planned:
            log.info("Extending the run from %d to %d steps: the learning-rate schedule is re-planned for %d steps "
                     "from step %d.", planned, wanted, wanted, step)

    def _filter_long_prompts(self) -> None:
        from data_loader import filter_long_prompts

        self.train_dataset, self.eval_dataset = filter_long_prompts(
            self.train_dataset, self.eval_dataset, self.tokenizer, self.config.max_prompt_length, self.data_report)
        for split, reasons in self.data_report.dropped.items():
            for reason, count in reasons.items():
                log.info("Dropped %d %s rows: %s", count, split, reason)
        log.debug("Data: %d train prompts, %s", len(self.train_dataset),  # the run header shows it
                 f"{len(self.eval_dataset)} held-out eval prompts" if self.eval_dataset is not None
                 else "no held-out eval split (evaluations use training prompts and are labelled so)")

    def _build_trainer(self, training: bool, output_dir: Path | None = None):
        """TRL's GRPOTrainer (our subclass in trl_trainer.py) on the config, with our callbacks."""
        import torch
        from trl import GRPOConfig as TRLConfig

        from grpokit.advantages import Options as AdvantageOptions
        from grpokit.callbacks import (
            BestCheckpoint,
            GenerationLogger,
            LearningSignalCheck,
            LogLinesCallback,
            TrainClock,
            WandbRunConfig,
        )
        from grpokit.checkpoints import DeterministicSampling, ManifestWriter
        from grpokit.group_schedule import schedule_from_config
        from grpokit.model_loader import model_path
        from grpokit.objective import keep as keep_objective
        from grpokit.objective import of_trainer
        from grpokit.trl_engine_adapter import start_engine
        from grpokit.trl_trainer import TRLGRPOTrainer
        from rewards import build_reward_functions

        config = self.config
        reward_funcs, reward_weights = build_reward_functions(self.reward_set, config.reward_function_type,
                                                              timeout=config.reward_timeout)
        if config.wandb_project and training:
            os.environ["WANDB_PROJECT"] = config.wandb_project
        kwargs = grpo_config_kwargs(config, self.eval_dataset is not None, reward_weights, self.load_plan)
        if output_dir is not None:
            kwargs.update(output_dir=str(output_dir), report_to="none", save_strategy="no")
            # this trainer saves nothing, so there is no best checkpoint to track or reload (transformers refuses
            # load_best_model_at_end without saves that line up with the evaluations: sft_grpo_qa sets it)
            for key in ("load_best_model_at_end", "metric_for_best_model", "greater_is_better"):
                kwargs.pop(key, None)
        if not torch.cuda.is_available():
            kwargs.setdefault("use_cpu", True)  # transformers refuses bf16 without a GPU unless told it is a CPU run
        share_prompts = config.share_prompts
        if share_prompts and self.backend == "unsloth" and torch.cuda.is_available():
            # Unsloth's GPU trainer scores the policy inside its fused loss (unsloth_zoo grpo_accumulated_loss), which
            # has its own shared-prefix forward (PrefixGrouper) for blocks of consecutive rows with one prompt.
            log.info("share_prompts: not used with Unsloth's GPU trainer (its fused loss computes log-probs with its "
                     "own kernels and its own shared-prefix forward, UNSLOTH_GRPO_PREFIX_GROUPER).")
            share_prompts = False
        self.threads.update()  # before the engine starts: it takes the chosen count
        # [engines] the chosen generation engine, built once and kept across the run's trainers
        self.generation_engine, self.engine_choice = start_engine(
            config, self.engine_choice, self.model, model_path(config.model_name, config.load_in_4bit), kwargs,
            self.generation_engine)
        self.threads.engine = self.generation_engine
        args = TRLConfig(**kwargs)
        keep_objective(args, kwargs)  # what a config class rewrote (Unsloth's generated one on a GPU), put back
        from grpokit.agents import trainer_kwargs

        trainer = TRLGRPOTrainer(model=self.model, processing_class=self.tokenizer, reward_funcs=reward_funcs,
                                 **trainer_kwargs(self.plan_agent()), args=args, train_dataset=self.train_dataset,
                                 eval_dataset=self.eval_dataset, share_prompts=share_prompts,
                                 generation_engine=self.generation_engine,
                                 advantage_options=AdvantageOptions.from_config(config),
                                 sft_loss_weight=config.sft_loss_weight, grpo_loss_weight=config.grpo_loss_weight,
                                 sft_columns=self.sft_columns,
                                 group_schedule=schedule_from_config(config, int(os.environ.get("WORLD_SIZE", "1"))),
                                 eval_loss=config.beta != 0 or config.sft_loss_weight > 0)
        self.objective = of_trainer(trainer, config)  # what its loss reads: the header and run_config.json say it
        trainer.add_callback(LogLinesCallback())
        if training:
            trainer.add_callback(self.threads.callback())  # re-checks the cores before every step
            self.clock = TrainClock()  # before the callbacks that log: its figure joins each step's log
            trainer.add_callback(self.clock)
            trainer.add_callback(LearningSignalCheck())
            trainer.add_callback(DeterministicSampling())
            if self.manifest is not None:
                trainer.add_callback(ManifestWriter(self.manifest))
            if config.wandb_project:
                # after TRL's W&B callback, so its run exists when ours adds the config
                trainer.add_callback(WandbRunConfig(_config_dict(config)))
        self.generation_logger = None
        if config.enable_generation_logging:
            held_out = self.eval_dataset is not None
            source = self.eval_dataset if held_out else self.train_dataset
            rows = [source[i] for i in range(min(config.max_generation_samples, len(source)))]
            log_dir = output_dir or Path(config.generation_log_dir or Path(config.output_dir) / GENERATION_LOGS)
            self.generation_logger = GenerationLogger(
                rows, self.tokenizer, self.reward_set, log_dir,
                max_new_tokens=config.generation_max_new_tokens or config.max_completion_length,
                is_main_process=trainer.is_world_process_zero(), pass_k=config.eval_pass_k,
                temperature=config.temperature, held_out=held_out, trainer=trainer,
                max_batch=self.load_plan.eval_batch if self.load_plan is not None else 0)
            if training:
                trainer.add_callback(self.generation_logger)
        if training and kwargs.get("metric_for_best_model"):
            trainer.add_callback(BestCheckpoint(kwargs["metric_for_best_model"], Path(config.output_dir)))
        from grpokit.console import install_progress, remove_console_callbacks

        if training:
            install_progress(trainer)  # one Rich bar (plain lines when not a terminal) instead of tqdm + dicts
        else:
            remove_console_callbacks(trainer)  # --eval-only: print_eval_only says the figures
        self.trainer = trainer
        return trainer

    def _run(self, trainer) -> dict[str, Any]:
        from grpokit.checkpoints import latest_complete_checkpoint
        from grpokit.run_end import GracefulStop, Stopped, fault_guard

        stop = GracefulStop()
        trainer.add_callback(stop)
        resume = str(self.resume_from) if self.resume_from is not None else None
        out = Path(self.config.output_dir)
        try:
            # run_end.py: anything that raises from here to the last file written (training, the final evaluation,
            # the final save on a full disk) saves the last completed step and becomes one RunFailed line.
            with fault_guard(trainer, verbose=self.verbose):
                try:
                    train_result = trainer.train(resume_from_checkpoint=resume)
                except Stopped as stopped:  # a second signal: at once, without saving this step
                    if not stop.aborted:
                        raise
                    saved = latest_complete_checkpoint(out, set_aside_incomplete=False)
                    where = (f"the latest checkpoint is {saved}; resume with the same command plus "
                             "--resume-from-checkpoint latest" if saved is not None else "no checkpoint was saved yet")
                    raise Interrupted(f"{stopped.signal_name} again at step {trainer.state.global_step + 1}: stopped at "
                                      f"once, that step not saved; {where}.", stopped.exit_code) from None
                train_seconds = self.clock.seconds()
                if stop.signal_name is None:
                    try:
                        summary = self._finish(trainer, train_result, train_seconds, stop)
                    except Stopped as stopped:  # during the final evaluation: the trained weights are kept
                        stop.phase = "saving"
                        self.save_model()
                        trainer.save_state()  # trainer_state.json: --eval-only labels the adapter with its step
                        if trainer.is_world_process_zero():  # the finished run's effective config, as at its end
                            self._write_run_config(out)
                        raise Interrupted(
                            f"{stopped.signal_name} during the final evaluation: training finished at step "
                            f"{trainer.state.global_step} and the adapter is saved in {out}; evaluate it with "
                            f"--eval-only --resume-from-checkpoint {out}.", stopped.exit_code) from None
        finally:
            stop.restore()
        if stop.signal_name is not None and stop.phase == "saving":
            raise Interrupted(f"{stop.signal_name} during the final save: the run finished at step "
                              f"{trainer.state.global_step} and its files are written in {out}.", stop.exit_code)
        if stop.signal_name is not None:
            checkpoint = out / f"checkpoint-{trainer.state.global_step}"
            raise Interrupted(
                f"{stop.signal_name} at step {trainer.state.global_step}: checkpoint saved to {checkpoint}. Resume "
                f"with the same command plus --resume-from-checkpoint {checkpoint} (or 'latest').", stop.exit_code)
        # Every rank says where it ended, so a multi-process run shows that all ranks agree (one process: the log
        # file only; the summary below says the step).
        log.info("rank %d of %d finished at global step %d", trainer.args.process_index, trainer.args.world_size,
                 trainer.state.global_step, extra={"file_only": trainer.args.world_size == 1})
        return summary

    def _finish(self, trainer, train_result, train_seconds, stop=None) -> dict[str, Any]:
        """The final evaluation, the summary and every output file. `stop` (run_end.GracefulStop) learns the phase:
        a signal abandons the evaluation at once, but waits for the files to be written."""
        if stop is not None:
            stop.phase = "evaluating"
        # Always end with an evaluation of the final weights, and only one: when the training loop already evaluated
        # this step (eval_steps divides it, or transformers' end-of-training evaluation), its numbers are the answer
        # (a second sampled evaluation of the same weights would disagree with the first and cost as much again).
        step = trainer.state.global_step
        if self.eval_dataset is not None:
            eval_metrics = _evaluated_at(trainer, step) or self._trl_evaluate(trainer)
        else:
            eval_metrics = {}
            logger = self.generation_logger
            if logger is not None and not (logger.history and logger.history[-1]["global_step"] == step):
                logger.log_generations(trainer.model, step)
        if stop is not None:
            stop.phase = "saving"
        summary = self._summary(trainer, train_result, eval_metrics, train_seconds)
        self.save_model()
        trainer.save_state()  # trainer_state.json: the full log history
        if trainer.is_world_process_zero():
            self._write_outputs(summary)
        return summary

    # ---- evaluation ------------------------------------------------------------------------------------------------
    def evaluate(self, dataset=None) -> dict[str, Any]:
        """TRL's sampled evaluation on the held-out split (or `dataset`) plus a greedy generation log; returns the
        metrics. Needs a model: after `train()` it evaluates the trained adapter."""
        if self.model is None:
            raise UsageError("evaluate() needs a model: call load_model() (and train(), or load an adapter) first.")
        if dataset is not None:
            from data_loader import as_grpo_dataset

            self.eval_dataset, _, _ = as_grpo_dataset(dataset, self.config)
        if self.train_dataset is None:
            self.load_data()
        if self.reward_set is None:
            self.build_rewards()
        trainer = self.trainer or self._build_trainer(training=False)
        if self.eval_dataset is None:
            raise UsageError("evaluate(): there is no held-out eval split; pass evaluate(dataset) with eval rows "
                             "or set eval_fraction > 0.")
        metrics = self._trl_evaluate(trainer)
        if self.generation_logger is not None:
            greedy = self.generation_logger.log_generations(trainer.model, trainer.state.global_step)
            if greedy:
                metrics["greedy_reward"] = greedy["reward_mean"]
        return metrics

    def evaluate_adapter(self, adapter_dir: Path) -> dict[str, Any]:
        """`--eval-only`: load a saved adapter onto the base model, write a generation log, eval metrics and the
        run report into OUTPUT_DIR/eval_only/<adapter>-step_<N>/; the adapter is not modified."""
        self.warm_engine()
        self.check_run()
        adapter_config = check_adapter_dir(adapter_dir, self.config.model_name)
        if self.train_dataset is None:
            self.load_data()
        if self.reward_set is None:
            self.build_rewards()
        config = self.config
        # The adapter's own shape, whatever the config says, so its weights fit.
        config.lora_r, config.lora_alpha = adapter_config["r"], adapter_config["lora_alpha"]
        config.lora_target_modules = sorted(adapter_config["target_modules"])
        self.load_model()
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        result = set_peft_model_state_dict(self.model, load_file(str(adapter_dir / "adapter_model.safetensors")))
        if getattr(result, "unexpected_keys", None):
            raise UsageError(f"{adapter_dir}: adapter weights do not fit {config.model_name} "
                             f"({len(result.unexpected_keys)} unexpected tensors).")
        self._filter_long_prompts()
        held_out = self.eval_dataset is not None
        if not held_out:
            self.eval_dataset = self.train_dataset.select(range(min(len(self.train_dataset),
                                                                    config.max_eval_samples or 64)))
        step = read_trainer_state(adapter_dir)["global_step"] if (adapter_dir / TRAINER_STATE).exists() else 0
        out = eval_only_dir(config.output_dir, adapter_dir, step)
        out.mkdir(parents=True, exist_ok=True)
        trainer = self._build_trainer(training=False, output_dir=out)
        greedy = (self.generation_logger.log_generations(trainer.model, step) or {}) if self.generation_logger else {}
        metrics = self._trl_evaluate(trainer)
        result = {"adapter": str(adapter_dir), "global_step": step, "held_out": held_out,
                  "eval": metrics, "generation_log": greedy, "output_dir": str(out)}
        (out / EVAL_METRICS).write_text(json.dumps(result, indent=2, default=str) + "\n")
        _write_report(out)
        return result

    @staticmethod
    def _trl_evaluate(trainer) -> dict[str, Any]:
        """trainer.evaluate(), plus the reward metrics TRL logs but does not return (eval_reward, eval_rewards/...),
        minus counters that mean nothing for an evaluation (eval_num_tokens is the training token count)."""
        metrics = dict(trainer.evaluate())
        for entry in reversed(trainer.state.log_history):
            if "eval_reward" in entry:
                metrics.update({k: v for k, v in entry.items() if k.startswith("eval_")})
                break
        metrics.pop("eval_num_tokens", None)
        return metrics

    # ---- saving ----------------------------------------------------------------------------------------------------
    def save_model(self, path: str | os.PathLike | None = None) -> Path:
        """Save the LoRA adapter and tokenizer (default: config.output_dir); with save_merged, also a merged 16-bit
        model in <path>/merged_16bit. Returns the directory."""
        if self.model is None:
            raise UsageError("save_model() needs a model: call load_model() and train() first.")
        out = Path(path or self.config.output_dir)
        if self.trainer is not None:
            self.trainer.save_model(str(out))  # rank 0 writes; handles wrapped (DDP/FSDP) models
            main = self.trainer.is_world_process_zero()
        else:
            out.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(str(out))
            main = True
        if main:
            self.tokenizer.save_pretrained(str(out))
            state = self.trainer.state if self.trainer is not None else None
            verify_adapter(out, state.log_history if state else (), self.config.max_completion_length)
            if self.config.save_merged:
                engine = self.generation_engine
                if hasattr(engine, "unshare_weights"):
                    # the trainer's own bf16 weights back: Unsloth then merges them in float32 exactly as in a run
                    # without the engine, and no merge can write into the engine's read-only mapping
                    engine.unshare_weights()
                save_merged(self.model, self.tokenizer, out / "merged_16bit")
        return out

    # ---- the summary -----------------------------------------------------------------------------------------------
    def _summary(self, trainer, train_result, eval_metrics, train_seconds) -> dict[str, Any]:
        config, logger = self.config, self.generation_logger
        train_rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
        summary: dict[str, Any] = {
            "backend": self.backend,
            "model": config.model_name,
            "global_step": trainer.state.global_step,
            "resumed_from": str(self.resume_from) if self.resume_from else None,
            "train_seconds": round(train_seconds, 2),
            "total_seconds": round(time.perf_counter() - self._started, 2),
            "train_reward_first": train_rewards[0] if train_rewards else None,
            "train_reward_last": train_rewards[-1] if train_rewards else None,
            "train_loss": train_result.training_loss,
            "eval": eval_metrics,
            "output_dir": str(Path(config.output_dir)),
            "best_checkpoint": trainer.state.best_model_checkpoint,
            "best_metric": trainer.state.best_metric,
            "notices": self.notices,
            "trained_base": _trained_base(self.model),
        }
        if logger is not None and logger.history:
            baseline = logger.baseline()  # the run's real step-0 figure, carried across resumes
            summary["generation_eval"] = {
                "prompts": len(logger.rows),
                "held_out": logger.held_out,
                "baseline_step": baseline["global_step"] if baseline else None,
                "baseline": baseline["reward_mean"] if baseline else None,
                "final_step": logger.history[-1]["global_step"],
                "final": logger.history[-1]["reward_mean"],
                **{key: logger.history[-1][key] for key in logger.history[-1] if key.startswith("pass@")},
                **_baseline_pass_at_k(logger.history, baseline),
                **logger.prompt_changes(),  # per prompt: improved / worse / same
            }
            summary["generation_logging_seconds"] = round(logger.seconds, 2)
            summary["generation_log_dir"] = str(logger.log_dir)
        if logger is not None and logger.failures:
            summary["generation_eval_failed"] = logger.failures  # e.g. an OOM in pass@k: a failure, not a gap
        return summary

    def _write_run_config(self, out: Path) -> None:
        """run_config.json: every field (`--config run_config.json` runs it again) and, under "objective", the loss
        settings the trainer trained with, under "agent", a tool run's tools, schemas and template, and under
        "cpu_threads" the thread counts it used (written by the run, ignored when the file is read back)."""
        from grpokit.cpu_threads import RECORD_KEY

        document = {**_config_dict(self.config), "objective": self.objective}
        if self.agent is not None and self.agent.active:
            document["agent"] = self.agent.describe()
        if getattr(self, "threads", None) is not None:  # what else decided the result besides the seed
            document[RECORD_KEY] = self.threads.record()
        (out / RUN_CONFIG).write_text(json.dumps(document, indent=2, default=str) + "\n")

    def _write_outputs(self, summary: dict[str, Any]) -> None:
        out = Path(self.config.output_dir)
        self._write_run_config(out)
        try:
            from grpokit.plots import make_plots

            summary["plots"] = [str(p) for p in make_plots(out)]
        except Exception as err:  # noqa: BLE001 - a plot must never cost the run its summary
            log.error("Plotting failed (%s: %s)", err.__class__.__name__, err)
        (out / METRICS_SUMMARY).write_text(json.dumps(summary, indent=2, default=str) + "\n")
        # in place of PEFT's model card from save_model (TRL's is not written: TRLGRPOTrainer.create_model_card)
        (out / README).write_text(run_readme(_config_dict(self.config), summary), encoding="utf-8")
        report = _write_report(out, [Path(p) for p in summary.get("plots", [])])
        if report is not None:
            summary["report"] = str(report)


# ---- pieces the class uses ---------------------------------------------------------------------------------------

def _trained_base(model) -> str | None:
    """The base weights the run computed with: "16-bit", or the NF4 settings its 4-bit weights were made with
    (gguf_export.nf4_settings), which `export --base trained` repeats on the 16-bit base; None with no model loaded
    (the export then rounds as this machine's 4-bit path would, and says so)."""
    from grpokit.gguf_export import nf4_settings

    if model is None:
        return None
    return nf4_settings(model) or "16-bit"


def check_wandb() -> None:
    """W&B problems surface now, not as a crash or a login prompt in the middle of a run."""
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        raise UsageError("--wandb-project needs wandb: pip install wandb (or drop --wandb-project / use --no-wandb).")
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    if not (netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore")):
        raise UsageError("W&B is not logged in: run `wandb login`, set WANDB_API_KEY, or log offline with "
                         "WANDB_MODE=offline (or drop --wandb-project).")


def grpo_config_kwargs(config: GRPORunConfig, has_eval: bool, reward_weights: list[float] | None,
                       plan=None) -> dict[str, Any]:
    """Everything TRL's GRPOConfig receives (kept separate so tests can check what we hand over); `plan`: the run's
    load plan (grpokit/load_plan.py), whose mixed precision the run trains in."""
    kwargs = trl_kwargs(config)
    if plan is not None and plan.mixed_precision in ("bf16", "fp16", "no"):
        # TRL defaults bf16=True (trl/trainer/base_config.py); on a T4 / V100, or a CPU without bf16 units, that
        # means emulated bf16, so the plan's choice per machine is set (a --set bf16 / fp16 of the user's is kept).
        kwargs.setdefault("bf16", plan.mixed_precision == "bf16")
        kwargs.setdefault("fp16", plan.mixed_precision == "fp16")
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
        disable_tqdm=True,  # console.ProgressCallback draws the one progress bar (and no raw metrics dicts)
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
    # Every loss setting explicit (TRL's value where the run sets none): Unsloth's generated GPU config would fill
    # in its own for some (grpokit/objective.py), and the GPU run would train another objective than the CPU one.
    return pinned(kwargs)


def _group_shape(config: GRPORunConfig, per_step: int) -> str:
    """'4 prompts x 4 completions', or with adaptive_group_size the range it grows through."""
    if config.adaptive_group_size:
        return (f"{per_step // config.min_group_size} -> {per_step // config.max_group_size} prompts x "
                f"{config.min_group_size} -> {config.max_group_size} completions ({config.group_size_schedule})")
    return f"{per_step // config.num_generations} prompts x {config.num_generations} completions"


def _evaluated_at(trainer, step: int) -> dict[str, Any] | None:
    """The eval_* metrics the training loop logged at `step`, if it evaluated there."""
    for entry in reversed(trainer.state.log_history):
        if "eval_reward" in entry and entry.get("step") == step:
            return {k: v for k, v in entry.items() if k.startswith("eval_") and k != "eval_num_tokens"}
    return None


def dataset_fingerprint(train_ds) -> str:
    """Content and order of the training prompts (ids are derived from content for every source)."""
    import hashlib

    digest = hashlib.sha256(json.dumps(list(train_ds["id"])).encode())
    digest.update(json.dumps(train_ds[0]["prompt"] if len(train_ds) else None).encode())
    return digest.hexdigest()[:16]


def check_lora_rank(config) -> None:
    """A LoRA rank above the model's hidden size, refused where the shape is known without loading (a preset, a local
    directory, the hub cache): an update on a layer `hidden` wide has rank `hidden` at most, so the rest is memory
    (r x (in + out) per adapted layer) and time that add no capacity; 100 000 would only fail at the first step."""
    from grpokit.load_plan import architecture_for
    from grpokit.model_loader import model_path

    arch = architecture_for(config.model_name, model_path(config.model_name, config.load_in_4bit))
    if arch is not None and config.lora_r > arch.hidden:
        raise UsageError(f"'lora_r' {config.lora_r} is above {config.model_name}'s hidden size {arch.hidden}: a LoRA "
                         f"update on its layers has rank {arch.hidden} at most, so the rest would be memory without "
                         "capacity. Give at most that (8-64 is usual; higher rank: more capacity, more memory).")


def resolve_checkpoint(value: str, output_dir: Path, eval_only: bool = False) -> Path:
    """A checkpoint path from --resume-from-checkpoint: 'latest' (the newest complete checkpoint-N in the output dir;
    incomplete ones are set aside with a warning; named in the log) or a path, checked complete before anything
    loads (checkpoints.resolve_resume)."""
    from grpokit.checkpoints import resolve_resume

    path = Path(resolve_resume(str(value), Path(output_dir), eval_only))
    if value == "latest":
        log.info("--resume-from-checkpoint latest: %s", path)
    return path


def check_adapter_dir(path: Path, model_name: str) -> dict[str, Any]:
    """A saved adapter we can load for this model, or a UsageError naming what is wrong with it."""
    from grpokit.model_loader import model_path

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
    # a preset's adapter may have been trained on its 4-bit or its 16-bit repository (--no-4bit)
    accepted = {expected, model_path(model_name, load_in_4bit=False)}
    if base and Path(base).name not in {Path(p).name for p in accepted} and base not in accepted:
        raise UsageError(f"{path} is an adapter for '{base}', not for '{model_name}' ({expected}): pass the matching "
                         "--model.")
    return adapter_config


def eval_only_dir(output_dir: str | os.PathLike, adapter_dir: Path, step: int) -> Path:
    return Path(output_dir) / "eval_only" / f"{Path(adapter_dir).resolve().name}-step_{step}"


def verify_adapter(path: Path, log_history=(), max_completion_length: int | None = None) -> None:
    """Reload the saved adapter and check it holds trained LoRA weights (B matrices start at zero); when it does not,
    say why from the run's step logs."""
    from safetensors.torch import load_file

    weights = load_file(str(path / "adapter_model.safetensors"))
    lora_b = [t for k, t in weights.items() if "lora_B" in k]
    if not lora_b or not any(bool(t.abs().sum() > 0) for t in lora_b):
        log.warning("Saved adapter in %s has all-zero LoRA B weights: nothing was learned (%s).", path,
                    why_nothing_learned(log_history, max_completion_length))
    else:
        log.info("Adapter check: %d LoRA tensors reloaded, LoRA B non-zero", len(weights))


def why_nothing_learned(log_history, max_completion_length: int | None) -> str:
    """The step logs' reason a run left the adapter untouched: TRL logs the share of groups with identical rewards
    (`frac_reward_zero_std`, all advantages 0 where it is 1) and of completions cut at the length limit."""
    steps = [entry for entry in log_history if "frac_reward_zero_std" in entry and "loss" in entry]
    if not steps:
        return "no training step was logged"
    if any(entry["frac_reward_zero_std"] < 1.0 for entry in steps):
        return "check rewards and learning_rate"
    reason = f"in all {len(steps)} steps every group's completions got identical rewards, so every advantage was 0"
    clipped = sum(entry.get("completions/clipped_ratio", 0.0) for entry in steps) / len(steps)
    if max_completion_length and clipped >= 0.5:
        reason += (f"; {clipped:.0%} of the completions were cut at max_completion_length {max_completion_length} "
                   f"before they finished: raise it (--set max_completion_length={2 * max_completion_length})")
    else:
        reason += ": preview the rewards with --score-completions, raise temperature, or train more steps"
    return reason


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


def _write_report(out: Path, plots: list[Path] | None = None) -> Path | None:
    from grpokit.report import write_report

    try:
        return write_report(out, plots=plots or None)
    except Exception as err:  # noqa: BLE001 - a report must never cost the run its results
        log.error("Writing report.html failed (%s: %s)", err.__class__.__name__, err)
        return None


def _config_dict(config: GRPORunConfig) -> dict[str, Any]:
    from config.loader import config_to_dict

    return config_to_dict(config)


def reward_set_for(config: GRPORunConfig, data_format: str, extra_funcs: list, rows=None, dataset: str = ""):
    """The configured reward set, or the data's default (rewards/fit.py default_reward_preset: `dataset` is the
    built-in dataset the rows came from, "" for your own rows)."""
    from rewards import load_reward_config, parse_reward_config
    from rewards.fit import default_reward_preset

    name = config.reward_config_name
    if not name and not config.reward_config:
        name = default_reward_preset(data_format, rows, dataset)
    data, source = load_reward_config(name, config.reward_config)
    reward_set = parse_reward_config(data, source, config.custom_rewards, config.max_completion_length)
    if extra_funcs:
        from rewards.fit import add_reward_functions

        add_reward_functions(reward_set, extra_funcs)
    return reward_set


def _baseline_pass_at_k(history: list[dict[str, Any]], baseline: dict[str, Any] | None) -> dict[str, float]:
    """pass@k before training, as `baseline_pass@k`, beside the final one: the step-0 evaluation's, also when an
    earlier process made it (a resumed run reads it from the generation logs' PASS_AT_K_FILE)."""
    if baseline is None or not history or history[-1].get("file") == baseline.get("file"):
        return {}
    return {f"baseline_{key}": value for key, value in baseline.items() if key.startswith("pass@")}


def _check_reward_metrics(config: GRPORunConfig, reward_set, columns: set[str], source: str) -> None:
    """What the evaluations can report for these rewards and this data, checked before a model loads: pass@k needs
    a right answer to pass (an `answer` or `tests` column), and best_metric's rewards/<name>/... a reward of that
    name (config/loader.py check_best_metric checks the other names)."""
    if config.eval_pass_k and not {"answer", "tests"} & columns:
        raise UsageError(f"eval_pass_k {config.eval_pass_k}: pass@k counts answers that pass, and {source} has no "
                         "answer or tests to pass (preference or prompt-only data): set eval_pass_k 0, or use "
                         "verifiable or code data.")
    name = config.best_metric.removeprefix("eval_")
    if name.startswith("rewards/"):
        logged = ["reward_total"] if config.reward_function_type == "single" else reward_set.names
        valid = [f"rewards/{n}/{stat}" for n in logged for stat in ("mean", "std")]
        if name not in valid:
            raise UsageError(f"best_metric '{name}' is not a metric of this run's rewards ({config.reward_function_type}"
                             f" mode logs {', '.join(valid[::2])}): pick one of those, or reward.")


def _columns_fit(reward_set, columns: set[str]) -> bool:
    return all(c in columns for component in reward_set.components for c in component.needs)


def _why(missing: dict[str, str], reward_set, columns: set[str]) -> str:
    needs = sorted({c for component in reward_set.components for c in component.needs if c not in columns})
    if needs:
        return f"it needs the column(s) {', '.join(needs)}"
    return "; ".join(f"{name} {why}" for name, why in missing.items())

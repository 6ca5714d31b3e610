"""The run configuration: every field documented once, here.

`--help`, docs/configuration.md's field reference (tools/docgen.py) and validation all read these dataclass fields,
so a field's help text is written in exactly one place. Fields marked `trl=True` are handed unchanged to TRL's
`GRPOConfig`; any other `GRPOConfig` / `TrainingArguments` field may also be set from a config file or `--set`, and
is checked against the installed TRL's own field list (read from its source, so `--dry-run` never imports TRL).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from config.models import EMBEDDED_MODEL

PANEL_MODEL = "Model"
PANEL_DATA = "Data"
PANEL_REWARDS = "Rewards"
PANEL_TRAINING = "Training"
PANEL_LOGGING = "Logging & evaluation"
PANEL_AGENTS = "Tools & environments"
PANEL_CHECKPOINTS = "Checkpoints"

DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _f(default: Any, help: str, panel: str, trl: bool = False) -> Any:
    """A documented field. Mutable defaults are copied per instance."""
    meta = {"help": help, "panel": panel, "trl": trl}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class GRPORunConfig:
    """Everything one run needs: model, data, rewards, training and logging."""


    def record_sources(self, sources: dict[str, str]) -> None:
        """Which layer set each field ('preset', 'file', 'flag', '--set', or 'api' for GRPOConfig(**fields)); the
        config builder records it once, so nothing downstream re-reads files or re-parses flags to learn it."""
        self.__dict__["_sources"] = dict(sources)  # not a dataclass field: never in run_config.json or a hash

    def source_of(self, name: str) -> str:
        """The layer that set `name`: 'default' when no layer did."""
        return self.__dict__.get("_sources", {}).get(name, "default")

    def named_by_user(self, *names: str) -> bool:
        """Did the user (a file, a flag, --set, the Python API) set any of these fields, rather than a preset?"""
        return any(self.source_of(name) not in ("default", "preset") for name in names)

    description: str = _f("", "Free text: what this configuration is for (presets carry one).", PANEL_MODEL)

    # ---- Model -------------------------------------------------------------------------------------------------
    model_name: str = _f(
        "llama-3.1-8b",
        f"Model preset (see `--list-models`), Hugging Face id, or local directory. '{EMBEDDED_MODEL}' is embedded "
        "and needs no download.",
        PANEL_MODEL,
    )
    max_seq_length: int = _f(2048, "Longest prompt + completion in tokens the model is prepared for.", PANEL_MODEL)
    load_in_4bit: bool = _f(True, "Load the base weights in 4-bit NF4 (QLoRA). Less memory, slightly slower.", PANEL_MODEL)
    backend: Literal["auto", "unsloth", "transformers"] = _f(
        "auto",
        "Model loading path: 'unsloth' (FastLanguageModel), 'transformers' (+ PEFT), or 'auto' (Unsloth when it "
        "imports, else transformers).",
        PANEL_MODEL,
    )
    lora_r: int = _f(16, "LoRA rank. Higher rank: more capacity, more memory.", PANEL_MODEL)
    lora_alpha: int = _f(32, "LoRA alpha (scaling = alpha / r).", PANEL_MODEL)
    lora_dropout: float = _f(0.0, "LoRA dropout (0 = off, what Unsloth's fast path expects).", PANEL_MODEL)
    lora_target_modules: list[str] = _f(DEFAULT_LORA_TARGETS, "Module names that get LoRA adapters.", PANEL_MODEL)
    use_gradient_checkpointing: Literal["unsloth", "true", "false"] = _f(
        "unsloth",
        "Activation checkpointing: 'unsloth' (offloaded, GPU), 'true' (recompute), 'false' (fastest, most memory).",
        PANEL_MODEL,
    )
    attn_implementation: Literal["auto", "eager", "sdpa", "flash_attention_2"] = _f(
        "auto",
        "Attention kernel. 'auto': eager on CPU when prompt + completion fit in 256 tokens (its backward is 3x faster "
        "than SDPA's there, see BENCHMARKS.md), else the model's default (SDPA).",
        PANEL_MODEL,
    )
    share_prompts: bool = _f(
        True,
        "Run each distinct prompt through the model once per log-prob pass, not once per completion (same log-probs, "
        "~half the tokens with 4 completions per prompt). Not with Unsloth's GPU trainer, which has its own kernels.",
        PANEL_MODEL,
    )
    fast_inference: bool = _f(
        False, "Unsloth's vLLM generation inside the training process (GPU only; needs vllm).", PANEL_MODEL
    )
    gpu_memory_utilization: float = _f(
        0.6, "Fraction of GPU memory vLLM may take with fast_inference (Unsloth's default 0.6 fits 8B on 24 GB).",
        PANEL_MODEL,
    )
    max_lora_rank: int = _f(0, "Largest LoRA rank vLLM prepares for with fast_inference (0 = lora_r).", PANEL_MODEL)
    generation_engine: Literal["auto", "transformers", "llama_cpp", "vllm"] = _f(
        "auto",
        "What samples the completions: 'transformers' (generate, prompts shared per group), 'llama_cpp' (CPU, the "
        "LoRA pushed in after every step), 'vllm' (GPU), or 'auto' (the log says which and why).",
        PANEL_MODEL,
    )
    generation_threads: int = _f(
        0,
        "CPU threads of the llama_cpp engine; 0 = automatic: one per core not busy with other processes (affinity, "
        "cgroup quota and load, re-checked every step; torch's training threads too, unless OMP_NUM_THREADS is set).",
        PANEL_MODEL,
    )

    use_vllm: bool = _f(
        False, "Generate with vLLM (GPU only; needs vllm): a `trl vllm-serve` server or colocated in-process.",
        PANEL_MODEL, True,
    )
    vllm_mode: Literal["server", "colocate"] = _f(
        "colocate",
        "vLLM mode: 'colocate' (in the training process, on the same GPUs; TRL's default; with Unsloth its "
        "fast_inference) or 'server' (a separate `trl vllm-serve` process you start first).",
        PANEL_MODEL, True,
    )
    vllm_server_host: str = _f("0.0.0.0", "vLLM server host (server mode).", PANEL_MODEL, True)
    vllm_server_port: int = _f(8000, "vLLM server port (server mode).", PANEL_MODEL, True)
    vllm_gpu_memory_utilization: float = _f(
        0.3, "GPU memory fraction for colocated vLLM (TRL's vllm_gpu_memory_utilization).", PANEL_MODEL, True
    )

    # ---- Data --------------------------------------------------------------------------------------------------
    dataset: str = _f("ultrafeedback", "Dataset preset (see `--list-datasets`).", PANEL_DATA)
    dataset_path: str = _f(
        "",
        "Load the preset's data from local files instead of the hub: a directory as downloaded from the hub, or "
        "parquet / json / jsonl / jsonl.gz files.",
        PANEL_DATA,
    )
    custom_data: str = _f("", "Your own JSONL file (formats in docs/data.md); overrides --dataset.", PANEL_DATA)
    max_samples: int = _f(0, "Use at most this many training prompts after shuffling (0 = all).", PANEL_DATA)
    max_eval_samples: int = _f(64, "Use at most this many evaluation prompts (0 = all).", PANEL_DATA)
    eval_fraction: float = _f(
        0.05, "Held-out fraction for evaluation when the dataset has no test split (0 = no evaluation).", PANEL_DATA
    )
    system_prompt: str = _f("", "System message prepended to every prompt ('' = none).", PANEL_DATA)
    max_prompt_length: int = _f(
        512, "Prompts longer than this many tokens are dropped and counted (0 = keep all).", PANEL_DATA
    )
    streaming: bool = _f(
        False,
        "Read the data lazily: only the rows a run needs (max_samples plus the eval rows) are read and mapped. "
        "Needs max_samples or max_steps.",
        PANEL_DATA,
    )
    prompt_field: str = _f("", "Custom data: the column holding the prompt ('' = auto-detect).", PANEL_DATA)
    answer_field: str = _f("", "Custom data: the column holding the reference answer ('' = auto-detect).", PANEL_DATA)
    chosen_field: str = _f("", "Custom data: the column holding the preferred reply ('' = auto-detect).", PANEL_DATA)
    rejected_field: str = _f("", "Custom data: the column holding the rejected reply ('' = auto-detect).", PANEL_DATA)

    # ---- Rewards -----------------------------------------------------------------------------------------------
    reward_function_type: Literal["single", "multi"] = _f(
        "single",
        "'single': one reward function, the weighted sum of the components (one curve). 'multi': one TRL reward "
        "function per component with reward_weights (a curve each).",
        PANEL_REWARDS,
    )
    reward_config_name: str = _f(
        "", "Named reward preset (see `--list-rewards`); '' = the dataset's default (math for GSM8K and numeric "
        "answers, qa for question/answer rows with text answers, arithmetic for the built-in task, balanced for "
        "preference data).", PANEL_REWARDS,
    )
    reward_config: str = _f("", "Reward config JSON file; replaces the named preset.", PANEL_REWARDS)
    reward_timeout: float = _f(
        0.0, "Seconds one reward call may take before the run stops as failed (0 = no limit).", PANEL_REWARDS
    )
    custom_rewards: list[str] = _f(
        [], "Your own reward functions as 'module.path:function' (weight 1 each), added to the components.",
        PANEL_REWARDS,
    )
    allow_unsandboxed_code: bool = _f(
        False,
        "Let the code_execution reward run model-written code where the sandbox gets no Linux namespaces (a "
        "container whose seccomp profile blocks unshare, macOS): the code then reaches the network and reads what "
        "uid 65534 (or your user) can read. Off: such a run is refused before anything loads. The reward's "
        "require_sandbox still refuses (docs/code-tasks.md).",
        PANEL_REWARDS,
    )

    # ---- Tools & environments (grpokit/agents.py; docs/agents.md) --------------------------------------------
    tools: list[str] = _f(
        [],
        "Tools the model may call while it answers: built-ins by name ('python': runs the code in the sandbox and "
        "returns what it prints; 'calculator': exact arithmetic) or 'module.path:function' (its name, type hints "
        "and docstring are the schema the model sees).",
        PANEL_AGENTS,
    )
    environment: list[str] = _f(
        [],
        "A multi-turn environment: 'python_repl' (a sandboxed interpreter whose variables persist across one "
        "rollout's calls) or 'module.path:Class' (one instance per rollout, reset(**row) at its start, its public "
        "methods are tools); several as name=module:Class entries, picked by each row's 'environment' column.",
        PANEL_AGENTS,
    )
    max_tool_calling_iterations: int = _f(
        4, "Tool rounds per completion: after this many the model's turn ends where it is.", PANEL_AGENTS, True,
    )
    tool_result_max_chars: int = _f(
        2000, "A tool's result is cut at this many characters, with a marker saying so (0 = no limit).",
        PANEL_AGENTS,
    )
    tool_timeout: float = _f(
        10.0, "Seconds one tool call may take; past it the call fails and the model is told (0 = no limit).",
        PANEL_AGENTS,
    )
    tool_memory_mb: int = _f(512, "Memory of one 'python' / 'python_repl' call's sandbox, in MiB.", PANEL_AGENTS)

    # ---- Training (TRL GRPOConfig) ------------------------------------------------------------------------------
    output_dir: str = _f("./grpo_outputs", "Where checkpoints, the adapter, logs and plots go.", PANEL_TRAINING, True)
    overwrite_output_dir: bool = _f(
        False,
        "Start a new run even where the output dir holds an unfinished one (its files move to previous_runs/; a "
        "finished run's files always do).",
        PANEL_TRAINING,
    )
    learning_rate: float = _f(5e-6, "Peak learning rate.", PANEL_TRAINING, True)
    num_train_epochs: float = _f(1.0, "Passes over the training prompts.", PANEL_TRAINING, True)
    max_steps: int = _f(-1, "Stop after this many optimizer steps (-1 = use num_train_epochs).", PANEL_TRAINING, True)
    per_device_train_batch_size: int = _f(
        8, "Completions per device per micro-batch (must be divisible into groups of num_generations).",
        PANEL_TRAINING, True,
    )
    per_device_eval_batch_size: int = _f(8, "Completions per device per evaluation batch.", PANEL_TRAINING, True)
    gradient_accumulation_steps: int = _f(1, "Micro-batches per optimizer step.", PANEL_TRAINING, True)
    num_generations: int = _f(
        4, "Completions sampled per prompt: the GRPO group (the spec's group_size).", PANEL_TRAINING, True
    )
    max_completion_length: int = _f(256, "Longest completion in tokens.", PANEL_TRAINING, True)
    temperature: float = _f(1.0, "Sampling temperature for training generations.", PANEL_TRAINING, True)
    beta: float = _f(
        0.0, "KL penalty against the reference model (0 = no reference model: less memory, faster; as in DAPO).",
        PANEL_TRAINING, True,
    )
    loss_type: str = _f(
        "dapo", "GRPO loss aggregation: grpo, dr_grpo, dapo, bnpo, ... (TRL's loss_type).", PANEL_TRAINING, True
    )
    scale_rewards: str = _f(
        "group", "Advantage normalisation: 'group' (std per group), 'batch', or 'none' (Dr. GRPO).",
        PANEL_TRAINING, True,
    )
    # GRPO options (grpokit/advantages.py; docs/grpo-options.md): order components -> weights -> sum -> scale ->
    # clip -> normalise -> baseline -> scale_rewards. All at their defaults = TRL's advantages untouched.
    baseline_type: Literal["group_mean", "group_median", "exponential_moving_average", "leave_one_out"] = _f(
        "group_mean",
        "What a completion's reward is compared with: its group's mean (TRL), median (mean of the two middle values "
        "for even groups), a per-prompt moving average across steps, or the mean of the group's other completions "
        "(RLOO).", PANEL_TRAINING,
    )
    baseline_ema_decay: float = _f(
        0.9, "exponential_moving_average: weight of a prompt's previous baseline, in (0, 1) (higher = slower).",
        PANEL_TRAINING,
    )
    reward_scaling: float = _f(1.0, "Multiply the summed reward by this before clipping (1.0 = off).", PANEL_TRAINING)
    reward_clipping: float = _f(0.0, "Clip the scaled reward to [-value, value] (0 = off).", PANEL_TRAINING)
    reward_normalization: bool = _f(
        False, "Normalise rewards by their running mean and std over the run (kept in checkpoints).", PANEL_TRAINING
    )
    dynamic_sampling: bool = _f(
        False,
        "DAPO dynamic sampling: drop groups whose rewards are all equal and refill the batch with new prompts.",
        PANEL_TRAINING,
    )
    dynamic_sampling_max_rounds: int = _f(
        3, "dynamic_sampling: extra generation rounds per batch at most; then the batch keeps zero-variance groups.",
        PANEL_TRAINING,
    )
    lr_scheduler_type: str = _f("linear", "Learning-rate schedule.", PANEL_TRAINING, True)
    warmup_steps: float = _f(
        0.0, "Learning-rate warmup: steps (>= 1) or a fraction of all steps (< 1).", PANEL_TRAINING, True
    )
    weight_decay: float = _f(0.0, "AdamW weight decay.", PANEL_TRAINING, True)
    max_grad_norm: float = _f(1.0, "Gradient clipping norm.", PANEL_TRAINING, True)
    optim: str = _f("adamw_torch", "Optimizer (TRL/transformers name; 8-bit ones need a GPU).", PANEL_TRAINING, True)
    seed: int = _f(42, "Seed for data shuffling, LoRA init and sampling. On CPU the thread count decides the result too: "
                       "OMP_NUM_THREADS=N pins it (docs/speed.md).", PANEL_TRAINING, True)
    logging_steps: int = _f(1, "Log training metrics every N optimizer steps.", PANEL_TRAINING, True)

    # ---- Training: mixed loss and adaptive group size (ours, grpokit/; docs/grpo-options.md) ---------------
    sft_loss_weight: float = _f(
        0.0,
        "Weight of a supervised term added to the GRPO loss: the token-mean NLL of the data's reference reply "
        "(chosen / worked solution / answer / completion) given the prompt (0 = off; the QA recipe uses 1.0).",
        PANEL_TRAINING,
    )
    grpo_loss_weight: float = _f(
        1.0, "Weight of the GRPO term (the QA recipe uses 0.5 with sft_loss_weight 1.0; 0 = supervised only).",
        PANEL_TRAINING,
    )
    adaptive_group_size: bool = _f(
        False,
        "Grow the completions per prompt over training from min_group_size to max_group_size (needs max_steps; "
        "evaluation keeps num_generations).",
        PANEL_TRAINING,
    )
    min_group_size: int = _f(4, "adaptive_group_size: completions per prompt at the first step.", PANEL_TRAINING)
    max_group_size: int = _f(16, "adaptive_group_size: completions per prompt at the last step.", PANEL_TRAINING)
    group_size_schedule: Literal["linear", "stages"] = _f(
        "linear",
        "adaptive_group_size: 'linear' (the size grows linearly with the step, rounded to the nearest size the "
        "generation batch holds) or 'stages' (an equal share of the steps for each size the batch holds).",
        PANEL_TRAINING,
    )

    # ---- Evaluation and logging --------------------------------------------------------------------------------
    eval_steps: int = _f(50, "Evaluate every N optimizer steps (0 = only at the end).", PANEL_LOGGING)
    enable_generation_logging: bool = _f(
        True, "Write sample generations at every evaluation (and once before training).", PANEL_LOGGING
    )
    generation_log_dir: str = _f("", "Where generation logs go ('' = {output_dir}/generation_logs).", PANEL_LOGGING)
    max_generation_samples: int = _f(5, "Eval prompts whose generations are logged each time.", PANEL_LOGGING)
    generation_max_new_tokens: int = _f(
        0, "Token limit for logged generations (0 = max_completion_length).", PANEL_LOGGING
    )
    eval_pass_k: int = _f(
        0, "Verifiable or code data: also sample k completions per logged prompt and report pass@1 and pass@k (0 = off; "
        "code: a sample passes when all its tests pass).",
        PANEL_LOGGING,
    )
    best_metric: str = _f(
        "reward",
        "Eval metric that picks the best checkpoint (higher is better; OUTPUT_DIR/best_checkpoint.json): TRL's "
        "reward or rewards/<name>/mean, or greedy_reward, pass@1, pass@k from the generation log; '' = off.",
        PANEL_LOGGING,
    )
    load_best_model_at_end: bool = _f(
        False, "Reload the best checkpoint's adapter at the end (save_steps must be a multiple of eval_steps).",
        PANEL_LOGGING,
    )
    wandb_project: str = _f("", "Log to this Weights & Biases project ('' = W&B off).", PANEL_LOGGING)
    run_name: str = _f("", "Run name for W&B and the logs ('' = generated).", PANEL_LOGGING)

    # ---- Checkpoints -------------------------------------------------------------------------------------------
    save_steps: int = _f(50, "Save a checkpoint every N optimizer steps (0 = only the final adapter).",
                         PANEL_CHECKPOINTS)
    save_total_limit: int = _f(3, "Keep at most this many checkpoints (0 = keep all).", PANEL_CHECKPOINTS)
    save_merged: bool = _f(False, "Also write a merged 16-bit model at the end.", PANEL_CHECKPOINTS)

    # Any other GRPOConfig / TrainingArguments field, validated against the installed TRL.
    trl_args: dict[str, Any] = field(default_factory=dict, metadata={"help": "", "panel": "", "trl": False})


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(GRPORunConfig) if f.name != "trl_args"}


def field_help(name: str) -> str:
    """The one help text of a config field, for `--help`."""
    return FIELDS[name].metadata["help"]


def field_type(name: str) -> Any:
    return typing.get_type_hints(GRPORunConfig)[name]


def literal_choices(tp: Any) -> tuple | None:
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else None

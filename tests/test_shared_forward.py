"""The training forward encodes each distinct prompt once per group, with the unshared forward's log-probs and LoRA
gradients.

Each test runs TRL's `_compute_loss` (through our trainer: the policy forward with grad, the loss, backward) on one
batch twice, `share_prompts` on then off (tests/fixtures/shared_forward.py), and compares the per-token log-probs of
the scored tokens and every LoRA gradient; it also counts the forward calls at the input embedding, so a silent
fallback to TRL's pass fails. Tolerances: float32 models, |Δ log-prob| ≤ 1e-5 and, per LoRA tensor,
‖Δ grad‖ ≤ 1e-4 ‖grad‖ (measured: ≤ 3e-6, float rounding of the prompt's gradient summed once instead of per
completion). Unsloth's CPU backend loads in bf16 on a CPU with bf16 units: there ‖Δ grad‖ ≤ 2e-2 ‖grad‖ (measured
4.5e-3 to 5.0e-3 on the tiny Llama) and |Δ log-prob| ≤ 2e-2.
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, make_tiny_model

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FIXTURE = ROOT / "tests" / "fixtures" / "shared_forward.py"


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """Tiny random Llama, Qwen2 and Gemma 2 (the embedded model's tokenizer), each 2 layers."""
    import torch
    from transformers import AutoTokenizer, Gemma2Config, Gemma2ForCausalLM, Qwen2Config, Qwen2ForCausalLM

    llama = make_tiny_model(tmp_path_factory.mktemp("llama"))
    tokenizer = AutoTokenizer.from_pretrained(llama)
    common = {"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "pad_token_id": tokenizer.pad_token_id,
              "eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.bos_token_id}
    dirs = {"llama": llama}
    for name, cls, config in (
            ("qwen2", Qwen2ForCausalLM, Qwen2Config(**common)),
            # soft-capped attention scores, a GELU-gated MLP; windows of 4096 (longer than any row here: packed) and
            # of 8 (shorter than the rows: a packed mask would not apply, the prompt-cache form runs instead)
            ("gemma2", Gemma2ForCausalLM, Gemma2Config(**common, head_dim=16, query_pre_attn_scalar=16,
                                                       attn_logit_softcapping=50.0, final_logit_softcapping=None,
                                                       sliding_window=4096)),
            ("gemma2-window8", Gemma2ForCausalLM, Gemma2Config(**common, head_dim=16, query_pre_attn_scalar=16,
                                                               attn_logit_softcapping=50.0,
                                                               final_logit_softcapping=None, sliding_window=8))):
        torch.manual_seed(0)
        path = tmp_path_factory.mktemp(name)
        cls(config).save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs[name] = path
    return dirs


def _model(path, attn="eager", checkpointing=False):
    """float32 + PEFT LoRA on every projection, random B; eager attention as our CPU loader leaves it
    (grpokit.activation_memory's grouped-query form) unless `attn` says otherwise."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpokit import activation_memory
    from tests.fixtures.shared_forward import random_lora_b

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, task_type="CAUSAL_LM"))
    if attn == "eager" and not checkpointing:
        activation_memory.apply(model)
    random_lora_b(model)
    return model


def _check(found, inputs, distinct, calls_shared=1, logp_tol=1e-5, grad_tol=1e-4):
    rows, width = inputs["prompt_ids"].size(0), inputs["prompt_ids"].size(1) + inputs["completion_ids"].size(1)
    shared, plain = found["shared_calls"], found["plain_calls"]
    assert plain[0] == (rows, width)  # TRL's pass: every row in full, the prompt once per completion
    # ours: one forward of one packed row, the distinct prompts as a prefix tree (or the prompt cache of each
    # distinct prompt, then the completions)
    assert len(shared) - len(plain) == calls_shared - 1, (shared, plain)
    assert shared[0][0] == (1 if calls_shared == 1 else distinct) and shared[0][0] * shared[0][1] < rows * width, \
        shared
    assert found["same_names"] and found["grads"] == 2 * 2 * len(TARGETS) and found["zero_grads"] == 0
    assert found["logp"] <= logp_tol and found["grad"] <= grad_tol, found
    assert found["loss"] <= 10 * logp_tol


def _run(trainer, inputs):
    from tests.fixtures.shared_forward import both_ways, differences

    return differences(both_ways(trainer, inputs), inputs)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2", "gemma2-window8"])
def test_each_architecture(tiny_dirs, tmp_path, arch):
    from transformers import AutoTokenizer

    from tests.fixtures.shared_forward import QUESTIONS, one_round, trainer_for

    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs[arch])
    trainer = trainer_for(_model(tiny_dirs[arch]), tokenizer, tmp_path)
    inputs = one_round(tokenizer, QUESTIONS[:2], 4, 8, seed=0)
    # Gemma 2 with an 8-token window shorter than the rows: the prompt cache once per distinct prompt, then the
    # completions (two calls)
    _check(_run(trainer, inputs), inputs, distinct=2, calls_shared=2 if arch == "gemma2-window8" else 1)


@pytest.mark.parametrize("case", ["sdpa", "gradient checkpointing", "num_iterations 2", "tools", "mixed sft",
                                  "merged rounds"])
def test_each_training_path(tiny_dirs, tmp_path, case):
    import torch
    from transformers import AutoTokenizer

    from grpokit.advantages import _merge
    from tests.fixtures.shared_forward import QUESTIONS, one_round, trainer_for

    path = tiny_dirs["llama"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = _model(path, attn="sdpa" if case == "sdpa" else "eager", checkpointing=case == "gradient checkpointing")
    options = {"num_iterations": 2} if case == "num_iterations 2" else {}
    if case == "mixed sft":
        options.update(sft_loss_weight=0.5, sft_columns=("answer",))
    trainer = trainer_for(model, tokenizer, tmp_path, **options)
    assert bool(getattr(model, "is_gradient_checkpointing", False)) is (case == "gradient checkpointing")
    inputs = one_round(tokenizer, QUESTIONS[:2], 4, 8, seed=0, tool_mask=case == "tools")
    distinct = 2
    if case == "num_iterations 2":  # later iterations: the sampling policy's log-probs differ; the ratio is clipped
        generator = torch.Generator().manual_seed(5)
        with torch.no_grad():
            trainer.share_prompts = False
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
            mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
            old = trainer._get_per_token_logps_and_entropies(model, ids, mask, 8)[0]
        inputs["old_per_token_logps"] = old + 0.3 * torch.randn(old.shape, generator=generator)
    if case == "mixed sft":  # a reference reply per row (grpokit.mixed_loss): its own forward, shared or not
        generator = torch.Generator().manual_seed(6)
        reply = torch.randint(10, len(tokenizer) - 10, (8, 6), generator=generator)
        reply_mask = torch.ones_like(reply)
        reply_mask[::2, 4:] = 0
        inputs.update(sft_ids=reply.masked_fill(reply_mask == 0, tokenizer.pad_token_id), sft_mask=reply_mask,
                      sft_num_items=reply_mask.sum())
    if case == "merged rounds":
        # dynamic sampling's batch: groups kept from two rounds with prompts of other widths (grpokit.advantages'
        # own merge: prompts re-padded left, completions right), one prompt in both rounds
        first = one_round(tokenizer, QUESTIONS[:2], 4, 8, seed=0, shuffle=False)
        second = one_round(tokenizer, [QUESTIONS[1], QUESTIONS[2]], 4, 6, seed=1, shuffle=False)
        inputs = _merge(trainer, [first, second], [(0, 0), (0, 1), (1, 0)], 4)
        distinct = torch.unique(torch.cat([inputs["prompt_ids"], inputs["prompt_mask"]], 1), dim=0).size(0)
        assert inputs["prompt_ids"].size(0) == 12
    found = _run(trainer, inputs)
    _check(found, inputs, distinct=distinct)
    if case == "mixed sft":  # the supervised term's own forward came after the policy's, in both passes
        assert len(found["shared_calls"]) == len(found["plain_calls"]) == 2
        assert trainer._metrics["train"]["sft_loss"][-1] > 0


def test_the_switch_turns_it_off(tiny_dirs, tmp_path):
    """share_prompts=False: TRL's own pass, every row in full, in the training forward."""
    from transformers import AutoTokenizer

    from tests.fixtures.shared_forward import QUESTIONS, both_ways, one_round, trainer_for

    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs["llama"])
    trainer = trainer_for(_model(tiny_dirs["llama"]), tokenizer, tmp_path)
    inputs = one_round(tokenizer, QUESTIONS[:2], 4, 8, seed=0)
    results = both_ways(trainer, inputs)
    assert results[False]["calls"] == [(8, inputs["prompt_ids"].size(1) + 8)]
    assert results[True]["calls"][0][0] == 1  # shared: one packed row, the 2 prompts as a prefix tree


@pytest.mark.slow
def test_unsloth_cpu_backend_shares_the_training_forward(tiny_dirs, tmp_path):
    """The default path: Unsloth's CPU backend through the real loader (grpokit.model_loader.load_model), 4-bit, 16-bit,
    and 4-bit with Unsloth's gradient checkpointing; in its own process (Unsloth is imported before TRL)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(FIXTURE), str(tiny_dirs["llama"]), str(tmp_path)], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [line["flags"]["load_in_4bit"] for line in lines] == [True, False, True]
    assert [line["gradient_checkpointing"] for line in lines] == [False, False, True]
    for found in lines:
        assert found["backend"] == "unsloth"
        bf16 = found["dtype"] == "torch.bfloat16"
        found["shared_calls"] = [tuple(c) for c in found["shared_calls"]]
        found["plain_calls"] = [tuple(c) for c in found["plain_calls"]]
        rows = 8
        assert found["plain_calls"][0][0] == rows and len(found["shared_calls"]) == 1, found
        # one packed row (the 2 distinct prompts as a prefix tree, then the 8 completions)
        assert found["shared_calls"][0][0] == 1 and found["shared_calls"][0][1] < found["plain_calls"][0][1] * 4
        assert found["same_names"] and found["grads"] == 2 * 2 * len(TARGETS) and found["zero_grads"] == 0
        assert found["logp"] <= (2e-2 if bf16 else 1e-5) and found["grad"] <= (2e-2 if bf16 else 1e-4), found

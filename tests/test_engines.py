"""Generation engines (engines/): choice, sampling, the llama_cpp engine against the PEFT model, a GRPO step each.

The llama_cpp tests need llama-cpp-python, which `make test` builds (`make llama-cpp`); the importorskip is only a
guard for a hand-made environment without it.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

from config.errors import UsageError
from engines import SamplingParams, choose_engine, vllm_kwargs
from engines.sampling import log_softmax, sample_rows, sequence_rngs


# ---- choosing an engine ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("requested, cuda, llama, vllm, expected", [
    ("auto", False, True, False, "llama_cpp"),  # CPU with llama.cpp built: the fast path
    ("auto", False, False, False, "transformers"),  # CPU without it: TRL's generate
    ("auto", True, True, True, "vllm"),  # GPU with vllm
    ("auto", True, True, False, "transformers"),  # GPU without vllm (llama_cpp here is a CPU build)
    ("transformers", False, True, False, "transformers"),
    ("llama_cpp", False, True, False, "llama_cpp"),
    ("vllm", True, False, True, "vllm"),
])
def test_choose_engine(monkeypatch, requested, cuda, llama, vllm, expected):
    import engines

    monkeypatch.setattr(engines, "llama_cpp_available", lambda: llama)
    monkeypatch.setattr(engines, "vllm_available", lambda: vllm)
    name, reason = choose_engine(requested, cuda=cuda, backend="unsloth", architecture="LlamaForCausalLM")
    assert name == expected and reason


@pytest.mark.parametrize("requested, cuda, llama, vllm, arch, message", [
    ("llama_cpp", False, False, False, "LlamaForCausalLM", "make llama-cpp"),
    ("llama_cpp", True, True, False, "LlamaForCausalLM", "CPU engine"),
    ("llama_cpp", False, True, False, "Gemma2ForCausalLM", "not Gemma2ForCausalLM"),
    ("vllm", False, False, True, "LlamaForCausalLM", "needs a CUDA GPU"),
    ("vllm", True, False, False, "LlamaForCausalLM", "pip install vllm"),
])
def test_choose_engine_refuses_what_cannot_work(monkeypatch, requested, cuda, llama, vllm, arch, message):
    import engines

    monkeypatch.setattr(engines, "llama_cpp_available", lambda: llama)
    monkeypatch.setattr(engines, "vllm_available", lambda: vllm)
    with pytest.raises(UsageError, match=message):
        choose_engine(requested, cuda=cuda, backend="unsloth", architecture=arch)


def test_auto_keeps_transformers_for_a_4bit_base(monkeypatch):
    import engines

    monkeypatch.setattr(engines, "llama_cpp_available", lambda: True)
    name, reason = choose_engine("auto", cuda=False, backend="unsloth", architecture="LlamaForCausalLM",
                                 load_in_4bit=True)
    assert name == "transformers" and "4-bit" in reason
    assert choose_engine("llama_cpp", cuda=False, backend="unsloth", architecture="LlamaForCausalLM",
                         load_in_4bit=True)[0] == "llama_cpp"


def test_auto_falls_back_for_an_unsupported_architecture(monkeypatch):
    import engines

    monkeypatch.setattr(engines, "llama_cpp_available", lambda: True)
    name, reason = choose_engine("auto", cuda=False, backend="unsloth", architecture="Gemma2ForCausalLM")
    assert name == "transformers" and "Gemma2ForCausalLM" in reason


def test_vllm_kwargs():
    unsloth = vllm_kwargs("unsloth")
    assert unsloth["grpo_config"]["use_vllm"] is True
    assert unsloth["grpo_config"]["vllm_importance_sampling_correction"] is True
    assert unsloth["unsloth"] == {"fast_inference": True}
    plain = vllm_kwargs("transformers")
    assert plain["grpo_config"]["vllm_mode"] == "colocate" and plain["unsloth"] == {}
    from trl import GRPOConfig  # every key is a real GRPOConfig field

    fields = GRPOConfig.__dataclass_fields__
    assert all(key in fields for key in plain["grpo_config"])


# ---- sampling -------------------------------------------------------------------------------------------------------
def _logits(rows=4, vocab=50, seed=0):
    return np.random.default_rng(seed).normal(size=(rows, vocab)).astype(np.float32) * 3


def test_sampling_is_seeded_and_logprobs_are_temperature_scaled():
    logits = _logits()
    params = SamplingParams(max_tokens=1, temperature=0.7)
    a, lp_a = sample_rows(logits, params, sequence_rngs(5, 4))
    b, lp_b = sample_rows(logits, params, sequence_rngs(5, 4))
    assert (a == b).all() and np.allclose(lp_a, lp_b)
    expected = log_softmax(logits / 0.7)[np.arange(4), a]
    assert np.allclose(lp_a, expected, atol=1e-5)
    draws = {tuple(sample_rows(logits, params, sequence_rngs(seed, 4))[0]) for seed in range(20)}
    assert len(draws) > 1  # a different seed, a different sample


def test_sampling_frequencies_follow_the_distribution():
    logits = np.log(np.array([[0.5, 0.3, 0.2]], dtype=np.float32))
    rngs = sequence_rngs(0, 1)
    counts = np.bincount([sample_rows(logits, SamplingParams(max_tokens=1), rngs)[0][0] for _ in range(4000)],
                         minlength=3) / 4000
    assert np.allclose(counts, [0.5, 0.3, 0.2], atol=0.03)


@pytest.mark.parametrize("params, allowed", [
    (SamplingParams(max_tokens=1, top_k=2), {0, 1}),  # the two largest logits
    (SamplingParams(max_tokens=1, top_p=0.6), {0, 1}),  # 0.5 + 0.3 reaches 0.6
    (SamplingParams(max_tokens=1, top_p=0.4), {0}),  # the first token alone reaches 0.4
    (SamplingParams(max_tokens=1, min_p=0.5), {0, 1}),  # p >= 0.5 * 0.5
    (SamplingParams(max_tokens=1, temperature=0), {0}),  # greedy
])
def test_truncation(params, allowed):
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], dtype=np.float32))
    rngs = sequence_rngs(1, 1)
    seen = {int(sample_rows(logits, params, rngs)[0][0]) for _ in range(300)}
    assert seen == allowed


# ---- the llama_cpp engine against the PEFT model -------------------------------------------------------------------
@pytest.fixture(scope="module")
def peft_and_engine():
    pytest.importorskip("llama_cpp")
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engines.llama_cpp_engine import LlamaCppEngine
    from model_loader import embedded_model_dir

    path = embedded_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], task_type="CAUSAL_LM"))
    model.eval()
    engine = LlamaCppEngine.from_model_dir(path, threads=torch.get_num_threads(), max_sequences=8, max_context=512)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3+4? Answer with just the number."}],
                                           add_generation_prompt=True, tokenize=True, return_dict=False)
    yield model, engine, list(prompt), tokenizer
    engine.close()


def _set_lora_b(model, seed, scale=0.02):
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)


def _peft_logits(model, prompt):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt])).logits[0, -1].float().numpy()


def test_pushed_lora_matches_the_peft_model(peft_and_engine):
    model, engine, prompt, _ = peft_and_engine
    with model.disable_adapter():
        base = _peft_logits(model, prompt)
    _set_lora_b(model, seed=1)
    engine.push_adapter(model)
    trained = _peft_logits(model, prompt)
    got = engine.prompt_logits(prompt)
    lora_effect = np.abs(trained - base).max()
    assert lora_effect > 0.5, lora_effect  # the LoRA changes the logits a lot, so agreement below means something
    assert np.abs(got - trained).max() < 0.05, np.abs(got - trained).max()  # f16 GGUF vs the fp32 model


def test_a_new_adapter_moves_the_engine(peft_and_engine):
    model, engine, prompt, _ = peft_and_engine
    _set_lora_b(model, seed=1)
    engine.push_adapter(model)
    before = engine.prompt_logits(prompt)
    _set_lora_b(model, seed=2)
    engine.push_adapter(model)
    after = engine.prompt_logits(prompt)
    expected = _peft_logits(model, prompt)
    assert np.abs(after - before).max() > 0.5
    assert np.abs(after - expected).max() < 0.05


def test_same_seed_same_completions(peft_and_engine):
    model, engine, prompt, tokenizer = peft_and_engine
    _set_lora_b(model, seed=1, scale=0.002)
    engine.push_adapter(model)
    params = SamplingParams(max_tokens=12, temperature=0.8, eos_token_ids=(tokenizer.eos_token_id,), seed=7)
    ids_a, lps_a = engine.generate([prompt, prompt[:-3]], 4, params)
    ids_b, lps_b = engine.generate([prompt, prompt[:-3]], 4, params)
    assert ids_a == ids_b and lps_a == lps_b
    assert len(ids_a) == 8 and all(0 < len(ids) <= 12 for ids in ids_a)
    assert all(len(i) == len(lp) for i, lp in zip(ids_a, lps_a, strict=True))
    for ids in ids_a:  # stops at the first EOS, which is kept (TRL's completion mask includes it)
        assert tokenizer.eos_token_id not in ids[:-1]
    ids_c, _ = engine.generate([prompt, prompt[:-3]], 4, SamplingParams(**{**params.__dict__, "seed": 8}))
    assert ids_c != ids_a


def test_sampler_logprobs_match_the_trainer(peft_and_engine):
    """The engine's log-prob of each sampled token is what the trainer computes, up to f16 rounding."""
    import torch

    model, engine, prompt, tokenizer = peft_and_engine
    _set_lora_b(model, seed=1, scale=0.002)
    engine.push_adapter(model)
    params = SamplingParams(max_tokens=10, temperature=0.8, eos_token_ids=(tokenizer.eos_token_id,), seed=3)
    ids, lps = engine.generate([prompt], 4, params)
    deltas = []
    for completion, sampler in zip(ids, lps, strict=True):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1]
        trainer = torch.log_softmax(logits.float() / 0.8, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
        deltas += (trainer.numpy() - np.array(sampler)).tolist()
    assert np.mean(np.abs(deltas)) < 0.01, np.mean(np.abs(deltas))


# ---- a whole GRPO step through the real CLI, per engine ------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("engine", ["transformers", "llama_cpp"])
def test_grpo_step_through_the_cli(tmp_path, engine):
    if engine == "llama_cpp":
        pytest.importorskip("llama_cpp")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "train_grpo.py", "--quick-test", "--output-dir", str(out), "--set", "max_steps=1",
         "--set", f"generation_engine={engine}", "--disable-generation-logging", "--set", "save_steps=0",
         "--set", "max_eval_samples=2"],  # the final evaluation: 2 prompts x 4 completions, one batch
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Generation engine: {engine}" in result.stderr
    import json

    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    step = next(h for h in history if "step_time" in h)
    assert step["completions/mean_length"] > 0
    if engine == "llama_cpp":
        # TRL's importance-sampling correction ran on the engine's log-probs; the mismatch is f16-small
        assert 0 <= step["sampling/sampling_logp_difference/mean"] < 0.1

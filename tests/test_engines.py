"""Generation engines (engines/): choice, sampling, the llama_cpp engine against the PEFT model, a GRPO step each.

The llama_cpp tests need llama-cpp-python, which `make test` builds (`make llama-cpp`); the importorskip is only a
guard for a hand-made environment without it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import GSM8K_FILE, ROOT, train_cli

from config.errors import UsageError
from grpokit.engines import SamplingParams, choose_engine
from grpokit.sampling import sample_rows, sequence_rngs


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
    from grpokit import engines

    monkeypatch.setattr(engines, "llama_cpp_available", lambda: llama)
    monkeypatch.setattr(engines, "vllm_available", lambda: vllm)
    name, reason = choose_engine(requested, cuda=cuda, backend="unsloth", architecture="LlamaForCausalLM")
    assert name == expected and reason


@pytest.mark.parametrize("requested, cuda, llama, vllm, arch, message", [
    ("llama_cpp", False, False, False, "LlamaForCausalLM", "make llama-cpp"),
    ("llama_cpp", True, True, False, "LlamaForCausalLM", "CPU engine"),
    ("llama_cpp", False, True, False, "Phi3ForCausalLM", "not Phi3ForCausalLM"),
    ("vllm", False, False, True, "LlamaForCausalLM", "needs a CUDA GPU"),
    ("vllm", True, False, False, "LlamaForCausalLM", "pip install vllm"),
])
def test_choose_engine_refuses_what_cannot_work(monkeypatch, requested, cuda, llama, vllm, arch, message):
    from grpokit import engines

    monkeypatch.setattr(engines, "llama_cpp_available", lambda: llama)
    monkeypatch.setattr(engines, "vllm_available", lambda: vllm)
    with pytest.raises(UsageError, match=message):
        choose_engine(requested, cuda=cuda, backend="unsloth", architecture=arch)


def test_auto_picks_llama_cpp_for_a_4bit_base_too(monkeypatch):
    from grpokit import engines

    monkeypatch.setattr(engines, "llama_cpp_available", lambda: True)
    name, reason = choose_engine("auto", cuda=False, backend="unsloth", architecture="LlamaForCausalLM",
                                 load_in_4bit=True)
    assert name == "llama_cpp" and reason.startswith("auto: CPU")


def test_auto_falls_back_for_an_unsupported_architecture(monkeypatch):
    from grpokit import engines

    monkeypatch.setattr(engines, "llama_cpp_available", lambda: True)
    name, reason = choose_engine("auto", cuda=False, backend="unsloth", architecture="Phi3ForCausalLM")
    assert name == "transformers" and "Phi3ForCausalLM" in reason


# What llama_print_system_info says for the Makefile's avx2 build and its avx512bf16 one (0.3.36 on machine C), and
# /proc/cpuinfo's flags (the relevant part) of an AVX2-only AMD CPU and of an AMX Intel one.
AVX2_BUILD = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | REPACK = 1 | "
AVX512_BUILD = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
                "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | REPACK = 1 | ")
AMD_AVX2 = "fpu sse sse2 pni ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi1 bmi2 sha_ni"
INTEL_AMX = (AMD_AVX2 + " avx512f avx512dq avx512cd avx512bw avx512vl avx512vbmi avx512_vnni avx512_bf16 amx_bf16 "
             "amx_tile amx_int8 avx_vnni")


def test_a_build_for_instructions_the_cpu_lacks_is_named():
    from grpokit.engines import cpu_flags, llama_missing_features

    amd, intel = cpu_flags(f"processor\t: 0\nflags\t\t: {AMD_AVX2}\n"), cpu_flags(f"flags\t: {INTEL_AMX}\n")
    assert llama_missing_features(AVX512_BUILD, amd) == ["AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"]
    assert llama_missing_features(AVX512_BUILD, intel) == []
    assert llama_missing_features(AVX2_BUILD, amd) == []
    # an AVX512F CPU without the rest of the set GGML_AVX512 compiles for (-mavx512bw ...) cannot run it either
    assert llama_missing_features(AVX512_BUILD, amd | {"avx512f"})[0] == "AVX512"
    assert cpu_flags("processor\t: 0\nFeatures\t: fp asimd\n") is None  # Arm: nothing to compare with


def test_the_probe_reads_the_installed_library(tmp_path):
    """The real library, probed in a child as a run does: fine on this CPU; on a CPU without AVX2 (the same library,
    the flags this one would lack) the run is told why."""
    from grpokit.engines import cpu_flags, llama_cpp_build_problem, llama_cpp_library

    lib, flags = llama_cpp_library(), cpu_flags()
    if lib is None or flags is None:
        pytest.skip("needs llama-cpp-python's library (make llama-cpp) and an x86 /proc/cpuinfo")
    assert llama_cpp_build_problem(lib, flags) is None
    problem = llama_cpp_build_problem(lib, flags - {"avx2"})
    assert problem and "AVX2" in problem and "this CPU lacks" in problem
    broken = tmp_path / "libllama.so"
    broken.write_bytes(b"not a library")
    assert "does not load" in llama_cpp_build_problem(broken, flags)


def test_the_engine_is_installed_with_one_copy_of_each_library():
    """llama-cpp.cmake: the engine's wheel holds each llama.cpp library once, in the package (not three names each,
    nor a second set in a top-level site-packages/lib): a 67 MB wheel to zip and unpack became a 12 MB one."""
    import sysconfig

    from grpokit.engines import llama_cpp_library

    lib = llama_cpp_library()
    if lib is None:
        pytest.skip("needs llama-cpp-python's library (make llama-cpp)")
    names = sorted(p.name for p in lib.parent.glob("lib*.so*"))
    assert names == ["libggml-base.so", "libggml-cpu.so", "libggml.so", "libllama.so"], names
    assert not list(Path(sysconfig.get_paths()["purelib"], "lib").glob("lib*.so*"))


@pytest.mark.parametrize("flags, isa", [
    (INTEL_AMX, "avx512bf16"),
    (AMD_AVX2 + " avx512f avx512dq avx512cd avx512bw avx512vl avx512vbmi avx512_vnni avx512_bf16", "avx512bf16"),
    (AMD_AVX2 + " avx512f avx512dq avx512cd avx512bw avx512vl", "avx512"),  # Skylake-X: AVX-512, no BF16
    (AMD_AVX2, "avx2"),
    ("fp asimd", "base"),  # no x86 flags: llama.cpp's defaults for the machine
])
def test_make_builds_the_engine_for_the_cpus_class(flags, isa):
    """The Makefile's class from a CPU's flags, and what it builds for it, as `make` computes them; and every class's
    build reports features that CPU has (the guard above would refuse nothing make builds for it)."""
    from grpokit.engines import LLAMA_FEATURE_FLAGS

    out = subprocess.run(["make", "-s", "--no-print-directory", "llama-isa", f"CPU_FLAGS={flags}"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == isa
    for feature in (arg[len("-DGGML_"):-len("=ON")] for arg in out[1:] if arg.endswith("=ON")):
        assert set(LLAMA_FEATURE_FLAGS[feature]) <= set(flags.split()), feature  # option names = feature names


def test_a_build_that_cannot_run_here_is_refused(monkeypatch):
    from grpokit import engines

    monkeypatch.setattr(engines, "llama_cpp_available", lambda: True)
    monkeypatch.setattr(engines, "llama_cpp_problem_here", lambda: "it was built for AVX512, which this CPU lacks")
    name, reason = choose_engine("auto", cuda=False, backend="unsloth", architecture="LlamaForCausalLM")
    assert name == "transformers" and "AVX512, which this CPU lacks" in reason and "make llama-cpp" in reason
    with pytest.raises(UsageError, match="cannot run here: it was built for AVX512"):
        choose_engine("llama_cpp", cuda=False, backend="unsloth", architecture="LlamaForCausalLM")


def test_the_fallback_for_an_unbuilt_engine_fits_the_run_header(monkeypatch):
    """Without llama-cpp-python 'auto' says so and names the fix, on one line of the run header at 80 columns
    (`engine` is the header's 7-character key column)."""
    from grpokit import engines

    monkeypatch.setattr(engines, "llama_cpp_available", lambda: False)
    name, reason = choose_engine("auto", cuda=False, backend="unsloth", architecture="LlamaForCausalLM")
    line = f"{'engine':<7}  {name} ({reason})"
    assert name == "transformers" and "make llama-cpp" in reason and len(line) <= 80, line


def test_vllm_runs_hand_trl_its_importance_sampling_correction_explicitly():
    """Unsloth's generated GRPOConfig defaults vllm_importance_sampling_correction to False; a run with its in-process
    vLLM (fast_inference) hands TRL's own declared default (True) explicitly (objective.pinned), with use_vllm in
    colocate mode (load_plan.vllm_settings), whatever config class then receives it."""
    from trl import GRPOConfig as TRLConfig

    from grpokit.run import GRPOConfig, grpo_config_kwargs
    from grpokit.trl_engine_adapter import _use_vllm

    assert TRLConfig.__dataclass_fields__["vllm_importance_sampling_correction"].default is True
    for backend, fields in (("unsloth", {"fast_inference": True}), ("transformers", {"use_vllm": True})):
        config = GRPOConfig(model_name="smollm2-135m", backend=backend)  # validated where vllm is installed
        for name, value in fields.items():
            setattr(config, name, value)
        _use_vllm(config, backend)
        kwargs = grpo_config_kwargs(config, False, None)
        assert kwargs["use_vllm"] is True and kwargs["vllm_mode"] == "colocate"
        assert kwargs["vllm_importance_sampling_correction"] is True


# ---- sampling -------------------------------------------------------------------------------------------------------
def _logits(rows=4, vocab=50, seed=0):
    return np.random.default_rng(seed).normal(size=(rows, vocab)).astype(np.float32) * 3


def test_sampling_is_seeded_and_logprobs_are_temperature_scaled():
    logits = _logits()
    params = SamplingParams(max_tokens=1, temperature=0.7)
    a, lp_a = sample_rows(logits, params, sequence_rngs(5, 4))
    b, lp_b = sample_rows(logits, params, sequence_rngs(5, 4))
    assert (a == b).all() and np.allclose(lp_a, lp_b)
    import torch

    expected = torch.log_softmax(torch.from_numpy(logits) / 0.7, -1).numpy()[np.arange(4), a]
    assert np.allclose(lp_a, expected, atol=1e-5)
    draws = {tuple(sample_rows(logits, params, sequence_rngs(seed, 4))[0]) for seed in range(20)}
    assert len(draws) > 1  # a different seed, a different sample


def test_sampling_frequencies_follow_the_distribution():
    logits = np.log(np.array([[0.5, 0.3, 0.2]], dtype=np.float32))
    rngs = sequence_rngs(0, 1)
    counts = np.bincount([sample_rows(logits, SamplingParams(max_tokens=1), rngs)[0][0] for _ in range(4000)],
                         minlength=3) / 4000
    assert np.allclose(counts, [0.5, 0.3, 0.2], atol=0.03)


def test_sampling_over_a_real_sized_vocabulary():
    # the draw searches blocks of tokens, then a block: mass in several blocks (and in the last, partial one)
    vocab, likely = 49_152 + 7, [3, 300, 301, 49_158]
    logits = np.full((1, vocab), -30.0, dtype=np.float32)
    logits[0, likely] = np.log([0.4, 0.3, 0.2, 0.1])
    rngs = sequence_rngs(0, 1)
    tokens = [int(sample_rows(logits, SamplingParams(max_tokens=1), rngs)[0][0]) for _ in range(3000)]
    assert set(tokens) <= set(likely)
    counts = np.array([tokens.count(t) for t in likely]) / 3000
    assert np.allclose(counts, [0.4, 0.3, 0.2, 0.1], atol=0.03)
    top2 = {int(sample_rows(logits, SamplingParams(max_tokens=1, top_k=2), rngs)[0][0]) for _ in range(300)}
    assert top2 == {3, 300}


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

    from grpokit.engine_llama_cpp import LlamaCppEngine
    from grpokit.model_loader import embedded_model_dir

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


def test_each_push_writes_the_bytes_a_fresh_adapter_file_would_hold(peft_and_engine, tmp_path):
    """The push lays the adapter file out once and then only refills its tensors: after the LoRA changed, the file
    it writes is byte for byte what gguf_export.write_lora_gguf writes from scratch (q/k rows in llama.cpp's order)."""
    from grpokit.engine_llama_cpp import LoraFile
    from grpokit.gguf_export import write_lora_gguf

    model, engine, _, _ = peft_and_engine
    _set_lora_b(model, seed=3)
    laid_out = LoraFile(model, tmp_path / "first.gguf", engine.architecture, engine.n_head, engine.n_kv_head)
    _set_lora_b(model, seed=4)
    with torch_no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name:
                param.mul_(-0.5)
    fresh = write_lora_gguf(model, tmp_path / "fresh.gguf", engine.architecture, engine.n_head, engine.n_kv_head)
    refilled = laid_out.write(tmp_path / "refilled.gguf")
    assert refilled.read_bytes() == fresh.read_bytes()
    assert refilled.read_bytes() != (tmp_path / "first.gguf").read_bytes()


def torch_no_grad():
    import torch

    return torch.no_grad()


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


def test_prompts_sharing_a_prefix_decode_as_if_alone(peft_and_engine):
    """The prefill decodes the prompts as a prefix tree (the chat template's system prompt once for all of them, one
    prompt that is a prefix of another): each completion must be what that prompt gives alone."""
    model, engine, prompt, tokenizer = peft_and_engine
    _set_lora_b(model, seed=1, scale=0.002)
    engine.push_adapter(model)
    prompts = [list(tokenizer.apply_chat_template([{"role": "user", "content": f"What is {a}+{b}? Answer briefly."}],
                                                  add_generation_prompt=True, tokenize=True, return_dict=False))
               for a, b in [(2, 3), (2, 5), (7, 1)]] + [prompt, prompt[:-3]]
    shared = sum(1 for column in zip(*prompts, strict=False) if len(set(column)) == 1)
    assert shared >= 20  # the system prompt and more: the tree really shares something
    greedy = SamplingParams(max_tokens=8, greedy=True, eos_token_ids=(tokenizer.eos_token_id,))
    decode, batches = engine._decode, []
    engine._decode = lambda: (batches.append(engine._batch.n_tokens), decode())[1]
    try:
        together, together_lps = engine.generate(prompts, 2, greedy)
    finally:
        engine._decode = decode
    # the prefill decoded each shared token once: the tree's nodes, not every prompt's every token
    assert batches[0] == len({tuple(p[:i + 1]) for p in prompts for i in range(len(p))}) < sum(map(len, prompts))
    for index, single in enumerate(prompts):
        alone, alone_lps = engine.generate([single], 2, greedy)
        assert together[2 * index:2 * index + 2] == alone
        # f16 KV cache and matmuls over a different batch: up to ~0.007 apart (the same before the tree, measured)
        np.testing.assert_allclose(np.concatenate(together_lps[2 * index:2 * index + 2]),
                                   np.concatenate(alone_lps), atol=0.02)


def test_an_engine_nobody_closed_leaves_no_directory_at_exit(tmp_path):
    """A run ends without closing its engine; the engine's LoRA scratch directory (a temporary directory) must go with
    the process all the same, not stay behind in /tmp, one per run."""
    pytest.importorskip("llama_cpp")
    script = ("from grpokit.engine_llama_cpp import LlamaCppEngine\n"
              "from grpokit.model_loader import embedded_model_dir\n"
              "engine = LlamaCppEngine.from_model_dir(embedded_model_dir(), threads=1)\n"
              "print(engine._lora_dir)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    scratch = Path(result.stdout.split()[-1])
    assert scratch.name.startswith("grpo-lora-") and not scratch.exists()


# ---- a whole GRPO step through the real CLI, per engine ------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("engine", ["transformers", "llama_cpp"])
def test_grpo_step_through_the_cli(tmp_path, engine):
    if engine == "llama_cpp":
        pytest.importorskip("llama_cpp")
    out = tmp_path / "run"
    result = train_cli(
        # 2 steps on one generation (num_iterations=2, the tutorials' n_update_per_generation): the second step
        # reuses the first's completions with the log-probs the engine sampled them with
        "--quick-test", "--output-dir", str(out), "--set", "max_steps=2",
         "--set", "n_update_per_generation=2",
         "--set", f"generation_engine={engine}", "--disable-generation-logging", "--set", "save_steps=0",
         "--set", "max_eval_samples=2",  # the final evaluation: 2 prompts x 4 completions, one batch
         "--generation-threads", "1",
         # llama_cpp: 16-bit, where the trainer computes with the engine's copy of the weights, and a merge at the
         # end that must not write into the engine's read-only mapping (4-bit: test_e2e's runs)
         *(["--no-4bit", "--save-merged"] if engine == "llama_cpp" else []),
        env={"WANDB_MODE": "offline"}, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Generation engine: {engine}" in (out / "grpo_training.log").read_text()  # the log names it and why
    assert f"engine   {engine}" in result.stdout + result.stderr  # and so does the run header
    assert "ERROR" not in result.stdout + result.stderr  # llama.cpp's harmless vocabulary notes stay in the log

    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "step_time" in h]
    assert [h["step"] for h in steps] == [1, 2] and steps[0]["completions/mean_length"] > 0
    assert "completions/mean_length" not in steps[1]  # step 2 trained on step 1's completions: no new generation
    step = steps[0]
    if engine == "llama_cpp":
        assert "engine   llama_cpp, 1 threads" in result.stderr  # --generation-threads reached the engine
        # the header's threads line says the engine's count is the user's; the log has the same line
        assert "sampling fixed by generation_threads=1" in " ".join(result.stderr.split())
        assert "CPU threads: " in (out / "grpo_training.log").read_text()
        # TRL's importance-sampling correction ran on the engine's log-probs; the mismatch is f16-small
        assert 0 <= step["sampling/sampling_logp_difference/mean"] < 0.1
        log = (out / "grpo_training.log").read_text()
        assert "the trainer computes with the engine's copy of 210 of 210 frozen projections" in log
        _check_merged(out)


def _check_merged(out):
    """The merged model is the base plus the saved adapter, rounded once to the 16-bit dtype it is saved in (Unsloth's
    CPU merge: bf16 on a CPU with bf16 units, f16 without): each projection within one ulp of PEFT's own float32
    merge of the embedded checkpoint and the adapter (a merge through the engine's f16 views, in GGUF row order or
    with a lost LoRA scale, would be off by far more), and its logits as close to the adapted model's as that single
    rounding allows (how close depends on the adapter a run trained, so it is measured)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from grpokit.model_loader import embedded_model_dir

    saved = json.loads((out / "merged_16bit" / "config.json").read_text())
    dtype = getattr(torch, saved.get("dtype") or saved["torch_dtype"])
    assert dtype in (torch.bfloat16, torch.float16)
    ids = torch.tensor([[1, 504, 3158, 314, 216, 34, 1232, 216, 35, 47]])
    with torch.no_grad():
        merged_model = AutoModelForCausalLM.from_pretrained(out / "merged_16bit", dtype=torch.float32)
        merged = merged_model(ids).logits[0, -1]
        adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(embedded_model_dir(),
                                                                                 dtype=torch.float32), out)
        adapted = adapter(ids).logits[0, -1]
        ideal_model = adapter.merge_and_unload().to(dtype).float()
        ideal = ideal_model(ids).logits[0, -1]
    want = ideal_model.state_dict()
    for name, tensor in merged_model.state_dict().items():
        if "_proj." in name:
            assert torch.allclose(tensor, want[name], rtol=torch.finfo(dtype).eps, atol=0), name
    assert (merged - adapted).abs().max() <= (ideal - adapted).abs().max() + 0.01


# ---- other architectures: tiny random Qwen checkpoints saved locally ------------------------------------------------
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=512)


def _tiny_model_dir(root, architecture):
    """A randomly initialised `architecture` checkpoint saved as safetensors like a hub download, with a tokenizer the
    converter reads: the embedded model's (a BPE vocabulary llama.cpp knows) for Llama/Qwen, a SentencePiece model
    trained here on GSM8K questions for Gemma (whose checkpoints ship a SentencePiece `tokenizer.model`)."""
    import shutil

    import torch
    import transformers

    from grpokit.model_loader import embedded_model_dir

    gemma = architecture.startswith("Gemma")
    config_class = {"LlamaForCausalLM": "LlamaConfig", "Qwen2ForCausalLM": "Qwen2Config",
                    "Qwen3ForCausalLM": "Qwen3Config", "Gemma2ForCausalLM": "Gemma2Config",
                    "Gemma3ForCausalLM": "Gemma3TextConfig"}[architecture]
    tokens = dict(vocab_size=512, pad_token_id=0, eos_token_id=1, bos_token_id=2) if gemma else dict(
        vocab_size=49152, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    # llama.cpp scales Gemma's attention by 1/sqrt(head_dim), as every released Gemma's query_pre_attn_scalar does
    extra = dict(query_pre_attn_scalar=TINY["head_dim"], sliding_window=256) if gemma else {}
    config = getattr(transformers, config_class)(**tokens, **extra, **TINY)
    config.architectures = [architecture]
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config).to(torch.float32)
    if gemma:  # random norm weights: Gemma's norms compute x * (1 + w), which the converter folds in
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.normal_(0, 0.1)
    target = root / architecture
    model.save_pretrained(target)
    if gemma:
        _write_sentencepiece(target / "tokenizer.model", tokens["vocab_size"])
        return target, model
    embedded = embedded_model_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (embedded / name).exists():
            shutil.copy(embedded / name, target / name)
    if architecture != "LlamaForCausalLM":
        # llama.cpp's converter names a BPE vocabulary by hashing how the tokenizer splits a test string, and knows
        # the real Qwen vocabularies, not SmolLM2's under a Qwen tokenizer class (transformers 5 picks the class from
        # config.json's model_type). The borrowed vocabulary keeps its own class: model_type says llama for that
        # lookup only; the converter picks the architecture from `architectures` (Qwen's config fields are Llama's).
        saved = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps({**saved, "model_type": "llama"}))
    return target, model


def _write_sentencepiece(path, vocab_size):
    """A small BPE SentencePiece model with Gemma's special ids (pad 0, eos 1, bos 2, unk 3)."""
    import io

    import sentencepiece

    questions = [json.loads(line)["question"] for line in
                 GSM8K_FILE.read_text().splitlines()[:400]]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(questions), model_writer=model, vocab_size=vocab_size, model_type="bpe",
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, byte_fallback=True, minloglevel=2)
    path.write_bytes(model.getvalue())


@pytest.mark.parametrize("architecture", ["Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma2ForCausalLM",
                                          "Gemma3ForCausalLM"])
def test_export_and_lora_push_for_other_architectures(tmp_path, monkeypatch, architecture):
    """Any supported architecture, not only the embedded Llama: the exported GGUF plus the pushed LoRA give the PEFT
    model's last-token logits (within 0.05)."""
    pytest.importorskip("llama_cpp")
    import torch
    from peft import LoraConfig, get_peft_model

    from grpokit.engine_llama_cpp import LlamaCppEngine

    model_dir, model = _tiny_model_dir(tmp_path, architecture)  # borrows the tokenizer from the shared cache
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))  # then a private one for the exports
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], task_type="CAUSAL_LM"))
    model.eval()
    engine = LlamaCppEngine.from_model_dir(model_dir, threads=torch.get_num_threads(), max_sequences=4,
                                           max_context=256)
    try:
        prompt = [2, 50, 60, 70, 80, 90, 100, 110] if architecture.startswith("Gemma") else [
            1, 504, 3458, 314, 216, 34, 30, 36, 47, 2]
        with model.disable_adapter():
            base = _peft_logits(model, prompt)
        engine.push_adapter(model)  # LoRA B is zero at init: the base model's logits
        assert np.abs(engine.prompt_logits(prompt) - base).max() < 0.05
        _set_lora_b(model, seed=1, scale=0.2)
        engine.push_adapter(model)
        trained, got = _peft_logits(model, prompt), engine.prompt_logits(prompt)
        lora_effect = np.abs(trained - base).max()
        assert lora_effect > 0.05, lora_effect  # the LoRA moves the logits, so agreement below means something
        assert np.abs(got - trained).max() < 0.05, (np.abs(got - trained).max(), lora_effect)
    finally:
        engine.close()


def test_a_converter_started_ahead_writes_the_same_gguf_and_one_left_unused_is_stopped(tmp_path, monkeypatch):
    """gguf_export.warm_converter: the converter's interpreter started before the export (its imports beside the
    model's load) writes the GGUF byte for byte as a fresh `python convert_hf_to_gguf.py` does; none is started for a
    model with an export cached; one the run never uses exits at the end of its input and is stopped at exit."""
    pytest.importorskip("llama_cpp")
    from grpokit import gguf_export

    model_dir, _ = _tiny_model_dir(tmp_path, "LlamaForCausalLM")  # borrows the tokenizer from the shared cache
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))  # then a private one for the exports
    cold = gguf_export._convert(model_dir, tmp_path / "cold.gguf", "f16")  # nothing waiting: a fresh interpreter
    assert gguf_export.warm_converter(model_dir)  # no export of it in the cache yet
    waiting = gguf_export._warm[str(gguf_export.converter_dir())]
    warm = gguf_export._convert(model_dir, tmp_path / "warm.gguf", "f16")
    assert waiting.returncode == 0 and not gguf_export._warm  # the job went to the waiting interpreter
    assert warm.read_bytes() == cold.read_bytes()

    cached = tmp_path / "cache" / "gguf" / f"{model_dir.name}-{gguf_export.model_identity(model_dir)}.f16.gguf"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(cold.read_bytes())  # where base_gguf keeps it: nothing to start
    assert gguf_export.base_gguf(model_dir, tmp_path / "cache", "f16") == cached
    assert not gguf_export.warm_converter(model_dir) and not gguf_export._warm
    assert not gguf_export.warm_converter(tmp_path / "not-a-model")  # nothing the engine could export
    # a model about to be made (the embedded model before its first conversion): started before it exists
    assert gguf_export.warm_converter(tmp_path / "being-made", being_made=True)
    unused = gguf_export._warm[str(gguf_export.converter_dir())]
    unused.communicate("")  # its input ends (the run exited): it exits, cleanly
    assert unused.returncode == 0
    assert gguf_export.warm_converter(tmp_path / "being-made", being_made=True)  # a fresh one in its place
    unused = gguf_export._warm[str(gguf_export.converter_dir())]
    gguf_export._stop_warm()  # what runs at exit
    assert unused.poll() is not None and not gguf_export._warm


def test_the_run_starts_the_converter_only_where_an_export_is_coming(tmp_path, monkeypatch):
    """GRPOTrainer.warm_engine (the CLI's first step, and load_model/train's): the embedded model before its first
    conversion gets a converter waiting, once however often it is asked; a run generating with transformers gets
    none."""
    pytest.importorskip("llama_cpp")
    from grpo_trainer import GRPOConfig, GRPOTrainer
    from grpokit import gguf_export

    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))  # nothing converted or exported here yet
    gguf_export._stop_warm()
    try:
        trainer = GRPOTrainer(GRPOConfig(model_name="smollm2-135m", output_dir=str(tmp_path / "out")))
        assert trainer.warm_engine() and len(gguf_export._warm) == 1
        waiting = next(iter(gguf_export._warm.values()))
        assert trainer.warm_engine() and list(gguf_export._warm.values()) == [waiting]  # asked again: the same one
        assert waiting.poll() is None
        gguf_export._stop_warm()
        other = GRPOTrainer(GRPOConfig(model_name="smollm2-135m", output_dir=str(tmp_path / "out2"),
                                       generation_engine="transformers"))
        assert not other.warm_engine() and not gguf_export._warm
    finally:
        gguf_export._stop_warm()


def test_an_unsupported_architecture_is_named(tmp_path):
    from grpokit.gguf_export import check_model_dir

    (tmp_path / "config.json").write_text('{"architectures": ["PhiForCausalLM"]}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(UsageError, match="PhiForCausalLM is not supported .*generation_engine=transformers"):
        check_model_dir(tmp_path)


@pytest.mark.slow
def test_auto_falls_back_to_transformers_when_llama_cpp_cannot_run_the_settings(tmp_path):
    """'auto' never ends a run over the engine: a setting llama_cpp does not implement (repetition_penalty) gives one
    warning line and TRL's own generation; asking for llama_cpp by name with it stops with one line and exit 2."""
    pytest.importorskip("llama_cpp")
    env = {"WANDB_MODE": "offline"}
    base = ["--quick-test", "--no-4bit", "--set", "max_steps=1",
            "--set", "repetition_penalty=1.1", "--disable-generation-logging", "--set", "save_steps=0",
            "--set", "max_eval_samples=2"]
    auto = train_cli(*base, "--output-dir", str(tmp_path / "auto"), env=env, timeout=1800)
    assert auto.returncode == 0, auto.stderr[-3000:]
    warnings = [line for line in (auto.stdout + auto.stderr).splitlines() if "WARNING Generation engine" in line]
    assert len(warnings) == 1 and "llama_cpp could not start" in warnings[0], auto.stderr[-2000:]
    assert "repetition_penalty=1.1" in warnings[0]
    assert "engine   transformers (llama_cpp could not start)" in auto.stderr  # the header says what runs
    named = train_cli(*base, "--output-dir", str(tmp_path / "named"), "--generation-engine", "llama_cpp", env=env,
                      timeout=1800)
    assert named.returncode == 2 and "Traceback" not in named.stderr, (named.stdout + named.stderr)[-2000:]
    assert named.stderr.strip().splitlines() == [
        "error: the llama_cpp engine does not implement repetition_penalty=1.1: drop it or use "
        "--set generation_engine=transformers."]  # refused before the model loads: nothing else was printed
    assert not (tmp_path / "named" / "grpo_training.log").exists()


def test_importance_sampling_in_the_loss_pass_matches_trls_separate_pass(tmp_path, monkeypatch):
    """On-policy steps compute TRL's importance-sampling ratio from the loss pass's own log-probs instead of a separate
    no-grad pass: two real GRPO steps with the llama_cpp engine agree with TRL's way (same samples, same loss, same
    mismatch metrics, same trained adapter), and the separate pass is really skipped."""
    pytest.importorskip("llama_cpp")
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    import grpokit.trl_engine_adapter as hook
    from grpokit.engine_llama_cpp import LlamaCppEngine
    from grpokit.model_loader import import_backend
    from grpokit.trl_trainer import TRLGRPOTrainer

    import_backend("transformers")  # TRL's fused LM head needs its CPU implementation on this machine
    model_dir, _ = _tiny_model_dir(tmp_path, "LlamaForCausalLM")  # borrows the tokenizer from the shared cache
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))  # then a private one for the exports
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": q}]}
                                 for q in ["What is 3 + 4?", "Name a colour.", "Count to three.", "Hi"] * 4])

    def length_reward(completions, **kwargs):
        return [len(c[0]["content"]) / 10 for c in completions]

    def run(name, deferred):
        import transformers

        monkeypatch.setattr(hook, "defers_importance_sampling", lambda trainer: deferred and hook._corrects_mismatch(
            trainer) and trainer.args.gradient_accumulation_steps % trainer.args.steps_per_generation == 0)
        model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        torch.manual_seed(1)
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM", target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        args = GRPOConfig(output_dir=str(tmp_path / name), per_device_train_batch_size=8, num_generations=4,
                          max_completion_length=10, max_steps=2, learning_rate=5e-3, seed=0, report_to="none",
                          use_cpu=True, bf16=False, gradient_checkpointing=False, beta=0.0, logging_steps=1,
                          save_strategy="no", temperature=1.0)
        trainer = TRLGRPOTrainer(model=model, processing_class=AutoTokenizer.from_pretrained(model_dir),
                                 reward_funcs=length_reward, args=args, train_dataset=prompts)
        trainer.generation_engine = LlamaCppEngine.from_model_dir(model_dir, threads=1, max_sequences=8,
                                                                  max_context=1024)
        forward_rows = []
        model.get_input_embeddings().register_forward_hook(
            lambda module, inputs, out: forward_rows.append(torch.is_grad_enabled()))
        try:
            trainer.train()
        finally:
            trainer.generation_engine.close()
        steps = [h for h in trainer.state.log_history if "loss" in h and "reward" in h]
        lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
        return steps, lora, forward_rows

    ours, our_lora, our_passes = run("deferred", True)
    theirs, their_lora, their_passes = run("trl", False)
    assert our_passes.count(False) == 0 < their_passes.count(False)  # no no-grad log-prob pass on our side
    assert len(ours) == len(theirs) == 2
    for mine, trl_step in zip(ours, theirs, strict=True):
        assert mine["reward"] == trl_step["reward"] and mine["reward_std"] == trl_step["reward_std"]  # same samples
        assert mine["loss"] == pytest.approx(trl_step["loss"], rel=1e-4, abs=1e-6)
        for key in ("sampling/sampling_logp_difference/mean", "sampling/importance_sampling_ratio/mean",
                    "sampling/importance_sampling_ratio/min"):
            assert mine[key] == pytest.approx(trl_step[key], rel=1e-4, abs=1e-6), key
    assert any(h["reward_std"] > 0 for h in theirs)
    for name, weight in their_lora.items():
        torch.testing.assert_close(our_lora[name], weight, rtol=1e-4, atol=1e-5, msg=name)


def test_generation_logs_decode_through_the_engine(tmp_path, monkeypatch):
    """The greedy generation log (and pass@k's samples) of a run with the llama_cpp engine are the engine's output,
    with the trainer's current adapter pushed first, not transformers' generate."""
    pytest.importorskip("llama_cpp")
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, LlamaForCausalLM
    from trl import GRPOConfig

    from grpokit.callbacks import GenerationLogger
    from grpokit.engine_llama_cpp import LlamaCppEngine
    from grpokit.model_loader import import_backend
    from grpokit.trl_trainer import TRLGRPOTrainer
    from rewards import parse_reward_config

    import_backend("transformers")
    model_dir, _ = _tiny_model_dir(tmp_path, "LlamaForCausalLM")  # borrows the tokenizer from the shared cache
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))  # then a private one for the exports
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = get_peft_model(LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32), LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    _set_lora_b(model, seed=3, scale=0.2)
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)}
            for a, b in ((1, 2), (3, 4), (5, 1))]
    trainer = TRLGRPOTrainer(
        model=model, processing_class=tokenizer, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                        max_completion_length=8, report_to="none", use_cpu=True, bf16=False,
                        gradient_checkpointing=False), train_dataset=Dataset.from_list(rows * 4))
    engine = trainer.generation_engine = LlamaCppEngine.from_model_dir(model_dir, threads=1, max_sequences=12,
                                                                         max_context=1024)
    try:
        logger = GenerationLogger(rows, tokenizer, parse_reward_config({"accuracy_weight": 1.0}, "test"),
                                  tmp_path / "logs", max_new_tokens=8, pass_k=4, temperature=1.0)
        logger.trainer = trainer
        summary = logger.log_generations(trainer.model, 0)
        assert engine.pushes == 1 and summary is not None and "pass@4" in summary  # the adapter went in first
        entries = json.loads((tmp_path / "logs" / "generation_log_step_0.json").read_text())
        prompt_ids = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                                    return_dict=False) for r in rows]
        greedy, _ = engine.generate([list(p) for p in prompt_ids], 1, SamplingParams(
            max_tokens=8, greedy=True, eos_token_ids=tuple(trainer.eos_token_ids)))
        for entry, ids in zip(entries, greedy, strict=True):
            assert entry["generated"] == tokenizer.decode([t for t in ids if t not in trainer.eos_token_ids],
                                                          skip_special_tokens=True)
    finally:
        engine.close()


def test_generation_threads():
    from grpo_trainer import GRPOConfig
    from grpokit.trl_engine_adapter import engine_threads

    assert engine_threads(0, torch_threads=2) == 2 and engine_threads(1, torch_threads=2) == 1
    assert GRPOConfig(generation_threads=1).generation_threads == 1
    with pytest.raises(UsageError, match="'generation_threads' must be 0 or more"):
        GRPOConfig(generation_threads=-1)


# ---- the trainer's own copy of the weights when llama_cpp samples ---------------------------------------------------
FROZEN_BF16_PROBE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from grpokit.model_loader import import_backend, load_model
import_backend("unsloth")
import torch
from config.loader import build_config

config = build_config(preset="quick_test", overrides=["load_in_4bit=false"])
ids = torch.tensor([[1, 504, 3158, 314, 216, 34, 1232, 216, 35, 47]])
out = {}
for engine in ("llama_cpp", "transformers"):
    model, _ = load_model(config, "unsloth", engine)
    layer = model.get_base_model().model.layers[0]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1]
    out[engine] = {"q_proj": str(layer.self_attn.q_proj.base_layer.weight.dtype),
                   "down_proj": str(layer.mlp.down_proj.base_layer.weight.dtype),
                   "embed": str(model.get_input_embeddings().weight.dtype),
                   "lora": str(layer.self_attn.q_proj.lora_A["default"].weight.dtype),
                   "env_after": os.environ.get("UNSLOTH_CPU_FROZEN_BF16"), "logits": logits.tolist()}
print("PROBE " + json.dumps(out))
"""


@pytest.mark.slow
def test_llama_cpp_runs_keep_the_frozen_projections_in_bf16():
    """With llama_cpp sampling, the trainer keeps the frozen projections as stored (bf16) and computes in float32:
    the same logits as the float32 load the transformers engine gets, bit for bit, in half the memory."""
    probe = _run_probe(FROZEN_BF16_PROBE, timeout=600)
    llama, plain = probe["llama_cpp"], probe["transformers"]
    assert (llama["q_proj"], llama["down_proj"]) == ("torch.bfloat16", "torch.bfloat16")
    if plain["q_proj"] == "torch.float32":  # a CPU without bf16 units (AVX2): Unsloth computes in float32
        assert plain["down_proj"] == llama["embed"] == llama["lora"] == "torch.float32"  # trained or summed: fp32
    # (with bf16 units, e.g. AMX, Unsloth trains in bf16 anyway and both loads are the same)
    assert llama["embed"] == plain["embed"]
    assert llama["env_after"] is None  # the setting does not leak into a later load
    assert llama["logits"] == plain["logits"]


SHARE_PROBE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from grpokit.model_loader import embedded_model_dir, import_backend, load_model
import_backend("unsloth")
import torch
from config.loader import build_config
from grpokit.engines import SamplingParams
from grpokit.engine_llama_cpp import LlamaCppEngine

def mapped(path):
    return sum(path in line for line in open("/proc/self/maps"))

def resident_mib(path):  # this process's resident pages of the file's mapping
    out, inside = 0, False
    for line in open("/proc/self/smaps"):
        if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
            inside = line.rstrip().endswith(path)
        elif inside and line.startswith("Rss:"):
            out += int(line.split()[1])
    return out / 1024

config = build_config(preset="quick_test", overrides=["load_in_4bit=false"])
model, tokenizer = load_model(config, "unsloth", "llama_cpp")
layer = model.get_base_model().model.layers[0]
ids = torch.tensor([[1, 504, 3158, 314, 216, 34, 1232, 216, 35, 47]])
with torch.no_grad():
    before = model(input_ids=ids).logits[0, -1]

def q_lora_grad():  # the gradient reaching q_proj's LoRA (its output is reordered when shared), same dropout draws
    model.train()
    model.zero_grad()
    torch.manual_seed(0)
    model(input_ids=ids, labels=ids).loss.backward()
    model.eval()
    return layer.self_attn.q_proj.lora_B["default"].weight.grad.clone()

q_grad_before = q_lora_grad()
checkpoint = str(embedded_model_dir() / "model.safetensors")
out = {"checkpoint_mapped_before": mapped(checkpoint), "compute": str(model.get_input_embeddings().weight.dtype)}
engine = LlamaCppEngine.from_model_dir(embedded_model_dir(), threads=torch.get_num_threads(), trainer_model=model)
gguf = os.path.realpath(engine.gguf_path)
start, _, length = engine._mapping()
down = layer.mlp.down_proj.base_layer.weight
out.update(shared=len(engine._shared), checkpoint_mapped_after=mapped(checkpoint),
           down_dtype=str(down.dtype), down_in_engine=start <= down.data_ptr() < start + length,
           q_in_engine=start <= layer.self_attn.q_proj.base_layer.weight.data_ptr() < start + length)
with torch.no_grad():
    out["shared_logits_gap"] = (model(input_ids=ids).logits[0, -1] - before).abs().max().item()
model.train()  # a backward through the shared weights reaches the LoRA
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
out["lora_grad"] = layer.mlp.down_proj.lora_B["default"].weight.grad.abs().sum().item()
q_grad = q_lora_grad()
out["q_grad_gap"] = ((q_grad - q_grad_before).abs().max() / q_grad_before.abs().max()).item()
model.eval()
prompt = ids[0].tolist()
params = SamplingParams(max_tokens=8, temperature=0.8, eos_token_ids=(tokenizer.eos_token_id,), seed=5)
first = engine.generate([prompt], 4, params)
out["resident_after_generate"] = resident_mib(gguf)
out["same_after_release"] = engine.generate([prompt], 4, params) == first
out["shared_mib"] = sum(engine._tensors[name][1] for name in engine._tensors
                        if ("ffn_" in name or ".attn_" in name) and "norm" not in name) / 2**20
out["file_mib"] = os.path.getsize(gguf) / 2**20
engine.close()  # gives the trainer its own copies back before the mapping goes
with torch.no_grad():
    out["after_close_gap"] = (model(input_ids=ids).logits[0, -1] - before).abs().max().item()
out["down_dtype_after_close"] = str(layer.mlp.down_proj.base_layer.weight.dtype)
out["hooks_after_close"] = len(layer.self_attn.q_proj.base_layer._forward_hooks)
print("PROBE " + json.dumps(out))
"""


@pytest.mark.slow
def test_the_trainer_computes_with_the_engines_copy_of_the_weights():
    """16-bit with llama_cpp: one copy of the frozen weights. The trainer's projections become views of the 16-bit
    tensors in llama.cpp's mapping (bf16 where the trainer computes in bf16, f32 where it computes in float32: read
    with no cast) (same values: same logits; Llama's q/k in the GGUF's row order, their outputs put back in HF's),
    its mmapped checkpoint goes, and between generations
    the tensors only the engine reads leave the resident set; closing the engine hands the trainer its copies back."""
    pytest.importorskip("llama_cpp")
    probe = _run_probe(SHARE_PROBE, timeout=600)
    assert probe["shared"] == 210  # q, k, v, o, gate, up, down x 30 layers (q/k in the GGUF's row order)
    engine_dtype = "torch.bfloat16" if probe["compute"] == "torch.bfloat16" else "torch.float32"
    assert probe["down_dtype"] == engine_dtype and probe["down_in_engine"] and probe["q_in_engine"], probe
    assert probe["checkpoint_mapped_before"] >= 1 and probe["checkpoint_mapped_after"] == 0
    assert probe["shared_logits_gap"] < 1e-4  # f16 or bf16 holds the bf16 checkpoint's values (bit-identical here)
    assert probe["lora_grad"] > 0
    # the reordered q output back-propagates as before (relative to its largest gradient). The backward through q/k
    # now sums over their outputs in the GGUF's order: in float32 that moves the last bits; in bf16 (a CPU with bf16
    # units) it flips an ulp (2^-8) here and there, and 30 layers of backward make that a few percent
    assert probe["q_grad_gap"] < (1e-4 if probe["compute"] == "torch.float32" else 0.1), probe
    # after a generation only the shared tensors stay resident: not token_embd or the norms
    assert probe["resident_after_generate"] <= probe["shared_mib"] + 2 < probe["file_mib"] - 50, probe
    assert probe["same_after_release"]  # dropped pages come back unchanged
    assert probe["after_close_gap"] < 1e-4 and probe["down_dtype_after_close"] == "torch.bfloat16"
    assert probe["hooks_after_close"] == 0  # q's output reordering went with the shared view


def test_a_4bit_base_is_exported_dequantised_even_from_a_prequantized_checkpoint(tmp_path, monkeypatch):
    """A 4-bit trainer: the engine samples from the dequantised NF4 weights the trainer scores with (its logits within
    0.05 of the 4-bit PEFT model's), also when config.json carries a bitsandbytes `quantization_config` (the
    `…-bnb-4bit` checkpoints), which llama.cpp's converter refuses: the export holds plain floats, so it is dropped."""
    pytest.importorskip("llama_cpp")
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from grpokit.engine_llama_cpp import LlamaCppEngine

    model_dir, _ = _tiny_model_dir(tmp_path, "LlamaForCausalLM")  # borrows the tokenizer from the shared cache
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))  # then a private one for the exports
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=quantization, dtype=torch.float32)
    saved = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**saved, "quantization_config": {
        "quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}}))
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                                             task_type="CAUSAL_LM"))
    model.eval()
    _set_lora_b(model, seed=2, scale=0.2)
    engine = LlamaCppEngine.from_model_dir(model_dir, threads=torch.get_num_threads(), max_sequences=2,
                                           max_context=64, trainer_model=model)
    try:
        assert engine.weights == "the dequantised 4-bit weights"
        engine.push_adapter(model)
        prompt = [1, 504, 3458, 314, 216, 34, 30, 36, 47, 2]
        got, want = engine.prompt_logits(prompt), _peft_logits(model, prompt)
        assert np.abs(got - want).max() < 0.05, np.abs(got - want).max()
    finally:
        engine.close()


NF4_PROBE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from grpokit.model_loader import embedded_model_dir, import_backend, load_model
import_backend("unsloth")
import torch
from config.loader import build_config
from grpokit.engine_llama_cpp import LlamaCppEngine

config = build_config(preset="quick_test", overrides=[])
ids = torch.tensor([[1, 504, 3158, 314, 216, 34, 1232, 216, 35, 47]])
NAMES = ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")

def measure(model):
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    model.train()
    model.zero_grad()
    torch.manual_seed(0)
    model(input_ids=ids, labels=ids).loss.backward()
    model.eval()
    layers = model.get_base_model().model.layers
    grads = [getattr(layers[i], "self_attn" if n.startswith("self") else "mlp").get_submodule(n.split(".")[1])
             .lora_B["default"].weight.grad.clone() for i in (0, 15, 29) for n in NAMES]
    return logits, grads

import grpokit.model_loader as loader
nf4_in_16bit = loader.nf4_in_16bit
loader.nf4_in_16bit = lambda *args: False  # the reference: bitsandbytes' own 4-bit path
bnb, _ = load_model(config, "unsloth", "transformers")
loader.nf4_in_16bit = nf4_in_16bit
out = {"bnb_class": type(bnb.get_base_model().model.layers[0].mlp.down_proj.base_layer).__name__,
       "compute": str(bnb.get_input_embeddings().weight.dtype)}
bnb_logits, bnb_grads = measure(bnb)
from bitsandbytes.functional import dequantize_4bit
bnb_down = bnb.get_base_model().model.layers[0].mlp.down_proj.base_layer.weight
bnb_down = dequantize_4bit(bnb_down.data, bnb_down.quant_state).float()  # what bitsandbytes computes with
del bnb
model, tokenizer = load_model(config, "unsloth", "llama_cpp")
engine = LlamaCppEngine.from_model_dir(embedded_model_dir(), threads=torch.get_num_threads(), trainer_model=model)
start, _, length = engine._mapping()
down = model.get_base_model().model.layers[0].mlp.down_proj.base_layer.weight
out.update(shared=len(engine._shared), weights=engine.weights, in_engine=start <= down.data_ptr() < start + length,
           weight_gap=((down.to(getattr(torch, out["compute"][6:])).float() - bnb_down).abs().max()
                       / bnb_down.abs().max()).item())
logits, grads = measure(model)
out["logits_gap"] = (logits - bnb_logits).abs().max().item()
out["logits_scale"] = bnb_logits.abs().max().item()
out["argmax_same"] = (logits.argmax(-1) == bnb_logits.argmax(-1)).float().mean().item()
out["grad_gaps"] = [((g - b).norm() / b.norm()).item() for g, b in zip(grads, bnb_grads)]
engine.close()
out["dtype_after_close"] = str(down.dtype) + " " + str(model.get_base_model().model.layers[0].mlp.down_proj.base_layer.weight.dtype)
print("PROBE " + json.dumps(out))
"""


@pytest.mark.slow
def test_4bit_with_llama_cpp_computes_the_nf4_weights_in_16_bits():
    """4-bit on a CPU with llama_cpp: the trainer's projections are the NF4 round trip of the checkpoint in 16 bits
    (bf16 where the trainer computes in bf16, f16 where it computes in float32), shared with the engine (one copy),
    instead of bitsandbytes' Linear4bit dequantising at every matmul: the same logits and LoRA gradients as the
    bitsandbytes path up to f16 rounding (none in bf16)."""
    pytest.importorskip("llama_cpp")
    probe = _run_probe(NF4_PROBE, timeout=900)
    assert probe["bnb_class"] == "Linear4bit"  # the reference really is bitsandbytes' 4-bit path
    assert probe["shared"] == 210 and probe["in_engine"], probe  # every projection viewed in the engine's GGUF
    assert probe["weights"] == "the dequantised 4-bit weights"
    # layer 0's down projection as the trainer computes with it (cast to the compute dtype) against bitsandbytes'
    # dequantised NF4: f16 rounding of the float32 values, or, in bf16, the very same values
    assert probe["weight_gap"] <= (2.0**-11 if probe["compute"] == "torch.float32" else 0.0), probe
    # f16 rounding of the NF4 values (2^-11 relative) through 30 layers; a different quantisation would move the
    # logits by whole units
    assert probe["logits_gap"] < 0.01 * probe["logits_scale"] and probe["argmax_same"] == 1.0, probe
    # LoRA B gradients (layers 0, 15, 29: q, v, down), relative; in bf16 (a CPU with bf16 units) both sides hold the
    # same bf16 values, and what differs is the order of the sums (bitsandbytes' kernels, our q/k in the GGUF's row
    # order) at 2^-8 per rounding through 30 layers
    assert max(probe["grad_gaps"]) < (0.02 if probe["compute"] == "torch.float32" else 0.06), probe
    # shared as the engine's GGUF holds it (f32 where the trainer computes in float32: read with no cast), and its
    # own 16-bit copy back after close, in the dtype it stored before sharing
    kept = "torch.bfloat16" if probe["compute"] == "torch.bfloat16" else "torch.float16"
    shared = "torch.bfloat16" if probe["compute"] == "torch.bfloat16" else "torch.float32"
    assert probe["dtype_after_close"] == f"{shared} {kept}", probe


@pytest.mark.parametrize("compute", ["bfloat16", "float32"])
def test_a_later_run_reads_its_nf4_rounding_from_the_engines_gguf_bit_for_bit(tmp_path, monkeypatch, compute):
    """The NF4 round trip of every projection (bitsandbytes' quantiser: 3-5 s on SmolLM2) is what the engine's cached
    GGUF holds, the values the trainer stores (bf16 where it computes in bf16; f16 where it computes in float32 from
    16-bit frozen weights, held in the f32 GGUF): a later run copies it from there, q/k rows put back in HF order
    (llama.cpp's converter reorders Llama's), and gets the same bits; without the file it rounds them itself."""
    pytest.importorskip("llama_cpp")
    import functools
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit import gguf_export
    from grpokit.doctor import save_tiny_llama
    from grpokit.model_loader import embedded_model_dir, nf4_rounding, round_through_nf4

    model_dir = save_tiny_llama(tmp_path / "tiny-llama", AutoTokenizer.from_pretrained(embedded_model_dir()))
    # a bf16 checkpoint, as the embedded model's
    AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).save_pretrained(model_dir)
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))  # then a private one for the engine's GGUF

    def load():
        if compute == "bfloat16":
            return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        # float32 compute from a bf16 checkpoint, as Unsloth's CPU path loads it on a CPU without bf16 units: its
        # frozen projections kept in bf16 by its own Linear subclass (unsloth_zoo/cpu/ops.py, torch only: loaded from
        # its file, as unsloth_zoo's package import wants Unsloth imported before transformers)
        ops = importlib.util.spec_from_file_location("unsloth_zoo_cpu_ops", Path(importlib.util.find_spec(
            "unsloth_zoo").submodule_search_locations[0]) / "cpu" / "ops.py")
        module = importlib.util.module_from_spec(ops)
        ops.loader.exec_module(module)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        module.store_frozen_linears_in_bf16(model.requires_grad_(False))
        assert model.get_input_embeddings().weight.dtype == torch.float32
        assert sum(type(layer) is module.Bf16StoredLinear for layer in model.modules()) == 14
        return model

    def projections(model):
        return {name: module.weight for name, module in model.named_modules()
                if isinstance(module, torch.nn.Linear) and ".layers." in name}

    first = load()
    assert round_through_nf4(first, shared=True, cached=functools.partial(gguf_export.cached_nf4_weights, model_dir,
                                                                          first)) == 14  # no file yet: rounded
    dtype = gguf_export.engine_dtype(first)
    assert dtype == ("bf16" if compute == "bfloat16" else "f32")  # float32 compute: the f16 values held in f32
    written = gguf_export.dequantized_gguf(first, model_dir, tmp_path / "cache", dtype)  # the engine, at its start
    import gguf

    # named as the model, not as the temporary directory it was converted from: the same file from every run
    assert bytes(gguf.GGUFReader(written).fields["general.name"].parts[-1]).decode().lower().replace(" ", "-") == \
        model_dir.name.lower()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["gguf"]  # the scratch copy is gone
    later = load()
    found = gguf_export.cached_nf4_weights(model_dir, later, nf4_rounding(first))
    assert len(found) == 14  # 2 layers x 7 projections, q / k among them
    import bitsandbytes.functional

    def quantiser(*args, **kwargs):
        raise AssertionError("rounded again")

    with monkeypatch.context() as patch:  # every layer from the file: the quantiser is never called
        patch.setattr(bitsandbytes.functional, "quantize_4bit", quantiser)
        assert round_through_nf4(later, shared=True, cached=functools.partial(gguf_export.cached_nf4_weights,
                                                                              model_dir, later)) == 14
    expected, got = projections(first), projections(later)
    assert got.keys() == expected.keys() and len(got) == 14
    for name, weight in expected.items():
        assert got[name].dtype == weight.dtype == (torch.bfloat16 if compute == "bfloat16" else torch.float16)
        assert torch.equal(got[name].view(torch.int16), weight.view(torch.int16)), name  # the same bits
    assert nf4_rounding(later) == nf4_rounding(first)
    if compute == "bfloat16":  # the export's float32 copy of the base, rounded as the bf16 run computed (round_base)
        from grpokit.export import round_base

        rounded, copy = (AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32) for _ in range(2))
        round_base(rounded, nf4_rounding(first))  # no base directory: the quantiser
        with monkeypatch.context() as patch:
            patch.setattr(bitsandbytes.functional, "quantize_4bit", quantiser)
            assert round_base(copy, nf4_rounding(first), model_dir) == 14
        for name, weight in projections(rounded).items():
            assert projections(copy)[name].dtype == torch.float32 and torch.equal(projections(copy)[name], weight)
    # another checkpoint (its identity names another file): nothing is read
    (model_dir / "config.json").write_text((model_dir / "config.json").read_text().replace("}", ' }', 1))
    assert gguf_export.cached_nf4_weights(model_dir, load(), nf4_rounding(first)) == {}


def test_the_engines_gguf_holds_the_trainers_compute_dtype_where_memory_allows(monkeypatch):
    """bf16 compute: bf16; float32 compute: f32 (read with no cast, and sampled from faster than f16 on AVX2) while
    the projections in float32 take at most an eighth of the machine's memory, f16 beyond (half the bytes)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpokit import gguf_export

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    projections = 2 * (32 * 32 * 2 + 32 * 16 * 2 + 32 * 64 * 3)  # q, o; k, v (2 kv heads of 8); gate, up, down
    assert gguf_export.projection_numel(model) == projections
    assert gguf_export.engine_dtype(model) == "f32"  # a few KB: fits anywhere
    monkeypatch.setattr(gguf_export, "physical_memory", lambda: 8 * 4 * projections)
    assert gguf_export.engine_dtype(model) == "f32"
    monkeypatch.setattr(gguf_export, "physical_memory", lambda: 8 * 4 * projections - 1)
    assert gguf_export.engine_dtype(model) == "f16"
    assert gguf_export.engine_dtype(model.to(torch.bfloat16)) == "bf16" and gguf_export.engine_dtype(None) == "f16"


def _run_probe(code: str, timeout: int) -> dict:
    """Run a probe script in a fresh interpreter (its own import order and memory); the dict it prints as PROBE."""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    line = next((x for x in result.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert line, (result.stdout + result.stderr)[-3000:]
    return json.loads(line[len("PROBE "):])


def test_a_long_prompt_batch_decodes_in_micro_batches_with_the_same_result(peft_and_engine, monkeypatch):
    """The prefill goes to llama.cpp one micro-batch per call (Python, and so a second Ctrl-C, gets control between
    them): the completions are those of one call, and each call holds at most PREFILL_TOKENS tokens."""
    from grpokit import engine_llama_cpp

    model, engine, prompt, tokenizer = peft_and_engine
    _set_lora_b(model, seed=2, scale=0.002)
    engine.push_adapter(model)
    prompts = [list(tokenizer.apply_chat_template([{"role": "user", "content": f"What is {a}+{b}? Answer briefly."}],
                                                  add_generation_prompt=True, tokenize=True, return_dict=False))
               for a, b in [(2, 3), (4, 5), (7, 1), (9, 9)]]
    greedy = SamplingParams(max_tokens=8, greedy=True, eos_token_ids=(tokenizer.eos_token_id,))
    whole, whole_lps = engine.generate(prompts, 2, greedy)
    decode, batches = engine._decode, []
    engine._decode = lambda: (batches.append(engine._batch.n_tokens), decode())[1]
    monkeypatch.setattr(engine_llama_cpp, "PREFILL_TOKENS", 16)
    try:
        split, split_lps = engine.generate(prompts, 2, greedy)
    finally:
        engine._decode = decode
    nodes = len({tuple(p[:i + 1]) for p in prompts for i in range(len(p))})
    prefill = batches[:-(-nodes // 16)]
    assert sum(prefill) == nodes and max(prefill) == 16 and len(prefill) >= 3
    assert split == whole
    np.testing.assert_allclose(np.concatenate(split_lps), np.concatenate(whole_lps), atol=0.02)


def _byte_tokenizer_llama(path):
    """A 2-layer random Llama with a byte-level BPE tokenizer built with `tokenizers`: llama.cpp's GGUF converter
    rejects it ("BPE pre-tokenizer was not recognized"), so the llama_cpp engine cannot start on it."""
    from grpokit.doctor import _byte_tokenizer, save_tiny_llama

    return save_tiny_llama(path, _byte_tokenizer())


@pytest.mark.parametrize("cpu_bf16", ["1", "0"])
def test_4bit_falls_back_to_transformers_when_llama_cpp_cannot_start(tmp_path, cpu_bf16):
    """Unsloth 4-bit on a CPU keeps its NF4-rounded projections in f16 for the llama_cpp engine to share; when the
    engine then cannot start (here llama.cpp's converter refuses the tokenizer) the run generates with transformers,
    with the weights in the model's compute dtype (it crashed with "BFloat16 != Half" at the first generation). On a
    CPU computing in bf16 the run is the one planned with the transformers engine, step for step; in float32
    (UNSLOTH_CPU_BF16=0) the weights went through f16 once, so the same run to f16 rounding."""
    pytest.importorskip("llama_cpp")
    model = _byte_tokenizer_llama(tmp_path / "tiny")
    env = {"WANDB_MODE": "offline", "UNSLOTH_CPU_BF16": cpu_bf16, "OMP_NUM_THREADS": "1"}  # one thread: the same sums
    base = ["--model", str(model), "--backend", "unsloth", "--dataset", "arithmetic",
            "--max-samples", "16", "--max-steps", "2", "--seed", "3", "--disable-generation-logging",
            "--reward", "tests.fixtures.user_rewards:length_on_odd_prompts", "--set", "learning_rate=0.05",
            "--set", "per_device_train_batch_size=4", "--set", "num_generations=2",
            "--set", "max_completion_length=8", "--set", "max_eval_samples=0", "--set", "save_steps=0"]
    runs = {}
    for engine in ("auto", "transformers") if cpu_bf16 == "1" else ("auto",):
        out = tmp_path / engine
        result = train_cli(*base, "--output-dir", str(out), "--set", f"generation_engine={engine}", env=env)
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        runs[engine] = json.loads((out / "trainer_state.json").read_text())["log_history"], result
    history, result = runs["auto"]
    assert "llama_cpp could not start" in result.stderr and "BPE pre-tokenizer" in result.stderr
    assert "engine   transformers (llama_cpp could not start)" in result.stderr
    steps = [h for h in history if "step_time" in h]
    assert [h["step"] for h in steps] == [1, 2] and all(h["completions/mean_length"] > 0 for h in steps)
    assert any(h["reward_std"] > 0 for h in steps)  # a gradient signal: the update below is a real one
    if cpu_bf16 == "1":
        # the same samples and rewards, the same loss; the step-2 gradient norm differed by ~2e-4 relative between
        # the two processes (the projections' weights and a forward/backward on them were bit-identical in one
        # process when this was written; the cause of that last difference was not tracked down)
        planned = [h for h in runs["transformers"][0] if "step_time" in h]
        keys = ("reward", "reward_std", "completions/mean_length", "frac_reward_zero_std")
        assert [[h[k] for k in keys] for h in steps] == [[h[k] for k in keys] for h in planned]
        for key in ("loss", "grad_norm"):
            assert [h[key] for h in steps] == pytest.approx([h[key] for h in planned], rel=1e-3, abs=1e-9)

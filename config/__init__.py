"""Configuration: one documented dataclass, JSON presets, and the spec's Python API.

    from config import create_default_config, save_config_to_file
    cfg = create_default_config("llama-3.1-8b", "ultrafeedback")
    cfg.learning_rate = 1e-5
    save_config_to_file(cfg, "my_config.json")   # then: python train_grpo.py --config my_config.json
"""

from config.errors import UsageError
from config.loader import (
    build_config,
    config_to_dict,
    create_default_config,
    load_config_file,
    preset_names,
    save_config_to_file,
    trl_kwargs,
)
from config.models import EMBEDDED_MODEL, MODEL_PRESETS
from config.schema import GRPORunConfig

__all__ = [
    "EMBEDDED_MODEL",
    "MODEL_PRESETS",
    "GRPORunConfig",
    "UsageError",
    "build_config",
    "config_to_dict",
    "create_default_config",
    "load_config_file",
    "preset_names",
    "save_config_to_file",
    "trl_kwargs",
]

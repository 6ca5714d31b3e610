"""The spec's Python API. The CLI (train_grpo.py) is a thin shell over the same class: one path for both.

    from grpo_trainer import GRPOTrainer, GRPOConfig
    from data_loader import create_grpo_dataloader

    config = GRPOConfig(model_name="smollm2-135m", max_samples=16, max_steps=1, max_completion_length=32,
                    output_dir="./my_grpo_outputs")
    data_loader, dataset = create_grpo_dataloader(model_name=config.model_name, dataset_name="arithmetic",
                                                  max_samples=config.max_samples)
    trainer = GRPOTrainer(config)
    trainer.load_model()
    metrics = trainer.train(dataset)      # a dict: steps, rewards, eval metrics, where things went
    trainer.save_model()                  # the LoRA adapter + tokenizer in config.output_dir

Nothing here calls `sys.exit`: bad input raises `UsageError`, a fault during training `RunFailed`, Ctrl-C / SIGTERM
`Interrupted` (each after saving what can be saved); resuming a finished run raises `AlreadyFinished`. The machinery
lives in the `grpokit` package (its docstring maps it); importing this module is instant.
"""

from config.errors import UsageError
from grpokit.run import GRPOConfig, GRPOTrainer
from grpokit.run_end import AlreadyFinished, Interrupted, RunFailed

__all__ = ["AlreadyFinished", "GRPOConfig", "GRPOTrainer", "Interrupted", "RunFailed", "UsageError"]

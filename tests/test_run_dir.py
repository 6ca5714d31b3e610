"""The run directory's own files: what a re-run sets aside, and the README a finished run leaves (no model loaded)."""

import json

from grpokit.run_dir import README, run_files, run_readme, set_aside_previous_run

CONFIG = {"model_name": "smollm2-135m", "load_in_4bit": True, "dataset": "arithmetic", "max_samples": 64}
SUMMARY = {"global_step": 10, "output_dir": "grpo_outputs/quick_test", "eval": {"eval_reward": 0.708},
           "generation_eval": {"prompts": 24, "held_out": True, "baseline_step": 0, "baseline": 0.458,
                               "final_step": 10, "final": 0.958, "improved": 12, "worse": 0, "same": 12}}


def test_a_rerun_sets_an_earlier_runs_export_aside_with_its_adapter(tmp_path):
    """An export left beside a newer run's adapter would be taken for that run's model."""
    for name in ("adapter_config.json", "adapter_model.safetensors", "metrics_summary.json", README):
        (tmp_path / name).write_text("{}")
    (tmp_path / "export" / "gguf-f16").mkdir(parents=True)
    (tmp_path / "export" / "gguf-f16" / README).write_text("card")
    (tmp_path / "notes.txt").write_text("the user's own")
    assert tmp_path / "export" in run_files(tmp_path)
    moved = set_aside_previous_run(tmp_path, "20260101-000000")
    assert (moved / "export" / "gguf-f16" / README).read_text() == "card"
    assert (moved / README).exists() and (moved / "adapter_model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "previous_runs"]


def test_the_run_readme_names_the_hub_base_its_figures_and_the_next_commands():
    text = run_readme(CONFIG, SUMMARY)
    assert text.startswith("---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\nlibrary_name: peft\n")
    assert "[None]" not in text and "/root/" not in text and ".cache" not in text  # TRL's / PEFT's cards did
    assert "0.458 at step 0 -> 0.958 at step 10 (better on 12, worse on 0, same on 12)" in text
    assert "python train_grpo.py export grpo_outputs/quick_test --quant q4_k_m --ollama" in text
    # a local directory as the model: no hub id is made up for it
    local = run_readme({**CONFIG, "model_name": "/data/models/my-llama"}, {**SUMMARY, "generation_eval": {}})
    assert "base_model:" not in local and "# GRPO run: /data/models/my-llama" in local
    assert json.dumps(local)  # plain text, one document


def test_trl_writes_no_model_card_into_the_output_dir():
    """TRL's GRPOTrainer writes OUTPUT_DIR/README.md at every checkpoint ("a fine-tuned version of [None]")."""
    import trl

    from grpokit.trl_trainer import TRLGRPOTrainer

    assert TRLGRPOTrainer.create_model_card is not trl.GRPOTrainer.create_model_card
    assert TRLGRPOTrainer.create_model_card(object(), model_name="run") is None

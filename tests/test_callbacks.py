"""The generation logger on the real embedded model: output fields, and failures that must not end training."""

import json

import pytest

from rewards import load_reward_config, parse_reward_config


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit.model_loader import embedded_model_dir

    path = embedded_model_dir()
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _logger(tmp_path, tokenizer, rows, **kwargs):
    from grpokit.callbacks import GenerationLogger

    data, source = load_reward_config("arithmetic")
    return GenerationLogger(rows, tokenizer, parse_reward_config(data, source), tmp_path / "logs",
                            max_new_tokens=8, **kwargs)


ROWS = [{"id": f"r{i}", "prompt": [{"role": "user", "content": f"What is {i} + 1? Answer with just the number."}],
         "answer": str(i + 1)} for i in range(3)]


def test_greedy_generations_are_scored_and_written(tmp_path, model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    logger = _logger(tmp_path, tokenizer, ROWS, pass_k=2)
    summary = logger.log_generations(model, global_step=7)
    entries = json.loads((tmp_path / "logs" / "generation_log_step_7.json").read_text())
    assert [e["sample_index"] for e in entries] == [0, 1, 2]
    assert all(e["reward_total"] == e["rewards"]["accuracy"] for e in entries)
    assert summary["reward_mean"] == pytest.approx(sum(e["reward_total"] for e in entries) / 3)
    assert 0 <= summary["pass@1"] <= summary["pass@2"] <= 1
    again = _logger(tmp_path, tokenizer, ROWS).log_generations(model, global_step=7)
    assert again["reward_mean"] == summary["reward_mean"]  # greedy: the same prompts give the same log


def test_a_failure_is_logged_and_training_goes_on(tmp_path, model_and_tokenizer, caplog):
    import logging

    _, tokenizer = model_and_tokenizer

    class Broken:  # a model whose generate() fails, as an OOM or a bad adapter would
        device = "cpu"
        training = True

        def eval(self):
            pass

        def train(self):
            pass

        def generate(self, **kwargs):
            raise RuntimeError("out of memory")

    logger = logging.getLogger("grpo")
    logger.addHandler(caplog.handler)
    try:
        assert _logger(tmp_path, tokenizer, ROWS).log_generations(Broken(), global_step=3) is None
    finally:
        logger.removeHandler(caplog.handler)
    assert any("Generation logging failed at step 3" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "logs" / "generation_log_step_3.json").exists()


def test_best_metric_missing_from_the_first_evaluation_lists_the_available_ones(tmp_path):
    from transformers import TrainerState

    from config.errors import UsageError
    from grpokit.callbacks import BestCheckpoint

    check = BestCheckpoint("eval_accuracy", tmp_path)
    metrics = {"eval_reward": 0.5, "eval_rewards/accuracy/mean": 0.5, "eval_greedy_reward": 0.4}
    with pytest.raises(UsageError, match="best_metric 'accuracy' is not an eval metric of this run; available: "
                                         "greedy_reward, reward, rewards/accuracy/mean"):
        check.on_evaluate(None, TrainerState(), None, metrics=metrics)
    named = BestCheckpoint("rewards/accuracy/mean", tmp_path)
    named.on_evaluate(None, TrainerState(), None, metrics=metrics)  # present: no error
    state = TrainerState(best_model_checkpoint=str(tmp_path / "checkpoint-3"), best_metric=0.5)
    named.on_save(None, state, None)
    assert json.loads((tmp_path / "best_checkpoint.json").read_text()) == {
        "checkpoint": str(tmp_path / "checkpoint-3"), "step": 3, "metric": "rewards/accuracy/mean", "value": 0.5}


@pytest.mark.parametrize("batch,accumulation,patience", [(8, 1, 16), (8, 4, 4), (64, 1, 3)])
def test_the_no_signal_check_counts_groups_not_steps(tmp_path, batch, accumulation, patience):
    """A run stops once 32 groups in a row from its start (and at least 3 steps) had identical rewards: the quick
    test's 2 groups per step get 16 steps, more than it runs, so a weak start does not stop it; a big batch stops
    after 3. Once a step had signal, later flat steps are only a metric. No reward at all stops at once."""
    from transformers import TrainerState
    from trl import GRPOConfig

    from grpokit.callbacks import LearningSignalCheck, NoLearningSignal

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=batch, num_generations=4,
                      gradient_accumulation_steps=accumulation, use_cpu=True, report_to=[])
    check, state = LearningSignalCheck(), TrainerState()
    check.on_train_begin(args, state, None)
    flat = {"reward": 0.0, "frac_reward_zero_std": 1.0}
    for step in range(1, patience):
        state.global_step = step
        check.on_log(args, state, None, logs=flat)
    state.global_step = patience
    with pytest.raises(NoLearningSignal, match=f"^steps 1-{patience}: every group's completions got identical "
                                               r"rewards, so GRPO has nothing to learn from \(all advantages are 0\)"):
        check.on_log(args, state, None, logs=flat)

    learned = LearningSignalCheck()
    learned.on_train_begin(args, state, None)
    learned.on_log(args, state, None, logs={"reward": 0.5, "frac_reward_zero_std": 0.5})
    for _ in range(3 * patience):
        learned.on_log(args, state, None, logs=flat)  # no error: the run had signal

    with pytest.raises(NoLearningSignal, match="every reward was None"):
        LearningSignalCheck().on_log(args, state, None, logs={"reward": float("nan"), "frac_reward_zero_std": 1.0})

    warm_start = LearningSignalCheck()  # flat rewards while a supervised term trains (sft_loss_weight): learning
    warm_start.on_train_begin(args, state, None)
    for _ in range(3 * patience):
        warm_start.on_log(args, state, None, logs={**flat, "sft_loss": 1.2})


def test_a_resumed_run_keeps_the_step_0_pass_at_k(tmp_path, model_and_tokenizer):
    """Sampled pass@k cannot be re-read from a greedy log: the process that measured it at step 0 keeps it beside
    the logs, and a later process (a resume) reports it as the run's baseline."""
    from grpokit.run import _baseline_pass_at_k

    model, tokenizer = model_and_tokenizer
    first = _logger(tmp_path, tokenizer, ROWS, pass_k=2)
    step0 = first.log_generations(model, global_step=0)
    resumed = _logger(tmp_path, tokenizer, ROWS, pass_k=2)  # a new process, after the resume
    resumed.log_generations(model, global_step=3)
    baseline = resumed.baseline()
    assert baseline["global_step"] == 0 and baseline["reward_mean"] == step0["reward_mean"]
    assert _baseline_pass_at_k(resumed.history, baseline) == {"baseline_pass@1": step0["pass@1"],
                                                              "baseline_pass@2": step0["pass@2"]}
    assert json.loads((tmp_path / "logs" / "pass_at_k.json").read_text()).keys() == {"0", "3"}

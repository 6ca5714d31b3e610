"""Where the stated objective scores the policy (grpokit/objective.py, `policy_scored_over`): over the vocabulary,
or, with Unsloth's trainer and vLLM rollouts truncated by top_k / top_p / min_p feeding the sampler correction, over
the sampler's kept set (unsloth_zoo's grpo_truncated_support_kwargs and the generated trainer's refusals)."""

import pytest

from config.loader import build_config
from grpokit.objective import describe, stated

VOCABULARY = "the vocabulary"


@pytest.mark.parametrize("overrides, engine, backend, kept", [
    (["top_p=0.9"], "vllm", "unsloth", True),  # Unsloth + vLLM, truncated, the correction on (TRL's default)
    (["top_k=50", "min_p=0.05"], "vllm", None, True),  # the backend not known yet: stated with its condition
    (["top_p=0.9"], "vllm", "transformers", False),  # TRL's own trainer scores the vocabulary
    (["top_p=0.9"], "llama_cpp", "unsloth", False),  # the CPU engine returns full-vocabulary log-probs
    (["top_p=0.9"], "llama_cpp or transformers", "unsloth", False),
    ([], "vllm", "unsloth", False),  # nothing truncated
    (["top_p=0.9", "vllm_importance_sampling_correction=false"], "vllm", "unsloth", False),  # nothing reads them
    (["top_p=0.9", "beta=0.04"], "vllm", "unsloth", False),  # Unsloth refuses: the reference pass's set differs
    (["top_p=0.9", "num_iterations=2"], "vllm", "unsloth", False),  # Unsloth refuses: reused rollouts
])
def test_the_policy_is_stated_over_the_kept_set_where_unsloth_scores_it_so(overrides, engine, backend, kept):
    objective = stated(build_config("default", overrides=overrides), engine, backend)
    said = objective["policy_scored_over"]
    if kept:
        assert said.startswith("the sampler's kept set (") and "else the vocabulary" in said, said
        assert "policy over the sampler's kept set" in describe(objective)
    else:
        assert said == VOCABULARY, said
        assert "kept set" not in describe(objective)


def test_the_kept_set_names_the_truncation():
    objective = stated(build_config("default", overrides=["top_k=50", "top_p=0.95", "min_p=0.05"]), "vllm",
                       "unsloth")
    assert objective["policy_scored_over"].startswith("the sampler's kept set (top_k 50, top_p 0.95, min_p 0.05)")


def test_a_setting_a_config_class_rewrote_is_put_back_and_said_on_the_console(caplog):
    """Unsloth's generated GRPOConfig turns dr_grpo's scale_rewards 'group' into 'none' and prints "Will override";
    the run puts its own value back and says so where that print lands (the console), not only in the log file."""
    import logging
    from types import SimpleNamespace

    from grpokit.objective import keep

    class UnslothGRPOConfig(SimpleNamespace):
        """A built config as Unsloth's generated __init__ leaves it."""

    args = UnslothGRPOConfig(loss_type="dr_grpo", scale_rewards="none", epsilon=0.2, epsilon_high=0.2)
    logger = logging.getLogger("grpo")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="grpo")
    try:
        changed = keep(args, {"loss_type": "dr_grpo", "scale_rewards": "group", "epsilon": 0.2})
    finally:
        logger.removeHandler(caplog.handler)
    assert changed == ["scale_rewards: 'none' -> 'group'"] and args.scale_rewards == "group"
    said = [r for r in caplog.records if "changed loss settings" in r.getMessage()]
    assert said and not getattr(said[0], "file_only", False)  # the console handler skips file_only records
    assert "UnslothGRPOConfig" in said[0].getMessage() and "trains its own" in said[0].getMessage()

"""The objective a run trains, stated once and the same on every machine.

On a GPU, `import unsloth` replaces TRL's GRPOConfig / GRPOTrainer with classes it generates from TRL's source
(unsloth/models/rl.py + rl_replacements.py); its CPU backend generates none of them. The generated GRPOConfig
rewrites loss settings it was not given: an explicit loss_type 'dapo' gets the DAPO paper's
mask_truncated_completions=True and epsilon_high=0.28 (every completion cut at max_completion_length then gets no
gradient), 'cispo' gets epsilon_high=5.0, 'dr_grpo' turns scale_rewards 'group' into 'none', and
vllm_importance_sampling_correction defaults off. The same command would so train one objective on a CPU and
another on a GPU.

So every setting below is handed to TRL's config explicitly, with TRL's own value where the run does not set it
(`pinned`, read from TRL's declared defaults), and what a config class still changes is put back (`keep`): both
machines train what `stated` says. `of_trainer` reads the values back from the built trainer (what its loss reads),
for the run header and run_config.json; `--dry-run` shows `stated`. A user who wants the DAPO paper's settings sets
them (`--set mask_truncated_completions=true --set epsilon_high=0.28`).

MoE router auxiliary loss (router_aux_loss_coef) is not part of this: Unsloth's fused GRPO forward does not compute it.

One GPU-only difference is stated rather than pinned (`policy_scored_over`): with vLLM rollouts truncated by top_k /
top_p / min_p and the sampler correction on, Unsloth's generated trainer scores the policy over the sampler's kept set
(unsloth_zoo's grpo_truncated_support_kwargs: automatic on CUDA where vLLM returns processed, kept-set renormalised
log-probs). Pinned off (UNSLOTH_GRPO_TRUNCATED_SUPPORT=0), the trainer's full-vocabulary log-probs would meet vLLM's
renormalised ones and every token's ratio would carry log(kept mass): a sequence-level ratio shrinks with length and
scales down the long completions' gradient. So the run keeps Unsloth's choice and says it: `of_trainer` asks
Unsloth's own decision, `stated` says where it applies. The CPU engines return full-vocabulary log-probs: there the
policy is scored over the vocabulary.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("grpo")

# TRL's loss settings (trl/trainer/grpo_config.py); the trainer copies each onto itself in __init__.
TRL_FIELDS = ("loss_type", "beta", "epsilon", "epsilon_high", "mask_truncated_completions", "scale_rewards",
              "importance_sampling_level", "num_iterations", "top_entropy_quantile",
              "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
              "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max")
# The tool's own advantage settings (grpokit/advantages.py, grpokit/mixed_loss.py), from the run config.
OWN_FIELDS = ("baseline_type", "reward_scaling", "reward_clipping", "reward_normalization", "dynamic_sampling",
              "sft_loss_weight")


def _resolved(values: dict[str, Any]) -> dict[str, Any]:
    """TRL's own resolution of a few spellings (GRPOConfig.__post_init__, GRPOTrainer.__init__)."""
    out = dict(values)
    if out.get("epsilon_high") is None:
        out["epsilon_high"] = out.get("epsilon")  # GRPOTrainer: epsilon_high defaults to epsilon
    out["scale_rewards"] = {True: "group", False: "none"}.get(out.get("scale_rewards"), out.get("scale_rewards"))
    return out


def pinned(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` for TRL's GRPOConfig with every loss setting explicit: the run's value, else TRL's declared default,
    resolved as TRL resolves it (epsilon_high = epsilon), so no config class can fill in one of its own."""
    from config.loader import trl_field_defaults

    defaults = trl_field_defaults()
    values = {name: kwargs.get(name, defaults.get(name)) for name in TRL_FIELDS if name in kwargs or name in defaults}
    return {**kwargs, **_resolved(values)}


def keep(args, kwargs: dict[str, Any]) -> list[str]:
    """Put back on a built GRPOConfig (`args`) each loss setting a config class changed from the pinned `kwargs`
    (Unsloth's generated one rewrites some in its __init__); returns 'name: theirs -> ours' for the log."""
    wanted = _resolved({name: kwargs[name] for name in TRL_FIELDS if name in kwargs})
    changed = []
    for name, value in wanted.items():
        if hasattr(args, name) and getattr(args, name) != value:
            changed.append(f"{name}: {getattr(args, name)!r} -> {value!r}")
            setattr(args, name, value)
    if changed:
        # On the console too: Unsloth's generated config prints that it will override (e.g. "Will override" for
        # dr_grpo's scale_rewards), and a person reading only that line would believe the run trains its value.
        log.info("%s changed loss settings the run gave it; the run trains its own, as on every machine: %s (set "
                 "them to train another value)", type(args).__name__, "; ".join(changed))
    return changed


def stated(config, engine: str | None = None, backend: str | None = None) -> dict[str, Any]:
    """The objective of `config` (a GRPORunConfig) as TRL's semantics give it, without importing TRL: what the run
    will train on any machine. `engine`: the rollout engine (the load plan's): 'vllm' and 'llama_cpp' sample apart
    from the trainer, so TRL's importance-sampling correction applies; None or 'transformers': the trainer samples.
    `backend`: 'unsloth' or 'transformers' where known (None: either)."""
    from config.loader import trl_kwargs

    kwargs = trl_kwargs(config)
    use_vllm = bool(config.fast_inference or kwargs.get("use_vllm")) or engine == "vllm"
    values = _resolved({name: value for name, value in pinned(kwargs).items() if name in TRL_FIELDS})
    # On a CPU 'auto' is decided at load (the load plan says 'llama_cpp or transformers'): both cases are stated.
    undecided = engine is not None and " or " in engine
    objective = _assemble(values, config, use_vllm, None if undecided else engine == "llama_cpp")
    kept = truncation(kwargs)
    if (use_vllm and kept and values["vllm_importance_sampling_correction"] and backend in (None, "unsloth")
            and not _kept_set_refused(values["beta"], kwargs, config)):
        objective["policy_scored_over"] = (f"the sampler's kept set ({kept}) where Unsloth's vLLM returns kept-set "
                                           "log-probs (CUDA, decided at load), else the vocabulary")
    return objective


def truncation(kwargs: dict[str, Any]) -> str:
    """The sampler's top_k / top_p / min_p where they truncate ('' for full-vocabulary sampling)."""
    parts = [f"top_k {kwargs['top_k']}" if (kwargs.get("top_k") or 0) > 0 else "",
             f"top_p {kwargs['top_p']:g}" if kwargs.get("top_p") is not None and kwargs["top_p"] < 1 else "",
             f"min_p {kwargs['min_p']:g}" if (kwargs.get("min_p") or 0) > 0 else ""]
    return ", ".join(p for p in parts if p)


def _kept_set_refused(beta: float, kwargs: dict[str, Any], config) -> bool:
    """Unsloth's own refusals (_unsloth_grpo_support_mismatch in its generated trainer): a reference pass (beta), or
    rollouts reused across optimizer steps, score other weights than the sampler's, so their kept set differs."""
    accumulation = int(config.gradient_accumulation_steps or 1)
    every = int(kwargs.get("steps_per_generation") or accumulation) * int(kwargs.get("num_iterations") or 1)
    return beta != 0 or accumulation % every != 0


def _kept_set_of(trainer) -> bool:
    """Whether Unsloth's generated trainer scores the policy over the vLLM sampler's kept set: its own decision
    (unsloth_zoo's grpo_truncated_support_kwargs, then the generated module's refusals)."""
    import sys

    if not getattr(trainer, "use_vllm", False):
        return False
    generated = next((cls for cls in type(trainer).__mro__ if cls.__name__ == "UnslothGRPOTrainer"), None)
    if generated is None:
        return False
    try:
        from unsloth_zoo.rl_replacements import grpo_truncated_support_kwargs
    except ImportError:
        return False
    refusals = getattr(sys.modules.get(generated.__module__), "_unsloth_grpo_support_mismatch", None)
    return bool(grpo_truncated_support_kwargs(trainer)) and not (refusals and refusals(trainer))


def of_trainer(trainer, config) -> dict[str, Any]:
    """The objective the built trainer trains: read from the attributes its loss reads (GRPOTrainer.__init__ copies
    them from its args; Unsloth's generated trainer reads the same ones)."""
    from grpokit.trl_engine_adapter import uses_engine

    read = {"epsilon": "epsilon_low"}
    values = {name: getattr(trainer, read.get(name, name), getattr(trainer.args, name, None)) for name in TRL_FIELDS}
    for name in ("vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min",
                 "vllm_importance_sampling_clip_max"):
        values[name] = getattr(trainer, name, getattr(trainer.args, name, None))
    objective = _assemble(values, config, bool(trainer.use_vllm), uses_engine(trainer))
    if _kept_set_of(trainer):
        objective["policy_scored_over"] = f"the sampler's kept set ({truncation(vars(trainer.args))})"
    return objective


def _assemble(values: dict[str, Any], config, use_vllm: bool, engine_logprobs: bool | None) -> dict[str, Any]:
    """`engine_logprobs` None: not known before the load (a CPU's 'auto' engine)."""
    objective = {name: values[name] for name in TRL_FIELDS if not name.startswith("vllm_")}
    # TRL's truncated importance sampling for the sampler/trainer mismatch: only where another engine samples.
    on = bool(values["vllm_importance_sampling_correction"])
    low = values["vllm_importance_sampling_clip_min"] or 0  # None: no lower bound (a ratio is never below 0)
    correction = (f"{values['vllm_importance_sampling_mode']}, ratio in [{low:g}"
                  f", {values['vllm_importance_sampling_clip_max']}]") if on else "off"
    if use_vllm or engine_logprobs:
        objective["sampler_correction"] = correction
    elif engine_logprobs is None:
        objective["sampler_correction"] = f"{correction} where llama_cpp samples; none needed where the trainer does"
    else:
        objective["sampler_correction"] = "none needed (the trainer samples)"
    # the vocabulary the policy's log-probs are normalised over (stated / of_trainer say where it is the kept set)
    objective["policy_scored_over"] = "the vocabulary"
    objective.update({name: getattr(config, name) for name in OWN_FIELDS})
    return objective


def describe(objective: dict[str, Any]) -> str:
    """One line for the run header: the loss, its clip range and masking, the KL weight and the advantages."""
    o = objective
    parts = [f"{o['loss_type']}", f"clip [{1 - o['epsilon']:g}, {1 + o['epsilon_high']:g}]",
             f"beta {o['beta']:g}", f"scale {o['scale_rewards']}",
             "truncated masked" if o["mask_truncated_completions"] else "truncated kept"]
    if o.get("policy_scored_over", "the vocabulary") != "the vocabulary":
        parts.append("policy over the sampler's kept set")
    if o["importance_sampling_level"] != "token":
        parts.append(f"IS {o['importance_sampling_level']}")
    if o["baseline_type"] != "group_mean":
        parts.append(o["baseline_type"].replace("exponential_moving_average", "EMA"))
    if o["dynamic_sampling"]:
        parts.append("dynamic sampling")
    if o["sft_loss_weight"]:
        parts.append(f"+ SFT x{o['sft_loss_weight']:g}")
    return ", ".join(parts)

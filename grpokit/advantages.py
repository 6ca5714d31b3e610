"""Group baselines, reward post-processing and dynamic sampling on top of TRL 1.15's GRPO advantages.

TRL computes one advantage per completion inside `GRPOTrainer._generate_and_score_completions`: the weighted sum of
the reward functions, minus its group's mean, divided by a std (`scale_rewards`). This module replaces that step when
the run asks for something else, in one fixed order:

    components -> weights -> sum -> x reward_scaling -> clip to +-reward_clipping -> running normalisation
    -> baseline (group_mean | group_median | exponential_moving_average | leave_one_out) -> scale_rewards

With every option at its default TRL's own advantages are used untouched (`Options.reshapes` is False). The hook
(`generate_and_score`) runs TRL's step, then recomputes the advantages from the gathered per-function rewards that
`TRLGRPOTrainer._calculate_rewards` keeps (`trainer._gathered_rewards`), and keeps TRL's per-process slice. Only
training steps are touched: evaluation reports TRL's own rewards and advantages.

Design decisions (docs/grpo-options.md):
- The pure functions (`group_baselines`, `advantages`, `transform_rewards`, `Welford`, `PromptEMA`) take the whole
  gathered batch, NaN for a completion no reward function could score (TRL turns `None` into NaN). Such a row never
  enters a baseline, a std or the normaliser, and gets advantage 0.
- A group whose valid rewards are all equal gets advantage 0 (there is nothing to compare), for every baseline except
  the EMA with scale_rewards 'none' / 'batch', whose baseline comes from earlier steps: there `r - baseline` is the
  signal. With scale_rewards 'group' the EMA gives such a group 0 too: dividing a history-based difference by the
  group's std (0 + 1e-4) would multiply it by 10^4; with 'batch' a step whose rewards are all equal gets 0 for the
  same reason. "Equal" is relative: within REL_TOL (1e-6) of the batch's largest |reward|, so float rounding of
  values like 1/3 at any magnitude is not mistaken for signal (nor kept by dynamic sampling).
- EMA baseline: one value per prompt (keyed by the row's `id` column, else by the prompt itself), carried across
  steps: b = decay * b_previous + (1 - decay) * group mean, and the first time a prompt is seen b = its group mean.
  A prompt comes back once per epoch (per dynamic-sampling draw), so in a one-epoch run it equals group_mean.
- The reward normaliser (Welford) is updated with a step's valid rewards before it normalises them (the first step is
  normalised by its own statistics); until it has two values with a non-zero spread it only subtracts the mean.
- EMA values and normaliser statistics are saved as `reward_state.json` in every checkpoint and loaded on resume.
  A checkpoint taken in the middle of a generation buffer (steps_per_generation or num_iterations > 1) saves the
  state as it was before that buffer's batch was scored: a resumed run generates that batch again (TRL keeps no
  buffer in a checkpoint) and scores it once, as the uninterrupted run did, instead of counting it twice.
- Dynamic sampling (DAPO, arXiv:2503.14476 §3.2; trl#3708): groups whose (post-processed) rewards have zero variance
  are dropped and replaced by groups of new prompts drawn at random from the training set, at most
  `dynamic_sampling_max_rounds` extra generation rounds per generation batch. Every rank computes the kept counts of
  every rank from the gathered rewards, so all agree on the number of rounds without another collective. When the
  cap is reached the batch is completed with dropped groups (what TRL would have trained on: advantage 0 for the
  in-group baselines), the step's `dynamic_sampling/capped` is 1 and the first time it happens a warning says so.
  The refill prompts are drawn beside the epoch's data loader, which is left as it is (epochs, resumes and
  `num_iterations` reuse are unchanged); a prompt already drawn for this batch is not drawn again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("grpo")

BASELINES = ("group_mean", "group_median", "exponential_moving_average", "leave_one_out")
SCALE_REWARDS = ("group", "batch", "none")
STATE_FILE = "reward_state.json"
STD_EPS = 1e-4  # what TRL adds to the std before dividing (grpo_trainer.py)
# Rewards that differ by less than this fraction of the batch's largest |reward| are equal: float32 rounding (1/3 of
# one sum against 1/3 of another, 0.1 + 0.2 against 0.3, a normalised value) differs by a few 1e-8 of the magnitude,
# at any magnitude, so an absolute tolerance would call such a group "spread" at 1e3 and flat ones spread at 1e-9.
REL_TOL = 1e-6

# Batch keys dynamic sampling knows how to merge across rounds: (side the padding goes, padding value; None = the
# tokenizer's pad id). Anything else in TRL's output (images, token_type_ids, ...) turns dynamic sampling off.
_PADDED = {
    "prompt_ids": ("left", None), "prompt_mask": ("left", 0),
    "completion_ids": ("right", None), "completion_mask": ("right", 0),
    "old_per_token_logps": ("right", 0.0), "ref_per_token_logps": ("right", 0.0),
    "sampling_per_token_logps": ("right", 0.0), "importance_sampling_ratio": ("right", 1.0),
    "tool_mask": ("right", 1),
}
_ROW_KEYS = {"advantages"}
_BATCH_KEYS = {"num_items_in_batch"}
# Unsloth's generated GPU trainer adds the batch's widest prompt left padding, repeated on every row ([rows, 1])
# (unsloth/models/rl_replacements.py, max_left_pad), and scores old / reference log-probs in another frame than TRL's:
# its no-grad pass moves every row's pad tokens to the right (unsloth_zoo's left_pack_padding) and keeps the last
# completion width + max_left_pad positions, so row i's completion starts at column max_left_pad - (row i's prompt
# pads). Its fused loss reads them back in that frame, its width giving max_left_pad (grpo_accumulated_loss). A merged
# batch gets both recomputed for its own rows (_repacked).
_LEFT_PAD_KEY = "max_left_pad"
_PACKED = ("old_per_token_logps", "ref_per_token_logps")


@dataclasses.dataclass(frozen=True)
class Options:
    """The run's settings for this module (config/schema.py documents each field)."""

    baseline_type: str = "group_mean"
    baseline_ema_decay: float = 0.9
    reward_scaling: float = 1.0
    reward_clipping: float = 0.0
    reward_normalization: bool = False
    dynamic_sampling: bool = False
    dynamic_sampling_max_rounds: int = 3

    @classmethod
    def from_config(cls, config) -> Options:
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})

    @property
    def reshapes(self) -> bool:
        """Whether the advantages differ from TRL's: otherwise TRL's are used as they are, bit for bit."""
        return (self.baseline_type != "group_mean" or self.reward_scaling != 1.0 or self.reward_clipping > 0
                or self.reward_normalization)


# ---- pure functions ----------------------------------------------------------------------------------------------


def _nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """TRL's `nanstd`: Bessel-corrected std over the non-NaN values; NaN with fewer than two."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True)
    variance = variance * torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
    std = torch.sqrt(variance)
    return std.squeeze(dim) if dim is not None else std.reshape(())


def group_baselines(rewards: torch.Tensor, group_size: int, baseline: str,
                    ema: torch.Tensor | None = None) -> torch.Tensor:
    """The baseline of every completion, shape [B] (NaN where there is none).

    rewards: [B] with the groups' completions consecutive, NaN = excluded. `ema`: [B / group_size], the EMA baseline
    of each group (PromptEMA.update), needed only for 'exponential_moving_average'.
    """
    groups = rewards.view(-1, group_size)
    valid = ~torch.isnan(groups)
    count = valid.sum(dim=1, keepdim=True)
    if baseline == "group_mean":
        base = torch.nanmean(groups, dim=1, keepdim=True).expand_as(groups)
    elif baseline == "group_median":
        # NaN sorts last as +inf; the median of n valid values is the mean of the two middle ones (the same one when
        # n is odd), unlike torch.nanmedian, which takes the lower of the two.
        ordered = torch.where(valid, groups, torch.full_like(groups, math.inf)).sort(dim=1).values
        low = ((count - 1).clamp(min=0) // 2)
        high = (count // 2).clamp(max=group_size - 1)
        middle = (ordered.gather(1, low) + ordered.gather(1, high)) / 2
        base = torch.where(count > 0, middle, torch.full_like(middle, math.nan)).expand_as(groups)
    elif baseline == "leave_one_out":
        # RLOO (Ahmadian et al. 2024): the mean of the group's other valid completions. A completion alone in its
        # group has no others: its baseline is itself (advantage 0).
        total = torch.nansum(groups, dim=1, keepdim=True)
        others = (total - groups) / (count - 1).clamp(min=1)
        base = torch.where(count > 1, others, groups)
    elif baseline == "exponential_moving_average":
        if ema is None:
            raise ValueError("the exponential_moving_average baseline needs the groups' EMA values")
        base = ema.to(groups).view(-1, 1).expand_as(groups)
    else:
        raise ValueError(f"unknown baseline {baseline!r}; valid: {', '.join(BASELINES)}")
    return torch.where(valid, base, torch.full_like(base, math.nan)).reshape(-1)


def _scale(rewards: torch.Tensor) -> torch.Tensor:
    """The batch's largest |valid reward| (0 when none): what REL_TOL is relative to."""
    valid = rewards[~torch.isnan(rewards)]
    return valid.abs().max() if valid.numel() else torch.zeros((), dtype=rewards.dtype, device=rewards.device)


def _spread(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(max - min over each row's valid values, the count of valid values) of a [G, n] tensor with NaNs."""
    valid = ~torch.isnan(groups)
    high = torch.where(valid, groups, torch.full_like(groups, -math.inf)).max(dim=1).values
    low = torch.where(valid, groups, torch.full_like(groups, math.inf)).min(dim=1).values
    return high - low, valid.sum(dim=1)


def zero_spread_groups(rewards: torch.Tensor, group_size: int, scale: torch.Tensor | None = None) -> torch.Tensor:
    """[B / group_size] bool: groups whose valid rewards are all equal (or that have fewer than two). Equal: within
    REL_TOL of `scale` (by default the largest |reward| of `rewards`, the whole gathered batch)."""
    spread, count = _spread(rewards.view(-1, group_size))
    scale = _scale(rewards) if scale is None else scale
    return (count < 2) | (spread <= REL_TOL * scale)


def flat_batch(rewards: torch.Tensor) -> bool:
    """Whether every valid reward of the batch is the same (within REL_TOL of the largest |reward|)."""
    spread, count = _spread(rewards.reshape(1, -1))
    return bool(count[0] < 2 or spread[0] <= REL_TOL * _scale(rewards))


def advantages(rewards: torch.Tensor, group_size: int, baseline: str = "group_mean", scale_rewards: str = "group",
               ema: torch.Tensor | None = None) -> torch.Tensor:
    """Advantage of every completion: (reward - baseline), divided by the group's std ('group'), the batch's std
    ('batch') or nothing ('none'), + 1e-4 as TRL. Rows with a NaN reward, and groups with zero spread (see the module
    docstring for the EMA exception), get 0. Computed in float64 (returned in the rewards' dtype), so a difference
    of two large rewards keeps its digits. Shape [B]."""
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}; valid: {', '.join(SCALE_REWARDS)}")
    dtype, rewards = rewards.dtype, rewards.double()
    ema = ema.double() if ema is not None else None
    adv = rewards - group_baselines(rewards, group_size, baseline, ema)
    if scale_rewards == "group":
        adv = adv / (_nanstd(rewards.view(-1, group_size), dim=1).repeat_interleave(group_size) + STD_EPS)
    elif scale_rewards == "batch":
        adv = adv / (_nanstd(rewards) + STD_EPS)
    if baseline != "exponential_moving_average" or scale_rewards == "group":
        # In-group baselines: exactly 0 mathematically, so float noise (x 1e4 under 'group') never becomes signal.
        # A history-based (EMA) baseline keeps `r - b` for such a group unless 'group' would divide it by ~1e-4.
        adv = adv.masked_fill(zero_spread_groups(rewards, group_size).repeat_interleave(group_size), 0.0)
    elif scale_rewards == "batch" and flat_batch(rewards):
        # EMA + 'batch' on a step whose rewards are all equal (every completion failed): the batch has no spread to
        # scale by, and `r - b` over 1e-4 would be ~10^4 times the reward. Nothing in this batch tells completions
        # apart, so it teaches nothing, as a flat group under 'group'.
        adv = torch.zeros_like(adv)
    return torch.nan_to_num(adv, nan=0.0).to(dtype)


def transform_rewards(raw: torch.Tensor, scaling: float = 1.0, clipping: float = 0.0) -> tuple[torch.Tensor,
                                                                                                  torch.Tensor]:
    """(raw x scaling, clipped to +-clipping when clipping > 0; a [B] bool of the valid values clipping changed).
    NaN stays NaN."""
    scaled = raw * scaling
    if clipping <= 0:
        return scaled, torch.zeros_like(raw, dtype=torch.bool)
    clipped = scaled.clamp(-clipping, clipping)
    return clipped, ~torch.isnan(scaled) & (scaled.abs() > clipping)


class Welford:
    """Running mean and variance of every valid reward seen in the run (Chan et al.'s merge of a batch into the
    running moments, exact in one pass)."""

    def __init__(self, count: int = 0, mean: float = 0.0, m2: float = 0.0):
        self.count, self.mean, self.m2 = count, mean, m2

    def update(self, values: torch.Tensor) -> None:
        values = values[~torch.isnan(values)].double()
        n = values.numel()
        if n == 0:
            return
        batch_mean = values.mean().item()
        batch_m2 = ((values - batch_mean) ** 2).sum().item()
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * n / total
        self.m2 += batch_m2 + delta * delta * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 0.0

    def normalise(self, values: torch.Tensor) -> torch.Tensor:
        """(values - mean) / std; while every value seen is the same (std within REL_TOL of |mean|: rounding), the
        mean is only subtracted."""
        std = self.std
        spread = std > REL_TOL * abs(self.mean) and std > 0
        return (values - self.mean) / (std if spread else 1.0)

    def state(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}


class PromptEMA:
    """One baseline per prompt, carried across steps: b = decay * b + (1 - decay) * group mean; first sighting: b =
    the group mean."""

    def __init__(self, decay: float, values: dict[str, float] | None = None):
        self.decay = decay
        self.values: dict[str, float] = dict(values or {})

    def update(self, keys: list[str], group_means: torch.Tensor) -> torch.Tensor:
        """The baselines of these groups (in order; a prompt twice in one batch is updated twice), NaN for a group
        with no valid reward (which leaves its prompt's value alone)."""
        out = []
        for key, mean in zip(keys, group_means.tolist(), strict=True):
            if math.isnan(mean):
                out.append(math.nan)
                continue
            previous = self.values.get(key)
            value = mean if previous is None else self.decay * previous + (1 - self.decay) * mean
            self.values[key] = value
            out.append(value)
        return torch.tensor(out, dtype=group_means.dtype, device=group_means.device)


# ---- the trainer side ----------------------------------------------------------------------------------------------


class RunState:
    """What a resumed run needs to continue: the EMA baselines and the normaliser (saved in each checkpoint)."""

    def __init__(self, options: Options):
        self.ema = PromptEMA(options.baseline_ema_decay)
        self.normaliser = Welford()
        self.warned: set[str] = set()  # warnings said once per run
        self.before_generation: dict[str, Any] | None = None  # to_json() before the current buffer's batch

    def mark_generation(self) -> None:
        """Called before a generation batch is scored: the state a checkpoint in the middle of its buffer saves."""
        self.before_generation = json.loads(json.dumps(self.to_json()))

    def to_json(self) -> dict[str, Any]:
        return {"ema_baselines": self.ema.values, "normaliser": self.normaliser.state()}

    def load(self, data: dict[str, Any]) -> None:
        self.ema.values = dict(data.get("ema_baselines", {}))
        self.normaliser = Welford(**data.get("normaliser", {}))


def run_state(trainer) -> RunState:
    state = getattr(trainer, "_reward_run_state", None)
    if state is None:
        state = trainer._reward_run_state = RunState(trainer.advantage_options or Options())
    return state


def save_state(trainer, checkpoint_dir: str | Path) -> None:
    """Called while a checkpoint is written (before it is marked complete); every rank holds the same state. In the
    middle of a generation buffer: the state before the buffer's batch was scored (see the module docstring)."""
    options = trainer.advantage_options
    if options is None or not options.reshapes or not trainer.args.should_save:
        return
    state = run_state(trainer)
    data = state.to_json()
    if mid_buffer(trainer) and state.before_generation is not None:
        data = state.before_generation
    (Path(checkpoint_dir) / STATE_FILE).write_text(json.dumps(data) + "\n")


def mid_buffer(trainer) -> bool:
    """Whether the next training step reuses generations already made (TRL's `_prepare_inputs`: a new batch every
    steps_per_generation x num_iterations micro-steps, counted by `_step`)."""
    every = getattr(trainer.args, "steps_per_generation", 1) * getattr(trainer, "num_iterations", 1)
    return getattr(trainer, "_step", 0) % max(1, every) != 0


def load_state(trainer, checkpoint_dir: str | Path | None) -> None:
    options = trainer.advantage_options
    if checkpoint_dir is None or options is None or not options.reshapes:
        return
    path = Path(checkpoint_dir) / STATE_FILE
    if not path.exists():
        if options.baseline_type == "exponential_moving_average" or options.reward_normalization:
            log.warning("%s has no %s: the EMA baselines and reward normaliser start afresh.", checkpoint_dir,
                        STATE_FILE)
        return
    run_state(trainer).load(json.loads(path.read_text()))


def _prompt_key(row: dict[str, Any]) -> str:
    if row.get("id") is not None:
        return str(row["id"])
    return hashlib.sha1(json.dumps(row.get("prompt"), sort_keys=True, default=str).encode()).hexdigest()


def _summed_rewards(trainer) -> torch.Tensor:
    """TRL's weighted sum of the gathered per-function rewards, NaN where every function returned None."""
    per_func = trainer._gathered_rewards
    summed = (per_func * trainer.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
    return summed.masked_fill(torch.isnan(per_func).all(dim=1), math.nan)


def _score_round(trainer, generate, inputs: list[dict[str, Any]]) -> tuple[dict[str, Any], torch.Tensor]:
    """TRL's generate-and-score on `inputs`, then our advantages; returns (TRL's output, zero-spread flag per global
    group). All ranks call it together (TRL gathers the rewards; the EMA gathers the prompt keys)."""
    options, state, metrics = trainer.advantage_options, run_state(trainer), trainer._metrics["train"]
    group_size = trainer.num_generations
    trainer._gathered_rewards = None
    output = generate(inputs)
    if trainer._gathered_rewards is None:  # a rollout path that skipped _calculate_rewards: TRL's advantages
        return output, torch.zeros(0, dtype=torch.bool)
    raw = _summed_rewards(trainer)
    if not options.reshapes:
        return output, zero_spread_groups(raw, group_size)
    rewards, clipped = transform_rewards(raw, options.reward_scaling, options.reward_clipping)
    valid = ~torch.isnan(rewards)
    if options.reward_normalization:
        state.normaliser.update(rewards)
        rewards = state.normaliser.normalise(rewards)
    ema = None
    if options.baseline_type == "exponential_moving_average":
        from accelerate.utils import gather_object

        keys = gather_object([_prompt_key(row) for row in inputs])[::group_size]
        ema = state.ema.update(keys, torch.nanmean(rewards.view(-1, group_size), dim=1))
    adv = advantages(rewards, group_size, options.baseline_type, trainer.scale_rewards, ema)
    start = trainer.accelerator.process_index * len(inputs)
    output["advantages"] = adv[start:start + len(inputs)].to(output["advantages"])
    trainer._logs["advantages"].extend(adv.tolist())  # a deque of one generation batch: replaces TRL's values
    n_valid = max(int(valid.sum()), 1)
    metrics["reward/raw_mean"].append(torch.nanmean(raw).item())
    metrics["reward/transformed_mean"].append(torch.nanmean(rewards).item())
    metrics["reward/clipped_frac"].append(clipped.sum().item() / n_valid)
    if options.reward_normalization:
        metrics["reward/running_mean"].append(state.normaliser.mean)
        metrics["reward/running_std"].append(state.normaliser.std)
    metrics["baseline/mean"].append(torch.nanmean(group_baselines(rewards, group_size, options.baseline_type,
                                                                  ema)).item())
    return output, zero_spread_groups(rewards, group_size)


def generate_and_score(trainer, generate, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """TRLGRPOTrainer._generate_and_score_completions: `generate` is TRL's own."""
    options = getattr(trainer, "advantage_options", None)
    if options is None or not trainer.model.training or not (options.reshapes or options.dynamic_sampling):
        return generate(inputs)
    run_state(trainer).mark_generation()
    if not options.dynamic_sampling:
        return _score_round(trainer, generate, inputs)[0]
    return _dynamic_sampling(trainer, generate, inputs)


# ---- dynamic sampling ------------------------------------------------------------------------------------------------


def _dynamic_sampling(trainer, generate, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    options, state, metrics = trainer.advantage_options, run_state(trainer), trainer._metrics["train"]
    group_size, world = trainer.num_generations, trainer.accelerator.num_processes
    rank = trainer.accelerator.process_index
    local_groups = len(inputs) // group_size
    if len(inputs) % group_size:
        # A group split across processes cannot be kept or dropped by one of them (config/loader.py refuses this
        # shape up front; this is the guard for a trainer built another way).
        _warn_once(trainer, "dynamic_sampling: a process holds part of a group; dynamic sampling is off.")
        return generate(inputs)
    outputs, flags = [], []
    kept = [0] * world  # kept groups per rank, known to every rank
    drawn = {_prompt_key(row) for row in inputs}
    round_inputs, rounds, capped = inputs, 0, False
    while True:
        output, flat = _score_round(trainer, generate, round_inputs)
        if flat.numel() == 0 or set(output) - set(_PADDED) - _ROW_KEYS - _BATCH_KEYS - {_LEFT_PAD_KEY}:
            _warn_once(trainer, "dynamic_sampling: this batch has fields it cannot merge (images, tools, a custom "
                                "rollout); dynamic sampling is off.")
            return output if rounds == 0 else outputs[0]
        outputs.append(output)
        per_rank = flat.view(world, -1)
        flags.append(per_rank[rank])
        for r in range(world):
            kept[r] += int((~per_rank[r]).sum())
        if min(kept) >= local_groups:
            break
        if rounds >= options.dynamic_sampling_max_rounds:
            capped = True
            break
        rounds += 1
        seen = sum(f.numel() for f in flags) * world
        pass_rate = sum(kept) / seen
        # Draw as many groups as the pass rate so far says will fill the emptiest rank, never more than a normal
        # generation batch (memory), the same count on every rank (TRL gathers the rewards).
        need = local_groups - min(kept)
        count = min(local_groups, math.ceil(need / pass_rate) if pass_rate > 0 else local_groups)
        round_inputs = _draw_prompts(trainer, count, rounds, drawn)
    seen = sum(f.numel() for f in flags) * world
    metrics["dynamic_sampling/kept_frac"].append(sum(kept) / seen)
    metrics["dynamic_sampling/rounds"].append(float(rounds))
    metrics["dynamic_sampling/capped"].append(float(capped))
    if capped and "capped" not in state.warned:
        state.warned.add("capped")
        log.warning("dynamic_sampling: %d extra round(s) did not find %d groups with reward variance per process "
                    "(pass rate %.2f); the batch is completed with zero-variance groups (advantage 0). Logged as "
                    "dynamic_sampling/capped; warned once per run.", rounds, local_groups, sum(kept) / seen)
    if len(outputs) == 1:
        return outputs[0]  # nothing was dropped (or the cap is 0): TRL's batch as it is
    # This rank's kept groups in the order they were generated, then dropped ones to fill up to the batch TRL expects.
    pieces = [(i, g) for i, flag in enumerate(flags) for g in range(flag.numel()) if not flag[g]]
    pieces += [(i, g) for i, flag in enumerate(flags) for g in range(flag.numel()) if flag[g]]
    return _merge(trainer, outputs, pieces[:local_groups], group_size)


def _draw_prompts(trainer, count: int, round_index: int, drawn: set[str]) -> list[dict[str, Any]]:
    """`count` new prompts for this rank, each repeated num_generations times (as TRL's RepeatSampler lays them out).

    One random order of the training set, the same on every rank (seeded by the run's seed, the step and the round),
    skipping prompts already drawn for this batch; rank r takes the r-th block, so ranks draw different prompts. A
    training set too small to avoid repeats repeats."""
    dataset, world = trainer.train_dataset, trainer.accelerator.num_processes
    generator = torch.Generator().manual_seed(
        (trainer.args.seed * 1_000_003 + trainer.state.global_step) * 101 + round_index)
    order = torch.randperm(len(dataset), generator=generator).tolist()
    picked, fallback = [], []
    for index in order:
        row = dataset[index]
        key = _prompt_key(row)
        (fallback if key in drawn else picked).append(row)
        if len(picked) == count * world:
            break
    picked = (picked + fallback * (count * world))[:count * world]
    drawn.update(_prompt_key(row) for row in picked)
    mine = picked[trainer.accelerator.process_index * count:(trainer.accelerator.process_index + 1) * count]
    return [dict(row) for row in mine for _ in range(trainer.num_generations)]


def _merge(trainer, outputs: list[dict[str, Any]], pieces: list[tuple[int, int]], group_size: int) -> dict[str, Any]:
    """One batch of TRL's shape from groups of several rounds: rows concatenated, each tensor padded to the widest
    round on the side TRL pads it (left for prompts, right for completions; masks 0 there, so the loss never sees the
    padding; rotary positions shift together, which leaves attention unchanged). Unsloth's left-packed old /
    reference log-probs are moved into the merged batch's frame instead (_repacked)."""
    pad_id = trainer._tokenizer.pad_token_id
    packed = _LEFT_PAD_KEY in outputs[0]
    merged: dict[str, Any] = {}
    for key in outputs[0]:
        if key in _BATCH_KEYS or key == _LEFT_PAD_KEY or (packed and key in _PACKED):
            continue
        if outputs[0][key] is None:  # e.g. sampling_per_token_logps where no other engine sampled
            merged[key] = None
            continue
        parts = [outputs[i][key][g * group_size:(g + 1) * group_size] for i, g in pieces]
        if key in _PADDED and parts[0].dim() > 1:
            side, value = _PADDED[key]
            value = pad_id if value is None else value
            width = max(p.size(1) for p in parts)
            padded = []
            for p in parts:
                fill = p.new_full((p.size(0), width - p.size(1)), value)
                padded.append(torch.cat([fill, p] if side == "left" else [p, fill], dim=1))
            parts = padded
        merged[key] = torch.cat(parts, dim=0)
    if packed:
        # what Unsloth computes for a batch (calculate_pad_tokens_in_prompt): the pad tokens in each row's prompt
        widest = int((merged["prompt_ids"] == pad_id).sum(dim=1).max())
        merged[_LEFT_PAD_KEY] = outputs[0][_LEFT_PAD_KEY].new_full((merged["prompt_ids"].size(0), 1), widest)
        for key in _PACKED:
            if key in outputs[0]:
                merged[key] = None if outputs[0][key] is None else _repacked(outputs, pieces, group_size, key, merged,
                                                                             widest)
    mask = merged["completion_mask"] * merged["tool_mask"] if "tool_mask" in merged else merged["completion_mask"]
    # TRL normalises the DAPO-style losses by the completion tokens of the whole batch on every process
    merged["num_items_in_batch"] = trainer.accelerator.gather(mask.sum()).sum()
    return merged


def _repacked(outputs: list[dict[str, Any]], pieces: list[tuple[int, int]], group_size: int, key: str,
              merged: dict[str, Any], widest: int) -> torch.Tensor:
    """Unsloth's left-packed log-probs (`key`) of each piece moved into the merged batch's frame.

    Left-packing keeps each row's non-pad tokens in order from column 0, and merging only adds pads (on the prompt's
    left, the completion's right), so every scored token keeps its packed position. A round's frame holds the packed
    positions from its length - its frame width on (prompt width - its max_left_pad, the width giving max_left_pad as
    the loss reads it); the merged frame from prompt width - `widest`, `widest` + completion width wide. Each round's
    columns so move by one offset; those that fall before the merged frame precede every kept row's completion
    (the round's widest padding was in a dropped group) and are prompt positions no loss reads."""
    prompt_width, completion_width = merged["prompt_ids"].size(1), merged["completion_ids"].size(1)
    start = prompt_width - widest
    parts = []
    for i, g in pieces:
        rows = outputs[i][key][g * group_size:(g + 1) * group_size]
        round_start = outputs[i]["prompt_ids"].size(1) + outputs[i]["completion_ids"].size(1) - rows.size(1)
        shift = round_start - start
        part = rows.new_zeros((rows.size(0), widest + completion_width))
        first = max(0, -shift)
        part[:, first + shift:rows.size(1) + shift] = rows[:, first:]
        parts.append(part)
    return torch.cat(parts, dim=0)


def _warn_once(trainer, message: str) -> None:
    state = run_state(trainer)
    if message not in state.warned:
        state.warned.add(message)
        log.warning("%s", message)

"""Adaptive group size: the completions sampled per prompt grow over training, min_group_size -> max_group_size.

The verl-style guide's knob (`adaptive_group_size: true, min_group_size: 4, max_group_size: 16,
group_size_schedule: linear`): small groups early (more distinct prompts per step while most groups still differ
in reward), larger groups later (a finer baseline once rewards bunch up). TRL's GRPOTrainer has one fixed
`num_generations`, baked into the sampler it builds once (`RepeatSampler(mini_repeat_count=num_generations)`), so two
things move together here, both reading one pure function of the generation round:

- `ScheduledGroupSampler` (installed by `TRLGRPOTrainer._get_train_sampler`) yields each generation batch as
  batch/size distinct prompts, each repeated size times, repeated `steps_per_generation x num_iterations` times as
  TRL's sampler does (the trainer generates on the first of those micro-steps and reuses the result for the rest).
  Prompts come from a stream of seeded permutations of the dataset, so a round's prompts depend only on the round.
- `set_round_group_size` sets `trainer.num_generations` before each generation round: TRL reads it to generate
  (vLLM's n per prompt) and to group rewards into advantages.

The generation batch never changes size, only how it is divided, so the size must divide it: the valid sizes are
the divisors of the generation batch (per_device_train_batch_size x gradient_accumulation_steps x processes, or
TRL's generation_batch_size) that are >= 2, and a min or max outside them is refused when the config is parsed.
Every rank computes the same size (a function of the step), and a resumed run continues the schedule by
construction. Evaluation keeps the fixed `num_generations` (TRL's `num_generations_eval` is set once at init).

Imported by config validation and `--dry-run`: no torch here.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from config.errors import UsageError

SCHEDULES = ("linear", "stages")


def generation_batch(config: Any, world_size: int = 1) -> tuple[int, int, int]:
    """(global generation batch, steps_per_generation, num_iterations) as TRL's GRPOConfig will compute them."""
    trl_args = config.trl_args
    per_step = config.per_device_train_batch_size * world_size
    if trl_args.get("generation_batch_size"):
        batch = trl_args["generation_batch_size"]
        steps = batch // per_step
    else:
        steps = trl_args.get("steps_per_generation") or config.gradient_accumulation_steps
        batch = per_step * steps
    return batch, steps, trl_args.get("num_iterations") or 1


def valid_group_sizes(batch: int) -> list[int]:
    """Group sizes a generation batch of `batch` completions can be divided into: its divisors >= 2."""
    return [size for size in range(2, batch + 1) if batch % size == 0]


@dataclass(frozen=True)
class GroupSchedule:
    """Group size per optimizer step. `step` is 0-based (the trainer's global_step before the update); the log
    shows that step's metrics as step + 1."""

    sizes: tuple[int, ...]  # the valid sizes from min_group_size to max_group_size, ascending
    kind: str
    total_steps: int
    batch: int  # global generation batch (completions per generation round)
    generate_every: int  # micro-steps per generation round: steps_per_generation x num_iterations
    grad_accum: int

    def size_at_step(self, step: int) -> int:
        fraction = min(max(step, 0), self.total_steps - 1) / max(1, self.total_steps - 1)
        if self.kind == "stages":  # an equal share of the run per size
            return self.sizes[min(int(fraction * len(self.sizes)), len(self.sizes) - 1)]
        target = self.sizes[0] + fraction * (self.sizes[-1] - self.sizes[0])
        return min(self.sizes, key=lambda size: (abs(size - target), size))  # nearest; a tie takes the smaller

    def size_for_round(self, round_index: int) -> int:
        """The size of generation round r: the size of the optimizer step it starts in."""
        return self.size_at_step(round_index * self.generate_every // self.grad_accum)

    def rounds(self) -> int:
        """Generation rounds that cover total_steps optimizer steps."""
        return math.ceil(self.total_steps * self.grad_accum / self.generate_every)

    def changes(self) -> dict[int, int]:
        """{logged step (1-based): size} at the first step and wherever the size changes (for --dry-run)."""
        out: dict[int, int] = {}
        for step in range(self.total_steps):
            size = self.size_at_step(step)
            if not out or size != list(out.values())[-1]:
                out[step + 1] = size
        return out


def schedule_from_config(config: Any, world_size: int = 1) -> GroupSchedule | None:
    """The run's schedule, or None without adaptive_group_size. Raises UsageError for a schedule the batch
    cannot follow (config.loader.validate calls this, so the error comes before anything loads)."""
    if not config.adaptive_group_size:
        return None
    batch, steps_per_generation, num_iterations = generation_batch(config, world_size)
    valid = valid_group_sizes(batch)
    listed = ", ".join(map(str, valid))
    for name in ("min_group_size", "max_group_size"):
        value = getattr(config, name)
        if value not in valid:
            raise UsageError(
                f"'{name}' {value} does not divide the generation batch of {batch} completions (per_device_train_"
                f"batch_size {config.per_device_train_batch_size} x {world_size} process(es) x {steps_per_generation} "
                f"step(s) per generation) into whole groups: valid group sizes are {listed}.")
    if config.min_group_size > config.max_group_size:
        raise UsageError(f"'min_group_size' {config.min_group_size} is larger than 'max_group_size' "
                         f"{config.max_group_size}: the group size grows from min to max.")
    if config.max_steps <= 0:
        raise UsageError("adaptive_group_size plans the group size over the run's steps: set max_steps (--max-steps "
                         "N); with a growing group the number of prompts per epoch is not fixed.")
    sizes = tuple(size for size in valid if config.min_group_size <= size <= config.max_group_size)
    return GroupSchedule(sizes, config.group_size_schedule, config.max_steps, batch,
                         steps_per_generation * num_iterations, config.gradient_accumulation_steps)


class ScheduledGroupSampler:
    """Indices for TRL's train dataloader: per generation round, batch/size prompts each repeated size times, the
    whole round repeated `repeat_count` (= steps_per_generation x num_iterations) times, as TRL's RepeatSampler lays
    them out, so the dataloader, the accelerate sharding and TRL's buffering work unchanged.

    The run is one pass of this sampler (len covers max_steps), so resuming skips batches of the same pass and
    lands on the same rounds. Prompts come from a stream of permutations, permutation k seeded by (seed, k): a new
    order each time the data is used up, and a round's prompts depend only on the rounds before it."""

    def __init__(self, num_prompts: int, schedule: GroupSchedule, repeat_count: int, shuffle: bool = True,
                 seed: int = 0):
        self.num_prompts, self.schedule, self.repeat_count = num_prompts, schedule, repeat_count
        self.shuffle, self.seed = shuffle, seed

    def __len__(self) -> int:
        return self.schedule.rounds() * self.repeat_count * self.schedule.batch

    def _prompt_stream(self):
        permutation = 0
        while True:
            order = list(range(self.num_prompts))
            if self.shuffle:
                random.Random(f"{self.seed}:{permutation}").shuffle(order)
            yield from order
            permutation += 1

    def __iter__(self):
        stream = self._prompt_stream()
        for round_index in range(self.schedule.rounds()):
            size = self.schedule.size_for_round(round_index)
            prompts = [next(stream) for _ in range(self.schedule.batch // size)]
            generation_batch = [index for index in prompts for _ in range(size)]
            for _ in range(self.repeat_count):
                yield from generation_batch


# ---- trainer hooks (TRLGRPOTrainer) ------------------------------------------------------------------------------


def train_sampler(trainer, dataset) -> ScheduledGroupSampler:
    """`_get_train_sampler` with a schedule: TRL's arguments, our grouping."""
    from datasets import IterableDataset

    if isinstance(dataset, IterableDataset):
        raise UsageError("adaptive_group_size needs a map-style dataset (its sampler picks prompts by index); this "
                         "one is an IterableDataset.")
    args = trainer.args
    return ScheduledGroupSampler(len(dataset), trainer.group_schedule, trainer.num_iterations * args.steps_per_generation,
                                 shuffle=trainer.shuffle_dataset, seed=args.seed)


def set_round_group_size(trainer) -> None:
    """Before a training generation round: the group size of the round whose rows the batch holds.

    The trainer consumes one dataloader batch per micro-step, and micro-step m holds round m // generate_every's
    rows, whenever TRL decides to generate (also after a resume, when its buffer is empty)."""
    schedule = trainer.group_schedule
    if schedule is None or not trainer.model.training:
        return
    accumulation = trainer.args.gradient_accumulation_steps
    micro_step = trainer.state.global_step * accumulation + trainer._step % accumulation
    trainer.num_generations = schedule.size_for_round(micro_step // schedule.generate_every)
    trainer._metrics["train"]["group_size"].append(float(trainer.num_generations))

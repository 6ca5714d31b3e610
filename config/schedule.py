"""The adaptive group-size schedule as a pure function of the config (no torch): which group sizes the generation
batch can hold, and the size at each step. Config validation refuses a schedule the batch cannot follow; the sampler
and the trainer hook that follow it are grpokit/group_schedule.py.
"""

from __future__ import annotations

import math
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
        if value < 2:
            raise UsageError(f"'{name}' is {value}: GRPO compares completions within a group, so a group needs at "
                             f"least 2 (valid group sizes for this batch: {listed}).")
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

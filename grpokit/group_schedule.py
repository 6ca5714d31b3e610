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

The schedule itself (pure, checked by config validation) is config/schedule.py.
"""

from __future__ import annotations

import random

from config.errors import UsageError
from config.schedule import SCHEDULES, GroupSchedule, generation_batch, schedule_from_config, valid_group_sizes

__all__ = ["SCHEDULES", "GroupSchedule", "generation_batch", "schedule_from_config", "valid_group_sizes"]


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

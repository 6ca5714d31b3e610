"""TRL's GRPOTrainer with one addition: each distinct prompt goes through the model once, not once per completion.

GRPO samples `num_generations` completions per prompt. TRL runs every prompt + completion row through the model in
full, both when generating (the prefill) and in the log-prob pass, so each prompt is computed `num_generations` times
(4 x 44 of the 68 tokens per row in the speed benchmark). Here the log-prob pass is one forward over one packed row:
the distinct prompts as a prefix tree (their common beginning, such as the chat template's system prompt or a tool
schema, once; each prompt's last token once, its output read by each of its completions' first prediction), then
each completion as a segment that sees only its prompt's path and itself (shared_prompts.pack_by_prompt, a 4D mask;
trailing padding left out); one row per distinct prompt where that row
would hold more attention scores than TRL's pass. Where the attention cannot take such a mask (flash attention,
sliding windows shorter than the rows, recurrent layers) or packing would hold more attention scores than TRL's
rows, the prompt's key/value cache is computed once per distinct prompt and indexed out to its rows, and the
completions (plus the last prompt token, which predicts the first completion token) follow in a second call.
Generation uses that cache form. Same tokens, masks and LM head as TRL's passes, and the same distances between
positions (the prefix tree counts positions from each prompt's first real token: rotary attention sees only the
distances), so the same log-probs and sampling distribution up to float rounding (tests compare both, values and
gradients); in the log-prob pass gradients flow back into the shared prompt.

Imported only after the backend (Unsloth must be imported before TRL).
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
import trl

from grpokit.shared_prompts import distinct_rows, generate_with_shared_prompts, pack_by_prompt

# Attention functions that take a custom 4D mask as it is (grpokit.activation_memory's registers as eager does):
# bool for SDPA, additive for eager. Flash attention takes none; other models keep the two-call pass.
_PACKED_MASK = {"sdpa": "bool", "eager": "additive", "grpo_eager_gqa": "additive"}


@contextlib.contextmanager
def _scored_positions(model, index):
    """While the block runs, the backbone's last hidden states are read at `index` (shared_prompts.Packed.expand: a
    prompt's last token once per completion) before TRL's fused LM head scores them: a forward hook on the module
    that head calls (`base_model` of the model TRL patched, under PEFT its base model). index_select is
    differentiable: a position read by several completions gets the sum of their gradients."""
    if index is None:
        yield
        return
    patched = model.get_base_model() if hasattr(model, "get_base_model") else model
    read = []

    def expand(module, args, output):
        read.append(True)
        output.last_hidden_state = output.last_hidden_state.index_select(1, index)
        return output

    handle = patched.base_model.register_forward_hook(expand)
    try:
        yield
    finally:
        handle.remove()
    if len(read) != 1:  # the head would have scored the wrong positions
        raise RuntimeError(f"the packed log-prob pass read the backbone's output {len(read)} times, not once")


@contextlib.contextmanager
def _cpu_map_location(device: torch.device):
    """torch.load with map_location `cpu:N` read as `cpu` while the block runs.

    Under torchrun on CPU, accelerate gives each rank the device `cpu:0` (torch.device("cpu", local_rank % 1)), and
    transformers' Trainer loads optimizer.pt with map_location=args.device whenever world_size > 1. torch's CPU
    deserializer takes only the location "cpu", so resuming any multi-rank CPU run died there ("don't know how to
    restore data location of torch.storage.UntypedStorage (tagged with cpu:0)"). A CPU has one memory: `cpu:N` is
    `cpu`. Any other device (cuda:N) passes through untouched."""
    if device.type != "cpu" or device.index is None:
        yield
        return
    load = torch.load

    @functools.wraps(load)
    def load_on_cpu(*args, **kwargs):
        location = args[1] if len(args) > 1 else kwargs.get("map_location")
        if str(location).startswith("cpu:"):  # a torch.device or its string
            if len(args) > 1:
                args = (args[0], "cpu", *args[2:])
            else:
                kwargs["map_location"] = "cpu"
        return load(*args, **kwargs)

    torch.load = load_on_cpu
    try:
        yield
    finally:
        torch.load = load


@functools.cache
def _scores_inside_its_loss(method) -> bool:
    """Unsloth's compiled GPU trainer: its log-prob method takes `compute_efficient` (read once per class)."""
    return "compute_efficient" in inspect.signature(method).parameters


class TRLGRPOTrainer(trl.GRPOTrainer):
    """TRL's GRPOTrainer plus what this tool adds; every addition is a constructor argument.

    `share_prompts`: each distinct prompt through the model once (multimodal batches and MoE auxiliary losses always
    take TRL's own pass). `generation_engine`: a grpokit.engines engine that samples the completions (None: TRL's
    own generate). `advantage_options`: a grpokit.advantages.Options (baselines, reward post-processing, dynamic
    sampling; None: TRL's advantages). `sft_loss_weight` / `grpo_loss_weight` / `sft_columns`: the supervised +
    GRPO mixed loss (grpokit.mixed_loss). `group_schedule`: the adaptive group size (grpokit.group_schedule).
    `eval_loss`: compute the loss of each evaluation batch (False: generate and score only, see prediction_step).
    `tool_budget`: a grpokit.agents.ToolBudget bounding each rollout's tool calls (None: TRL's unbounded loop).
    Every default is TRL's behaviour."""

    def __init__(self, *args, share_prompts: bool = False, generation_engine=None, advantage_options=None,
                 sft_loss_weight: float = 0.0, grpo_loss_weight: float = 1.0, sft_columns: tuple[str, ...] = (),
                 group_schedule=None, eval_loss: bool = True, tool_budget=None, **kwargs):
        self.share_prompts = share_prompts
        self.generation_engine = generation_engine
        self.advantage_options = advantage_options
        self.sft_loss_weight, self.grpo_loss_weight = sft_loss_weight, grpo_loss_weight
        self.sft_columns = sft_columns  # where each row's reference reply is read (grpokit.mixed_loss)
        self.group_schedule = group_schedule  # a grpokit.group_schedule.GroupSchedule; None = fixed num_generations
        self.eval_loss = eval_loss
        self.tool_budget = tool_budget  # grpokit.agents.ToolBudget: what one rollout's tools may take in all
        super().__init__(*args, **kwargs)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        # An evaluation batch is generated and scored in _prepare_inputs (the eval reward metrics); TRL then runs
        # the loss pass too. Without a KL term or a supervised term that loss is a function of the rewards and
        # lengths just logged (the policy ratio is 1 on the policy's own samples), yet it is a forward pass over
        # every eval completion: most of an evaluation's time on a CPU (BENCHMARKS.md). `eval_loss=False` skips it.
        if self.eval_loss:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        self._prepare_inputs(inputs)
        return None, None, None

    def _tool_call_loop(self, *args, **kwargs):
        # [agents] each rollout's tools draw on one budget of calls and seconds (grpokit/agents.py ToolBudget)
        if self.tool_budget is None:
            return super()._tool_call_loop(*args, **kwargs)
        saved = self._sync_tool_dicts
        self._sync_tool_dicts = [self.tool_budget.wrap(tools) for tools in saved]
        try:
            return super()._tool_call_loop(*args, **kwargs)
        finally:
            self._sync_tool_dicts = saved

    def create_model_card(self, *args, **kwargs):
        """Nothing: TRL writes OUTPUT_DIR/README.md at every checkpoint ("a fine-tuned version of [None]" for a local
        model, its absolute cache path); the run writes its own README at the end (run_dir.run_readme) and each
        export a model card beside its file."""
        return None

    def _save_checkpoint(self, model, trial):
        # Atomic checkpoints (checkpoints.py): visible to `latest` and rotation only once every file and the
        # `.complete` marker are on disk; a full disk sets the partial one aside and raises CheckpointWriteError.
        from grpokit.checkpoints import save_checkpoint_atomically

        save_checkpoint_atomically(self, super()._save_checkpoint, model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """Resume at the learning rate the schedule gives for this step.

        The checkpoint's optimizer carries the lr of the old schedule's last step (0.0 at the end of a linear decay),
        and the scheduler's `_last_lr` too; only the next scheduler step would recompute it. When a run is extended
        (a larger max_steps), the first resumed step would train at that stale rate. The scheduler built for this
        run knows the new total, so its value at the current step is set now: the schedule re-planned for the new
        total from the current step, and the rate the log reports is the rate each step trains at."""
        from grpokit.advantages import load_state

        with _cpu_map_location(self.args.device):  # multi-rank CPU runs: transformers maps to `cpu:0`
            super()._load_optimizer_and_scheduler(checkpoint)
        load_state(self, checkpoint)  # the run state saved beside the optimizer (grpokit/advantages.py)
        scheduler = self.lr_scheduler
        lambdas = getattr(scheduler, "lr_lambdas", None)
        if checkpoint is None or not lambdas or self.optimizer is None:
            return
        step = scheduler.last_epoch
        rates = [base * fn(step) for base, fn in zip(scheduler.base_lrs, lambdas, strict=True)]
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        scheduler._last_lr = rates

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, *args, **kwargs):
        # Past compute_entropy the parents differ: TRL has compute_aux_loss then the multimodal inputs; Unsloth's
        # compiled GPU trainer has compute_efficient, which its compute_loss passes positionally in the 7th slot
        # (unsloth/models/rl_replacements.py, grpo_trainer_compute_loss: True = the policy is scored inside its fused
        # loss, so this returns (None, None)). Anything asked there goes to the parent exactly as it came. Unsloth's
        # method keeps every call: it scores old / reference log-probs with the scorer of its fused policy loss, so
        # that the ratio starts at 1 and the KL is unbiased (its note in grpo_trainer__get_per_token_logps_and_...).
        parent = super()._get_per_token_logps_and_entropies
        if (not self.share_prompts or _scores_inside_its_loss(getattr(parent, "__func__", parent))
                or any(v is not None and v is not False for v in (*args, *kwargs.values()))):
            return parent(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, *args,
                          **kwargs)
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            ids, mask = input_ids[start:start + batch_size], attention_mask[start:start + batch_size]
            lp, ent = self._shared_prompt_logps(model, ids, mask, logits_to_keep, compute_entropy)
            logps.append(lp)
            entropies.append(ent)
        return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None

    # ---- generation engine (grpokit/engines.py; how it plugs into TRL: trl_engine_adapter.py) ---------------------

    def _generate_and_score_completions(self, inputs):
        from grpokit.advantages import generate_and_score
        from grpokit.group_schedule import set_round_group_size
        from grpokit.mixed_loss import attach_references
        from grpokit.trl_engine_adapter import importance_sampling, timed

        set_round_group_size(self)  # [group_schedule] TRL reads num_generations to generate and to group rewards
        with importance_sampling(self), timed(self, "timing/generate_and_score_s"):
            # importance_sampling: TRL's vLLM mismatch correction, fed the engine's log-probs; generate_and_score:
            # baselines, reward post-processing, dynamic sampling (TRL's own step when those are at their defaults)
            output = generate_and_score(self, super()._generate_and_score_completions, inputs)
        # [mixed_loss] each row's reference reply, tokenised once (dynamic sampling, which swaps rows, is refused
        # together with sft_loss_weight when the config is validated)
        attach_references(self, inputs, output)
        return output

    # ---- advantages (grpokit/advantages.py) ------------------------------------------------------------------------
    def _prepare_inputs(self, generation_batch):
        # A resumed trainer counts TRL's micro-steps (`_step`) from 0, which would move TRL's generation schedule:
        # resumed in the middle of a buffer it would generate now and again every steps_per_generation x
        # num_iterations micro-steps from here, not on the uninterrupted run's steps. Counted from the run's start,
        # it regenerates the interrupted buffer once (nothing holds it) and then generates where the run would have.
        if (self.model.training and getattr(self, "_step", None) == 0 and self.state.global_step > 0
                and getattr(self, "_buffered_inputs", None) is None):
            self._step = self.state.global_step * self.args.gradient_accumulation_steps
        return super()._prepare_inputs(generation_batch)

    def _calculate_rewards(self, *args, **kwargs):
        # the gathered [all rows, reward functions] tensor TRL sums and baselines inline; kept to recompute from
        self._gathered_rewards = super()._calculate_rewards(*args, **kwargs)
        # Components' own per-call figures (code_execution: code/hack_suspected, code/unsplit_tests) join TRL's
        # step metrics, so the logs and W&B show the step a policy starts to reach for hacks.
        mode = "train" if self.model.training else "eval"
        for function in self.reward_funcs:
            reward_set = getattr(function, "reward_set", None)
            for component in (reward_set.components if reward_set else [getattr(function, "component", None)]):
                for key, value in (getattr(component, "last_metrics", None) or {}).items():
                    self._metrics[mode][key].append(float(value))
        return self._gathered_rewards

    def _save_optimizer_and_scheduler(self, output_dir):
        from grpokit.advantages import save_state

        super()._save_optimizer_and_scheduler(output_dir)
        save_state(self, output_dir)  # EMA baselines + reward normaliser, inside the atomic checkpoint

    def _compute_loss(self, model, inputs):
        from grpokit.mixed_loss import mixed_loss
        from grpokit.trl_engine_adapter import importance_sampling

        with importance_sampling(self, inputs):
            loss = super()._compute_loss(model, inputs)
        return mixed_loss(self, model, inputs, loss)  # [mixed_loss] grpo_loss_weight x GRPO + sft_loss_weight x SFT

    # ---- adaptive group size (grpokit/group_schedule.py) ----------------------------------------------------------
    def _get_train_sampler(self, dataset=None):
        if self.group_schedule is None:
            return super()._get_train_sampler(dataset)
        from grpokit.group_schedule import train_sampler

        return train_sampler(self, dataset if dataset is not None else self.train_dataset)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, *args, **kwargs):
        from grpokit.trl_engine_adapter import generate_for_trainer, timed, uses_engine

        with timed(self, "timing/generation_s"):  # per-phase step times (bench/bench_speed.py)
            if uses_engine(self) and images is None and not multimodal_fields:
                return generate_for_trainer(self, self.generation_engine, prompt_ids)
            return self._shared_generate_single_turn(prompt_ids, images, multimodal_fields, *args, **kwargs)

    def _shared_generate_single_turn(self, *args, **kwargs):
        # Under several processes TRL's own generation: the prompt cache is one more forward call, made only by a rank
        # whose rows repeat a prompt (generate_with_shared_prompts), and with sharded parameters (ZeRO-3 with
        # ds3_gather_for_generation=false, FSDP's inner units) every forward is a collective: every rank must make
        # the same calls (transformers' synced_gpus keeps only generate's own decode steps in step).
        if not self.share_prompts or self.use_vllm or self.accelerator.num_processes > 1:
            return super()._generate_single_turn(*args, **kwargs)
        model = self.accelerator.unwrap_model(self.model)
        own = vars(model).get("generate")  # Unsloth may have wrapped generate on the instance already
        model.generate = functools.partial(generate_with_shared_prompts, model, model.generate)
        try:
            return super()._generate_single_turn(*args, **kwargs)
        finally:
            if own is None:
                del model.generate
            else:
                model.generate = own

    def _shared_prompt_logps(self, model, input_ids, attention_mask, logits_to_keep, compute_entropy):
        prompt_len = input_ids.size(1) - logits_to_keep
        first_row, row_to_prompt = distinct_rows(input_ids[:, :prompt_len], attention_mask[:, :prompt_len])
        if prompt_len >= 2 and first_row.size(0) < input_ids.size(0):
            packed = self._packed_logps(model, input_ids, attention_mask, prompt_len, compute_entropy)
            if packed is not None:
                return packed
        # Nothing shared, or activation checkpointing on in training (transformers then returns no key/value cache,
        # so there is nothing to share): TRL's own pass. Under several processes too: the packed form and TRL's pass
        # are one forward each, the prompt cache two, and whether packing applies depends on each rank's own rows;
        # every rank must make the same forward calls (each one gathers the layers under ZeRO-3 / FSDP, and DDP
        # broadcasts its buffers at each).
        checkpointing = model.training and getattr(self.accelerator.unwrap_model(model), "is_gradient_checkpointing",
                                                   False)
        if prompt_len < 2 or first_row.size(0) == input_ids.size(0) or checkpointing or self.accelerator.num_processes > 1:
            logps, entropies, _ = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, compute_entropy=compute_entropy)
            return logps, entropies
        with self.accelerator.autocast():
            # Every prompt token but the last: the last one's hidden state predicts the first completion token, and
            # the fused LM head scores positions inside one call.
            prefix = model(input_ids=input_ids[first_row, :prompt_len - 1],
                           attention_mask=attention_mask[first_row, :prompt_len - 1], use_cache=True,
                           logits_to_keep=1)
            cache = prefix.past_key_values
            if cache is None:  # a model that returns no cache in this mode: TRL's own pass, correct if not shared
                logps, entropies, _ = super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, compute_entropy=compute_entropy)
                return logps, entropies
            cache.reorder_cache(row_to_prompt)  # index_select per layer: differentiable, gradients sum per prompt
            rest = input_ids[:, prompt_len - 1:]
            labels = rest.masked_fill(attention_mask[:, prompt_len - 1:] == 0, -100)
            labels[:, 0] = -100  # the last prompt token is context, not scored
            outputs = model(input_ids=rest, attention_mask=attention_mask, past_key_values=cache, labels=labels,
                            fused_lm_head=True)
        # The fused head computes the completion tokens' log-probs (and entropies, unless it is a reference model's).
        return outputs.log_probs, outputs.entropy if compute_entropy else None

    def _packed_logps(self, model, input_ids, attention_mask, prompt_len, compute_entropy):
        """The log-prob pass in one forward of packed rows (shared_prompts.pack_by_prompt: the prompts as a prefix tree
        in one row, or one row per distinct prompt), where the model's attention takes a custom mask and is plain
        causal over these lengths; else None."""
        config = self.accelerator.unwrap_model(model).config
        form = _PACKED_MASK.get(getattr(config, "_attn_implementation", None))
        window = getattr(config, "sliding_window", None)
        kinds = set(getattr(config, "layer_types", None) or ())
        if form is None or kinds - {"full_attention", "sliding_attention"} or (
                isinstance(window, int) and input_ids.size(1) > window):
            return None  # recurrent / linear-attention layers, or a window the 4D mask would not apply
        # the prefix tree moves positions (distances kept): for rotary position embeddings only
        rotary = getattr(config, "rope_parameters", None) is not None or getattr(config, "rope_theta", None) is not None
        packed = pack_by_prompt(input_ids, attention_mask, prompt_len, tree=rotary)
        if packed is None:
            return None
        mask = packed.attend
        if form == "additive":
            mask = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(
                ~mask, torch.finfo(torch.float32).min)
        with self.accelerator.autocast(), _scored_positions(self.accelerator.unwrap_model(model), packed.expand):
            outputs = model(input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids,
                            shift_labels=packed.shift_labels, fused_lm_head=True)
        # The fused head scores the labelled positions (and entropies, unless it is a reference model's); each
        # completion token's value is gathered back to TRL's [rows, completion] layout, 0 past the row's end.
        logps = outputs.log_probs[packed.rows, packed.cols] * packed.kept
        entropy = outputs.entropy if compute_entropy else None
        return logps, None if entropy is None else entropy[packed.rows, packed.cols] * packed.kept

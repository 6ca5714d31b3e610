"""grpokit: the machinery behind `train_grpo.py` (the CLI) and `grpo_trainer.py` (the spec's Python API).

The spec's faces stay at the repository root: `train_grpo.py`, `grpo_trainer.py`, `data_loader.py`, `config/`
(fields, presets, the config builder) and `rewards/`. Everything else is here, one concern per file, flat. Imports
only go down this list (a module imports only modules below it, `config/`, `rewards/` and `data_loader.py`;
tests/test_layout.py checks it):

    doctor.py              `train_grpo.py doctor`: what a run would use on this machine and whether it works (each
                           check, then a 3-step run on a tiny model), one table
    run.py                 one GRPO run, config -> data -> rewards -> model -> TRL trainer -> train -> evaluate
                           -> save (the class grpo_trainer.py re-exports)
    callbacks.py           trainer callbacks: generation logs (greedy + pass@k), W&B config, log lines, no-signal check
    report.py              report.html (summary, settings, curves, baseline vs final completions); `redraw`
    plots.py               the PNG curves, from the run directory's files
    export.py              `train_grpo.py export`: GGUF (llama.cpp's converter + quantiser), GGUF LoRA, merged
                           16-bit weights, into the base the run computed with (NF4-rounded for 4-bit), each measured
                           against the run's final evaluation; an Ollama Modelfile, a Hub upload with a model card
    trl_trainer.py         TRLGRPOTrainer: TRL's GRPOTrainer subclass (atomic checkpoints, resumed lr, shared prompts,
                           the generation engine)
    agents.py              tools and multi-turn environments (the door): resolved and turned into schemas before
                           loading, guarded calls, the chat template + parser per model family, the logs' rollouts
                           through TRL's tool loop
    agent_tools.py         the built-in tools: `python` (the sandbox), `calculator` (exact arithmetic), the
                           `python_repl` environment
    objective.py           the loss settings a run trains, stated once (--dry-run, header, run_config.json) and the
                           same on every machine: handed to TRL explicitly, put back where Unsloth's GPU config rewrites
    advantages.py          group baselines (mean, median, EMA, leave-one-out), reward scale / clip / running
                           normalisation, dynamic sampling: the advantages TRL's loss sees
    mixed_loss.py          the supervised + GRPO loss: each row's reference reply, its token-mean NLL, the weights
    group_schedule.py      adaptive group size: valid sizes, the schedule, the sampler that follows it
    trl_engine_adapter.py  how an engine plugs into TRL: choose / start it, generation, importance sampling, timing
    load_plan.py           the load plan: checkpoint, quantisation, dtype / mixed precision, device_map per rank,
                           rollout engine, GPU memory estimate; pure functions of a Machine description
    engine_llama_cpp.py    the llama.cpp engine (CPU): GGUF export, LoRA push, batched seeded sampling, shared weights
    engine_transformers.py the transformers engine (benchmarks and tests; the trainer keeps TRL's own path)
    sampling.py            numpy sampling of engine logits (temperature, top-k/p, min-p), seeded per sequence
    engines.py             the engine interface, SamplingParams, which engine runs and why
    cpu_threads.py         threads for sampling and training from the cores really free (affinity, quota, load)
    gguf_export.py         HF checkpoint / PEFT adapter -> GGUF (base model, LoRA)
    shared_prompts.py      each distinct prompt through the model once per group (generation and log-probs)
    model_loader.py        backend choice, Unsloth / transformers + PEFT loading (4-bit on CPU: NF4-rounded 16-bit), the
                           embedded model, cache dir
    activation_memory.py   leaner saved activations on CPU (grouped-query eager attention, checkpointed MLP gate)
    run_end.py             how a run ends: exit codes, RunFailed / Interrupted / AlreadyFinished, signals, faults
    checkpoints.py         checkpoint files: atomic writes, manifest, resume checks, the output-dir lock
    console.py             what the terminal shows: header, progress, summary, third-party noise, --help layout
    run_dir.py             the run directory: every file name a run leaves, and their readers
    hub.py                 Hugging Face Hub reachability (fail fast offline)

Model-written code (the code reward, its sandbox, the monitor; the `python` tool runs in that sandbox) has a room of
its own, `rewards/code/`: its `__init__.py` says where the verdict is decided and where the trust boundary lies.

Three classes are called GRPOTrainer and two GRPOConfig; which is which:
- `grpo_trainer.GRPOTrainer` (= `grpokit.run.GRPOTrainer`): the spec's run object; it builds the next one.
- `grpokit.trl_trainer.TRLGRPOTrainer`: our subclass of `trl.GRPOTrainer` (TRL's trainer, the third).
- `grpo_trainer.GRPOConfig` (= `grpokit.run.GRPOConfig`): `config.schema.GRPORunConfig` (all our fields) checked
  like a config file; `trl.GRPOConfig` is TRL's, built from it by `run.grpo_config_kwargs`.
"""

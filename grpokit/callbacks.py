"""Trainer callbacks: generation logs at every evaluation, and the training log file.

The generation log is the spec's central feature: the same eval prompts, decoded greedily, scored by the run's own
rewards, written as `{generation_log_dir}/generation_log_step_{n}.json` once before training (the baseline) and at
every evaluation, so steps are directly comparable.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from config.errors import UsageError
from grpokit.run_dir import BEST_CHECKPOINT, PASS_AT_K_FILE
from rewards import RewardSet, WeightedSum, weighted_total
from rewards.base import completion_text, tool_calls

log = logging.getLogger("grpo")


class GenerationLogger(TrainerCallback):
    def __init__(self, rows: list[dict[str, Any]], tokenizer, reward_set: RewardSet, log_dir: Path,
                 max_new_tokens: int, is_main_process: bool = True, pass_k: int = 0, temperature: float = 1.0,
                 held_out: bool = True, trainer=None, max_batch: int = 0):
        self.rows = rows
        self.held_out = held_out  # False: no eval split, the logged prompts are training prompts (and say so)
        self.tokenizer = tokenizer
        self.reward_set = reward_set
        self.log_dir = Path(log_dir)
        self.max_new_tokens = max_new_tokens
        self.is_main_process = is_main_process
        self.pass_k = pass_k
        self.temperature = temperature
        self.trainer = trainer  # TRL's trainer, whose generation engine (if any) decodes the logs, as in training
        # Sequences per transformers `generate` call (0 = all at once): on a GPU the load plan sizes it from the
        # memory left beside the model (load_plan.eval_batch_size), since one call over rows x k would not fit.
        self.max_batch = max_batch
        self.history: list[dict[str, Any]] = []  # one summary per logged evaluation
        self.failures: list[dict[str, Any]] = []  # evaluations that failed (an OOM...): reported, not skipped
        self.seconds = 0.0
        existing = sorted(self.log_dir.glob("generation_log_step_*.json")) if self.log_dir.exists() else []
        # A resumed run continues the eval_step numbering instead of overwriting earlier files.
        self.eval_step = len(existing)

    def _keep_pass_at_k(self, summary: dict[str, Any], global_step: int) -> None:
        """pass@k beside the logs (PASS_AT_K_FILE, by step): the greedy logs can be re-read, sampled pass@k
        cannot, and a resumed run's summary still needs the step-0 figure."""
        figures = {key: value for key, value in summary.items() if key.startswith("pass@")}
        if not figures:
            return
        path = self.log_dir / PASS_AT_K_FILE
        try:
            kept = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        except (OSError, ValueError):
            kept = {}
        kept[str(global_step)] = figures
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(kept, indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)

    def baseline(self) -> dict[str, Any] | None:
        """The run's first generation log (step 0 before any training), also when this process resumed a run whose
        baseline was written by an earlier process: the real "before training" figure, never a resumed step's."""
        files = sorted(self.log_dir.glob("generation_log_step_*.json"),
                       key=lambda p: int(p.stem.rsplit("_", 1)[-1]) if p.stem.rsplit("_", 1)[-1].isdigit() else 1 << 60)
        if not files:
            return self.history[0] if self.history else None
        entries = json.loads(files[0].read_text(encoding="utf-8"))
        summary = summarise(entries, self.reward_set.names)
        summary.update(global_step=entries[0]["global_step"] if entries else 0, file=str(files[0]))
        try:  # its pass@k, kept by whichever process made it
            kept = json.loads((self.log_dir / PASS_AT_K_FILE).read_text(encoding="utf-8"))
            summary.update(kept.get(str(summary["global_step"]), {}))
        except (OSError, ValueError, AttributeError):
            pass
        return summary

    def prompt_changes(self) -> dict[str, int]:
        """Per prompt, the last generation log's greedy reward against the baseline's (the run's first log):
        {"improved": n, "worse": n, "same": n}; empty without two logs to compare."""
        from grpokit.report import compare_samples
        from grpokit.run_dir import read_json

        baseline = self.baseline()
        if not self.history or baseline is None or baseline.get("file") == self.history[-1].get("file"):
            return {}
        rows = compare_samples(read_json(Path(baseline["file"])), read_json(Path(self.history[-1]["file"])))
        return {"improved": sum(r["change"] > 1e-9 for r in rows), "worse": sum(r["change"] < -1e-9 for r in rows),
                "same": sum(abs(r["change"]) <= 1e-9 for r in rows)}

    # -- TrainerCallback hooks ------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not (self.log_dir / f"generation_log_step_{state.global_step}.json").exists():
            self.log_generations(model, state.global_step)

    def on_evaluate(self, args, state, control, model=None, metrics=None, **kwargs):
        summary = self.log_generations(model, state.global_step)
        if metrics is not None and self.failures and self.failures[-1]["global_step"] == state.global_step:
            metrics["eval_generation_eval_failed"] = 1.0
        if metrics is not None:
            # The greedy view joins TRL's eval metrics (eval_greedy_reward, eval_pass@k) before transformers picks the
            # best checkpoint from them, so best_metric can name it. Only the main process generates, and every rank
            # gets its values: transformers decides per rank whether this is a new best, and a new best makes
            # _save_checkpoint wait at a barrier (and the end reload the best model, a collective under ZeRO-3 /
            # FSDP), so a rank that disagreed would leave the others waiting for good. NaN: the log failed.
            found = summary or {}
            keys = ["reward_mean", *(("pass@1", f"pass@{self.pass_k}") if self.pass_k else ())]
            values = same_on_every_rank([float(found.get(k, float("nan"))) for k in keys], args)
            for key, value in zip(["greedy_reward", *keys[1:]], values, strict=True):
                metrics[f"eval_{key}"] = value

    # -- the work -------------------------------------------------------------------------------------------------
    def log_generations(self, model, global_step: int) -> dict[str, Any] | None:
        """Generate, score and write one step file. A failure here is logged, never allowed to end training."""
        if not self.is_main_process or model is None or not self.rows:
            return None
        started = time.perf_counter()
        try:
            entries = self._generate_and_score(model, global_step)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            path = self.log_dir / f"generation_log_step_{global_step}.json"
            # "replace": a trajectory may hold a lone surrogate (a tool call's JSON escapes it), which UTF-8 cannot
            # encode; the step's log is written all the same
            path.write_bytes((json.dumps(entries, indent=2, ensure_ascii=False) + "\n").encode("utf-8", "replace"))
            summary = summarise(entries, self.reward_set.names)
            if self.pass_k and ("answer" in self.rows[0] or "tests" in self.rows[0]):
                try:
                    summary.update(self._pass_at_k(model))
                except Exception as err:  # noqa: BLE001 - the greedy log stands; pass@k is reported as failed
                    self._failed(err, global_step, f"pass@{self.pass_k}")
            summary.update(eval_step=self.eval_step, global_step=global_step, file=str(path))
            self._keep_pass_at_k(summary, global_step)
            self.history.append(summary)
            self.eval_step += 1
            _log_to_wandb(entries, summary, global_step)
            # the file's path goes to the log file only: on the console the line stays within 80 columns
            log.info("Generation log step %d: mean reward %.3f over %d prompts", global_step, summary["reward_mean"],
                     len(entries))
            if "tool_call_rate" in summary:
                log.info("Step %d: tool calls in %.0f%% of completions, %.2f per completion, %.2f failed", global_step,
                         100 * summary["tool_call_rate"], summary["tool_calls_per_completion"],
                         summary["tool_failures_per_completion"])
            if self.pass_k and f"pass@{self.pass_k}" in summary:  # also at step 0: the figure training must beat
                log.info("Step %d: pass@1 %.3f, pass@%d %.3f (sampled)", global_step, summary["pass@1"], self.pass_k,
                         summary[f"pass@{self.pass_k}"])
            log.info("Generation log step %d written to %s", global_step, path, extra={"file_only": True})
            return summary
        except Exception as err:  # noqa: BLE001 - logging must not kill a long run
            from grpokit.run_end import stops_the_run

            if stops_the_run(err):  # a broken reward stops the run anyway: "training continues" would contradict it
                raise
            self._failed(err, global_step, "greedy generation log")
            return None
        finally:
            self.seconds += time.perf_counter() - started

    def _failed(self, err: Exception, global_step: int, what: str) -> None:
        """A failed evaluation (typically CUDA out of memory) is logged as a failure and kept for the run summary
        (`generation_eval_failed`) and the eval metrics, so a missing pass@k is never a silent gap."""
        from grpokit.run_end import stops_the_run

        if stops_the_run(err):
            raise err
        out_of_memory = "OutOfMemoryError" in err.__class__.__name__ or "out of memory" in str(err)
        if out_of_memory:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # training goes on: give the cache back
        message = str(err).splitlines()[0][:300] if str(err) else ""
        self.failures.append({"global_step": global_step, "what": what, "error": f"{err.__class__.__name__}: {message}",
                              "max_batch": self.max_batch or None})
        hint = (" (out of memory: lower --max-generation-samples, eval_pass_k or generation_max_new_tokens)"
                if out_of_memory else "")
        log.error("Generation logging failed at step %d (%s; %s: %s)%s; training continues.", global_step, what,
                  err.__class__.__name__, message, hint)

    def _generate(self, model, texts: list[str], sample: bool = False, n: int = 1) -> list[list[int]]:
        """`n` completions per text (greedy, or sampled at the run's temperature), prompt-major; the new token ids
        of each. Through the run's generation engine when it has one (llama_cpp: the same sampler as training, with
        the current adapter pushed first), else transformers' batched, left-padded `generate`."""
        import torch

        from grpokit.trl_engine_adapter import engine_generate, uses_engine

        tokenizer = self.tokenizer
        if self.trainer is not None and uses_engine(self.trainer):
            prompt_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
            seed = int(torch.randint(0, 2**62, (1,)).item()) if sample else 0
            return engine_generate(self.trainer, prompt_ids, n, self.max_new_tokens, greedy=not sample,
                                   temperature=self.temperature, seed=seed)
        was_training = model.training
        side = tokenizer.padding_side
        tokenizer.padding_side = "left"  # batched decoding needs the prompts right-aligned
        model.eval()
        new_tokens: list[list[int]] = []
        try:
            for chunk, count in generation_batches(len(texts), n, self.max_batch):
                sampling = {"do_sample": True, "temperature": self.temperature,
                            "num_return_sequences": count} if sample else {"do_sample": False}
                batch = tokenizer([texts[i] for i in chunk], return_tensors="pt", padding=True,
                                  add_special_tokens=False).to(model.device)
                with torch.no_grad():
                    output = model.generate(**batch, max_new_tokens=self.max_new_tokens, use_cache=True,
                                            pad_token_id=tokenizer.pad_token_id, **sampling)
                new_tokens += output[:, batch["input_ids"].shape[1]:].tolist()
        finally:
            tokenizer.padding_side = side
            if was_training:
                model.train()
        return new_tokens

    def _pass_at_k(self, model) -> dict[str, float]:
        """pass@1 and pass@k from k sampled completions per prompt (unbiased estimator of Chen et al. 2021 with
        n = k, i.e. the fraction of prompts with at least one correct sample)."""
        import torch

        from rewards.components import Accuracy

        tokenizer, k = self.tokenizer, self.pass_k
        texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
                 for r in self.rows]
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(1234)  # the same samples for the same weights at every evaluation
        try:
            if self.agentic:  # trajectories: the rewards judge each one's last assistant turn
                completions = self._trajectories(k, greedy=False)[0]
            else:
                completions = [self._decode(ids)[0] for ids in self._generate(model, texts, sample=True, n=k)]
        finally:
            torch.random.set_rng_state(generator_state)  # do not disturb training's sampling stream
        if "tests" in self.rows[0]:  # code: correct = every test passes (rewards/code/reward.py's sandbox)
            from rewards.code import passes_all

            correct = passes_all(completions, [row for row in self.rows for _ in range(k)])
        else:  # the answer judged as the run's default reward judges it: as a number, or as a short text answer
            from rewards.components import QA
            from rewards.fit import answers_are_numbers

            answers = [row["answer"] for row in self.rows for _ in range(k)]
            aliases = [row.get("answer_aliases") for row in self.rows for _ in range(k)]
            judge = Accuracy() if answers_are_numbers(self.rows) else QA()
            correct = [float(v is not None and v >= 1.0) for v in judge(completions=completions, answer=answers,
                                                                        answer_aliases=aliases)]
        per_prompt = [correct[i * k:(i + 1) * k] for i in range(len(self.rows))]
        return {"pass@1": sum(sum(c) / k for c in per_prompt) / len(per_prompt),
                f"pass@{k}": sum(1.0 for c in per_prompt if max(c) > 0) / len(per_prompt)}

    def _decode(self, ids: list[int]) -> tuple[str, list[int], bool]:
        """(text, ids up to the end-of-turn token, truncated?)"""
        pad = self.tokenizer.pad_token_id
        # the tokenizer's EOS and the generation config's (what the engine and TRL stop on)
        stops = {self.tokenizer.eos_token_id, *getattr(self.trainer, "eos_token_ids", ())}
        end = next((i for i, token in enumerate(ids) if token in stops), None)
        if end is not None:
            ids, truncated = ids[:end], False
        else:
            ids, truncated = [t for t in ids if t != pad], True
        return self.tokenizer.decode(ids, skip_special_tokens=True), ids, truncated

    @property
    def agentic(self) -> bool:
        """A run with tools or environments: its logs are trajectories through TRL's tool loop (grpokit/agents.py)."""
        return self.trainer is not None and bool(getattr(self.trainer, "tools", None))

    def _trajectories(self, n: int, greedy: bool):
        """n trajectories per row through TRL's generation and tool loop: (message lists, completion ids, tool masks);
        the tokens of each trajectory are the model's turns and the tools' results, as in training."""
        from grpokit.agents import rollout

        return rollout(self.trainer, self.rows, n=n, greedy=greedy)

    def _generate_and_score(self, model, global_step: int) -> list[dict[str, Any]]:
        tokenizer = self.tokenizer
        prompts = [row["prompt"] for row in self.rows]
        texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True,
                                               tools=getattr(self.trainer, "tools", None) or None) for p in prompts]
        completion_ids, completions, truncated = [], [], []
        trajectories, model_tokens = None, None
        if self.agentic:
            trajectories, completion_ids, masks = self._trajectories(1, greedy=True)
            stops = {tokenizer.eos_token_id, *getattr(self.trainer, "eos_token_ids", ())}
            completions = [completion_text(t) for t in trajectories]
            truncated = [not ids or ids[-1] not in stops for ids in completion_ids]
            model_tokens = [sum(mask) for mask in masks]
            conversational = trajectories
        else:
            for row_tokens in self._generate(model, texts):
                text, ids, cut = self._decode(row_tokens)
                completion_ids.append(ids)
                completions.append(text)
                truncated.append(cut)
            conversational = [[{"role": "assistant", "content": c}] for c in completions]
        # Every reference column, as TRL hands them to rewards in training (code rows: tests, entry_point, ...).
        columns = {k: [row.get(k) for row in self.rows] for k in self.rows[0] if k not in ("id", "prompt")}
        per = WeightedSum(self.reward_set).components(
            prompts=prompts, completions=conversational, completion_ids=completion_ids, **columns)
        totals = weighted_total(per, self.reward_set.weights)
        # Components that keep per-completion details of their last call (code_execution: tests passed of total,
        # outcome, the tail of the program's error output) put them in the log beside the score.
        details = {c.name: c.last_details for c in self.reward_set.components
                   if len(getattr(c, "last_details", None) or ()) == len(self.rows)}
        entries = []
        for i, row in enumerate(self.rows):
            entry = {
                "eval_step": self.eval_step,
                "global_step": global_step,
                "sample_index": i,
                "id": row.get("id"),
                "prompt": prompts[i],
                "generated": completions[i],
                "full_response": texts[i] + (tokenizer.decode(completion_ids[i]) if trajectories else completions[i]),
                "rewards": {name: values[i] for name, values in per.items()},
                "reward_total": totals[i],
                "completion_tokens": model_tokens[i] if model_tokens else len(completion_ids[i]),
                "truncated": truncated[i],
                "split": "eval" if self.held_out else "train",
            }
            if trajectories is not None:  # what the agent did: every turn, and each call with its result
                entry["trajectory"] = trajectories[i]
                entry["tool_calls"] = tool_calls(trajectories[i])
            for key in ("answer", "chosen"):
                if key in row:
                    entry[f"reference_{key}"] = row[key]
            if details:
                entry["details"] = {name: values[i] for name, values in details.items()}
                suspected = sorted({s for d in entry["details"].values() if isinstance(d, dict)
                                    for s in d.get("suspected") or ()})
                if suspected:  # the hack monitor's finding, where a reader of the log sees it first
                    entry["hack_suspected"] = suspected
            entries.append(entry)
        return entries


def generation_batches(prompts: int, n: int, max_batch: int) -> list[tuple[list[int], int]]:
    """The generate calls for `n` completions of each of `prompts` prompts with at most `max_batch` sequences per
    call (0 = one call): (prompt indices, completions per prompt) each, in prompt-major order. n above the bound
    splits a prompt's completions across calls."""
    if max_batch <= 0 or prompts * n <= max_batch:
        return [(list(range(prompts)), n)] if prompts else []
    if n <= max_batch:
        per_call = max_batch // n
        return [(list(range(start, min(start + per_call, prompts))), n) for start in range(0, prompts, per_call)]
    calls = []
    for prompt in range(prompts):
        left = n
        while left > 0:
            calls.append(([prompt], min(left, max_batch)))
            left -= max_batch
    return calls


def _log_to_wandb(entries: list[dict[str, Any]], summary: dict[str, Any], global_step: int) -> None:
    """The samples as a W&B Table (and their mean rewards), when the run reports to W&B."""
    import sys

    wandb = sys.modules.get("wandb")  # only if TRL's W&B integration already imported and started it
    if wandb is None or wandb.run is None:
        return
    columns = ["global_step", "sample_index", "prompt", "generated", "reward_total", "completion_tokens", "truncated"]
    table = wandb.Table(columns=columns)
    for e in entries:
        table.add_data(e["global_step"], e["sample_index"], json.dumps(e["prompt"], ensure_ascii=False),
                       e["generated"], e["reward_total"], e["completion_tokens"], e["truncated"])
    metrics = {f"generations/{k}": v for k, v in summary.items() if isinstance(v, (int, float))}
    wandb.log({"generations/samples": table, **metrics})


def summarise(entries: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    n = max(1, len(entries))
    summary = {
        "reward_mean": sum(e["reward_total"] for e in entries) / n,
        "completion_tokens_mean": sum(e["completion_tokens"] for e in entries) / n,
        "truncated_fraction": sum(e["truncated"] for e in entries) / n,
    }
    for name in names:
        values = [e["rewards"][name] for e in entries if e["rewards"].get(name) is not None]
        summary[f"rewards/{name}"] = sum(values) / len(values) if values else None
    if any("tool_calls" in e for e in entries):  # a tool run: how often the agent reached for a tool, and failed
        calls = [e.get("tool_calls") or [] for e in entries]
        summary["tool_call_rate"] = sum(1 for c in calls if c) / n
        summary["tool_calls_per_completion"] = sum(len(c) for c in calls) / n
        summary["tool_failures_per_completion"] = sum(1 for c in calls for call in c if call.get("failed")) / n
    return summary


class WandbRunConfig(TrainerCallback):
    """Adds our effective run config (dataset, rewards, model preset) beside TRL's GRPOConfig in the W&B run."""

    def __init__(self, config_dict: dict[str, Any]):
        self.config_dict = config_dict

    def on_train_begin(self, args, state, control, **kwargs):
        import sys

        wandb = sys.modules.get("wandb")
        if state.is_world_process_zero and wandb is not None and wandb.run is not None:
            wandb.config.update({"grpo_cli": self.config_dict}, allow_val_change=True)


# Metrics of grpokit/advantages.py and group_schedule.py that grpo_training.log's step lines carry.
STEP_METRIC_PREFIXES = ("baseline/", "reward/", "dynamic_sampling/", "group_size", "frac_reward_zero_std", "code/",
                        "eval_code/", "tools/", "eval_tools/", "sft_loss")


class LogLinesCallback(TrainerCallback):
    """Each logging step and evaluation as one line in the run's log (console and grpo_training.log)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        keys = ("loss", "reward", "reward_std", "kl", "learning_rate", "completions/mean_length", "step_time",
                "eval_reward", "eval_loss")
        shown = {k: logs[k] for k in keys if k in logs}
        shown.update({k: v for k, v in logs.items() if k.startswith(("rewards/", "eval_rewards/")) and k.endswith("/mean")})
        # what shaped this step's advantages: baseline, reward transforms, dynamic sampling, group size (GRPO options)
        shown.update({k: v for k, v in logs.items() if k.startswith(STEP_METRIC_PREFIXES)})
        if shown:
            text = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items())
            log.debug("step %d: %s", state.global_step, text)  # the progress bar shows it; the log file keeps it

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            log.info("Saved checkpoint %s/checkpoint-%d", args.output_dir, state.global_step)


# Steps in a row, from the start of training, in which every group's completions scored the same before the run
# is stopped: GRPO's advantages are rewards minus their group mean, so such a step trains on nothing.
class TrainClock(TrainerCallback):
    """The run's one training time: wall seconds inside the training loop (steps and their in-loop evaluations),
    carried across resumes. Each logged step records the running total as `train_seconds` in the log history, so a
    resumed run starts from the checkpoint's figure and the summary, the report and metrics_summary.json agree."""

    def __init__(self):
        self.before = 0.0
        self.started: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.before = next((h["train_seconds"] for h in reversed(state.log_history) if "train_seconds" in h), 0.0)
        self.started = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or any(key.startswith("eval_") for key in logs):
            return
        # transformers appends a copy of `logs` (plus "step") to log_history before the callbacks see it: the figure
        # goes into both, so trainer_state.json (and every checkpoint's copy of it) carries it
        logs["train_seconds"] = round(self.seconds(), 2)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1]["train_seconds"] = logs["train_seconds"]

    def seconds(self) -> float:
        return self.before + (time.perf_counter() - self.started if self.started is not None else 0.0)


def same_on_every_rank(values: list[float], args) -> list[float]:
    """The main process's `values` on every rank (a broadcast from rank 0 on the device of the training `args`; as
    they are without a process group)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=args.device)
    dist.broadcast(tensor, src=0)
    return tensor.tolist()


class BestCheckpoint(TrainerCallback):
    """`best_metric` checked against the first evaluation's metrics (the available ones listed when it is missing),
    and OUTPUT_DIR/best_checkpoint.json (checkpoint, step, metric, value) rewritten whenever a better one is saved."""

    def __init__(self, metric: str, output_dir: Path):
        self.key = metric if metric.startswith("eval_") else f"eval_{metric}"
        self.path = Path(output_dir) / BEST_CHECKPOINT
        self.checked = False

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self.checked or metrics is None:
            return
        self.checked = True
        if self.key not in metrics:
            names = sorted(k.removeprefix("eval_") for k in metrics if k.startswith("eval_"))
            raise UsageError(f"best_metric '{self.key.removeprefix('eval_')}' is not an eval metric of this run; "
                             f"available: {', '.join(names)}. Set --set best_metric=<one of them>.")

    def on_save(self, args, state, control, **kwargs):
        if state.best_model_checkpoint and state.is_world_process_zero:
            record = {"checkpoint": state.best_model_checkpoint,
                      "step": int(Path(state.best_model_checkpoint).name.rsplit("-", 1)[-1]),
                      "metric": self.key.removeprefix("eval_"), "value": state.best_metric}
            self.path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


# A run stops when this many groups in a row, from its first step, all had identical rewards (and at least
# NO_SIGNAL_STEPS steps did). Counted in groups, not steps: a quick test's 2 groups per step are all-zero for 3 steps
# running on a weak start often enough (1 of 5 seeds on a bf16 machine) to stop a run that then learns; a reward
# that succeeds on 10 % of completions leaves a group of 4 flat with p = 0.9^4 + 0.1^4 = 0.66, so 32 flat groups in a
# row are a 1-in-700000 event for it, and a reward that cannot score is still caught within a few steps of a normal
# batch.
NO_SIGNAL_GROUPS = 32
NO_SIGNAL_STEPS = 3


class NoLearningSignal(UsageError):
    """Every group had identical rewards for the first NO_SIGNAL_GROUPS groups (or every reward was None)."""


class LearningSignalCheck(TrainerCallback):
    """Stops a run that cannot learn instead of reporting it as a normal run. TRL logs `frac_reward_zero_std` (the
    share of groups whose completions all scored the same) and NaN reward means when every value was None."""

    def __init__(self, groups: int = NO_SIGNAL_GROUPS):
        self.groups = groups
        self.patience = NO_SIGNAL_STEPS
        self.flat_steps = 0
        self.first_step: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        # groups scored per optimizer step: every rank's batch over the accumulation steps, num_generations each
        completions = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        per_step = max(1, completions // max(1, getattr(args, "num_generations", None) or 1))
        self.patience = max(NO_SIGNAL_STEPS, -(-self.groups // per_step))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "frac_reward_zero_std" not in logs or any(k.startswith("eval_") for k in logs):
            return
        if self.first_step is None:
            self.first_step = state.global_step
        reward = logs.get("reward")
        if isinstance(reward, float) and reward != reward:  # NaN: no completion got a score
            raise NoLearningSignal(
                f"step {state.global_step}: every reward was None (no reward could score any completion): check "
                "that the rewards fit the data (--score-completions previews them).")
        if self.flat_steps < 0:
            return  # the run has shown signal once: later flat steps are a metric, not a fault
        if logs["frac_reward_zero_std"] >= 1.0:
            if "sft_loss" in logs:  # the supervised term trained this step (a warm start): not a run that cannot learn
                return
            self.flat_steps += 1
            if self.flat_steps >= self.patience:
                raise NoLearningSignal(
                    f"steps {self.first_step}-{state.global_step}: every group's completions got identical rewards, "
                    "so GRPO has nothing to learn from (all advantages are 0). Preview the rewards with "
                    "--score-completions, raise temperature, or use a reward with partial credit.")
        else:
            self.flat_steps = -1

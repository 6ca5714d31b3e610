"""A run's output directory: the name of every file a run leaves there, and the readers of them (typed once here).

What each file holds is in docs/evaluation.md ("What a run leaves in --output-dir"). Checkpoint internals (markers,
manifest, lock) belong to checkpoints.py; this module names the files a user, the report and the summary read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from config.errors import UsageError

TRAINER_STATE = "trainer_state.json"  # TRL's log_history (every logged metric), written by the trainer
METRICS_SUMMARY = "metrics_summary.json"  # the run summary: steps, times, rewards, final eval
RUN_CONFIG = "run_config.json"  # the effective config, every field
BEST_CHECKPOINT = "best_checkpoint.json"  # the best checkpoint by best_metric: checkpoint, step, metric, value
EVAL_METRICS = "eval_metrics.json"  # an --eval-only result
TRAINING_LOG = "grpo_training.log"  # every log line of the run
GENERATION_LOGS = "generation_logs"  # generation_log_step_<N>.json, one per evaluation
GENERATION_LOG_GLOB = "generation_log_step_*.json"
PASS_AT_K_FILE = "pass_at_k.json"  # beside the generation logs: {step: {"pass@1": x, "pass@k": y}}
PLOTS_DIR = "plots"
REPORT_FILE = "report.html"
MANIFEST = "run_manifest.json"  # in each checkpoint: config hash, dataset fingerprint, versions
EXPORT_DIR = "export"  # `train_grpo.py export`'s default output: export/<format>[-<quant>]/
README = "README.md"  # what the directory holds, its results and the export command (run_readme)


def generation_log_file(log_dir: Path, step: int) -> Path:
    return Path(log_dir) / f"generation_log_step_{step}.json"


def link_latest_log(log_file: Path, where: Path | None = None) -> bool:
    """Make `where`/grpo_training.log (default: the current directory) a symlink to this run's log, so that the
    spec's `tail -f grpo_training.log` and `grep "ERROR" grpo_training.log` read it from where the command ran. Only
    a link of ours, or nothing, is replaced there: a real file of that name is left alone. Returns whether it linked
    (False also where symlinks cannot be made, or the log is that very file)."""
    import os

    link = Path(where if where is not None else Path.cwd()) / TRAINING_LOG
    target = Path(log_file).resolve()
    if link.resolve() == target or (link.exists() and not link.is_symlink()):
        return False
    partial = link.with_name(f".{TRAINING_LOG}.{os.getpid()}")
    try:
        partial.unlink(missing_ok=True)
        partial.symlink_to(target)
        os.replace(partial, link)  # atomic: a `tail -f` running on the old link never sees it missing
    except OSError:
        partial.unlink(missing_ok=True)
        return False
    return True


def read_trainer_state(path: Path) -> dict[str, Any]:
    """trainer_state.json of a checkpoint or run directory (`path` is the directory)."""
    return read_json(Path(path) / TRAINER_STATE)


# ---------------------------------------------------------------------------------------------------------------------

def read_json(path: Path) -> Any:
    """A JSON file of the run, or a UsageError naming the file (a run killed mid-write leaves a truncated one)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise UsageError(f"{path} is not valid JSON ({err.msg}, line {err.lineno}): the run may have been killed "
                         "while writing it; delete it or rerun.") from None


def run_config(output_dir: Path) -> dict[str, Any]:
    """The effective config the run wrote (run_config.json), else the one in the newest checkpoint manifest
    (which leaves out the fields a resume may change)."""
    path = output_dir / RUN_CONFIG
    if not path.exists():
        # A checkpoint directory carries its own manifest; a run directory has them in its checkpoints.
        manifests = [output_dir / MANIFEST] if (output_dir / MANIFEST).exists() else sorted(
            output_dir.glob("checkpoint-*/" + MANIFEST), key=lambda p: _step_of(p.parent.name))
        if not manifests:
            return {}
        path = manifests[-1]
    data = read_json(path)
    config = data.get("config", data) if isinstance(data, dict) else {}
    return config if isinstance(config, dict) else {}


def log_history(output_dir: Path) -> list[dict[str, Any]]:
    """TRL's log_history (empty when the directory has no trainer_state.json, e.g. an --eval-only result)."""
    path = output_dir / TRAINER_STATE
    if not path.exists():
        checkpoints = sorted(output_dir.glob("checkpoint-*/" + TRAINER_STATE), key=lambda p: _step_of(p.parent.name))
        if not checkpoints:  # an interrupted run has only its checkpoints' states
            return []
        path = checkpoints[-1]
    data = read_json(path)
    return data.get("log_history", []) if isinstance(data, dict) else []


def generation_log_dir(output_dir: Path) -> Path | None:
    """Where the run wrote generation_log_step_*.json: the configured directory, generation_logs/, or the output
    directory itself (an --eval-only result)."""
    candidates = []
    for source in (output_dir / METRICS_SUMMARY, output_dir / RUN_CONFIG):
        if source.exists():
            try:
                data = json.loads(source.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, OSError):
                continue
            data = data.get("config", data) if isinstance(data, dict) else {}
            if isinstance(data, dict) and data.get("generation_log_dir"):
                candidates.append(Path(data["generation_log_dir"]))
    candidates += [output_dir / GENERATION_LOGS, output_dir]
    for candidate in candidates:
        if candidate.is_dir() and any(candidate.glob(GENERATION_LOG_GLOB)):
            return candidate
    return None


def generation_logs(log_dir: Path | None) -> list[tuple[int, list[dict[str, Any]]]]:
    """[(global step, entries)] sorted by step; files that are empty or unreadable are skipped."""
    if log_dir is None:
        return []
    logs = []
    for path in log_dir.glob(GENERATION_LOG_GLOB):
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, OSError):
            continue  # a log being written right now, or cut by a crash: the others still tell the story
        if isinstance(entries, list) and entries:
            logs.append((_step_of(path.stem), entries))
    return sorted(logs, key=lambda item: item[0])


def _step_of(name: str) -> int:
    tail = name.rsplit("_", 1)[-1].rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1




def run_readme(config: dict[str, Any], summary: dict[str, Any]) -> str:
    """README.md of a finished run's directory (in place of the model cards TRL and PEFT write there, which name no
    base model or an absolute cache path): what the run was, its held-out figures, the files and the commands."""
    import re
    import shlex

    from config.models import MODEL_PRESETS

    model = str(config.get("model_name") or summary.get("model") or "?")
    preset = MODEL_PRESETS.get(model)
    if preset is not None:
        hub_id = preset.checkpoint(load_in_4bit=False)
    else:  # a hub id as typed; a local directory is named by no hub id
        hub_id = model if re.fullmatch(r"[\w.-]+/[\w.-]+", model) and not Path(model).exists() else None
    data = config.get("dataset_path") or config.get("custom_data") or config.get("dataset") or "?"
    out = shlex.quote(str(summary.get("output_dir") or "OUTPUT_DIR"))
    lines = ["---", *([f"base_model: {hub_id}"] if hub_id else []), "library_name: peft", "tags:", "- grpo", "- trl",
             "- lora", "---", "", f"# GRPO run: {model}", "",
             f"A LoRA adapter trained with GRPO by `train_grpo.py` (TRL's GRPOTrainer): {model}"
             f"{' (' + hub_id + ')' if hub_id and hub_id != model else ''}, "
             f"{'4-bit (NF4)' if config.get('load_in_4bit') else '16-bit'} base, data {data}, "
             f"{summary.get('global_step', '?')} steps.", ""]
    greedy = summary.get("generation_eval") or {}
    if greedy.get("baseline") is not None:
        lines += [f"Greedy reward on {greedy.get('prompts')} {'held-out' if greedy.get('held_out') else 'training'} "
                  f"prompts: {greedy['baseline']:.3f} at step {greedy.get('baseline_step')} -> {greedy['final']:.3f} at "
                  f"step {greedy.get('final_step')}"
                  + (f" (better on {greedy['improved']}, worse on {greedy['worse']}, same on {greedy['same']})."
                     if "improved" in greedy else "."), ""]
    sampled = (summary.get("eval") or {}).get("eval_reward")
    if sampled is not None:
        lines += [f"Sampled reward on the held-out split: {sampled:.3f}.", ""]
    lines += ["| file | what |", "|---|---|",
              "| `adapter_model.safetensors`, `adapter_config.json` | the LoRA adapter (PEFT) |",
              f"| `{RUN_CONFIG}` | every setting: `python train_grpo.py --config {RUN_CONFIG}` runs it again |",
              f"| `{METRICS_SUMMARY}`, `{TRAINER_STATE}` | the summary; every logged metric |",
              f"| `{REPORT_FILE}`, `{PLOTS_DIR}/`, `{GENERATION_LOGS}/` | the report, the curves, each evaluation's "
              "greedy completions |", "",
              "```sh", f"python train_grpo.py export {out} --quant q4_k_m --ollama   # GGUF for llama.cpp / Ollama",
              f"python train_grpo.py report {out}", "```", ""]
    return "\n".join(lines)


# ---- one output directory, one run ------------------------------------------------------------------------------

PREVIOUS_RUNS = "previous_runs"  # a finished run's files, set aside when a new run starts in its directory
# Everything a run writes at the top of its output directory (TRL's save_model adds the tokenizer), and the exports
# of its adapter (an export beside a newer run's adapter would say it is that run's model); nothing else is ever
# moved, so an output dir that also holds the user's own files keeps them.
RUN_FILES = (TRAINER_STATE, METRICS_SUMMARY, RUN_CONFIG, TRAINING_LOG, GENERATION_LOGS, PLOTS_DIR, REPORT_FILE,
             BEST_CHECKPOINT, EXPORT_DIR, "adapter_model.safetensors", "adapter_config.json", "training_args.bin", "merged_16bit",
             "ref", "eval_only", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "chat_template.jinja", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")
RUN_FILE_PATTERNS = ("checkpoint-*", "incomplete-checkpoint-*")


def run_files(output_dir: Path) -> list[Path]:
    """The files and directories an earlier run left in `output_dir` (empty for a fresh directory)."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [out / name for name in RUN_FILES if (out / name).exists()]
    found += [p for pattern in RUN_FILE_PATTERNS for p in sorted(out.glob(pattern))]
    if found and (out / README).exists() and (out / "adapter_config.json").exists():
        found.append(out / README)  # the run's README (run_readme), or PEFT's model card from an older run
    return found


def finished(output_dir: Path) -> bool:
    """A run that got to its summary (metrics_summary.json): nothing left to continue."""
    return (Path(output_dir) / METRICS_SUMMARY).exists()


def set_aside_previous_run(output_dir: Path, stamp: str) -> Path | None:
    """Move an earlier run's files into OUTPUT_DIR/previous_runs/<stamp>/ (nothing is deleted); the directory they
    went to, or None when there was nothing to move."""
    files = run_files(output_dir)
    if not files:
        return None
    target = Path(output_dir) / PREVIOUS_RUNS / stamp
    target.mkdir(parents=True, exist_ok=False)
    for path in files:
        path.rename(target / path.name)
    return target


def check_output_dir(path: str, option: str = "--output-dir", what: str = "Output directory") -> Path:
    """Refuse an output directory we could not write, before anything is loaded or written; `option`: the flag
    that named it, which the line tells the user to change."""
    if not str(path).strip():
        # Path("") is the working directory: the lock, the log and the checkpoints would land there
        raise UsageError(f"{option} is empty: give a directory, e.g. {option} grpo_outputs/my_run.")
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"{what} {out} is a file, not a directory: choose another {option}.")
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        raise UsageError(f"{what} {out} is not writable ({probe} is not a writable directory): "
                         f"choose another {option}.")
    # os.access says yes to root everywhere, also on /proc, /sys or a read-only mount: only making a directory there
    # tells (it is removed at once)
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".grpo-write-check-", dir=probe))
    except OSError as err:
        raise UsageError(f"{what} {out} is not writable (making a directory in {probe} fails: "
                         f"{err.strerror or err}): choose another {option}.") from None
    return out

"""What a person sees on the terminal during a run: no third-party noise, one progress bar, whole option names.

train_grpo.py wires it like this (see each function's docstring):

    quiet_third_party(verbose)                 # first thing in a run, before torch / unsloth / transformers / trl
    whole_option_names_in_help()               # once, before the Typer app renders --help
    logger.addHandler(console_handler())       # run logs print above the live progress bar, not through it
    install_progress(trainer)                  # replaces transformers' tqdm bar and its printed metrics dicts

Everything here is cheap to import: rich and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
import time
import warnings
from collections.abc import Iterable
from typing import Any

# ---------------------------------------------------------------------------------------------------------------------
# Third-party noise
# ---------------------------------------------------------------------------------------------------------------------

# Each entry: (logger name, message regex, why it is harmless). A filter on the named logger drops only these
# records, so anything else those libraries log (a real error, a new warning) still shows.
_HARMLESS_LOG_RECORDS = [
    # torchao ships prebuilt kernels for other Pythons / GPUs (_C_mxfp8 is built for CPython 3.10, _C_cutlass_90a
    # for Hopper GPUs). It tries each with torch.ops.load_library and logs every failure through its "torchao"
    # logger (which has no handler: Python's last-resort handler prints it). Nothing we run uses those kernels.
    ("torchao", r"^Failed to load .*_C_[\w.-]*\.so"),
    # torchao/kernel/intmm.py on a machine without Triton (every CPU install): its Triton int-matmul kernels are
    # simply not used. Printed through the root handler Unsloth installs with logging.basicConfig.
    ("torchao.kernel.intmm", r"Detected no triton"),
    # torch 2.13 deprecates register_constant() on Enums; torchao's float8 module still calls it at import time
    # (KernelPreference, ScaleCalculationMode). torch's own logging handler prints these as "W1122 ... _pytree.py".
    ("torch.utils._pytree", r"is an Enum subclass and is now natively supported"),
    # bitsandbytes on a CPU with AVX512-BF16 tries to fetch a faster 4-bit gemm from the Hugging Face `kernels`
    # package (not installed: it downloads kernels at run time) and logs a 220-column line at import when it cannot.
    # Its own 4-bit gemm still runs, and a 4-bit run on a CPU does not use bitsandbytes' matmuls anyway (NF4-rounded
    # weights computed in 16 bits, model_loader.nf4_in_16bit).
    ("bitsandbytes.backends.cpu.ops", r"^Failed to load CPU gemm_4bit_forward from kernels-community"),
]

# (category, message regex, module regex) for warnings.filterwarnings.
_HARMLESS_WARNINGS = [
    # transformers 5 warns once per tokenizer that it will not apply WordPiece clean-up to a BPE tokenizer (the
    # saved tokenizer_config.json of SmolLM2 / Qwen / Llama sets clean_up_tokenization_spaces=True). It is logged,
    # not warned, in 5.17; the filter covers releases that route it through warnings.
    (UserWarning, r".*Ignoring clean_up_tokenization_spaces", ""),
    # torch's pytree deprecation in releases that raise it as a FutureWarning instead of logging it.
    (FutureWarning, r".*register_constant\(\) on Enum subclasses is deprecated", ""),
    # TRL marks environment_factory experimental at every trainer built with one; the CLI's tools and environments
    # are documented as TRL's contract of the pinned release (docs/agents.md), and a run's evaluation builds a
    # second trainer: the same notice twice per run.
    (UserWarning, r"You are using 'environment_factory', which is an experimental feature", ""),
]

# Set only when the user has not chosen: an explicit TRANSFORMERS_VERBOSITY=info in the environment still wins.
_QUIET_ENV = {
    # transformers' and datasets' own loggers: warnings such as the clean_up_tokenization_spaces one above are
    # advice for library authors; errors still print.
    "TRANSFORMERS_VERBOSITY": "error",
    "DATASETS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    # The Rust tokenizers warn after every fork (data loader workers, reward subprocesses) that they turned their
    # thread pool off; turning it off up front says the same thing without the warning.
    "TOKENIZERS_PARALLELISM": "false",
}


class _DropMatching(logging.Filter):
    """Drops the records of one logger whose message matches a pattern; passes everything else."""

    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a badly formatted record is not ours to judge: let it through
            return True
        return not self.pattern.search(message)


def quiet_third_party(verbose: bool = False) -> None:
    """Silence known-harmless third-party warnings at their source, before the libraries are imported.

    Call it first thing in a run, before torch / unsloth / transformers / trl are imported (env variables such as
    TRANSFORMERS_VERBOSITY are read at import time; logger filters attach to logger objects that the libraries
    fetch by name later). Only the messages listed in this module are dropped; stderr is not redirected, so real
    errors and unknown warnings still show. `verbose=True` changes nothing."""
    if verbose:
        return
    for name, value in _QUIET_ENV.items():
        os.environ.setdefault(name, value)
    for logger_name, pattern in _HARMLESS_LOG_RECORDS:
        logger = logging.getLogger(logger_name)
        if not any(isinstance(f, _DropMatching) and f.pattern.pattern == pattern for f in logger.filters):
            logger.addFilter(_DropMatching(pattern))
    for category, message, module in _HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    _hide_weight_loading_bar()


def _hide_weight_loading_bar() -> None:
    """transformers 5 draws a "Loading weights" tqdm bar for every model load (hundreds of redraws in a log file).

    transformers.utils.logging has a tqdm hook for exactly this, but importing transformers here would put it in
    sys.modules before Unsloth (Unsloth then warns and skips its patches). So the hook is installed by an import
    hook the moment transformers.utils.logging finishes loading. Hub download bars are left alone: a multi-GB
    download without a bar looks like a hang."""
    _after_import("transformers.utils.logging", _install_tqdm_hook)


_HIDDEN_BARS = ("Loading weights",)


def _install_tqdm_hook(module) -> None:
    set_hook = getattr(module, "set_tqdm_hook", None)
    if set_hook is None:  # older transformers: no hook, the bar stays
        return
    empty = getattr(module, "EmptyTqdm", None)

    def hook(factory, args, kwargs):
        if empty is not None and str(kwargs.get("desc", "")).startswith(_HIDDEN_BARS):
            return empty(*args, **kwargs)
        return factory(*args, **kwargs)

    set_hook(hook)


def _after_import(name: str, callback, before=None) -> None:
    """Run `callback(module)` now if `name` is imported, else right after it is (once). `before()`, if given, runs
    just before the module executes and returns what to call once it has (see _markdown_placeholder)."""
    if name in sys.modules:
        callback(sys.modules[name])
    elif not any(isinstance(finder, _AfterImport) and finder.name == name for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback, before))


class _AfterImport:
    """A sys.meta_path finder that runs `callback(module)` right after one named module has been executed."""

    def __init__(self, name: str, callback, before=None):
        self.name = name
        self.callback = callback
        self.before = before

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        import importlib.machinery

        sys.meta_path.remove(self)  # find the real spec with the other finders, and fire once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        original_exec = spec.loader.exec_module
        callback, before = self.callback, self.before

        def exec_module(module):
            after = before() if before is not None else None
            try:
                original_exec(module)
            finally:
                if after is not None:
                    after()
            try:
                callback(module)
            except Exception:  # noqa: BLE001 - a cosmetic hook must never break an import
                pass

        spec.loader.exec_module = exec_module
        return spec


# ---------------------------------------------------------------------------------------------------------------------
# One shared Rich console on stderr (stdout carries results: --dry-run JSON, --score-completions rows)
# ---------------------------------------------------------------------------------------------------------------------

_console = None


def get_console():
    """The Rich console every part of the run prints through, so log lines land above a live progress bar."""
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(stderr=True, highlight=False, soft_wrap=False)
    return _console


class ConsoleHandler(logging.Handler):
    """A logging handler that prints through the shared Rich console ("HH:MM:SS LEVEL message").

    A plain StreamHandler keeps a reference to the original stderr and writes through a live progress bar; Rich
    prints these lines above it instead. Records logged with `extra={"file_only": True}` are skipped (the per-step
    line that ProgressCallback already shows on the console still belongs in grpo_training.log)."""

    def __init__(self, level: int = logging.INFO):
        super().__init__(level)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "file_only", False):
            return
        try:
            text = self.format(record)
            style = "red" if record.levelno >= logging.ERROR else "yellow" if record.levelno >= logging.WARNING else None
            get_console().print(text, style=style, markup=False, highlight=False, soft_wrap=True)
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)


def console_handler(level: int = logging.INFO) -> logging.Handler:
    """The handler for the run's logger on the console: `logging.getLogger("grpo").addHandler(console_handler())`."""
    return ConsoleHandler(level)


# ---------------------------------------------------------------------------------------------------------------------
# Training progress
# ---------------------------------------------------------------------------------------------------------------------

def _duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "--:--"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _num(value: Any, digits: int = 3) -> str:
    if isinstance(value, (int, float)):
        if value != 0 and (abs(value) < 10 ** -digits or abs(value) >= 10 ** 5):
            return f"{value:.2e}"
        return f"{value:.{digits}f}"
    return "-"


class _ProgressState:
    """The numbers the bar and the plain lines show, independent of how they are drawn."""

    def __init__(self):
        self.total = 0
        self.step = 0
        self.start_step = 0
        self.step_seconds: list[float] = []
        self.step_started: float | None = None
        self.last: dict[str, Any] = {}

    def seconds_per_step(self) -> float | None:
        recent = self.step_seconds[-10:]  # the last few steps: the first ones carry warm-up costs
        return sum(recent) / len(recent) if recent else None

    def eta(self) -> float | None:
        per_step = self.seconds_per_step()
        return None if per_step is None else per_step * max(self.total - self.step, 0)


def _reward_components(logs: dict[str, Any]) -> dict[str, float]:
    """{component: mean} from TRL's `rewards/<name>/mean` keys (one per reward function)."""
    return {k[len("rewards/"):-len("/mean")]: v for k, v in logs.items()
            if k.startswith("rewards/") and k.endswith("/mean") and isinstance(v, (int, float))}


def _step_line(state: _ProgressState, logs: dict[str, Any]) -> str:
    parts = [f"step {state.step}/{state.total}"]
    if "reward" in logs:
        parts.append(f"reward {_num(logs['reward'])} ± {_num(logs.get('reward_std'))}")
        components = _reward_components(logs)
        if len(components) > 1:  # one component is the total itself ('single' mode): nothing to add
            parts.append("(" + ", ".join(f"{k} {_num(v, 2)}" for k, v in components.items()) + ")")
    if "loss" in logs:
        parts.append(f"loss {_num(logs['loss'], 4)}")
    if isinstance(logs.get("kl"), (int, float)) and logs["kl"]:
        parts.append(f"kl {_num(logs['kl'], 4)}")
    parts += _tool_parts(logs)
    per_step = state.seconds_per_step()
    if per_step is not None:
        parts.append(f"{per_step:.1f} s/step")
        parts.append(f"ETA {_duration(state.eta())}")
    return "  ".join(parts)


def _tool_parts(logs: dict[str, Any], prefix: str = "") -> list[str]:
    """A tool run's calls and failed calls per completion (TRL's tools/call_frequency, tools/failure_frequency:
    failures per call, shown here per completion)."""
    calls = logs.get(f"{prefix}tools/call_frequency")
    if not isinstance(calls, (int, float)):
        return []
    failures = logs.get(f"{prefix}tools/failure_frequency") or 0.0
    return [f"tools {_num(calls, 2)}/completion, {_num(calls * failures, 2)} failed"]


def _eval_line(step: int, metrics: dict[str, Any]) -> str:
    parts = [f"eval @ step {step}:"]
    reward = metrics.get("eval_reward")
    if reward is not None:
        parts.append(f"reward {_num(reward)} ± {_num(metrics.get('eval_reward_std'))}")
    components = {k[len("eval_rewards/"):-len("/mean")]: v for k, v in metrics.items()
                  if k.startswith("eval_rewards/") and k.endswith("/mean")}
    if len(components) > 1:
        parts.append("(" + ", ".join(f"{k} {_num(v, 2)}" for k, v in components.items()) + ")")
    parts += _tool_parts(metrics, "eval_")
    if "eval_completions/mean_length" in metrics:
        parts.append(f"length {_num(metrics['eval_completions/mean_length'], 1)}")
    if "eval_runtime" in metrics:
        parts.append(f"({metrics['eval_runtime']:.1f} s)")
    return "  ".join(parts)


class _ProgressCallbackMixin:
    """One Rich progress bar on a terminal (live reward, reward std, loss, s/step, ETA) and one line per evaluation;
    elsewhere (CI, pipes, nohup) one plain line per logged step and per evaluation, no redraws."""

    def __init__(self, console=None, interactive: bool | None = None):
        self.console = console or get_console()
        self.interactive = self.console.is_terminal if interactive is None else interactive
        self.state = _ProgressState()
        self.progress = None
        self.task = None

    # -- drawing ---------------------------------------------------------------------------------------------------
    def _start_bar(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[metrics]}"),
            console=self.console,
            transient=False,
            redirect_stdout=True,  # an Unsloth / TRL print() lands above the bar instead of through it
            redirect_stderr=True,
            refresh_per_second=2,  # steps take seconds: more redraws would only cost CPU
        )
        self.task = self.progress.add_task("train", total=self.state.total, completed=self.state.step,
                                           metrics="waiting for the first step…")
        self.progress.start()

    def _bar_metrics(self) -> str:
        logs, parts = self.state.last, []
        if "reward" in logs:
            parts.append(f"reward {_num(logs['reward'])} ± {_num(logs.get('reward_std'))}")
        if "loss" in logs:
            parts.append(f"loss {_num(logs['loss'], 4)}")
        per_step = self.state.seconds_per_step()
        if per_step is not None:
            parts.append(f"{per_step:.1f} s/step")
            parts.append(f"ETA {_duration(self.state.eta())}")
        return "  ".join(parts) or "waiting for the first step…"

    def _refresh(self, description: str = "train") -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=self.state.step, total=self.state.total,
                                 description=description, metrics=self._bar_metrics())

    def _say(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    # -- TrainerCallback hooks -------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.state.total = state.max_steps
        self.state.step = self.state.start_step = state.global_step
        if self.interactive:
            self._start_bar()
        else:
            resumed = f" (resuming at step {state.global_step})" if state.global_step else ""
            self._say(f"training: {state.max_steps} steps{resumed}")

    def on_step_begin(self, args, state, control, **kwargs):
        self.state.step_started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.state.step_started is not None:
            self.state.step_seconds.append(time.perf_counter() - self.state.step_started)
            self.state.step_started = None
        self.state.step = state.global_step
        if state.is_world_process_zero:
            self._refresh()

    def on_prediction_step(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.progress is not None:
            self._refresh("eval ")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if any(k.startswith("eval_") for k in logs) or "train_runtime" in logs:
            return  # evaluations: on_evaluate; the end-of-training totals: on_train_end
        self.state.last = dict(logs)
        self.state.step = state.global_step
        if self.progress is not None:
            self._refresh()
        else:
            self._say(_step_line(self.state, logs))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if not state.is_world_process_zero or not metrics:
            return
        self._say(_eval_line(state.global_step, metrics))
        self._refresh()

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        if self.progress is not None:
            self._refresh("done ")
            self.progress.stop()
            self.progress = None
        # No "trained N steps in T" here: the summary gives the run's one training time (callbacks.TrainClock).


def __getattr__(name: str):
    # `console.ProgressCallback` must derive from transformers' TrainerCallback, but importing transformers when
    # console.py is imported would put it in sys.modules before Unsloth (the import-order warning, and Unsloth's
    # patches skipped). So the class is built on first access (PEP 562).
    if name == "ProgressCallback":
        from transformers import TrainerCallback

        cls = type("ProgressCallback", (_ProgressCallbackMixin, TrainerCallback), {
            "__doc__": _ProgressCallbackMixin.__doc__, "__module__": __name__})
        globals()["ProgressCallback"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def install_progress(trainer, console=None, interactive: bool | None = None):
    """Swap transformers' console output on `trainer` for ProgressCallback; returns the callback."""
    remove_console_callbacks(trainer)
    progress_class = globals().get("ProgressCallback") or __getattr__("ProgressCallback")
    callback = progress_class(console=console, interactive=interactive)
    trainer.add_callback(callback)
    return callback


def remove_console_callbacks(trainer) -> None:
    """transformers adds exactly one of three console callbacks in Trainer.__init__ (transformers 5.17,
    trainer.py: `PrinterCallback if args.disable_tqdm else DEFAULT_PROGRESS_CALLBACK`): `ProgressCallback` (the
    tqdm bar, which also writes every logs dict with tqdm.write), `NotebookProgressCallback` in Jupyter, or
    `PrinterCallback` (print(logs)) when disable_tqdm=True. All three are removed, whatever disable_tqdm says (an
    --eval-only trainer would otherwise print its whole metrics dict)."""
    from transformers.trainer_callback import PrinterCallback
    from transformers.trainer_callback import ProgressCallback as TqdmProgressCallback

    removable: list[type] = [PrinterCallback, TqdmProgressCallback]
    try:
        from transformers.utils.notebook import NotebookProgressCallback

        removable.append(NotebookProgressCallback)
    except ImportError:  # pragma: no cover - IPython-less installs
        pass
    for callback_class in removable:
        trainer.remove_callback(callback_class)


# ---------------------------------------------------------------------------------------------------------------------
# Header and summary
# ---------------------------------------------------------------------------------------------------------------------

def print_header(lines: Iterable[tuple[str, Any] | str], title: str = "GRPO run") -> None:
    """A compact start-of-run block: a rule and one `key  value` item per line (strings print as they are); a value
    longer than the console is wide continues under the value, not under the key.

    Use it instead of logging the whole config as one JSON line (which wraps to a dozen lines at 80 columns and is
    in run_config.json anyway)."""
    import textwrap

    console = get_console()
    console.rule(f"[bold]{title}", style="dim")
    items = [line if isinstance(line, str) else (str(line[0]), str(line[1])) for line in lines]
    width = max((len(item[0]) for item in items if not isinstance(item, str)), default=0)
    for item in items:
        if isinstance(item, str):
            console.print(item, markup=False, highlight=False)
            continue
        # wrapped here, between words (a path longer than the line stays whole), so that rich does not wrap it again
        # at column 0
        first, *rest = textwrap.wrap(item[1], max(20, console.width - width - 2), break_long_words=False,
                                     break_on_hyphens=False) or [""]
        console.print(f"[bold]{item[0]:<{width}}[/]  {_escape(first)}", highlight=False, soft_wrap=True)
        for line in rest:
            console.print(" " * (width + 2) + line, markup=False, highlight=False, soft_wrap=True)


def print_summary(summary: dict[str, Any], console=None) -> None:
    """The end-of-run block, from metrics_summary.json's dict: steps, times, rewards before -> after, where things
    are. The one summary renderer (the report's page says the same numbers)."""
    console = console or _summary_console()
    console.rule("[bold]GRPO run finished")
    resumed = f" (resumed from {summary['resumed_from']})" if summary.get("resumed_from") else ""
    console.print(f"steps: {summary['global_step']}{resumed}  backend: {summary['backend']}  "
                  f"train time: {_duration(summary['train_seconds'])}  total: {_duration(summary['total_seconds'])}")
    first, last = summary.get("train_reward_first"), summary.get("train_reward_last")
    if first is not None:
        console.print(f"train reward (sampled): first step {first:.3f} -> last step {last:.3f}")
    greedy = summary.get("generation_eval")
    if greedy and greedy.get("baseline") is not None:
        # two lines of at most 80 columns: the mean before -> after, then the verdict with the per-prompt counts
        what = "held-out prompts" if greedy["held_out"] else "TRAINING prompts"
        change = greedy["final"] - greedy["baseline"]
        verdict = "improved" if change > 1e-9 else "got worse" if change < -1e-9 else "unchanged"
        console.print(f"greedy reward on {greedy['prompts']} {what}: {greedy['baseline']:.3f} at step "
                      f"{greedy['baseline_step']} -> {greedy['final']:.3f} at step {greedy['final_step']}")
        if "improved" in greedy:
            compared = greedy["improved"] + greedy["worse"] + greedy["same"]
            verdict += (f": better on {greedy['improved']}, worse on {greedy['worse']}, same on {greedy['same']} "
                        f"of {compared} prompts")
        console.print(verdict if greedy["held_out"] else f"{verdict} (no held-out split: these were trained on)")
        for key in sorted(k for k in greedy if k.startswith("pass@")):
            before = greedy.get(f"baseline_{key}")
            console.print(f"{key} (sampled): {greedy[key]:.3f}" if before is None else
                          f"{key} (sampled): {before:.3f} at step {greedy['baseline_step']} -> {greedy[key]:.3f} at "
                          f"step {greedy['final_step']}")
    if summary.get("eval", {}).get("eval_reward") is not None:
        console.print(f"eval reward (sampled, held-out split): {summary['eval']['eval_reward']:.3f}")
    for notice in summary.get("notices") or []:
        console.print(f"note: {notice}")
    console.print(f"adapter, tokenizer, trainer state, metrics_summary.json: {summary['output_dir']}")
    # what people do next: run it in llama.cpp / Ollama (or --format merged, --push-to-hub; see `export --help`);
    # the command alone on its line where "export: " would take the line past 80 columns (the quick test's does)
    command = f"python train_grpo.py export {shlex.quote(str(summary['output_dir']))} --quant q4_k_m --ollama"
    if len(command) <= 80 - len("export: "):
        console.print(f"export: {command}")
    else:
        console.print("export to GGUF + an Ollama Modelfile:")
        console.print(f"  {command}")
    if summary.get("report"):
        console.print(f"report: {summary['report']}")
    if "generation_log_dir" in summary:
        console.print(f"generation logs: {summary['generation_log_dir']}")
    if summary.get("best_checkpoint"):
        console.print(f"best checkpoint: {summary['best_checkpoint']} (eval metric {summary['best_metric']:.4g})")


def print_eval_only(result: dict[str, Any], console=None) -> None:
    """The end of an --eval-only run: the adapter, its greedy reward, pass@k and sampled reward, where files are."""
    console = console or _summary_console()
    console.rule("[bold]Evaluation finished")
    greedy, metrics = result.get("generation_log") or {}, result.get("eval") or {}
    what = "held-out eval prompts" if result.get("held_out") else "training prompts (no held-out split)"
    console.print(f"adapter: {result['adapter']} (step {result['global_step']})")
    if greedy.get("reward_mean") is not None:
        console.print(f"greedy reward on {what}: {greedy['reward_mean']:.3f}")
    for key in sorted(k for k in greedy if k.startswith("pass@")):
        console.print(f"{key} (sampled): {greedy[key]:.3f}")
    if metrics.get("eval_reward") is not None:
        # the sampled evaluation in one line, as a run's "eval @ step" line says it (every figure: eval_metrics.json)
        sampled = _eval_line(result["global_step"], metrics).split(":", 1)[1].strip()
        console.print(f"sampled, {'held-out' if result.get('held_out') else 'training prompts'}: {sampled}")
    where = f"eval_metrics.json, generation log, report: {result['output_dir']}"
    if len(where) <= 80:
        console.print(where)
    else:  # the directory alone on its line (eval_only/<adapter>-step_<N> is long)
        console.print("eval_metrics.json, generation log, report:")
        console.print(f"  {result['output_dir']}")


def _summary_console():
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)  # a summary line stays one line in a log file or a pipe


def is_main_process() -> bool:
    """Rank 0 (or a single process): the one that talks to the user."""
    return int(os.environ.get("RANK", "0")) == 0


def add_file_logging(path):
    """The run's log lines also go to grpo_training.log (appended: a resumed run continues the same file). Returns
    a function that closes it again, or None where that file already takes them (the CLI opens it before the API's
    train()).

    The file gets every detail (DEBUG), as the CLI's does. Where nobody configured the "grpo" logger (the Python
    API), that means lowering its level for the run; its records then reach the caller's own handlers (or Python's
    last resort) through a forwarder at the level they got before, so the caller sees no more than without the file.
    """
    target = os.path.abspath(path)
    logger = logging.getLogger("grpo")
    if any(isinstance(h, logging.FileHandler) and h.baseFilename == target for h in logger.handlers):
        return None
    handler = logging.FileHandler(target, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    level, propagate, forward = logger.level, logger.propagate, None
    if logger.getEffectiveLevel() > logging.DEBUG:
        forward = _ToParents(logger, logger.getEffectiveLevel() if propagate else logging.CRITICAL + 1)
        logger.addHandler(forward)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False

    def close() -> None:
        logger.removeHandler(handler)
        handler.close()
        if forward is not None:
            logger.removeHandler(forward)
            logger.setLevel(level)
            logger.propagate = propagate

    return close


class _ToParents(logging.Handler):
    """What propagation did for `logger`'s records, for those at `level` and above: its ancestors' handlers, each
    at its own level, or Python's last-resort handler where none has any (logging.Logger.callHandlers)."""

    def __init__(self, logger: logging.Logger, level: int):
        super().__init__(level)
        self.logger = logger

    def emit(self, record: logging.LogRecord) -> None:
        found, current = 0, self.logger.parent
        while current is not None:
            for handler in current.handlers:
                found += 1
                if record.levelno >= handler.level:
                    handler.handle(record)
            current = current.parent if current.propagate else None
        if not found and logging.lastResort is not None and record.levelno >= logging.lastResort.level:
            logging.lastResort.handle(record)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(str(text))


# ---------------------------------------------------------------------------------------------------------------------
# --help at 80 columns
# ---------------------------------------------------------------------------------------------------------------------

_MIN_HELP_WIDTH = 16


def whole_option_names_in_help() -> None:
    """Make Typer's rich --help print every option name whole, at any width down to 80 columns.

    Typer (0.19 - 0.29) renders each panel as a Rich table with one column per name kind (long, short, negative
    long, negative short), then the type and the help. When the table is too wide Rich shrinks every column and
    cuts names with an ellipsis ("--enable-generation…"). This replaces the table class Typer's option panels use
    with one that stacks a flag's names in one column (the negative form on its own line), never wraps or cuts
    that column, folds long type lists, and gives the help text the rest. Command tables are left alone.
    Call once when building the app; calling again is harmless. typer.rich_utils (Rich's tables, ~0.1 s) is only
    imported when help or an error is rendered, so the patch waits for that import instead of forcing it."""
    _after_import("typer.rich_utils", _patch_typer_tables, before=_markdown_placeholder)


def _markdown_placeholder():
    """typer.rich_utils imports rich.markdown (markdown-it: ~45 ms, a tenth of --help) for `rich_markup_mode=
    "markdown"`, which this app does not use. While it imports, lend it a placeholder module whose `Markdown` builds
    the real one on first use; returns what removes the placeholder again, so any later import gets the real module."""
    import types

    if "rich.markdown" in sys.modules:
        return None

    class Markdown:
        def __new__(cls, *args, **kwargs):
            from rich.markdown import Markdown as real  # the placeholder is gone by then: the real module loads

            return real(*args, **kwargs)

    placeholder = types.ModuleType("rich.markdown")
    placeholder.Markdown = Markdown
    sys.modules["rich.markdown"] = placeholder

    def remove():
        if sys.modules.get("rich.markdown") is placeholder:
            del sys.modules["rich.markdown"]

    return remove


def _patch_typer_tables(rich_utils) -> None:
    if not getattr(rich_utils.Table, "_whole_option_names", False):
        rich_utils.Table = _options_table_class(rich_utils.Table)


def _options_table_class(base):
    class OptionsTable(base):
        """Typer's option rows arrive as 6 cells ([required,] long, short, negative long, negative short, type,
        help) on a table with no declared columns; those rows are rebuilt, anything else passes through."""

        _whole_option_names = True

        def add_row(self, *renderables, **kwargs):
            if self.columns and not getattr(self, "_rebuilt", False) or len(renderables) not in (6, 7):
                return super().add_row(*renderables, **kwargs)
            from rich.text import Text

            required, cells = (renderables[0], renderables[1:]) if len(renderables) == 7 else (None, renderables)
            long_names, short_names, negative_long, negative_short, types, help_text = cells
            names, shorts = _stacked(long_names, negative_long), _stacked(short_names, negative_short)
            if not getattr(self, "_rebuilt", False):
                self._rebuilt = True
                if len(renderables) == 7:
                    self.add_column(no_wrap=True)
                self.add_column(no_wrap=True, overflow="ignore")  # names: never wrapped, never cut
                self.add_column(no_wrap=True, overflow="ignore")
                self.add_column(overflow="fold")  # a long choice list wraps between choices; names stay whole
                self.add_column(ratio=1)  # the help text takes what is left
            if isinstance(types, Text) and "|" in types.plain:
                # A choice list wraps between choices, never inside one (`<single|multi|syste` / `matic>`): a
                # space after each bar gives Rich a place to break.
                types = Text(types.plain.replace("|", "| "), style=types.style)
            row = [names, shorts, types, help_text]
            if len(renderables) == 7:
                row.insert(0, required)
            return super().add_row(*row, **kwargs)

        def _calculate_column_widths(self, console, options):
            if getattr(self, "_rebuilt", False):
                # A long choice list may take a quarter of the width, the help text keeps the rest.
                self.columns[-2].max_width = max(12, options.max_width // 4)
            widths = super()._calculate_column_widths(console, options)
            if not getattr(self, "_rebuilt", False):
                return widths
            # Rich shrinks no_wrap columns too when the table is too wide; give the name columns their full width
            # back and take it from the help column (the last), which wraps.
            first = 1 if len(self.columns) == 5 else 0
            for index in (first, first + 1):
                column = self.columns[index]
                need = max((cell.cell_len for cell in _plain_lines(column)), default=0)
                missing = need - widths[index]
                if missing > 0 and widths[-1] - missing >= _MIN_HELP_WIDTH:  # a terminal too narrow keeps Rich's cut
                    widths[-1] -= missing
                    widths[index] = need
            return widths

    return OptionsTable


def _stacked(*parts):
    """The non-empty Text parts one under the other (an option and its negative form: --x / --no-x)."""
    from rich.text import Text

    out = Text()
    for part in parts:
        if isinstance(part, Text) and part.plain:
            if out.plain:
                out.append("\n")
            out.append_text(part)
    return out


def _plain_lines(column) -> list:
    from rich.text import Text

    lines = []
    for cell in column.cells:
        if isinstance(cell, Text):
            lines.extend(Text(line) for line in cell.plain.split("\n"))
    return lines

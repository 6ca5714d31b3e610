"""console.py (third-party noise, progress, --help at 80 columns) and hub.py (fail fast offline)."""

import io
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from config.errors import UsageError
from grpokit import console, hub

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------------------------------
# quiet_third_party
# ---------------------------------------------------------------------------------------------------------------------

@pytest.fixture
def clean_noise_state(monkeypatch):
    """quiet_third_party changes process-wide state (env, logger filters, warning filters, sys.meta_path): undo it."""
    for name in console._QUIET_ENV:
        monkeypatch.delenv(name, raising=False)
    names = [name for name, _ in console._HARMLESS_LOG_RECORDS]
    filters = {name: list(logging.getLogger(name).filters) for name in names}
    meta_path = list(sys.meta_path)
    # Start from a process where no run has quietened anything yet (CLI tests in the same process call it, and a
    # library imported by an earlier test may have put a filter of its own on these loggers).
    for name in names:
        logging.getLogger(name).filters[:] = []
    sys.meta_path[:] = [f for f in meta_path if not isinstance(f, console._AfterImport)]
    with warnings.catch_warnings():
        yield
    for name in names:
        logging.getLogger(name).filters[:] = filters[name]
    sys.meta_path[:] = meta_path


def _record(logger: str, message: str, *args) -> logging.LogRecord:
    return logging.LogRecord(logger, logging.WARNING, __file__, 1, message, args, None)


def test_quiet_drops_only_the_listed_messages(clean_noise_state):
    console.quiet_third_party(verbose=False)
    torchao = logging.getLogger("torchao")
    so = "/x/.venv/lib/python3.11/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so"
    assert not torchao.filter(_record("torchao", "Failed to load %s: Could not load this library: %s", so, so))
    assert not torchao.filter(_record("torchao", f"Failed to load {so.replace('_C_mxfp8.cpython-310-x86_64-linux-gnu', '_C_cutlass_90a.abi3')}: x"))
    assert torchao.filter(_record("torchao", "Skipping import of cpp extensions: torch too old"))  # not listed
    pytree = logging.getLogger("torch.utils._pytree")
    assert not pytree.filter(_record("torch.utils._pytree", "%s is an Enum subclass and is now natively supported by "
                                     "torch.compile as an opaque value type.", "<enum 'KernelPreference'>"))
    assert pytree.filter(_record("torch.utils._pytree", "some other pytree problem"))
    assert not logging.getLogger("torchao.kernel.intmm").filter(
        _record("torchao.kernel.intmm", "Warning: Detected no triton, on systems without Triton certain kernels"))
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"


def test_quiet_twice_adds_each_filter_once(clean_noise_state):
    console.quiet_third_party(False)
    console.quiet_third_party(False)
    assert len([f for f in logging.getLogger("torchao").filters if isinstance(f, console._DropMatching)]) == 1
    assert len([f for f in sys.meta_path if isinstance(f, console._AfterImport)
                and f.name == "transformers.utils.logging"]) <= 1


def test_quiet_keeps_what_the_user_chose(clean_noise_state, monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    console.quiet_third_party(False)
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "info"


def test_verbose_changes_nothing(clean_noise_state):
    before_env = dict(os.environ)
    before_meta = list(sys.meta_path)
    console.quiet_third_party(verbose=True)
    assert dict(os.environ) == before_env
    assert sys.meta_path == before_meta
    assert not any(isinstance(f, console._DropMatching) for f in logging.getLogger("torchao").filters)


def test_tqdm_hook_hides_only_the_weight_loading_bar():
    calls = {}

    class Empty:
        def __init__(self, *args, **kwargs):
            self.empty = True

    fake = SimpleNamespace(EmptyTqdm=Empty, set_tqdm_hook=lambda hook: calls.setdefault("hook", hook))
    console._install_tqdm_hook(fake)
    hook = calls["hook"]
    assert isinstance(hook(lambda *a, **k: "bar", (range(3),), {"desc": "Loading weights"}), Empty)
    assert hook(lambda *a, **k: "bar", (range(3),), {"desc": "Downloading"}) == "bar"


def test_after_import_runs_once_when_the_module_loads(tmp_path, monkeypatch):
    package = tmp_path / "fakepkg_h2"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "sub.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    console._after_import("fakepkg_h2.sub", lambda module: seen.append(module.VALUE + 1))
    assert seen == []
    import fakepkg_h2.sub  # noqa: F401

    assert seen == [42]
    assert not any(isinstance(f, console._AfterImport) and f.name == "fakepkg_h2.sub" for f in sys.meta_path)
    console._after_import("fakepkg_h2.sub", lambda module: seen.append(0))  # already imported: runs at once
    assert seen == [42, 0]


def test_importing_console_imports_no_heavy_library():
    # train_grpo.py imports console before Unsloth: transformers / torch must not come in with it.
    code = "import sys; from grpokit import console; print(sorted(m for m in ('transformers', 'torch', 'rich', 'trl') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_quiet_torchao_import_prints_nothing():
    """The real thing: torchao's import-time lines (failed .so loads, torch's Enum deprecation) are gone."""
    code = "from grpokit import console; console.quiet_third_party(False); import torchao"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Failed to load" not in out.stderr
    assert "register_constant" not in out.stderr


# ---------------------------------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------------------------------

TRAIN_LOG = {  # one logged step, keys as TRL 1.15 logs them (abridged)
    "loss": -0.00834, "grad_norm": 0.41, "learning_rate": 0.0001667, "num_tokens": 860.0,
    "completions/mean_length": 9.5, "completions/clipped_ratio": 0.75, "rewards/reward_total/mean": 0.375,
    "rewards/reward_total/std": 0.5175, "reward": 0.375, "reward_std": 0.5175, "frac_reward_zero_std": 0.5,
    "entropy": 1.3, "step_time": 3.2, "epoch": 0.0625,
}
EVAL_METRICS = {"eval_reward": 0.5, "eval_reward_std": 0.5, "eval_rewards/reward_total/mean": 0.5,
                "eval_completions/mean_length": 8.0, "eval_runtime": 4.2, "epoch": 0.0625}


def _drive(callback, steps=4, eval_every=2):
    """Feed the callback what transformers' Trainer sends, through transformers' own CallbackHandler."""
    from transformers import TrainerControl, TrainerState
    from transformers.trainer_callback import CallbackHandler

    handler = CallbackHandler([callback], model=None, processing_class=None, optimizer=None, lr_scheduler=None)
    state, control, args = TrainerState(max_steps=steps), TrainerControl(), SimpleNamespace()
    handler.on_train_begin(args, state, control)
    for step in range(1, steps + 1):
        handler.on_step_begin(args, state, control)
        state.global_step = step
        handler.on_step_end(args, state, control)
        handler.on_log(args, state, control, dict(TRAIN_LOG, reward=0.1 * step))
        if step % eval_every == 0:
            handler.on_prediction_step(args, state, control)
            handler.on_log(args, state, control, dict(EVAL_METRICS))
            handler.on_evaluate(args, state, control, metrics=dict(EVAL_METRICS))
    handler.on_log(args, state, control, {"train_runtime": 12.0, "train_loss": 0.01, "epoch": 0.125})
    handler.on_train_end(args, state, control)


def _console(terminal: bool):
    from rich.console import Console

    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=terminal, width=100, color_system=None), buffer


def test_progress_without_a_terminal_prints_one_plain_line_per_step():
    rich_console, buffer = _console(terminal=False)
    _drive(console.ProgressCallback(console=rich_console))
    lines = buffer.getvalue().splitlines()
    assert "\r" not in buffer.getvalue()
    step_lines = [line for line in lines if line.startswith("step ")]
    eval_lines = [line for line in lines if line.startswith("eval @ step")]
    assert len(step_lines) == 4 and len(eval_lines) == 2
    assert step_lines[2].startswith("step 3/4  reward 0.300 ± 0.517  loss -0.0083")
    assert "s/step" in step_lines[2] and "ETA" in step_lines[2]
    assert eval_lines[0] == "eval @ step 2:  reward 0.500 ± 0.500  length 8.0  (4.2 s)"
    assert lines[0] == "training: 4 steps" and not any(line.startswith("trained ") for line in lines)
    assert len(lines) == 7  # header, 4 steps, 2 evaluations: nothing else (the summary gives the training time)


def test_progress_shows_components_in_multi_mode():
    rich_console, buffer = _console(terminal=False)
    callback = console.ProgressCallback(console=rich_console)
    logs = dict(TRAIN_LOG, **{"rewards/accuracy/mean": 0.25, "rewards/format/mean": 1.0})
    del logs["rewards/reward_total/mean"]
    state = SimpleNamespace(is_world_process_zero=True, global_step=1, max_steps=2)
    callback.on_log(None, state, None, logs=logs)
    assert "(accuracy 0.25, format 1.00)" in buffer.getvalue()


def test_progress_bar_on_a_terminal():
    rich_console, buffer = _console(terminal=True)
    _drive(console.ProgressCallback(console=rich_console))
    text = buffer.getvalue()
    assert "4/4" in text and "reward 0.400" in text and "s/step" in text
    assert text.count("eval @ step") == 2


def test_install_progress_replaces_transformers_console_callbacks():
    from transformers.trainer_callback import (
        CallbackHandler,
        DefaultFlowCallback,
        PrinterCallback,
    )
    from transformers.trainer_callback import ProgressCallback as TqdmProgressCallback

    class FakeTrainer:  # Trainer.add_callback / remove_callback delegate to the handler exactly like this
        def __init__(self, console_callback):
            self.callback_handler = CallbackHandler([DefaultFlowCallback, console_callback], None, None, None, None)

        def add_callback(self, callback):
            self.callback_handler.add_callback(callback)

        def remove_callback(self, callback):
            self.callback_handler.remove_callback(callback)

    for console_callback in (PrinterCallback, TqdmProgressCallback):  # disable_tqdm=True / False
        trainer = FakeTrainer(console_callback)
        ours = console.install_progress(trainer, interactive=False)
        kinds = [type(cb) for cb in trainer.callback_handler.callbacks]
        assert kinds == [DefaultFlowCallback, console.ProgressCallback]
        assert trainer.callback_handler.callbacks[-1] is ours


def test_console_handler_skips_file_only_records(monkeypatch):
    rich_console, buffer = _console(terminal=False)
    monkeypatch.setattr(console, "_console", rich_console)
    logger = logging.getLogger("grpo.test_console")
    logger.propagate = False
    handler = console.console_handler()
    logger.addHandler(handler)
    try:
        logger.warning("Generation log step %d: mean reward %.3f", 2, 0.5)
        logger.info("step 2: loss=0 reward=0.5", extra={"file_only": True})
    finally:
        logger.removeHandler(handler)
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].endswith("WARNING Generation log step 2: mean reward 0.500")


def test_print_header_and_summary(monkeypatch):
    rich_console, buffer = _console(terminal=False)
    monkeypatch.setattr(console, "_console", rich_console)
    console.print_header([("model", "smollm2-135m"), ("rewards", "accuracy x1 [bold]"), "plain line"])
    console.print_summary({"global_step": 4, "backend": "unsloth", "train_seconds": 75.2, "total_seconds": 130,
                           "train_reward_first": 0.0, "train_reward_last": 0.375,
                           "generation_eval": {"prompts": 8, "held_out": True, "baseline_step": 0, "baseline": 0.625,
                                               "final_step": 4, "final": 0.75, "improved": 2, "worse": 1,
                                               "same": 5},
                           "output_dir": "/tmp/run", "report": "/tmp/run/report.html"}, console=rich_console)
    text = buffer.getvalue()
    assert "model    smollm2-135m" in text and "accuracy x1 [bold]" in text and "plain line" in text
    flat = " ".join(text.split())  # the test console wraps at its width; a terminal's soft_wrap does not
    assert "train reward (sampled): first step 0.000 -> last step 0.375" in flat
    assert "greedy reward on 8 held-out prompts: 0.625 at step 0 -> 0.750 at step 4" in text
    assert "improved: better on 2, worse on 1, same on 5 of 8 prompts" in text
    assert max(len(line) for line in text.splitlines() if "─" not in line) <= 80  # whole at 80 columns (the rule
    # spans the terminal)
    assert "report: /tmp/run/report.html" in flat
    assert "export: python train_grpo.py export /tmp/run --quant q4_k_m --ollama" in flat  # what to run next


def test_a_header_value_longer_than_the_line_continues_under_the_value(monkeypatch):
    """The quick test's `threads` line is 104 columns: it wrapped to column 0, in the middle of the key column."""
    rich_console, buffer = _console(terminal=False)
    monkeypatch.setattr(console, "_console", rich_console)
    threads = ("2 (2 CPUs, 0.0 busy elsewhere; re-checked every step); the result of a seed depends on the count: "
               "OMP_NUM_THREADS=N pins it")
    path = "/tmp/" + "x" * 90
    console.print_header([("model", "smollm2-135m"), ("threads", threads), ("output", path)])
    lines = [line for line in buffer.getvalue().splitlines() if "─" not in line]
    assert lines[0] == "model    smollm2-135m"
    assert lines[1].startswith("threads  2 (2 CPUs") and len(lines[1]) <= 100  # the test console's width
    assert lines[2].startswith(" " * 9) and not lines[2].startswith(" " * 10)  # under the value
    assert " ".join(line.strip() for line in lines[1:3]).removeprefix("threads  ") == threads
    assert lines[3] == f"output   {path}"  # a word longer than the line stays whole, on its own line


def test_the_quick_tests_export_command_fits_80_columns_whole(monkeypatch):
    """grpo_outputs/quick_test makes "export: " + the command 83 columns: the command goes on its own line."""
    rich_console, buffer = _console(terminal=False)
    console.print_summary({"global_step": 10, "backend": "unsloth", "train_seconds": 30, "total_seconds": 40,
                           "output_dir": "grpo_outputs/quick_test"}, console=rich_console)
    lines = [line for line in buffer.getvalue().splitlines() if "─" not in line]
    assert max(len(line) for line in lines) <= 80, lines
    assert "  python train_grpo.py export grpo_outputs/quick_test --quant q4_k_m --ollama" in lines


def test_eval_only_prints_a_short_summary_not_the_metrics_dict():
    rich_console, buffer = _console(terminal=False)
    metrics = {"eval_loss": 0.0, "eval_model_preparation_time": 0.0021, "eval_runtime": 22.21,
               "eval_samples_per_second": 1.08, "eval_steps_per_second": 0.045, "eval_reward": 0.7083,
               "eval_reward_std": 0.4593, "eval_rewards/accuracy/mean": 0.7083, "eval_rewards/accuracy/std": 0.4593,
               "eval_completions/mean_length": 8.54, "eval_completions/min_length": 5.0,
               "eval_completions/max_length": 10.0, "eval_completions/clipped_ratio": 0.125,
               "eval_frac_reward_zero_std": 0.5, **{f"eval_extra_metric_{i}": i / 3 for i in range(20)}}
    assert len(str(metrics)) > 900
    console.print_eval_only({"adapter": "grpo_outputs/quick_test", "global_step": 10, "held_out": True,
                             "eval": metrics, "generation_log": {"reward_mean": 0.9583},
                             "output_dir": "grpo_outputs/quick_test/eval_only/quick_test-step_10"},
                            console=rich_console)
    lines = [line for line in buffer.getvalue().splitlines() if "─" not in line]
    assert "{" not in buffer.getvalue() and max(len(line) for line in lines) <= 80, lines
    assert "greedy reward on held-out eval prompts: 0.958" in lines
    assert "sampled, held-out: reward 0.708 ± 0.459  length 8.5  (22.2 s)" in lines


# ---------------------------------------------------------------------------------------------------------------------
# --help at 80 columns
# ---------------------------------------------------------------------------------------------------------------------

def test_help_at_80_columns_shows_every_option_name_whole(monkeypatch):
    import typer.main
    import typer.rich_utils
    from typer.testing import CliRunner

    from train_grpo import app

    monkeypatch.setattr(typer.rich_utils, "Table", typer.rich_utils.Table)  # restored after the test
    console.whole_option_names_in_help()
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    words = {word.strip("│,") for line in lines for word in line.split()}
    command = typer.main.get_command(app)
    names = [name for param in command.params for name in [*param.opts, *param.secondary_opts]]
    assert len(names) > 30
    missing = [name for name in names if name not in words and not any(name in w.split(",") for w in words)]
    assert not missing, f"cut or missing at 80 columns: {missing}"


# ---------------------------------------------------------------------------------------------------------------------
# hub.py
# ---------------------------------------------------------------------------------------------------------------------

@pytest.fixture
def fresh_hub(monkeypatch):
    hub.clear_cache()
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY",
                 "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    hub.clear_cache()


@pytest.fixture
def listening_port():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


@pytest.mark.alone  # a wall-clock bound of a fraction of a second
def test_offline_answers_at_once_without_touching_the_network(fresh_hub):
    fresh_hub.setenv("HF_HUB_OFFLINE", "1")
    fresh_hub.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("no connection when offline"))
    started = time.perf_counter()
    assert hub.hub_reachable() is False
    with pytest.raises(UsageError, match="HF_HUB_OFFLINE is set, so model 'Qwen/Qwen2.5-7B' cannot be downloaded"):
        hub.require_hub("model 'Qwen/Qwen2.5-7B'")
    assert time.perf_counter() - started < 0.1


@pytest.mark.alone  # a wall-clock bound of a fraction of a second
def test_unreachable_endpoint_answers_within_the_timeout(fresh_hub):
    # A connection that never completes (as behind a firewall that drops packets, or a resolver that hangs).
    def hangs(*args, **kwargs):  # then fails as a real timeout would, so the abandoned thread ends quietly
        time.sleep(30)
        raise TimeoutError("timed out")

    fresh_hub.setattr(socket, "create_connection", hangs)
    started = time.perf_counter()
    assert hub.hub_reachable(timeout=0.3) is False
    assert time.perf_counter() - started < 0.6


def test_require_hub_message_names_host_timeout_and_fixes(fresh_hub):
    fresh_hub.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens, refused at once
    with pytest.raises(UsageError) as err:
        hub.require_hub("dataset 'openai/gsm8k'")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("Cannot reach the Hugging Face hub (127.0.0.1, 2 s) to download dataset 'openai/gsm8k'")
    assert "--dataset-path" in message and "--custom-data" in message


def test_an_offline_model_is_offered_a_model_fix_not_a_dataset_one(fresh_hub):
    fresh_hub.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UsageError) as err:
        hub.require_hub("model 'Qwen/Qwen2.5-7B' (it is not in the local cache)")
    message = str(err.value)
    assert "--model DIR" in message and "'smollm2-135m'" in message and "--dataset-path" not in message


def test_reachable_endpoint_and_cache(fresh_hub, listening_port):
    fresh_hub.setenv("HF_ENDPOINT", f"http://127.0.0.1:{listening_port}")
    assert hub.hub_reachable() is True
    hub.require_hub("model 'x'")  # no error
    fresh_hub.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("cached: no second connection"))
    assert hub.hub_reachable() is True


def test_proxy_is_what_gets_connected(fresh_hub, listening_port):
    fresh_hub.setenv("HTTPS_PROXY", f"http://127.0.0.1:{listening_port}")
    assert hub.hub_reachable() is True  # huggingface.co itself is not contacted: the proxy answers
    hub.clear_cache()
    fresh_hub.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    with pytest.raises(UsageError, match=r"\(huggingface.co via proxy http://127.0.0.1:9, 2 s\)"):
        hub.require_hub("model 'x'")


@pytest.mark.alone  # a wall-clock bound of a fraction of a second
def test_this_machine_answers_within_two_seconds(fresh_hub):
    """The real network, whatever it is (offline here, online in CI): an answer in at most 2 s."""
    started = time.perf_counter()
    hub.hub_reachable()
    assert time.perf_counter() - started < 2.5


def test_concurrent_callers_do_not_hang(fresh_hub, listening_port):
    fresh_hub.setenv("HF_ENDPOINT", f"http://127.0.0.1:{listening_port}")
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(hub.hub_reachable())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert answers == [True] * 4


def test_help_at_80_columns_never_breaks_a_choice(monkeypatch):
    import typer.rich_utils
    from typer.testing import CliRunner

    from config.schema import FIELDS, field_type, literal_choices
    from train_grpo import app

    monkeypatch.setattr(typer.rich_utils, "Table", typer.rich_utils.Table)  # restored after the test
    console.whole_option_names_in_help()
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    words = {word.strip("│,<>|") for line in result.output.splitlines() for word in line.split()}
    for name in ("reward_function_type", "generation_engine", "backend"):
        for choice in literal_choices(field_type(name)) or ():
            assert choice in words, f"--help breaks the choice {choice!r} of {name} (FIELDS: {name in FIELDS})"


def test_the_run_log_takes_every_detail_without_leaking_it_to_the_callers_handlers(tmp_path):
    """The Python API's run log: the file gets DEBUG and up; a caller's own root handler gets what it got before the
    file opened (here: warnings, root's level), no more; closing restores the logger; the same file opens once."""
    import logging

    from grpokit.console import add_file_logging

    logger, root = logging.getLogger("grpo"), logging.getLogger()
    saved = (logger.level, logger.propagate, list(logger.handlers), root.level)
    seen: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    capture = Capture()
    try:
        logger.handlers[:] = []
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
        root.setLevel(logging.WARNING)
        root.addHandler(capture)
        close = add_file_logging(tmp_path / "grpo_training.log")
        assert add_file_logging(tmp_path / "grpo_training.log") is None  # already open: the CLI's, then train()'s
        logger.debug("a detail")
        logger.info("a step")
        logger.warning("a warning")
        close()
        logger.info("after the run")
        text = (tmp_path / "grpo_training.log").read_text()
        assert "DEBUG a detail" in text and "INFO a step" in text and "WARNING a warning" in text
        assert "after the run" not in text
        assert seen == ["a warning"]
        assert (logger.level, logger.propagate) == (logging.NOTSET, True)
    finally:
        root.removeHandler(capture)
        root.setLevel(saved[3])
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers[:] = saved[2]

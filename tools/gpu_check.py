"""The Python half of `tools/gpu_check.sh` (the GPU check, docs/gpu.md): small commands the script's stages run.

    python tools/gpu_check.py models DIR          # random-weight tiny Llama + Qwen2.5-0.5B-shaped Qwen2, own tokenizer
    python tools/gpu_check.py env FILE            # versions, CUDA, the bundle's imports and requirements -> FILE (JSON)
    python tools/gpu_check.py wrap PEAK.json SCRIPT ARGS...   # run SCRIPT; write its peak GPU memory to PEAK.json
    python tools/gpu_check.py report WORK OUT     # the stages' records and files -> OUT/gpu_check.json + .md
    python tools/gpu_check.py fake STAGE WORK     # GPU_CHECK_DRY=1: what a stage would leave, from fixtures

No model can be downloaded on the GPU machine, and the embedded SmolLM2 is too big to carry, so the models are built
there from configs with random weights and a byte-level BPE tokenizer trained on a few strings (ChatML template, the
vocabulary padded to the config's size so every id the model can sample decodes). Random weights never say
end-of-sequence: every completion runs to max_completion_length, which is what the timing wants anyway.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# name -> (transformers config class, its arguments). qwen2-0.5b: Qwen2.5-0.5B-Instruct's shape (494M parameters,
# tied embeddings, 151936 ids); llama-tiny: the smallest shape Unsloth's Llama kernels take (head_dim 64).
SHAPES = {
    "llama-tiny": ("LlamaConfig", dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                       tie_word_embeddings=False, rms_norm_eps=1e-5)),
    "qwen2-0.5b": ("Qwen2Config", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                       num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                       max_position_embeddings=32768, tie_word_embeddings=True, rms_norm_eps=1e-6,
                                       use_sliding_window=False)),
}
# Keys of run_config.json that say which objective ran (copied whole into the report; "objective" is the summary a
# run writes there where it does).
OBJECTIVE_KEYS = re.compile(r"objective|loss_type|epsilon|mask_truncated|^beta$|importance|^delta$|scale_rewards|"
                            r"top_entropy|num_iterations|loss_weight|backend|load_in_4bit|generation_engine")


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
    built = [build_model(name, out / name) for name in names]
    (out / "models.json").write_text(json.dumps(built, indent=2))
    for b in built:
        print(f"{b['name']}: {b['architecture']} {b['parameters'] / 1e6:.1f}M parameters -> {b['dir']}")


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


# ---- wrap: peak GPU memory of a script --------------------------------------------------------------------------

def wrap(peak: Path, argv: list[str]) -> None:
    """Run a script (train_grpo.py, bench/plain_trl_grpo.py) in this process and write its peak GPU memory at exit
    (torch.cuda.max_memory_allocated / _reserved: the process's own tensors, what the run allocated). With
    GPU_CHECK_PLAIN_MODEL=DIR the plain script's model (the embedded SmolLM2) is DIR instead."""
    import runpy

    started = time.time()

    def dump() -> None:
        data = {"wall_s": round(time.time() - started, 1)}
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                data.update(max_memory_allocated_mib=round(torch.cuda.max_memory_allocated() / 2**20),
                            max_memory_reserved_mib=round(torch.cuda.max_memory_reserved() / 2**20),
                            device=torch.cuda.get_device_name(0))
        except Exception as err:  # noqa: BLE001
            data["error"] = f"{type(err).__name__}: {err}"
        peak.write_text(json.dumps(data))

    atexit.register(dump)
    sys.path.insert(0, str(ROOT))
    model = os.environ.get("GPU_CHECK_PLAIN_MODEL")
    if model:
        import grpokit.model_loader as model_loader

        model_loader.embedded_model_dir = lambda: Path(model)
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = str(Path(script).resolve().parent)
    runpy.run_path(script, run_name="__main__")


# ---- report -------------------------------------------------------------------------------------------------------

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


def read_stages(work: Path) -> list[dict]:
    """The script's stage records: one tab-separated line per stage: name, rc (or 'skipped'), seconds, limit."""
    stages = []
    path = work / "stages.tsv"
    if path.exists():
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            name, rc, seconds, limit = (line.split("\t") + ["", "", ""])[:4]
            status = ("skipped" if rc == "skipped" else "ok" if rc == "0" else
                      "timed out" if rc in ("124", "137") else "failed")
            stage = {"name": name, "status": status, "rc": None if rc == "skipped" else int(rc),
                     "seconds": float(seconds or 0), "limit_s": limit}
            if status != "ok":
                stage["last_lines"] = _tail(work / "logs" / f"{name}.log")
            stages.append(stage)
    return stages


HEADER = re.compile(r"^(model|engine|threads|data|rewards|steps|loss|output|plan|memory|gpu|device|precision)\s{2,}\S")


def run_result(run_dir: Path, peak: Path, log: Path | None = None) -> dict | None:
    """Step times (TRL's step_time per logged step), completion lengths and rewards, peak GPU memory, the run
    header's lines (what the console said it would run)."""
    state = _read_json(run_dir / "trainer_state.json")
    peak_data = _read_json(peak)
    if state is None and peak_data is None:
        return None
    result: dict = {"peak_gpu": peak_data}
    if log is not None and log.exists():
        result["header"] = [line for line in log.read_text(errors="replace").splitlines() if HEADER.match(line)]
    if state is not None:
        steps = [h for h in state.get("log_history", []) if "step_time" in h]
        times = [h["step_time"] for h in steps]
        result.update(steps=len(steps), step_times_s=[round(t, 3) for t in times],
                      completion_mean_length=[h.get("completions/mean_length") for h in steps],
                      reward=[h.get("reward") for h in steps])
        if len(times) > 1:
            result["median_step_s_after_first"] = round(statistics.median(times[1:]), 3)
    config = _read_json(run_dir / "run_config.json")
    if isinstance(config, dict):
        result["objective"] = {k: v for k, v in config.items() if OBJECTIVE_KEYS.search(k)}
    summary = _read_json(run_dir / "metrics_summary.json")
    if isinstance(summary, dict):
        result["summary"] = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None}
    return result


def report(work: Path, out: Path) -> dict:
    stages = read_stages(work)
    plan_doc = _read_json(work / "plan.json")
    doc = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "dry": os.environ.get("GPU_CHECK_DRY") == "1",
        "commit": (work / "commit.txt").read_text().strip() if (work / "commit.txt").exists() else None,
        "stages": stages,
        "failed": [s["name"] for s in stages if s["status"] != "ok"],
        "nvidia_smi": _tail(work / "logs" / "nvidia_smi.log", 30),
        "env": _read_json(work / "env.json"),
        "doctor": _read_json(work / "doctor.json"),
        "models": _read_json(work / "models" / "models.json"),
        "load_plan": plan_doc.get("load_plan") if isinstance(plan_doc, dict) else None,
        "runs": {},
    }
    for name in ("ours_qwen", "plain_qwen", "ours_llama"):
        result = run_result(work / "runs" / name, work / f"peak_{name}.json", work / "logs" / f"{name}.log")
        if result is not None:
            doc["runs"][name] = result
    ours, plain = doc["runs"].get("ours_qwen", {}), doc["runs"].get("plain_qwen", {})
    if ours.get("median_step_s_after_first") and plain.get("median_step_s_after_first"):
        doc["ratio_ours_over_plain"] = round(ours["median_step_s_after_first"] / plain["median_step_s_after_first"], 3)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(doc, indent=2, default=str))
    (out / "gpu_check.md").write_text(markdown(doc))
    return doc


def markdown(doc: dict) -> str:
    lines = [f"# GPU check {doc['when']}{' (DRY: no GPU stages ran)' if doc['dry'] else ''}", "",
             f"commit: {doc.get('commit')}", ""]
    env_doc = doc.get("env") or {}
    cuda = env_doc.get("cuda") or {}
    if cuda:
        lines += [f"device: {cuda.get('device')} ({cuda.get('memory_gib')} GiB, sm {cuda.get('capability')}), "
                  f"torch CUDA {cuda.get('torch_cuda')}", ""]
    if env_doc.get("versions"):
        lines += ["versions: " + ", ".join(f"{k} {v}" for k, v in env_doc["versions"].items() if v), ""]
    for line in env_doc.get("unmet_requirements") or []:
        lines.append(f"- unmet requirement: {line}")
    lines += ["", "| stage | status | seconds | limit |", "|---|---|---|---|"]
    for s in doc["stages"]:
        rc = "" if s["rc"] in (0, None) else f" (rc {s['rc']})"
        lines.append(f"| {s['name']} | {s['status']}{rc} | {s['seconds']:.1f} | {s['limit_s']} |")
    lines.append("")
    for name, run in doc["runs"].items():
        peak = run.get("peak_gpu") or {}
        lines += [f"## {name}", "",
                  f"- step times (s): {run.get('step_times_s')}; median after the first: "
                  f"{run.get('median_step_s_after_first')}",
                  f"- completion mean length: {run.get('completion_mean_length')}",
                  f"- peak GPU memory: allocated {peak.get('max_memory_allocated_mib')} MiB, reserved "
                  f"{peak.get('max_memory_reserved_mib')} MiB"]
        if run.get("header"):
            lines += ["- run header:", "", "```", *run["header"], "```", ""]
        if run.get("objective"):
            lines.append(f"- objective (run_config.json): `{json.dumps(run['objective'], default=str)}`")
        lines.append("")
    if doc.get("ratio_ours_over_plain"):
        lines += [f"ratio ours / plain TRL (median step time, qwen2-0.5b): {doc['ratio_ours_over_plain']}", ""]
    plan = doc.get("load_plan")
    if plan:
        lines += ["## load plan (qwen2-0.5b, --dry-run)", "", "```json", json.dumps(plan, indent=1, default=str)[:6000],
                  "```", ""]
    for s in doc["stages"]:
        if s["status"] != "ok" and s.get("last_lines"):
            lines += [f"## {s['name']}: {s['status']}, last lines", "", "```", *s["last_lines"], "```", ""]
    return "\n".join(lines) + "\n"


# ---- fake: the dry mode's stand-ins ---------------------------------------------------------------------------------

def fake(stage: str, work: Path) -> None:
    """What each stage leaves behind, written from fixtures, so GPU_CHECK_DRY=1 exercises the script and the report
    without a GPU. 'ours_llama' fails on purpose (a failed stage must not stop the others)."""
    if stage == "env":
        (work / "env.json").write_text(json.dumps({"python": "3.12.3", "versions": {"torch": "2.11.0"},
                                                   "cuda": {"available": False}, "imports": {},
                                                   "unmet_requirements": []}))
    elif stage == "models":
        (work / "models").mkdir(parents=True, exist_ok=True)
        (work / "models" / "models.json").write_text(json.dumps([{"name": "qwen2-0.5b", "parameters": 494032768}]))
    elif stage == "plan":
        (work / "plan.json").write_text(json.dumps({"load_plan": {"device": "cuda", "memory": {"total_gib": 1.5}}}))
    elif stage in ("ours_qwen", "plain_qwen"):
        run = work / "runs" / stage
        run.mkdir(parents=True, exist_ok=True)
        base = 2.0 if stage == "ours_qwen" else 3.0
        history = [{"step": i + 1, "step_time": base + (1.0 if i == 0 else 0.1 * i), "reward": 0.0,
                    "completions/mean_length": 256.0} for i in range(5)]
        (run / "trainer_state.json").write_text(json.dumps({"log_history": history}))
        if stage == "ours_qwen":
            (run / "run_config.json").write_text(json.dumps({"loss_type": "dapo", "beta": 0.0, "epsilon": 0.2,
                                                             "mask_truncated_completions": True, "seed": 42}))
        (work / f"peak_{stage}.json").write_text(json.dumps({"max_memory_allocated_mib": 3000,
                                                            "max_memory_reserved_mib": 3500}))
    elif stage == "ours_llama":
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
    elif command == "report":
        doc = report(Path(rest[0]), Path(rest[1]))
        print(f"report: {rest[1]}/gpu_check.json, gpu_check.md; failed stages: {', '.join(doc['failed']) or 'none'}")
    elif command == "fake":
        fake(rest[0], Path(rest[1]))
    else:
        sys.exit(f"unknown command {command!r}\n{__doc__}")


if __name__ == "__main__":
    main()

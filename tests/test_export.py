"""`train_grpo.py export`: the exported model is the trained model, read by consumers that are not ours.

The quick test as `make quick-test` runs it (10 steps, 24 held-out prompts) gives the adapter; the run's own final
greedy evaluation (its last generation log) is the reference: the export merges into the weights the 4-bit run
computed with (`--base trained`), and measures itself against that log. The GGUF files are loaded with
llama-cpp-python's own `Llama` class, the merged weights with plain transformers (no PEFT). Each export is made once
per module and shared by the asserts.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, train_cli

pytestmark = pytest.mark.slow

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}


def cli(*args, env=None, timeout=900):
    return train_cli(*args, env={"WANDB_MODE": "offline", **(env or {})}, timeout=timeout)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The quick test as `make quick-test` runs it (10 steps): an adapter, its run config and the greedy generation logs of 24 held-out sums."""
    out = tmp_path_factory.mktemp("export") / "run"
    result = cli("--quick-test", "--no-wandb", "--output-dir", str(out), "--set", "save_steps=0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train_grpo.py export" in result.stderr  # the end-of-run summary names the export command
    readme = (out / "README.md").read_text()  # the run's own, not TRL's / PEFT's model card
    assert readme.startswith("---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\n") and "[None]" not in readme
    assert not (out / "best_checkpoint.json").exists()  # one evaluation, at the end: nothing to choose between
    return out


@pytest.fixture(scope="module")
def held_out(run):
    """[(prompt messages, reference answer)] of the held-out split, from the run's own generation log."""
    from grpokit.run_dir import generation_log_dir, generation_logs

    entries = generation_logs(generation_log_dir(run))[-1][1]
    assert len(entries) == 24 and all(e["split"] == "eval" for e in entries)
    return [(e["prompt"], e["reference_answer"]) for e in entries]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from grpokit.model_loader import embedded_model_dir

    return AutoTokenizer.from_pretrained(embedded_model_dir())


@pytest.fixture(scope="module")
def max_new_tokens(run):
    return json.loads((run / "run_config.json").read_text())["max_completion_length"]


def prompt_ids(tokenizer, prompt):
    from grpokit.export import prompt_ids as ids

    return ids(tokenizer, prompt)


def torch_greedy(model, tokenizer, held_out, max_new_tokens):
    from grpokit.export import torch_greedy as greedy

    return greedy(model, tokenizer, [prompt_ids(tokenizer, prompt) for prompt, _ in held_out], max_new_tokens)


@pytest.fixture(scope="module")
def reference(run):
    """The run's own final greedy evaluation: what the export must reproduce."""
    from grpokit.run_dir import generation_log_dir, generation_logs

    return [e["generated"].strip() for e in generation_logs(generation_log_dir(run))[-1][1]]


def llama_greedy(path, tokenizer, held_out, max_new_tokens, lora=None):
    """Greedy answers from llama-cpp-python's own Llama class, fed the same prompt tokens; the text is llama.cpp's
    own detokenisation (the GGUF's vocabulary)."""
    from grpokit.export import gguf_greedy

    return gguf_greedy(path, [prompt_ids(tokenizer, prompt) for prompt, _ in held_out], max_new_tokens, lora=lora)


def held_out_reward(run, held_out, answers):
    """The mean of the run's own rewards over the held-out answers."""
    from grpo_trainer import GRPOTrainer
    from rewards import score_rows

    reward_set = GRPOTrainer(json.loads((run / "run_config.json").read_text())).build_rewards()
    rows = [{"prompt": prompt, "completion": answer, "answer": ref} for (prompt, ref), answer in
            zip(held_out, answers, strict=True)]
    return sum(r["total"] for r in score_rows(reward_set, rows)) / len(rows)


def same(a, b):
    """How many completions are identical."""
    return sum(x == y for x, y in zip(a, b, strict=True))


def same_answers(a, b):
    """How many answers agree: a completion's first line ("7 + 8 = 15"). What follows it is the cut-off start of
    whatever the model says next, where a near tie between two tokens can go either way at 8-bit precision."""
    return sum(x.split("\n")[0].strip() == y.split("\n")[0].strip() for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def gguf_f16(run):
    result = cli("export", str(run), "--quant", "f16")
    assert result.returncode == 0, result.stderr[-3000:]
    # the export measured itself: one line, and the same in the model card
    line = next(x for x in result.stderr.splitlines() if "answers as the run's final evaluation" in x)
    assert int(line.split("/")[0]) >= 23 and len(line) <= 80, line
    card = (run / "export" / "gguf-f16" / "README.md").read_text()
    assert f"| measured | {line} " in card and "rounded through NF4 as the 4-bit run computed with it" in card
    files = [Path(line) for line in result.stdout.split()]
    return next(f for f in files if f.suffix == ".gguf")


@pytest.fixture(scope="module")
def gguf_q4(run):
    """The whole chain in one command: merge, llama.cpp's converter, its quantiser, the Modelfile. --no-measure: the
    test answers the held-out prompts itself (gguf_f16 and gguf-lora measure themselves)."""
    result = cli("export", str(run), "--quant", "q4_k_m", "--ollama", "--no-measure")
    assert result.returncode == 0, result.stderr[-3000:]
    return run / "export" / "gguf-q4_k_m"


def test_gguf_f16_and_q8_0_answer_as_the_adapter_does(run, gguf_f16, held_out, tokenizer, reference,
                                                      max_new_tokens):
    from grpokit.export import quantise

    assert gguf_f16.parent == run / "export" / "gguf-f16"
    # at f16, whole completions: the export's own measurement (llama-cpp-python's Llama on the file, the run's
    # held-out prompts, its final evaluation's completions) said >= 23 of 24 (the gguf_f16 fixture)
    # q8_0 from the same f16 file, by the quantiser the command runs for every quantised type
    q8 = quantise(gguf_f16, gguf_f16.with_name("model.Q8_0.gguf"), "q8_0")
    answers = llama_greedy(q8, tokenizer, held_out, max_new_tokens)
    matching = same_answers(answers, reference)
    # the trained model, 8-bit rounded: as right as the run's own evaluation on the held-out sums (near ties between
    # two phrasings of the same sum, "4 + 5 = 9" / "4 + 5 equals 9", may fall otherwise: 18 to 23 of 24 answers the
    # same on the adapters trained so far)
    quantised, trained = held_out_reward(run, held_out, answers), held_out_reward(run, held_out, reference)
    assert matching >= 16 and quantised >= trained - 0.05, (quantised, trained, list(zip(answers, reference,
                                                                                          strict=True)))
    if matching < 23:  # the goal, met on this adapter where measured (23/24); a machine without bf16 units
        # trains another adapter (float32 compute), whose near ties may fall otherwise
        pytest.xfail(f"q8_0: {matching}/24 answers as the run's evaluation (goal 23): "
                     f"{[(a, r) for a, r in zip(answers, reference, strict=True) if a != r]}")


def test_gguf_carries_the_trained_weights_not_the_base(run, gguf_f16, held_out, tokenizer):
    """Next-token logits on the held-out prompts: the GGUF sits with the adapter on the base the run computed with
    (NF4-rounded), far from that base alone."""
    import numpy as np
    import torch
    from llama_cpp import Llama
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from grpokit.export import round_base, run_files, trained_rounding
    from grpokit.model_loader import embedded_model_dir

    base = AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=torch.float32).eval()
    assert round_base(base, trained_rounding(*run_files(run), "trained")) > 0
    llm = Llama(model_path=str(gguf_f16), n_ctx=256, n_threads=2, logits_all=True, verbose=False)
    base_logits, gguf_logits = [], []
    ids_list = [prompt_ids(tokenizer, prompt) for prompt, _ in held_out[:8]]
    with torch.no_grad():
        for ids in ids_list:
            base_logits.append(base(torch.tensor([ids])).logits[0, -1].numpy())
            llm.reset()
            llm.eval(ids)
            gguf_logits.append(np.array(llm.scores[len(ids) - 1]))
    llm.close()
    adapter = PeftModel.from_pretrained(base, run).eval()
    with torch.no_grad():
        trained = [adapter(torch.tensor([ids])).logits[0, -1].numpy() for ids in ids_list]
    to_gguf = np.mean([np.abs(g - t).mean() for g, t in zip(gguf_logits, trained, strict=True)])
    to_base = np.mean([np.abs(b - t).mean() for b, t in zip(base_logits, trained, strict=True)])
    assert to_gguf < to_base / 4, (to_gguf, to_base)


def test_gguf_q4_k_m_keeps_the_held_out_reward_and_ollama_gets_a_modelfile(run, gguf_q4, held_out, tokenizer,
                                                                           reference, max_new_tokens):
    gguf = next(gguf_q4.glob("*.Q4_K_M.gguf"))
    modelfile = (gguf_q4 / "Modelfile").read_text()
    assert modelfile.startswith(f"FROM ./{gguf.name}\n")
    assert 'PARAMETER stop "<|im_end|>"' in modelfile
    # the Go template renders the prompt the model was trained on, system prompt included
    system = modelfile.split('SYSTEM """', 1)[1].split('"""', 1)[0]
    prompt = held_out[0][0]
    messages = prompt if prompt[0]["role"] == "system" else [{"role": "system", "content": system}, *prompt]
    rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + \
        "<|im_start|>assistant\n"
    assert rendered == tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    card = (gguf_q4 / "README.md").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card and "| steps | 10 |" in card
    assert "held-out" in card and "train_grpo.py export" in card
    assert not [p for p in gguf_q4.iterdir() if p.name.startswith(".")]  # no scratch or partial file left
    answers = llama_greedy(gguf, tokenizer, held_out, max_new_tokens)
    quantised, trained = held_out_reward(run, held_out, answers), held_out_reward(run, held_out, reference)
    assert abs(quantised - trained) <= 0.25, (quantised, trained)  # the trained model, 4-bit rounded
    if abs(quantised - trained) > 0.05:  # the goal, met on this adapter where measured (0.917 vs 0.917)
        pytest.xfail(f"q4_k_m: held-out reward {quantised:.3f} vs {trained:.3f} in PyTorch (goal: within 0.05)")


def test_merged_safetensors_answer_as_the_adapter_does_without_peft(run, held_out, tokenizer, reference,
                                                                    max_new_tokens):
    """In float32 the merged weights are the trained model exactly. In the base's bfloat16 a short run's update is
    mostly below a weight's rounding step: the command measures how much is lost, says it in one line with the dtype
    that keeps it, and writes the figure into the model card."""
    import torch
    from transformers import AutoModelForCausalLM

    # --no-measure: this test answers the held-out prompts itself (the bf16 export below measures itself)
    result = cli("export", str(run), "--format", "merged", "--dtype", "float32", "-o", str(run / "export" / "m32"),
                 "--no-measure")
    assert result.returncode == 0, result.stderr[-3000:]
    merged = run / "export" / "m32"
    assert "| measured | not measured (--no-measure) |" in (merged / "README.md").read_text()
    assert (merged / "model.safetensors").exists() and not (merged / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(merged).eval()
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    answers = torch_greedy(model, tokenizer, held_out, max_new_tokens)
    assert same(answers, reference) >= 23, list(zip(answers, reference, strict=True))
    assert "relative error of 0.0%" in (merged / "README.md").read_text()

    result = cli("export", str(run), "--format", "merged")  # the base's own dtype
    assert result.returncode == 0, result.stderr[-3000:]
    merged = run / "export" / "merged"
    assert json.loads((merged / "config.json").read_text())["dtype"] == "bfloat16"
    card = (merged / "README.md").read_text()
    assert "answers as the run's final evaluation" in card  # measured itself
    error = float(re.search(r"bfloat16 weights carry the trained LoRA update with a relative error of ([\d.]+)%",
                            card).group(1)) / 100
    warned = re.search(r"merged: rounding to bfloat16 changes the trained LoRA update by (\d+)%", result.stderr)
    assert bool(warned) == (error > 0.25), result.stderr[-1500:]  # said when it matters, with the figure
    if warned:
        assert abs(int(warned.group(1)) / 100 - error) <= 0.01 and "--dtype float32" in result.stderr
    # the bf16 file answered the held-out prompts in the export's own measurement (plain transformers, no PEFT),
    # whole completions compared: what the float32 file above was checked for here, 8 bits of mantissa rounded
    measured = re.search(r"\| measured \| (\d+)/24 answers as the run's final evaluation", card)
    assert measured and int(measured.group(1)) >= 20, card


def test_gguf_lora_loads_in_llama_cpp_on_its_base(run):
    """The adapter alone, applied by llama.cpp to the base GGUF written beside it for Ollama's ADAPTER (as
    `llama-cli -m BASE --lora ADAPTER` does)."""
    result = cli("export", str(run), "--format", "gguf-lora", "--ollama")
    assert result.returncode == 0, result.stderr[-3000:]
    out = run / "export" / "gguf-lora"
    lora = next(out.glob("*.lora.gguf"))
    base = next(p for p in out.glob("*.gguf") if p != lora)
    assert (out / "Modelfile").read_text().startswith(f"FROM ./{base.name}\nADAPTER ./{lora.name}\n")
    # it measured itself: llama-cpp-python's Llama on the base GGUF with the LoRA applied (gguf_greedy, what
    # llama_greedy here runs), whole completions against the run's final evaluation; the base alone answers many
    # of them otherwise (the run's summary counts those it improved)
    measured = re.search(r"\| measured \| (\d+)/24 answers as the run's final evaluation",
                         (out / "README.md").read_text())
    assert measured and int(measured.group(1)) >= 23, (out / "README.md").read_text()


# ---- bad input: one line, exit 2, nothing written --------------------------------------------------------------------

def one_error_line(result):
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_bad_input_is_one_line_and_exit_2(run, tmp_path):
    assert "has no LoRA adapter" in one_error_line(cli("export", str(tmp_path)))
    assert "llama.cpp has no such type" in one_error_line(cli("export", str(run), "--quant", "q9_z"))
    assert "importance matrix" in one_error_line(cli("export", str(run), "--quant", "iq2_xs"))
    # an adapter whose base is a hub model that is not in the cache, offline
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    shutil.copy(run / "adapter_model.safetensors", adapter)
    config = json.loads((run / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path":
                                                             "example-org/not-cached-model"}))
    assert "not in the local Hugging Face cache" in one_error_line(cli("export", str(adapter)))
    # the hub out of reach: refused before any work
    line = one_error_line(cli("export", str(run), "--push-to-hub", "me/model", "-o", str(tmp_path / "hub")))
    assert "HF_HUB_OFFLINE" in line and not (tmp_path / "hub").exists()


def test_a_full_disk_is_one_line_and_leaves_no_file_under_a_final_name(run, tmp_path, monkeypatch, capsys):
    """A real 64 MB filesystem: refused up front; and when the estimate is fooled, the write itself fails (ENOSPC)
    and leaves nothing under the final name."""
    from config.errors import UsageError
    from grpokit.export import ExportRequest, export_adapter

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        assert "not enough disk space" in one_error_line(cli("export", str(run), "-o", str(disk / "gguf")))
        assert not any(disk.iterdir())
        real = shutil.disk_usage
        monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=1 << 40))
        with pytest.raises(UsageError, match="disk filled up"):
            export_adapter(ExportRequest(source=run, format="merged", output_dir=disk / "merged"))
        assert not (disk / "merged").exists() and not list(disk.iterdir())
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


# ---- --push-to-hub against a local hub: the installed huggingface_hub client speaking HTTP to tests/fixtures/fake_hub

WRITE_TOKEN, READ_TOKEN = "hf_write_token_for_tests", "hf_read_token_for_tests"


@pytest.fixture
def hub():
    from tests.fixtures.fake_hub import FakeHub

    with FakeHub(tokens={WRITE_TOKEN: "write", READ_TOKEN: "read"}, user="me") as fake:
        yield fake


def push(hub, tmp_path, *args, token=WRITE_TOKEN, xet=False):
    """`export RUN --format gguf-lora -o OUT --push-to-hub ...` with the hub at HF_ENDPOINT and `token` as HF_TOKEN
    (None: no token anywhere, HF_HOME an empty directory). Without `xet` the client runs its LFS batch protocol
    (HF_HUB_DISABLE_XET=1): the local hub does not speak Xet."""
    env = {**ENV, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf_home"),
           "HF_HUB_DISABLE_XET": "0" if xet else "1"}
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_OIDC_RESOURCE", "TRANSFORMERS_OFFLINE"):
        env.pop(name, None)
    if token is not None:
        env["HF_TOKEN"] = token
    (tmp_path / "hf_home").mkdir(exist_ok=True)
    # --no-measure: what these tests check is the upload (test_gguf_lora_loads_in_llama_cpp_on_its_base measures)
    return subprocess.run([sys.executable, "train_grpo.py", "export", *args, "--format", "gguf-lora", "--no-measure",
                           "-o", str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.parametrize("private, xet", [(True, False), (False, True)], ids=["private-lfs", "public-inline-xet"])
def test_hub_push_commits_every_exported_file_in_one_commit(run, hub, tmp_path, private, xet):
    """A write token: the repository is created with the visibility asked for, and one commit holds every exported
    file byte for byte. `private-lfs`: the GGUF goes through the LFS batch API (upload + verify) and is committed as
    an lfsFile; `public-inline-xet`: the client's default path with hf_xet installed (the pipelined upload), against
    a hub that takes every file inline."""
    if xet:
        hub.lfs_threshold = None
    result = push(hub, tmp_path, str(run), "--push-to-hub", "me/model", *(["--private"] if private else []), xet=xet)
    assert result.returncode == 0, result.stderr[-3000:]
    exported = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()}
    assert {"README.md", "run_config.json"} <= set(exported) and any(n.endswith(".lora.gguf") for n in exported)
    repo = hub.repos["me/model"]
    assert repo.private is private and repo.repo_type == "model"
    assert len(repo.commits) == 1, [c.summary for c in repo.commits]
    assert repo.files == exported  # every file, byte-identical, nothing else
    assert f"{hub.url}/me/model/commit/{repo.commits[0].oid}" in result.stdout + result.stderr
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in repo.files["README.md"].decode()
    uploads = [path for method, path in hub.requests if method == "PUT"]
    gguf = next(content for name, content in exported.items() if name.endswith(".lora.gguf"))
    assert len(gguf) > 10_000_000 and uploads == ([] if xet else [f"/lfs-upload/{hashlib.sha256(gguf).hexdigest()}"
                                                                  f"?size={len(gguf)}"])


def test_hub_push_refuses_a_read_only_token_before_any_work(run, hub, tmp_path):
    line = one_error_line(push(hub, tmp_path, str(run), "--push-to-hub", "me/model", token=READ_TOKEN))
    assert "read-only" in line and "Nothing was exported or uploaded" in line
    assert not (tmp_path / "out").exists() and not hub.repos
    assert ("GET", "/api/whoami-v2") in hub.requests  # the token was asked about, at HF_ENDPOINT


def test_hub_push_without_a_token_is_one_line(run, hub, tmp_path):
    line = one_error_line(push(hub, tmp_path, str(run), "--push-to-hub", "me/model", token=None))
    assert "no Hugging Face token" in line and "HF_TOKEN" in line
    assert not (tmp_path / "out").exists() and not hub.repos


def test_hub_push_a_failed_commit_commits_nothing_and_keeps_the_export(run, hub, tmp_path):
    """The hub answers the commit with HTTP 500 after the GGUF's LFS upload: one error line, exit 2, the repository
    (created first) without a commit, the export on disk for a rerun."""
    hub.fail_commits = True
    result = push(hub, tmp_path, str(run), "--push-to-hub", "me/model")
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "nothing was committed" in errors[0] and str(tmp_path / "out") in errors[0]
    assert hub.repos["me/model"].commits == []
    assert any(p.name.endswith(".lora.gguf") for p in (tmp_path / "out").iterdir())
    assert (tmp_path / "out" / "README.md").is_file() and (tmp_path / "out" / "run_config.json").is_file()


@pytest.mark.parametrize("base, words", [
    ("{tmp}/empty", "--base-model {tmp}/empty is not a transformers model directory (config.json + *.safetensors): "
                    "give --base-model one."),
    ("./nowhere", "--base-model ./nowhere is no directory here: give --base-model a model directory or an 'org/name' "
                  "hub id."),
    ("example-org/not-cached-model", "--base-model example-org/not-cached-model is not in the local Hugging Face "
                                     "cache and the hub cannot be reached (offline): connect and rerun, or give "
                                     "--base-model DIR with its 16-bit weights."),
])
def test_a_base_model_given_that_cannot_be_used_is_named_as_given(tmp_path, monkeypatch, base, words):
    # these said "pass --base-model" to a user who had passed it
    from config.errors import UsageError
    from grpokit.export import ADAPTER_FILES, resolve_base

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "empty").mkdir()
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / ADAPTER_FILES[0]).write_text(json.dumps({"base_model_name_or_path": "org/base"}))
    with pytest.raises(UsageError) as err:
        resolve_base(adapter, {}, base.format(tmp=tmp_path))
    assert str(err.value) == words.format(tmp=tmp_path)


def test_a_truncated_adapter_is_one_line_read_without_torch(tmp_path):
    """The adapter's header is read before any work; reading it needs no torch (a 2 s import before an error line)."""
    import numpy as np
    from safetensors.numpy import save_file

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "smollm2-135m-instruct",
                                                            "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}))
    weights = adapter / "adapter_model.safetensors"
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((8, 576), np.float32)},
              str(weights))
    check = ("import sys; from pathlib import Path; from grpokit.export import find_adapter; "
             f"find_adapter(Path({str(adapter)!r})); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr[-2000:]
    weights.write_bytes(weights.read_bytes()[:1000])
    line = one_error_line(cli("export", str(adapter), "--no-measure"))
    assert line == f"error: {adapter}: the adapter files are unreadable or truncated (SafetensorError)."


def test_an_output_dir_that_is_a_file_is_named(tmp_path):
    # the write itself said only "error: ...: File exists"
    import torch
    from safetensors.torch import save_file

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "smollm2-135m-instruct",
                                                            "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}))
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(8, 576)},
              str(adapter / "adapter_model.safetensors"))
    blocker = tmp_path / "taken"
    blocker.write_text("a file")
    line = one_error_line(cli("export", str(adapter), "--output-dir", str(blocker), "--no-measure"))
    assert line == f"error: Export directory {blocker} is a file, not a directory: choose another --output-dir."


def test_ctrl_c_during_an_export_says_what_it_left(run, tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group, the GGUF converter included) while the GGUF is written: one
    line saying what is kept and how to finish, exit 130, no half-written file and no converter left running."""
    import signal
    import time

    import psutil

    out = tmp_path / "export"
    process = subprocess.Popen([sys.executable, str(ROOT / "train_grpo.py"), "export", str(run), "-o", str(out)],
                               cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True,
                               # as a terminal's shell starts it: a pytest-xdist worker ignores SIGINT, and a child
                               # inherits an ignored signal (Python then installs no KeyboardInterrupt handler)
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # the GGUF under its temporary name: the conversion is running (polled, not read from the log, whose lines
    # say only what has finished)
    deadline = time.monotonic() + 600
    while not list(out.glob("*.partial")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, "the export finished before its GGUF was being written"
    os.killpg(process.pid, signal.SIGINT)
    _, rest = process.communicate(timeout=120)
    said = rest
    assert process.returncode == 130, said[-3000:]
    assert "export interrupted: files finished before it are kept, the one being written was removed" in said
    assert "Traceback" not in said
    assert not [p for p in out.parent.rglob("*") if p.name.endswith(".partial") or p.name.startswith(".merge-")]
    assert not any(str(out) in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))

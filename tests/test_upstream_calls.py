"""Where our trainer meets upstream code that runs only on a GPU, the calls are read from the installed source.

Unsloth's compiled GPU trainer (built at `import unsloth` on a CUDA machine from unsloth/models/rl_replacements.py)
is the parent of TRLGRPOTrainer there; on this CPU machine TRL's GRPOTrainer is. Each test parses the installed
file with `ast`, takes the call expression or function exactly as written, and runs it against our trainer on a
tiny model; a moved or renamed upstream function fails the test by name instead of passing vacuously.
"""

from __future__ import annotations

import ast
import copy
import inspect
import os
from pathlib import Path

import pytest
from conftest import make_tiny_model

SITE = Path(inspect.getfile(pytest)).parent.parent  # site-packages
TRL_GRPO = SITE / "trl" / "trainer" / "grpo_trainer.py"
UNSLOTH_RL = SITE / "unsloth" / "models" / "rl_replacements.py"
LOGPS = "_get_per_token_logps_and_entropies"


def _tree(path: Path) -> ast.Module:
    assert path.is_file(), f"{path} is gone: re-read how the installed version calls {LOGPS}"
    return ast.parse(path.read_text())


def _function(tree: ast.AST, name: str, inside: str | None = None) -> ast.FunctionDef:
    """The one function `name` (nested in function `inside` when given); fails by name when it is not there."""
    scopes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == inside] if inside else [tree]
    found = [n for scope in scopes for n in ast.walk(scope) if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(found) == 1, f"expected one {name}{f' in {inside}' if inside else ''}, found {len(found)}"
    return found[0]


def _calls(node: ast.AST, attribute: str) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == attribute]


def _compiled(node: ast.FunctionDef, namespace: dict):
    """`node` defined in `namespace` as the source writes it (decorators dropped: profiling / compile wrappers)."""
    node = copy.copy(node)
    node.decorator_list = []
    exec(compile(ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[])), "<upstream>", "exec"),
         namespace)
    return namespace[node.name]


def _unsloth_logps():
    """Unsloth's `_get_per_token_logps_and_entropies` as its compiled trainer defines it, with the module helpers
    it calls (copied into that trainer the same way: by source)."""
    tree = _tree(UNSLOTH_RL)
    namespace = {"os": os, "torch": __import__("torch"), "DEVICE_TYPE_TORCH": "cpu"}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("_unsloth_grpo_"):
            _compiled(node, namespace)
    return _compiled(_function(tree, LOGPS, inside=f"grpo_trainer_{LOGPS}"), namespace)


def _unsloth_loss_calls():
    """From Unsloth's GRPO compute_loss: the lambda it scores the policy through (which calls LOGPS positionally)
    and each call of that lambda, as source."""
    compute_loss = _function(_tree(UNSLOTH_RL), "compute_loss", inside="grpo_trainer_compute_loss")
    lambdas = [n.value for n in ast.walk(compute_loss) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Lambda)
               and _calls(n.value, LOGPS)]
    assert len(lambdas) == 1, f"Unsloth's compute_loss: expected one lambda calling {LOGPS}, found {len(lambdas)}"
    name = next(n.targets[0].id for n in ast.walk(compute_loss) if isinstance(n, ast.Assign) and n.value is lambdas[0])
    outer = [n for n in ast.walk(compute_loss) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == name]
    assert outer, f"Unsloth's compute_loss no longer calls {name}"
    return lambdas[0], outer


def _evaluate(node: ast.expr, namespace: dict):
    return eval(compile(ast.fix_missing_locations(ast.Expression(body=node)), "<upstream>", "eval"), namespace)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """Our trainer (shared prompts on) on a 2-layer random Llama with LoRA, in training mode."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from grpokit.trl_trainer import TRLGRPOTrainer

    path = make_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("out")), per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=6, max_steps=1, report_to="none", use_cpu=True,
                      bf16=False, gradient_checkpointing=False, save_strategy="no")
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": "Hi"}]}] * 4)
    trainer = TRLGRPOTrainer(model=model, processing_class=AutoTokenizer.from_pretrained(path),
                             reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                             train_dataset=rows, share_prompts=True)
    trainer.model.train()
    return trainer


def _batch(trainer):
    """2 prompts x 2 completions, the prompt rows repeated as GRPO repeats them."""
    import torch

    ids = torch.randint(100, 5000, (4, 9), generator=torch.Generator().manual_seed(0))
    ids[1, :5], ids[3, :5] = ids[0, :5], ids[2, :5]
    return ids, torch.ones_like(ids), 4  # input_ids, attention_mask, logits_to_keep


def _recording_parent(monkeypatch, trainer, signature: inspect.Signature) -> list[dict]:
    """The parent's method replaced by one that records what it was asked, bound to `signature` (the parent's own,
    read from its source), so the test sees the arguments exactly as the parent's parameters receive them."""
    seen: list[dict] = []

    def parent(*args, **kwargs):
        seen.append(_bound(signature, *args, **kwargs))
        return None, None, None

    parent.__signature__ = signature

    monkeypatch.setattr(type(trainer).__mro__[1], LOGPS, parent)
    return seen


def _bound(signature: inspect.Signature, *args, **kwargs) -> dict:
    """Each parameter's value for this call (defaults filled in: passing a default explicitly is the same call)."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _signature(path: Path, inside: str | None = None) -> inspect.Signature:
    node = copy.copy(_function(_tree(path), LOGPS, inside=inside))
    node.body = [ast.Pass()]
    return inspect.signature(_compiled(node, {}))


def _trl_call_sites():
    return _calls(_tree(TRL_GRPO), LOGPS)


def test_trl_and_unsloth_call_sites_are_where_they_were_read():
    # TRL: old, reference (two forms) and the loss pass; Unsloth's GPU compute_loss: one lambda, called once
    assert len(_trl_call_sites()) == 4
    _, outer = _unsloth_loss_calls()
    assert len(outer) == 1 and any(k.arg == "compute_efficient" for k in outer[0].keywords)


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("site", range(4))
def test_trls_calls_reach_trls_parameters_as_made(monkeypatch, trainer, share, site):
    """Every call TRL makes, with its own argument expressions (ids and masks real, the rest TRL's values or a
    marker), reaches TRL's method with each value on the parameter TRL meant, whenever it is passed on."""
    import torch

    call = _trl_call_sites()[site]
    ids, mask, keep = _batch(trainer)
    marker = object()
    namespace = {"self": trainer, "model": trainer.model, "prompt_completion_ids": ids, "input_ids": ids,
                 "attention_mask": mask, "logits_to_keep": keep, "batch_size": 2, "num_images": marker,
                 "num_tiles": None, "forward_kwargs": {}, "inputs": {}, "torch": torch}
    seen = _recording_parent(monkeypatch, trainer, _signature(TRL_GRPO))
    expected = _bound(_signature(TRL_GRPO), trainer, *[_evaluate(a, namespace) for a in call.args],
                      **{k.arg: _evaluate(k.value, namespace) for k in call.keywords if k.arg})
    monkeypatch.setattr(trainer, "share_prompts", share)
    result = _evaluate(call, namespace)
    if seen:
        assert seen == [expected]
    else:  # our shared-prompt pass took it (only when nothing past compute_entropy was asked for): with grad
        assert share and expected.get("num_images") is None and not expected.get("compute_aux_loss")
        assert result[0].shape == (4, keep) and result[0].grad_fn is not None


@pytest.mark.parametrize("share", [False, True])
def test_unsloths_positional_call_reaches_compute_efficient(monkeypatch, trainer, share):
    """Unsloth's compute_loss scores the policy through a lambda that calls the method positionally, with
    compute_efficient (True) in the 7th slot: it must arrive as compute_efficient, not as TRL's compute_aux_loss."""
    lam, outer = _unsloth_loss_calls()
    ids, mask, keep = _batch(trainer)
    namespace = {"self": trainer, "model": trainer.model, "input_ids": ids, "attention_mask": mask,
                 "logits_to_keep": keep}
    namespace["get_logps_func"] = _evaluate(lam, namespace)
    signature = _signature(UNSLOTH_RL, inside=f"grpo_trainer_{LOGPS}")
    seen = _recording_parent(monkeypatch, trainer, signature)
    monkeypatch.setattr(trainer, "share_prompts", share)
    assert not hasattr(trainer, "_get_per_token_logps")  # else the lambda takes the other branch (older TRL)
    _evaluate(outer[0], namespace)
    assert len(seen) == 1 and seen[0]["compute_efficient"] is True and seen[0]["kwargs"] == {}


def test_unsloths_compute_loss_gets_what_its_own_method_returns(monkeypatch, trainer):
    """On a tiny model, our trainer with Unsloth's real method as its parent (as on a GPU), called as Unsloth's
    compute_loss calls it: the same answer as Unsloth's trainer without us (None: its fused loss scores the
    policy), and never log-probs without a gradient, which its loss would then train on (a failing backward)."""
    import torch

    unsloth_logps = _unsloth_logps()
    lam, outer = _unsloth_loss_calls()
    ids, mask, keep = _batch(trainer)
    monkeypatch.setattr(type(trainer).__mro__[1], LOGPS, unsloth_logps)  # the compiled GPU trainer's, above ours
    results = {}
    for who, method in (("unsloth alone", unsloth_logps), ("ours on unsloth", type(trainer).__dict__[LOGPS])):
        monkeypatch.setattr(trainer, LOGPS, method.__get__(trainer))
        namespace = {"self": trainer, "model": trainer.model, "input_ids": ids, "attention_mask": mask,
                     "logits_to_keep": keep}
        namespace["get_logps_func"] = _evaluate(lam, namespace)
        with torch.enable_grad():
            results[who] = _evaluate(outer[0], namespace)
    assert results["unsloth alone"] is None
    ours = results["ours on unsloth"]
    assert ours is None or ours.grad_fn is not None
    assert ours is results["unsloth alone"]


def test_the_mixed_loss_is_refused_where_unsloths_gpu_loss_replaces_trls(cli, monkeypatch):
    """The supervised term is added in `_compute_loss`, which TRL's compute_loss calls and Unsloth's GPU compute_loss
    does not (when it does, the refusal can go): on a GPU with Unsloth the weights are refused before loading; the
    preset that sets them names the transformers backend, and runs."""
    from conftest import GSM8K_FILE

    from config import build_config
    from grpokit import load_plan
    from grpokit.load_plan import Machine, plan_load

    assert _calls(_function(_tree(TRL_GRPO), "compute_loss"), "_compute_loss")
    assert not _calls(_function(_tree(UNSLOTH_RL), "compute_loss", inside="grpo_trainer_compute_loss"),
                      "_compute_loss")
    a100 = Machine(cuda=True, gpu_name="NVIDIA A100-SXM4-80GB", gpu_memory_gib=79.2, bf16=True)
    mixed = build_config(preset="default", flags={}, overrides=["sft_loss_weight=1.0", "grpo_loss_weight=0.5"])
    assert "Unsloth's GPU trainer" in plan_load(mixed, a100, "unsloth").refusal
    assert not plan_load(mixed, a100, "transformers").refusal
    assert not plan_load(mixed, Machine(), "unsloth").refusal  # Unsloth's CPU backend keeps TRL's trainer

    monkeypatch.setattr(load_plan, "detect_machine", lambda: a100)
    data = ("--dataset-path", str(GSM8K_FILE), "--max-samples", "16", "--dry-run")
    code, out, err = cli("--preset", "sft_grpo_qa", "--backend", "unsloth", *data)
    assert code == 2 and "--backend transformers" in err and len(err.strip().splitlines()) == 1, err
    code, out, err = cli("--preset", "sft_grpo_qa", *data)
    assert code == 0, err


@pytest.mark.parametrize("site", range(4))
def test_on_unsloths_trainer_its_own_scorer_takes_every_call(monkeypatch, trainer, site):
    """Unsloth scores old / reference log-probs with its fused loss's scorer (so the ratio starts at 1): with its
    method as the parent, even the calls our shared-prompt pass would take reach it, as they were made."""
    import torch

    call = _trl_call_sites()[site]
    ids, mask, keep = _batch(trainer)
    namespace = {"self": trainer, "model": trainer.model, "prompt_completion_ids": ids, "input_ids": ids,
                 "attention_mask": mask, "logits_to_keep": keep, "batch_size": 2, "num_images": None,
                 "num_tiles": None, "forward_kwargs": {}, "inputs": {}, "torch": torch}
    signature = _signature(UNSLOTH_RL, inside=f"grpo_trainer_{LOGPS}")
    seen = _recording_parent(monkeypatch, trainer, signature)
    expected = _bound(signature, trainer, *[_evaluate(a, namespace) for a in call.args],
                      **{k.arg: _evaluate(k.value, namespace) for k in call.keywords if k.arg})
    _evaluate(call, namespace)
    assert trainer.share_prompts and seen == [expected]

"""Every GPU command line the docs show plans on the machine it names.

Each training command line of README.md, docs/*.md and the launcher configs' own usage lines is planned as it would
start on its GPUs: under its launcher, with the environment that launcher gives each rank (accelerate's own
`launch_command` with the YAML, stopped where it would start torch's elastic agent; torchrun's argument parser), on
the cards its comment names (`# ... (8 × H100 80GB)`), or on the page's default of one 16 GB T4 per process. The
run's own checks (`GRPOTrainer.check_run`, which the CLI and the Python API pass before anything loads) must accept
it, and its load plan must say that many ranks on that card. Only torch's CUDA queries answer for the named card:
the plan, the config and the launchers are the real ones.
"""

from __future__ import annotations

import re
import shlex
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT

FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.M | re.S)
GIB = 1024**3
# name in a comment -> what torch.cuda.get_device_properties reports for the card (name, GiB, compute capability)
CARDS = {
    "T4": ("Tesla T4", 14.6, 7),
    "L4": ("NVIDIA L4", 22.0, 8),
    "A10G": ("NVIDIA A10G", 22.0, 8),
    "A100 40GB": ("NVIDIA A100-SXM4-40GB", 39.4, 8),
    "A100 80GB": ("NVIDIA A100-SXM4-80GB", 79.2, 8),
    "H100 80GB": ("NVIDIA H100 80GB HBM3", 79.1, 9),
}
DEFAULT_CARD = "T4"  # docs/gpu.md: a command line that names no card plans on a 16 GB T4 per process
CARD = re.compile(r"(?:(\d+)\s*[×x]\s*)?(" + "|".join(re.escape(c) for c in CARDS) + r")\b")
NOT_TRAINING = {"--help", "-h", "--list-models", "--list-datasets", "--list-rewards", "--score-completions"}


@dataclass
class Recipe:
    source: str
    line: str
    launcher: str  # "python", "torchrun" or "accelerate"
    words: list[str]
    card: str
    cards: int | None  # named in the comment


def _split_comment(line: str) -> tuple[str, str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=False)
    lexer.whitespace_split, lexer.commenters = True, ""
    words, comment = [], ""
    for word in lexer:
        if word.startswith("#"):
            comment = line[line.index(" #") + 2:] if " #" in line else word
            break
        words.append(word)
    return " ".join(shlex.quote(w) for w in words), comment


def recipes() -> list[Recipe]:
    found = []
    texts = [(p.relative_to(ROOT).as_posix(), block) for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
             for lang, block in FENCE.findall(p.read_text()) if lang in ("bash", "sh", "shell")]
    for config in sorted((ROOT / "config" / "accelerate").glob("*.yaml")):
        comments = [line[1:].strip() for line in config.read_text().splitlines() if line.startswith("#")]
        texts.append((config.relative_to(ROOT).as_posix(), "\n".join(comments)))  # its usage line(s)
    for source, block in texts:
        for raw in block.replace("\\\n", " ").splitlines():
            if "train_grpo.py" not in raw or "…" in raw:
                continue
            command, comment = _split_comment(raw)
            words = shlex.split(command)
            while words and re.match(r"\w+=", words[0]):
                words = words[1:]
            if not words or Path(words[0]).name not in ("python", "python3", "torchrun", "accelerate"):
                continue
            script = next(i for i, w in enumerate(words) if w.endswith("train_grpo.py"))
            args = words[script + 1:]
            if (args and args[0] in ("export", "report", "doctor")) or NOT_TRAINING & set(args):
                continue
            named = CARD.search(comment)
            found.append(Recipe(source, raw.strip(), Path(words[0]).name.replace("python3", "python"), words,
                                named.group(2) if named else DEFAULT_CARD,
                                int(named.group(1) or 1) if named else None))
    return found


RECIPES = recipes()


def _ranks(recipe: Recipe, monkeypatch) -> tuple[list[str], int, dict[str, str]]:
    """(train_grpo.py's arguments, processes, the launcher's environment for every rank), from the launchers' own
    code."""
    import torch.distributed.run as distrib_run

    if recipe.launcher == "python":
        script = next(i for i, w in enumerate(recipe.words) if w.endswith("train_grpo.py"))
        return recipe.words[script + 1:], 1, {}
    if recipe.launcher == "torchrun":
        args = distrib_run.get_args_parser().parse_args(recipe.words[1:])
        return list(args.training_script_args), int(args.nproc_per_node), {}
    import accelerate.commands.launch as launch

    captured = []
    # accelerate builds each rank's environment, then hands torch's elastic agent the arguments: kept, not started
    monkeypatch.setattr(distrib_run, "run", lambda args: captured.append((args, dict(__import__("os").environ))))
    monkeypatch.setattr(launch, "is_deepspeed_available", lambda: True)  # the launcher only reads a file name of it
    runner = types.ModuleType("deepspeed.launcher.runner")
    runner.DEEPSPEED_ENVIRONMENT_NAME = ".deepspeed_env"
    for name, module in (("deepspeed", types.ModuleType("deepspeed")),
                         ("deepspeed.launcher", types.ModuleType("deepspeed.launcher")),
                         ("deepspeed.launcher.runner", runner)):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name, module))
    assert recipe.words[1] == "launch", recipe.line
    launch.launch_command(launch.launch_command_parser().parse_args(recipe.words[2:]))
    (args, env), = captured
    added = {k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "FSDP_"))}
    return list(args.training_script_args), int(args.nproc_per_node), added


@pytest.fixture
def on_card(monkeypatch):
    """torch's CUDA queries answer for `count` cards of the named kind."""
    import torch

    from grpokit import load_plan

    def install(card: str, count: int):
        name, gib, major = CARDS[card]
        properties = types.SimpleNamespace(name=name, total_memory=int(gib * GIB), major=major, minor=0)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)
        monkeypatch.setattr(load_plan, "_driver_present", lambda: True)

    return install


class Planned(Exception):
    """Raised right after the run's checks passed: nothing loads."""


def test_the_docs_show_gpu_recipes():
    sources = {r.source for r in RECIPES}
    assert {"README.md", "docs/gpu.md", "config/accelerate/deepspeed_zero3.yaml"} <= sources
    assert {r.launcher for r in RECIPES} == {"python", "torchrun", "accelerate"}
    assert any(r.cards == 8 and r.card == "H100 80GB" for r in RECIPES)  # the 70B ZeRO-3 recipe names its machine


@pytest.mark.parametrize("vllm", [False, True], ids=["no-vllm", "vllm"])
@pytest.mark.parametrize("recipe", RECIPES, ids=[f"{r.source}:{' '.join(r.words)[:90]}" for r in RECIPES])
def test_each_gpu_recipe_plans_on_the_machine_it_names(recipe, vllm, cli, on_card, monkeypatch, tmp_path):
    """Every line on the cards it names, where vllm is installed and where it is not (the 'auto' engine differs)."""
    import importlib.machinery
    import importlib.util

    from grpokit.run import GRPOTrainer

    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):  # only whether vllm is there is asked of it before anything loads
        if name == "vllm":
            return importlib.machinery.ModuleSpec("vllm", None) if vllm else None
        return real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("WANDB_MODE", "offline")  # --wandb-project lines: W&B's login is not what is checked here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args, processes, env = _ranks(recipe, monkeypatch)
    assert recipe.cards in (None, processes), f"{recipe.line}: names {recipe.cards} cards, launches {processes}"
    on_card(recipe.card, processes)
    plans = []
    real_check_run = GRPOTrainer.check_run

    def check_run(self):
        real_check_run(self)
        plans.append(self.load_plan)
        raise Planned

    monkeypatch.setattr(GRPOTrainer, "check_run", check_run)
    for rank in sorted({0, processes - 1}):
        for key, value in {**env, "WORLD_SIZE": str(processes), "RANK": str(rank), "LOCAL_RANK": str(rank),
                           "LOCAL_WORLD_SIZE": str(processes)}.items():
            monkeypatch.setenv(key, value)
        if "--output-dir" not in args:  # the plan checks the output directory is writable: not the checkout's
            args = [*args, "--output-dir", str(tmp_path / "out")]
        code, out, err = cli(*args)
        assert plans and len(plans) == sorted({0, processes - 1}).index(rank) + 1, \
            f"{recipe.source}: {recipe.line}\non {processes} x {recipe.card}: exit {code}: {err.strip()[-600:]}"
    for rank, plan in zip(sorted({0, processes - 1}), plans, strict=True):
        assert plan.cuda and plan.refusal in (None, "")
        assert plan.machine.world_size == processes and plan.machine.local_rank == rank
        assert plan.machine.gpu_name == CARDS[recipe.card][0]
        if plan.memory is not None:
            assert plan.memory.training_gib <= CARDS[recipe.card][1], plan.as_dict()

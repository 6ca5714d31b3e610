"""The documents tell the truth: README.md, BENCHMARKS.md and docs/ link to pages and anchors that exist, name files
that exist, and every command line in them that can run offline runs (with `--dry-run` where it would train); the
field reference is the schema's; and product files speak of the product, not of how it was built.
"""

from __future__ import annotations

import ast
import io
import re
import shlex
import subprocess
import sys
import time
import tokenize
from pathlib import Path

import pytest
from conftest import ROOT

README = ROOT / "README.md"
SPEC = ROOT.parent / "shared" / "spec" / "SPEC.md"  # the user's README for this tool (Korean), beside the checkout
DOCS = [README, ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\s]+)`")
# A command refused only because this machine is offline (a hub dataset), has no run to resume or export, or no
# GPU: the command line itself parsed and was checked up to that point.
OFFLINE_REFUSALS = re.compile(r"offline or behind a proxy|cannot be downloaded from the Hugging Face hub"
                              r"|no checkpoint-\* directory|Checkpoint \S+ does not exist|--dataset-path \S+ does not exist"
                              r"|needs a CUDA GPU|needs a GPU")
# Commands named in the docs that this test does not run, and why.
NOT_RUN = {
    "pip": "installs packages", "uv": "installs packages", "echo": "writes a file for pip", "tail": "reads a run's log", "grep": "reads a log",
    "ollama": "needs Ollama", "trl": "starts a vLLM server (GPU)", "git": "clones", "rm": "deletes",
    "tar": "packs a checkout to copy",
}


def _tracked_top_level() -> set[str]:
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return {line.split("/")[0] for line in files.splitlines() if line}
    except (OSError, subprocess.CalledProcessError):
        return {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}


def _prose(text: str) -> str:
    """The text without its fenced code blocks (links and paths in prose)."""
    return FENCE.sub("", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(path.read_text()).splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            slug = _slug(match.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for doc in DOCS:
        for target in LINK.findall(_prose(doc.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not ours to check offline
            path_part, _, anchor = target.partition("#")
            path = (doc.parent / path_part).resolve() if path_part else doc
            if not path.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{doc.name}: {target} (no heading with that anchor)")
    assert not broken, "\n".join(broken)


def test_every_repository_path_named_in_the_docs_exists():
    top = _tracked_top_level()
    missing = []
    for doc in DOCS:
        text = doc.read_text()
        names = CODE_SPAN.findall(_prose(text))
        for _lang, block in FENCE.findall(text):  # paths on command lines too (config files, example data)
            names += re.findall(r"(?<![\w./-])((?:[\w.-]+/)+[\w.*-]+/?)", block)
        for name in names:
            name = name.rstrip(".,;:)").split(":")[0]
            if "/" not in name or name.split("/")[0] not in top or re.search(r"[<{]", name):
                continue  # not a path in this repository (an output file, a metric name, an upstream file, a hub id)
            if not (list(ROOT.glob(name)) if "*" in name else (ROOT / name).exists()):
                missing.append(f"{doc.name}: {name}")
    assert not missing, "\n".join(missing)


def _command_lines() -> list[tuple[str, str]]:
    """(document, command line) for every line of every shell block, continuation lines joined, comments dropped;
    and the user's spec's own `python train_grpo.py` lines, as written (where the spec sits beside the checkout)."""
    lines = []
    if SPEC.exists():
        for line in SPEC.read_text().splitlines():
            if line.strip().startswith("python train_grpo.py") and "[" not in line and "/path/to/" not in line:
                lines.append(("SPEC.md", shlex.join(shlex.split(line, comments=True))))
    for doc in DOCS:
        for lang, block in FENCE.findall(doc.read_text()):
            if lang not in ("bash", "sh", "shell", "console"):
                continue
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words:
                    lines.append((doc.name, shlex.join(words)))
    return lines


def _train_grpo_args(args: list[str]) -> list[str]:
    """What to run of `train_grpo.py ARGS`: a subcommand on a run that does not exist here is parsed with --help
    (click rejects an unknown option before it shows help); a training command runs as --dry-run."""
    if args and args[0] in ("report", "export", "doctor") and "--help" not in args:
        return [*args, "--help"]  # doctor: tests/test_doctor.py runs it
    if {"--help", "-h", "--dry-run", "--score-completions", "--list-models", "--list-datasets",
            "--list-rewards"} & set(args) or (args and args[0] in ("report", "export", "doctor")):
        return args
    return [*args, "--dry-run"]


def test_every_command_line_in_the_docs_runs_offline(cli, monkeypatch):
    monkeypatch.chdir(ROOT)
    makefile = (ROOT / "Makefile").read_text()
    failures, ran, seen, timings = [], 0, set(), []
    for doc, line in _command_lines():
        words = shlex.split(line)
        while words and re.match(r"\w+=", words[0]):
            words = words[1:]  # environment assignments
        head = words[0] if words else ""
        if "…" in line or Path(head).name in NOT_RUN:
            continue
        if head == "make":
            if not re.search(rf"^{re.escape(words[1])}:", makefile, re.M):
                failures.append(f"{doc}: {line}: no such make target")
            continue
        if head in ("torchrun", "accelerate"):
            config = words[words.index("--config_file") + 1] if "--config_file" in words else None
            if config and not (ROOT / config).exists():
                failures.append(f"{doc}: {line}: no {config}")
            words = ["python", *words[next(i for i, w in enumerate(words) if w.endswith("train_grpo.py")):]]
            head = "python"
        if head not in ("python", "python3", ".venv/bin/python"):
            failures.append(f"{doc}: {line}: unknown command: run it here or name it in NOT_RUN")
            continue
        script, args = words[1], words[2:]
        if script == "train_grpo.py":
            args = _train_grpo_args(args)
            if tuple(args) in seen:
                continue
            seen.add(tuple(args))
            started = time.perf_counter()
            code, out, err = cli(*args)
            ran += 1
            timings.append((time.perf_counter() - started, line))
            if code != 0 and not (code == 2 and OFFLINE_REFUSALS.search(err)):
                failures.append(f"{doc}: {line}: exit {code}: {(err or out).strip()[-400:]}")
        elif script.startswith("bench/"):
            source = (ROOT / script).read_text() if (ROOT / script).exists() else ""
            unknown = [a.split("=")[0] for a in args if a.startswith("--") and a.split("=")[0] not in source]
            if not source or unknown:
                failures.append(f"{doc}: {line}: {'no such script' if not source else f'unknown options {unknown}'}")
        elif script == "tools/docgen.py":
            continue  # test_field_reference_is_generated_from_the_schema runs it
        elif script == "tools/compile_run_imports.py":
            continue  # tests/test_compile_run_imports.py runs it
        elif script == "-c":
            result = subprocess.run([sys.executable, "-c", args[0]], cwd=ROOT, capture_output=True, text=True,
                                    timeout=120)
            ran += 1
            if result.returncode != 0:
                failures.append(f"{doc}: {line}: exit {result.returncode}: {result.stderr[-400:]}")
        elif script != "-m":
            failures.append(f"{doc}: {line}: unknown script: run it here or name it in NOT_RUN")
    print("slowest:", *sorted(timings, reverse=True)[:5], sep="\n  ")
    assert not failures, "\n".join(failures)
    assert ran >= 20  # the README's and the topic pages' command lines were found and run


def test_python_blocks_parse():
    for doc in DOCS:
        for lang, block in FENCE.findall(doc.read_text()):
            if lang == "python":
                ast.parse(block, filename=doc.name)


def test_field_reference_is_generated_from_the_schema():
    result = subprocess.run([sys.executable, "tools/docgen.py", "--check"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr


def test_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert "make quick-test" in text and "make test" in text
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.M)  # CI runs the README's command
    assert "docs/development.md#code-map" in text
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{page.name}" in text, f"README's documentation map lacks {page.name}"


# Words about how the product was built, not about the product: ticket numbers and work-log words.
# "Session" names a class and `session.x` a variable; the word in prose is lower case or starts a sentence.
WORKLOG = [re.compile(r"\bissues?\s+#?\d+", re.I), re.compile(r"(?<![`._])\bsessions?\b(?![._(]\w|`)"),
           re.compile(r"(?:^|[.:]\s+)Sessions?\b"), re.compile(r"\bthis\s+round\b", re.I)]
BARE_TICKET = re.compile(r"(?<![\w/.-])#\d{1,5}\b")  # "#40"; an upstream reference names its repository: trl#4973


def _python_prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment, docstring and message string of a Python file."""
    found = []
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string.lstrip("#")))
        elif token.type == tokenize.STRING and token.string.strip("\"'rbfu").lower() != "session":  # scope, a name
            found.append((token.start[0], token.string))
    return found


def test_product_files_speak_of_the_product():
    files = subprocess.run(["git", "ls-files", "*.py", "*.md"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    files = sorted(set(files) | {str(p.relative_to(ROOT)) for p in DOCS})
    hits = []
    for name in files:
        path = ROOT / name
        if not path.exists():
            continue
        if name.endswith(".py"):
            pieces = _python_prose(path)
        else:
            pieces = [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1)]
        for lineno, text in pieces:
            patterns = WORKLOG + ([BARE_TICKET] if name.endswith(".md") or text.lstrip()[:1] not in "\"'" else [])
            for pattern in patterns:
                match = pattern.search(text)
                if match:
                    hits.append(f"{name}:{lineno}: {match.group(0)!r}")
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("image", ["report.png", "curves.png"])
def test_pictures_are_small_pngs(image):
    data = (ROOT / "docs" / "images" / image).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 400_000


def test_each_topic_page_opens_with_what_the_reader_can_do():
    for page in sorted((ROOT / "docs").glob("*.md")):
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# ") and lines[2].startswith("After reading this page you"), page.name

"""The wheels a GPU machine without network lacks, built here for `tools/gpu_check.sh` to install there.

    python tools/gpu_bundle.py build     # download from the registry into gpu_bundle/, repack, check (~15 MiB)
    python tools/gpu_bundle.py stamp     # only gpu_bundle/COMMIT: the commit the check will report (build does it)
    python tools/gpu_bundle.py check     # Requires-Dist of every bundled wheel against the image + the bundle; size
    python tools/gpu_bundle.py simulate  # the same set for this box's Python, imported for real in a clean venv

The GPU image the check was sized for (docs/gpu.md "The GPU check") runs Python 3.12 with torch 2.11.0+cu130,
transformers 5.17.0, PEFT, accelerate 1.15.0, triton 3.6, ... (IMAGE below: its package list of 2026-11-17) and reaches
no registry. What our GPU path needs beyond that travels as cp312 manylinux wheels (BUNDLE), two of them repacked so
that the bundle and the checkout fit in 64 MiB (LIMIT_MIB) together:

- unsloth: without `studio/` (Unsloth Studio's web front end and server, 2000 of its 2250 files, 85 of its 89 MB
  unpacked); nothing under `unsloth/` imports it.
- bitsandbytes: only `libbitsandbytes_cuda130.so` (torch there is cu130) and the CPU library, of 15 native builds.

Each repacked wheel's RECORD is rewritten (dropped files out, changed files re-hashed), so pip installs it as valid.
Dependencies a bundled wheel declares but the GPU path does not import are left out on purpose (OMITTED, each with
its reason); `check` fails on any other requirement that neither the image nor the bundle satisfies.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import os
import re
import subprocess
import sys
import time
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "gpu_bundle"
LIMIT_MIB = 64  # the checkout plus gpu_bundle/, copied to the GPU machine in one go (--limit-mib for another cap)

# What the bundle holds: exact versions, one of each (two versions of a name stop pip's whole install there).
BUNDLE = [
    "trl==1.15.0",
    "unsloth==2026.10.9",
    "unsloth_zoo==2026.10.9",
    "bitsandbytes==0.50.2",
    "datasets==4.8.5",
    "dill==0.4.1",             # datasets: dill<0.4.2
    "multiprocess==0.70.19",   # datasets: multiprocess<0.70.20
    "tyro==1.0.17",            # unsloth, unsloth_zoo (imported at import)
    "docstring_parser==0.18.0",  # tyro
    "typeguard==4.6.1",        # tyro
    "msgspec==0.22.0",         # unsloth_zoo
    "hf_transfer==0.1.9",      # unsloth, unsloth_zoo
    "cut_cross_entropy==25.1.1",  # unsloth_zoo's fused cross-entropy on CUDA (what `pip install unsloth` brings)
]

# The GPU image's packages (its package list of 2026-11-17) with the versions read there; the rest of IMAGE: present,
# version not recorded.
IMAGE_VERSIONS = {
    "python": "3.12.3", "torch": "2.11.0", "transformers": "5.17.0", "accelerate": "1.15.0", "triton": "3.6.0",
    "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0", "tokenizers": "0.23.2",
    "sentencepiece": "0.2.2", "torchvision": "0.26.0",
}
IMAGE = set(IMAGE_VERSIONS) | set("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split()) - {"python"}

# Declared by a bundled wheel, deliberately not bundled: why the GPU path runs without it.
OMITTED = {
    "xformers": "optional in unsloth: ModuleNotFoundError -> PyTorch SDPA attention (unsloth/models/_utils.py); "
                "PyPI's wheels are built for another torch and are ~100 MB",
    "torchao": "imported only for fp8 / QAT / torchao saving, each behind find_spec or inside the function",
    "diffusers": "not imported by unsloth/ or unsloth_zoo/ (only Unsloth Studio, which is repacked out)",
    "pydantic": "unsloth_zoo/__init__.py imports it inside try/except (a warnings filter); Studio uses it",
    "json5": "Unsloth Studio only (repacked out)",
    "structlog": "Unsloth Studio only (repacked out)",
    "nest-asyncio": "unsloth/import_fixes.py imports it inside try/except (OpenEnv only)",
    "eval-type-backport": "python_version < '3.10' only",
}
# Declared versions the image cannot meet and that do not matter at run time.
VERSION_WAIVED = {
    "certifi": "unsloth and unsloth_zoo 2026.10.9 declare certifi>=2026.10.19, which no registry serves yet "
               "(../shared/NOTES.md); the image's certifi is used",
}

PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---- repacking ------------------------------------------------------------------------------------------------

def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(wheel: Path, drop, edit=None) -> tuple[int, int]:
    """Rewrite `wheel` in place without the members `drop(name)` selects; `edit(name, data)` may change a kept
    member's bytes (None: unchanged). RECORD loses the dropped files' lines and gets new hashes for edited ones.
    Returns (files dropped, bytes saved on disk)."""
    before = wheel.stat().st_size
    with zipfile.ZipFile(wheel) as zin:
        infos = zin.infolist()
        record_name = next(i.filename for i in infos if i.filename.endswith(".dist-info/RECORD"))
        kept, dropped, edited = [], 0, {}
        for info in infos:
            if info.filename == record_name:
                continue
            if drop(info.filename):
                dropped += 1
                continue
            data = zin.read(info)
            if edit is not None:
                new = edit(info.filename, data)
                if new is not None and new != data:
                    edited[info.filename] = new
                    data = new
            kept.append((info, data))
        old_record = zin.read(record_name).decode()
    keep_names = {info.filename for info, _ in kept}
    lines = []
    for line in old_record.splitlines():
        if not line.strip():
            continue
        path = line.rsplit(",", 2)[0]
        if path == record_name:
            lines.append(f"{record_name},,")
        elif path in edited:
            lines.append(f"{path},{_record_hash(edited[path])},{len(edited[path])}")
        elif path in keep_names:
            lines.append(line)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zout:
        for info, data in kept:
            out = zipfile.ZipInfo(info.filename, info.date_time)
            out.external_attr = info.external_attr
            out.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(out, data)
        zout.writestr(zipfile.ZipInfo(record_name, kept[0][0].date_time if kept else (1980, 1, 1, 0, 0, 0)),
                      "\n".join(lines) + "\n")
    wheel.write_bytes(buf.getvalue())
    return dropped, before - wheel.stat().st_size


def repack_unsloth(wheel: Path) -> tuple[int, int]:
    def edit(name, data):
        if name.endswith(".dist-info/top_level.txt"):
            return b"".join(line for line in data.splitlines(keepends=True) if line.strip() != b"studio")
        return None

    return repack(wheel, lambda name: name.startswith("studio/"), edit)


def repack_bitsandbytes(wheel: Path, keep=("libbitsandbytes_cuda130.so", "libbitsandbytes_cpu.so")) -> tuple[int, int]:
    def drop(name):
        base = name.rsplit("/", 1)[-1]
        return base.startswith("libbitsandbytes_") and base.endswith(".so") and base not in keep

    return repack(wheel, drop)


REPACKS = {"unsloth": repack_unsloth, "bitsandbytes": repack_bitsandbytes}


# ---- checking -------------------------------------------------------------------------------------------------

def wheel_metadata(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        msg = Parser().parsestr(z.read(name).decode("utf-8", "replace"))
    return {"name": canon(msg["Name"]), "version": msg["Version"], "requires": msg.get_all("Requires-Dist") or []}


def target_environment(python_version: str = "3.12") -> dict:
    return {"python_version": python_version, "python_full_version": f"{python_version}.3",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def check_requirements(wheels: list[Path], python_version: str = "3.12") -> dict:
    """Every Requires-Dist (no extras) of every wheel, judged against the image and the bundle. Returns
    {"ok": [...], "omitted": [...], "waived": [...], "missing": [...], "conflicts": [...]}: `missing` names
    requirements neither provides and OMITTED does not excuse; `conflicts` a known version that fails a specifier."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    env = target_environment(python_version)
    metas = [wheel_metadata(w) for w in wheels]
    bundled = {m["name"]: m["version"] for m in metas}
    result = {"ok": [], "omitted": [], "waived": [], "missing": [], "conflicts": []}
    for meta in metas:
        for text in meta["requires"]:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            name = canon(req.name)
            line = f"{meta['name']} -> {text.split(';')[0].strip()}"
            if name in bundled or name in IMAGE:
                version = bundled.get(name) or IMAGE_VERSIONS.get(name)
                if version and req.specifier and not req.specifier.contains(Version(version), prereleases=True):
                    (result["waived"] if name in VERSION_WAIVED else result["conflicts"]).append(
                        f"{line} (has {version})")
                elif name in VERSION_WAIVED and req.specifier:
                    result["waived"].append(f"{line} ({VERSION_WAIVED[name]})")
                else:
                    where = "bundle" if name in bundled else "image"
                    result["ok"].append(f"{line} ({where}{' ' + version if version else ''})")
            elif name in OMITTED:
                result["omitted"].append(f"{line}: {OMITTED[name]}")
            else:
                result["missing"].append(line)
    names = [m["name"] for m in metas]
    result["duplicates"] = sorted({n for n in names if names.count(n) > 1})
    return result


def record_problems(wheel: Path) -> list[str]:
    """What pip's install would trip on or silently get wrong: members missing from RECORD, RECORD lines for
    members that are not there, and hashes or sizes that do not match. [] for a valid wheel."""
    problems = []
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD") and n.count("/") == 1)
        listed = {}
        for line in z.read(record_name).decode().splitlines():
            if line.strip():
                path, digest, size = line.rsplit(",", 2)
                listed[path] = (digest, size)
        for name in sorted(names - {record_name}):
            if name.endswith("/"):
                continue
            if name not in listed:
                problems.append(f"{wheel.name}: {name} not in RECORD")
                continue
            data = z.read(name)
            digest, size = listed[name]
            if digest != _record_hash(data) or (size and int(size) != len(data)):
                problems.append(f"{wheel.name}: {name} does not match its RECORD line")
        problems += [f"{wheel.name}: RECORD lists {p}, which is not in the wheel"
                     for p in sorted(set(listed) - names - {record_name})]
    return problems


def tree_bytes(root: Path = ROOT) -> int:
    """What is copied to the GPU machine beside gpu_bundle/: tracked and untracked-not-ignored files."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout
    total = 0
    for name in out.decode().split("\0"):
        path = root / name
        if name and path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def size_report(dest: Path, limit_mib: float = LIMIT_MIB, root: Path = ROOT) -> tuple[bool, str]:
    bundle, tree = dir_bytes(dest), tree_bytes(root)
    total = bundle + tree
    mib = 1024 * 1024
    ok = total <= limit_mib * mib
    return ok, (f"bundle {bundle / mib:.1f} MiB + working tree {tree / mib:.1f} MiB = {total / mib:.1f} MiB "
                f"({'within' if ok else 'OVER'} the {limit_mib} MiB cap on the copy to the GPU machine)")


def check(dest: Path, python_version: str = "3.12", limit_mib: float = LIMIT_MIB, verbose: bool = True) -> bool:
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        print(f"no wheels in {dest}: run `python tools/gpu_bundle.py build` first", file=sys.stderr)
        return False
    result = check_requirements(wheels, python_version)
    if verbose:
        for w in wheels:
            print(f"  {w.stat().st_size / 1024 / 1024:6.2f} MiB  {w.name}")
        for key in ("omitted", "waived"):
            for line in result[key]:
                print(f"{key}: {line}")
    for key in ("missing", "conflicts"):
        for line in result[key]:
            print(f"{key.upper()}: {line}", file=sys.stderr)
    for name in result["duplicates"]:
        print(f"DUPLICATE: {name} (two versions stop pip's install)", file=sys.stderr)
    bad_records = [p for w in wheels for p in record_problems(w)]
    for line in bad_records:
        print(f"RECORD: {line}", file=sys.stderr)
    ok_size, line = size_report(dest, limit_mib)
    print(line)
    print(f"requirements: {len(result['ok'])} met, {len(result['omitted'])} omitted on purpose, "
          f"{len(result['waived'])} waived, {len(result['missing'])} missing, {len(result['conflicts'])} conflicts")
    return (ok_size and not result["missing"] and not result["conflicts"] and not result["duplicates"]
            and not bad_records)


# ---- building -------------------------------------------------------------------------------------------------

def commit_line(root: Path = ROOT) -> str:
    """'<short hash>' of the checkout, with ' + N changed files' when tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout

    try:
        head = git("rev-parse", "--short", "HEAD").strip()
        changed = len([line for line in git("status", "--porcelain", "--untracked-files=no").splitlines() if line])
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git here)"
    return head + (f" + {changed} changed files" if changed else "")


def stamp(dest: Path, root: Path = ROOT) -> str:
    """gpu_bundle/COMMIT: the commit of the checkout beside the bundle. A copied working tree carries no .git, so
    this is how the check's report names the code it ran (tools/gpu_check.sh reads the first line)."""
    dest.mkdir(parents=True, exist_ok=True)
    line = commit_line(root)
    (dest / "COMMIT").write_text(f"{line}\nwritten {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} "
                                 "by tools/gpu_bundle.py\n")
    return line


def download(dest: Path, python_version: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", python_version, "--implementation", "cp", "--dest", str(dest)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run(cmd + BUNDLE, check=True)


def build(dest: Path, python_version: str) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()  # one version of each: a stale wheel would make two
    download(dest, python_version)
    for wheel in sorted(dest.glob("*.whl")):
        name = canon(wheel.name.split("-")[0])
        if name in REPACKS:
            dropped, saved = REPACKS[name](wheel)
            print(f"repacked {wheel.name}: {dropped} files out, {saved / 1024 / 1024:.1f} MiB smaller")
    print(f"commit: {stamp(dest)} (written to {dest / 'COMMIT'})")


# `simulate`: the image's packages that the bundle's imports reach, installable on a CPU box (torch: the CPU wheel
# at hand; triton is left out, as on any CPU-only install). Versions as on the image where known.
IMAGE_SIM = ["transformers==5.17.0", "accelerate==1.15.0", "huggingface_hub==1.33.0", "peft", "tokenizers",
             "safetensors", "numpy", "pandas", "pyarrow", "pyyaml", "requests", "jinja2", "tqdm", "regex", "protobuf",
             "pillow", "einops", "xxhash", "fsspec", "aiohttp", "httpx", "filelock", "packaging", "typing_extensions",
             "typer", "rich", "psutil", "sentencepiece", "wheel", "click", "certifi"]
PROBE = ("import os; os.environ.setdefault('UNSLOTH_FORCE_CPU', '1'); import unsloth, unsloth_zoo, trl, datasets, "
         "bitsandbytes, tyro, msgspec; from trl import GRPOConfig, GRPOTrainer; "
         "from unsloth import FastLanguageModel; "
         "print('imported from the bundle:', *sorted({m.__name__: m.__file__ for m in "
         "(unsloth, unsloth_zoo, trl, datasets, bitsandbytes)}.items()), sep='\\n  ')")


def simulate(work: Path, python: str, torch: str = "torch==2.13.0+cpu") -> int:
    """The bundle's imports for real on this CPU box: a clean venv of `python` (another minor version than the
    GPU's 3.12 is fine: the same names are built for it) holding only IMAGE_SIM and torch, then the bundle built for
    that Python, installed with --no-index --no-deps, then `import unsloth, trl, datasets, ...` (Unsloth's CPU
    backend: its CUDA-only modules are not reached here)."""
    work.mkdir(parents=True, exist_ok=True)
    venv, wheels = work / "venv", work / "wheels"
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    build(wheels, version)
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "--quiet"]
    subprocess.run(pip + [torch, *IMAGE_SIM], check=True)
    subprocess.run(pip + ["--no-index", "--no-deps", "--find-links", str(wheels), *map(str, wheels.glob("*.whl"))],
                   check=True)
    return subprocess.run([str(py), "-c", PROBE], cwd=work).returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["build", "check", "simulate", "stamp"])
    parser.add_argument("--dest", type=Path, default=DEST)
    parser.add_argument("--python-version", default="3.12",
                        help="the GPU image's Python (3.12); another one builds a variant to try the wheels here")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_bundle_sim"), help="simulate: its folder")
    parser.add_argument("--python", default="python3", help="simulate: the interpreter of the clean venv")
    parser.add_argument("--torch", default="torch==2.13.0+cpu",
                        help="simulate: the torch to install (a CPU wheel at hand; the GPU image has 2.11.0+cu130)")
    a = parser.parse_args(argv)
    if a.command == "simulate":
        return simulate(a.work, a.python, a.torch)
    if a.command == "stamp":
        print(f"commit: {stamp(a.dest)} (written to {a.dest / 'COMMIT'})")
        return 0
    if a.command == "build":
        build(a.dest, a.python_version)
    ok = check(a.dest, a.python_version, a.limit_mib)
    print("bundle OK" if ok else "bundle NOT OK", file=sys.stderr if not ok else sys.stdout)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    sys.exit(main())

"""One package's source distribution, downloaded without building anything: `uv pip compile` resolves the requirement
against pip's package sources (tools/uv_pip_args.py) to the sdist's URL, size and sha256 (a pylock.toml), and the file
is fetched and checked against all three.

    python tools/fetch_sdist.py .venv/bin/uv llama-cpp-python==0.3.36 DEST.tar.gz

Why not `pip download --no-binary`: it builds the package's metadata first, in a throwaway environment it installs the
build backend into (scikit-build-core for the engine), 9-10 s on 2 cores with the file already in pip's cache; this
takes ~1 s plus the transfer. The Makefile's engine build waits on this file, so the time comes off a cold install.
Exit 1 with one line on any failure (no uv, an index uv cannot read, a hash mismatch): the Makefile then uses pip.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from uv_pip_args import pip_config, uv_words  # noqa: E402


def locate(uv: str, requirement: str) -> dict:
    """The sdist entry uv resolves `requirement` to: {"url" or "path", "size", "hashes": {"sha256": ...}}."""
    env_words, args = uv_words(pip_config())
    env = dict(os.environ, **dict(word.split("=", 1) for word in env_words))
    name = re.split(r"[=<>!~\[;@ ]", requirement, maxsplit=1)[0]
    out = subprocess.run([uv, "pip", "compile", "-", "--no-deps", "--no-binary", name, "--format", "pylock.toml",
                          "--python", sys.executable, "--quiet", *args],
                         input=requirement, capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"uv pip compile: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    packages = tomllib.loads(out.stdout).get("packages", [])
    if len(packages) != 1 or "sdist" not in packages[0]:
        raise RuntimeError(f"no source distribution for {requirement} in the resolution")
    return packages[0]["sdist"]


def fetch(sdist: dict, dest: Path) -> None:
    """Download (or copy, for a local index) `sdist` to `dest`, atomically, after checking its size and sha256."""
    expected = sdist.get("hashes", {}).get("sha256")
    if not expected:
        raise RuntimeError("the index gives no sha256 for the file")
    partial = dest.with_name(f".{dest.name}.{os.getpid()}")
    digest, size = hashlib.sha256(), 0
    source = urllib.request.urlopen(sdist["url"], timeout=180) if "url" in sdist else open(sdist["path"], "rb")
    try:
        with source, open(partial, "wb") as out:
            while chunk := source.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
        if digest.hexdigest() != expected or size != sdist.get("size", size):
            raise RuntimeError(f"{sdist.get('url', sdist.get('path'))}: sha256 or size differs from the index's")
        os.replace(partial, dest)
    finally:
        if partial.exists():
            partial.unlink()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python tools/fetch_sdist.py PATH_TO_UV REQUIREMENT DEST", file=sys.stderr)
        return 2
    uv, requirement, dest = argv
    try:
        if shutil.which(uv) is None:
            raise RuntimeError(f"{uv} is not there")
        fetch(locate(uv, requirement), Path(dest))
    except (OSError, RuntimeError, ValueError, KeyError, tomllib.TOMLDecodeError) as exc:
        print(f"fetch_sdist: {requirement}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

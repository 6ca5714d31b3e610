"""tools/fetch_sdist.py: the engine's sdist located by the real uv (`uv pip compile`, pip's package sources) and
fetched, checked against the index's sha256 and size; a file that differs never lands under the final name. A local
find-links directory stands in for the index: seconds, no network."""

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import fetch_sdist  # noqa: E402

UV = Path(sys.executable).parent / "uv"
PKG_INFO = "Metadata-Version: 2.2\nName: demo-pkg\nVersion: 1.0\n"
PYPROJECT = '[build-system]\nrequires = []\nbuild-backend = "none"\n[project]\nname = "demo-pkg"\nversion = "1.0"\n'


def _sdist(directory: Path) -> Path:
    """A minimal source distribution (static metadata: nothing to build to resolve it)."""
    path = directory / "demo_pkg-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in (("PKG-INFO", PKG_INFO), ("pyproject.toml", PYPROJECT)):
            data = text.encode()
            info = tarfile.TarInfo(f"demo_pkg-1.0/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def local_index(monkeypatch, tmp_path):
    """pip configured with no index and a find-links directory holding the sdist (PIP_CONFIG_FILE overrides the
    machine's pip.conf files for these keys)."""
    if not UV.exists():
        pytest.skip("uv is not installed in this environment (make install bootstraps it)")
    links = tmp_path / "links"
    links.mkdir()
    sdist = _sdist(links)
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nno-index = true\nfind-links = {links}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    return sdist


def test_the_sdist_is_located_by_uv_and_fetched_byte_for_byte(local_index, tmp_path):
    dest = tmp_path / "out" / "demo.tar.gz"
    dest.parent.mkdir()
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "fetch_sdist.py"), str(UV), "demo-pkg==1.0",
                           str(dest)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert dest.read_bytes() == local_index.read_bytes()
    assert os.listdir(dest.parent) == ["demo.tar.gz"]  # no partial file left beside it


def test_a_file_that_differs_from_the_index_is_refused_and_leaves_nothing(local_index, tmp_path):
    sdist = fetch_sdist.locate(str(UV), "demo-pkg==1.0")
    assert sdist["hashes"]["sha256"] == hashlib.sha256(local_index.read_bytes()).hexdigest()
    dest = tmp_path / "out.tar.gz"
    tampered = dict(sdist, hashes={"sha256": "0" * 64})
    with pytest.raises(RuntimeError, match="sha256 or size differs"):
        fetch_sdist.fetch(tampered, dest)
    with pytest.raises(RuntimeError, match="sha256 or size differs"):
        fetch_sdist.fetch(dict(sdist, size=local_index.stat().st_size + 1), dest)
    assert list(tmp_path.glob("*out.tar.gz*")) == []


def test_failures_are_one_line_and_exit_1_for_the_makefiles_pip_fallback(local_index, tmp_path):
    for uv, requirement in ((str(tmp_path / "no-uv"), "demo-pkg==1.0"), (str(UV), "demo-pkg==9.9")):
        proc = subprocess.run([sys.executable, str(ROOT / "tools" / "fetch_sdist.py"), uv, requirement,
                               str(tmp_path / "x.tar.gz")], capture_output=True, text=True)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("fetch_sdist: ")
    assert not (tmp_path / "x.tar.gz").exists()

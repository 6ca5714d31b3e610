"""tools/uv_pip_args.py: pip's configuration, read by the real `pip config list`, becomes the same package sources
for uv (the Makefile installs with `uv pip install`, which reads no pip.conf). Seconds; no downloads."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import uv_pip_args  # noqa: E402


def _pip_env(monkeypatch, tmp_path, conf: str | None, **env: str) -> None:
    """Our config file (PIP_CONFIG_FILE: it overrides the machine's pip.conf files, which pip still reads) and our
    PIP_* variables only; conf=None: no config file at all (PIP_CONFIG_FILE=/dev/null makes pip read none)."""
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    path = tmp_path / "pip.conf"
    path.write_text(conf or "")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull if conf is None else str(path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def _pairs(args: list[str]) -> list[tuple[str, str]]:
    return [(args[i], args[i + 1]) for i in range(0, len(args) - 1) if args[i].startswith("--")
            and not args[i + 1].startswith("--")]


def test_pip_precedence_and_lists_carry_over(monkeypatch, tmp_path):
    conf = ("[global]\nindex-url = https://mirror.example/simple\nfind-links = /wheels/a /wheels/b\n"
            "timeout = 60\ncert = /etc/custom-ca.pem\n"
            "[install]\nindex-url = https://install-section.example/simple\n")
    _pip_env(monkeypatch, tmp_path, conf, PIP_EXTRA_INDEX_URL="file:///idx/one file:///idx/two",
             PIP_DEFAULT_TIMEOUT="180", PIP_TRUSTED_HOST="mirror.example")
    env, args = uv_pip_args.uv_words(uv_pip_args.pip_config())
    pairs = _pairs(args)
    # [install] overrides [global], as in `pip install`; a PIP_* variable overrides both
    assert ("--index-url", "https://install-section.example/simple") in pairs
    assert [v for o, v in pairs if o == "--find-links"] == ["/wheels/a", "/wheels/b"]
    assert [v for o, v in pairs if o == "--extra-index-url"] == ["file:///idx/one", "file:///idx/two"]
    assert ("--allow-insecure-host", "mirror.example") in pairs
    assert ("--index-strategy", "unsafe-best-match") in pairs  # pip's best version over all sources
    assert "SSL_CERT_FILE=/etc/custom-ca.pem" in env and "UV_HTTP_TIMEOUT=180" in env


def test_no_index_and_an_empty_config(monkeypatch, tmp_path):
    _pip_env(monkeypatch, tmp_path, "[global]\nno-index = true\nfind-links = /offline\n")
    env, args = uv_pip_args.uv_words(uv_pip_args.pip_config())
    assert "--no-index" in args and ("--find-links", "/offline") in _pairs(args)
    _pip_env(monkeypatch, tmp_path, None)
    assert uv_pip_args.uv_words(uv_pip_args.pip_config()) == ([], ["--index-strategy", "unsafe-best-match"])


def test_the_printed_command_line(monkeypatch, tmp_path):
    _pip_env(monkeypatch, tmp_path, "[global]\nfind-links = /wheels\n")
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "uv_pip_args.py"), ".venv/bin/uv", "pip", "install"],
                         capture_output=True, text=True, check=True).stdout.split()
    command = [w for w in out if "=" not in w]  # after the variables (a CA from the machine's pip.conf, say)
    assert command[:3] == [".venv/bin/uv", "pip", "install"] and ("--find-links", "/wheels") in _pairs(command)
    usage = subprocess.run([sys.executable, str(ROOT / "tools" / "uv_pip_args.py")], capture_output=True, text=True)
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1 and "usage:" in usage.stderr

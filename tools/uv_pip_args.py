"""pip's configuration, said to uv: the Makefile installs with `uv pip install`, which does not read pip's config.

    python tools/uv_pip_args.py .venv/bin/uv pip install   # prints: [VAR=value ...] .venv/bin/uv pip install [options]
    python tools/uv_pip_args.py .venv/bin/uv build         # the same for building a wheel (the llama.cpp engine)

The Makefile runs the printed words with `env` in front. pip's own view of its configuration (`pip config list`:
pip.conf files, PIP_CONFIG_FILE, PIP_* variables; a variable overrides an [install] section, which overrides [global])
becomes the same package sources for uv: index-url, extra-index-url, find-links, no-index, constraint, trusted-host;
cert, timeout and proxy travel as the variables uv reads. Whatever a machine has configured for pip (a local wheel
directory holding the CPU build of torch, a mirror, a CA) then holds for uv, with nothing of this machine's paths
written here. `--index-strategy unsafe-best-match` is pip's own rule (the best version over every source); uv's
default would take each package from the first index that has it. Values are split on whitespace as pip splits them.
"""

import ast
import subprocess
import sys

# pip option -> uv option (repeated per value for the list options)
LIST_OPTIONS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint",
                "trusted-host": "--allow-insecure-host"}
# pip option -> the environment variable uv reads for it
ENV_OPTIONS = {"cert": "SSL_CERT_FILE", "timeout": "UV_HTTP_TIMEOUT", "default-timeout": "UV_HTTP_TIMEOUT",
               "proxy": "HTTPS_PROXY"}
TRUE = {"1", "true", "yes", "on"}


def pip_config(python: str = sys.executable) -> dict[str, str]:
    """pip's effective value per option name, as `pip install` would use it."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True).stdout
    sections: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        section, dot, name = key.rpartition(".")
        if not (sep and dot):
            continue
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass
        sections.setdefault(section, {})[name] = str(value)
    merged: dict[str, str] = {}
    for section in ("global", "install", ":env:"):  # pip's precedence, lowest first
        merged.update(sections.get(section, {}))
    return merged


def uv_words(config: dict[str, str]) -> tuple[list[str], list[str]]:
    env = [f"{ENV_OPTIONS[name]}={value}" for name, value in config.items() if name in ENV_OPTIONS and value]
    args = ["--index-strategy", "unsafe-best-match"]
    if config.get("index-url"):
        args += ["--index-url", config["index-url"]]
    if config.get("no-index", "").lower() in TRUE:
        args.append("--no-index")
    for name, option in LIST_OPTIONS.items():
        for value in config.get(name, "").split():
            args += [option, value]
    return env, args


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python tools/uv_pip_args.py PATH_TO_UV SUBCOMMAND... (e.g. .venv/bin/uv pip install)",
              file=sys.stderr)
        return 2
    env, args = uv_words(pip_config())
    if argv[1] == "build":  # `uv build` takes pip's constraints for the build environment under this name
        args = ["--build-constraint" if word == "--constraint" else word for word in args]
    print(" ".join([*env, *argv, *args]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Writes the field reference of docs/configuration.md from config/schema.py, so the page cannot drift from the code.

    .venv/bin/python tools/docgen.py            # rewrite the generated part of docs/configuration.md
    .venv/bin/python tools/docgen.py --check    # exit 1 if the page differs from what the schema gives

Everything between the two GENERATED markers of the page is this script's output: one table per `--help` panel
(field, type and default, the command-line flag that sets it, the field's own help text), then the other names a
config file may use for a field and the keys accepted for other tools' configs that have no effect in GRPO. The rest
of the page is written by hand. tests/test_docs.py regenerates the part and compares.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PAGE = ROOT / "docs" / "configuration.md"
BEGIN = "<!-- BEGIN GENERATED: tools/docgen.py writes this part from config/schema.py; do not edit by hand -->"
END = "<!-- END GENERATED -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type_name(tp) -> str:
    choices = typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else None
    if choices:
        return " \\| ".join(f"`{c}`" for c in choices)
    if typing.get_origin(tp) is list:
        return "list"
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> str:
    value = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
    if value == "" or value == [] or value == {}:
        return "empty"
    return f"`{value!r}`" if isinstance(value, (list, dict)) else f"`{value}`"


def flags_by_field() -> dict[str, str]:
    """The command-line flags of each config field, read from the real Typer app: an option's help text is its
    field's (train_grpo.py `_opt`), so the help text names the field."""
    import typer

    from config.schema import FIELDS, field_help
    from train_grpo import app

    command = typer.main.get_command(app)
    flags: dict[str, str] = {}
    for param in command.params:
        names = [*param.opts, *getattr(param, "secondary_opts", [])]
        for name in FIELDS:
            if field_help(name) and (param.help or "").startswith(field_help(name)):
                flags[name] = " / ".join(f"`{n}`" for n in names)
    return flags


def generate() -> str:
    from config.loader import ALIASES, NO_EFFECT
    from config.schema import FIELDS, GRPORunConfig

    hints = typing.get_type_hints(GRPORunConfig)
    flags = flags_by_field()
    panels: dict[str, list[str]] = {}
    for name, f in FIELDS.items():
        panels.setdefault(f.metadata["panel"], []).append(name)
    lines = [BEGIN, ""]
    for panel, names in panels.items():
        lines += [f"### {panel}", "", "| field | type, default | flag | what it does |", "|---|---|---|---|"]
        for name in names:
            f = FIELDS[name]
            trl = " Passed to TRL's `GRPOConfig` as is." if f.metadata.get("trl") else ""
            lines.append(f"| `{name}` | {_type_name(hints[name])}, {_default(f)} | {flags.get(name, '—')} | "
                         f"{_cell(f.metadata['help'])}{trl} |")
        lines.append("")
    lines += ["### Other names for the same fields", "",
              "A config file or `--set` may use these names; `run_config.json` records the field's own name.", "",
              "| name | means |", "|---|---|"]
    lines += [f"| `{alias}` | `{target}` |" for alias, target in ALIASES.items()]
    lines += ["", "### Accepted, with no effect in GRPO", "",
              "Keys of other RL tools' configs: they load with a warning saying why they do nothing.", "",
              "| key | why |", "|---|---|"]
    lines += [f"| `{key}` | {_cell(why)} |" for key, why in NO_EFFECT.items()]
    lines += ["", END]
    return "\n".join(lines)


def render(page: str) -> str:
    """The page with its generated part replaced by what the schema gives now."""
    start, end = page.index(BEGIN), page.index(END) + len(END)
    return page[:start] + generate() + page[end:]


def main() -> int:
    page = PAGE.read_text()
    fresh = render(page)
    if "--check" in sys.argv[1:]:
        if fresh != page:
            print(f"{PAGE.relative_to(ROOT)} differs from config/schema.py: run .venv/bin/python tools/docgen.py",
                  file=sys.stderr)
            return 1
        return 0
    if fresh != page:
        PAGE.write_text(fresh)
        print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

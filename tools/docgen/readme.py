"""The generated regions of the Markdown pages (README.md's exit codes, docs/events.md's event names) and
docs/options.md (the options tables)."""

from __future__ import annotations

from typing import Sequence

from mbr_launch.config.settings import Setting
from mbr_launch.report import exitcodes
from mbr_launch.report.events import EVENT_FIELDS

from .common import GENERATED, by_panel, default_shown


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def options_table(settings: Sequence[Setting]) -> str:
    """The options tables, one per panel."""
    out = [f"<!-- {GENERATED} -->"]
    for panel, members in by_panel(settings):
        out += ["", f"### {panel}", "", "| Flag | Environment | Default | Description |", "|---|---|---|---|"]
        for setting in members:
            meta = setting.value_hint
            # The metavar once, on the canonical flag: the aliases take the same value.
            flags = ", ".join([f"`{setting.flag}{' ' + meta if meta else ''}`", *(f"`{f}`" for f in setting.flags[1:])])
            env = ", ".join(f"`{e}`" for e in setting.envvars)
            default = default_shown(setting)
            out.append(f"| {_md(flags)} | {env} | {_md(f'`{default}`') if default else ''} | {_md(setting.help)} |")
    return "\n".join(out) + "\n"


def options_page(settings: Sequence[Setting]) -> str:
    """docs/options.md: a title, how to read the tables, then ``options_table``."""
    head = ["# mbr-launch options", "",
            "Every option, by panel, with its environment variables (`MBR_*`; torchrun's `PET_*` where torchrun has",
            "the flag) and its default. A flag beats its environment variable, which beats the `mbr_launch:` section",
            "of `--config FILE`. On a terminal: `mbr-launch --help-all` or `man ./man/mbr-launch.1`.", ""]
    return "\n".join(head) + "\n" + options_table(settings)


def exit_codes() -> str:
    out = [f"<!-- {GENERATED} -->", "", "| code | meaning |", "|---|---|"]
    out += [f"| `{code}` | {_md(text)} |" for code, text in exitcodes.TABLE]
    return "\n".join(out) + "\n"


def events_table() -> str:
    out = [f"<!-- {GENERATED} (events.EVENT_FIELDS; field meanings below) -->", "",
           "| event | fields besides the common ones |", "|---|---|"]
    out += [f"| `{name}` | {', '.join(f'`{f}`' for f in fields)} |" for name, fields in EVENT_FIELDS.items()]
    return "\n".join(out) + "\n"


def replace_region(page: str, table: str, name: str, path: str) -> str:
    """``page`` (the text of ``path``) with the text between the ``name`` markers replaced by ``table``."""
    begin, finish = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    start, end = page.find(begin), page.find(finish)
    if start < 0 or end < start:
        raise ValueError(f"{path} lacks the markers {begin} ... {finish}")
    return page[: start + len(begin)] + "\n" + table + page[end:]

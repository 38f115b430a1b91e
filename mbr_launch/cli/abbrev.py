"""Abbreviated long options, read as torchrun reads them.

torchrun's argparse takes any unique prefix of a long option; click takes none, so ``expand`` writes the
options before SCRIPT out in full before a parser reads them (what the user sees: docs/torchrun.md). A prefix
is matched against the installed torch's torchrun options first, so that mbr-launch's extra options never make
a torchrun prefix ambiguous (``--h``: torchrun's ``--help``, also our ``--hang-kill-grace``); candidates that
all spell one option are that option, where argparse would call them ambiguous."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from mbr_launch.config.settings import Setting

Version = tuple[int, ...]
ALWAYS: Version = (0,)  # in every torchrun this checks (2.13 on)
_SHOWN = 12  # candidates named in the error; the rest are counted


@dataclass(frozen=True)
class Spelling:
    owner: str  # the option it spells (a setting's name): candidates of one owner are one option
    takes_value: bool
    torchrun_since: Version | None = None  # None: not one of torchrun's option strings


class AmbiguousOption(Exception):
    def __init__(self, word: str, candidates: Sequence[str]) -> None:
        shown = ", ".join(candidates[:_SHOWN])
        more = f" and {len(candidates) - _SHOWN} more" if len(candidates) > _SHOWN else ""
        super().__init__(f"ambiguous option: {word} could match {shown}{more}")
        self.word = word
        self.candidates = tuple(candidates)


def _by_owner(names: Iterable[str], spellings: Mapping[str, Spelling]) -> list[str]:
    chosen: dict[str, str] = {}
    for name in sorted(names, key=lambda n: ("_" in n, n)):
        chosen.setdefault(spellings[name].owner, name)
    return list(chosen.values())


def resolve(prefix: str, spellings: Mapping[str, Spelling], torch: Callable[[], Version], *,
            word: str | None = None) -> str | None:
    """The option string ``prefix`` stands for, or None when no option starts with it (the parser reports it).
    ``torch`` is asked only for a real prefix."""
    if prefix in spellings:
        return prefix
    if not prefix.startswith("--") or len(prefix) < 3:
        return None
    every = [name for name in spellings if name.startswith(prefix)]
    if not every:
        return None
    version = torch()
    theirs = [name for name in every if (since := spellings[name].torchrun_since) is not None and since <= version]
    for candidates in (theirs, every):
        if not candidates:
            continue
        if len({spellings[name].owner for name in candidates}) == 1:  # spellings of one option
            return min(candidates, key=lambda n: ("_" in n, n))
        raise AmbiguousOption(word or prefix, _by_owner(candidates, spellings))
    return None


def expand(argv: Sequence[str], spellings: Mapping[str, Spelling], torch: Callable[[], Version]) -> list[str]:
    """``argv`` with each abbreviated long option before SCRIPT written out in full; raises ``AmbiguousOption``."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--" or not word.startswith("-") or word == "-":
            break  # SCRIPT (or what ends the options): it and the rest are the script's
        name, equals, value = word.partition("=")
        if word.startswith("--"):
            full = resolve(name, spellings, torch, word=word) if equals else resolve(word, spellings, torch)
        elif word in spellings:
            full = word
        elif equals and name in spellings and spellings[name].takes_value:
            out.extend([name, value])  # argparse gives ``-r=3`` the value 3 (click would read "=3")
            i += 1
            continue
        else:
            full = None  # -r3, -mr3: click reads them as argparse does
        if full is None:  # an unknown option: the parser reports it
            out.append(word)
            i += 1
        elif equals and word.startswith("--"):
            out.append(f"{full}={value}")
            i += 1
        elif spellings[full].takes_value and i + 1 < len(argv):
            out.extend([full, argv[i + 1]])  # the value, whatever it looks like, is never matched
            i += 2
        else:
            out.append(full)
            i += 1
    return out + list(argv[i:])


def setting_spellings(settings: Iterable[Setting]) -> dict[str, Spelling]:
    table = {}
    for setting in settings:
        for flag in setting.flags:
            since = (setting.torchrun_since or ALWAYS) if flag in setting.torchrun_flags else None
            table[flag] = Spelling(owner=setting.name, takes_value=setting.takes_value, torchrun_since=since)
    return table


# torchrun's -h/--help (argparse's own), taken like its other options
HELP = {flag: Spelling(owner="help", takes_value=False, torchrun_since=ALWAYS) for flag in ("-h", "--help")}
# The launch's options beside the settings (``cli.helptext``, ``cli.completion``): mbr-launch's own, and torchrun's
# --print-completion.
LAUNCH_EXTRAS = {
    "--help-all": Spelling(owner="help_all", takes_value=False),
    "--version": Spelling(owner="version", takes_value=False),
    **{flag: Spelling(owner="print_completion", takes_value=True, torchrun_since=(2, 14))
       for flag in ("--print-completion", "--print_completion")},
}

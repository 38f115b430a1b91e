"""Parsers for values as ft_launcher (NVRx 0.4.1, 0.6, 0.7) reads them; ``parse`` has the shared ones.

ft_launcher's booleans follow three rules (``RULES``), and ``--ft-enable-nic-monitor``'s changed between
versions (``versioned_bool``). mbr-launch's own words ``on`` and ``off`` mean what they say, where ft_launcher
0.6+ would read ``off`` as true; ``unclear`` tells a caller that a word is in no version's vocabulary."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping

from mbr_launch.config.parse import LARGEST, NONE_WORDS, Parser, _fail, _number

TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")
OURS = {"on": True, "off": False}
# What an unlisted word means under each rule.
RULES: Mapping[str, Callable[[str], bool]] = {
    "truthy": lambda word: word in TRUE_WORDS,
    "falsy": lambda word: word not in FALSE_WORDS,
    "exact_true": lambda word: word == "true",
}
LEVELS = {"DEBUG": "DEBUG", "DBG": "DEBUG", "INFO": "INFO", "WARNING": "WARNING", "WARN": "WARNING",
          "ERROR": "ERROR", "CRITICAL": "CRITICAL"}


def unclear(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    word = str(value).strip().lower()
    return word not in (*TRUE_WORDS, *FALSE_WORDS, *OURS)


def ft_bool(name: str, rule: str) -> Parser:
    reads = RULES[rule]

    def parse(value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if value is None or isinstance(value, (list, dict)):
            raise _fail(name, value, "expected true or false")
        word = str(value).strip().lower()
        return OURS[word] if word in OURS else reads(word)

    parse.rule = rule  # type: ignore[attr-defined]
    return parse


def versioned_bool(name: str, rules: Mapping[str, str]) -> Parser:
    """A boolean whose rule depends on the workers' NVRx line (``rules``: line -> rule, oldest first): the newest
    rule plainly, ``parse.for_generation(g)`` for line ``g``."""
    parsers = {generation: ft_bool(name, rule) for generation, rule in rules.items()}
    newest = list(parsers.values())[-1]

    def for_generation(generation: str | None) -> Parser:
        return parsers.get(generation or "", newest)

    def parse(value: Any) -> bool:
        return newest(value)

    parse.for_generation = for_generation  # type: ignore[attr-defined]
    parse.rules = dict(rules)  # type: ignore[attr-defined]
    return parse


def log_level(name: str) -> Parser:
    """A log level as NVRx takes it: a name in any case (DBG and WARN too), or a number 10 to 50 from a YAML file
    (kept as text when it lies between the named levels)."""

    def parse(value: Any) -> str:
        if isinstance(value, bool):
            raise _fail(name, value, "expected a log level such as INFO or DEBUG")
        if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
            number = int(value)
            if not logging.DEBUG <= number <= logging.CRITICAL:
                raise _fail(name, value, f"a numeric log level must be {logging.DEBUG} to {logging.CRITICAL}")
            known = logging.getLevelName(number)
            return known if known in LEVELS else str(number)
        text = str(value).strip().upper()
        if text not in LEVELS:
            raise _fail(name, value, "choose one of DEBUG, INFO, WARNING, ERROR, CRITICAL (any case)")
        return LEVELS[text]

    parse.choices = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")  # type: ignore[attr-defined]
    return parse


def folded_choice(name: str, options: tuple[str, ...], fold: Callable[[str], str], *,
                  none_ok: bool = False) -> Parser:
    """One of ``options`` after ``fold``, as ft_launcher's ``type=str.lower`` choices; ``none_ok``: YAML null is None."""

    def parse(value: Any) -> str | None:
        if value is None and none_ok:
            return None
        text = fold(str(value).strip())
        if text not in options:
            raise _fail(name, value, f"choose one of {', '.join(options)}")
        return text

    parse.choices = options  # type: ignore[attr-defined]
    parse.takes_none = none_ok  # type: ignore[attr-defined]
    return parse


def integer(name: str, *, least: int = -LARGEST, most: int = LARGEST) -> Parser:
    """A whole number, negative ones too where ft_launcher gives them a meaning (``-1``: off)."""

    def parse(value: Any) -> int:
        number = _number(name, int, value, most)
        if number < least:
            raise _fail(name, value, f"must be at least {least}")
        return int(number)

    low, high = "" if least == -LARGEST else least, "" if most == LARGEST else most
    parse.bounds = f"[{low}..{high}]"  # type: ignore[attr-defined]
    return parse


def optional_number(name: str, kind: type = float, *, positive: bool = False) -> Parser:
    """A number, or null/none/'' (ft_launcher 0.6+'s None), which means "the default" to whoever reads it."""

    def parse(value: Any) -> Any:
        if value is None or (isinstance(value, str) and value.strip().lower() in NONE_WORDS):
            return None
        number = _number(name, kind, value)
        if number < 0 or (positive and number == 0):
            raise _fail(name, value, "must be positive" if positive else "must be zero or positive")
        return number

    parse.takes_none = True  # type: ignore[attr-defined]
    parse.bounds = ("(0..]" if positive else "[0..]") + " or none"  # type: ignore[attr-defined]
    return parse


def absolute_path(name: str) -> Parser:
    """An absolute path, as ft_launcher requires."""

    def parse(value: Any) -> str:
        text = str(value).strip()
        if not os.path.isabs(text):
            raise _fail(name, value, "must be an absolute path (ft_launcher's rule: every node reads the same "
                                     "path, whatever its working directory)")
        return text

    return parse


def absolute_paths(name: str) -> Parser:

    def parse(value: Any) -> tuple[str, ...]:
        parts = [str(v).strip() for v in value if v is not None] if isinstance(value, (list, tuple)) \
            else [p.strip() for p in str(value).split(",")]
        paths = tuple(p for p in parts if p)
        for path in paths:
            if not path.startswith("/"):
                raise _fail(name, value, f"{path!r} is not an absolute path; give paths that start with '/'")
        return paths

    parse.takes_list = True  # type: ignore[attr-defined]
    return parse

"""What mbr-launch knows about the NVRx versions it follows (0.4.1, 0.6.0 and 0.7.0), and how their ft_launcher
reads a value.

Where ft_launcher's versions disagree, mbr-launch follows the NVRx in the workers' environment
(``config.host.workers_nvrx``); ``tests/test_ft_flag_parity.py`` checks these tables against the real packages.
ft_launcher's booleans follow three rules (``RULES``), and ``--ft-enable-nic-monitor``'s changed between
versions (``versioned_bool``); mbr-launch's own words ``on`` and ``off`` mean what they say, where 0.6+ would
read ``off`` as true."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from mbr_launch.config.parse import LARGEST, NONE_WORDS, Parser, _fail, _number

# The lines whose behaviour mbr-launch knows, oldest first (0.5 behaves as 0.4.1; a newer one as the last).
GENERATIONS = ("0.4", "0.6", "0.7")
NEWEST = GENERATIONS[-1]
NAMES = {"0.4": "0.4.1", "0.6": "0.6", "0.7": "0.7"}  # a line as people call it ("ft_launcher 0.4.1's defaults")

# FaultToleranceConfig's fields in each line, in declaration order (the YAML ``fault_tolerance:`` keys).
_FIELDS_04 = ("workload_check_interval", "initial_rank_heartbeat_timeout", "rank_heartbeat_timeout",
              "rank_section_timeouts", "rank_out_of_section_timeout", "node_health_check_interval", "safety_factor",
              "rank_termination_signal", "log_level", "restart_check_interval", "enable_nic_monitor")
_FIELDS_06 = (*_FIELDS_04, "enable_nic_healthcheck", "enable_dist_storage_healthcheck", "storage_healthcheck_path",
              "pci_topo_file", "link_down_path_template", "link_state_path_template", "skip_section_response",
              "segment", "numa_bind_strict", "gpu_memory_reclaim_timeout", "gpu_memory_tolerance_mb",
              "gpu_memory_poll_interval", "check_remaining_processes", "max_no_progress_cycles",
              "min_progress_iterations", "checkpoint_iteration_file", "install_exception_hook",
              "num_warmup_iterations", "attribution_endpoint")
FT_FIELDS: dict[str, tuple[str, ...]] = {
    "0.4": (*_FIELDS_04, "pci_topo_file", "link_down_path_template"),
    "0.6": (*_FIELDS_06, "cycle_info_dir"),
    "0.7": (*_FIELDS_06, "attribution_stop_action", "attribution_export_url", "cycle_info_dir",
            "segment_health_check_dir"),
}
ALL_FT_FIELDS = frozenset(f for fields in FT_FIELDS.values() for f in fields)
# Fields of 0.6+ that the client itself reads (the others are the launcher's): no effect on a 0.4.1 client.
CLIENT_FIELDS_SINCE_06 = ("skip_section_response", "install_exception_hook", "num_warmup_iterations")

# ft_launcher 0.6 dropped these 0.4.1 spellings (and every --ft-param-* / --ft_param_* one); 0.7 dropped one of 0.6.
REMOVED_IN_06 = frozenset({"--fault-tol-cfg-path", "--restart-policy", "--restart_policy",
                           "--ignore-missing-fault-tol-cfg"})
REMOVED_IN_07 = frozenset({"--ft-attribution-compute-timeout", "--ft_attribution_compute_timeout"})
# (setting, value) -> the line that stopped taking that value.
REMOVED_VALUES: dict[tuple[str, str], str] = {
    ("restart_policy", "min-healthy"): "0.6", ("rdzv_impl", "legacy"): "0.7",
    ("attribution_analysis_backend", "mcp"): "0.7",
}


def generation(version: str | None) -> str | None:
    """The line of an NVRx ``version`` ("0.7.0rc1" -> "0.7"); None when there is none or it cannot be read."""
    if not version:
        return None
    match = re.match(r"(\d+)\.(\d+)", version.strip())
    if match is None:
        return None
    found = (int(match.group(1)), int(match.group(2)))
    line = GENERATIONS[0]
    for candidate in GENERATIONS:
        if found >= release(candidate):
            line = candidate
    return line


def release(line: str) -> tuple[int, ...]:
    return tuple(int(part) for part in line.split("."))


def removed_spelling(flag: str) -> str | None:
    if flag.startswith(("--ft-param-", "--ft_param_")) or flag in REMOVED_IN_06:
        return "0.6"
    return "0.7" if flag in REMOVED_IN_07 else None


@dataclass(frozen=True)
class NvrxFound:
    """The NVRx a worker would import (None: not installed), where its metadata is, and how that is on the path."""

    version: str | None
    where: str = ""
    via: str = ""

    @property
    def generation(self) -> str | None:
        return generation(self.version)

    def describe(self) -> str:
        if self.version is None:
            return "no nvidia-resiliency-ext in the workers' environment"
        return f"nvidia-resiliency-ext {self.version} ({self.where}, on {self.via})"


# ---- values as ft_launcher reads them ----

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
    """One of ``options`` after ``fold``, as ft_launcher's ``type=str.lower`` choices; ``none_ok``: null is None."""

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

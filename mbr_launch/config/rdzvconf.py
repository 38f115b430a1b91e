"""``--rdzv-conf KEY=VALUE,...``, read as torchrun reads it, and checked as torch's rendezvous reads each key.

The text is split exactly as torchrun splits it (quotes stay part of keys and values). A key the backend
reads (``READ``, from torch's ``dynamic_rendezvous``, ``c10d_rendezvous_backend`` and
``static_tcp_rendezvous``) is checked before anything starts; one it never reads is passed on all the same,
and named in one warning line. What the user sees: docs/torchrun.md."""

from __future__ import annotations

import math
from typing import Any, Callable

from mbr_launch.config.errors import ConfigError
from mbr_launch.config.parse import LARGEST, whole

_BOOL_WORDS = ("1", "true", "t", "yes", "y", "0", "false", "f", "no", "n")  # torch's get_as_bool, any case
_SECONDS = ("join_timeout", "last_call_timeout", "close_timeout", "heartbeat_timeout", "keep_alive_interval",
            "keep_alive_max_attempt", "read_timeout")
CAS_BACKOFF = "cas_backoff_max_seconds"
CAS_BACKOFF_SINCE = (2, 15)
# key -> how the backend reads it: "int" (whole seconds or a count, from 1), "bool", "store", "seconds" (a
# number from 0), "launcher" (set by the launcher itself, whatever is given)
READ: dict[str, dict[str, str]] = {
    "c10d": {**{key: "int" for key in _SECONDS}, "is_host": "bool", "store_type": "store", CAS_BACKOFF: "seconds"},
    "static": {"timeout": "int", "rank": "launcher"},
}
_QUOTES = "'\"`"


def parse_rdzv_conf(text: str) -> dict[str, str]:
    """torchrun's own split of ``text`` (``torch.distributed.elastic.rendezvous.utils``), its errors included."""
    conf: dict[str, str] = {}
    if not text.strip():
        return conf
    for part in text.strip().split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not key:
            raise ConfigError(f"--rdzv-conf: expected KEY=VALUE,... with no empty part (got {text!r})")
        if not sep or not value:
            raise ConfigError(f"--rdzv-conf: {key} needs a value, KEY=VALUE (got {text!r})")
        conf[key] = value
    return conf


def _check(backend: str, key: str, value: str) -> None:
    how = READ.get(backend, {}).get(key)
    if how == "int" and not 0 < (whole(value.lstrip("+")) or 0) <= LARGEST:
        raise ConfigError(f"--rdzv-conf: {key} must be a whole number of seconds (or count) from 1 to {LARGEST}, as "
                          f"torch reads it (got {value!r})")
    if how == "bool" and value.lower() not in _BOOL_WORDS:
        raise ConfigError(f"--rdzv-conf: {key} must be true or false (got {value!r})")
    if how == "store" and value.lower() not in ("tcp", "file"):
        raise ConfigError(f"--rdzv-conf: {key} must be tcp or file (got {value!r})")
    if how == "seconds":
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not 0 <= seconds <= LARGEST:  # NaN fails both
            raise ConfigError(f"--rdzv-conf: {key} must be a number of seconds from 0 to {LARGEST} (got {value!r})")


def check_rdzv_conf(conf: dict[str, Any], backend: str, torch_version: Callable[[], tuple[int, ...]]) -> list[str]:
    """Check the keys ``backend`` reads (raises ``ConfigError``); the warning lines (at most one) for the rest."""
    ignored = []
    for key, value in conf.items():
        _check(backend, key, str(value))
        if key not in READ.get(backend, {}) or READ[backend][key] == "launcher":
            ignored.append(key)
    notes = []
    if ignored:
        quoted = any(c in _QUOTES for key in ignored for c in key + str(conf[key]))
        why = " (the quotes are part of the text: the shell or YAML that passed them on did not remove them)" \
            if quoted else ""
        notes.append(f"torch's {backend} rendezvous does not read {', '.join(map(repr, ignored))}{why}")
    if CAS_BACKOFF in conf and backend == "c10d" and torch_version() < CAS_BACKOFF_SINCE:
        notes.append(f"{CAS_BACKOFF} is read from torch {'.'.join(map(str, CAS_BACKOFF_SINCE))} on, not by the torch "
                     "installed here")
    return [f"--rdzv-conf: {'; '.join(notes)}: ignored, as torchrun ignores it"] if notes else []

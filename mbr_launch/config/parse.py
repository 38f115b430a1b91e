"""Pure parsers and validators: text (or a config-file value) in, a typed value or a named error out.

The setting parsers are factories that close over the flag they report and raise ``SettingError``; the
launch-shape parsers (``parse_nnodes``, ...) raise ``ConfigError`` and are handed what they need to ask the host."""

from __future__ import annotations

import signal
from typing import Any, Callable, Mapping

from mbr_launch.config.errors import ConfigError, SettingError
from mbr_launch.config.model import StdSpec

Parser = Callable[[Any], Any]

# The largest count or number of seconds a setting takes: about 3 years. Larger values are typos, and
# beyond ~9e9 s Python's own waits overflow (threading.TIMEOUT_MAX, time_t) deep inside a running job.
LARGEST = 100_000_000
MAX_NODES = 65_536  # c10d keeps every node in one rendezvous key that each join rewrites: far beyond tested
MAX_NPROC = 1_024  # workers per node: each is a process with pipes and sockets, more is a typo
UNCATCHABLE = ("SIGKILL", "SIGSTOP")  # the kernel never delivers these to a handler


def _fail(setting: str, value: Any, why: str) -> SettingError:
    return SettingError(f"{setting}: {why} (got {value!r})")


def whole(text: str) -> int | None:
    """``text`` as a non-negative integer when it is plain ASCII digits, else None (``str.isdigit`` passes '²')."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


# ---- setting parsers -----------------------------------------------------------------------------


def as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise SettingError(f"expected a boolean (1/0, true/false), got {value!r}")


def _number(name: str, kind: type, value: Any, most: float = LARGEST) -> Any:
    noun = "an int" if kind is int else f"a {kind.__name__}"
    if isinstance(value, bool):  # a YAML true/false is not a count
        raise _fail(name, value, f"expected {noun}")
    try:
        number = kind(value)
    except (TypeError, ValueError, OverflowError):
        raise _fail(name, value, f"expected {noun}") from None
    if number != number or abs(number) == float("inf"):  # NaN compares unequal to itself
        raise _fail(name, value, "expected a finite number")
    if number != value and isinstance(value, float):  # int(2.7) would quietly be 2
        raise _fail(name, value, f"expected {noun}")
    if number > most:
        raise _fail(name, value, f"must be at most {most}")
    return number


def non_negative(name: str, kind: type, *, most: float = LARGEST, zero: bool = True) -> Parser:
    """``zero=False`` (``positive``) where zero has no sensible meaning (a silence bound of 0 s would call every
    peer lost)."""

    def parse(value: Any) -> Any:
        number = _number(name, kind, value, most)
        if number < 0 or (number == 0 and not zero):
            raise _fail(name, value, "must be zero or positive" if zero else "must be positive")
        return number

    parse.bounds = f"{'[' if zero else '('}0..{'' if most == LARGEST else most}]"  # type: ignore[attr-defined]
    return parse


def positive(name: str, kind: type) -> Parser:
    return non_negative(name, kind, zero=False)


NONE_WORDS = ("none", "null", "")  # what ft_launcher 0.6+ reads as None (any case); 'off' is ours


def _is_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in (*NONE_WORDS, "off"))


def optional_timeout(name: str) -> Parser:
    """Seconds > 0, or none/null/off/'' to disable the timeout (NVRx treats None as infinite)."""

    def parse(value: Any) -> float | None:
        if _is_none(value):
            return None
        try:
            number = float(value) if not isinstance(value, bool) else float("nan")
        except (TypeError, ValueError, OverflowError):
            raise _fail(name, value, "expected seconds (a number) or 'none'") from None
        if not number > 0 or number == float("inf"):
            raise _fail(name, value, "must be a positive number of seconds, or 'none' to disable")
        if number > LARGEST:
            raise _fail(name, value, f"must be at most {LARGEST} seconds, or 'none' to disable")
        return number

    parse.takes_none = True  # type: ignore[attr-defined]  # YAML null means 'none' (settings.parse_value)
    parse.bounds = "(0..] or none"  # type: ignore[attr-defined]
    return parse


def section_timeouts(value: Any) -> dict[str, float | None]:
    flag = "--ft-rank-section-timeouts"
    if isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
    else:
        text = str(value).strip()
        if not text:
            return {}
        items = []
        for part in text.split(","):
            name, sep, seconds = part.partition(":")
            if not sep:
                raise _fail(flag, value, f"'{part}' is not NAME:SECONDS")
            items.append((name.strip(), seconds.strip()))
    result: dict[str, float | None] = {}
    for name, seconds in items:
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            raise _fail(flag, value, f"bad section name {name!r}")
        if name in result:
            raise _fail(flag, value, f"section {name!r} is given twice")
        try:
            result[name] = optional_timeout(flag)(seconds)
        except SettingError:
            raise _fail(flag, value, f"section {name!r} needs positive seconds or 'none', not {seconds!r}") from None
    return result


def signal_name(name: str) -> Parser:
    def parse(value: Any) -> str:
        text = str(value).strip().upper()
        if whole(text) is not None:
            try:
                return signal.Signals(int(text)).name
            except ValueError:
                raise _fail(name, value, "unknown signal number") from None
        if not text.startswith("SIG"):
            text = "SIG" + text
        if text not in signal.Signals.__members__:
            raise _fail(name, value, "unknown signal name (e.g. SIGTERM, SIGKILL)")
        return text

    return parse


def signal_list(name: str) -> Parser:
    """Signals the launcher installs handlers for: SIGKILL and SIGSTOP cannot be caught."""

    def parse(value: Any) -> tuple[str, ...]:
        parts = [p for p in str(value).split(",") if p.strip()]
        names = tuple(signal_name(name)(p) for p in parts)
        for sig in names:
            if sig in UNCATCHABLE:
                raise _fail(name, value, f"{sig} cannot be caught, so the launcher could never act on it; "
                                         "use catchable signals such as SIGTERM, SIGUSR1")
        return names

    return parse


def choice(name: str, options: tuple[str, ...]) -> Parser:
    def parse(value: Any) -> str:
        text = str(value).strip()
        if text not in options:
            raise _fail(name, value, f"choose one of {', '.join(options)}")
        return text

    parse.choices = options  # type: ignore[attr-defined]  # the setting's choices, for --help and completions
    return parse


def comma_list(value: Any) -> tuple[str, ...]:
    """torchrun's comma list, where ',,' escapes a comma."""
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    text = str(value)
    if not text:
        return ()
    placeholder = "\0"
    return tuple(p.replace(placeholder, ",") for p in text.replace(",,", placeholder).split(","))


def module_list(name: str) -> Parser:

    def parse(value: Any) -> tuple[str, ...]:
        parts = [str(v).strip() for v in value] if isinstance(value, (list, tuple)) \
            else [p.strip() for p in str(value).split(",") if p.strip()]
        if parts == ["none"]:
            return ()
        if "none" in parts:
            raise _fail(name, value, "none stands alone (it means no module); drop it or the module names")
        for part in parts:
            if not all(piece.isidentifier() for piece in part.split(".")):
                raise _fail(name, value, f"{part!r} is not a module name like torch._dynamo")
        return tuple(parts)

    return parse


def exit_code_list(name: str) -> Parser:
    def parse(value: Any) -> tuple[int, ...]:
        if isinstance(value, (list, tuple)):
            parts = [str(v) for v in value]
        else:
            parts = [p.strip() for p in str(value).split(",") if p.strip()]
        codes = []
        for part in parts:
            if whole(part) is None or not 0 <= int(part) <= 255:
                raise _fail(name, value, f"{part!r} is not an exit code 0-255")
            codes.append(int(part))
        return tuple(codes)

    return parse


def fraction(name: str) -> Parser:

    def parse(value: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise _fail(name, value, "expected a number between 0 and 1") from None
        if not 0.0 <= number <= 1.0:
            raise _fail(name, value, "must be between 0 and 1")
        return number

    parse.bounds = "[0..1]"  # type: ignore[attr-defined]
    return parse


# ---- the launch's shape --------------------------------------------------------------------------


def parse_nnodes(text: str) -> tuple[int, int]:
    parts = text.split(":")
    try:
        if len(parts) == 1:
            low = high = int(parts[0])
        elif len(parts) == 2:
            low, high = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise ConfigError(f"--nnodes: expected N or MIN:MAX with integers (got {text!r})") from None
    if not 0 < low <= high:
        raise ConfigError(f"--nnodes: need 0 < MIN <= MAX (got {text!r})")
    if high > MAX_NODES:
        raise ConfigError(f"--nnodes: at most {MAX_NODES} nodes (got {text!r})")
    return low, high


def parse_nproc(text: str, device_count: Callable[[str], int]) -> int:
    text = text.strip()
    count = whole(text)
    if count is not None and count > MAX_NPROC:
        raise ConfigError(f"--nproc-per-node: at most {MAX_NPROC} workers per node (got {text!r})")
    if count is not None and count > 0:
        return count
    if text in ("cpu", "auto", "gpu", "xpu"):
        count = device_count(text)
        if count < 1:
            raise ConfigError(f"--nproc-per-node {text}: no {text} devices found on this machine")
        return count
    raise ConfigError(f"--nproc-per-node: expected a positive integer, auto, cpu, gpu or xpu (got {text!r})")


def parse_endpoint(endpoint: str) -> tuple[str, int | None]:
    host, sep, port = endpoint.rpartition(":")
    if not sep:
        return endpoint, None
    if whole(port) is None or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--rdzv-endpoint: bad port in {endpoint!r}; expected HOST:PORT")
    return host.strip("[]"), int(port)


def parse_std(flag: str, text: str) -> StdSpec:
    text = text.strip()
    try:
        if ":" not in text:
            value = int(text or "0")
            if value not in (0, 1, 2, 3):
                raise ValueError
            return StdSpec(default=value)
        per_rank = {}
        for part in text.split(","):
            rank, _, value_text = part.partition(":")
            if int(value_text) not in (0, 1, 2, 3):
                raise ValueError
            per_rank[int(rank)] = int(value_text)
        return StdSpec(per_rank=per_rank)
    except ValueError:
        raise ConfigError(f"{flag}: expected 0-3 or LOCAL_RANK:0-3,... (got {text!r})") from None


def parse_ranks_filter(text: str) -> frozenset[int] | None:
    if not text:
        return None
    ranks = [whole(r.strip()) for r in text.split(",")]
    if None in ranks:
        raise ConfigError(f"--local-ranks-filter: expected local ranks like 0,1,2 (got {text!r})")
    return frozenset(r for r in ranks if r is not None)


def parse_seconds_env(name: str, raw: str) -> float:
    try:
        seconds = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if not 0 <= seconds <= LARGEST:  # also refuses NaN
        raise ConfigError(f"{name}={raw!r}: need a number of seconds from 0 to {LARGEST}")
    return seconds

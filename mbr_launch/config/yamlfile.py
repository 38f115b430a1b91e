"""Read a YAML file a person handed us, safely: a regular file of bounded size, UTF-8 text, plain data.

Every way it can be wrong is one ``ConfigError`` line that names the file (and line:column for a syntax error).
The file is opened by ``report.untrusted``'s ``LINKED`` rules, so a FIFO or device, even one swapped in after a
check, cannot block or flood us; a duplicate key is an error, as YAML would silently keep the last one."""

from __future__ import annotations

import functools
import stat
from typing import TYPE_CHECKING, Any

from mbr_launch.config.errors import ConfigError
from mbr_launch.report.untrusted import LINKED, FileRule, UnsafeFile, read_file

if TYPE_CHECKING:
    import yaml

MAX_BYTES = 16 * 1024 * 1024

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a device"),
          (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


@functools.lru_cache(maxsize=None)
def _loader() -> type:
    """PyYAML's safe loader, except that a key given twice in one mapping is an error. Made on first use: most
    launches read no config file, and importing PyYAML costs start-up time."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the base class reports it
                    break
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice", key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def _read_bytes(path: str, what: str) -> bytes:
    try:
        return read_file(path, LINKED, MAX_BYTES)
    except FileNotFoundError:
        raise ConfigError(f"{what}: file {path} does not exist") from None
    except UnsafeFile as err:
        if err.rule in (FileRule.SIZE, FileRule.GREW):
            raise ConfigError(f"{what}: {path} is larger than {MAX_BYTES // (1024 * 1024)} MiB; "
                              "is it really the YAML config?") from None
        mode = err.st.st_mode if err.st is not None else 0
        kind = next((kind for test, kind in _KINDS if test(mode)), None)
        if kind:
            raise ConfigError(f"{what}: {path} is {kind}, not a file; give the path of a YAML file") from None
        raise ConfigError(f"{what}: {path} is not a regular file; give the path of a YAML file") from None
    except OSError as err:
        raise ConfigError(f"{what}: cannot read {path}: {err.strerror or err}") from None


def _syntax_error(path: str, what: str, err: yaml.YAMLError) -> ConfigError:
    """``FILE:LINE:COL: problem`` on one line (PyYAML's own message spans several)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or getattr(err, "context", None) or str(err)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
    return ConfigError(f"{what}: {where}: {' '.join(str(problem).split())} (YAML error)")


def read_yaml(path: str, *, what: str = "--config") -> Any:
    """The data in the YAML file at ``path``; ``what`` (the flag) starts every error message."""
    raw = _read_bytes(path, what)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{what}: {path} is not UTF-8 text (byte {raw[err.start]:#04x} at offset {err.start}); "
                          "give the path of a YAML file") from None
    if "\0" in text:
        raise ConfigError(f"{what}: {path} holds a NUL byte, so it is not a text file; give the path of a YAML file")
    import yaml

    try:
        return yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        raise _syntax_error(path, what, err) from None
    except RecursionError:
        raise ConfigError(f"{what}: {path} is nested too deeply to be a config") from None

"""The YAML config file (``--config``): mbr-launch's own section, ft_launcher's, and Megatron-Bridge's.

The Bridge section names live here, the lowest layer that needs them (``doctor.mbridge`` imports them).
``read_yaml`` reads any YAML file a person hands us; every way it can be wrong is one ``ConfigError`` line
that names the file. It is opened by ``report.untrusted``'s ``LINKED`` rules, so a FIFO or device, even one
swapped in after a check, cannot block or flood us; a duplicate key, which YAML would silently drop, is an error."""

from __future__ import annotations

import difflib
import functools
import stat
from typing import Any

from mbr_launch.config.errors import ConfigError
from mbr_launch.config.parse import comma_list
from mbr_launch.config.settings import BY_FT_KEY, BY_NAME, Setting
from mbr_launch.report.untrusted import LINKED, FileRule, UnsafeFile, read_file

# Megatron-Bridge ConfigContainer sections with resiliency meaning, checked key by key by the doctor.
BRIDGE_STRICT_SECTIONS = frozenset({"ft", "nvrx_straggler", "straggler", "inprocess_restart", "rerun_state_machine"})
# Sections with a few resiliency fields among many training ones.
BRIDGE_LOOSE_SECTIONS = frozenset({"checkpoint", "train", "dist"})
# ConfigContainer's other sections: known, not about resiliency, so not inspected.
BRIDGE_OTHER_SECTIONS = frozenset(
    "rng model optimizer optimizer_config_override_provider ddp validation scheduler dataset logger tokenizer "
    "profiling peft comm_overlap mixed_precision tensor_inspect env_vars".split())
BRIDGE_IGNORED_KEYS = frozenset({"_target_", "_partial_"})  # Hydra-style markers Bridge writes into YAML
OWN_SECTIONS = frozenset({"mbr_launch", "fault_tolerance"})


# Top-level keys a Megatron-Bridge config may have (mbr-launch's own file may carry them too).
BRIDGE_KEYS = BRIDGE_STRICT_SECTIONS | BRIDGE_LOOSE_SECTIONS | BRIDGE_OTHER_SECTIONS | BRIDGE_IGNORED_KEYS


def load_config_file(path: str) -> dict[str, Any]:
    """Read our YAML file: an ``mbr_launch:`` section and/or ft_launcher's ``fault_tolerance:``, at the top or, as
    NVRx finds it, inside another section. Unknown keys are errors that name the key and say what to do."""
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config: {path} must hold a mapping with 'mbr_launch:' and/or 'fault_tolerance:'")
    found = find_fault_tolerance(data)
    sections = {key: section for key, section in data.items() if key == "mbr_launch"}
    if found is not None:
        sections[found[0]] = found[1]
    holder = found[0].split(".")[0] if found is not None else None  # the key the section was found in
    for key in data:
        if key not in OWN_SECTIONS and key not in BRIDGE_KEYS and str(key) != holder:
            _check_top_level(key, path, carried=found is not None)
    values: dict[str, Any] = {}
    for where, section in sections.items():
        if section is None:
            continue
        if not isinstance(section, dict):
            raise ConfigError(f"--config: '{where}' in {path} must be a mapping")
        for name, value in section.items():
            setting = _setting(where, name, path)
            problem = _value_problem(value, list_ok=setting.parse is comma_list or isinstance(setting.default, tuple)
                                     or getattr(setting.parse, "takes_list", False),
                                     mapping_ok=setting.name == "section_timeouts")
            if problem:
                raise ConfigError(f"--config: '{where}.{name}' in {path} {problem}")
            values[setting.name] = value
    return values


def find_fault_tolerance(data: Any, where: str = "") -> tuple[str, Any] | None:
    """(dotted path, section) of the ``fault_tolerance`` section as NVRx's ``_find_fault_tol_section`` finds it:
    the top level's, even when empty, else the first non-empty one in a depth-first walk of mappings and lists."""
    if isinstance(data, dict):
        if "fault_tolerance" in data:
            return f"{where}fault_tolerance", data["fault_tolerance"]
        items: list[tuple[str, Any]] = [(f"{where}{key}.", value) for key, value in data.items()]
    elif isinstance(data, list):
        items = [(f"{where}{i}.", value) for i, value in enumerate(data)]
    else:
        return None
    for prefix, value in items:
        found = find_fault_tolerance(value, prefix)
        if found is not None and found[1]:
            return found
    return None


def _check_top_level(key: Any, path: str, *, carried: bool) -> None:
    """A top-level key that is none of ours: left alone beside a carried ft_launcher section (as NVRx does) unless
    it looks like a misspelt name of ours; an error in a file without that section."""
    known = sorted(OWN_SECTIONS if carried else OWN_SECTIONS | BRIDGE_KEYS)
    guess = difflib.get_close_matches(str(key), known, n=1, cutoff=0.8)
    if carried and not guess:
        return
    hint = f" (did you mean {guess[0]!r}?)" if guess else ""
    raise ConfigError(f"--config: unknown top-level key {key!r} in {path}{hint}; expected 'mbr_launch', "
                      "'fault_tolerance' or a Megatron-Bridge section (ft, inprocess_restart, ...)")


def _setting(where: str, name: Any, path: str) -> Setting:
    """The setting that ``name`` of section ``where`` sets. NVRx ignores unknown keys; here they are errors, so that
    a misspelt one cannot leave a timeout at its default."""
    key = str(name).replace("-", "_")
    ft = where != "mbr_launch"
    setting = (BY_FT_KEY if ft else BY_NAME).get(key)
    if setting is not None and setting.name != "config":
        return setting
    other = BY_NAME.get(key) if ft else BY_FT_KEY.get(key)
    if ft and other is not None and other.name != "config":
        why = (f"{key} is not a fault_tolerance key of any ft_launcher (NVRx would ignore it there); move it to the "
               f"'mbr_launch:' section or pass {other.flag}")
    elif not ft and other is not None:
        why = f"that is ft_launcher's name: write '{other.name}' here, or move it to 'fault_tolerance:'"
    else:
        names = BY_FT_KEY if ft else BY_NAME
        guess = difflib.get_close_matches(key, list(names), n=1, cutoff=0.75)
        why = (f"did you mean {guess[0]!r}? " if guess else "") + \
            ("NVRx ignores unknown keys, mbr-launch refuses them so that a misspelt key cannot leave a setting at "
             "its default: fix or remove it (docs/options.md lists every key)")
    raise ConfigError(f"--config: unknown key '{where}.{name}' in {path}: {why}")


_SCALARS = (str, int, float, bool)


def _value_problem(value: Any, *, list_ok: bool, mapping_ok: bool) -> str | None:
    """Why a config value is not plain data this setting can take, or None. Anything else would become its repr,
    and YAML aliases to nested lists would multiply into gigabytes of text."""
    if value is None or isinstance(value, _SCALARS):
        return "holds a NUL character" if isinstance(value, str) and "\0" in value else None
    if list_ok and isinstance(value, list) and all(isinstance(v, _SCALARS) for v in value):
        return next((p for p in (_value_problem(v, list_ok=False, mapping_ok=False) for v in value) if p), None)
    if mapping_ok and isinstance(value, dict) and all(
            isinstance(k, str) and (v is None or isinstance(v, _SCALARS)) for k, v in value.items()):
        return None
    shape = ["text or a number"] + ["a list of them"] * list_ok + ["a mapping of section: seconds"] * mapping_ok
    return f"must be {' or '.join(shape)}, not {type(value).__name__} (quote a value to make it text)"


# ---- reading a YAML file a person handed us: a regular file of bounded size, UTF-8 text, plain data ----

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


def read_yaml(path: str, *, what: str = "--config") -> Any:
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
    except yaml.YAMLError as err:  # FILE:LINE:COL: problem, on one line (PyYAML's own spans several)
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        problem = getattr(err, "problem", None) or getattr(err, "context", None) or str(err)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        raise ConfigError(f"{what}: {where}: {' '.join(str(problem).split())} (YAML error)") from None
    except RecursionError:
        raise ConfigError(f"{what}: {path} is nested too deeply to be a config") from None

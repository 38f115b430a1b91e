"""The YAML config file (``--config``): mbr-launch's own section, ft_launcher's, and the Megatron-Bridge
sections the same file may carry.

The Bridge section names live here, the lowest layer that needs them: the loader must accept them, and
``doctor.mbridge`` (which checks their contents) imports them from here rather than config reaching up.
"""

from __future__ import annotations

from typing import Any

from mbr_launch.config.errors import ConfigError
from mbr_launch.config.parse import comma_list
from mbr_launch.config.settings import BY_FT_KEY, BY_NAME
from mbr_launch.config.yamlfile import read_yaml

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


def bridge_sections() -> frozenset[str]:
    """Top-level keys a Megatron-Bridge config may have (mbr-launch's own file may carry them too)."""
    return BRIDGE_STRICT_SECTIONS | BRIDGE_LOOSE_SECTIONS | BRIDGE_OTHER_SECTIONS | BRIDGE_IGNORED_KEYS


def load_config_file(path: str) -> dict[str, Any]:
    """Read our YAML file: an ``mbr_launch:`` section of settings and/or ``fault_tolerance:`` as ft_launcher
    writes it. Unknown keys are errors that name the key."""
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config: {path} must hold a mapping with 'mbr_launch:' and/or 'fault_tolerance:'")
    values: dict[str, Any] = {}
    for key, section in data.items():
        if key not in OWN_SECTIONS:
            if key in bridge_sections():
                continue  # Megatron-Bridge resiliency settings: checked by the doctor preflight
            raise ConfigError(f"--config: unknown top-level key {key!r} in {path}; expected 'mbr_launch', "
                              "'fault_tolerance' or a Megatron-Bridge section (ft, inprocess_restart, ...)")
        if section is None:
            continue
        if not isinstance(section, dict):
            raise ConfigError(f"--config: '{key}' in {path} must be a mapping")
        table = BY_NAME if key == "mbr_launch" else BY_FT_KEY
        for name, value in section.items():
            setting = table.get(str(name).replace("-", "_"))
            if setting is None or setting.name == "config":
                raise ConfigError(f"--config: unknown key '{key}.{name}' in {path}")
            problem = _value_problem(value, list_ok=setting.parse is comma_list or isinstance(setting.default, tuple),
                                     mapping_ok=setting.name == "section_timeouts")
            if problem:
                raise ConfigError(f"--config: '{key}.{name}' in {path} {problem}")
            values[setting.name] = value
    return values


_SCALARS = (str, int, float, bool)


def _value_problem(value: Any, *, list_ok: bool, mapping_ok: bool) -> str | None:
    """Why a config value is not plain data this setting can take, or None: text or a number; a list of
    them for list settings; a mapping for section timeouts. Anything else would be turned into its repr
    (an id "{'a': 1}"), and aliases to nested lists would multiply into gigabytes of text."""
    if value is None or isinstance(value, _SCALARS):
        return "holds a NUL character" if isinstance(value, str) and "\0" in value else None
    if list_ok and isinstance(value, list) and all(isinstance(v, _SCALARS) for v in value):
        return next((p for p in (_value_problem(v, list_ok=False, mapping_ok=False) for v in value) if p), None)
    if mapping_ok and isinstance(value, dict) and all(
            isinstance(k, str) and (v is None or isinstance(v, _SCALARS)) for k, v in value.items()):
        return None
    shape = ["text or a number"] + ["a list of them"] * list_ok + ["a mapping of section: seconds"] * mapping_ok
    return f"must be {' or '.join(shape)}, not {type(value).__name__} (quote a value to make it text)"

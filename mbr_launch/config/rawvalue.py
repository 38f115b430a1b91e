"""Checks on a setting's raw value before its parser sees it: where it came from can make it unusable.

An empty environment variable is an error unless the default is empty too (torchrun fails on
``PET_NPROC_PER_NODE=''``); bytes that are not UTF-8 are refused except in file names (torch's store refuses
them deep inside the rendezvous); a YAML null is unset, 'none' or an error, per setting."""

from __future__ import annotations

from typing import Any, Mapping

from mbr_launch.config.errors import SettingError

# Settings whose values are file names: those may hold any bytes the file system allows.
PATH_SETTINGS = frozenset({"log_dir", "config", "pci_topo_file", "link_down_path_template", "link_state_path_template",
                           "storage_health_check_path", "segment_health_check_dir", "checkpoint_iteration_file",
                           "per_cycle_applog_prefix", "cycle_info_dir", "nvrx_logfile", "log_server_log_prefix",
                           "attribution_llm_api_key_file"})


def env_name(setting: Any, default: str, environ: Mapping[str, str]) -> str | None:
    for name in setting.envvars:
        value = environ.get(name)
        if value is None or (value == "" and default == ""):
            continue
        if value == "":
            raise SettingError(f"{name} is set but empty; unset it or give it a value for {setting.flag} "
                               f"(default: {default})")
        return name
    return None


def pet_switch(setting: Any, name: str, raw: str) -> str:
    """torchrun reads a switch's ``PET_`` variable as ``bool(int(value))`` (``PET_STANDALONE=2`` runs standalone);
    other words are left to the switch's own reading."""
    if not (name.startswith("PET_") and setting.kind is bool and not setting.valued):
        return raw
    try:
        return "true" if int(raw) else "false"
    except ValueError:
        return raw


def check_text(setting: Any, raw: Any) -> None:
    if isinstance(raw, str) and setting.name not in PATH_SETTINGS:
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:
            raise SettingError(f"{setting.flag}: the value is not valid UTF-8 text (got {raw!r})") from None


def null_value(setting: Any, default: str) -> Any:
    if setting.default is None:
        return None
    if setting.parse is not None and getattr(setting.parse, "takes_none", False):
        return setting.parse(None)
    raise SettingError(f"{setting.flag}: needs a value, not null (leave the key out for the default, {default!r})")


def source_hint(source: str) -> str:
    """Where a bad value came from, for the end of its error message (nothing for the command line)."""
    if source.startswith("env:"):
        return f" (from the environment variable {source[4:]})"
    return " (from the config file)" if source == "config" else ""

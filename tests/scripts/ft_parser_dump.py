"""Dump the installed NVRx's ft_launcher command line and FaultToleranceConfig as JSON, for
``tests/test_ft_flag_parity.py`` (run with one NVRx version on PYTHONPATH: two cannot share a process).

stdin: {"probes": [argv, ...], "candidates": [value, ...]}. stdout: {"version", "actions", "fields", "defaults",
"yaml", "probes", "samples"}:
- actions: every option's strings, nargs, choices, default, dest and whether it is a switch;
- fields / defaults: FaultToleranceConfig's fields in order and their defaults; yaml: ``to_yaml_file``'s text;
- probes: per argv, the FaultToleranceConfig ``from_args`` makes of it (or the error);
- samples: per value-taking option, the first candidate value ft_launcher takes: its parser, ``from_args``, and
  the checks its launcher makes at start for a few options (absolute paths, boolean-like text), read from
  ``config_from_args`` of NVRx 0.6/0.7.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
import warnings

warnings.simplefilter("ignore")

from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig  # noqa: E402
from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser  # noqa: E402


def _plain(value):
    if isinstance(value, signal.Signals):
        return value.name
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return repr(value)


def _cfg(cfg: FaultToleranceConfig) -> dict:
    return {f.name: _plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def _later_check(dest: str, value: str) -> None:
    """What ft_launcher 0.6/0.7 refuses at start (config_from_args / _validate_args) though its parser took it."""
    if dest in ("ft_per_cycle_applog_prefix", "ft_segment_health_check_dir", "ft_nvrx_logfile") \
            and not os.path.isabs(value):
        raise ValueError("must be absolute")
    if dest == "ft_storage_healthcheck_path" and any(not p.strip().startswith("/") for p in value.split(",")
                                                     if p.strip()):
        raise ValueError("must be absolute")
    if dest == "ft_enable_dist_storage_healthcheck" and value.strip().lower() not in (
            "true", "1", "yes", "false", "0", "no", ""):
        raise ValueError("boolean-like only")


def dump(request: dict) -> dict:
    """The dump for ``request`` (see the module docstring), of the NVRx this process imports."""
    parser = get_args_parser()
    actions = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    out: dict = {"version": None, "actions": [], "probes": [], "samples": {}}
    try:
        from importlib.metadata import version

        out["version"] = version("nvidia-resiliency-ext")
    except Exception:
        pass
    for a in actions:
        out["actions"].append({"strings": a.option_strings, "dest": a.dest, "switch": a.nargs == 0,
                               "choices": list(a.choices) if a.choices else None, "default": _plain(a.default)})
    fields = dataclasses.fields(FaultToleranceConfig)
    out["fields"] = [f.name for f in fields]
    out["defaults"] = _cfg(FaultToleranceConfig())
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ft.yaml")
        FaultToleranceConfig().to_yaml_file(path)
        with open(path) as f:
            out["yaml"] = f.read()
    for argv in request["probes"]:
        try:
            args = parser.parse_args([*argv, "train.py"])
            out["probes"].append({"cfg": _cfg(FaultToleranceConfig.from_args(args)), "ns": _plain(vars(args))})
        except (SystemExit, Exception) as err:  # noqa: BLE001 - the probe records what ft_launcher refuses
            out["probes"].append({"error": f"{type(err).__name__}: {err}"})
    for a in actions:
        if a.nargs == 0:
            continue
        for value in [*(a.choices or ()), *request["candidates"]]:
            try:
                args = parser.parse_args([a.option_strings[0], str(value), "train.py"])
                FaultToleranceConfig.from_args(args)
                _later_check(a.dest, str(value))
            except (SystemExit, Exception):  # noqa: BLE001
                continue
            out["samples"][a.option_strings[0]] = str(value)
            break
    return out


if __name__ == "__main__":
    # argparse prints usage errors to stderr; keep stdout for the JSON alone.
    sys.stderr = open(os.devnull, "w")
    print(json.dumps(dump(json.load(sys.stdin))))

"""The Python API under the CLI: keyword-only, one validated config object, then the agent."""

from __future__ import annotations

import os
from typing import Any, Mapping

from .config import ConfigError, LaunchConfig, build_config, load_config_file
from .settings import SettingError, resolve


def build_launch_config(*, cli: Mapping[str, Any], script: str | None, script_args: tuple[str, ...] = (),
                        environ: Mapping[str, str] | None = None) -> LaunchConfig:
    """Resolve every setting (command line > environment > config file > default) and validate."""
    environ = os.environ if environ is None else environ
    try:
        config_path = cli.get("config") or environ.get("MBR_CONFIG") or environ.get("PET_FT_CFG_PATH") or None
        file_values = load_config_file(config_path) if config_path else {}
        resolved = resolve(cli, environ, file_values)
    except SettingError as err:
        raise ConfigError(str(err)) from None
    return build_config(resolved, script=script, script_args=script_args, environ=environ)


def launch(cfg: LaunchConfig, *, environ: Mapping[str, str] | None = None) -> int:
    """Run this node's agent until the job ends; returns the launcher's exit code (see exitcodes).

    ``environ`` is what the workers inherit (default: this process's environment)."""
    from .agent import Agent

    return Agent(cfg, environ=dict(environ) if environ is not None else None).run()

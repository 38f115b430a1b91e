"""The two ways input can be wrong; both reach people as one line and exit code 2 (report.exitcodes.USAGE)."""

from __future__ import annotations


class SettingError(ValueError):
    """A setting has a value we cannot use; the message says which and what to do."""


class ConfigError(ValueError):
    """Bad input: the message says what is wrong and what to do."""

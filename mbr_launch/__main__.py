"""``python -m mbr_launch`` is ``mbr-launch``."""

from .cli import entry

entry()

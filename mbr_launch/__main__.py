"""``python -m mbr_launch`` is ``mbr-launch``."""

from mbr_launch.cli.app import entry

entry()

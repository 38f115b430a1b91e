"""``python -m mbr_launch`` is ``mbr-launch``."""

from mbr_launch.cli.entry import entry

entry()

"""mbr-launch: a fault-tolerant, drop-in replacement for torchrun.

Kept import-light on purpose: workers import ``mbr_launch.shim.boot`` before the user's script, so nothing
here may pull in torch, typer or rich.
"""

__version__ = "0.1.0"

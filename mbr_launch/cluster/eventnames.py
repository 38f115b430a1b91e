"""A cheap name for each of torch's rendezvous events.

torch names each rendezvous event with ``get_method_name()``, which calls ``inspect.stack()`` (reads source
files): most of a crowded join's CPU. ``install`` swaps in the same answer from ``sys._getframe``.
"""

from __future__ import annotations

import sys

from mbr_launch.cluster import torch_internals
from mbr_launch.cluster.torch_internals import Patch


def install() -> Patch:
    """Replace torch's ``get_method_name``; the record says whether it took."""
    return torch_internals.replace_event_names(get_method_name)


def get_method_name(depth: int = 2) -> str:
    # Frame 0 is this function, as inspect.stack()[0] is torch's own: the same frame ``depth`` up.
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # a stack shallower than depth
        return "no_method_name"

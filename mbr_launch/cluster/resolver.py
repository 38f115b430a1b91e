"""The agent's own DNS resolver settings: a lost query costs one second, not five (docs/performance.md).

torch's store client reverse-resolves every socket it opens (pytorch#159007), and all agents connect at the
same moments, so a resolver dropping part of the burst held up every round by glibc's 5 s retry.
"""

from __future__ import annotations

from typing import MutableMapping

AGENT_RES_OPTIONS = "timeout:1 attempts:5"


def quick_retries(environ: MutableMapping[str, str]) -> None:
    """Give this process's resolver quick retries unless the user chose resolver options."""
    environ.setdefault("RES_OPTIONS", AGENT_RES_OPTIONS)

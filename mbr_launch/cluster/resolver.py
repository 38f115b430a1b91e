"""The agent's own DNS resolver settings: a lost query costs one second, not five.

torch's store client names every socket it opens with a reverse lookup (``getnameinfo``; pytorch#159007),
and the address it connects to is a mapped ``::ffff:`` one, which /etc/hosts never answers, so each new
store connection asks DNS. All agents of a job open theirs at the same moments (the join, the start of every
round), and a resolver that drops part of such a burst (measured here: 41 of 64 simultaneous lookups lost
their first packet) makes glibc wait its default 5 s before asking again: one late agent holds up a round of
every agent (seen: every agent's join took 6 s instead of 1.2 s in 2 of 3 launches of 32 agents).

With ``timeout:1 attempts:5`` a lost packet is asked again after 1 s (64 at once: worst 1.0 s instead of 5.0 s),
and a resolver that answers late still answers within the same total patience (5 x 1 s; glibc's default is
2 x 5 s). ``RES_OPTIONS`` adds to /etc/resolv.conf's options for this process only; a ``RES_OPTIONS`` the user
set is kept as it is, and the workers get the user's environment, not this.
"""

from __future__ import annotations

from typing import MutableMapping

AGENT_RES_OPTIONS = "timeout:1 attempts:5"


def quick_retries(environ: MutableMapping[str, str]) -> None:
    """Give this process's resolver quick retries unless the user chose resolver options."""
    environ.setdefault("RES_OPTIONS", AGENT_RES_OPTIONS)

"""Secrets kept out of what we write: the value of any flag whose name says it holds one.

The launcher's command line (its own flags and the script's) goes into ``events.jsonl``; an
``--api-key VALUE`` or ``--hf_token=VALUE`` there would be a leaked credential, so such values are
replaced, in both spellings. The environment is never written anywhere.
"""

from __future__ import annotations

import re
from typing import Sequence

REDACTED = "<redacted>"
# A flag's name (without its dashes) that contains one of these words holds a secret.
_SECRET = re.compile(r"token|key|secret|passw(or)?d", re.IGNORECASE)


def is_secret_flag(arg: str) -> bool:
    """``--api-key``, ``-password``, ``--HF_TOKEN`` (not a bare word, not a negative number)."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return False
    return bool(_SECRET.search(arg.lstrip("-")))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of every secret flag replaced by ``<redacted>``.

    ``--flag=value`` keeps its name; in ``--flag value`` the next word is replaced unless it is itself a long
    option (a boolean flag such as ``--use-token-cache`` then hides nothing). When in doubt a word is
    redacted: a word too many costs less than a leaked key."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        name, eq, _value = arg.partition("=")
        if is_secret_flag(name):
            if eq:
                out.append(f"{name}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


__all__ = ["REDACTED", "is_secret_flag", "redact_argv"]

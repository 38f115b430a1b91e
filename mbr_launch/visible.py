"""Text that came from outside the launcher, made safe to show on a terminal or to write into one line.

A raw control character can move the cursor, erase the launcher's lines or forge a ``[mbr-launch host] HANG:``
line; a bidi override can make a line read differently. Each is written as its Python escape instead.
"""

from __future__ import annotations

import re

# C0 controls (tab and newline: the caller's choice), DEL, C1 controls, the Unicode characters that reorder or
# hide text (bidi, separators, zero-width), and lone surrogates (printing one raises UnicodeEncodeError).
_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ud800-\udfff\ufeff"
_IN_TEXT = re.compile(f"[{_UNSAFE}]")
_IN_LINE = re.compile(f"[{_UNSAFE}\t\n]")


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    return {"\t": "\\t", "\n": "\\n", "\r": "\\r"}.get(c) or (
        f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def truncated(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def visible(text: str, limit: int | None = None) -> str:
    """``text`` with every control and reordering character shown as its escape; tabs and newlines kept."""
    shown = _IN_TEXT.sub(_escape, text)
    return truncated(shown, limit) if limit is not None else shown


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` as one line: as :func:`visible`, with tabs and newlines escaped too."""
    shown = _IN_LINE.sub(_escape, text)
    return truncated(shown, limit) if limit is not None else shown


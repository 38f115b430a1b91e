"""Secrets kept out of what we write (``events.jsonl``, stack files, the leftover-process warning, ``mbr-launch
doctor``): the value of a flag, Hydra override or environment assignment whose name says it holds a secret,
URL credentials and ``Authorization:``/``Cookie:`` header values (docs/events.md lists the rules).
"""

from __future__ import annotations

import re
import shlex
from typing import Sequence

REDACTED = "<redacted>"

# A name's last whole word says whether its value is a secret (``--tokenizer``, ``--num-key-value-heads`` hold
# none). Not "session" or "pass": far more often a name and a count than a credential.
_WORDS = frozenset({"token", "key", "secret", "password", "passwd", "passphrase", "auth", "authorization",
                    "credential", "credentials", "creds", "bearer", "cookie", "cookies"})
# ... or ends with one of these, written as one word (``--apikey``, ``--hftoken``, ``clientSecret``).
_ENDINGS = ("token", "secret", "password", "passwd", "passphrase", "apikey", "accesskey", "privatekey",
            "secretkey", "authkey")
# Last words that only say how the secret is spelled: the word before them decides (``--token-value``).
_SPELLINGS = frozenset({"value", "str", "string", "text", "b64", "base64", "hex"})
# A word of a Hydra override or an environment assignment: ``[+|++|~]key=value``, the key dotted or a path.
_ASSIGN = re.compile(r"(?P<key>(?:\+\+|\+|~)?[A-Za-z_][\w\-./@]*)=(?P<value>.*)", re.DOTALL)
# The password of ``scheme://user:password@``; it may hold ``@`` (the last one before the path ends it).
_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^/?#@\s:]*:)[^/\s]*@")
# The user part alone of an http(s) URL: a token (``https://TOKEN@github.com``); ssh's ``git@host`` stays.
_HTTP_USER = re.compile(r"(?P<head>\b(?:git\+)?https?://)[^/?#@\s:]+@")
_HEADER = re.compile(r"(?P<head>^\s*(?:proxy-authorization|authorization|cookie|x-api-key|private-token)\s*:).+",
                     re.IGNORECASE | re.DOTALL)


def is_secret_name(name: str) -> bool:
    """``api-key``, ``HF_TOKEN``, ``trainer.wandb_key``, ``clientSecret`` (not ``no-token``: a switch)."""
    last = re.split(r"[./]", name.lstrip("-+~"))[-1]
    words = [w for w in re.split(r"[-_]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", last).lower()) if w]
    if words[:1] == ["no"]:
        return False
    while len(words) > 1 and words[-1] in _SPELLINGS:
        words.pop()
    return bool(words) and (words[-1] in _WORDS or words[-1].endswith(_ENDINGS))


def redact_text(text: str) -> str:
    """``text`` with URL passwords and an ``Authorization:`` header's value hidden."""
    if "://" in text:
        text = _HTTP_USER.sub(rf"\g<head>{REDACTED}@", _PASSWORD.sub(rf"\g<head>{REDACTED}@", text))
    return _HEADER.sub(rf"\g<head> {REDACTED}", text) if ":" in text else text


def _redact_word(arg: str) -> tuple[str, bool]:
    """(``arg`` without its secrets, whether the next word is a secret flag's value)."""
    if arg.startswith("-") and arg not in ("-", "--"):
        name, eq, value = arg.partition("=")
        if is_secret_name(name):
            return (f"{name}={REDACTED}", False) if eq else (arg, True)
        return name + eq + redact_text(value) if eq else arg, False
    assign = _ASSIGN.fullmatch(arg)
    if assign and is_secret_name(assign["key"]):
        return f"{assign['key']}={REDACTED}", False
    return redact_text(arg), False


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with every secret replaced by ``<redacted>``; after a bare secret flag, the next word unless it
    is a long option (``--use-token`` is a switch). In doubt, redact: a word too many costs less than a key."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        word, hide_next = _redact_word(arg)
        out.append(word)
    return out


# A shell word. An unclosed quote is an ordinary character, so a secret behind a stray quote is still found.
_SHELL_WORD = re.compile(r"""(?:[^\s'"\\]+|\\.?|'[^']*'|"(?:[^"\\]|\\.)*"|['"])+""", re.DOTALL)


def _unquoted(word: str) -> str:
    try:
        parts = shlex.split(word)
    except ValueError:  # an unbalanced quote: the word as it stands, its quotes left out
        return word.replace("'", "").replace('"', "")
    return parts[0] if len(parts) == 1 else word


def redact_command_line(text: str) -> str:
    """A command line as text (py-spy's, a process title) with its secrets hidden as :func:`redact_argv` hides
    them, the rest as it was. Text joined without quoting has lost where a value ends: only its first word is
    hidden after a secret flag."""
    spans = [(m.start(), m.end()) for m in _SHELL_WORD.finditer(text)]
    words = [_unquoted(text[a:b]) for a, b in spans]
    out, last = [], 0
    for (start, end), word, shown in zip(spans, words, redact_argv(words)):
        out.append(text[last:start])
        out.append(text[start:end] if shown == word else shown)
        last = end
    out.append(text[last:])
    return "".join(out)


_PROCESS_LINE = re.compile(r"^(Process \d+: )(.*)$", re.MULTILINE)


def redact_process_lines(text: str) -> str:
    """``text`` (py-spy's dump) with the secrets of each ``Process 1234: <command line>`` line hidden."""
    return _PROCESS_LINE.sub(lambda m: m[1] + redact_command_line(m[2]), text)


def shown_argv(argv: Sequence[str]) -> str:
    """A process's argv as one line without its secrets; a title rewritten as one string is read as a command line."""
    if len(argv) == 1 and " " in argv[0]:
        return redact_command_line(argv[0])
    return " ".join(redact_argv(argv))

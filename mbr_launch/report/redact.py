"""Secrets kept out of what we write: the value of any flag whose name says it holds one.

A command line reaches ``events.jsonl`` (the launcher's own), the stack files of a hung rank (py-spy's
``Process NNN: ...`` line), the leftover-process warning and ``mbr-launch doctor``'s list of other launches;
each is kept or shown longer, and to more people, than the process itself. What is hidden:

- the value of a flag whose name says it holds a secret, in both spellings: ``--api-key VALUE``,
  ``--hf_token=VALUE``, ``--trainer.logger.api_key=VALUE``;
- the value of a Hydra-style override or an environment assignment whose key says so:
  ``model.wandb.api_key=VALUE``, ``+trainer.wandb_key=VALUE``, ``HF_TOKEN=VALUE``;
- the password in a URL (``https://user:VALUE@host``, ``redis://:VALUE@host``), and the whole user part of an
  http(s) URL, which is a token in practice (``https://ghp_xxx@github.com``);
- the credentials of an ``Authorization:`` or ``Cookie:`` header given as one argument.

The environment is never written anywhere.
"""

from __future__ import annotations

import re
import shlex
from typing import Sequence

REDACTED = "<redacted>"

# A name's last word (``--hf-token``: "token") says whether its value is a secret. Whole words, not substrings:
# ``--tokenizer``, ``--max-tokens``, ``--keyframe`` and ``--num-key-value-heads 8`` hold none. Not "session" or
# "pass": a ``--session`` is a name and a ``--pass`` a count far more often than a credential.
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
    """``api-key``, ``HF_TOKEN``, ``trainer.wandb_key``, ``clientSecret``: the name of something that holds a secret
    (judged by its last dotted part's last word; ``no-token`` is a switch, not a value)."""
    last = re.split(r"[./]", name.lstrip("-+~"))[-1]
    words = [w for w in re.split(r"[-_]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", last).lower()) if w]
    if words[:1] == ["no"]:
        return False
    while len(words) > 1 and words[-1] in _SPELLINGS:
        words.pop()
    return bool(words) and (words[-1] in _WORDS or words[-1].endswith(_ENDINGS))


def is_secret_flag(arg: str) -> bool:
    """``--api-key``, ``-password``, ``--HF_TOKEN`` (not a bare word, not a negative number, not ``--tokenizer``)."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return False
    return is_secret_name(arg)


def redact_text(text: str) -> str:
    """``text`` (one word, or any text) with URL passwords and an ``Authorization:`` header's value hidden."""
    if "://" in text:
        text = _HTTP_USER.sub(rf"\g<head>{REDACTED}@", _PASSWORD.sub(rf"\g<head>{REDACTED}@", text))
    return _HEADER.sub(rf"\g<head> {REDACTED}", text) if ":" in text else text


def _redact_word(arg: str) -> tuple[str, bool]:
    """(``arg`` without its secrets, whether the next word is a secret flag's value)."""
    if arg.startswith("-") and arg not in ("-", "--"):
        name, eq, value = arg.partition("=")
        if is_secret_flag(name):
            return (f"{name}={REDACTED}", False) if eq else (arg, True)
        return name + eq + redact_text(value) if eq else arg, False
    assign = _ASSIGN.fullmatch(arg)
    if assign and is_secret_name(assign["key"]):
        return f"{assign['key']}={REDACTED}", False
    return redact_text(arg), False


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with every secret replaced by ``<redacted>``.

    ``--flag=value`` keeps its name; in ``--flag value`` the next word is replaced unless it is itself a long
    option (a boolean flag such as ``--use-token`` then hides nothing). When in doubt a word is redacted: a word
    too many costs less than a leaked key."""
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


# A shell word: unquoted characters, backslash escapes and quoted parts. A quote that is never closed (text cut
# short, a title a process wrote itself) is an ordinary character: the words after it are still read one by
# one, so a secret behind a stray quote is found all the same.
_SHELL_WORD = re.compile(r"""(?:[^\s'"\\]+|\\.?|'[^']*'|"(?:[^"\\]|\\.)*"|['"])+""", re.DOTALL)


def _unquoted(word: str) -> str:
    try:
        parts = shlex.split(word)
    except ValueError:  # an unbalanced quote: the word as it stands, its quotes left out
        return word.replace("'", "").replace('"', "")
    return parts[0] if len(parts) == 1 else word


def redact_command_line(text: str) -> str:
    """A command line given as text (py-spy's ``Process NNN: python train.py --api-key K``, a process title) with its
    secrets hidden as :func:`redact_argv` hides them; the rest, spacing and quotes included, as it was.

    Words are read as a shell would (quotes, backslashes) and an unbalanced quote is taken as it comes. Text
    joined from argv without quoting (py-spy's, ``ps``'s) has lost where a value with spaces ends: only its
    first word is hidden after a secret flag."""
    spans = [(m.start(), m.end()) for m in _SHELL_WORD.finditer(text)]
    words = [_unquoted(text[a:b]) for a, b in spans]
    out, last = [], 0
    for (start, end), word, shown in zip(spans, words, redact_argv(words)):
        out.append(text[last:start])
        out.append(text[start:end] if shown == word else shown)
        last = end
    out.append(text[last:])
    return "".join(out)


# A line of a report that names a process by its command line: py-spy's dump starts with one.
_PROCESS_LINE = re.compile(r"^(Process \d+: )(.*)$", re.MULTILINE)


def redact_process_lines(text: str) -> str:
    """``text`` (py-spy's dump) with the secrets of each ``Process 1234: <command line>`` line hidden."""
    return _PROCESS_LINE.sub(lambda m: m[1] + redact_command_line(m[2]), text)


def shown_argv(argv: Sequence[str]) -> str:
    """A process's argv (``/proc/PID/cmdline``) as one line to show, without its secrets. A process that rewrote its
    title as one string (``setproctitle``) has one word with spaces: it is read as a command line."""
    if len(argv) == 1 and " " in argv[0]:
        return redact_command_line(argv[0])
    return " ".join(redact_argv(argv))

"""The generated docs (man page, completions, options page, the tables of README.md and docs/events.md) match
``SETTINGS`` and work in real tools; every relative link of the Markdown pages resolves and README.md stays short.

Shell and man tests need zsh, fish, man-db and groff (Debian packages of the same names); each is skipped
with a reason when its tool is missing.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys

import pytest

from tools import docgen
from mbr_launch.config.settings import PANELS, SETTINGS, Setting

from .conftest import REPO

TIMEOUT = 30  # seconds for any one tool; the machine is shared, so be generous
pytestmark = pytest.mark.timeout(90)


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "LC_ALL": "C.UTF-8", **kwargs.pop("env", {})}
    return subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO, env=env, **kwargs)


def _need(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (apt-get install zsh fish man-db groff)")


# ---- drift ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [*docgen.RENDERERS, *docgen.REGIONS])
def test_committed_file_is_current(path: str):
    expected = docgen.expected_files(REPO)[path]
    assert (REPO / path).read_text() == expected, f"{path} is stale: run scripts/gen-docs"


def _with_help_changed(settings: tuple[Setting, ...]) -> tuple[Setting, ...]:
    return tuple(dataclasses.replace(s, help=s.help + " Changed.") if s.name == "nproc_per_node" else s
                 for s in settings)


def _with_alias_added(settings: tuple[Setting, ...]) -> tuple[Setting, ...]:
    return tuple(dataclasses.replace(s, flags=(*s.flags, "--nprocs")) if s.name == "nproc_per_node" else s
                 for s in settings)


@pytest.mark.parametrize(("change", "stale"), [
    (_with_help_changed, {"man/mbr-launch.1", "completions/_mbr-launch", "completions/mbr-launch.fish",
                          "docs/options.md"}),
    (_with_alias_added, {*docgen.RENDERERS}),
])
def test_drift_is_detected(monkeypatch, capsys, change, stale: set[str]):
    """Proves the drift test can fail: a changed declaration makes the committed files stale."""
    committed_man = (REPO / "man/mbr-launch.1").read_text()
    monkeypatch.setattr(docgen, "SETTINGS", change(SETTINGS))
    assert docgen.render_man() != committed_man
    assert set(docgen.stale_files(REPO)) == stale
    assert docgen.main(["--check"]) == 1
    assert "stale: man/mbr-launch.1" in capsys.readouterr().err


def test_write_touches_only_the_generated_regions(tmp_path):
    before, after = "# Title\n\nintro\n", "\n## Later\n\ntext <!-- events:start --> not a marker line\n"
    (tmp_path / "README.md").write_text(f"{before}<!-- exitcodes:start -->\nold exitcodes\n"
                                        f"<!-- exitcodes:end -->{after}")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/events.md").write_text(f"{before}<!-- events:start -->\nold events\n"
                                             "<!-- events:end -->\nend\n")
    assert docgen.main(["--check"], root=tmp_path) == 1
    assert docgen.main(["--write"], root=tmp_path) == 0
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith(before + "<!-- exitcodes:start -->\n")
    assert readme.endswith("<!-- exitcodes:end -->" + after)
    assert "old exitcodes" not in readme and "| `5` | preempted" in readme and "| `hang` |" not in readme
    events = (tmp_path / "docs/events.md").read_text()
    assert events.startswith(before + "<!-- events:start -->\n") and events.endswith("<!-- events:end -->\nend\n")
    assert "old events" not in events and "| `hang` |" in events and "| `5` | preempted" not in events
    options = (tmp_path / "docs/options.md").read_text()
    assert options.startswith("# mbr-launch options") and "`--nproc-per-node {N,auto,cpu,gpu,xpu}`" in options
    assert docgen.main(["--check"], root=tmp_path) == 0


def test_a_page_without_its_markers_is_named(tmp_path):
    (tmp_path / "README.md").write_text("<!-- exitcodes:start -->\n<!-- exitcodes:end -->\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/events.md").write_text("# Event log, its table lost\n")
    with pytest.raises(ValueError, match=r"docs/events.md lacks the markers <!-- events:start -->"):
        docgen.main(["--check"], root=tmp_path)


# ---- the Markdown pages: links that resolve, a README that stays short -------------------------------

README_MAX_LINES = 400
PAGES = ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))]
# [text](target) and [text]: target; a target with a scheme (https:, mailto:) or only an anchor is not a file.
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|^\s*\[[^\]]+\]:\s*(\S+)", re.M)
_CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.M | re.S)


def _targets(text: str) -> list[str]:
    """Every link target of a Markdown text, except those with a scheme; code spans and blocks are not looked in."""
    targets = (a or b for a, b in _LINK.findall(_CODE.sub("", text)))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def relative_links(text: str) -> list[str]:
    """The relative link targets of a Markdown text (files), anchors cut off."""
    return [t.split("#", 1)[0] for t in _targets(text) if not t.startswith("#")]


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown text's headings: lower case, punctuation but `-` and `_` dropped,
    spaces as `-`, a repeated one numbered (`-1`, `-2`)."""
    found: set[str] = set()
    times: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(f"{slug}-{times[slug]}" if slug in times else slug)
        times[slug] = times.get(slug, 0) + 1
    return found


def test_relative_links_are_found():
    text = ("[a](docs/a.md) [b](b.md#part) [c](https://x.org/c.md) [d](#anchor) [e](<e.md>)\n"
            "`[g](not/a/link.md)`\n```\n[h](nor/this.md)\n```\n[i]: ref.md\n[j](k.md \"title\")\n")
    assert relative_links(text) == ["docs/a.md", "b.md", "e.md", "ref.md", "k.md"]
    assert anchors("# Title\n## Which rank hung: the verdict\n```\n# not a heading\n```\n### `--x` (0.6/0.7)\n"
                   "## Part\n## Part\n") == {"title", "which-rank-hung-the-verdict", "--x-0607", "part", "part-1"}


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page: str):
    path = REPO / page
    broken = [t for t in relative_links(path.read_text()) if not (path.parent / t).exists()]
    assert not broken, f"{page} links to what does not exist: {broken}"


@pytest.mark.parametrize("page", PAGES)
def test_every_anchor_names_a_heading(page: str):
    path = REPO / page
    broken = []
    for target in _targets(path.read_text()):
        file, _, anchor = target.partition("#")
        linked = (path.parent / file) if file else path
        if anchor and linked.suffix == ".md" and linked.is_file() and anchor not in anchors(linked.read_text()):
            broken.append(target)
    assert not broken, f"{page} links to headings that do not exist: {broken}"


def test_every_doc_page_is_linked_from_the_readme():
    linked = {(REPO / t).resolve() for t in relative_links((REPO / "README.md").read_text())}
    unlinked = [p for p in PAGES[1:] if (REPO / p).resolve() not in linked]
    assert not unlinked, f"README.md does not link to {unlinked}"


def test_the_readme_stays_short():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"


# ---- the CLI agrees with the declaration ---------------------------------------------------------


def test_cli_parses_every_declared_flag():
    import typer

    from mbr_launch.cli.app import app

    command = typer.main.get_command(app)
    options = {p.name: set(p.opts) for p in command.params if p.name in {s.name for s in SETTINGS}}
    for setting in SETTINGS:
        assert options.get(setting.name) == set(setting.flags), setting.name
        value = "7" if setting.takes_value else None
        for flag in setting.flags:
            args = [flag, *([value] if value else []), "train.py"]
            context = command.make_context("mbr-launch", args)
            assert context.params[setting.name] == (value or True), (flag, context.params[setting.name])
            assert context.params["training_script"] == "train.py"


def _help_text() -> str:
    result = _run([sys.executable, "-m", "mbr_launch", "--help-all"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.processes
def test_help_groups_options_in_panels_in_order():
    text = _help_text()
    used = [p for p in PANELS if any(s.panel == p and not s.hidden for s in SETTINGS)]
    positions = [text.find(f"\n{panel}:\n") for panel in used]
    assert -1 not in positions, dict(zip(used, positions))
    shown = [used[positions.index(p)] for p in sorted(positions)]
    assert shown == used, f"panels out of order: {shown}"


@pytest.mark.processes
def test_help_shows_defaults_and_environment():
    text = _help_text()
    assert "MBR_NPROC_PER_NODE" in text and "[default: 1:1]" in text


# ---- real tools ----------------------------------------------------------------------------------


def _bash_complete(line: str) -> list[str]:
    script = ('source completions/mbr-launch.bash && complete -p mbr-launch >/dev/null || exit 9\n'
              'read -ra COMP_WORDS <<<"$1"; [[ $1 == *" " ]] && COMP_WORDS+=("")\n'
              'COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); _mbr_launch_complete; printf "%s\\n" "${COMPREPLY[@]}"')
    result = _run(["bash", "--norc", "--noprofile", "-c", script, "bash", line])
    assert result.returncode == 0 and not result.stderr, result
    return result.stdout.split()


def _twins(flags: list[str]) -> list[str]:
    """Flags offered together with their underscore twin (--max_restarts beside --max-restarts)."""
    return sorted(f for f in flags if "_" in f and f.replace("_", "-") in flags)


@pytest.mark.processes
def test_bash_completion():
    result = _run(["bash", "--norc", "-c", "source completions/mbr-launch.bash && complete -p mbr-launch"])
    assert result.returncode == 0 and "_mbr_launch_complete" in result.stdout, result
    offered = _bash_complete("mbr-launch --")
    assert len(offered) == len(set(offered)) and not _twins(offered), _twins(offered)
    assert not [f for f in offered if "_" in f], "underscore spellings are accepted, not offered"
    assert "--nproc-per-node" in offered and "--version" in offered and "--help-all" in offered
    # Values for every setting that has choices or suggestions, under every spelling of its flag.
    assert _bash_complete("mbr-launch --rdzv-backend ") == ["c10d", "static"]
    assert {"gpu", "cpu", "auto", "1", "8"} <= set(_bash_complete("mbr-launch --nproc-per-node "))
    assert {"gpu", "cpu", "auto"} <= set(_bash_complete("mbr-launch --nproc_per_node "))
    for setting in SETTINGS:
        if setting.suggestions and not setting.hidden:
            assert _bash_complete(f"mbr-launch {setting.flag} ") == list(setting.suggestions), setting.name
    assert "--status" in _bash_complete("mbr-launch --max_restarts 3 --sta")  # the alias's value is skipped
    assert _bash_complete("mbr-launch --start-method f") == ["fork", "forkserver"]
    assert _bash_complete("mbr-launch --start-method = f") == ["fork", "forkserver"]
    assert "doctor" in _bash_complete("mbr-launch do")
    assert "--skip-check" in _bash_complete("mbr-launch doctor --sk")
    assert {"--json", "--deep", "--verbose"} <= set(_bash_complete("mbr-launch doctor --"))
    assert _bash_complete("mbr-launch --nnodes 2 train.py --npr") == []  # the script's own arguments


@pytest.mark.processes
def test_zsh_completion_loads():
    _need("zsh")
    for script in ("autoload -U compinit; compinit -u; source completions/_mbr-launch; print $_comps[mbr-launch]",
                   "fpath=(completions $fpath); autoload -U compinit; compinit -u -D; print $_comps[mbr-launch]"):
        result = _run(["zsh", "-f", "-c", script])
        assert result.returncode == 0 and not result.stderr and result.stdout.strip() == "_mbr-launch", result


# Type a line into an interactive zsh on a pseudo-terminal, press TAB, and print what compadd was given.
_ZSH_CAPTURE = r"""
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "PROMPT=''; fpath=($PWD/completions \$fpath); autoload -U compinit; compinit -u -D"
zpty -w z 'compadd () { if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then builtin compadd "$@"; return; fi;
  local -a hits; builtin compadd -A hits "$@"; (( $#hits )) && print -rl -- MATCH:$^hits >/dev/tty;
  builtin compadd "$@"; }'
zpty -w z "zstyle ':completion:*' menu no; print -r -- REA''DY"
zpty -r -m z out '*READY*'
zpty -w -n z "$1"$'\t'
zpty -r -m z first '*MATCH:*'
zpty -w z $'\C-uprint -r -- DO\'\'NE'
zpty -r -m z out '*DONE*'
print -r -- "${first//$'\r'/}${out//$'\r'/}"
zpty -d z
"""


def _zsh_complete(line: str) -> set[str]:
    """What zsh offers for ``line``: every case here offers something, so the capture waits for the first match
    before it clears the line (a Ctrl-U typed while a loaded machine was still completing lost the matches)."""
    result = _run(["zsh", "-f", "-c", _ZSH_CAPTURE, "zsh", line])
    assert result.returncode == 0, result
    return set(re.findall(r"MATCH:(\S+)", result.stdout))  # terminal escapes may precede a match


@pytest.mark.processes
def test_zsh_completion_completes():
    _need("zsh")
    offered = _zsh_complete("mbr-launch --nproc")
    assert "--nproc-per-node" in offered and "--nproc_per_node" not in offered, offered  # one spelling
    assert _zsh_complete("mbr-launch --numa-binding ") == {"node", "socket", "exclusive", "core-complex"}
    assert _zsh_complete("mbr-launch --rdzv-backend ") == {"c10d", "static"}
    assert {"gpu", "cpu", "auto", "8"} <= _zsh_complete("mbr-launch --nproc-per-node ")
    assert "--json" in _zsh_complete("mbr-launch doctor --js")


@pytest.mark.processes
def test_fish_completion():
    _need("fish")
    result = _run(["fish", "-n", "completions/mbr-launch.fish"])
    assert result.returncode == 0 and not result.stderr, result
    result = _run(["fish", "--no-config", "-c", "source completions/mbr-launch.fish; complete -C'mbr-launch --nproc'"])
    assert result.returncode == 0 and not result.stderr, result
    assert {line.split("\t")[0] for line in result.stdout.splitlines()} == {"--nproc-per-node"}
    result = _run(["fish", "--no-config", "-c",
                   "source completions/mbr-launch.fish; complete -C'mbr-launch --rdzv-backend '"])
    assert {line.split("\t")[0] for line in result.stdout.splitlines()} == {"c10d", "static"}, result


@pytest.mark.processes
def test_man_page_renders():
    _need("man")
    _need("groff")
    result = _run(["groff", "-man", "-Tutf8", "-ww", "-z", "man/mbr-launch.1"])
    assert result.returncode == 0 and not result.stderr, result.stderr
    result = _run(["man", "-P", "cat", "-l", "man/mbr-launch.1"], env={"MANWIDTH": "100", "MANPAGER": "cat"})
    assert result.returncode == 0 and not result.stderr, result.stderr
    for needle in ("OPTIONS", "Fault tolerance", "--nproc-per-node", "EXIT STATUS", "MBR_NPROC_PER_NODE",
                   "--kill-on-bad-exit=0"):
        assert needle in result.stdout, needle

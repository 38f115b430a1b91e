"""Abbreviated long options (``cli.abbrev``): argparse's rules on the launch's real option table, no process.
Every torchrun option and prefix against torch's own parser: ``test_flag_parity``."""

from __future__ import annotations

import pytest

from mbr_launch.cli import app, plainline
from mbr_launch.cli.abbrev import AmbiguousOption, Spelling, expand, resolve
from mbr_launch.config.host import release

pytestmark = pytest.mark.timeout(60)

TABLE = plainline.SPELLINGS
T213, T214 = (lambda: (2, 13, 0)), (lambda: (2, 14, 1))


def _never() -> tuple[int, ...]:
    raise AssertionError("asked for torch's version without a prefix to resolve")


@pytest.mark.parametrize("argv,expanded", [
    # exact option strings: never a prefix of another; the version is not even asked
    (["--tee", "3", "t.py"], ["--tee", "3", "t.py"]),
    (["--status", "off", "t.py"], ["--status", "off", "t.py"]),
    (["--log_dir=/x", "t.py"], ["--log_dir=/x", "t.py"]),
    # the script and everything after it are the script's, options or not
    (["t.py", "--redir", "3", "--nproc=2"], ["t.py", "--redir", "3", "--nproc=2"]),
    (["--", "--redir", "t.py"], ["--", "--redir", "t.py"]),
    (["-", "--redir"], ["-", "--redir"]),
    (["", "--redir"], ["", "--redir"]),
    # an option's value is never matched, whatever it looks like
    (["--role", "--redir", "t.py"], ["--role", "--redir", "t.py"]),
    (["-r", "--tee", "t.py"], ["-r", "--tee", "t.py"]),
    # short options: argparse's -r3 and -mr3 are click's too; -r=3 is the value 3 to argparse, "=3" to click
    (["-r3", "-mr3", "t.py"], ["-r3", "-mr3", "t.py"]),
    (["-r=3", "t.py"], ["-r", "3", "t.py"]),
    # unknown options stay, for the parser's own message
    (["--bogus", "t.py"], ["--bogus", "t.py"]),
    (["-x", "t.py"], ["-x", "t.py"]),
    # a switch with =value stays for the parser to refuse, as argparse refuses it
    (["--standal=1", "t.py"], ["--standalone=1", "t.py"]),
])
def test_what_is_not_a_prefix_is_left_alone(argv, expanded):
    assert expand(argv, TABLE, _never if argv[0] in TABLE or not argv[0].startswith("--") else T213) == expanded


@pytest.mark.parametrize("argv,expanded", [
    (["--redirect=3", "--te", "3", "t.py"], ["--redirects=3", "--tee", "3", "t.py"]),
    (["--max_restart", "1", "t.py"], ["--max_restarts", "1", "t.py"]),  # torchrun's underscore spelling kept
    (["--nproc=2", "t.py"], ["--nproc-per-node=2", "t.py"]),  # both candidates spell one option
    (["--rdzv-e", "h:1", "--rdzv-b", "c10d", "t.py"], ["--rdzv-endpoint", "h:1", "--rdzv-backend", "c10d", "t.py"]),
    (["--role=a=b", "t.py"], ["--role=a=b", "t.py"]),  # cut at the first '='
    (["--he"], ["--help"]),  # torchrun's --help, though --heartbeat-timeout starts so too
    (["--peer-t", "5", "t.py"], ["--peer-timeout", "5", "t.py"]),  # ours: no torchrun option starts so
    (["--ft-rank-hea", "5", "t.py"], ["--ft-rank-heartbeat-timeout", "5", "t.py"]),
])
def test_a_prefix_is_its_option(argv, expanded):
    assert expand(argv, TABLE, T213) == expanded


def test_torchrun_options_win_over_ours():
    """--h: torchrun's --help, though --hang-kill-grace, --help-all, --heartbeat-timeout... start so too; --no:
    torchrun's --no-python and --node-rank, so ambiguous, and named as torchrun names them (not our
    --no-restart-exit-codes)."""
    assert expand(["--h"], TABLE, T213) == ["--help"]
    with pytest.raises(AmbiguousOption) as err:
        expand(["--no", "t.py"], TABLE, T213)
    assert err.value.candidates == ("--no-python", "--node-rank")


def test_what_torchrun_has_depends_on_the_installed_torch():
    """torch 2.14 adds --log-line-prefix-template: --log- is --log-dir to 2.13's torchrun, ambiguous to 2.14's."""
    assert expand(["--log-", "/d", "t.py"], TABLE, T213) == ["--log-dir", "/d", "t.py"]
    with pytest.raises(AmbiguousOption, match=r"--log- could match --log-dir, --log-line-prefix-template$"):
        expand(["--log-", "/d", "t.py"], TABLE, T214)


def test_an_ambiguous_prefix_names_its_candidates_once_each():
    with pytest.raises(AmbiguousOption) as err:
        expand(["--ma=1", "t.py"], TABLE, T213)
    assert str(err.value) == "ambiguous option: --ma=1 could match --master-addr, --master-port, --max-restarts"
    with pytest.raises(AmbiguousOption) as err:
        expand(["--ft", "t.py"], TABLE, T213)
    assert len(err.value.candidates) > 12 and str(err.value).endswith(f"and {len(err.value.candidates) - 12} more")


def test_resolve_on_a_table_of_its_own():
    table = {"--alpha": Spelling("a", True, (0,)), "--alpha-beta": Spelling("ab", False, (2, 14)),
             "--alps": Spelling("alps", False)}
    assert resolve("--alpha", table, _never) == "--alpha"  # exact wins over --alpha-beta
    # not torchrun 2.13's (added in 2.14), but the one option of all that starts so
    assert resolve("--alpha-", table, T213) == resolve("--alpha-", table, T214) == "--alpha-beta"
    assert resolve("--alp", table, T213) == "--alpha"  # torchrun's one candidate, though --alps starts so too
    with pytest.raises(AmbiguousOption):
        resolve("--alp", table, T214)
    assert resolve("--x", table, T213) is None and resolve("--", table, _never) is None


def test_the_plain_table_is_typers():
    assert plainline.SPELLINGS == app.spellings(app.launch_cli)


@pytest.mark.parametrize("text,version", [("2.14.1+cu130", (2, 14, 1)), ("2.15.0a0+git1", (2, 15, 0)),
                                          ("2.13.0", (2, 13, 0)), ("2", (2,)), ("nightly", (9999,))])
def test_torch_release(text, version):
    assert release(text) == version


@pytest.mark.parametrize("argv,code,line", [
    (["--ma=1", "t.py"], 2, "mbr-launch: error: ambiguous option: --ma=1 could match --master-addr, --master-port, "
                            "--max-restarts (see mbr-launch --help)"),
    # torchrun's two candidates named (not our --status, --standby...); the doctor's "could not run" code
    (["doctor", "--st", "t.py"], 3, "mbr-launch: error: ambiguous option: --st could match --standalone, "
                                    "--start-method (see mbr-launch doctor --help)"),
])
def test_an_ambiguous_prefix_is_one_line_and_a_usage_code(argv, code, line, capsys):
    assert app._dispatch(argv) == code
    err = capsys.readouterr().err.splitlines()
    assert err == [line]

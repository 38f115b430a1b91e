"""--rdzv-conf read as torchrun reads it: the split compared with torch's own parser, the values of the keys a backend
reads compared with how torch's ``RendezvousParameters`` reads them, and the one warning for the keys it does not."""

from __future__ import annotations

import dataclasses

import pytest
from torch.distributed.elastic.rendezvous.api import RendezvousParameters
from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

from mbr_launch.config.errors import ConfigError
from mbr_launch.config.rdzvconf import READ, check_rdzv_conf, parse_rdzv_conf
from mbr_launch.config.settings import resolve

from .test_config_build import OFFLINE, build

pytestmark = pytest.mark.timeout(60)

T213, T215 = (lambda: (2, 13, 0)), (lambda: (2, 15, 0))
QUOTED = "'join_timeout=5,last_call_timeout=1,timeout=5'"


@pytest.mark.parametrize("text", [
    "", "   ", "a=1", " a = 1 , b=2", "a=1=2", QUOTED, '"a=1"', "a=1,a=2", "a=,b=1", "a", "=1", "a=1,", ",a=1",
    "a=1,,b=2", "a= ", " , ", "join_timeout=5 ,last_call_timeout = 1", "k=v w", "é=ü",
])
def test_the_split_is_torchruns(text):
    try:
        theirs: dict | None = _parse_rendezvous_config(text)
    except ValueError:
        theirs = None
    try:
        ours: dict | None = parse_rdzv_conf(text)
    except ConfigError as err:
        assert "--rdzv-conf" in str(err)
        ours = None
    assert ours == theirs


def _torch_reads(key: str, how: str, value: str) -> bool:
    params = RendezvousParameters("c10d", "h:1", "id", 1, 1, **{key: value})
    try:
        if how == "int":
            return params.get_as_int(key) > 0  # and RendezvousTimeout / the read timeout refuse 0 and less
        if how == "bool":
            params.get_as_bool(key)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("value", ["5", "+5", "0", "-1", "5'", "abc", "1.5", "true", "T", "No", "Y", "maybe"])
@pytest.mark.parametrize("key,how", [(k, h) for k, h in READ["c10d"].items() if h in ("int", "bool")])
def test_a_value_is_taken_where_torch_takes_it(key, how, value):
    try:
        check_rdzv_conf({key: value}, "c10d", T213)
        ours = True
    except ConfigError as err:
        assert str(err).startswith(f"--rdzv-conf: {key} must be")
        ours = False
    assert ours == _torch_reads(key, how, value)


def test_quotes_inside_the_argument_run_with_one_warning():
    """The line torchrun runs: the quoted keys are ones c10d never reads (torch's join_timeout stays 600)."""
    conf = parse_rdzv_conf(QUOTED)
    assert conf == {"'join_timeout": "5", "last_call_timeout": "1", "timeout": "5'"}
    warnings = check_rdzv_conf(conf, "c10d", T213)
    assert warnings == ["--rdzv-conf: torch's c10d rendezvous does not read \"'join_timeout\", 'timeout' "
                        "(the quotes are part of the text: the shell or YAML that passed them on did not remove them):"
                        " ignored, as torchrun ignores it"]
    cfg = build({"rdzv_conf": QUOTED, "nproc_per_node": "1"})
    assert cfg.rendezvous.join_timeout == 600 and cfg.rendezvous.conf["last_call_timeout"] == "1"
    assert [w for w in cfg.warnings if "--rdzv-conf" in w] == warnings


def test_static_reads_timeout_as_torch_does():
    with pytest.raises(ConfigError, match=r"timeout must be a whole number"):
        check_rdzv_conf(parse_rdzv_conf(QUOTED), "static", T213)  # torch's int("5'") fails the same way
    assert check_rdzv_conf({"timeout": "90"}, "static", T213) == []
    probes = dataclasses.replace(OFFLINE, is_local_host=lambda host: False)
    cfg = build({"rdzv_backend": "static", "nnodes": "2", "master_addr": "h", "master_port": "1234",
                 "rdzv_conf": "timeout=90,join_timeout=7"}, probes=probes)
    assert cfg.rendezvous.join_timeout == 90
    assert cfg.warnings[-1:] == ("--rdzv-conf: torch's static rendezvous does not read 'join_timeout': "
                                 "ignored, as torchrun ignores it",)


def test_cas_backoff_is_passed_on_and_said_to_wait_for_2_15():
    assert check_rdzv_conf({"cas_backoff_max_seconds": "0.3"}, "c10d", T215) == []
    assert check_rdzv_conf({"cas_backoff_max_seconds": "0.3"}, "c10d", T213) == [
        "--rdzv-conf: cas_backoff_max_seconds is read from torch 2.15 on, not by the torch installed here: "
        "ignored, as torchrun ignores it"]
    for bad in ("-1", "nan", "x", "1e9"):
        with pytest.raises(ConfigError, match="cas_backoff_max_seconds must be a number of seconds"):
            check_rdzv_conf({"cas_backoff_max_seconds": bad}, "c10d", T215)
    cfg = build({"rdzv_conf": "cas_backoff_max_seconds=0.5", "nproc_per_node": "1"},
                probes=dataclasses.replace(OFFLINE, torch_version=T215))
    assert cfg.rendezvous.conf["cas_backoff_max_seconds"] == "0.5" and not cfg.warnings


def test_logs_specs_default_is_torchruns_default():
    assert build({"logs_specs": "default"}).output.log_dir is None
    with pytest.raises(ConfigError, match=r"^--logs-specs mine: mbr-launch loads no torchrun.logs_specs entry point"):
        build({"logs_specs": "mine"})
    assert resolve({}, {"PET_LOGS_SPECS": "mine"}, {}).values["logs_specs"] is None  # torchrun reads no PET_ there

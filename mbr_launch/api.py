"""The Python API under the CLI: keyword-only, one validated config object, then the agent."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from mbr_launch.config.build import build_config
from mbr_launch.config.errors import ConfigError, SettingError
from mbr_launch.config.files import load_config_file
from mbr_launch.config.model import LaunchConfig, PreflightSpec
from mbr_launch.config.settings import Resolved, resolve
from mbr_launch.gcpause import resume_gc

if TYPE_CHECKING:
    from mbr_launch.doctor import DoctorContext
    from mbr_launch.cluster.storeserver import Served
    from mbr_launch.cluster.storevalue import Sealer
    from mbr_launch.report.timeline import RunTimeline


def resolve_settings(*, cli: Mapping[str, Any], environ: Mapping[str, str]) -> Resolved:
    """Every setting's value by precedence: command line > environment > config file > default."""
    try:
        config_path = cli.get("config") or environ.get("MBR_CONFIG") or environ.get("PET_FT_CFG_PATH") or None
        file_values = load_config_file(config_path) if config_path else {}
        return resolve(cli, environ, file_values)
    except SettingError as err:
        raise ConfigError(str(err)) from None


def build_launch_config(*, cli: Mapping[str, Any], script: str | None, script_args: tuple[str, ...] = (),
                        environ: Mapping[str, str] | None = None) -> LaunchConfig:
    """Resolve every setting (command line > environment > config file > default) and validate."""
    environ = os.environ if environ is None else environ
    resolved = resolve_settings(cli=cli, environ=environ)
    check_skip_ids(resolved["skip_check"])
    return build_config(resolved, script=script, script_args=script_args, environ=environ)


def check_skip_ids(skip: tuple[str, ...]) -> None:
    """An unknown ``--skip-check`` id is bad input, found before anything starts (not at the preflight)."""
    if not set(skip) - {"all"}:
        return  # the common case stays free of the doctor's imports (cold-launch time)
    from mbr_launch.doctor import DoctorError, check_skip

    try:
        check_skip(skip)
    except DoctorError as err:
        raise ConfigError(f"--skip-check: {err}") from None


def doctor_context(spec: PreflightSpec, *, environ: Mapping[str, str], launcher: str,
                   run_id: str | None = None) -> "DoctorContext":
    """What the doctor checks, from the same settings a launch uses."""
    from mbr_launch.doctor import DoctorContext

    return DoctorContext.from_values(
        env=dict(environ), nproc_per_node=spec.nproc_per_node, nnodes=spec.nnodes, rdzv_backend=spec.rdzv_backend,
        rdzv_endpoint=spec.rdzv_endpoint, standalone=spec.standalone, master_addr=spec.master_addr,
        master_port=spec.master_port, log_dir=spec.log_dir, launcher=launcher, ft_enabled=spec.ft_declared,
        config_path=spec.config_path, pg_timeout_s=spec.pg_timeout, restart_policy=spec.restart_policy,
        script=spec.script, script_args=spec.script_args,
        disk_paths=[spec.log_dir] if spec.log_dir else [], ft_given=spec.ft_given, flags=spec.flags, run_id=run_id,
    )


def preflight(cfg: LaunchConfig, *, environ: Mapping[str, str]) -> bool:
    """The cheap doctor checks before any worker starts; False when an error must stop the launch."""
    from mbr_launch.doctor import DoctorError, preflight as run_preflight

    skip = set(cfg.preflight.skip_checks)
    if "all" in skip:
        return True
    ctx = doctor_context(cfg.preflight, environ=environ, launcher="mbr-launch", run_id=cfg.rendezvous.run_id)
    try:
        return run_preflight(ctx, skip=skip, quiet=cfg.output.quiet)
    except DoctorError as err:
        raise ConfigError(f"--skip-check: {err}") from None


class _Stopped(BaseException):
    """A handled signal before the agent took the signals over (preflight, importing torch)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop_early(signum: int, _frame: Any) -> None:
    raise _Stopped(signum)


@contextlib.contextmanager
def _signals_while_starting(cfg: LaunchConfig) -> Iterator[None]:
    """Until the agent installs its own handlers, a signal it would handle ends the start-up at once with the
    agent's exit code, not uncleanly or as a traceback."""
    names = dict.fromkeys((*cfg.workers.signals_to_handle, *cfg.preemption.signals))
    old = {sig: signal.signal(sig, _stop_early) for sig in (signal.Signals[name] for name in names)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _sealer(cfg: LaunchConfig) -> "Sealer | None":
    """The job's store sealer (its secret read again); None, said, when the file is no longer usable."""
    from mbr_launch.cluster.storevalue import Sealer
    from mbr_launch.config.secret import SecretFileError, read_secret

    try:
        secret = read_secret(cfg.rendezvous.secret_file) if cfg.rendezvous.secret_file else None
    except SecretFileError as err:
        print(f"mbr-launch: error: --rdzv-secret-file: {err}", file=sys.stderr, flush=True)
        return None
    return Sealer(secret)


def launch(cfg: LaunchConfig, *, environ: Mapping[str, str] | None = None, exit_after: bool = False) -> int:
    """Run this node's agent until the job ends; returns the launcher's exit code (see exitcodes).
    ``environ``: what the workers inherit. ``exit_after``: the caller ``os._exit``s right after (no joins)."""
    from mbr_launch.monitor.link import MonitorLink
    from mbr_launch.report import exitcodes
    from mbr_launch.workers.standbypool import early_pool

    env = dict(os.environ if environ is None else environ)
    # The monitor and the warm workers start first, overlapping the launcher's imports, preflight and
    # rendezvous. The monitor before the pool: it is forked while this process has one thread.
    monitor = MonitorLink(env=dict(env)).spawn(fork=True) if cfg.monitor.enabled else None
    pool = None
    try:
        pool = early_pool(cfg, env)
        with _signals_while_starting(cfg):
            if not preflight(cfg, environ=env):
                print("mbr-launch: error: preflight checks failed (above); fix them, or skip one with "
                      "--skip-check ID", file=sys.stderr, flush=True)
                return exitcodes.USAGE
            sealer = _sealer(cfg)
            if sealer is None:
                return exitcodes.USAGE
            from mbr_launch.agent.lifecycle import Agent

            agent = Agent(cfg, environ=env, standby=pool, monitor=monitor, exit_after=exit_after, sealer=sealer)
        resume_gc()  # the console script paused it for the imports above (gcpause.py)
        pool = monitor = None  # the agent owns them now (closed with its worker group and monitor handle)
        return agent.run()
    except _Stopped as stop:
        name = signal.Signals(stop.signum).name
        print(f"mbr-launch: received {name} while starting (before the rendezvous); stopping",
              file=sys.stderr, flush=True)
        return exitcodes.PREEMPTED if name in cfg.preemption.signals else 128 + stop.signum
    finally:
        if pool is not None:
            pool.close()
        if monitor is not None:
            monitor.close()


def serve_store(port: int, *, host: str = "") -> "Served":
    """Serve the c10d rendezvous store on ``port`` until SIGINT, SIGTERM or SIGHUP; raises ``StoreServeError``."""
    from mbr_launch.cluster.storeserver import serve

    return serve(port, host=host)


def run_report(run_dir: "str | os.PathLike[str] | None" = None) -> "RunTimeline":
    """What happened in the run at ``run_dir`` (a run folder, its events.jsonl, or a folder of runs: the
    latest), default the latest under the default log folder. Raises ``report.runs.ReportError``."""
    from pathlib import Path

    from mbr_launch.config.rundir import default_base
    from mbr_launch.report.runs import find_run
    from mbr_launch.report.timeline import build

    return build(find_run(Path(run_dir) if run_dir is not None else None, default_base()))

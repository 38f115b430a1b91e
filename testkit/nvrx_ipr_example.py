"""NVRx's in-job + in-process restart example, launched the way its own script launches it.

``run_inprocess_injob_example.sh`` (NVRx v0.4.1, vendored unmodified in third_party/) starts three
``ft_launcher`` agents of two ranks each. ``commands`` reads that script's flags (the common launcher and
fault-tolerance flags, each agent's ``--rdzv-conf``, the worker's arguments) and gives the same three command
lines with another launcher, a free port instead of 29500, and another fault schedule and length: the test
and the bench run exactly what NVRx's docs run, and follow the script if it changes.

The worker keeps each rank's last simulated fault in ``/tmp/_injob_inproc_example_rank<N>_failed_iter.txt``
(a fixed path, not ``--path``): two runs at once on one machine would disarm each other's faults, so every
run holds ``exclusive()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

EXAMPLES = Path(__file__).resolve().parents[1] / "third_party" / "nvrx-v0.4.1" / "examples" / "fault_tolerance"
WORKER = EXAMPLES / "in_job_and_in_process_example.py"
SCRIPT = EXAMPLES / "run_inprocess_injob_example.sh"
LOCK = Path("/tmp/_injob_inproc_example.lock")


@dataclass(frozen=True)
class Example:
    launcher_args: tuple[str, ...]  # $COMMON_LAUNCHER_ARGS $COMMON_FT_ARGS, in the script's order
    rdzv_confs: tuple[str, ...]  # one per agent: is_host=1, is_host=0, is_host=0
    worker_args: tuple[str, ...]  # what follows $WORKER_SCRIPT (with $SIM_FAULTS_DESC substituted)
    faults: str  # the script's own SIM_FAULTS_DESC
    iterations: int  # its --total-iterations


def read_script(text: str | None = None) -> Example:
    text = SCRIPT.read_text() if text is None else text
    values: dict[str, str] = {}
    for name, value in re.findall(r"^([A-Z_]+)=(.*)$", text, re.MULTILINE):
        word = shlex.split(value)[0] if value.strip() else ""
        values[name] = re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: values.get(m.group(1), ""), word)
    lines = re.sub(r"\\\n", " ", text).splitlines()
    agents = [shlex.split(line.rstrip("& ")) for line in lines if line.startswith("ft_launcher ")]
    assert len(agents) == 3, f"expected three ft_launcher lines in {SCRIPT}"
    first = agents[0]
    worker_at = first.index("$WORKER_SCRIPT")
    confs = tuple(next(a for a in agent if a.startswith("--rdzv-conf")) for agent in agents)
    worker = tuple(a.replace("$SIM_FAULTS_DESC", values["SIM_FAULTS_DESC"]) for a in first[worker_at + 1:])
    launcher = shlex.split(values["COMMON_LAUNCHER_ARGS"]) + shlex.split(values["COMMON_FT_ARGS"])
    total = next(int(a.split("=", 1)[1]) for a in worker if a.startswith("--total-iterations="))
    assert all(a.startswith("$COMMON") or a.startswith("--rdzv-conf") for a in first[1:worker_at]), first
    return Example(tuple(launcher), confs, worker, values["SIM_FAULTS_DESC"], total)


def commands(launcher: Sequence[str], *, port: int, faults: str | None = None, iterations: int | None = None,
             checkpoint_dir: Path | None = None, per_agent: Sequence[Sequence[str]] = ((), (), ()),
             example: Example | None = None) -> list[list[str]]:
    """The three agents' command lines: ``launcher`` (e.g. ``[python, -m, mbr_launch]`` or ``[ft_launcher]``)
    with the script's flags, ``127.0.0.1:<port>`` as the endpoint, and the worker with ``faults`` and
    ``iterations`` (default: the script's own) and its checkpoint in ``checkpoint_dir`` (``--path``)."""
    ex = example or read_script()
    flags = [re.sub(r"(--rdzv[-_]endpoint=[^:]+:)\d+", rf"\g<1>{port}", a) for a in ex.launcher_args]
    worker = [a for a in ex.worker_args]
    worker = [f"--fault-iters={faults}" if faults is not None and a.startswith("--fault-iters=") else
              f"--total-iterations={iterations}" if iterations is not None and a.startswith("--total-iterations=")
              else a for a in worker]
    if checkpoint_dir is not None:
        worker += ["--path", str(checkpoint_dir)]
    return [[*launcher, *flags, conf, *extra, str(WORKER), *worker] for conf, extra in zip(ex.rdzv_confs, per_agent)]


def for_launcher(launcher: Sequence[str], *, env: dict[str, str], cwd: Path) -> Example:
    """The script's flags, less ``--ft-enable-nic-monitor=False`` where ``launcher`` does not take a value for
    that flag (mbr-launch before issue 17's flag parity: its switch is off by default, which is what False
    asks for). Asked of the launcher itself: ``FLAG=False --help`` exits 0 only when the value parses."""
    ex = read_script()
    nic = [a for a in ex.launcher_args if a.startswith("--ft-enable-nic-monitor")]
    if not nic or subprocess.run([*launcher, *nic, "--help"], capture_output=True, env=env, cwd=cwd,
                                 timeout=120).returncode == 0:
        return ex
    return dataclasses.replace(ex, launcher_args=tuple(a for a in ex.launcher_args if a not in nic))


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """Hold the machine-wide lock on the example's fixed /tmp files (see the module docstring), which start
    empty (a run killed before its end leaves a rank's last fault, which would disarm that fault next time)
    and are gone after."""
    with open(LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            _forget_faults()
            yield
        finally:
            _forget_faults()
            fcntl.flock(handle, fcntl.LOCK_UN)


def _forget_faults() -> None:
    for path in LOCK.parent.glob("_injob_inproc_example_rank*_failed_iter.txt"):
        path.unlink(missing_ok=True)


_ITERATION = re.compile(r"rank=0 iteration=(\d+) ")


def iterations_done(output: str) -> int:
    """Iterations finished, from rank 0's progress lines (``rank=0 iteration=N loss...`` every
    ``--log-interval``): the highest N plus one (0 before the first line)."""
    return max((int(n) + 1 for n in _ITERATION.findall(output)), default=0)

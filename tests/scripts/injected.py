"""What tests/scripts/lightning_train.py and hf_train.py share: their fault options and the injection itself.

Imported from the scripts' own folder (first on sys.path when a script runs). Faults come after an optimizer
step (the library's step counter has counted it), on the attempt chosen (``--kill-restart``, ``--stop-restart``:
TORCHELASTIC_RESTART_COUNT, default 0, the first).
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

RANK = int(os.environ.get("RANK", "0"))
RESTART = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def parser(folder_flag: str) -> argparse.ArgumentParser:
    """The options both scripts take; ``folder_flag``: where the library keeps its checkpoints."""
    p = argparse.ArgumentParser()
    p.add_argument(folder_flag, required=True)
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-at-step", type=int, default=-1)
    p.add_argument("--stop-rank", type=int, default=-1)
    p.add_argument("--stop-at-step", type=int, default=-1)
    p.add_argument("--kill-restart", type=int, default=0)
    p.add_argument("--stop-restart", type=int, default=0)
    p.add_argument("--ready-file", default=None)
    return p


def started(step: int) -> None:
    print(f"rank {RANK} restart {RESTART} starts at step {step}", flush=True)


def after_step(args: argparse.Namespace, step: int) -> None:
    """The ready file (rank 0, once), then SIGKILL or SIGSTOP of the chosen rank at the chosen step."""
    if args.ready_file and RANK == 0 and not os.path.exists(args.ready_file):
        Path(args.ready_file).write_text(str(os.getpid()))
    if (RANK, step, RESTART) == (args.kill_rank, args.kill_at_step, args.kill_restart):
        print(f"rank {RANK} SIGKILL at step {step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if (RANK, step, RESTART) == (args.stop_rank, args.stop_at_step, args.stop_restart):
        print(f"rank {RANK} SIGSTOP at step {step}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)

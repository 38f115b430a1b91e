"""The one shape every trial bench shares: its command line, the interleaved trial loop, and --from-raw.

    parser = bench_parser(__doc__, trials=..., choices=CHOICES)    # --trials --launchers --out --raw ...
    args = parser.parse_args()
    session = start(args, "restart")                               # work dir, mbr_launch snapshot, SIGTERM
    done = run_trials(args, session, plan(launchers, args.trials), one_trial, status_text, width=17)
    return publish(args, SECTION, render(done.records, ...), done.records)

Interleaving: trial i runs the items in the order ``rotate(items, i)``, so drift in the machine's load
(other people's tests on 2 shared cores) lands on every launcher alike.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, Sequence, TypeVar

from .launchers import LAUNCHERS, Launcher, baseline_variant, mbr_source, snapshot
from .processes import stop_on_sigterm
from .reports import finish_dir, load_raw, work_dir, write_raw, write_section

T = TypeVar("T")


def bench_parser(doc: str | None, *, trials: int, choices: Sequence[str], default: str | Sequence[str] | None = None,
                 launchers_help: str | None = None, gpu: bool = True, nproc: bool = True,
                 from_raw: bool = False) -> argparse.ArgumentParser:
    """The options every trial bench takes; the bench adds its own to the parser it gets back."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=trials, help="trials per launcher (interleaved)")
    default = ",".join(choices) if default is None else default if isinstance(default, str) else ",".join(default)
    parser.add_argument("--launchers", default=default,
                        help=launchers_help or f"comma-separated subset of: {', '.join(choices)}")
    if gpu:
        parser.add_argument("--gpu", action="store_true", help="nccl on cuda:LOCAL_RANK instead of gloo on CPU")
    if nproc:
        parser.add_argument("--nproc", type=int, default=2, help="ranks per launch")
    parser.add_argument("--out", type=Path, default=None, help="write/replace this bench's section in FILE")
    parser.add_argument("--raw", type=Path, default=None, help="write every trial as JSON to FILE")
    parser.add_argument("--keep", action="store_true", help="keep the per-trial logs (path printed)")
    parser.add_argument("--mbr-source", choices=["head", "tree"], default="head",
                        help="mbr_launch code to run: a snapshot of HEAD (default) or the working tree as is")
    parser.add_argument("--mbr-baseline", metavar="REV", default=None,
                        help="also run every mbr-launch variant with the mbr_launch code of git revision REV, "
                             "interleaved in the same trials (named NAME@REV): before/after in one run")
    if from_raw:
        parser.add_argument("--from-raw", type=Path, nargs="+", help="only render: records of earlier --raw files "
                            "(trials of the k-th file numbered from 1000*k, so pairs stay within a run)")
        parser.add_argument("--commands", default="", help="with --from-raw: the commands of those runs, for the text")
        parser.add_argument("--mbr-code", default="", help="with --from-raw: which mbr_launch code those runs used")
    return parser


@dataclass(frozen=True)
class Session:
    """One bench run: the directory its trials live in and the mbr_launch snapshot (None: the tree)."""
    root: Path
    mbr_path: Path | None
    baseline: tuple[Path, str] | None = None  # --mbr-baseline: (snapshot path, revision)

    def with_baseline(self, launchers: Sequence[Launcher]) -> list[Launcher]:
        """``launchers`` plus, with --mbr-baseline, each mbr-launch variant again on the baseline's code."""
        if self.baseline is None:
            return list(launchers)
        path, rev = self.baseline
        variants = [baseline_variant(l, path, rev) for l in launchers if l.name.startswith("mbr-")]
        LAUNCHERS.update({v.name: v for v in variants})  # the reports look launchers up by name
        return [*launchers, *variants]


def start(args: argparse.Namespace, prefix: str) -> Session:
    """Make SIGTERM unwind like Ctrl-C, make the work dir, pick the mbr_launch code (``args.mbr_code``)."""
    stop_on_sigterm()
    root = work_dir(prefix)
    mbr_path, args.mbr_code = mbr_source(args.mbr_source, root)
    args.commands = ""  # the report quotes this run's own command line
    rev = getattr(args, "mbr_baseline", None)
    if rev:
        args.mbr_code += f"; baseline: {rev} (git archive snapshot, `python -m mbr_launch`)"
    return Session(root, mbr_path, (snapshot(rev, root / "mbr-base"), rev) if rev else None)


def rotate(items: Sequence[T], i: int) -> list[T]:
    k = i % len(items) if items else 0
    return [*items[k:], *items[:k]]


@dataclass(frozen=True)
class Step(Generic[T]):
    """One run of one item (launcher or variant) in trial ``trial`` of ``phase``."""
    trial: int
    item: T
    phase: str = ""


def plan(items: Sequence[T], trials: int, *, first: int = 0, phases: Sequence[str] = ("",)) -> list[Step[T]]:
    """Every phase in turn; in it, trial i runs every item once, in an order rotated by i."""
    return [Step(i, item, phase) for phase in phases for i in range(first, first + trials)
            for item in rotate(items, i)]


@dataclass(frozen=True)
class Outcome:
    records: list[dict]
    interrupted: bool  # Ctrl-C or SIGTERM: the records are those done before it


def failed_text(rec: dict) -> str:
    return f"FAILED: {rec.get('reason', '')}"


def run_trials(args: argparse.Namespace, session: Session, steps: Sequence[Step[Any]],
               run: Callable[[Step[Any]], dict | None], status: Callable[[dict], str], *, width: int,
               failed: Callable[[dict], str] = failed_text, records: Sequence[dict] = ()) -> Outcome:
    """Run the steps; ``run`` returns the trial's record, or None for a step that records nothing (a skipped
    or yardstick run). A status line per record; --raw is rewritten after each, so a run cut short keeps
    what it measured (``records``: earlier ones to keep with them). Ctrl-C/SIGTERM stop early with the
    records so far; the trial directories are removed at the end unless --keep."""
    done = list(records)
    total = max((s.trial for s in steps), default=-1) + 1
    interrupted = False
    try:
        for step in steps:
            rec = run(step)
            if rec is None:
                continue
            done.append(rec)
            write_raw(args.raw, done)
            where = f"{step.phase} " if step.phase else ""
            print(f"[{where}{step.trial + 1}/{total}] {rec.get('launcher', ''):{width}s} "
                  + (status(rec) if rec.get("ok", True) else failed(rec)), flush=True)
    except KeyboardInterrupt:
        print("interrupted: reporting the trials so far", file=sys.stderr)
        interrupted = True
    finally:
        finish_dir(session.root, args.keep)
    return Outcome(done, interrupted)


def launchers_in(records: Sequence[dict], choices: Sequence[str]) -> list[str]:
    """The choices that have records, in the choices' order (for a report rendered from raw files)."""
    return [n for n in choices if any(r["launcher"] == n for r in records)]


def render_raw(args: argparse.Namespace, section: str, render: Callable[[list[dict]], str]) -> int:
    """--from-raw: render the records of earlier --raw files (see load_raw), print, write --out's section."""
    text = render(load_raw(args.from_raw))
    print(text)
    if args.out:
        write_section(args.out, section, text)
    return 0

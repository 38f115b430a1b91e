"""What a fault case is and how a run of it is judged (the table itself is testkit/fault_cases.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .fault_runs import Ctx, Run

Predicate = Callable[[Any], bool]


@dataclass(frozen=True)
class Expect:
    """An event that must be in the log: its name and fields (a value, or a predicate on the value); ``agent``
    picks one agent's log (index in start order), None: any agent's."""
    event: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    agent: int | None = None

    def matches(self, record: dict) -> bool:
        if record.get("event") != self.event:
            return False
        return all(want(record.get(k)) if callable(want) else record.get(k) == want for k, want in self.fields.items())

    def found(self, run: Run) -> list[dict]:
        logs = run.events if self.agent is None else run.events[self.agent:self.agent + 1]
        return [e for events in logs for e in events if self.matches(e)]

    def __str__(self) -> str:
        shown = ", ".join(f"{k}={getattr(v, '__doc__', None) or '?' if callable(v) else v}"
                          for k, v in self.fields.items())
        where = "" if self.agent is None else f" (agent {self.agent})"
        return f"{self.event}{{{shown}}}{where}"


@dataclass(frozen=True)
class Case:
    name: str
    fault: str  # what is done, in words
    run: Callable[[Ctx], Run]
    exits: tuple[int | None, ...]  # per agent, in start order; None: killed by the scenario itself
    expect: tuple[Expect, ...]
    needs: tuple[str, ...] = ()  # "root", "netns", "slurm"
    check: Callable[[Run], None] | None = None  # the case's own assertions
    torchrun: Callable[[Ctx], Run] | None = None  # the same fault under torchrun (bench only)
    pending: str = ""  # another helper's issue-16 work this expectation depends on
    known_bug: str = ""  # a bug this case shows and nobody has fixed yet: the test is a strict xfail
    tested_by: str = ""  # a test that runs the same fault (same script, same flags) and checks more: the matrix
    # test skips the case, which benchmarks/bench_faults.py still runs beside torchrun

    @property
    def outcome(self) -> str:
        codes = [c for c in self.exits if c is not None]
        if not codes:
            return "killed by the case"
        return "survived" if all(c == 0 for c in codes) else "exit " + "/".join(map(str, codes))


def verify(case: Case, run: Run) -> list[str]:
    """Every way this run differs from what the case expects (empty: it passed)."""
    problems = []
    if len(run.codes) != len(case.exits) or any(w is not None and w != c for w, c in zip(case.exits, run.codes)):
        problems.append(f"exit codes {run.codes}, expected {list(case.exits)}")
    for want in case.expect:
        if not want.found(run):
            problems.append(f"no {want} in events.jsonl")
    if run.orphans:
        problems.append("processes of the killed agent outlived it: " + "; ".join(run.orphans))
    problems += run.cut_logs
    if case.check:
        try:
            case.check(run)
        except AssertionError as err:
            problems.append(f"check: {err}")
    return problems


def is_(*allowed: Any) -> Predicate:
    def pred(value: Any) -> bool:
        return value in allowed
    pred.__doc__ = "|".join(map(str, allowed))
    return pred


def has(text: str) -> Predicate:
    def pred(value: Any) -> bool:
        return isinstance(value, str) and text in value
    pred.__doc__ = f"~{text!r}"
    return pred

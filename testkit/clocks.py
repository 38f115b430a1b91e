"""An injected clock for pure-logic tests of waits: ``clock()`` reads it, ``clock.sleep(s)`` records the pause
and moves it forward (and says the wait goes on, as a sleep that no stop interrupted)."""

from __future__ import annotations


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> bool:
        self.slept.append(seconds)
        self.now += seconds
        return True

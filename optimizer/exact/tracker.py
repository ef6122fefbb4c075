"""The best schedule so far, the best bound so far, and the progress reports they make.

Every phase of a solve offers what it finds here; the tracker keeps the best that fits
the memory limit, and turns it into the final Schedule with bound, gap and status.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from optimizer.exact.incumbents import objective_value
from optimizer.exact.options import Progress, ProgressCallback
from optimizer.exact.spantiming import affordable, retimed_for
from optimizer.schedule import Schedule

# Two makespans closer than this (relative) are the same: they come from float sums.
SAME = 1e-9


class BoundSource(Protocol):
    """A bound being proven alongside the search (optimizer.exact.fluidbound.FluidRun)."""

    def value(self) -> float: ...

    def close(self) -> None: ...

    def failure(self) -> str | None: ...


@dataclass
class Tracker:
    objective: str
    time_limit: float
    on_progress: ProgressCallback | None = None
    began: float = field(default_factory=time.monotonic)
    best: Schedule | None = None
    best_value: float = float("inf")
    best_by: str | None = None
    bound: float = 0.0
    bound_reason: str = ""
    proven: bool = False  # a model proved the incumbent optimal
    models_ran: bool = False  # an exact model (whole or window) took part
    # Seconds kept at the end for turning the best order into the result (`result`): the
    # phases end this much before the time limit.
    finish_reserve: float = 0.0
    # Bounds proven alongside the search (`watch`): each with its reason and the gap
    # (relative) at which it is no longer worth its core.
    watched: list[tuple[BoundSource, str, float]] = field(default_factory=list)

    @property
    def deadline(self) -> float:
        return self.began + self.time_limit - self.finish_reserve

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def offer(self, schedule: Schedule, by: str) -> bool:
        """Keep `schedule` if it fits and is better; report progress when it is.

        Under the span objective the order is first timed for the least longest span
        (optimizer.exact.spantiming): as-soon-as-possible times can make a device wait.
        Where that is too slow for every candidate (spantiming.affordable), candidates
        are compared by their as-soon-as-possible span and only the result is retimed.
        """
        if not schedule.fits_memory():
            return False
        if affordable(schedule.problem):
            schedule = retimed_for(schedule, self.objective)
        value = objective_value(schedule, self.objective)
        if value >= self.best_value * (1 - SAME):
            return False
        self.best, self.best_value, self.best_by = schedule, value, by
        self.report(by)
        self.collect()
        return True

    def raise_bound(self, value: float, reason: str) -> None:
        if value > self.bound * (1 + SAME):
            self.bound, self.bound_reason = value, reason
            self.report(reason)

    def watch(self, source: BoundSource, reason: str, until_gap: float = 0.0) -> None:
        """Take `source`'s bound at each `collect` (each phase and each better schedule)
        until `release`, or until the gap is within `until_gap` (then it is stopped)."""
        self.watched.append((source, reason, until_gap))

    def collect(self) -> None:
        """Raise the bound with what the watched sources have proven so far; stop those
        whose gap is closed."""
        for source, reason, _ in self.watched:
            self.raise_bound(source.value(), reason)
        if self.best is None:
            return
        closed = [w for w in self.watched if self.best_value - self.bound <= w[2] * self.best_value]
        for source, _, _ in closed:
            source.close()
        self.watched = [w for w in self.watched if w not in closed]

    def release(self) -> None:
        """Collect a last time and stop the watched sources (warning of one that failed)."""
        try:
            self.collect()
        finally:
            for source, _, _ in self.watched:
                source.close()
                if (failure := source.failure()) is not None:
                    self.warn(failure)
            self.watched.clear()

    def report(self, phase: str, incumbent: float | None = None, warning: str | None = None) -> None:
        if self.on_progress is None:
            return
        shown = self.best_value if self.best is not None else None
        if incumbent is not None and (shown is None or incumbent < shown):
            shown = incumbent
        self.on_progress(Progress(self.elapsed(), shown, min(self.bound, shown) if shown else self.bound, phase, warning))

    def warn(self, text: str) -> None:
        """Report something the user must hear (Progress.warning)."""
        self.report("warning", warning=text)

    def closed(self) -> bool:
        return self.proven or (self.best is not None and self.best_value <= self.bound * (1 + SAME))

    def result(self, method: str) -> Schedule | None:
        """The best schedule with its metrics filled in, named after the requested method."""
        if self.best is None:
            return None
        best = self.best
        if not affordable(best.problem):  # offers were compared as soon as possible
            with _collection_paused():
                best = retimed_for(best, self.objective)
            self.best_value = min(self.best_value, objective_value(best, self.objective))
        schedule = Schedule(best.problem, method, best.devices)
        closed = self.closed()
        bound = self.best_value if closed else min(self.bound, self.best_value)
        metrics = schedule.metrics
        metrics.lower_bound = bound
        metrics.gap = 0.0 if closed or self.best_value <= 0 else (self.best_value - bound) / self.best_value
        metrics.status = "optimal" if closed else ("feasible" if self.models_ran else "heuristic")
        metrics.method_won = self.best_by
        metrics.solve_seconds = round(self.elapsed(), 3)
        return schedule


@contextlib.contextmanager
def _collection_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block. The final timing for the span makes
    millions of short-lived tuples, freed by reference counting, and at the end of a solve
    the collections they trigger scan a large heap: at p = 32, m = 256 on the V placement
    it took 2.4-2.6 s with them and 1.4-1.9 s without, inside a time limit."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

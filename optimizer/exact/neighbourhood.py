"""Large-neighbourhood search: re-optimize windows of the incumbent in time with CP-SAT.

A window frees the ops that start in [t0, t1) on every device; ops before it keep their
times and ops after it keep their order (see optimizer.exact.subproblem, whose tails
make the window model's makespan the whole schedule's). Windows are visited where the
incumbent has idle time first, each solved for a short deterministic effort; an improved
window is spliced in and the whole order re-simulated, and kept only when the whole
schedule gets shorter, or as short and finishing its ops earlier overall. When a round
finds nothing, windows grow, so the search keeps improving with more time.

Under the span objective the window models still minimize the makespan (their tails make
it exact), but every candidate is timed for the least longest span
(optimizer.exact.spantiming) and kept only when that span gets shorter: a window that
lengthens the makespan to shorten the longest span is accepted.
"""

from __future__ import annotations

import random
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from optimizer.exact.cpsat import solve_cpsat_subproblem
from optimizer.exact.incumbents import objective_value
from optimizer.exact.spantiming import affordable, timed_for
from optimizer.exact.subproblem import splice, window_subproblem
from optimizer.exact.ticktiming import tick_times
from optimizer.exact.timescale import IntegerTables
from optimizer.ops import Op, TimedOp
from optimizer.problem import Problem
from optimizer.schedule import Schedule

# Free ops per window: small enough that CP-SAT closes most windows in well under a
# second, large enough to move a warm-up or cool-down as a whole.
FIRST_WINDOW_OPS = 90
MAX_WINDOW_OPS = 700


@dataclass
class _State:
    orders: list[list[Op]]
    timed: list[list[TimedOp]]  # in ticks
    schedule: Schedule  # in the user's units
    value: float  # objective in the user's units
    compactness: int  # sum of all ends in ticks: the tie-breaker


def _evaluate(problem: Problem, tables: IntegerTables, orders: list[list[Op]], objective: str) -> _State:
    timed = tick_times(tables, problem.num_stages, orders)  # ASAP: the window models' boundary conditions
    # Compared as the tracker compares them: timed for the span only where affordable.
    schedule = timed_for(problem, orders, objective if affordable(problem) else "makespan")
    return _State(orders, timed, schedule, objective_value(schedule, objective), int(sum(t.end for ops in timed for t in ops)))


def _windows(timed: Sequence[Sequence[TimedOp]], size: int, rng: random.Random) -> list[tuple[int, int]]:
    """Windows [t0, t1) of about `size` op starts, overlapping by half, idle ones first."""
    starts = sorted(round(t.start) for ops in timed for t in ops)
    end = max(round(t.end) for ops in timed for t in ops)
    step = max(1, size // 2)
    windows = []
    for k in range(0, len(starts), step):
        t0 = starts[k]
        t1 = starts[k + size] if k + size < len(starts) else end + 1
        if t1 > t0:
            windows.append((t0, t1))
    windows = sorted(set(windows))
    devices = [_BusyIndex(ops) for ops in timed]
    idle = {w: sum(device.idle_inside(*w) for device in devices) for w in windows}
    rng.shuffle(windows)
    windows.sort(key=lambda w: -idle[w])
    return windows


class _BusyIndex:
    """One device's ops (in ticks) with prefix sums of busy time: the idle time inside a
    window in O(log n), where a scan of every op per window took seconds at p = 32,
    m = 256 (past short time limits)."""

    def __init__(self, ops: Sequence[TimedOp]):
        self.starts = [t.start for t in ops]
        self.ends = [t.end for t in ops]
        self.busy: list[float] = [0.0]
        for t in ops:
            self.busy.append(self.busy[-1] + t.end - t.start)
        self.first, self.last = (round(ops[0].start), round(ops[-1].end)) if ops else (0, 0)

    def idle_inside(self, t0: int, t1: int) -> int:
        a = bisect_right(self.ends, t0)  # the ops that end after t0 ...
        b = bisect_left(self.starts, t1)  # ... and start before t1
        busy = 0.0
        if a < b:
            busy = self.busy[b] - self.busy[a] - max(0, t0 - self.starts[a]) - max(0, self.ends[b - 1] - t1)
        span = max(0, min(t1, self.last) - max(t0, self.first))
        return max(0, round(span - busy))


def neighbourhood_search(
    problem: Problem,
    tables: IntegerTables,
    orders: list[list[Op]],
    *,
    deadline: float,
    seed: int = 0,
    threads: int = 2,
    objective: str = "makespan",
    target: float = 0.0,
    on_improve: Callable[[Schedule], object] | None = None,
) -> Schedule:
    """Improve a canonical feasible order until `deadline` (time.monotonic) or `target` is reached.

    Raises KeyboardInterrupt after reporting the best schedule through `on_improve`; the
    caller keeps it.
    """
    rng = random.Random(seed)
    state = _evaluate(problem, tables, orders, objective)
    size = FIRST_WINDOW_OPS
    total_ops = sum(len(ops) for ops in orders)
    while time.monotonic() < deadline and state.value > target * (1 + 1e-9):
        improved_this_round = False
        for t0, t1 in _windows(state.timed, size, rng):
            left = deadline - time.monotonic()
            if left <= 0.05 or state.value <= target * (1 + 1e-9):
                break
            sub = window_subproblem(problem, tables, state.timed, t0, t1)
            if len(sub.ops) < 2:
                continue
            # Windows need a good solution, not a proof: a short effort each, in
            # deterministic units first and wall-clock as a cap.
            effort = 0.2 + len(sub.ops) / 300
            result = solve_cpsat_subproblem(
                sub,
                time_limit=min(left, 2 * effort),
                seed=rng.randrange(1 << 30),
                threads=threads,
                objective="makespan",
                compact=True,
                deterministic_limit=effort,
            )
            if result.starts is not None:
                candidate_orders = splice(state.timed, t0, t1, result.orders(sub))
                candidate = _evaluate(problem, tables, candidate_orders, objective)
                better = candidate.value < state.value * (1 - 1e-12) or (
                    candidate.value <= state.value * (1 + 1e-12) and candidate.compactness < state.compactness
                )
                if better and candidate.schedule.fits_memory():
                    gained = candidate.value < state.value * (1 - 1e-12)
                    state = candidate
                    improved_this_round = improved_this_round or gained
                    if gained and on_improve is not None:
                        on_improve(state.schedule)
            if result.interrupted:
                raise KeyboardInterrupt
        if not improved_this_round:
            if size >= min(MAX_WINDOW_OPS, total_ops):
                rng.seed(rng.random())  # new offsets, same sizes
            size = min(MAX_WINDOW_OPS, total_ops, int(size * 1.5))
    return state.schedule

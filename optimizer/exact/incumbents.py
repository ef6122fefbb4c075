"""Starting points: every applicable known schedule, made canonical and timed.

The best one that fits the memory limit is the incumbent every solver starts from (and
must never do worse than); when none fits, the one that overshoots least is named in the
error message.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from optimizer.exact.canonical import canonical
from optimizer.ops import Op
from optimizer.problem import Problem
from optimizer.schedule import Schedule, longest_span, orders_fit
from optimizer.schedules import applicable
from optimizer.simulate import simulate

# Making a generator's orders canonical and timing them, per op (Problem.num_ops): 0.3 to
# 0.4 s for the 49k ops of p = 32, m = 256 on the V placement. A build that stops at a
# deadline may also finish the step it is in (a candidate of v-auto: up to 0.4 s there,
# three times that on 2 loaded cores), so 2e-5 s per op (1 s there) is kept for both.
_TIMING_SECONDS_PER_OP = 2e-5


@dataclass
class Candidate:
    name: str
    schedule: Schedule  # timed in the user's units, canonical order (or the family's own: `as_published`)
    overshoot: float  # largest relative excess over a device's memory limit (0 when it fits)

    @property
    def fits(self) -> bool:
        return self.overshoot <= 1e-9


def overshoot(schedule: Schedule) -> float:
    limits = schedule.problem.tables().limit
    worst = 0.0
    for peak, limit in zip(schedule.metrics.peak_memory, limits):
        worst = max(worst, (peak - limit) / limit)
    return worst


def candidate(problem: Problem, name: str, orders: Sequence[Sequence[Op]], as_published: bool = False) -> Candidate:
    """The orders timed, made canonical first unless `as_published` (the family's own
    orders, e.g. GPipe's fused backwards, as its paper defines it)."""
    schedule = simulate(problem, orders if as_published else canonical(orders, problem), method=name)
    return Candidate(name, schedule, overshoot(schedule))


def generator_candidates(
    problem: Problem,
    deadline: float | None = None,
    *,
    essential: tuple[str, ...] = (),
    essential_deadline: float | None = None,
    which: Callable[[str], bool] | None = None,
    as_published: bool = False,
    fitting_only: bool = False,
    essential_after: int = 0,
) -> tuple[list[Candidate], dict[str, str]]:
    """Every applicable generator's schedule (those `which` selects by name, when given),
    canonical (or, with `as_published`, the family's own orders) and timed; plus the ones
    that failed and why. With `fitting_only`, orders over the memory limit are not timed
    (memory depends on the order alone; timing is most of a family's cost on large
    problems) and are listed with the failed ones.

    With a `deadline` (time.monotonic()), a generator still running then is given up
    (its thread is left to finish on its own) so that the solver keeps its time limit;
    an automatic scheduler's best orders found by then stand in for its result.
    The generators named in `essential` may run until `essential_deadline` instead.

    Vocabulary passes are woven in several ways, each a list-scheduling run, and a build
    stops weaving at the first way that fits once its share of the time is out: an even
    share of what is left to the builds still to come against the same deadline (the
    essential ones counting `essential_after` more that a later call will make). Without
    the share the first families built wove until the deadline and the later ones, quicker
    or shorter, were not built: with passes every family weaves for 0.1-0.5 s at p = 4-8,
    m = 16-80, and on a loaded machine `auto` at 1 s returned GPipe's 651.1 where ZB-H1
    gives 625; V-Half's 108.55, built in 0.5 s, was left out for 112.15.
    """
    found, failed = [], {}
    chosen = [g for g in applicable(problem) if which is None or which(g.name)]
    essentials = [essential_deadline is not None and g.name in essential for g in chosen]
    left = {True: sum(essentials) + essential_after, False: len(chosen) - sum(essentials)}
    for generator, is_essential in zip(chosen, essentials):
        own_deadline = essential_deadline if is_essential else deadline
        share = left[is_essential]
        left[is_essential] -= 1
        # Not started at all once its time is out, nor (unless essential) once what is left
        # would not even time its orders: a thread given up keeps running and slows the
        # solver down (GIL; at p = 256, m = 39 with vocabulary passes a layers file's splits
        # each left one such build behind, and the solve after them took 7 s instead of 3).
        reserve = 0.0 if is_essential else _TIMING_SECONDS_PER_OP * problem.num_ops
        now = time.monotonic()
        if own_deadline is not None and now >= own_deadline - reserve:
            failed[generator.name] = "not run: the solver's time for known schedules had run out"
            continue
        # The build's own deadline and the end of its share (weaving), both less the time
        # that timing its orders will take.
        timing = _TIMING_SECONDS_PER_OP * problem.num_ops
        ends = None if own_deadline is None else (own_deadline - timing, share_end(now, own_deadline, share) - timing)
        outcome: dict[str, Any] = {}  # "orders" (a generator's orders) or "error" (its message)
        done = threading.Event()
        given_up = threading.Event()  # set once this stops waiting: the build may end then

        def build(generator=generator, outcome=outcome, done=done, ends=ends, given_up=given_up) -> None:
            try:
                if ends is None:
                    outcome["orders"] = generator.build(problem)
                else:
                    outcome["orders"] = generator.build_within(
                        problem,
                        ends[0],
                        keep=lambda orders: outcome.__setitem__("so_far", orders),
                        abandoned=given_up.is_set,
                        weave_by=ends[1],
                    )
            except Exception as error:  # a broken family must not stop the solver; it is reported
                outcome["error"] = f"{error.__class__.__name__}: {error}"
            finally:
                done.set()

        if own_deadline is None:
            build()
        else:
            threading.Thread(target=build, daemon=True).start()
            if not done.wait(max(0.0, own_deadline - time.monotonic())):
                # What the build had stands; taken before it hears that nobody waits (it may
                # then end with an error at once, which must not cost what it had found).
                had = dict(outcome)
                given_up.set()
                if "orders" not in had and "so_far" in had:
                    outcome = {"orders": had["so_far"]}
                else:
                    outcome = had
        if "orders" not in outcome and "error" not in outcome:
            failed[generator.name] = "gave no schedule before the solver's time for known schedules ran out"
        elif "error" in outcome:
            failed[generator.name] = str(outcome["error"])
        elif fitting_only and not orders_fit(problem, outcome["orders"]):
            failed[generator.name] = "over the memory limit (not timed)"
        else:
            try:
                found.append(candidate(problem, generator.name, outcome["orders"], as_published))
            except Exception as error:  # e.g. an order that deadlocks
                failed[generator.name] = f"{error.__class__.__name__}: {error}"
    return found, failed


def share_end(now: float, deadline: float, builds: int) -> float:
    """When an even share of the time from `now` to `deadline` among `builds` builds ends."""
    return now + (deadline - now) / max(1, builds)


def best_fitting(candidates: Sequence[Candidate], objective: str = "makespan") -> Candidate | None:
    fitting = [c for c in candidates if c.fits]
    return min(fitting, key=lambda c: objective_value(c.schedule, objective), default=None)


def closest(candidates: Sequence[Candidate]) -> Candidate | None:
    return min(candidates, key=lambda c: (c.overshoot, c.schedule.makespan), default=None)


def objective_value(schedule: Schedule, objective: str = "makespan") -> float:
    """The makespan, or the longest single-device span."""
    if objective == "span":
        return longest_span(schedule.devices)
    return schedule.makespan

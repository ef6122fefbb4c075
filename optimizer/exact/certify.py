"""`solve --certify SECONDS`: time after the solve spent only on raising the lower bound.

Two bounds share it, each where it proves most:

* the fluid bound (optimizer.exact.fluidbound), every device at once: what settles large
  problems at V-Half's memory and above. It ends early once its bisection is within its
  tolerance;
* then, where they apply (no vocabulary passes; one device's relaxation within
  devicebound's op limits), the exact relaxations of single devices and of the device
  that runs stage 0 with its neighbours (optimizer.exact.devicebound), hinted with the
  schedule. On small problems under a tight limit they reach the optimum where the fluid
  bound stalls: 4 devices, m = 8, Zero Bubble's 1.5B timings, V placement, from the
  schedule `auto` returns in 1 s: at V-Half's memory 389.7 -> 446.6 (its span) in 15 s, at
  V-Min's 476.1 -> 531.5 (the optimum) in about 100 s, on 2 loaded cores. Where they
  apply the fluid bound gets at most half the time.

Below FLUID_MIN_SECONDS the relaxations get all the time where they apply. Each argument
is a bound on its own; the schedule's lower bound and gap are raised as each rises, so a
certification stopped by Ctrl-C keeps what the relaxations proved. Where the relaxations
close the gap (the bound meets the schedule's value) the status becomes `optimal`, as the
solver's own would; the fluid bound's bisection stops within its tolerance and leaves the
status as it was. CP-SAT under a time limit with several workers is not repeatable: the
same command may prove a little more or less from run to run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from optimizer.exact import devicebound, fluidbound
from optimizer.exact.incumbents import objective_value
from optimizer.exact.slicebounds import split_relaxation
from optimizer.exact.tracker import SAME
from optimizer.schedule import Schedule

# Below this many seconds, where the relaxations apply they get all of them: the fluid
# bound's worker takes about half a second to start and its first program longer, and
# with half of 2 s it proved nothing while the relaxations were left no time.
FLUID_MIN_SECONDS = 4.0
# Least time the relaxations are started with (CP-SAT closes one device's relaxation at
# p = 4, m = 8 in a fraction of a second).
RELAXATION_MIN_SECONDS = 0.2


def certify(
    schedule: Schedule,
    objective: str,
    seconds: float,
    *,
    seed: int = 0,
    threads: int = 2,
    on_warning: Callable[[str], None] | None = None,
) -> bool:
    """Raise `schedule`'s lower bound (and lower its gap) within `seconds`; whether it rose.
    A fluid worker that fails is reported to `on_warning` and the relaxations still run."""
    problem = schedule.problem
    deadline = time.monotonic() + seconds
    before = schedule.metrics.lower_bound
    relaxing = devicebound.relaxation_applies(problem, objective)
    if fluidbound.applicable(problem) and not (relaxing and seconds < FLUID_MIN_SECONDS):
        try:
            fluidbound.certify(schedule, objective, seconds / 2 if relaxing else seconds)
        except fluidbound.FluidWorkerError as error:
            if on_warning is not None:
                on_warning(str(error))
    if relaxing and schedule.metrics.gap and deadline - time.monotonic() >= RELAXATION_MIN_SECONDS:
        _relaxation_bound(schedule, objective, deadline, seed, threads)
    after = schedule.metrics.lower_bound
    return after is not None and (before is None or after > before)


def _relaxation_bound(schedule: Schedule, objective: str, deadline: float, seed: int, threads: int) -> None:
    problem = schedule.problem
    relaxed = split_relaxation(problem)
    assert relaxed is not None, "runs only where the relaxations apply"
    value = objective_value(schedule, objective)
    metrics = schedule.metrics

    def raise_bound(bound: float, reason: str) -> None:
        # Each rise at once: an interrupt keeps it. A relaxation's optimum is at most the
        # schedule's value (rounding in ticks only lowers it); anything above would be no
        # bound, and is not taken.
        if bound > value * (1 + SAME):
            return
        if metrics.lower_bound is None or bound > metrics.lower_bound:
            if value <= bound * (1 + SAME):
                # Closed: the schedule is proven optimal, as the solver says it (tracker).
                metrics.lower_bound, metrics.gap, metrics.status = value, 0.0, "optimal"
            else:
                metrics.lower_bound, metrics.gap = bound, (value - bound) / value

    devicebound.device_subset_bound(
        relaxed,
        upper=value,
        deadline=deadline,
        seed=seed,
        threads=threads,
        on_bound=raise_bound,
        objective=objective,
        incumbent=schedule.devices if relaxed is problem else None,
    )

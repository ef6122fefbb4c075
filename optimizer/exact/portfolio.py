"""The `auto` method: known schedules first, then exact models and window search.

1. Every applicable generator and a few list-scheduler policies; the best one that fits
   the memory limit is the incumbent (auto is never worse than it).
2. Where a pair of devices makes a small model: a share of the time raising the lower
   bound with exact relaxations on growing sets of devices (optimizer.exact.devicebound).
3. Small problems (up to FULL_MODEL_OPS ops): a short window search to sharpen the
   incumbent, then the whole CP-SAT model hinted with it, which can prove optimality.
4. Larger problems: a periodic steady state solved once and unrolled
   (optimizer.exact.periodic) for a share of the time, then window search
   (optimizer.exact.neighbourhood) from the best schedule until the time limit or the
   lower bound is reached.
"""

from __future__ import annotations

import time

from optimizer.exact import devicebound
from optimizer.exact.canonical import canonical
from optimizer.exact.cpsat import solve_cpsat_subproblem
from optimizer.exact.incumbents import Candidate, candidate, generator_candidates
from optimizer.exact.listsched import list_schedule, policies
from optimizer.exact.neighbourhood import neighbourhood_search
from optimizer.exact.options import SolveOptions
from optimizer.exact.periodic import periodic_orders
from optimizer.exact.subproblem import full_subproblem
from optimizer.exact.timescale import IntegerTables, integer_tables, tick_problem
from optimizer.exact.tracker import Tracker
from optimizer.problem import Problem
from optimizer.simulate import simulate, simulate_times

# Up to this many ops the whole model is worth running: CP-SAT proves p=4, m=16
# (192 ops) optimal in seconds when hinted, and stalls far beyond ~1000.
FULL_MODEL_OPS = 600
# Share of the time the window search gets before the whole model on small problems.
WINDOW_SHARE_SMALL = 0.25
# Share of the time left after the starting points that periodic patterns may take.
PERIODIC_SHARE = 0.2
# Share of the time left after the starting points that the device relaxations may take:
# at p = 8, m = 16 under a tight limit they lift the bound from 88.7 to 92.5 (optimum
# <= 94) in ~15 s, where the whole model proves nothing above 88.7 in minutes.
RELAXATION_SHARE = 0.3


# Share of the time limit the known schedules may take at most (they are usually far
# quicker; the cap protects the time limit from a family that runs long).
GENERATOR_SHARE = 0.4


def starting_points(problem: Problem, tracker: Tracker) -> list[Candidate]:
    """Offer every generator and list-scheduler policy to the tracker; return them all.

    When no known schedule fits, the first list-scheduler policy runs even past the time
    limit, so there is a schedule that fits whenever one exists, however short the limit.
    """
    found, _ = generator_candidates(problem, deadline=tracker.began + GENERATOR_SHARE * tracker.time_limit)
    for c in found:
        tracker.offer(c.schedule, c.name)
    for policy in policies():
        # Once a fitting schedule is known and the known schedules' share of the time is
        # spent, a list schedule (as slow as a simulation) would overrun a short limit.
        if tracker.best is not None and (tracker.left() <= 0 or tracker.elapsed() >= GENERATOR_SHARE * tracker.time_limit):
            break
        orders = list_schedule(problem, policy)
        if orders is not None:
            c = candidate(problem, str(policy), orders)
            found.append(c)
            tracker.offer(c.schedule, c.name)
    return found


def whole_model(problem: Problem, tables: IntegerTables, options: SolveOptions, tracker: Tracker, time_limit: float) -> None:
    """The whole CP-SAT model hinted with the incumbent; offers its solution, raises the bound."""
    hint = None
    if tracker.best is not None:
        hint = simulate_times(tick_problem(problem, tables), canonical(tracker.best.order()))
    sub = full_subproblem(problem, tables, hint, options.symmetry_breaking)
    scale = tables.time_scale
    tracker.models_ran = True
    tracker.report(f"cpsat, {tables.describe()}")  # says whether the time grid is exact

    def on_solution(value: int, bound: int) -> None:
        tracker.report("cpsat", incumbent=value / scale)

    result = solve_cpsat_subproblem(
        sub, time_limit=time_limit, seed=options.seed, threads=options.threads, objective=options.objective, on_solution=on_solution
    )
    if result.starts is not None:
        tracker.offer(simulate(problem, sub.orders_from_starts(result.starts)), "cpsat")
    tracker.raise_bound(tables.bound_to_time(result.bound, options.objective, problem.num_devices), "CP-SAT's proven bound")
    if result.status == "optimal" and tables.proves_optimality(options.objective) and result.starts is not None:
        tracker.proven = True
    if result.interrupted:
        raise KeyboardInterrupt


def window_search(problem: Problem, tables: IntegerTables, options: SolveOptions, tracker: Tracker, until: float) -> None:
    start = tracker.best
    assert start is not None, "window search starts from an incumbent"
    origin = tracker.best_by
    tracker.models_ran = True
    neighbourhood_search(
        problem,
        tables,
        canonical(start.order()),
        deadline=until,
        seed=options.seed,
        threads=options.threads,
        objective=options.objective,
        target=tracker.bound,
        on_improve=lambda schedule: tracker.offer(schedule, f"lns({origin})"),
    )


def solve_auto(problem: Problem, options: SolveOptions, tracker: Tracker) -> None:
    starting_points(problem, tracker)
    if tracker.best is None or tracker.closed() or tracker.left() <= 0:
        return
    if devicebound.applicable(problem, objective=options.objective):
        relaxation_bounds(problem, options, tracker, time.monotonic() + RELAXATION_SHARE * tracker.left())
        if tracker.closed() or tracker.left() <= 0:
            return
    tables = integer_tables(problem)
    ops = 3 * problem.num_stages * problem.num_microbatches
    if ops <= FULL_MODEL_OPS:
        window_search(problem, tables, options, tracker, time.monotonic() + WINDOW_SHARE_SMALL * tracker.left())
        if not tracker.closed() and tracker.left() > 0:
            whole_model(problem, tables, options, tracker, tracker.left())
    else:
        periodic_patterns(problem, tables, options, tracker, time.monotonic() + PERIODIC_SHARE * tracker.left())
        if not tracker.closed():
            window_search(problem, tables, options, tracker, tracker.deadline)


def relaxation_bounds(problem: Problem, options: SolveOptions, tracker: Tracker, until: float) -> None:
    """Raise the bound with exact relaxations on sets of devices (single devices for the span)."""
    devicebound.device_subset_bound(
        problem,
        upper=tracker.best_value,
        deadline=until,
        seed=options.seed,
        threads=options.threads,
        on_bound=lambda value, reason: tracker.raise_bound(value, reason),
        objective=options.objective,
    )


def periodic_patterns(problem: Problem, tables: IntegerTables, options: SolveOptions, tracker: Tracker, until: float) -> None:
    """Offer unrolled periodic patterns, shortest period first, until one fits the limit."""

    def fits(orders) -> bool:
        return simulate(problem, orders).fits_memory()

    for name, orders in periodic_orders(problem, tables, deadline=until, seed=options.seed, threads=options.threads, fits=fits):
        tracker.offer(simulate(problem, orders), name)

"""The solver API: `solve(problem, method, options, on_progress) -> Schedule`.

method "auto" runs the portfolio (optimizer.exact.portfolio), "cpsat" and "milp" the
whole model hinted with the best starting point. Every method returns the best schedule
that fits the memory limit with lower_bound, gap, status ("optimal" when proven,
"feasible" when an exact model took part, "heuristic" otherwise), method_won and
solve_seconds. Ctrl-C (KeyboardInterrupt) ends the search and returns the best so far.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence

from optimizer.errors import InputError, PipeschedError
from optimizer.exact.canonical import canonical
from optimizer.exact.errors import NoScheduleFoundError
from optimizer.exact.incumbents import Candidate, closest
from optimizer.exact.options import ProgressCallback, SolveOptions, checked_options
from optimizer.exact.portfolio import bound_first, problem_bound, solve_auto, starting_points, take_whole_model_result, whole_model
from optimizer.exact.spantiming import final_timing_seconds
from optimizer.exact.subproblem import full_subproblem
from optimizer.exact.timescale import integer_tables
from optimizer.exact.tracker import Tracker
from optimizer.interrupts import interrupts_deferred
from optimizer.ops import fusing_can_win
from optimizer.problem import Problem, require_problem
from optimizer.schedule import Schedule
from optimizer.schedules.listengine import check_memory_feasible

METHODS = ("auto", "cpsat", "milp")
# The whole-model methods build every op into one model before the clock can stop them
# (`benchmarks/timelimit.py`, 2 s limit, 2 cores): CP-SAT returned 1.6 s late at 3072 ops
# and 6.4 s late at 6144; the big-M MILP took 7.3 s at 768 ops and 82 s at 1536 (PuLP
# writes a pair of ordering binaries for every two ops of a device).
WHOLE_MODEL_MAX_OPS = {"cpsat": 3200, "milp": 400}
# The least time left after the starting points for which cpsat and milp build their model
# (with a fitting schedule known): below it the limit asked for a first schedule only
# (--time-limit 0.01 took 2.3-3.2 s with the MILP built, 0.6 s without).
MODEL_MIN_SECONDS = 0.25
# A fused-or-split choice (optimizer.ops.fusing_can_win) weighs as this many ops more: with
# every backward a choice (BW shorter than B + W, B allocating, under a limit) CP-SAT's
# presolve ran 3.0 s past a 1 s limit at 1920 ops and 8.5 s at 3192, against 2.0 s
# at 1584 (p = 8); without choices 3192 ops ran 1.6-2 s past it.
CHOICE_WEIGHT = 2


def whole_model_refusal(problem: Problem, method: str) -> str | None:
    """Why `method` refuses `problem` up front (a whole model too large to keep its time
    limit), or None when it takes it."""
    if method not in WHOLE_MODEL_MAX_OPS:
        return None
    tables = problem.tables()
    choosing = sum(fusing_can_win(tables, s, k) for s in range(problem.num_stages) for k in range(problem.num_slices))
    ops, choices = problem.num_ops, choosing * problem.num_microbatches
    if ops + CHOICE_WEIGHT * choices <= WHOLE_MODEL_MAX_OPS[method]:
        return None
    held = f"all {ops} ops" + (f" and {choices} fused-or-split choices (each weighs as {CHOICE_WEIGHT} ops)" if choices else "")
    return (
        f"method: {method} builds one model of {held} and ends within seconds of its time limit (its build counts) "
        f"up to {WHOLE_MODEL_MAX_OPS[method]} ops; use --method auto, which decomposes larger problems"
    )


def solve(
    problem: Problem,
    method: str = "auto",
    options: SolveOptions | None = None,
    on_progress: ProgressCallback | None = None,
    starts: Sequence[tuple[str, Schedule]] = (),
    *,
    retime_starts: bool = True,
) -> Schedule:
    """Solve `problem` within options.time_limit; see the module doc. `starts` are (name,
    schedule of `problem`) given by the user: offered first, so the result is never worse
    than one of them that fits the memory limit. Each start's order is timed on `problem`
    (`retime_starts`), or, with False, taken as it is: schedules of this very problem,
    already timed by pipesched (the pareto sweep's points, where timing each earlier point
    again at every limit would cost a simulation per point and limit)."""
    require_problem(problem)
    options = checked_options(options if options is not None else SolveOptions())
    if method not in METHODS:
        raise InputError(f"method: '{method}' is not one of {', '.join(METHODS)}")
    given_starts = _starts_of(problem, starts, retime_starts)
    refusal = whole_model_refusal(problem, method)
    if refusal is not None:
        raise InputError(refusal)
    if method == "milp":
        _milp().make_solver(options.solver, options.time_limit, options.threads)  # an unknown name fails now, not later
    check_memory_feasible(problem)
    # The final order's timing for the span is kept out of the phases' time (at most half
    # of it: a short limit still gets its starting points).
    reserve = min(0.5 * options.time_limit, final_timing_seconds(problem, options.objective))
    tracker = Tracker(options.objective, options.time_limit, on_progress, finish_reserve=reserve)
    early = bound_first(problem, options)
    if early:
        problem_bound(problem, options, tracker, within_time=False)
    for name, given in given_starts:
        tracker.offer(given, name)  # one over the memory limit is left out
    candidates: list[Candidate] = []
    interrupted = False
    try:
        if method == "auto":
            solve_auto(problem, options, tracker, bound_later=not early)
        else:
            candidates = starting_points(problem, tracker)
            if not early:
                problem_bound(problem, options, tracker, within_time=True)
            # With less than MODEL_MIN_SECONDS left after the starting points and one of
            # them fitting, the model is not built: its build and back end (2-3 s for the
            # MILP, which gets at least 1 s) would only overrun a limit that left it nothing.
            if not tracker.closed() and (tracker.best is None or tracker.left() >= MODEL_MIN_SECONDS):
                if method == "cpsat":
                    whole_model(problem, integer_tables(problem), options, tracker, tracker.deadline)
                else:
                    _whole_milp(problem, options, tracker)
    except KeyboardInterrupt:
        interrupted = True
    with _ignoring_interrupts() if interrupted else contextlib.nullcontext():
        # Ctrl-C again while the best so far becomes the result would lose it.
        if interrupted:
            if tracker.best is None:
                raise KeyboardInterrupt
            tracker.report("interrupted")
        schedule = tracker.result(method)
    if schedule is None:
        near = closest(candidates)
        hint = f"; closest was {near.name}, {near.overshoot:.1%} over the limit" if near else ""
        raise NoScheduleFoundError(f"no schedule within the memory limit found in {options.time_limit:g} s{hint}")
    return schedule


def _starts_of(problem: Problem, starts: Sequence[tuple[str, Schedule]], retime: bool = True) -> list[tuple[str, Schedule]]:
    """Each start's order timed on `problem` (only the order counts, as for `--start`), or
    InputError naming the start when it is not an order of the problem's ops that can run:
    a schedule of another problem, an op missing, an order that deadlocks."""
    from optimizer.validate import checked_schedule

    timed = []
    for entry in starts:
        pair = isinstance(entry, Sequence) and not isinstance(entry, str) and len(entry) == 2
        if not (pair and isinstance(entry[0], str) and isinstance(entry[1], Schedule)):
            raise InputError(f"starts: each start is a (name, Schedule) pair, got {type(entry).__name__}")
        name, given = entry
        if not retime:  # schedules of this very problem, timed by pipesched
            timed.append((name, given))
            continue
        try:
            # Memory aside: the tracker leaves out a start over the limit.
            timed.append((name, checked_schedule(problem, given.order(), f"starts: {name}", name, memory=False, rules=False)))
        except PipeschedError as error:
            raise InputError(str(error)) from None
    return timed


@contextlib.contextmanager
def _ignoring_interrupts() -> Iterator[None]:
    """Ignore Ctrl-C during the block (main thread, default handler only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _milp():
    """The MILP module, imported on first use: PuLP is an optional extra (pipesched[milp])."""
    try:
        with interrupts_deferred():  # PuLP tries highspy under a bare except: a Ctrl-C there is lost
            from optimizer.exact import milp
    except ImportError as error:
        raise InputError(f"method: milp needs PuLP ({error}); install it with pip install 'pipesched[milp]'") from None
    return milp


def _whole_milp(problem: Problem, options: SolveOptions, tracker: Tracker) -> None:
    tables = integer_tables(problem, relax_memory=True)  # so that its bound holds (whole_model's doc)
    hint = canonical(tracker.best.order(), problem) if tracker.best is not None else None
    sub = full_subproblem(problem, tables, hint, options.symmetry_breaking)
    tracker.models_ran = True
    tracker.report(f"milp, {tables.describe()}")  # says whether the time grid is exact
    result = _milp().solve_milp_subproblem(
        sub,
        time_limit=max(1.0, tracker.left()),
        solver=options.solver,
        threads=options.threads,
        seed=options.seed,
        objective=options.objective,
    )
    label = f"milp({options.solver})"
    take_whole_model_result(problem, tables, sub, result, options, tracker, label, f"{label} proven bound")

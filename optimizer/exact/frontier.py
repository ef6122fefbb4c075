"""Memory against speed: solve one problem under a sweep of memory limits.

Each limit of LOW:HIGH:STEP is solved with `auto` (the time limit applies per point); every
known schedule (those built within the share of one point's time that `solve` gives them)
is placed beside the curve at the peak memory it needs. Limits below what one microbatch
needs are reported as infeasible points, not errors. Ctrl-C ends the sweep: the limits
solved so far are returned, the interrupted one with its best schedule so far.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from optimizer.errors import InfeasibleError, InputError, PipeschedError
from optimizer.exact.api import solve
from optimizer.exact.incumbents import generator_candidates
from optimizer.exact.options import Progress, SolveOptions, checked_options, positive_real
from optimizer.exact.portfolio import GENERATOR_SHARE
from optimizer.io import describe_validation_error
from optimizer.problem import MAX_VALUE, Problem, require_problem
from optimizer.schedule import Schedule, fits_limits


@dataclass
class ParetoPoint:
    limit: float | list[float]  # a per-device list when given so (Python API)
    feasible: bool
    makespan: float | None = None
    bubble: float | None = None
    bound: float | None = None
    gap: float | None = None
    status: str | None = None
    method_won: str | None = None
    peak_memory: float | None = None
    note: str | None = None


@dataclass
class GeneratorPoint:
    name: str
    peak_memory: float
    makespan: float
    bubble: float


@dataclass
class ParetoCurve:
    points: list[ParetoPoint]
    generators: list[GeneratorPoint]
    time_limit: float
    problem: dict = field(default_factory=dict)
    interrupted: bool = False  # Ctrl-C ended the sweep: `points` are the limits solved so far

    def to_json(self) -> dict:
        """The curve as `pipesched.pareto` JSON (optimizer/formats/pareto_json.py)."""
        from optimizer.formats.pareto_json import curve_json

        return curve_json(self)


# The most limits one sweep takes (each is a solve of its own).
MAX_LIMITS = 1000


def parse_limits(text: str) -> list[float]:
    """ "LOW:HIGH:STEP" -> [LOW, LOW+STEP, ..., <= HIGH]; a single number is one limit."""
    parts = text.split(":")
    try:
        values = [float(part) for part in parts]
    except ValueError:
        raise InputError(f"limits: '{text}' is not LOW:HIGH:STEP with numbers") from None
    if len(values) == 1:
        start = stop = values[0]
        step = 1.0
    elif len(values) == 3:
        start, stop, step = values
    else:
        raise InputError(f"limits: '{text}' is not LOW:HIGH:STEP")
    if not all(math.isfinite(v) for v in values):
        raise InputError(f"limits: '{text}' needs finite numbers")
    if start <= 0 or step <= 0 or stop < start:
        raise InputError(f"limits: '{text}' needs 0 < LOW <= HIGH and STEP > 0")
    if stop > MAX_VALUE:
        raise InputError(f"limits: '{text}' goes above {MAX_VALUE:g}, the largest memory value pipesched takes")
    steps = (stop - start) / step
    # HIGH counts when the steps reach it but for a rounding: 3:3.0000004:0.0000001 is
    # 3.9999999996 steps, and HIGH was dropped.
    if abs(steps - round(steps)) < 1e-6:
        steps = round(steps)
    if steps >= MAX_LIMITS:
        raise InputError(f"limits: '{text}' gives more than {MAX_LIMITS} limits; use a larger STEP")
    count = int(steps) + 1
    if count > MAX_LIMITS:
        raise InputError(f"limits: '{text}' gives {count} limits; use a larger STEP")
    # Twelve significant digits, not decimals: 0.1 + 2 * 0.1 is 0.3, and a limit of 2e-13
    # stays 2e-13 (rounded to 12 decimals it was 0, refused as not positive).
    return [float(f"{start + k * step:.12g}") for k in range(count)]


def _checked_limits(limits: object, num_devices: int) -> list:
    """A list of limits given in Python, each a positive finite number or a per-device list
    of them, at most MAX_LIMITS (InputError naming the first that is not): a NaN or infinite
    limit would otherwise be a point marked infeasible, or no limit at all."""

    try:
        values = list(limits)  # type: ignore[call-overload]
    except TypeError:
        raise InputError(f"limits: expected 'LOW:HIGH:STEP' or a list of limits, got {type(limits).__name__}") from None
    if len(values) > MAX_LIMITS:
        raise InputError(f"limits: {len(values)} limits is more than the {MAX_LIMITS} pareto takes")
    checked: list = []
    for k, value in enumerate(values):
        one = positive_real(value, MAX_VALUE)
        listed = isinstance(value, (list, tuple)) and len(value) == num_devices
        each = [positive_real(v, MAX_VALUE) for v in value] if listed else [None]
        if one is not None:
            checked.append(one)
        elif all(v is not None for v in each):
            checked.append(each)
        else:
            raise InputError(
                f"limits.{k}: {value!r} is not a memory limit (a number above 0 and at most {MAX_VALUE:g}, "
                f"or a list of {num_devices} of them, one per device)"
            )
    return checked


def _with_limit(problem: Problem, limit: float) -> Problem:
    data = problem.model_dump(mode="json")
    data["memory_limit"] = limit
    try:
        return Problem.model_validate(data)
    except ValidationError as error:  # the limit is below one forward of some stage
        raise InfeasibleError(describe_validation_error(error)) from None


def pareto(
    problem: Problem,
    limits: Sequence[float] | str,
    options: SolveOptions | None = None,
    on_point: Callable[[ParetoPoint], None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> ParetoCurve:
    """Solve `problem` under every limit; see the module doc."""
    require_problem(problem)
    options = checked_options(options if options is not None else SolveOptions(time_limit=10.0))
    values = parse_limits(limits) if isinstance(limits, str) else _checked_limits(limits, problem.num_devices)
    unlimited = Problem.model_validate({**problem.model_dump(mode="json"), "memory_limit": None})
    # The known schedules get the share of one limit's time that `solve` gives them: at
    # the size limit, building all of them takes longer than a short time limit.
    # Placed as their papers define them (GPipe's and 1F1B's backwards fused), as
    # `compare` shows them; the solver's starting points are their canonical forms.
    found, _ = generator_candidates(unlimited, deadline=time.monotonic() + GENERATOR_SHARE * options.time_limit, as_published=True)
    generators = [
        GeneratorPoint(c.name, max(c.schedule.metrics.peak_memory), c.schedule.makespan, c.schedule.metrics.bubble_ratio) for c in found
    ]
    points = []
    interrupted = False

    def watch(progress: Progress) -> None:
        nonlocal interrupted
        interrupted = interrupted or progress.phase == "interrupted"
        if on_progress is not None:
            on_progress(progress)

    solved: list[Schedule] = []
    for limit in values:
        try:
            point, schedule = _solve_point(problem, limit, options, watch, solved)
        except KeyboardInterrupt:  # before this limit had any schedule: the points so far stand
            interrupted = True
            break
        points.append(point)
        if schedule is not None:
            solved.append(schedule)
        try:
            if on_point is not None:
                on_point(point)
        except KeyboardInterrupt:  # while reporting a solved point: it stands
            interrupted = True
        if interrupted:  # this limit's best so far is kept; the sweep ends here
            break
    return ParetoCurve(points, generators, options.time_limit, unlimited.to_json(), interrupted)


def _solve_point(
    problem: Problem, limit: float, options: SolveOptions, on_progress: Callable[[Progress], None], solved: Sequence[Schedule]
) -> tuple[ParetoPoint, Schedule | None]:
    """The point at `limit`, and its schedule. The schedules of the limits solved before
    that fit this one start its search: a looser limit then never gets a longer schedule
    than a tighter one did (the search's end point varies; 4 of 132 random curves were
    longer at a looser limit)."""
    try:
        limited = _with_limit(problem, limit)
        limits = limited.tables().limit
        starts = [
            (f"point at limit {_limit_name(s.problem.memory_limit)}", _retimed(limited, s))
            for s in solved
            if fits_limits(s.metrics.peak_memory, limits)
        ]
        schedule = solve(limited, "auto", options, on_progress, starts=starts, retime_starts=False)
    except PipeschedError as error:
        # Proven infeasible, or only nothing found in time: the file and the table say which.
        status = "infeasible" if isinstance(error, InfeasibleError) else "unknown"
        return ParetoPoint(limit, False, status=status, note=str(error)), None
    m = schedule.metrics
    point = ParetoPoint(limit, True, m.makespan, m.bubble_ratio, m.lower_bound, m.gap, m.status, m.method_won, max(m.peak_memory))
    return point, schedule


def _limit_name(limit: float | list[float] | None) -> str:
    """A limit as a start's name says it: twelve digits, a per-device list in brackets."""
    if isinstance(limit, list):
        return "[" + ", ".join(f"{v:.12g}" for v in limit) + "]"
    return f"{limit:.12g}"


def _retimed(problem: Problem, schedule: Schedule) -> Schedule:
    """`schedule`'s order as a schedule of `problem` (the same problem under another limit:
    the same times)."""
    return Schedule(problem, schedule.method, schedule.devices)

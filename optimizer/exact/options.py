"""What a caller can ask of the solvers, and what they report while they run."""

from __future__ import annotations

import dataclasses
import math
import numbers
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from optimizer.errors import InputError

Objective = Literal["makespan", "span"]
OBJECTIVES: tuple[Objective, ...] = ("makespan", "span")
# The longest time limit taken (about 11 days): any finite number beyond is a typo.
MAX_TIME_LIMIT = 1e6
# CP-SAT takes a 32-bit seed.
SEED_RANGE = (-(2**31), 2**31 - 1)
# CP-SAT workers: beyond this a run only slows down (and a typo could start thousands of threads).
MAX_THREADS = 256


@dataclass(frozen=True)
class SolveOptions:
    """Knobs of :func:`optimizer.exact.solve`.

    time_limit: wall-clock seconds for the whole solve (generators included).
    objective: "makespan" (last end minus first start over all devices) or "span"
        (the longest single device's span, the Zero Bubble bubble convention).
    seed: random seed of CP-SAT and of the neighbourhood search.
    threads: CP-SAT workers; a fixed count is part of what makes a run repeatable.
    solver: MILP back end: "cbc", "highs" or any PuLP solver name (e.g. GUROBI, CPLEX_CMD).
    symmetry_breaking: run the microbatches of one op kind in order on each stage (always
        safe: microbatches are interchangeable, see optimizer.exact.canonical).
    """

    time_limit: float = 60.0
    objective: Objective = "makespan"
    seed: int = 0
    threads: int = 2
    solver: str = "cbc"
    symmetry_breaking: bool = True


def positive_real(value: object, high: float) -> float | None:
    """`value` as a float when it is a real number (numpy's too; not a bool) above 0 and at
    most `high`, else None (an integer beyond any float included)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and 0 < number <= high else None


def checked_options(options: SolveOptions) -> SolveOptions:
    """`options` with each field checked (InputError naming it) and its integers made
    Python ints (a numpy integer is one): the solvers deep inside would otherwise fail on
    them late, or a NaN time limit never end."""
    if not isinstance(options, SolveOptions):
        raise InputError(f"options: expected SolveOptions, got {type(options).__name__}")
    limit = positive_real(options.time_limit, MAX_TIME_LIMIT)
    if limit is None:
        shown = repr(options.time_limit)[:40]
        raise InputError(f"time_limit: must be a number of seconds above 0 and at most {MAX_TIME_LIMIT:g}, got {shown}")
    if options.objective not in OBJECTIVES:
        raise InputError(f"objective: '{options.objective}' is not one of {', '.join(OBJECTIVES)}")
    integers: dict[str, int] = {}
    for name, low, high in (("seed", *SEED_RANGE), ("threads", 1, MAX_THREADS)):
        value = getattr(options, name)
        try:
            number = operator.index(value)  # ints, numpy ints; not floats, not bool
        except TypeError:
            number = None
        if number is None or isinstance(value, bool) or not low <= number <= high:
            raise InputError(f"{name}: must be an integer from {low} to {high}, got {value!r}")
        integers[name] = number
    if not isinstance(options.solver, str) or not options.solver:
        raise InputError(f"solver: must be a MILP back end's name, got {options.solver!r}")
    if not isinstance(options.symmetry_breaking, bool):
        raise InputError(f"symmetry_breaking: must be True or False, got {options.symmetry_breaking!r}")
    return dataclasses.replace(options, time_limit=limit, seed=integers["seed"], threads=integers["threads"])


@dataclass(frozen=True)
class Progress:
    """One report of a running solve: the incumbent and the bound, both in the problem's time units."""

    elapsed: float
    incumbent: float | None
    bound: float
    phase: str
    # Something the user must hear even without the progress line (a bound's worker that
    # failed): shown as one `warning:` line, also with --quiet.
    warning: str | None = None

    @property
    def gap(self) -> float | None:
        if self.incumbent is None or self.incumbent <= 0:
            return None
        return max(0.0, (self.incumbent - self.bound) / self.incumbent)


ProgressCallback = Callable[[Progress], None]

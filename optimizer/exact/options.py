"""What a caller can ask of the solvers, and what they report while they run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Objective = Literal["makespan", "span"]
OBJECTIVES: tuple[Objective, ...] = ("makespan", "span")


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

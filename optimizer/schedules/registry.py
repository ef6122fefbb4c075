"""Schedule generators by name: each maps a problem to per-device op orders."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from optimizer.ops import Op
from optimizer.problem import Problem

Orders = list[list[Op]]


@dataclass(frozen=True)
class Generator:
    """A named schedule family.

    `build` returns per-device op orders (timed later by the simulator); `unsupported`
    returns why the family does not apply to a problem, or None when it does. `slices`:
    the family orders token slices (a problem with num_slices > 1); the others apply to
    unsliced problems only.
    """

    name: str
    summary: str
    build: Callable[[Problem], Orders]
    unsupported: Callable[[Problem], str | None]
    slices: bool = False

    def reason(self, problem: Problem) -> str | None:
        """Why the family does not apply to `problem` (None: it does), slices included."""
        if problem.num_slices > 1 and not self.slices:
            return f"does not order token slices (the problem has num_slices = {problem.num_slices})"
        return self.unsupported(problem)


def any_problem(problem: Problem) -> str | None:
    return None


def linear_only(problem: Problem) -> str | None:
    placement = problem.placement()
    return None if placement == "linear" else f"needs the linear placement (one stage per device), got {placement}"


def sliced_only(problem: Problem) -> str | None:
    """For the token-slice families: at one slice they are their unsliced parent family."""
    return None if problem.num_slices > 1 else "needs token slices (num_slices > 1; pipesched problem --slices K)"

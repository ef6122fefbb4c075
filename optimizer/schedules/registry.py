"""Schedule generators by name: each maps a problem to per-device op orders."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from optimizer.problem import Problem
from optimizer.schedule import Op

Orders = list[list[Op]]


@dataclass(frozen=True)
class Generator:
    """A named schedule family.

    `build` returns per-device op orders (timed later by the simulator); `unsupported`
    returns why the family does not apply to a problem, or None when it does.
    """

    name: str
    summary: str
    build: Callable[[Problem], Orders]
    unsupported: Callable[[Problem], str | None]


def any_problem(problem: Problem) -> str | None:
    return None


def linear_only(problem: Problem) -> str | None:
    placement = problem.placement()
    return None if placement == "linear" else f"needs the linear placement (one stage per device), got {placement}"

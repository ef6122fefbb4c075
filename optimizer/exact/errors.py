"""The solver's own user-facing error: time ran out before any schedule fit the limit."""

from __future__ import annotations

from optimizer.errors import PipeschedError


class NoScheduleFoundError(PipeschedError):
    """Not proven infeasible, but nothing that fits was found in time (exit 4)."""

    exit_code = 4

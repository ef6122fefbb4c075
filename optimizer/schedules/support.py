"""Placement checks shared by the families that only apply to one stage layout.

Each returns a one-line reason when the problem does not fit, or None when it does,
the contract of `Generator.unsupported`.
"""

from __future__ import annotations

from optimizer.problem import Problem


def vshape_only(problem: Problem) -> str | None:
    placement = problem.placement()
    if placement == "vshape":
        return None
    return f"needs the vshape placement (2 stages per device, down and back), got {placement}"


def interleaved_chunks(problem: Problem) -> int | None:
    """The chunk count V when stage s sits on device s % p, else None.

    Checked on the devices rather than the placement name, because small cases have
    several names (p = 1 with two stages also reads as vshape).
    """
    p, n = problem.num_devices, problem.num_stages
    if n % p == 0 and all(stage.device == s % p for s, stage in enumerate(problem.stages)):
        return n // p
    return None

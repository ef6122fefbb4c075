"""Random problems with token slices and a fused backward time on an exact time grid.

Shared by the tests of the exact stack on sliced and fused-or-split problems: shares,
costs and times with two decimals keep every slice's time on a grid of 1e-4, where the
integer models' proofs of optimality hold (factories.random_problem's slices do not).
"""

from __future__ import annotations

import random

from factories import random_problem

from optimizer.problem import Problem


def sliced_problem(
    rng: random.Random,
    p: int,
    m: int,
    num_slices: int,
    placement: str = "linear",
    *,
    limit: float | None = None,
    fused_ratio: float | None = None,
    decimals: int | None = 2,
) -> Problem:
    """A random problem with `num_slices` slices of random shares and costs (later slices dearer).

    fused_ratio: each stage's fused backward is this times B + W (None: B + W, the default).
    decimals: shares, costs and times on that many decimals (an exact grid when the
    products stay within the integer models' four).
    """
    base = random_problem(rng, p, m, placement, limit=limit, decimals=decimals)
    data = base.model_dump()
    if num_slices > 1:
        weights = [rng.randint(1, 4) for _ in range(num_slices)]
        shares = _fractions(weights)
        # Attention makes later slices dearer: costs grow with the prefix.
        costs = _fractions(sorted(w * (k + 1) for k, w in enumerate(weights)))
        data["num_slices"] = num_slices
        # The base limit fits one whole microbatch; its slices need no more.
        data["slices"] = [{"share": a, "cost": c} for a, c in zip(shares, costs)]
    if fused_ratio is not None:
        for stage in data["stages"]:
            stage["backward"] = round(fused_ratio * (stage["backward_input"] + stage["backward_weight"]), 2)
    return Problem.model_validate(data)


def _fractions(weights: list[int]) -> list[float]:
    """Weights as fractions with two decimals summing to exactly 1 (the last takes the rest)."""
    total = sum(weights)
    parts = [max(0.01, round(w / total, 2)) for w in weights[:-1]]
    return parts + [round(1.0 - sum(parts), 2)]

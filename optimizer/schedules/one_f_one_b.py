"""1F1B (PipeDream-Flush, Narayanan et al. 2021): one forward, one fused backward.

Device r warms up with min(p-r-1, m) forwards, then alternates F and BW, then drains
the remaining backwards. Peak memory p microbatches on device 0; bubble rate
(p-1)/(m+p-1). Linear placement.
"""

from __future__ import annotations

from optimizer.problem import Problem
from optimizer.schedules.registry import Generator, Orders, linear_only
from optimizer.schedules.units import backward_unit, forward_unit


def one_f_one_b(problem: Problem) -> Orders:
    return fused_1f1b(problem, slices=1)


def fused_1f1b(problem: Problem, slices: int) -> Orders:
    """1F1B over units: microbatches, or with `slices` > 1 token slices (Seq1F1B), whose
    warm-up is K - 1 units deeper (the last device needs a microbatch's K forwards before
    its first backward)."""
    p, units = problem.num_devices, problem.num_microbatches * slices
    orders: Orders = []
    for r in range(p):
        warmup = min(p - r - 1 + slices - 1, units)
        ops = [forward_unit(r, u, slices) for u in range(warmup)]
        for u in range(units - warmup):
            ops += [forward_unit(r, warmup + u, slices), backward_unit(r, u, slices, "BW")]
        ops += [backward_unit(r, u, slices, "BW") for u in range(units - warmup, units)]
        orders.append(ops)
    return orders


GENERATOR = Generator("1f1b", "1F1B: warm-up forwards, then one forward and one fused backward", one_f_one_b, linear_only)

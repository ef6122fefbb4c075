"""1F1B (PipeDream-Flush, Narayanan et al. 2021): one forward, one fused backward.

Device r warms up with min(p-r-1, m) forwards, then alternates F and BW, then drains
the remaining backwards. Peak memory p microbatches on device 0; bubble rate
(p-1)/(m+p-1). Linear placement.
"""

from __future__ import annotations

from optimizer.ops import Op
from optimizer.problem import Problem
from optimizer.schedules.registry import Generator, Orders, linear_only


def one_f_one_b(problem: Problem) -> Orders:
    p, m = problem.num_devices, problem.num_microbatches
    orders: Orders = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        ops = [Op("F", r, i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [Op("F", r, warmup + i), Op("BW", r, i)]
        ops += [Op("BW", r, i) for i in range(m - warmup, m)]
        orders.append(ops)
    return orders


GENERATOR = Generator("1f1b", "1F1B: warm-up forwards, then one forward and one fused backward", one_f_one_b, linear_only)

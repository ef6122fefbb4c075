"""ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", figure 3 top).

1F1B's warm-up (p-r-1 forwards) and memory (p microbatches on every device), with B and
W split and device r keeping r W's pending until the cool-down. Bubble time
(p-1)(F+B-W) at comm 0 when W <= F and W <= B (a third of 1F1B's at F=B=W).
Linear placement.
"""

from __future__ import annotations

from optimizer.problem import Problem
from optimizer.schedules.registry import Generator, Orders, linear_only
from optimizer.schedules.zero_bubble import split_backward_1f1b


def zb_h1(problem: Problem) -> Orders:
    p = problem.num_devices
    return split_backward_1f1b(problem, warmup=lambda r: p - r - 1, deferred=lambda r: r)


GENERATOR = Generator(
    "zb-h1",
    "ZB-H1: 1F1B memory, split backward, W's deferred into the cool-down",
    zb_h1,
    linear_only,
)

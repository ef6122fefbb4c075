"""ZB-H2 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", figure 3 bottom).

Twice 1F1B's warm-up (2(p-r-1) forwards) fills the start-up bubble, and device r keeps
2r W's pending to fill the cool-down. Peak 2p-1 microbatches on every device; span of
the longest device m(F+B+W) + (p-1)(F+B+2c-2W), zero bubble at F=B=W and comm 0.
Linear placement.
"""

from __future__ import annotations

from optimizer.problem import Problem
from optimizer.schedules.registry import Generator, Orders, linear_only
from optimizer.schedules.zero_bubble import split_backward_1f1b


def zb_h2(problem: Problem) -> Orders:
    p = problem.num_devices
    return split_backward_1f1b(problem, warmup=lambda r: 2 * (p - r - 1), deferred=lambda r: 2 * r)


GENERATOR = Generator(
    "zb-h2",
    "ZB-H2: 2p-1 microbatches of memory, split backward, zero bubble at F=B=W",
    zb_h2,
    linear_only,
)

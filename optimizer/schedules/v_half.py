"""V-Half (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory", section 4).

Building block on the V placement with offsets, for device i,
[2i, 3p-2-i, 3p+d+2i-1, 6p+d-2-i], d = 3 when p is even else 0: half of 1F1B's
activation memory, (p+2)//2 microbatches, and about half of 1F1B's bubble.
"""

from __future__ import annotations

from optimizer.problem import Problem
from optimizer.schedules.building_block import building_block_orders
from optimizer.schedules.registry import Generator, Orders
from optimizer.schedules.support import vshape_only


def v_half_offsets(p: int) -> list[list[int]]:
    d = 3 if p % 2 == 0 else 0
    return [[2 * i, 3 * p - 2 - i, 3 * p + d + 2 * i - 1, 6 * p + d - 2 - i] for i in range(p)]


def v_half(problem: Problem) -> Orders:
    return building_block_orders(v_half_offsets(problem.num_devices), problem.num_microbatches)


GENERATOR = Generator(
    "v-half",
    "V-Half: building block on the V placement, half of 1F1B's activation memory",
    v_half,
    vshape_only,
)

"""V-Min (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory", section 4).

Building block on the V placement with offsets, for device i,
[i, 2p-1-i, 2p+d+i, 4p+d-1-i], d = 2 when p % 3 == 0 else 0: a third of 1F1B's
activation memory, (p+4)//3 microbatches, and about two thirds of 1F1B's bubble.
"""

from __future__ import annotations

from optimizer.problem import Problem
from optimizer.schedules.building_block import building_block_orders
from optimizer.schedules.registry import Generator, Orders
from optimizer.schedules.support import vshape_only


def v_min_offsets(p: int) -> list[list[int]]:
    d = 2 if p % 3 == 0 else 0
    return [[i, 2 * p - 1 - i, 2 * p + d + i, 4 * p + d - 1 - i] for i in range(p)]


def v_min(problem: Problem) -> Orders:
    return building_block_orders(v_min_offsets(problem.num_devices), problem.num_microbatches)


GENERATOR = Generator(
    "v-min",
    "V-Min: building block on the V placement, a third of 1F1B's activation memory",
    v_min,
    vshape_only,
)

"""GPipe (Huang et al. 2019): all forwards, then all fused backwards.

Peak memory m microbatches per stage; bubble rate (p-1)/(m+p-1) on the linear placement.
Works for any placement: a device runs its stages' forwards in model order, then their
backwards in reverse model order.
"""

from __future__ import annotations

from optimizer.ops import Op
from optimizer.problem import Problem
from optimizer.schedules.registry import Generator, Orders, any_problem


def gpipe(problem: Problem) -> Orders:
    m = problem.num_microbatches
    orders: Orders = []
    for device in range(problem.num_devices):
        stages = problem.stages_on(device)
        forwards = [Op("F", s, i) for s in stages for i in range(m)]
        backwards = [Op("BW", s, i) for s in reversed(stages) for i in range(m)]
        orders.append(forwards + backwards)
    return orders


GENERATOR = Generator("gpipe", "GPipe: all forwards, then all fused backwards", gpipe, any_problem)

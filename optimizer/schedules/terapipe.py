"""TeraPipe (Li et al. 2021, "TeraPipe: Token-Level Pipeline Parallelism for Training
Large-Scale Language Models"): GPipe's order over token slices.

Each device runs the forwards of every (microbatch, slice) in order, slice by slice
within a microbatch, then the fused backwards microbatch by microbatch, each
microbatch's slices in reverse (a slice's backward waits for the later slices'
backwards on its stage). Devices with several stages run them as GPipe does. At one
slice this is GPipe's order.
"""

from __future__ import annotations

from optimizer.ops import Op
from optimizer.problem import Problem
from optimizer.schedules.registry import Generator, Orders, sliced_only


def terapipe(problem: Problem) -> Orders:
    m, num_slices = problem.num_microbatches, problem.num_slices
    orders: Orders = []
    for device in range(problem.num_devices):
        stages = problem.stages_on(device)
        forwards = [Op("F", s, i, k) for s in stages for i in range(m) for k in range(num_slices)]
        backwards = [Op("BW", s, i, k) for s in reversed(stages) for i in range(m) for k in reversed(range(num_slices))]
        orders.append(forwards + backwards)
    return orders


GENERATOR = Generator(
    "terapipe",
    "TeraPipe: GPipe over token slices (all forwards, then fused backwards, slices in reverse)",
    terapipe,
    sliced_only,
    slices=True,
)

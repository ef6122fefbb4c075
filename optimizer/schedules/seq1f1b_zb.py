"""Seq1F1B with the backward split as ZB-H1 splits it (Sun et al. 2024 pair Seq1F1B with
Zero Bubble's ZB-H1; Qi et al. 2024).

Seq1F1B's units and warm-up ((p - r - 1) + (K - 1) slices on device r), B and W split,
and device r keeping r slice W's pending until the cool-down, as ZB-H1 keeps r
microbatch W's. Linear placement; at one slice, ZB-H1.
"""

from __future__ import annotations

from optimizer.problem import Problem
from optimizer.schedules.registry import Generator, Orders
from optimizer.schedules.seq1f1b import unsupported
from optimizer.schedules.zero_bubble import split_backward_1f1b


def seq1f1b_zb(problem: Problem) -> Orders:
    p, k = problem.num_devices, problem.num_slices
    return split_backward_1f1b(problem, warmup=lambda r: p - r - 1 + k - 1, deferred=lambda r: r, slices=k)


GENERATOR = Generator(
    "seq1f1b-zb",
    "Seq1F1B with ZB-H1's split backward: W's of r slices deferred into the cool-down on device r",
    seq1f1b_zb,
    unsupported,
    slices=True,
)

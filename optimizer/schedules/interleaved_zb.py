"""Interleaved zero bubble: interleaved 1F1B's walk with the backward split, as torch's
ScheduleInterleavedZeroBubble orders it (torchtitan's `InterleavedZeroBubble`).

This is ZB-H1's idea (Qi et al. 2024, "Zero Bubble Pipeline Parallelism") on the
interleaved placement: the depth-first walk of optimizer.schedules.interleaved, with a
warm-up of one forward per device downstream instead of two, (p-r-1) + (V-1)*g, B in
place of the fused backward, and device r keeping r weight gradients pending after its
B's (as optimizer.schedules.zero_bubble does), so that the backward chain runs ahead and
the pending W's fill the cool-down. It holds less memory than interleaved 1F1B and is
shorter where W is a real share of the backward.
"""

from __future__ import annotations

from optimizer.problem import Problem
from optimizer.schedules.interleaved import family_walk, unsupported, walk
from optimizer.schedules.registry import Generator, Orders


def interleaved_zb(problem: Problem) -> Orders:
    return walk(problem, family_walk(problem, split=True))


GENERATOR = Generator(
    "interleaved-zb",
    "Interleaved zero bubble (torch's InterleavedZeroBubble): interleaved 1F1B's walk, split backward, W's deferred",
    interleaved_zb,
    unsupported,
)

"""Seq1F1B (Sun et al. 2024, "Seq1F1B: Efficient Sequence-Level Pipeline Parallelism for
Large Language Model Training"): 1F1B over token slices, with fused backwards.

The units are (microbatch, slice): forwards run through each microbatch's slices in
order, backwards through each microbatch's slices in reverse (the paper's partially
ordered queue: a slice's backward waits for the later slices' backwards). Device r warms
up with (p - r - 1) + (K - 1) units, the paper's count: the last device needs all K
forwards of a microbatch before its first backward. Then one forward unit and one
backward unit alternate. A device holds about p - r + K - 1 slices' activations, under
1F1B's p microbatches once K is below p. Linear placement; at one slice, 1F1B.
"""

from __future__ import annotations

from optimizer.problem import Problem
from optimizer.schedules.one_f_one_b import fused_1f1b
from optimizer.schedules.registry import Generator, Orders, linear_only, sliced_only


def seq1f1b(problem: Problem) -> Orders:
    return fused_1f1b(problem, problem.num_slices)


def unsupported(problem: Problem) -> str | None:
    return sliced_only(problem) or linear_only(problem)


GENERATOR = Generator(
    "seq1f1b", "Seq1F1B: 1F1B over token slices (warm-up deeper by K - 1 slices), fused backwards", seq1f1b, unsupported, slices=True
)

"""The least-memory schedule: microbatches one at a time, every backward fused.

Each device runs microbatch i's forwards on its stages (stage order, slices in order),
its vocabulary passes, then its fused backwards (reverse stage order, slices in
reverse), and only then microbatch i + 1. A device so never holds more than one
microbatch's trajectory with fused backwards, which is `Problem.min_memory_limit()`:
this order fits every limit under which any schedule exists. It is the starting point
of last resort, for limits that only fused backwards fit (a B that allocates keeps its
allocation until its W, so split schedules need more): slow, and the searches that
follow improve on it.

It never deadlocks: the ops of microbatch i on every device wait only for ops of
microbatch i that come earlier in the dependency chain, and each device reaches them
once it has finished microbatch i - 1, which needs nothing from later microbatches.
"""

from __future__ import annotations

from optimizer.exact.incumbents import Candidate, candidate
from optimizer.ops import Kind, Op
from optimizer.problem import Problem
from optimizer.schedules.listengine import short_of
from optimizer.schedules.registry import Orders
from optimizer.schedules.vocab_passes import base_problem


def least_memory_orders(problem: Problem) -> Orders:
    """Per device: each microbatch's forwards, passes and fused backwards before the next's."""
    slices = range(problem.num_slices)
    orders: Orders = [[] for _ in range(problem.num_devices)]
    for d, order in enumerate(orders):
        stages = problem.stages_on(d)
        for i in range(problem.num_microbatches):
            order += [Op(Kind.F, s, i, k) for s in stages for k in slices]
            if problem.vocab_parallel is not None:
                order += [Op(Kind.S, d, i), Op(Kind.T, d, i)]
            order += [Op(Kind.BW, s, i, k) for s in reversed(stages) for k in reversed(slices)]
    return orders


def least_memory_candidate(problem: Problem) -> Candidate:
    return candidate(problem, "least memory", least_memory_orders(problem))


def split_backwards_fit(problem: Problem) -> bool:
    """Whether every device's limit holds one microbatch with every backward split: what the
    list engine needs (with vocabulary passes, on the problem without them whose limit is
    lowered by one pass, which the engine orders before the passes are woven in). Where it
    does not, only fused backwards fit and this module's order is the way to a schedule."""
    engine = base_problem(problem) if problem.vocab_parallel is not None else problem
    short, _ = short_of(engine.split_memory_limit(), engine.tables().limit)
    return not short

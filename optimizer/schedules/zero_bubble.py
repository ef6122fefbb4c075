"""The handcrafted Zero Bubble schedules' common shape (Qi et al. 2024, "Zero Bubble
Pipeline Parallelism", ICLR, section 3).

Both ZB-H1 and ZB-H2 are 1F1B with the backward split into B (input gradient, on the
critical path) and W (weight gradient, free to move): device r warms up with some
forwards, then alternates F and B, and runs a W after a B only once it holds more
than `deferred(r)` pending W's; the pending W's fill the cool-down. Deferring r W's on
device r is what lets the last device finish its B's early, so the backward chain
reaches device 0 sooner.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from optimizer.ops import Op
from optimizer.problem import Problem
from optimizer.schedules.registry import Orders
from optimizer.schedules.units import backward_unit, forward_unit


def run_backward(ops: list[Op], pending: deque[Op], b: Op, keep: int) -> None:
    """Append the B `b`, keep its W pending, and run the oldest pending W's beyond `keep`."""
    ops.append(b)
    pending.append(b._replace(kind="W"))
    while len(pending) > keep:
        ops.append(pending.popleft())


def split_backward_1f1b(problem: Problem, warmup: Callable[[int], int], deferred: Callable[[int], int], slices: int = 1) -> Orders:
    """Linear-placement orders: `warmup(r)` forwards first, then F/B pairs, W's deferred.

    With `slices` > 1 the units are token slices (Seq1F1B): forwards run through every
    microbatch's slices in order, backwards through every microbatch's slices in reverse.
    """
    p, units = problem.num_devices, problem.num_microbatches * slices
    orders: Orders = []
    for r in range(p):
        w, keep = min(warmup(r), units), deferred(r)
        ops = [forward_unit(r, u, slices) for u in range(w)]
        pending: deque[Op] = deque()

        def backward(u: int) -> None:
            run_backward(ops, pending, backward_unit(r, u, slices), keep)

        for u in range(units - w):
            ops.append(forward_unit(r, w + u, slices))
            backward(u)
        for u in range(units - w, units):
            backward(u)
        ops += pending
        orders.append(ops)
    return orders

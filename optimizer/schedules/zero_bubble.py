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


def split_backward_1f1b(problem: Problem, warmup: Callable[[int], int], deferred: Callable[[int], int]) -> Orders:
    """Linear-placement orders: `warmup(r)` forwards first, then F/B pairs, W's deferred."""
    p, m = problem.num_devices, problem.num_microbatches
    orders: Orders = []
    for r in range(p):
        w, keep = min(warmup(r), m), deferred(r)
        ops = [Op("F", r, i) for i in range(w)]
        pending: deque[int] = deque()

        def backward(i: int) -> None:
            ops.append(Op("B", r, i))
            pending.append(i)
            while len(pending) > keep:
                ops.append(Op("W", r, pending.popleft()))

        for i in range(m - w):
            ops.append(Op("F", r, w + i))
            backward(i)
        for i in range(m - w, m):
            backward(i)
        ops += [Op("W", r, i) for i in pending]
        orders.append(ops)
    return orders

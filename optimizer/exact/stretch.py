"""Many microbatches from fewer: a schedule's steady state repeated.

On large microbatch counts the order search has too many ops to move in its time, and a
schedule's steady state degrades with m: at V-Min's memory on the V placement (1.5B,
p = 8) `auto` at 60 s spent 54.5 per added microbatch from m = 24 to 32 and 57.8 from
32 to 64. The same problem with fewer microbatches is searched far better in the same
time, and its steady state carries over: stretching a 30 s schedule of m = 32 to m = 64
gave 3609 where `auto` found 3734 in 60 s.

Stretching keeps the small schedule's warm-up and drain and repeats a window of it in
between. With m' microbatches in the small schedule, q = m - m' added, a pivot c and a
window of r microbatches before it, microbatch i of the large problem takes the start
times of microbatch f(i) of the small one, shifted by (i - f(i)) periods:

* f(i) = i before the pivot (the warm-up),
* f(i) = c - r + ((i - c) mod r) for the q added ones (the window, over and over),
* f(i) = i - q after them (the drain);

the period P is the window's own pace (how far the pivot starts after the window's first
microbatch, over r, averaged over their ops). Each device's order is its ops sorted by
those keys.
Within one microbatch every op keeps its offsets, so its dependencies come first, and
sorting all devices by one key is a topological order: the orders never deadlock.
Memory on a device depends only on its own order, so whether a stretch fits is checked
exactly on the orders (optimizer.schedule.orders_fit); windows where the small schedule is
not periodic may not fit, which is why several pivots and window lengths are tried.

Every microbatch must have the same ops (one slice, no vocabulary passes), as for the
order search that `auto` runs on the smaller problem (optimizer.exact.localsearch).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

from optimizer.ops import Op, dependency_depths
from optimizer.problem import Problem
from optimizer.schedule import Schedule

# Window lengths tried (microbatches). On Zero Bubble's settings at V-Min's memory the
# stretches that won used windows of 3, 4 and 8 at p = 8 and of 1 at p = 16 and 32.
WINDOWS = (1, 2, 3, 4, 6, 8)
# The smaller problem keeps at least this many microbatches per device: at p = 8 on the V
# placement at V-Min's memory no stretch of a 16-microbatch schedule to 64 fit the limit
# or beat v-auto, where 24 and 32 gave 3586 and 3576 against v-auto's 3940.
STEADY_PER_DEVICE = 3


def fewer_count(problem: Problem) -> int | None:
    """How many microbatches the smaller problem has: half, but at least STEADY_PER_DEVICE
    per device so that it has a steady state between warm-up and drain (None: not fewer)."""
    count = max(STEADY_PER_DEVICE * problem.num_devices, math.ceil(problem.num_microbatches / 2))
    return count if count < problem.num_microbatches else None


def fewer_microbatches(problem: Problem, count: int) -> Problem:
    """The same problem with `count` microbatches."""
    return problem.model_copy(update={"num_microbatches": count})


def stretched_orders(problem: Problem, small: Schedule, window: int, pivot: int) -> list[list[Op]]:
    """Per-device orders of `problem` from `small` (fewer microbatches, same stages):
    microbatches `pivot - window` to `pivot - 1` repeated for the added ones (module doc)."""
    fewer = small.problem.num_microbatches
    added = problem.num_microbatches - fewer
    if not 0 < window <= pivot < fewer or added < 0:
        raise ValueError(f"window {window} and pivot {pivot} must lie within the small schedule's {fewer} microbatches")
    start = {(t.kind, t.stage, t.microbatch): t.start for device in small.devices for t in device}
    # The window's pace: how far the pivot starts after the window's first microbatch
    # (ops both have: one may fuse a backward the other splits).
    shifts = [
        began - start[(kind, stage, pivot - window)]
        for (kind, stage, i), began in start.items()
        if i == pivot and (kind, stage, pivot - window) in start
    ]
    period = sum(shifts) / len(shifts) / window

    def source(i: int) -> int:
        if i < pivot:
            return i
        if i < pivot + added:
            return pivot - window + (i - pivot) % window
        return i - added

    depth = dependency_depths(problem.num_stages)
    orders = []
    for device in small.devices:
        # Each microbatch copies its source's ops on the device (a fused backward stays fused).
        by_microbatch: dict[int, list[tuple[str, int, float]]] = {}
        for t in device:
            by_microbatch.setdefault(t.microbatch, []).append((t.kind, t.stage, t.start))
        keyed = []
        for i in range(problem.num_microbatches):
            f = source(i)
            for kind, stage, began in by_microbatch.get(f, []):
                op = Op(kind, stage, i)
                keyed.append((began + (i - f) * period, depth(op), i, op))
        keyed.sort()
        orders.append([op for *_, op in keyed])
    return orders


def stretches(problem: Problem, small: Schedule, deadline: float) -> Iterator[tuple[str, list[list[Op]]]]:
    """(name, orders) of stretches of `small` to `problem`, until `deadline` (time.monotonic):
    every window length of WINDOWS, pivots from the middle of the small schedule outwards
    (its steady state, away from the warm-up and the drain)."""
    fewer = small.problem.num_microbatches
    added = problem.num_microbatches - fewer
    middle = fewer // 2
    pivots = sorted(range(1, fewer), key=lambda c: (abs(c - middle), c))
    # Windows that divide the added count first: the drain then follows the window's phase.
    windows = sorted((w for w in WINDOWS if w <= fewer), key=lambda w: (added % w != 0, w))
    for pivot in pivots:
        for window in windows:
            if time.monotonic() >= deadline:
                return
            if window <= pivot:
                yield f"stretch(m={fewer}, window {window} before microbatch {pivot})", stretched_orders(problem, small, window, pivot)

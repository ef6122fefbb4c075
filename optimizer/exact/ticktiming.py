"""As-soon-as-possible times of an order in integer ticks, on the models' own durations.

The models' hints and the window search's boundary conditions need an order timed on the
integer grid (optimizer.exact.timescale). The simulator times a problem, and a sliced
problem's per-slice ticks are no problem's (each is rounded on its own), so this times
an order on the tick durations directly, with the same rule: an op starts when its
device is free and its dependencies (optimizer.ops) have ended, plus the transfer time
across devices. Orders come from the simulator's own schedules, so they never deadlock;
one that does is a programming error (AssertionError).
"""

from __future__ import annotations

from collections.abc import Sequence

from optimizer.exact.timescale import IntegerTables
from optimizer.ops import Op, TimedOp, completion_key, dependencies


def tick_times(tables: IntegerTables, num_stages: int, orders: Sequence[Sequence[Op]]) -> list[list[TimedOp]]:
    """ASAP times of `orders` in ticks (integers stored as floats, like the simulator's)."""
    num_slices = tables.num_slices
    ended: dict[Op, int] = {}
    head = [0] * len(orders)
    free_at = [0] * len(orders)
    timed: list[list[TimedOp]] = [[] for _ in orders]
    progress = True
    while progress:  # sweep the devices until none can move (at most ops x devices steps)
        progress = False
        for d, ops in enumerate(orders):
            while head[d] < len(ops):
                op = ops[head[d]]
                start = free_at[d]
                ready = True
                for key in dependencies(op, num_stages, num_slices, tables.vocab):
                    if key not in ended:
                        ready = False
                        break
                    start = max(start, ended[key] + tables.delay(key, d))
                if not ready:
                    break
                end = start + tables.op_ticks(op.kind, op.stage, op.slice)
                timed[d].append(TimedOp(op.kind, op.stage, op.microbatch, float(start), float(end), op.slice))
                free_at[d] = end
                head[d] += 1
                progress = True
                done = completion_key(op)
                if done is not None:
                    ended[done] = end
    assert all(head[d] == len(ops) for d, ops in enumerate(orders)), "tick timing of an order that deadlocks"
    return timed

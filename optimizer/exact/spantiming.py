"""Times for an order that minimize the longest device span (the `span` objective).

The simulator's as-soon-as-possible times minimize the makespan of an order, not its
longest device span: a device that starts its first op early and then waits for inputs
has a longer span than it needs. Under the span objective a device may start later, so
the best times of an order solve a system of difference constraints:

    start[b] >= end[a] + delay       for every dependency and device-order pair (a, b)
    end[last_d] - start[first_d] <= Z  for every device d

Every constraint but the last kind follows the order's acyclic graph. Let L[c][d] be the
longest path from the start of device c's first op to the end of device d's last op
(minus infinity when there is none). The system is feasible exactly when no cycle of
span constraints gains time: Z >= the mean weight of every cycle of the device graph
whose edge c -> d weighs L[c][d]. The least such Z is that graph's maximum cycle mean,
found exactly by Karp's algorithm on the p devices (self-loops are each device's own
longest path). With that Z, the earliest times meeting every constraint are the least
fixpoint of the device start times, reached in at most p rounds of relaxation; they are
also the shortest makespan at the optimal span.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from optimizer.ops import Op, TimedOp, completion_key, dependencies, new_tuple, op_duration, transfer_delay
from optimizer.problem import Problem
from optimizer.schedule import Schedule, longest_span
from optimizer.simulate import simulate, simulate_times

# The optimal span is a cycle mean of float path lengths; relaxing the fixpoint at
# exactly that value can cycle on rounding, so it runs at a span this much larger
# (relative), far below the validator's 1e-9 slack.
_SPAN_SLACK = 1e-12


def span_times(problem: Problem, orders: Sequence[Sequence[Op]]) -> list[list[TimedOp]]:
    """The earliest times of `orders` whose longest device span is the least possible."""
    flat: list[tuple[int, int]] = []  # the ops in a topological order, as timed
    asap = simulate_times(problem, orders, run_order=flat)  # also refuses bad placements and deadlocks
    p = len(orders)
    tables = problem.tables()
    device_of = tables.device
    vocab = tables.vocab_rule()

    # --- the order's graph, ops numbered in a topological order ------------------------
    number = {(d, k): j for j, (d, k) in enumerate(flat)}
    ops = [asap[d][k] for d, k in flat]
    duration = np.array([op_duration(tables, t.kind, t.stage, t.slice) for t in ops])
    producer: dict[Op, int] = {}
    for j, t in enumerate(ops):
        key = completion_key(t)
        if key is not None:
            producer[key] = j
    predecessors: list[list[tuple[int, float]]] = [[] for _ in ops]
    for (d, k), j in number.items():
        if k > 0:
            predecessors[j].append((number[(d, k - 1)], 0.0))
        for dep in dependencies(ops[j], problem.num_stages, problem.num_slices, vocab):
            delay = float(transfer_delay(dep, d, device_of, problem.comm_time, tables.barrier_time))
            predecessors[j].append((producer[dep], delay))
    first = np.array([number[(d, 0)] for d in range(p)])
    last = np.array([number[(d, len(orders[d]) - 1)] for d in range(p)])

    # --- longest paths from each device's first start (column p: from time 0) ----------
    longest = np.full((len(ops), p + 1), -np.inf)
    longest[:, p] = 0.0
    longest[first, np.arange(p)] = 0.0
    for j, preds in enumerate(predecessors):
        row = longest[j]
        for i, delay in preds:
            np.maximum(row, longest[i] + (duration[i] + delay), out=row)
    to_last_end = longest[last, :p].T + duration[last]  # [c][d]: first start of c -> last end of d

    # --- the least span: maximum cycle mean of the device graph -------------------------
    span = _maximum_cycle_mean(to_last_end)
    span += _SPAN_SLACK * max(1.0, abs(span))

    # --- the least device start times meeting every span constraint ---------------------
    # start[first_d] >= longest path from any first start c to first_d, and
    # start[first_d] >= end[last_d] - span (the span constraint).
    reach_first = longest[first, :p].T  # [c][d]: first start of c -> first start of d
    through_last = to_last_end - span
    edge = np.maximum(reach_first, through_last)
    floor = np.maximum(longest[first, p], longest[last, p] + duration[last] - span)
    start_first = floor.copy()
    for _ in range(p + 1):
        relaxed = np.maximum(floor, np.max(start_first[:, None] + edge, axis=0))
        if np.array_equal(relaxed, start_first):
            break
        start_first = relaxed
    start = np.maximum(longest[:, p], np.max(longest[:, :p] + start_first[None, :], axis=1))

    timed: list[list[TimedOp]] = [[] for _ in range(p)]
    for j, (d, _k) in enumerate(flat):
        t = ops[j]
        s = float(start[j])
        timed[d].append(new_tuple(TimedOp, (t.kind, t.stage, t.microbatch, s, s + float(duration[j]), t.slice)))
    # Rounding could in principle stop the relaxation short; ASAP times are never wrong.
    return timed if longest_span(timed) <= longest_span(asap) else asap


def _maximum_cycle_mean(weight: np.ndarray) -> float:
    """Karp's algorithm: the largest mean weight of a cycle (-inf entries are no edge)."""
    n = weight.shape[0]
    walk = np.full((n + 1, n), -np.inf)
    walk[0] = 0.0  # a source joined to every node: walks may start anywhere
    for k in range(1, n + 1):
        walk[k] = np.max(walk[k - 1][:, None] + weight, axis=0)
    best = -np.inf
    for v in range(n):
        if not np.isfinite(walk[n, v]):
            continue
        means = [(walk[n, v] - walk[k, v]) / (n - k) for k in range(n) if np.isfinite(walk[k, v])]
        best = max(best, min(means))
    return float(best)


def timed_for(problem: Problem, orders: Sequence[Sequence[Op]], objective: str, method: str = "custom") -> Schedule:
    """The order timed for the objective: ASAP for makespan, least longest span for span."""
    if objective == "span":
        return Schedule(problem, method, span_times(problem, orders))
    return simulate(problem, orders, method)


def affordable(problem: Problem) -> bool:
    """Whether timing an order for the span is cheap enough to do for every candidate.

    The longest paths cost ops x devices vector steps: about 1 s at p = 32, m = 256 on
    the V placement, too slow for every starting point of a short solve; larger problems
    time only the final schedule this way.
    """
    return _timing_steps(problem) <= AFFORDABLE_STEPS


def _timing_steps(problem: Problem) -> int:
    """Ops x devices: the vector steps of timing one order for the span."""
    return 3 * problem.num_stages * problem.num_microbatches * problem.num_slices * problem.num_devices


# Ops x devices of the largest problem whose candidates are all timed for the span
# (p = 16, m = 128 linear: 6144 ops x 16 devices, about 0.1 s each).
AFFORDABLE_STEPS = 100_000
# Seconds per op x device step of that timing: 0.9 s at p = 32, m = 256 on the V
# placement (49k ops x 32 devices) on 2 quiet cores, more at the end of a solve (1.4 s
# kept; with 1.9 s kept, 5 s solves of the four published levels there took 4.3-5.1 s).
SECONDS_PER_STEP = 0.9e-6


def final_timing_seconds(problem: Problem, objective: str) -> float:
    """About how long timing the final order takes where candidates were not timed for
    the span (`affordable`), so that a solve can keep that time for it; else 0."""
    if objective != "span" or affordable(problem):
        return 0.0
    return SECONDS_PER_STEP * _timing_steps(problem)


def retimed_for(schedule: Schedule, objective: str) -> Schedule:
    """`schedule`'s order timed for the objective (unchanged for makespan)."""
    if objective != "span":
        return schedule
    return Schedule(schedule.problem, schedule.method, span_times(schedule.problem, schedule.order()))

"""A memory-safe list scheduler: a quick, always-feasible starting point for any problem.

Devices take decisions in time order. A free device runs, among the ops whose inputs
have arrived, the one its policy prefers (oldest microbatch first). A new microbatch may
enter a device (its forward on the device's first stage) only when the device keeps room
for one more microbatch's forwards on its other stages: then the microbatch closest to
its end can always take its next forward, every limit at or above
problem.min_memory_limit() is free of memory deadlocks, and devices with two chunks
(V shapes) can still fill their memory with first-chunk activations. A few policies (how many microbatches in flight, backward or
forward first, weight gradients early or late) cover the shapes of the known schedules;
the portfolio keeps the best.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from itertools import product

from optimizer.problem import Problem
from optimizer.schedule import Op


@dataclass(frozen=True)
class Policy:
    in_flight_factor: float  # a device admits up to factor * (its distance to the pipeline's end) microbatches
    backward_first: bool
    eager_weights: bool  # run W right after its B instead of when nothing else is ready

    def __str__(self) -> str:
        depth = "unbounded" if math.isinf(self.in_flight_factor) else f"{self.in_flight_factor:g}x"
        return f"list({depth}, {'B' if self.backward_first else 'F'} first, {'eager' if self.eager_weights else 'lazy'} W)"


def policies() -> list[Policy]:
    return [Policy(f, b, w) for f, b, w in product((1.0, 1.5, 2.0, math.inf), (True, False), (False, True))]


def list_schedule(problem: Problem, policy: Policy) -> list[list[Op]] | None:
    """Per-device orders built greedily under `policy`; None if it got stuck (never expected)."""
    t = problem.tables()
    S, m, p = problem.num_stages, problem.num_microbatches, problem.num_devices
    comm = problem.comm_time
    dur = {"F": t.forward, "B": t.backward_input, "W": t.backward_weight}
    mem = {"F": t.mem_forward, "B": t.mem_backward_input, "W": t.mem_backward_weight}
    stages_on = [problem.stages_on(d) for d in range(p)]
    first_stage = [stages[0] for stages in stages_on]
    # Room kept free at each entry: the forwards of one microbatch on the device's other stages.
    reserve = [sum(t.mem_forward[s] for s in stages[1:]) for stages in stages_on]
    slack = [1e-9 * max(1.0, lim) if not math.isinf(lim) else 0.0 for lim in t.limit]
    # A microbatch entering device d comes back after passing the S - first stages above
    # it twice; with k stages on d, about (S - first) / k microbatches keep it busy meanwhile
    # (p - d on the linear placement, as in 1F1B).
    depth = [math.ceil((S - first_stage[d]) / len(stages_on[d])) for d in range(p)]
    cap = [m if math.isinf(policy.in_flight_factor) else max(1, min(m, math.ceil(policy.in_flight_factor * depth[d]))) for d in range(p)]

    next_mb = {(k, s): 0 for k in ("F", "B", "W") for s in range(S)}
    ended: dict[tuple[str, int, int], float] = {}
    free_at = [0.0] * p
    usage = [0.0] * p
    entered = [0] * p
    left = [0] * p  # microbatches whose backward on the device's first stage is done
    orders: list[list[Op]] = [[] for _ in range(p)]
    remaining = 3 * S * m

    def ready_time(kind: str, s: int, i: int) -> float | None:
        if kind == "F":
            if s == 0:
                return 0.0
            e = ended.get(("F", s - 1, i))
            return None if e is None else e + (comm if t.device[s - 1] != t.device[s] else 0.0)
        if kind == "B":
            if s == S - 1:
                return ended.get(("F", s, i))
            e = ended.get(("B", s + 1, i))
            return None if e is None else e + (comm if t.device[s + 1] != t.device[s] else 0.0)
        return ended.get(("B", s, i))

    def candidates(d: int) -> list[tuple[float, str, int, int]]:
        found = []
        for s in stages_on[d]:
            for kind in ("F", "B", "W"):
                i = next_mb[(kind, s)]
                if i >= m:
                    continue
                r = ready_time(kind, s, i)
                if r is None:
                    continue
                if kind == "F":
                    room = t.limit[d] + slack[d] - usage[d] - mem["F"][s]
                    if s == first_stage[d] and (entered[d] - left[d] >= cap[d] or room < reserve[d]):
                        continue
                    if room < 0:
                        continue
                found.append((r, kind, s, i))
        return found

    rank = {"B": 0, "F": 1, "W": 2} if policy.backward_first else {"F": 0, "B": 1, "W": 2}

    def choose(d: int) -> tuple[float, tuple[str, int, int]] | None:
        found = candidates(d)
        if not found:
            return None
        start = max(free_at[d], min(r for r, *_ in found))
        now = [(kind, s, i) for r, kind, s, i in found if r <= start]
        if policy.eager_weights:
            weights = [c for c in now if c[0] == "W"]
            if weights:
                return start, min(weights, key=lambda c: (c[2], -c[1]))
        best = min(now, key=lambda c: (rank[c[0]], c[2], -c[1]))
        return start, best

    heap = [(0.0, d) for d in range(p)]
    queued = [0.0] * p
    while heap:
        when, d = heapq.heappop(heap)
        if when != queued[d]:
            continue
        decision = choose(d)
        if decision is None:
            queued[d] = -1.0  # waits until an input arrives
            continue
        start, (kind, s, i) = decision
        if start > when:
            queued[d] = start
            heapq.heappush(heap, (start, d))
            continue
        end = start + dur[kind][s]
        orders[d].append(Op(kind, s, i))
        next_mb[(kind, s)] += 1
        free_at[d] = end
        remaining -= 1
        if kind == "F":
            usage[d] += mem["F"][s]
            if s == first_stage[d]:
                entered[d] += 1
        else:
            usage[d] += mem[kind][s]
            if kind == "B" and s == first_stage[d]:
                left[d] += 1
        ended[(kind, s, i)] = end
        queued[d] = end
        heapq.heappush(heap, (end, d))
        # Wake the devices whose next op may have just become ready.
        for other in _consumers(t.device, kind, s, S):
            if other != d and queued[other] < 0:
                queued[other] = max(free_at[other], end)
                heapq.heappush(heap, (queued[other], other))
    return orders if remaining == 0 else None


def _consumers(device: tuple[int, ...], kind: str, s: int, S: int) -> list[int]:
    if kind == "F":
        return [device[s + 1]] if s + 1 < S else [device[s]]
    if kind == "B":
        return [device[s - 1], device[s]] if s > 0 else [device[s]]
    return []

"""The one list-scheduling engine: an event-driven, memory-safe list scheduler whose
choices are set by a `Policy`. The `greedy` family (optimizer.schedules.greedy) runs a
grid of policies; the solver's starting points (optimizer.exact.listsched) run others.

It simulates time itself: whenever a device is idle it picks, among the ops whose
inputs have arrived, a B or an F (which first is the policy's `priority`), else a W
filling the wait; a W is forced first when the F or B would not fit in memory. The
policy adds 1F1B's warm-up profile, caps on microbatches in flight, room kept for later
forwards, ZB-H1's deferral of W's and waits for inputs known to arrive soon. The
simulator retimes the result (ASAP retiming never makes a fixed order slower).

Works for heterogeneous stage times, per-device memory limits and any placement,
custom included. Per stage, F's and B's run in microbatch order; each device runs its
W's first in, first out.

Token slices: the engine orders units, F's through each microbatch's slices in order and
B's through each microbatch's slices in reverse (what the slice dependencies ask for), so
a stage's F's and B's are each one sequence of positions as microbatches are without
slices. Memory is kept per microbatch (all its slices), and its trajectory on a device
is the order above (`one_microbatch_peaks`); that order is the only one on a device with
one stage. On a device with several stages the slices of different stages may
interleave, and the engine bounds a microbatch's future by its F's not yet run, which
needs B and W to free memory only (`sliced_support`); without a limit anything works.

Memory safety, the reason it never deadlocks, whatever the policy. On a device, call a
microbatch live from its first F there until its last W there; live microbatches are
admitted in microbatch order. Let h_j be the memory microbatch j holds on the device
and P_j the most its remaining ops there can still add (`DeviceMemory`). The engine
keeps, for every live j,

    sum of h_k over live k >= j  +  P_j  <=  limit.

An op that allocates runs only if that still holds; ops that free always run. When j
is the oldest unfinished microbatch of the whole problem, nothing older holds memory,
so every op of j fits; its ops are also first in each stage's microbatch order, no
policy rule ever holds them (a heuristic stall drops the heuristics), and its W's are
runnable, so it always progresses and the run always finishes. One microbatch alone
must fit, so the least workable limit is its peak on each device with split backwards,
`Problem.split_memory_limit()`: `check_split_memory` refuses less. Below
`Problem.min_memory_limit()` no schedule exists and `check_memory_feasible` says so; in
between (a B that allocates) only fused backwards fit, which this engine does not place.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections import deque
from dataclasses import dataclass

from optimizer.errors import InfeasibleError
from optimizer.ops import Op, op_duration, op_memory
from optimizer.problem import Problem, one_microbatch_peaks, tolerant
from optimizer.schedules.registry import Keep, Orders
from optimizer.schedules.units import backward_unit, forward_unit


@dataclass(frozen=True)
class Policy:
    """The choices of one engine run.

    priority: when both an F and a B are ready, "backward" runs the B (shortens the
        B chain), "forward" the F (deepens the warm-up), "alternate" the kind the device
        did not run last (1F1B's steady state); "strict" alternates and also waits
        for the due kind when it is known to arrive before the other op would end.
    fill_w: what a device does with its pending W's: "always" runs one when nothing
        else is ready; "eager" runs one before any F or B (right after its B); "fit"
        only when it ends before the next already-known arrival of an F or B; "defer"
        keeps up to one W per stage upstream of the device pending (ZB-H1 keeps r on
        device r), so that the B's that others wait on run back to back; "fit-defer"
        runs one when over that quota or when it fits. Memory forces W's under every
        policy.
    hold_forward: leave the device idle rather than start an F that would still be
        running when a known B arrives.
    throttle: stage s keeps at most S-s microbatches in flight (F's done minus B's
        done), 1F1B's warm-up profile (p-r on device r of a linear pipeline), so that
        no device runs ahead of its upstream neighbour; otherwise every stage warms up
        as deep as its memory allows.
    in_flight: if set, a device admits a new microbatch (its F on the device's first
        stage) only while fewer than ceil(in_flight * depth) microbatches have entered
        and not left it (B done on that stage), depth = ceil((S - first stage) / stages
        on the device): the microbatches that keep it busy until the first one returns
        (p - d on the linear placement, as in 1F1B).
    reserve: room kept when admitting a new microbatch to a device. "each": every
        microbatch live there keeps room for its next forward (V-Min's point: short
        lifespans on devices with several stages); "one": room for one microbatch's
        forwards on the device's other stages (devices with two chunks can still fill
        their memory with first-chunk activations); "none".
    w_order: which pending W runs first: "fifo" (in the order of their B's) or "oldest"
        (oldest microbatch first, deeper stage first).
    force_w: run a pending W before a ready F or B when some F or B was refused for
        memory (the W may free it); otherwise a refused op just waits, and W's run as
        `fill_w` says. Safety does not depend on it: the oldest microbatch's ops are
        never refused.
    """

    priority: str = "alternate"
    fill_w: str = "always"
    hold_forward: bool = False
    throttle: bool = True
    in_flight: float | None = None
    reserve: str = "none"
    w_order: str = "fifo"
    force_w: bool = True


def short_of(needs: list[float], limits: tuple[float, ...]) -> tuple[list[int], str]:
    """The devices whose limit is below their need, and a description of the first few."""
    short = [d for d, (need, limit) in enumerate(zip(needs, limits)) if need > tolerant(limit)]
    details = ", ".join(f"device {d} needs {_versus(needs[d], limits[d])}" for d in short[:4])
    more = f" and {len(short) - 4} more" if len(short) > 4 else ""
    return short, details + more


def _versus(need: float, limit: float) -> str:
    """'need > limit' with as many digits as it takes to tell them apart."""
    digits = 6
    while digits < 17 and f"{need:.{digits}g}" == f"{limit:.{digits}g}":
        digits += 3
    return f"{need:.{digits}g} > limit {limit:.{digits}g}"


def rounded_up(value: float, digits: int = 6) -> str:
    """`value` to `digits` significant digits, never below it: a limit printed as advice
    must fit when it is used as printed."""
    text = f"{value:.{digits}g}"
    if value <= 0 or float(text) >= value:
        return text
    step = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    up = math.ceil(value / step) * step
    while float(f"{up:.{digits}g}") < value:  # the float product may land a hair below
        up += step
    return f"{up:.{digits}g}"


def _smallest(needs: list[float]) -> str:
    """The least limit that fits, and per device when they differ; a device that needs
    nothing shows the least need of the others (a limit must be positive), so the list can
    be pasted into the problem as it is."""
    least_positive = min((v for v in needs if v > 0), default=1.0)
    shown = [rounded_up(v if v > 0 else least_positive) for v in needs]
    per_device = "" if len(set(shown)) == 1 else " (per device: " + ", ".join(shown) + ")"
    return f"{rounded_up(max(needs))}{per_device}"


def check_memory_feasible(problem: Problem) -> None:
    """Raise InfeasibleError, naming the smallest limit that fits, when a device cannot hold one microbatch.

    `Problem.min_memory_limit()` is the least limit under which any schedule finishes;
    this is the one place that compares the limits with it."""
    needs = problem.min_memory_limit()
    short, details = short_of(needs, problem.tables().limit)
    if short:
        raise InfeasibleError(f"memory_limit: no schedule fits ({details}); the smallest limit that fits is {_smallest(needs)}")


def check_split_memory(problem: Problem) -> None:
    """Raise InfeasibleError when the limit fits no schedule whose backwards are all split
    (this engine's, and the families' that split), naming what would fit: a larger limit,
    or fused backwards (the optimizer's models place them)."""
    check_memory_feasible(problem)
    needs = problem.split_memory_limit()
    short, details = short_of(needs, problem.tables().limit)
    if short:
        raise InfeasibleError(
            f"memory_limit: with every backward split into B and W no schedule fits ({details}): a B that allocates "
            f"holds it until its W; fused backwards fit: use --method auto, or a limit of at least {_smallest(needs)}"
        )


def sliced_support(problem: Problem) -> str | None:
    """Why the engine cannot order this problem's token slices safely (None: it can)."""
    if problem.num_slices == 1 or problem.memory_limit is None or problem.num_stages == problem.num_devices:
        return None
    if any(stage.memory.backward_input > 0 or stage.memory.backward_weight > 0 for stage in problem.stages):
        return "orders token slices under a memory limit with one stage per device, or with B and W only freeing memory"
    return None


def _oldest_first(op: Op) -> tuple[int, int, int]:
    return op.microbatch, -op.stage, op.slice


def _op_time(tables, op: Op) -> float:
    return op_duration(tables, op.kind, op.stage, op.slice)


class DeviceMemory:
    """The live microbatches of one device and the safety check of the module docstring.

    For live j: `held` h_j, `steps` its F's and B's done, and its pending W's as
    [sum of deltas, sum of allocating deltas, count]. Then
    P_j = max(allocating pending, all pending + peaks[steps]) bounds what j can still
    add, provided a B of j never runs while j has W's pending on the device; that rule
    is only needed (`irregular`) where some B or W allocates.

    `peaks[steps]` assumes j's F's and B's run on the device in one order. With token
    slices on a device with several stages they need not, so there `forward_total` (one
    microbatch's F allocations on the device) is given and, B and W freeing only, j can
    still add exactly its F's not yet run, in any order (all of a microbatch's F's come
    before its B's).
    """

    def __init__(
        self,
        limit: float,
        peaks: list[float],
        ops_per_microbatch: int,
        irregular: bool,
        w_alloc_total: float,
        forward_total: float | None = None,
    ):
        self.tracking = math.isfinite(limit)  # with no limit there is nothing to check
        self.limit = tolerant(limit) if self.tracking else limit
        self.peaks = peaks
        self.ops_per_microbatch = ops_per_microbatch
        self.irregular = irregular
        self.bound_p = max(peaks) + w_alloc_total  # no P_j exceeds this
        self.used = 0.0
        self.held_positive = 0.0  # sum of max(h_j, 0): bounds every suffix sum of h
        self.live: deque[int] = deque()
        self.held: dict[int, float] = {}
        self.steps: dict[int, int] = {}
        self.pending: dict[int, tuple[float, float, int]] = {}
        self.left: dict[int, int] = {}
        self.forward_total = forward_total
        self.forwards_done: dict[int, float] = {}

    def _rest(self, mb: int, step: int = 0, forward: float = 0.0) -> float:
        """What mb's F's and B's can still add after `step` more of them (`forward`: that
        one's allocation when it is an F)."""
        if self.forward_total is None:
            return self.peaks[self.steps.get(mb, 0) + step]
        return max(0.0, self.forward_total - self.forwards_done.get(mb, 0.0) - forward)

    def future(self, mb: int) -> float:
        w_sum, w_alloc, _ = self.pending.get(mb, (0.0, 0.0, 0))
        return max(w_alloc, w_sum + self._rest(mb))

    def admits(self, forwards: list[float]) -> bool:
        """Could a new microbatch join while every live one keeps room for its next forward?

        `forwards` are the device's F allocations in stage order."""
        if not self.tracking:
            return True
        steps = len(forwards)
        committed = self.used + sum(forwards[self.steps[j]] for j in self.live if self.steps[j] < steps)
        return committed + forwards[0] <= self.limit

    def pending_count(self, mb: int) -> int:
        return self.pending.get(mb, (0.0, 0.0, 0))[2]

    # An op is (delta, F/B step 0 or 1, change of the pending W's).
    def allows_forward(self, mb: int, a: float) -> bool:
        return self._allows(mb, a, 1, (0.0, 0.0, 0), forward=a)

    def allows_backward(self, mb: int, b: float, w: float) -> bool:
        return self._allows(mb, b, 1, (w, max(0.0, w), 1))

    def allows_weight(self, mb: int, w: float) -> bool:
        return self._allows(mb, w, 0, (-w, -max(0.0, w), -1))

    def apply_forward(self, mb: int, a: float) -> None:
        self._apply(mb, a, 1, (0.0, 0.0, 0))
        if self.tracking:
            self.forwards_done[mb] = self.forwards_done.get(mb, 0.0) + a

    def apply_backward(self, mb: int, b: float, w: float) -> None:
        self._apply(mb, b, 1, (w, max(0.0, w), 1))

    def apply_weight(self, mb: int, w: float) -> None:
        self._apply(mb, w, 0, (-w, -max(0.0, w), -1))

    def _allows(self, mb: int, delta: float, step: int, change: tuple[float, float, int], forward: float = 0.0) -> bool:
        if delta <= 0.0 or not self.tracking:
            return True  # freeing never breaks the invariant: every suffix sum shrinks
        if self.held_positive + delta + self.bound_p <= self.limit:
            return True
        w_sum, w_alloc, _ = self.pending.get(mb, (0.0, 0.0, 0))
        after = max(w_alloc + change[1], w_sum + change[0] + self._rest(mb, step, forward))
        older = 0.0
        for j in self.live:
            if j == mb:
                break
            if self.used - older + self.future(j) + delta > self.limit:
                return False
            older += self.held[j]
        return self.used - older + delta + after <= self.limit

    def _apply(self, mb: int, delta: float, step: int, change: tuple[float, float, int]) -> None:
        if not self.tracking:
            return
        if mb not in self.held:
            self.live.append(mb)
            self.held[mb], self.steps[mb], self.left[mb] = 0.0, 0, self.ops_per_microbatch
            self.pending[mb] = (0.0, 0.0, 0)
        old = self.held[mb]
        self.held[mb] = old + delta
        self.held_positive += max(old + delta, 0.0) - max(old, 0.0)
        self.used += delta
        self.steps[mb] += step
        w_sum, w_alloc, count = self.pending[mb]
        self.pending[mb] = (w_sum + change[0], w_alloc + change[1], count + change[2])
        self.left[mb] -= 1
        if self.left[mb] == 0:
            self.held_positive -= max(self.held.pop(mb), 0.0)
            del self.steps[mb], self.left[mb], self.pending[mb]
            self.forwards_done.pop(mb, None)
            self.live.remove(mb)


class _Abandoned(Exception):
    """A run that can no longer beat the cutoff it was given."""


class _ListScheduler:
    """One run of the event-driven list scheduler for one setting of the policy.

    With a `cutoff`, the run stops (raising _Abandoned) once some device's finish time,
    or the current time for an idle device, plus its remaining work exceeds it: that
    run cannot end sooner.
    """

    def __init__(self, problem: Problem, policy: Policy, cutoff: float = math.inf):
        self.policy = policy
        self.cutoff = cutoff
        self.tables = t = problem.tables()
        self.p, self.m, self.n = problem.num_devices, problem.num_microbatches, problem.num_stages
        # F's and B's of a stage are runs of positions over units (microbatch, slice).
        self.k = problem.num_slices
        self.units = self.m * self.k
        self.comm = problem.comm_time
        self.device = t.device
        self.stages_on = [problem.stages_on(d) for d in range(self.p)]
        self.memory = [
            DeviceMemory(
                t.limit[d],
                one_microbatch_peaks(t, self.stages_on[d]),
                3 * len(self.stages_on[d]) * self.k,
                any(t.mem_backward_input[s] > 0 or t.mem_backward_weight[s] > 0 for s in self.stages_on[d]),
                sum(max(0.0, t.mem_backward_weight[s]) for s in self.stages_on[d]),
                self._order_free_forwards(d),
            )
            for d in range(self.p)
        ]
        inf = math.inf
        self.arrive_f = [[0.0 if s == 0 else inf] * self.units for s in range(self.n)]
        self.arrive_b = [[inf] * self.units for _ in range(self.n)]
        self.next_f = [0] * self.n
        self.next_b = [0] * self.n
        self.weights: list[deque[Op]] = [deque() for _ in range(self.p)]
        self.free_at = [0.0] * self.p
        self.w_quota = [min(self.stages_on[d]) for d in range(self.p)]
        self.forward_alloc = [[op_memory(t, "F", s, k) for s in self.stages_on[d] for k in range(self.k)] for d in range(self.p)]
        self.first_stage = [stages[0] for stages in self.stages_on]
        # Room for one microbatch's forwards on the device's other stages (reserve "one").
        self.reserve_one = [sum(t.mem_forward[s] for s in stages[1:]) for stages in self.stages_on]
        self.in_flight_cap = [self._in_flight_cap(d) for d in range(self.p)]
        self.capping = any(cap is not None for cap in self.in_flight_cap)
        self.entered = [0] * self.p  # microbatches that ran their F on the device's first stage
        self.left = [0] * self.p  # ... and their B there
        self.last_kind = ["B"] * self.p  # F or B, for the "alternate" priority
        self.orders: Orders = [[] for _ in range(self.p)]
        self.remaining = 3 * self.n * self.units
        self.work_left = [
            self.m * sum(op_duration(t, kind, s, k) for s in self.stages_on[d] for k in range(self.k) for kind in "FBW")
            for d in range(self.p)
        ]
        self.wakes: list[tuple[float, int]] = [(0.0, d) for d in range(self.p)]
        self.relaxed = False  # set if the heuristics ever idled every device (a safety net)
        self.makespan = 0.0
        # Each stage's next F and next B once its arrival is known: waiting (heaps by
        # arrival) until a device's clock reaches it, then ready (sorted by the order the
        # choice takes them in). A choice looks at those alone, not at every stage of its
        # device (3 devices of 341 stages each took 40 s a problem scanning them all).
        self.position = [0] * self.n
        for stages in self.stages_on:
            for index, stage in enumerate(stages):
                self.position[stage] = index
        self.waiting_f: list[list[tuple[float, int]]] = [[] for _ in range(self.p)]
        self.waiting_b: list[list[tuple[float, int]]] = [[] for _ in range(self.p)]
        self.ready_f: list[list[tuple[int, int, int]]] = [[] for _ in range(self.p)]  # (unit, -stage, stage)
        self.ready_b: list[list[tuple[int, int, int]]] = [[] for _ in range(self.p)]  # (unit, position, stage)
        self._watch_f(0)

    def _order_free_forwards(self, d: int) -> float | None:
        """One microbatch's F allocations on device d where its slices' order there is not
        fixed (several stages; see DeviceMemory), else None."""
        stages = self.stages_on[d]
        if self.k == 1 or len(stages) == 1:
            return None
        return sum(op_memory(self.tables, "F", s, k) for s in stages for k in range(self.k))

    def _in_flight_cap(self, d: int) -> int | None:
        factor = self.policy.in_flight
        if factor is None or math.isinf(factor):
            return None
        depth = math.ceil((self.n - self.first_stage[d]) / len(self.stages_on[d]))
        # At least 1 (the oldest always enters); in units, a microbatch's K slices more.
        return max(1, math.ceil(factor * depth)) + self.k - 1

    # -- running ---------------------------------------------------------------------

    def run(self) -> Orders:
        stalled_at = -1
        while self.remaining:
            if not self.wakes:
                # Every device idles with nothing in flight: only a heuristic wait can
                # cause that; drop the heuristics (memory safety alone always progresses).
                if stalled_at == self.remaining:
                    raise RuntimeError(f"list engine stalled with {self.remaining} ops left (memory invariant broken)")
                stalled_at = self.remaining
                self.relaxed = True
                now = max(self.free_at)
                self.wakes = [(now, d) for d in range(self.p)]
                self._unsettle()  # `now` may be earlier than the last wake: arrivals are judged again
            time, d = heapq.heappop(self.wakes)
            if self.free_at[d] > time:
                continue
            if time + self.work_left[d] > self.cutoff:
                raise _Abandoned
            op = self._choose(d, time)
            if op is not None:
                self._commit(d, op, time)
        return self.orders

    def _commit(self, d: int, op: Op, start: float) -> None:
        t, s, i, k = self.tables, op.stage, op.microbatch, op.slice
        memory = self.memory[d]
        end = start + _op_time(t, op)
        if op.kind == "F":
            u = i * self.k + k
            memory.apply_forward(i, op_memory(t, "F", s, k))
            self._leave(self.ready_f[d], (u, -s, s))
            self.next_f[s] += 1
            self._watch_f(s)
            if s == self.first_stage[d]:
                self.entered[d] += 1
            if s + 1 < self.n:
                self._arrive(self.arrive_f, s + 1, u, end + (self.comm if self.device[s + 1] != d else 0.0))
            else:  # its B is due on this device, which wakes at `end` anyway
                v = i * self.k + self.k - 1 - k
                self.arrive_b[s][v] = end
                if v == self.next_b[s]:
                    self._watch_b(s)
        elif op.kind == "B":
            memory.apply_backward(i, op_memory(t, "B", s, k), op_memory(t, "W", s, k))
            self._leave(self.ready_b[d], (self.next_b[s], self.position[s], s))
            self.next_b[s] += 1
            self._watch_b(s)
            if s == self.first_stage[d]:
                self.left[d] += 1
            weight = op._replace(kind="W")
            if self.policy.w_order == "oldest":
                bisect.insort(self.weights[d], weight, key=_oldest_first)
            else:
                self.weights[d].append(weight)
            if s > 0:
                v = i * self.k + self.k - 1 - k
                self._arrive(self.arrive_b, s - 1, v, end + (self.comm if self.device[s - 1] != d else 0.0))
        else:
            memory.apply_weight(i, op_memory(t, "W", s, k))
        self.work_left[d] -= end - start
        if end + self.work_left[d] > self.cutoff:
            raise _Abandoned
        self.orders[d].append(op)
        if op.kind != "W":
            self.last_kind[d] = op.kind
        self.free_at[d] = end
        self.remaining -= 1
        self.makespan = max(self.makespan, end)
        heapq.heappush(self.wakes, (end, d))

    def _arrive(self, table: list[list[float]], stage: int, mb: int, time: float) -> None:
        table[stage][mb] = time
        heapq.heappush(self.wakes, (time, self.device[stage]))
        if table is self.arrive_f and mb == self.next_f[stage]:
            self._watch_f(stage)
        elif table is self.arrive_b and mb == self.next_b[stage]:
            self._watch_b(stage)

    # -- the stages whose next op has arrived ----------------------------------------

    def _watch_f(self, s: int) -> None:
        """Wait for stage s's next F where its arrival is known (else its arrival will call)."""
        u = self.next_f[s]
        if u < self.units and self.arrive_f[s][u] < math.inf:
            heapq.heappush(self.waiting_f[self.device[s]], (self.arrive_f[s][u], s))

    def _watch_b(self, s: int) -> None:
        u = self.next_b[s]
        if u < self.units and self.arrive_b[s][u] < math.inf:
            heapq.heappush(self.waiting_b[self.device[s]], (self.arrive_b[s][u], s))

    def _settle(self, d: int, now: float) -> None:
        """Move what has arrived on device d by `now` from waiting to ready."""
        waiting = self.waiting_f[d]
        while waiting and waiting[0][0] <= now:
            _, s = heapq.heappop(waiting)
            bisect.insort(self.ready_f[d], (self.next_f[s], -s, s))
        waiting = self.waiting_b[d]
        while waiting and waiting[0][0] <= now:
            _, s = heapq.heappop(waiting)
            bisect.insort(self.ready_b[d], (self.next_b[s], self.position[s], s))

    def _unsettle(self) -> None:
        """Every ready stage back to waiting (the clock is about to go back)."""
        for d in range(self.p):
            for u, _, s in self.ready_f[d]:
                heapq.heappush(self.waiting_f[d], (self.arrive_f[s][u], s))
            for u, _, s in self.ready_b[d]:
                heapq.heappush(self.waiting_b[d], (self.arrive_b[s][u], s))
            self.ready_f[d].clear()
            self.ready_b[d].clear()

    @staticmethod
    def _leave(ready: list[tuple[int, int, int]], entry: tuple[int, int, int]) -> None:
        at = bisect.bisect_left(ready, entry)
        if at < len(ready) and ready[at] == entry:
            del ready[at]

    # -- choosing --------------------------------------------------------------------

    def _choose(self, d: int, now: float) -> Op | None:
        policy, t = self.policy, self.tables
        self._settle(d, now)  # what follows sees the device's arrivals up to `now`
        if policy.fill_w == "eager" and self.weights[d]:
            weight = self._weight(d)
            if weight is not None:
                return weight
        backward, backward_blocked = self._ready_backward(d, now)
        alternating = policy.priority in ("alternate", "strict")
        backward_first = policy.priority == "backward" or (alternating and self.last_kind[d] == "F")
        if backward is not None and backward_first:
            return backward
        forward, forward_blocked = self._ready_forward(d, now)
        if policy.priority == "strict" and not self.relaxed:
            due = self._due_soon(d, now, backward if self.last_kind[d] == "B" else forward, self.last_kind[d])
            if due:
                return None  # the kind whose turn it is arrives before the other would end
        if policy.force_w and (forward_blocked or backward_blocked) and self.weights[d]:
            weight = self._weight(d)  # forced: the op does not fit until a W frees memory
            if weight is not None:
                return weight
        if forward is not None:
            return forward
        if backward is not None:
            return backward
        if not self.weights[d]:
            return None
        if self.relaxed or policy.fill_w in ("always", "eager") or not self._has_inputs_to_come(d):
            return self._weight(d)
        if "defer" in policy.fill_w and len(self.weights[d]) > self.w_quota[d]:
            return self._weight(d)
        if "fit" in policy.fill_w and now + _op_time(t, self.weights[d][0]) <= self._next_arrival(d, now):
            return self._weight(d)
        return None  # wait: keep the W for later, an input is coming

    def _ready_backward(self, d: int, now: float) -> tuple[Op | None, bool]:
        """The B to run now (oldest microbatch first), and whether one was refused for memory."""
        ready = self.ready_b[d]
        best = backward_unit(ready[0][2], ready[0][0], self.k) if ready else None  # oldest unit, then the device's first stage
        if best is not None:
            t, s, i, k, memory = self.tables, best.stage, best.microbatch, best.slice, self.memory[d]
            if memory.tracking and memory.irregular and memory.pending_count(i):
                return None, True  # its own W's first (see DeviceMemory)
            if not memory.allows_backward(i, op_memory(t, "B", s, k), op_memory(t, "W", s, k)):
                return None, True
        return best, False

    def _ready_forward(self, d: int, now: float) -> tuple[Op | None, bool]:
        """The F to run now, and whether a ready F was refused for memory."""
        t, policy, memory = self.tables, self.policy, self.memory[d]
        soonest_b = math.inf
        if policy.hold_forward and not self.relaxed:
            # An arrived B (at or before `now`) first, else the next to arrive.
            soonest_b = min((self.arrive_b[s][u] for u, _, s in self.ready_b[d]), default=self._next_arrival_of(self.waiting_b[d]))
        blocked = False
        # Oldest unit first, depth first; throttled, capped and held ones are not candidates.
        for u, _, s in self.ready_f[d]:
            if self._throttled(s) or (self.capping and self._capped(d, s)):
                continue
            op = forward_unit(s, u, self.k)
            if now + _op_time(t, op) > soonest_b:
                continue
            i = op.microbatch
            if policy.reserve == "each" and i not in memory.held and not memory.admits(self.forward_alloc[d]):
                blocked = True
                continue
            if policy.reserve == "one" and not self.relaxed and s == self.first_stage[d] and not self._room_for_one(d, s):
                blocked = True
                continue
            if memory.allows_forward(i, op_memory(t, "F", s, op.slice)):
                return op, False
            blocked = True
        return None, blocked

    def _throttled(self, s: int) -> bool:
        # Never blocks the oldest unfinished microbatch: nothing is in flight before it, and
        # in units its K slices fit (the last stage needs all K forwards before a backward).
        return self.policy.throttle and self.next_f[s] - self.next_b[s] >= self.n - s + self.k - 1

    def _capped(self, d: int, s: int) -> bool:
        cap = self.in_flight_cap[d]
        return cap is not None and s == self.first_stage[d] and self.entered[d] - self.left[d] >= cap

    def _room_for_one(self, d: int, s: int) -> bool:
        memory = self.memory[d]
        return not memory.tracking or memory.limit - memory.used - op_memory(self.tables, "F", s, 0) >= self.reserve_one[d]

    def _weight(self, d: int) -> Op | None:
        """The first queued W that fits; only a W that allocates can be refused."""
        queue, t = self.weights[d], self.tables
        for position, weight in enumerate(queue):
            if self.memory[d].allows_weight(weight.microbatch, op_memory(t, "W", weight.stage, weight.slice)):
                del queue[position]
                return weight
        return None

    def _due_soon(self, d: int, now: float, other: Op | None, last: str) -> bool:
        """Is the op of the kind not run last missing now but known to arrive before `other` ends?"""
        if other is None:
            return False
        waiting = self.waiting_f[d] if last == "B" else self.waiting_b[d]  # settled at `now`: all after it
        return self._next_arrival_of(waiting) < now + _op_time(self.tables, other)

    def _has_inputs_to_come(self, d: int) -> bool:
        return any(self.next_b[s] < self.units for s in self.stages_on[d])

    def _next_arrival(self, d: int, now: float) -> float:
        return min(self._next_arrival_of(self.waiting_f[d]), self._next_arrival_of(self.waiting_b[d]))

    @staticmethod
    def _next_arrival_of(waiting: list[tuple[float, int]]) -> float:
        return waiting[0][0] if waiting else math.inf


def schedule_with(problem: Problem, policy: Policy) -> tuple[Orders, float]:
    """One engine run: the orders and the makespan of its own timing."""
    check_split_memory(problem)
    scheduler = _ListScheduler(problem, policy)
    orders = scheduler.run()
    return orders, scheduler.makespan


def best_of(
    problem: Problem,
    policies: tuple[Policy, ...] | list[Policy],
    deadline: float | None = None,
    keep: Keep | None = None,
) -> tuple[Orders, Policy]:
    """The shortest orders (by the engine's own timing) over `policies`, and the policy that made them.

    A run that cannot beat the best so far by a relative 1e-12 stops early. With a
    `deadline` (time.monotonic()) no policy starts after it once one has given orders;
    `keep` hears each shorter result as it comes."""
    check_split_memory(problem)
    best_orders: Orders | None = None
    best_policy = policies[0]
    best = math.inf
    for policy in policies:
        if best_orders is not None and deadline is not None and time.monotonic() >= deadline:
            break
        scheduler = _ListScheduler(problem, policy, cutoff=best * (1 - 1e-12))
        try:
            orders = scheduler.run()
        except _Abandoned:
            continue
        if scheduler.makespan < best:
            best, best_orders, best_policy = scheduler.makespan, orders, policy
            if keep is not None:
                keep(orders)
    assert best_orders is not None
    return best_orders, best_policy

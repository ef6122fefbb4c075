"""Vocabulary passes woven into any schedule (vocabulary parallelism, Problem.vocab_parallel).

Vocabulary parallelism ("Balancing Pipeline Parallelism with Vocabulary Parallelism",
Yeung et al., MLSys 2025) adds, per microbatch, an S and a T pass on every device, tied
by collectives (optimizer/ops.py). Its schedules are existing ones with these passes
placed in: the paper inserts them into 1F1B and V-Half and lets the last stage's
backwards start a fixed number of microbatches later. Here any family's order (built
for the problem without the passes) is the base, and an event-driven list scheduler
runs it with the passes:

* base ops keep their base priority (the base schedule's start times); a device runs
  either its base order strictly, or (`flexible`) any ready base op whose stage keeps
  its F's, backwards and W's each in microbatch order and whose stage holds at most
  `extra_in_flight` more microbatches (F's done minus backwards done) than in the base
  schedule; the extra ones are what lets the last stage go on with forwards while a
  microbatch's passes and collectives run (the paper's delayed backward);
* a pass runs when ready, ahead of base ops (`eager`, since the last stage's backward
  waits for every device's passes) or only when no base op is ready;
* under a memory limit (and with pass memory) a device holds one pass at a time (its next
  S waits for its T), an op that allocates runs only if it fits, and a forward only if
  the pass's memory still fits after it while no pass is held, so the next S always finds
  room (a base order that fits the limit less one pass's memory, as `base_problem` asks
  memory-aware families for, then never waits for memory); when the
  base itself ignores the limit and no choice finishes within it, the passes are placed
  ignoring it too (as that family's own schedule does).

Every combination of these choices is tried and the shortest order that fits the limit
is kept (the simulator times them; a combination that deadlocks is skipped).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from optimizer.errors import DeadlockError, InfeasibleError, InputError
from optimizer.ops import VOCAB_KINDS, Kind, Op, completion_key, dependencies, op_duration, op_memory, transfer_delay
from optimizer.problem import Problem, tolerant
from optimizer.schedules.registry import Orders
from optimizer.simulate import simulate, simulate_times


@dataclass(frozen=True)
class Weave:
    """One way of placing the passes (module doc)."""

    flexible: bool
    extra_in_flight: int
    eager: bool


def weaves(barriers: int) -> list[Weave]:
    """The choices tried: the base order strictly, and flexibly with up to barriers + 1
    extra microbatches, passes eagerly; passes only in idle time at `barriers` extra.
    (On 2 placements x 2 barrier counts x 2 limits x 2 pass lengths at p = 8, m = 32 over
    every family, the eager choices won or tied 147 of 172 times; lazy ones added 25 ties or
    wins, most at `barriers` extra.)"""
    choices = [Weave(False, 0, True)]
    choices += [Weave(True, extra, True) for extra in range(barriers + 2)]
    return choices + [Weave(True, barriers, False)]


def base_problem(problem: Problem) -> Problem:
    """The problem without the passes for a base family, its limit lowered by one pass's
    memory where that still leaves a valid problem (so memory-aware bases leave room)."""
    stripped = problem.without_vocab()
    vocab = problem.vocab_parallel
    if vocab is None or vocab.memory == 0 or problem.memory_limit is None:
        return stripped
    limits = [problem.device_limit(d) - vocab.memory for d in range(problem.num_devices)]
    try:
        return problem.model_validate({**stripped.model_dump(), "memory_limit": limits})
    except ValueError:
        return stripped


# Above this many ops a build without a deadline weaves the passes only until a way fits.
WEAVE_EVERY_WAY_MAX_OPS = 10_000


def with_vocab_passes(problem: Problem, base_orders: Sequence[Sequence[Op]], deadline: float | None = None) -> Orders:
    """The shortest order (fitting the limit when any does) of `base_orders` with the passes
    woven in; past `deadline` (time.monotonic()) the best so far once one fits (each way of
    weaving is a list-scheduling run: 1-2 s at p = 32, m = 192 on the V placement)."""
    vocab = problem.vocab_parallel
    if vocab is None:
        raise InputError("vocab_parallel: the problem has no vocabulary passes to place")
    base_times = simulate_times(problem.without_vocab(), base_orders)
    # Without a deadline (`compare`, a family by name), a large problem keeps the first way
    # that fits, as past a deadline: every way is a list-scheduling run of 1-2 s there, and
    # the eager first way won or tied most comparisons (`weaves`).
    hurry = deadline is None and problem.num_ops > WEAVE_EVERY_WAY_MAX_OPS
    best: tuple[tuple[bool, float], Orders] | None = None
    # A base that ignores the limit (the hand-made families) can leave no room for the
    # passes: then they are placed ignoring it too, and the result says how far over it is.
    for respect_memory in (True, False):
        for weave in weaves(vocab.barriers):
            try:
                orders = weave_passes(problem, base_times, weave, respect_memory)
            except DeadlockError:
                continue
            schedule = simulate(problem, orders)
            key = (not schedule.fits_memory(), schedule.makespan)
            if best is None or key < best[0]:
                best = (key, orders)
            if not best[0][0] and (hurry or (deadline is not None and time.monotonic() >= deadline)):
                return best[1]
        if best is not None:
            return best[1]
    raise InfeasibleError("vocab_parallel: the vocabulary passes could not be placed into this schedule")


def weave_passes(problem: Problem, base_times: Sequence[Sequence], weave: Weave, respect_memory: bool = True) -> Orders:
    """One list-scheduling run (module doc); DeadlockError when it cannot finish."""
    return _Weaver(problem, base_times, weave, respect_memory).run()


class _Weaver:
    def __init__(self, problem: Problem, base_times: Sequence[Sequence], weave: Weave, respect_memory: bool):
        self.problem, self.weave = problem, weave
        self.tables = tables = problem.tables()
        vocab = tables.vocab_rule()
        assert vocab is not None, "weaving needs vocabulary passes"
        self.vocab = vocab
        p, m = problem.num_devices, problem.num_microbatches
        self.priority: dict[Op, float] = {}
        self.base: list[list[Op]] = []
        in_flight_peak = [0] * problem.num_stages
        for timed in base_times:
            self.base.append([t.op for t in timed])
            for t in timed:
                self.priority[t.op] = t.start
            in_flight_peak_update(in_flight_peak, timed)
        last = problem.num_stages - 1
        for j in range(m):
            forward_end = self._base_end(Op(Kind.F, last, j))
            for d in range(p):
                self.priority[Op(Kind.S, d, j)] = forward_end
                self.priority[Op(Kind.T, d, j)] = forward_end
        self.cap = [peak + weave.extra_in_flight for peak in in_flight_peak]
        self.ended: dict[Op, float] = {}
        self.free_at = [0.0] * p
        self.usage = [0.0] * p
        self.limit = tables.limit if respect_memory else (math.inf,) * p
        self.orders: Orders = [[] for _ in range(p)]
        self.position = [0] * p  # strict mode: next base op
        self.done: set[Op] = set()
        self.in_flight = [0] * problem.num_stages
        self.next_pass = [[0, 0] for _ in range(p)]  # per device: next microbatch of S, of T
        self.last = problem.num_stages - 1
        # Flexible runs reserve, per device, the forwards its live microbatches still owe
        # there (a device of several stages could otherwise fill up with first-chunk
        # forwards that wait for nothing, and deadlock).
        self.first_stage = [min(stages) for stages in (problem.stages_on(d) for d in range(p))]
        self.forwards_on = [sum(tables.mem_forward[s] for s in problem.stages_on(d)) for d in range(p)]
        self.pending_forwards = [0.0] * p
        # Per microbatch: how many shards ended their S (T), and the latest end.
        self.s_done, self.t_done = [0] * m, [0] * m
        self.s_end, self.t_end = [0.0] * m, [0.0] * m
        # Per stage and class (F, backward, W): the base ops in microbatch order.
        self.queues: dict[tuple[int, str], list[Op]] = {}
        for ops in self.base:
            for op in ops:
                cls = "B" if op.kind in (Kind.B, Kind.BW) else op.kind
                self.queues.setdefault((op.stage, cls), []).append(op)
        for queue in self.queues.values():
            queue.sort(key=lambda op: op.microbatch)
        self.heads = dict.fromkeys(self.queues, 0)
        self.stages_on = [problem.stages_on(d) for d in range(p)]
        self.remaining = sum(len(ops) for ops in self.base) + 2 * p * m

    def _base_end(self, op: Op) -> float:
        return self.priority[op] + op_duration(self.tables, op.kind, op.stage)

    def run(self) -> Orders:
        p = self.problem.num_devices
        events = [(0.0, d) for d in range(p)]
        heapq.heapify(events)
        while events and self.remaining:
            now, d = heapq.heappop(events)
            if now < self.free_at[d]:
                continue
            op = self._choose(d, now)
            if op is None:
                continue  # woken again when an input arrives or the device frees
            end = now + op_duration(self.tables, op.kind, op.stage)
            self._commit(d, op, end)
            heapq.heappush(events, (end, d))
            for device, arrival in self._wakeups(op, end):
                heapq.heappush(events, (arrival, device))
        if self.remaining:
            stuck = ", ".join(f"device {d} after {len(ops)} ops" for d, ops in enumerate(self.orders))
            raise DeadlockError(f"deadlock while placing vocabulary passes: {stuck}", {})
        return self.orders

    def _wakeups(self, op: Op, end: float) -> list[tuple[int, float]]:
        key = completion_key(op)
        if key is None:
            return []
        tables = self.tables
        if op.kind in VOCAB_KINDS:  # the last shard's pass ends the collective: every device's T, the last stage's backward
            done = self.s_done if op.kind == Kind.S else self.t_done
            if done[op.microbatch] < self.problem.num_devices:
                return []
            return [(d, end + tables.barrier_time) for d in range(self.problem.num_devices)]
        if op.kind == Kind.F and op.stage == self.problem.num_stages - 1:
            return [(d, end + transfer_delay(key, d, tables.device, self.problem.comm_time, 0.0)) for d in range(self.problem.num_devices)]
        neighbours = {op.stage - 1, op.stage + 1} & set(range(self.problem.num_stages))
        return [
            (tables.device[s], end + transfer_delay(key, tables.device[s], tables.device, self.problem.comm_time, 0.0)) for s in neighbours
        ]

    def _ready(self, op: Op, d: int, now: float) -> bool:
        # The collectives are counted per microbatch instead of checking every shard's pass
        # (p dependencies) at every event: the scheduler stays linear in the ops.
        tables, kind, j = self.tables, op.kind, op.microbatch
        if kind == Kind.T:
            return self._collective_done(self.s_done, self.s_end, j, now)
        if kind == Kind.S:
            end = self.ended.get(Op(Kind.F, self.last, j))
            return end is not None and end + (self.problem.comm_time if d != tables.device[self.last] else 0.0) <= now
        if kind in (Kind.B, Kind.BW) and op.stage == self.last:
            done, ends = (self.s_done, self.s_end) if self.vocab.barriers == 1 else (self.t_done, self.t_end)
            if not self._collective_done(done, ends, j, now):
                return False
        for key in dependencies(op, self.problem.num_stages):
            end = self.ended.get(key)
            if end is None or end + transfer_delay(key, d, tables.device, self.problem.comm_time, 0.0) > now:
                return False
        return True

    def _collective_done(self, done: list[int], ends: list[float], j: int, now: float) -> bool:
        return done[j] == self.problem.num_devices and ends[j] + self.tables.barrier_time <= now

    def _fits(self, d: int, op: Op) -> bool:
        limit = tolerant(self.limit[d])
        if math.isinf(limit):
            return True
        delta = op_memory(self.tables, op.kind, op.stage)
        held = self.next_pass[d][0] - self.next_pass[d][1]  # S's run minus T's run
        reserve = self.tables.vocab_memory if held == 0 else 0.0
        if op.kind == Kind.S:
            return held == 0 or self.tables.vocab_memory == 0
        if op.kind != Kind.F:
            return delta <= 0 or self.usage[d] + delta <= limit
        if not self.weave.flexible:
            return self.usage[d] + delta + reserve <= limit
        if op.stage == self.first_stage[d]:  # a new microbatch: room for all its forwards here
            return self.usage[d] + self.pending_forwards[d] + self.forwards_on[d] + reserve <= limit
        return self.usage[d] + self.pending_forwards[d] + reserve <= limit

    def _passes(self, d: int) -> list[Op]:
        m = self.problem.num_microbatches
        s, t = self.next_pass[d]
        return [Op(kind, d, j) for kind, j in ((Kind.S, s), (Kind.T, t)) if j < m]

    def _base_candidates(self, d: int) -> list[Op]:
        if not self.weave.flexible:
            k = self.position[d]
            return [self.base[d][k]] if k < len(self.base[d]) else []
        found = []
        for s in self.stages_on[d]:
            for cls in ("F", "B", "W"):
                queue = self.queues.get((s, cls))
                if queue is None or self.heads[(s, cls)] >= len(queue):
                    continue
                op = queue[self.heads[(s, cls)]]
                if cls == "F" and self.in_flight[s] >= self.cap[s]:
                    continue
                found.append(op)
        return found

    def _choose(self, d: int, now: float) -> Op | None:
        ready_passes = [op for op in self._passes(d) if self._ready(op, d, now) and self._fits(d, op)]
        if ready_passes and self.weave.eager:
            return min(ready_passes, key=self._rank)
        ready_base = [op for op in self._base_candidates(d) if self._ready(op, d, now) and self._fits(d, op)]
        pool = ready_base or ready_passes
        return min(pool, key=self._rank) if pool else None

    def _rank(self, op: Op) -> tuple[float, int, int]:
        return (self.priority[op], op.microbatch, op.stage)

    def _commit(self, d: int, op: Op, end: float) -> None:
        self.orders[d].append(op)
        self.free_at[d] = end
        self.usage[d] += op_memory(self.tables, op.kind, op.stage)
        self.remaining -= 1
        key = completion_key(op)
        if key is not None:
            self.ended[key] = end
        if op.kind in VOCAB_KINDS:
            self.next_pass[d][VOCAB_KINDS.index(op.kind)] += 1
            done, ends = (self.s_done, self.s_end) if op.kind == Kind.S else (self.t_done, self.t_end)
            done[op.microbatch] += 1
            ends[op.microbatch] = max(ends[op.microbatch], end)
            return
        if not self.weave.flexible:
            self.position[d] += 1
        cls = "B" if op.kind in (Kind.B, Kind.BW) else op.kind
        if self.weave.flexible:
            self.heads[(op.stage, cls)] += 1
        if op.kind == Kind.F:
            self.in_flight[op.stage] += 1
            if op.stage == self.first_stage[d]:
                self.pending_forwards[d] += self.forwards_on[d]
            self.pending_forwards[d] -= op_memory(self.tables, op.kind, op.stage)
        elif cls == "B":
            self.in_flight[op.stage] -= 1


def in_flight_peak_update(peak: list[int], timed: Sequence) -> None:
    """Raise each stage's peak count of microbatches between their F and their backward."""
    count: dict[int, int] = {}
    for t in timed:
        if t.kind == Kind.F:
            count[t.stage] = count.get(t.stage, 0) + 1
            peak[t.stage] = max(peak[t.stage], count[t.stage])
        elif t.kind in (Kind.B, Kind.BW):
            count[t.stage] = count.get(t.stage, 0) - 1

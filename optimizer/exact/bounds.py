"""Lower bounds on the makespan, computed from the problem alone.

Five ideas, each a valid bound, the best one is reported:

* busiest device: a device cannot finish before it has done all of its work;
* heads and tails: every op has an earliest start (the forward chain that must reach it,
  and the earlier microbatches of its own stage and kind, see optimizer.exact.canonical)
  and a least amount of work that must follow it (the backward chain back to stage 0,
  later microbatches). On each device this is a one-machine problem with release dates
  and delivery times, whose preemptive optimum (Jackson's preemptive schedule) is a
  lower bound: it captures warm-up, busy time and cool-down at once;
* memory: with a limit, a device may start a forward only after enough earlier
  microbatches have freed memory, and those frees cannot happen before their round trip
  through the pipeline. This raises the forwards' earliest starts (device 0 with room for
  k activations waits a round trip every k microbatches), and the heads-and-tails bound
  is computed again with them. Under the span objective the same holds in each device's
  own frame, for the forwards of every device (`heads`): on the V placement at
  V-Min's and V-Half's memory the devices on the way hold back the first device's
  microbatches (their forwards wait for their own frees), which lengthens the round
  trips the first device waits for, and counting that raised those bounds by 0.6 to 6%.
  A device with several stages must also keep room for its next chunk: its first
  chunk's forward of microbatch i waits for the next chunk's forward of microbatch
  i - K (optimizer.exact.reservation), whose allocation the memory argument then counts
  too; on tiny V and interleaved problems at tight limits this reaches the optimum;
* a device's own order (`_device_order_release`, inside `heads`): an F or B waits for
  every earlier op of its microbatch's chain and, by each class's microbatch order, for
  those ops of the previous microbatch; the ones on its own device run there one at a
  time. On the V placement both of a device's chunks lie on every round trip, so the
  returns to a device are spaced by both chunks' work, which the chain alone does not
  see: V-Min's p = 16 bounds rise 1.3 to 2.2% (14.6B m48: 1836.9 -> 1877.1 ms), the
  grid's p = 16 V case 212.6 -> 215.0;
* warm-up and drain (`warm_up_and_drain`): a device's span is its busy time plus the
  idle before its first backward may start plus the idle after its last microbatch's
  first op. Waiting for that microbatch's round trip can only be filled with work left
  from earlier microbatches, and what is left holds memory: under a limit only so much
  fits. This is the bound that proves ZB-H1 optimal at 1F1B's memory on Zero Bubble's
  profiled settings; the preemptive one-machine bound cannot count memory.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from optimizer.exact.reservation import lags
from optimizer.problem import Problem, tolerant

# Stage-microbatch cells the span bound may spend on per-device passes (about 0.5 s):
# every device up to p = 16, m = 64; the busiest few at p = 32, m = 256.
SPAN_BOUND_CELLS = 40_000
# One part of a bound (a pass of heads and tails, or one device's frame, over every
# stage and microbatch) takes at most about this long per cell: 0.1-0.35 s at p = 32,
# m = 256 on the V placement (16k cells) on 2 idle cores, so 0.49 s is allowed. With a
# deadline a part starts only if it would end by then.
PART_SECONDS_PER_CELL = 3e-5
# How many earlier microbatches' ops on a device the device-order argument of `heads`
# counts: 1 already gives all it gains on Zero Bubble's p = 16 settings and the grid's
# p = 16 V case (windows of 2 to 4 measured: same bounds, more time).
DEVICE_ORDER_WINDOW = 1
# And at most this many of them, the latest: a subset only weakens the argument (it stays a
# bound), and it keeps the cost per op flat where a device holds many stages (interleaved
# with 1024 chunks on one device, every op sorted all 2048 of its device's recent ops: 18 s
# for m = 16). The V placement's 2 stages per device have at most 8 such ops.
DEVICE_ORDER_MAX_OPS = 64
# The memory argument of `heads` counts, for a forward, at most this many (stage,
# microbatch) pairs of its device's started forwards of its own and lower stages (the
# latest microbatches of the stages nearest it, its own stage always), and the lags of at
# most MEMORY_LAG_STAGES higher stages (the highest), each over a window as long. Leaving
# a pair out, its allocation and its frees both, only weakens the argument: the memory the
# pair holds is never negative. It keeps the cost per forward flat where a device holds
# many stages: interleaved with 512 stages a device and m = 16, the pass counted every
# pair and lag (8,000 and 511 a forward) and took about a minute, where the part's time
# estimate (PART_SECONDS_PER_CELL) said 0.5 s. The V placement up to m = 256 (at most
# 512 pairs, one lag) and interleaved up to 8 stages a device at m = 64 keep every one.
MEMORY_PAIRS = 512
MEMORY_LAG_STAGES = 8


@dataclass(frozen=True)
class LowerBound:
    value: float
    reason: str  # which argument gave the value


@dataclass
class _Ops:
    """head/tail per (kind, stage, microbatch) as nested lists: kind -> stage -> mb."""

    head: dict[str, list[list[float]]]
    tail: dict[str, list[list[float]]]


def durations(problem: Problem) -> dict[str, tuple[float, ...]]:
    t = problem.tables()
    return {"F": t.forward, "B": t.backward_input, "W": t.backward_weight}


def _links(problem: Problem) -> list[float]:
    """Transfer time after each stage's forward (0 after the last, or to the same device)."""
    device = problem.tables().device
    S = problem.num_stages
    return [problem.comm_time if s + 1 < S and device[s] != device[s + 1] else 0.0 for s in range(S)]


class _OutOfTime(Exception):
    """A pass of `heads` reached its deadline: its part of a bound is left out."""


def heads(problem: Problem, memory_aware: bool, origin: int = 0, deadline: float | None = None) -> dict[str, list[list[float]]]:
    """Earliest start of every op, optionally raised by the memory argument. With a
    `deadline` (time.monotonic()) the pass raises _OutOfTime once it is past it (checked
    once a microbatch), so that a part whose time estimate was short keeps its deadline.

    With `origin` > 0 the heads are measured from the start of stage `origin`'s first
    forward instead of from time 0: the forwards of the stages before it (and their
    transfers) count as instantaneous. Every op of those stages' microbatches that
    depends on a forward of `origin` keeps a valid head in that frame (the span bound
    below explains why the others do no harm).

    The memory argument holds in that frame on every device, not only on the device
    whose span is bounded: a forward that cannot fit until earlier microbatches' B's and
    W's have freed enough starts after those frees end, and every B and W waits for its
    microbatch's forward of `origin`, so the frees' heads are valid in the frame and so
    is the forward's raised head. (A forward before `origin` may run before the frame
    starts, so its head of 0 is no claim about it; raised by memory it is one, and it
    only feeds the forward of `origin`, which starts in the frame anyway.) This is what
    sees, from the first device, that the other devices' memory holds back the
    microbatches on their way: their forwards wait for their own frees, which delays
    the round trips the first device waits for.
    """
    t = problem.tables()
    S, m = problem.num_stages, problem.num_microbatches
    dur = durations(problem)
    comm = _links(problem)
    if origin > 0:
        dur = dict(dur, F=tuple(0.0 if s < origin else v for s, v in enumerate(dur["F"])))
        comm = [0.0 if s < origin else v for s, v in enumerate(comm)]
    head = {k: [[0.0] * m for _ in range(S)] for k in ("F", "B", "W")}
    F, B, W = head["F"], head["B"], head["W"]

    frees_nonpositive = all(v <= 0 for v in t.mem_backward_input + t.mem_backward_weight)
    use_memory = memory_aware and frees_nonpositive and not all(math.isinf(v) for v in t.limit)
    # For a forward of stage s on device d, the "low" stages are those of d up to s: all
    # their forwards of microbatches <= i have started, and only their frees count.
    # At most MEMORY_PAIRS of them, the nearest, each over a window of its latest microbatches.
    kept = max(1, MEMORY_PAIRS)
    low_stages = [[s2 for s2 in range(s + 1) if t.device[s2] == t.device[s]] for s in range(S)]
    low_stages = [low[max(0, len(low) - kept) :] for low in low_stages]
    window = [max(1, kept // len(low)) for low in low_stages]
    low_index = [np.array(low, dtype=np.intp) for low in low_stages]
    # And d's higher stages' forwards up to microbatch i - K (optimizer.exact.reservation).
    lag = [pairs[max(0, len(pairs) - MEMORY_LAG_STAGES) :] for pairs in lags(problem)] if use_memory else [[] for _ in range(S)]
    frees = _Frees.of(t) if use_memory else None

    # Earliest end of every B and W, kept as arrays for the memory argument's sorting.
    free_end = {kind: np.zeros((S, m)) for kind in ("B", "W")}
    # Per device, (chain position, microbatch, head, duration) of its recent F's and B's.
    device = t.device
    recent: list[list[tuple[int, int, float, float]]] = [[] for _ in range(problem.num_devices)]

    for i in range(m):
        if deadline is not None and time.monotonic() > deadline:
            raise _OutOfTime
        for d, entries in enumerate(recent):
            recent[d] = [e for e in entries if e[1] >= i - DEVICE_ORDER_WINDOW]
        for s in range(S):
            h = 0.0
            if s > 0:
                h = F[s - 1][i] + dur["F"][s - 1] + comm[s - 1]
            if i > 0:
                h = max(h, F[s][i - 1] + dur["F"][s])
            if use_memory and i > 0:
                assert frees is not None
                first = max(0, i + 1 - window[s])
                higher_started = []
                for higher, k in lag[s]:
                    if i >= k:
                        h = max(h, F[higher][i - k] + dur["F"][higher])
                        higher_started.append((higher, max(0, i - k + 1 - window[s]), i - k + 1))
                h = max(h, frees.release(low_index[s], first, higher_started, i, free_end))
            h = max(h, _device_order_release(recent[device[s]], s))
            F[s][i] = h
            recent[device[s]].append((s, i, h, dur["F"][s]))
        for s in reversed(range(S)):
            h = F[s][i] + dur["F"][s] if s == S - 1 else B[s + 1][i] + dur["B"][s + 1] + comm[s]
            if i > 0:
                h = max(h, B[s][i - 1] + dur["B"][s])
            h = max(h, _device_order_release(recent[device[s]], 2 * S - 1 - s))
            B[s][i] = h
            recent[device[s]].append((2 * S - 1 - s, i, h, dur["B"][s]))
            free_end["B"][s, i] = h + dur["B"][s]
        for s in range(S):
            h = B[s][i] + dur["B"][s]
            if i > 0:
                h = max(h, W[s][i - 1] + dur["W"][s])
            # Its microbatch's B (in `recent` now) and the earlier W's of its stage too.
            earlier_w = [(W[s][j], dur["W"][s]) for j in range(max(0, i - DEVICE_ORDER_WINDOW), i)]
            h = max(h, _device_order_release(recent[device[s]], 2 * S - 1 - s, earlier_w))
            W[s][i] = h
            free_end["W"][s, i] = h + dur["W"][s]
    return head


def _device_order_release(entries: list[tuple[int, int, float, float]], position: int, extra: Sequence[tuple[float, float]] = ()) -> float:
    """Earliest time a device can have run every op of `entries` (chain position,
    microbatch, head, duration) at or before chain `position`, and `extra` (head,
    duration): all of them precede the op being bounded on its device.

    An F or B of stage s and microbatch i waits for the F's and B's before it in its
    microbatch's chain (F of stages 0..S-1, then B of stages S-1..0) and, by each class's
    microbatch order (optimizer.exact.canonical), for every op of those classes and of
    its own of earlier microbatches. Those on its own device run there one at a time,
    none before its head: they end no earlier than h plus the durations of those whose
    head is at least h, for every h. (On the V placement a device's two chunks both lie
    on every microbatch's round trip, which spaces its returns by both chunks' work.)
    """
    items = [(head, duration) for pos, _, head, duration in entries[-DEVICE_ORDER_MAX_OPS:] if pos <= position]
    items.extend(extra)
    best = acc = 0.0
    for head, duration in sorted(items, reverse=True):
        acc += duration
        best = max(best, head + acc)
    return best


@dataclass(frozen=True)
class _Frees:
    """Per stage, what its forward allocates and its B and W free (as positive amounts)."""

    forward: np.ndarray
    by_b: np.ndarray
    by_w: np.ndarray
    limit: tuple[float, ...]
    device: tuple[int, ...]

    @staticmethod
    def of(t) -> _Frees:
        return _Frees(
            np.array(t.mem_forward, dtype=float),
            np.maximum(-np.array(t.mem_backward_input, dtype=float), 0.0),
            np.maximum(-np.array(t.mem_backward_weight, dtype=float), 0.0),
            tuple(t.limit),
            tuple(t.device),
        )

    def release(self, low: np.ndarray, first: int, higher: list[tuple[int, int, int]], i: int, free_end: dict[str, np.ndarray]) -> float:
        """Earliest time a forward of microbatch i can fit in memory, given the forwards of
        microbatches first..i of the stages `low` and, per (stage, first, end) of `higher`,
        of microbatches first..end-1 of that stage: all started, all on the forward's device.

        Those forwards hold their allocation until their stage's B and W free it (every other
        piece held is non-negative), so the frees of those microbatches (`free_end`: their
        earliest ends; microbatch i has freed nothing yet) must cover what exceeds the limit.
        """
        limit = tolerant(self.limit[self.device[int(low[0])]])
        allocated = (i + 1 - first) * float(self.forward[low].sum()) + sum((end - start) * self.forward[s] for s, start, end in higher)
        needed = allocated - limit
        if needed <= 1e-12 * max(1.0, limit):
            return 0.0
        # Stages counted over the same microbatches are gathered at once (the lags of a
        # device's higher stages mostly share theirs).
        spans: dict[tuple[int, int], list[int]] = {}
        for s, start, end in higher:
            if min(end, i) > start:
                spans.setdefault((start, min(end, i)), []).append(s)
        groups = [(low, first, i)] if i > first else []
        groups += [(np.array(stages, dtype=np.intp), start, stop) for (start, stop), stages in spans.items()]
        ends, amounts = [], []
        for stages, start, stop in groups:
            for kind, by in (("B", self.by_b), ("W", self.by_w)):
                ends.append(free_end[kind][stages, start:stop].ravel())
                amounts.append(np.repeat(by[stages], stop - start))
        if not ends:
            return 0.0
        end_times = np.concatenate(ends)
        amount = np.concatenate(amounts)
        order = np.argsort(end_times, kind="stable")
        freed = np.cumsum(amount[order])
        k = int(np.searchsorted(freed, needed - 1e-9 * max(1.0, needed)))
        return float(end_times[order][min(k, len(end_times) - 1)])


def tails(problem: Problem) -> dict[str, list[list[float]]]:
    """Least work that must follow the end of every op before the schedule can end."""
    S, m = problem.num_stages, problem.num_microbatches
    dur = durations(problem)
    comm = _links(problem)
    tail = {k: [[0.0] * m for _ in range(S)] for k in ("F", "B", "W")}
    F, B, W = tail["F"], tail["B"], tail["W"]
    for i in reversed(range(m)):
        for s in range(S):
            W[s][i] = W[s][i + 1] + dur["W"][s] if i + 1 < m else 0.0
        for s in range(S):
            q = dur["W"][s] + W[s][i]
            if i + 1 < m:
                q = max(q, dur["B"][s] + B[s][i + 1])
            if s > 0:
                q = max(q, comm[s - 1] + dur["B"][s - 1] + B[s - 1][i])
            B[s][i] = q
        for s in reversed(range(S)):
            q = dur["B"][s] + B[s][i] if s == S - 1 else comm[s] + dur["F"][s + 1] + F[s + 1][i]
            if i + 1 < m:
                q = max(q, dur["F"][s] + F[s][i + 1])
            F[s][i] = q
    return tail


def jackson_preemptive(jobs: list[tuple[float, float, float]]) -> float:
    """Optimal preemptive one-machine value max(C_j + q_j) for jobs (release, duration, tail)."""
    jobs = sorted(jobs)
    ready: list[tuple[float, float]] = []  # (-tail, remaining)
    time, best, k = 0.0, 0.0, 0
    while k < len(jobs) or ready:
        if not ready:
            time = max(time, jobs[k][0])
        while k < len(jobs) and jobs[k][0] <= time:
            heapq.heappush(ready, (-jobs[k][2], jobs[k][1]))
            k += 1
        neg_tail, remaining = heapq.heappop(ready)
        next_release = jobs[k][0] if k < len(jobs) else math.inf
        if time + remaining <= next_release:
            time += remaining
            best = max(best, time - neg_tail)
        else:
            heapq.heappush(ready, (neg_tail, remaining - (next_release - time)))
            time = next_release
    return best


def _device_jobs(problem: Problem, head, tail) -> list[list[tuple[float, float, float]]]:
    dur = durations(problem)
    device = problem.tables().device
    jobs: list[list[tuple[float, float, float]]] = [[] for _ in range(problem.num_devices)]
    for kind in ("F", "B", "W"):
        for s in range(problem.num_stages):
            for i in range(problem.num_microbatches):
                jobs[device[s]].append((head[kind][s][i], dur[kind][s], tail[kind][s][i]))
    return jobs


def _in_time(problem: Problem, deadline: float | None) -> bool:
    """Whether one more part of a bound (see PART_SECONDS_PER_CELL) would end by `deadline`."""
    cells = problem.num_stages * problem.num_microbatches
    return deadline is None or time.monotonic() + PART_SECONDS_PER_CELL * cells <= deadline


def makespan_lower_bound(problem: Problem, deadline: float | None = None) -> LowerBound:
    """The best of the busiest-device, heads-and-tails and memory bounds (see module doc).

    With a `deadline` (time.monotonic()) the parts that would end past it are left out:
    each part is a bound alone, so what the others proved stands (at least the busiest
    device's work)."""
    dur = durations(problem)
    device = problem.tables().device
    m = problem.num_microbatches
    work = [0.0] * problem.num_devices
    for s in range(problem.num_stages):
        work[device[s]] += m * (dur["F"][s] + dur["B"][s] + dur["W"][s])
    best = LowerBound(max(work), "busiest device's work")
    if not _in_time(problem, deadline):
        return best
    try:
        tail = tails(problem)
        plain_heads = heads(problem, memory_aware=False, deadline=deadline)
        value = max(jackson_preemptive(jobs) for jobs in _device_jobs(problem, plain_heads, tail))
        if value > best.value * (1 + 1e-12):
            best = LowerBound(value, "warm-up, work and cool-down (heads and tails)")
        if problem.memory_limit is not None and _in_time(problem, deadline):
            aware = _device_jobs(problem, heads(problem, memory_aware=True, deadline=deadline), tail)
            value = max(jackson_preemptive(jobs) for jobs in aware)
            if value > best.value * (1 + 1e-12):
                best = LowerBound(value, "memory limit delays forwards (memory-aware heads and tails)")
            # The makespan holds each device's span after the device's earliest first start.
            first = plain_heads["F"]
            for device, _, _, split in _device_span_bounds(problem, work, deadline):
                value = first[min(problem.stages_on(device))][0] + split
                if value > best.value * (1 + 1e-12):
                    best = LowerBound(value, f"device {device}'s earliest start, busy time, warm-up and drain")
    except _OutOfTime:
        pass  # each part is a bound alone: what the finished ones proved stands
    return best


def device_tails(problem: Problem, device: int) -> dict[str, list[list[float]]]:
    """Least time from the end of every op to the end of `device`'s last op (-inf: no path).

    Paths follow the dependencies (with transfers) and each stage's microbatch order
    (optimizer.exact.canonical); a path counts only when it ends at an op of `device`.
    """
    S, m = problem.num_stages, problem.num_microbatches
    dur = durations(problem)
    on_device = [d == device for d in problem.tables().device]
    comm = _links(problem)
    none = -math.inf
    tail = {k: [[none] * m for _ in range(S)] for k in ("F", "B", "W")}
    F, B, W = tail["F"], tail["B"], tail["W"]

    def after(kind: str, s: int, i: int, delay: float) -> float:
        return delay + dur[kind][s] + tail[kind][s][i]

    for i in reversed(range(m)):
        for s in range(S):
            q = 0.0 if on_device[s] else none
            if i + 1 < m:
                q = max(q, after("W", s, i + 1, 0.0))
            W[s][i] = q
        for s in range(S):
            q = max(0.0 if on_device[s] else none, after("W", s, i, 0.0))
            if i + 1 < m:
                q = max(q, after("B", s, i + 1, 0.0))
            if s > 0:
                q = max(q, after("B", s - 1, i, comm[s - 1]))
            B[s][i] = q
        for s in reversed(range(S)):
            q = 0.0 if on_device[s] else none
            q = max(q, after("B", s, i, 0.0) if s == S - 1 else after("F", s + 1, i, comm[s]))
            if i + 1 < m:
                q = max(q, after("F", s, i + 1, 0.0))
            F[s][i] = q
    return tail


def span_lower_bound(problem: Problem, deadline: float | None = None) -> LowerBound:
    """A bound on the longest device span: busy time plus the idle forced inside a device.

    A device's span runs from its first start t0 to its last end. In a canonical
    schedule (optimizer.exact.canonical, which relabels microbatches without changing
    any device's times) every op of the device waits, directly or not, for a forward of
    its lowest stage, the first of which starts at t0. Measured from t0, an op's start
    is therefore at least its head computed with the earlier stages' forwards taken as
    instantaneous (`heads(..., origin=lowest stage)`; the memory argument still holds,
    since the frees it counts wait for the device's forwards too, on every device, see
    `heads`), and its end plus
    `device_tails` is at most the span. The device's ops thus form a one-machine
    problem with release dates and delivery times in that frame, whose preemptive
    optimum (Jackson) bounds the span from below. Heads from time 0 would not: a device
    may start late and then never wait.

    The same frame gives a second bound, `warm_up_and_drain`: busy time plus the idle
    forced before the device's first backward may start and after its last
    microbatch's first op, where the memory limit caps how much earlier work can still
    be left to fill the wait for that microbatch's round trip. The preemptive bound
    cannot see that cap; on Zero Bubble's settings at 1F1B's memory this bound equals
    ZB-H1's span.

    Every device's bound is valid alone, so the largest over any set of devices is a
    bound (`_device_span_bounds` picks the devices); the others count their busy time.
    With a `deadline` (time.monotonic()) a device whose pass would end past it is left
    out, so the bound may be weaker, never wrong.
    """
    dur = durations(problem)
    m = problem.num_microbatches
    busy = [m * sum(dur[k][s] for s in problem.stages_on(d) for k in ("F", "B", "W")) for d in range(problem.num_devices)]
    value = max(busy)
    where = f"busy time of device {busy.index(value)}"
    for device, preemptive, busiest, split in _device_span_bounds(problem, busy, deadline):
        if preemptive > value * (1 + 1e-12):
            value, where = (
                preemptive,
                f"work and forced idle of device {busiest} within device {device}'s span (heads and tails from its first start)",
            )
        if split > value * (1 + 1e-12):
            value, where = split, f"busy time, warm-up and drain of device {device} (memory limits the work left at the drain)"
    return LowerBound(value, where)


def _device_span_bounds(problem: Problem, busy: list[float], deadline: float | None = None):
    """(device, preemptive bound, the device it comes from, warm-up and drain bound) on the
    spans of the busiest devices (`_through_others` for the preemptive bound from others).

    Each device costs a pass over all stages and microbatches: the busiest (ties: the
    first, which waits longest under a memory limit) until SPAN_BOUND_CELLS cells are spent
    or, with a `deadline`, until the next pass would end past it.
    The first one's frame also bounds through the other devices (`_through_others`).
    """
    memory_aware = problem.memory_limit is not None
    ranked = sorted(range(problem.num_devices), key=lambda d: (-busy[d], d))
    cells = problem.num_stages * problem.num_microbatches
    for n, device in enumerate(ranked):
        if n > 0 and (n + 1) * cells > SPAN_BOUND_CELLS:
            break
        if not _in_time(problem, deadline):
            break
        origin = min(problem.stages_on(device))
        try:
            head = heads(problem, memory_aware, origin=origin, deadline=deadline)
        except _OutOfTime:
            return
        tail = device_tails(problem, device)
        own = jackson_preemptive(_jobs_of(problem, device, head, tail))
        # The other devices seen from the first (most telling) frame only: p times the work.
        through, other = _through_others(problem, device, head, tail) if n == 0 else (0.0, device)
        yield device, max(own, through), other if through > own else device, warm_up_and_drain(problem, device, head, tail)


def _through_others(problem: Problem, device: int, head, tail) -> tuple[float, int]:
    """The preemptive bound on `device`'s span from the ops of the other devices.

    In `device`'s frame an op of a stage at or after its lowest one waits for that
    stage's forward of its microbatch, so its head holds, and its tail (when it leads to
    `device` at all) is what must follow it before `device` ends. Those ops of one other
    device form a one-machine problem like `device`'s own: all its forwards and
    backwards must pass between the first forward reaching it and the last backward
    leaving it, which bounds the span when that device is the busier one.
    """
    origin = min(problem.stages_on(device))
    dur = durations(problem)
    m = problem.num_microbatches
    best, where = 0.0, device
    for other in range(problem.num_devices):
        if other == device:
            continue
        jobs = [
            (head[k][s][i], dur[k][s], tail[k][s][i])
            for s in problem.stages_on(other)
            if s >= origin
            for k in ("F", "B", "W")
            for i in range(m)
            if tail[k][s][i] > -math.inf
        ]
        value = jackson_preemptive(jobs) if jobs else 0.0
        if value > best:
            best, where = value, other
    return best, where


def _one_microbatch(problem: Problem, device: int) -> tuple[list[tuple[str, int]], list[tuple[int, int]]]:
    """A microbatch's ops on `device` in path order (F up the stages, B down, W after its B)
    and their precedences as index pairs."""
    stages = problem.stages_on(device)
    ops = [("F", s) for s in stages] + [("B", s) for s in reversed(stages)] + [("W", s) for s in stages]
    n = 2 * len(stages)
    before = [(k, k + 1) for k in range(n - 1)] + [(ops.index(("B", s)), ops.index(("W", s))) for s in stages]
    return ops, before


# Pending states of a microbatch are enumerated: up to this many stages on a device
# (V and interleaved:2 have 2; 4 stages give at most a few hundred states).
PENDING_MAX_STAGES = 4


def _pending_states(problem: Problem, device: int) -> list[tuple[float, float]]:
    """(memory held, work left) of a microbatch whose first op on `device` has run.

    The ops it has run form a set closed under its precedences (each stage's ops of a
    kind run in microbatch order, so this holds op by op); the memory it holds is the sum
    of their changes, the work left the others' durations.
    """
    t = problem.tables()
    dur = durations(problem)
    ops, before = _one_microbatch(problem, device)
    change = {"F": t.mem_forward, "B": t.mem_backward_input, "W": t.mem_backward_weight}
    states = []
    for mask in range(1 << len(ops)):
        if not mask & 1 or any(mask >> b & 1 and not mask >> a & 1 for a, b in before):
            continue
        held = sum(change[k][s] for n, (k, s) in enumerate(ops) if mask >> n & 1)
        left = sum(dur[k][s] for n, (k, s) in enumerate(ops) if not mask >> n & 1)
        states.append((held, left))
    return states


def most_pending_work(states: list[tuple[float, float]], capacity: float, count: int) -> float:
    """Largest sum of work left over at most `count` microbatches holding at most `capacity`.

    The linear relaxation (fractional numbers of microbatches in each state), an upper
    bound on the integer value: max sum(n_s w_s) s.t. sum(n_s h_s) <= capacity,
    sum(n_s) <= count, n >= 0. Two constraints, so an optimal vertex uses at most two
    states: every single state and every pair is tried.
    """
    best = 0.0
    eps = 1e-12
    for h, w in states:
        n = count if h <= eps else min(count, capacity / h)
        best = max(best, n * w)
    for a, (h1, w1) in enumerate(states):
        for h2, w2 in states[a + 1 :]:
            if abs(h1 - h2) <= eps:
                continue
            # n1 + n2 = count, n1 h1 + n2 h2 = capacity
            n1 = (capacity - count * h2) / (h1 - h2)
            n2 = count - n1
            if n1 >= -eps and n2 >= -eps:
                best = max(best, max(0.0, n1) * w1 + max(0.0, n2) * w2)
    return best


def drain_idle(problem: Problem, device: int, tail: dict[str, list[list[float]]]) -> float:
    """Least idle of `device` after its last microbatch's first op starts (at x, say).

    After x the device runs that microbatch's ops, whose chain (through the other
    devices) lasts at least its first op's duration plus its device tail, and the work
    still pending from earlier microbatches. Those hold memory at x: with the last
    microbatch's first allocation, at most the limit. So the idle after x is at least
    the chain minus the last microbatch's work minus the most pending work that fits
    (`most_pending_work`). 0 when the device has too many stages to enumerate.
    """
    stages = problem.stages_on(device)
    m = problem.num_microbatches
    if len(stages) > PENDING_MAX_STAGES:
        return 0.0
    t = problem.tables()
    dur = durations(problem)
    origin = min(stages)
    chain = dur["F"][origin] + tail["F"][origin][m - 1]
    own = sum(dur[k][s] for s in stages for k in ("F", "B", "W"))
    limit = tolerant(t.limit[device])
    capacity = math.inf if math.isinf(limit) else limit - t.mem_forward[origin]
    pending = most_pending_work(_pending_states(problem, device), capacity, m - 1) if m > 1 else 0.0
    return max(0.0, chain - own - pending)


def warm_up_idle(problem: Problem, device: int, head: dict[str, list[list[float]]]) -> float:
    """Least idle of `device` from its first start until its first op other than a forward may start.

    Measured in the device's own frame (`head` from its first start). Until h, the
    earliest head of its B's and W's (and no later than its last microbatch's first op,
    which the drain counts from), only forwards run: each at most its duration and no
    earlier than its head, and together they allocate at most the limit (no free comes
    before h). The most forward work that fits is a fractional knapsack.
    """
    stages = problem.stages_on(device)
    m = problem.num_microbatches
    t = problem.tables()
    dur = durations(problem)
    origin = min(stages)
    until = min(min(head[k][s][0] for s in stages for k in ("B", "W")), head["F"][origin][m - 1])
    items = []  # (work inside the window, memory)
    for s in stages:
        for i in range(m):
            work = min(dur["F"][s], until - head["F"][s][i])
            if work > 0:
                items.append((work, t.mem_forward[s]))
    room = tolerant(t.limit[device])
    fits = 0.0
    for work, memory in sorted(items, key=lambda wm: -wm[0] / wm[1] if wm[1] > 0 else -math.inf):
        if memory <= 0:
            fits += work
        elif room > 0:
            share = min(1.0, room / memory)
            fits += share * work
            room -= share * memory
    return max(0.0, until - fits)


def warm_up_and_drain(problem: Problem, device: int, head: dict[str, list[list[float]]], tail: dict[str, list[list[float]]]) -> float:
    """A bound on `device`'s span: its busy time plus its warm-up and drain idle.

    `head` from the device's first start and `tail` to its last end (see
    span_lower_bound). The warm-up window ends no later than the drain's starts (the
    last microbatch's first op), so the two idle times add up.
    """
    dur = durations(problem)
    busy = problem.num_microbatches * sum(dur[k][s] for s in problem.stages_on(device) for k in ("F", "B", "W"))
    return busy + warm_up_idle(problem, device, head) + drain_idle(problem, device, tail)


def _jobs_of(problem: Problem, device: int, head, tail) -> list[tuple[float, float, float]]:
    """(head, duration, tail) of every op of one device."""
    dur = durations(problem)
    m = problem.num_microbatches
    return [(head[k][s][i], dur[k][s], tail[k][s][i]) for s in problem.stages_on(device) for k in ("F", "B", "W") for i in range(m)]


def lower_bound(problem: Problem, objective: str = "makespan", deadline: float | None = None) -> LowerBound:
    """The bound for `objective`; with a `deadline`, the parts that end by it (see each)."""
    return span_lower_bound(problem, deadline) if objective == "span" else makespan_lower_bound(problem, deadline)

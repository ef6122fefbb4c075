"""Simulator-driven local search over per-device op orders under the memory limit.

A move takes one op of one device and re-inserts it a few positions earlier or later in
that device's order (a W moved into a wait, an F pulled into the warm-up or pushed out
of it, two neighbours swapped); ops are picked on the critical chain of the device that
sets the objective, next to idle time, or anywhere. A repeated move makes the same move
in every round of the steady state at once (the same class moved past the same
neighbouring classes at the same microbatch distance): under a tight limit the span is
set by the peak memory of the rounds, which moves only when every round changes.

A move is kept when the objective (longest device span, or makespan) gets no worse and
a tie-breaker (the sum of device spans, then the sum of all ends) improves or stays:
ties walk the plateaus. After a first share of plain descent, a move may also lengthen
the objective by a random allowance that shrinks to nothing at the end (threshold
accepting), which lets the search leave a rigid local optimum; the best order seen is
what it returns.

Invariants, and why they hold:
* Every order kept fits the memory limit: memory on a device depends on its order only
  (optimizer.schedule.peak_memory), so a move is checked on prefix sums before timing.
* Every order kept is deadlock-free: the re-timing refuses an order that cannot finish.
* Each class of ops (kind and stage) keeps microbatch order: a move never passes an op
  of its own class. Such orders lose nothing (optimizer.exact.canonical) and moves
  that only relabel microbatches are not tried.
* Timing is exact and incremental: an op that started before the moved range's first
  possible start cannot depend on the moved ops (durations and delays are not
  negative), so its times are kept and only the rest is re-simulated with
  optimizer.simulate's as-soon-as-possible rule (tested against it). The result is
  simulated by optimizer.simulate before it leaves this module.

Deterministic for a seed and a number of moves (`max_moves`); with a deadline alone,
how far it gets (and how fast the allowance shrinks) depends on the machine's speed.
"""

from __future__ import annotations

import math
import random
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from optimizer.ops import Op, completion_key, dependencies, op_duration, op_memory
from optimizer.problem import Problem, tolerant
from optimizer.schedule import Schedule
from optimizer.simulate import simulate

# Relative slack for float comparisons of memory and times (sums of profiled values).
_REL = 1e-9
# Farthest a move carries an op, in positions of its device's order.
MAX_SHIFT = 6
# Share of the moves taken on the critical chain (the rest anywhere, near idle time).
CRITICAL_SHARE = 0.5
# Share of the moves made in every round at once: the same op class moved past the same
# neighbours' classes at the same microbatch distance (the steady state changed at once;
# under a tight limit the peak, and so the span, moves only when every round changes).
REPEAT_SHARE = 0.3
# Mean allowance for a longer objective at the start, relative to the starting objective.
HEAT = 0.002
# Share of the run spent in plain descent before any allowance.
DESCENT_SHARE = 0.4


@dataclass(frozen=True)
class OpTable:
    """The ops as integers: what the hot loop reads, as plain lists."""

    ops: list[Op]
    device: list[int]
    duration: list[float]
    memory: list[float]
    pred: list[int]  # the op this one waits for (-1: none); unsliced problems have at most one
    delay: list[float]  # transfer time after `pred` ends
    cls: list[int]  # kind and stage: ops of one class keep microbatch order
    microbatch: list[int]
    limit: list[float]

    def positions(self, orders: Sequence[Sequence[int]]) -> list[int]:
        pos = [0] * len(self.ops)
        for seq in orders:
            for k, o in enumerate(seq):
                pos[o] = k
        return pos


def applicable(problem: Problem) -> bool:
    """One dependency per op: one slice, no vocabulary passes (their barriers join many)."""
    return problem.num_slices == 1 and problem.vocab_parallel is None


def op_table(problem: Problem, orders: Sequence[Sequence[Op]]) -> tuple[OpTable, list[list[int]]]:
    tables = problem.tables()
    index: dict[Op, int] = {}
    ops: list[Op] = []
    device: list[int] = []
    for d, seq in enumerate(orders):
        for op in seq:
            index[op] = len(ops)
            ops.append(op)
            device.append(d)
    done_by = {completion_key(op): j for j, op in enumerate(ops) if completion_key(op) is not None}
    classes: dict[tuple[str, int], int] = {}
    pred, delay, cls = [], [], []
    for j, op in enumerate(ops):
        deps = dependencies(op, problem.num_stages)
        q = done_by[deps[0]] if deps else -1
        pred.append(q)
        delay.append(problem.comm_time if q >= 0 and device[q] != device[j] else 0.0)
        # B and BW are one class: the stage's backward
        cls.append(classes.setdefault(("B" if op.kind == "BW" else op.kind, op.stage), len(classes)))
    table = OpTable(
        ops=ops,
        device=device,
        duration=[op_duration(tables, op.kind, op.stage) for op in ops],
        memory=[op_memory(tables, op.kind, op.stage) for op in ops],
        pred=pred,
        delay=delay,
        cls=cls,
        microbatch=[op.microbatch for op in ops],
        limit=[tolerant(limit) for limit in tables.limit],
    )
    return table, [[index[op] for op in seq] for seq in orders]


class _Timing:
    """Per-device start and end times aligned with the orders, and each op's position."""

    def __init__(self, table: OpTable, orders: list[list[int]]):
        self.table = table
        self.orders = orders
        self.pos = table.positions(orders)
        starts, ends = retime(table, orders, self.pos)
        assert starts is not None and ends is not None, "the starting order deadlocks"
        self.starts: Times = starts
        self.ends: Times = ends

    def spans(self) -> list[float]:
        return [e[-1] - s[0] if s else 0.0 for s, e in zip(self.starts, self.ends)]

    def critical(self, objective: str) -> list[tuple[int, int]]:
        """(device, position) of the ops that start right when their device's previous op
        ends, on the chain that sets the objective's device (traced back from its last op).

        Moving such an op earlier, past ops that are not on the chain, or moving those
        later, is what can shorten the chain.
        """
        table, starts, ends = self.table, self.starts, self.ends
        if objective == "span":
            spans = self.spans()
            d = max(range(len(spans)), key=spans.__getitem__)
            floor = starts[d][0]  # before the device starts, nothing counts in its span
        else:
            d = max(range(len(ends)), key=lambda e: ends[e][-1] if ends[e] else 0.0)
            floor = 0.0
        k = len(starts[d]) - 1
        out = []
        while k >= 0:
            if k > 0 and starts[d][k] <= ends[d][k - 1] * (1 + _REL) + _REL:
                out.append((d, k))
                k -= 1
                continue
            q = table.pred[self.orders[d][k]]
            if q < 0 or starts[d][k] < floor:
                break
            d, k = table.device[q], self.pos[q]
        return out


Times = list[list[float]]  # per device, aligned with its order
Score = tuple[float, float, float]


def retime(
    table: OpTable,
    orders: list[list[int]],
    pos: list[int],
    old: tuple[Times, Times, float] | None = None,
    cap: float = float("inf"),
    span: bool = True,
) -> tuple[Times, Times] | tuple[None, None]:
    """As-soon-as-possible times; with `old` = (starts, ends, since), ops that started
    before `since` keep their old times (`pos`: each op's position in its device's order).

    Returns (None, None) on a deadlock, or as soon as a device's span (`span`) or an op's
    end (otherwise) exceeds `cap`: ends only grow along a device, so such an order is
    already worse than the cap.
    """
    pred, delay, duration, device = table.pred, table.delay, table.duration, table.device
    p = len(orders)
    if old is None:
        starts: Times = [[] for _ in range(p)]
        ends: Times = [[] for _ in range(p)]
    else:
        old_starts, old_ends, since = old
        cut = [bisect_left(s, since) for s in old_starts]
        starts = [s[:k] for s, k in zip(old_starts, cut)]
        ends = [e[:k] for e, k in zip(old_ends, cut)]
    free = [e[-1] if e else 0.0 for e in ends]
    waiting: dict[int, list[int]] = {}
    runnable = list(range(p))
    while runnable:
        d = runnable.pop()
        seq, st, en = orders[d], starts[d], ends[d]
        h, t, n = len(st), free[d], len(seq)
        limit = cap + (st[0] if span and st else 0.0) if h else cap
        while h < n:
            o = seq[h]
            q = pred[o]
            if q >= 0:
                e = device[q]
                k = pos[q]
                if k >= len(ends[e]):
                    waiting.setdefault(q, []).append(d)
                    break
                arrive = ends[e][k] + delay[o]
                if arrive > t:
                    t = arrive
            if not h and span:
                limit = cap + t  # the device's first op: its span counts from here
            st.append(t)
            t += duration[o]
            en.append(t)
            if t > limit:
                return None, None
            h += 1
            woken = waiting.pop(o, None)
            if woken:
                runnable.extend(woken)
        free[d] = t
    if any(len(st) < len(seq) for st, seq in zip(starts, orders)):
        return None, None
    return starts, ends


def score(starts: list[list[float]], ends: list[list[float]], objective: str) -> tuple[float, float, float]:
    spans = [e[-1] - s[0] for s, e in zip(starts, ends) if s]
    first = min(s[0] for s in starts if s)
    last = max(e[-1] for e in ends if e)
    primary = max(spans) if objective == "span" else last - first
    return primary, sum(spans), sum(sum(e) for e in ends)


def no_worse(new: tuple[float, float, float], old: tuple[float, float, float]) -> bool:
    for a, b in zip(new, old):
        tolerance = _REL * max(1.0, abs(b))
        if a < b - tolerance:
            return True
        if a > b + tolerance:
            return False
    return True  # a tie: accepted, the search walks the plateau


def move_fits(table: OpTable, seq: list[int], i: int, j: int, limit: float) -> bool:
    """Does moving seq[i] to position j keep the device within `limit` and its class order?"""
    o = seq[i]
    c, cls, memory, pred = table.cls[o], table.cls, table.memory, table.pred
    lo, hi = (j, i) if j < i else (i + 1, j + 1)
    passed = seq[lo:hi]
    if any(cls[x] == c for x in passed):
        return False
    # Passing the op it waits for, or one that waits for it, is a deadlock.
    if (j < i and pred[o] in passed) or (j > i and any(pred[x] == o for x in passed)):
        return False
    if j > i:
        return True if memory[o] >= 0 else _prefix_fits(memory, seq, i, j, o, limit)
    return True if memory[o] <= 0 else _prefix_fits(memory, seq, j, i, o, limit)


def _prefix_fits(memory: list[float], seq: list[int], lo: int, hi: int, o: int, limit: float) -> bool:
    # Only the prefix sums between the two positions change, by the moved op's delta.
    usage = sum(memory[x] for x in seq[:lo])
    if memory[o] > 0:  # moved earlier: it now counts from position lo
        usage += memory[o]
        if usage > limit:
            return False
        for x in seq[lo:hi]:
            usage += memory[x]
            if usage > limit:
                return False
        return True
    for x in seq[lo + 1 : hi + 1]:  # moved later: the ops it passes lose its free
        usage += memory[x]
        if usage > limit:
            return False
    return True


def local_search(
    problem: Problem,
    orders: Sequence[Sequence[Op]],
    *,
    deadline: float,
    seed: int = 0,
    objective: str = "span",
    max_moves: int | None = None,
    on_improve: Callable[[Schedule], object] | None = None,
    report_every: float = 1.0,
) -> Schedule:
    """Improve a feasible order that fits the memory limit until `deadline` (time.monotonic)
    or `max_moves` tried; the best order found, simulated (never worse than the input)."""
    table, current = op_table(problem, orders)
    timing = _Timing(table, current)
    current_score = score(timing.starts, timing.ends, objective)
    best_primary, best_orders = current_score[0], [list(seq) for seq in current]
    rng = random.Random(seed)
    p = len(current)
    reported = began = time.monotonic()
    moves = 0
    # Threshold accepting: a move may lengthen the objective by a random allowance that
    # shrinks to nothing by the end, so the search can leave a rigid local optimum
    # (under a tight limit almost every single move lengthens the span).
    heat = HEAT * current_score[0]
    allowance = cooled = 0.0
    chain: list[tuple[int, int]] | None = None
    try:
        while max_moves is None or moves < max_moves:
            now = time.monotonic()  # every move: one costs up to ~50 ms at p = 32, m = 256
            if now >= deadline:
                break
            moves += 1
            if max_moves is not None:
                cooled = moves / max_moves
            else:
                cooled = (now - began) / max(1e-9, deadline - began)
            # Plain descent first (short runs gain most from it), then the allowance.
            warmth = 0.0 if cooled < DESCENT_SHARE else (1.0 - cooled) / (1.0 - DESCENT_SHARE)
            allowance = heat * warmth * -math.log(1.0 - rng.random())
            if rng.random() < CRITICAL_SHARE:
                if chain is None:
                    chain = timing.critical(objective)
                if not chain:
                    continue
                d, i = chain[rng.randrange(len(chain))]
                # The op bound by its device predecessor moves earlier, or that predecessor later.
                if rng.random() < 0.5:
                    shift = -rng.randint(1, MAX_SHIFT)
                else:
                    i, shift = i - 1, rng.randint(1, MAX_SHIFT)
            else:
                d = _pick_device(timing, rng, p)
                i = _pick_position(timing, d, rng)
                shift = rng.randint(1, MAX_SHIFT) * (1 if rng.random() < 0.5 else -1)
            seq = current[d]
            if len(seq) < 2:
                continue
            j = min(len(seq) - 1, max(0, i + shift))
            if j == i:
                continue
            if rng.random() < REPEAT_SHARE:
                at = repeated_moves(table, seq, i, j - i)
                if not at:
                    continue
                undo = _insert_all(seq, at, j - i, timing.pos)
                if not device_fits(table, seq, table.limit[d]):
                    undo()
                    continue
                lo = min(at[0], at[0] + j - i)
            else:
                if not move_fits(table, seq, i, j, table.limit[d]):
                    continue
                undo = _insert(seq, i, j, timing.pos)
                lo = min(i, j)
            cap = current_score[0] * (1 + _REL) + _REL + allowance
            # Nothing at or after the moved range can start before its first position's
            # predecessor ends; everything that started earlier keeps its times.
            old = (timing.starts, timing.ends, timing.ends[d][lo - 1]) if lo > 0 else None
            starts, ends = retime(table, current, timing.pos, old, cap, objective == "span")
            if starts is not None and ends is not None:
                new = score(starts, ends, objective)
                if new[0] <= cap and (new[0] > current_score[0] * (1 + _REL) or no_worse(new, current_score)):
                    timing.starts, timing.ends, current_score, chain = starts, ends, new, None
                    if new[0] < best_primary * (1 - _REL):
                        best_primary, best_orders = new[0], [list(s) for s in current]
                        if on_improve is not None and time.monotonic() - reported >= report_every:
                            reported = time.monotonic()
                            on_improve(simulate(problem, _as_ops(table, best_orders)))
                    continue
            undo()
    except KeyboardInterrupt:
        if on_improve is not None:  # the caller keeps the best so far
            on_improve(simulate(problem, _as_ops(table, best_orders)))
        raise
    best = simulate(problem, _as_ops(table, best_orders))
    if on_improve is not None:
        on_improve(best)
    return best


def _insert(seq: list[int], i: int, j: int, pos: list[int]) -> Callable[[], None]:
    """Move seq[i] to position j; returns the undo."""
    seq.insert(j, seq.pop(i))
    _renumber(seq, min(i, j), max(i, j), pos)

    def undo() -> None:
        seq.insert(i, seq.pop(j))
        _renumber(seq, min(i, j), max(i, j), pos)

    return undo


def _renumber(seq: list[int], lo: int, hi: int, pos: list[int]) -> None:
    for k in range(lo, hi + 1):
        pos[seq[k]] = k


def repeated_moves(table: OpTable, seq: list[int], i: int, shift: int) -> list[int]:
    """Positions k where moving seq[k] by `shift` is the move of seq[i] in another round:
    seq[k] and seq[k + shift] of the same classes and microbatch distance as seq[i] and
    seq[i + shift]. Rounds whose windows would overlap, or where the move would pass an
    op of its own class or a dependency, are left out."""
    cls, mb, pred = table.cls, table.microbatch, table.pred
    x, y = seq[i], seq[i + shift]
    cx, cy, gap = cls[x], cls[y], mb[y] - mb[x]
    out: list[int] = []
    free_from = 0  # windows stay disjoint, so each move is applied on its own
    for k in range(max(0, -shift), len(seq) - max(0, shift)):
        a, b = seq[k], seq[k + shift]
        if cls[a] != cx or cls[b] != cy or mb[b] - mb[a] != gap or min(k, k + shift) < free_from:
            continue
        lo, hi = (k + shift, k) if shift < 0 else (k + 1, k + shift + 1)
        passed = seq[lo:hi]
        if any(cls[z] == cx for z in passed):
            continue
        if (shift < 0 and pred[a] in passed) or (shift > 0 and any(pred[z] == a for z in passed)):
            continue
        out.append(k)
        free_from = max(k, k + shift) + 1
    return out


def device_fits(table: OpTable, seq: list[int], limit: float) -> bool:
    memory, usage = table.memory, 0.0
    for o in seq:
        usage += memory[o]
        if usage > limit:
            return False
    return True


def _insert_all(seq: list[int], at: list[int], shift: int, pos: list[int]) -> Callable[[], None]:
    """Move each seq[k], k in `at`, by `shift` (disjoint windows); returns the undo."""
    undos = [_insert(seq, k, k + shift, pos) for k in at]

    def undo() -> None:
        for step in reversed(undos):
            step()

    return undo


def _as_ops(table: OpTable, orders: list[list[int]]) -> list[list[Op]]:
    return [[table.ops[o] for o in seq] for seq in orders]


def _pick_device(timing: _Timing, rng: random.Random, p: int) -> int:
    # Half the moves go to the device whose span is the objective, the rest anywhere
    # (the longest device waits on the others).
    if rng.random() < 0.5:
        spans = timing.spans()
        return max(range(p), key=spans.__getitem__)
    return rng.randrange(p)


def _pick_position(timing: _Timing, d: int, rng: random.Random) -> int:
    # Half the moves start next to an idle gap: that is where order changes pay.
    starts, ends = timing.starts[d], timing.ends[d]
    n = len(starts)
    if rng.random() < 0.5:
        for _ in range(4):
            k = rng.randrange(1, n)
            if starts[k] > ends[k - 1] * (1 + _REL) + _REL:
                return k if rng.random() < 0.5 else k - 1
    return rng.randrange(n)

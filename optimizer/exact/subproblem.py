"""The integer problem the CP-SAT and MILP models solve: some ops free, the rest fixed.

For the whole problem every op is free. For a neighbourhood (a window of the incumbent
in time) only the ops starting inside the window are free; the ops before it keep their
times, and the ops after it keep their per-device order. Because ASAP times of a fixed
order are longest paths, the ops after the window add, to each free op, an exact *tail*:
the longest path from its end to the end of the schedule. The model's makespan
max(floor, end + tail) is then the true makespan of the whole schedule (in ticks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from optimizer.exact.timescale import IntegerTables
from optimizer.ops import Op, TimedOp, dependencies
from optimizer.problem import Problem


@dataclass
class SubProblem:
    """Free ops with integer durations, memory deltas and boundary conditions."""

    num_devices: int
    ops: list[Op]
    device: list[int]
    duration: list[int]
    delta: list[int]  # memory change: at the start of an F, at the end of a B or W
    release: list[int]  # earliest start (fixed predecessors, device free time)
    tail: list[int]  # exact remaining length after the op's end
    precedences: list[tuple[int, int, int]]  # (a, b, delay): start[b] >= end[a] + delay
    in_order: list[tuple[int, int]]  # (a, b) on one device: a ends before b starts (symmetry)
    initial_memory: list[int]
    limit: list[int | None]
    floor: int = 0  # makespan reached regardless of the free ops
    hint: list[int] | None = None  # start of each op in the incumbent
    index: dict[Op, int] = field(default_factory=dict)
    transfer_slack: int = 0  # the most transfer time a one-op-at-a-time schedule can add

    def horizon(self, objective: str = "makespan") -> int:
        """A makespan that some optimal solution of the objective does not exceed.

        makespan: the hint's makespan (an optimal solution is no longer than the hint),
        or, without a hint, every op in sequence after the latest release plus the
        longest tail and every transfer.
        span: the hint bounds nothing, since a shorter longest span can need a longer
        makespan (a device starting later waits less). Take a span-optimal order and
        its earliest times at the optimal span Z (optimizer.exact.spantiming): each
        start is the length of a longest path of the order's graph plus span
        constraints, whose cycles gain nothing, so some longest path crosses each
        device's span constraint (weight <= 0) at most once. Between crossings it
        follows the order, at most the sequential bound above; hence the makespan is
        at most (devices + 1) times that bound.
        """
        sequential = max(self.floor, max(self.release, default=0) + sum(self.duration) + max(self.tail, default=0)) + self.transfer_slack
        if objective == "span":
            return (self.num_devices + 1) * sequential
        if self.hint is not None:
            return max([self.floor] + [s + d + q for s, d, q in zip(self.hint, self.duration, self.tail)])
        return sequential

    def hint_span(self) -> int | None:
        """The hint's longest device span in ticks: no span-optimal solution exceeds it."""
        if self.hint is None:
            return None
        spans = []
        for d in range(self.num_devices):
            mine = [j for j in range(len(self.ops)) if self.device[j] == d]
            if mine:
                spans.append(max(self.hint[j] + self.duration[j] for j in mine) - min(self.hint[j] for j in mine))
        return max(spans, default=0)

    def orders_from_starts(self, starts: Sequence[int]) -> list[list[Op]]:
        """The free ops of each device sorted by start time."""
        per_device: list[list[tuple[int, Op]]] = [[] for _ in range(self.num_devices)]
        for j, op in enumerate(self.ops):
            per_device[self.device[j]].append((starts[j], op))
        return [[op for _, op in sorted(ops, key=lambda x: x[0])] for ops in per_device]


def _all_ops(problem: Problem) -> list[Op]:
    return [Op(kind, s, i) for s in range(problem.num_stages) for i in range(problem.num_microbatches) for kind in ("F", "B", "W")]


def _dependency_op(op: Op, num_stages: int) -> Op | None:
    """The one op `op` waits for (unsliced problems: at most one; all backwards split here)."""
    deps = dependencies(op, num_stages)
    return deps[0] if deps else None


def _memory_delta(tables: IntegerTables, op: Op) -> int:
    return tables.memory[op.kind][op.stage]


def full_subproblem(
    problem: Problem,
    tables: IntegerTables,
    hint: Sequence[Sequence[TimedOp]] | None = None,
    symmetry_breaking: bool = True,
) -> SubProblem:
    """Every op free; `hint` is a canonical schedule timed in ticks."""
    ops = _all_ops(problem)
    index = {op: j for j, op in enumerate(ops)}
    S, m = problem.num_stages, problem.num_microbatches
    precedences = []
    for j, op in enumerate(ops):
        dep = _dependency_op(op, S)
        if dep is not None:
            delay = tables.comm if tables.device[dep.stage] != tables.device[op.stage] else 0
            precedences.append((index[dep], j, delay))
    in_order = []
    if symmetry_breaking:
        for s in range(S):
            for kind in ("F", "B", "W"):
                for i in range(m - 1):
                    in_order.append((index[Op(kind, s, i)], index[Op(kind, s, i + 1)]))
    starts = None
    if hint is not None:
        starts = [0] * len(ops)
        for device_ops in hint:
            for t in device_ops:
                starts[index[t.op]] = round(t.start)
    p = problem.num_devices
    sub = SubProblem(
        num_devices=p,
        ops=ops,
        device=[tables.device[op.stage] for op in ops],
        duration=[tables.duration[op.kind][op.stage] for op in ops],
        delta=[_memory_delta(tables, op) for op in ops],
        release=[0] * len(ops),
        tail=[0] * len(ops),
        precedences=precedences,
        in_order=in_order,
        initial_memory=[0] * p,
        limit=list(tables.limit),
        hint=starts,
        index=index,
    )
    sub.transfer_slack = tables.comm * 2 * S * m
    return sub


def window_subproblem(
    problem: Problem,
    tables: IntegerTables,
    timed: Sequence[Sequence[TimedOp]],
    start: int,
    stop: int,
) -> SubProblem:
    """Free the ops of a canonical tick-timed schedule that start in [start, stop).

    Ops starting earlier keep their times; later ops keep their per-device order, and
    contribute exact tails and the floor (see the module doc).
    """
    S, p = problem.num_stages, problem.num_devices
    comm = tables.comm
    device_of = tables.device
    where: dict[Op, tuple[int, int]] = {}  # op -> (device, position)
    lo = [0] * p
    hi = [0] * p
    for d, device_ops in enumerate(timed):
        lo[d] = sum(1 for t in device_ops if t.start < start)
        hi[d] = sum(1 for t in device_ops if t.start < stop)
        for k, t in enumerate(device_ops):
            where[t.op] = (d, k)

    def part(op: Op) -> str:
        d, k = where[op]
        return "before" if k < lo[d] else ("free" if k < hi[d] else "after")

    def delay(a: Op, b: Op) -> int:
        return comm if device_of[a.stage] != device_of[b.stage] else 0

    # Successors by dependency (each op has at most one dependency; invert the relation).
    successors: dict[Op, list[Op]] = {}
    for seq in timed:
        for t in seq:
            dep = _dependency_op(t.op, S)
            if dep is not None:
                successors.setdefault(dep, []).append(t.op)

    # Longest path from each after-op's start to the end, in decreasing start order.
    after = sorted((t for d, seq in enumerate(timed) for t in seq[hi[d] :]), key=lambda t: -t.start)
    length: dict[Op, int] = {}
    for t in after:
        d, k = where[t.op]
        best = 0
        if k + 1 < len(timed[d]):
            best = length[timed[d][k + 1].op]
        for succ in successors.get(t.op, ()):
            best = max(best, delay(t.op, succ) + length[succ])
        length[t.op] = round(t.end - t.start) + best

    # Earliest start of each after-op ignoring the free ops: paths that avoid the window.
    floor = max((round(t.end) for d, seq in enumerate(timed) for t in seq[: lo[d]]), default=0)
    independent: dict[Op, int] = {}
    for t in reversed(after):
        d, k = where[t.op]
        est = 0
        if k > 0 and k - 1 < lo[d]:
            est = round(timed[d][k - 1].end)
        elif k > 0 and k - 1 >= hi[d]:
            prev = timed[d][k - 1]
            est = independent[prev.op] + round(prev.end - prev.start)
        dep = _dependency_op(t.op, S)
        if dep is not None:
            kind = part(dep)
            if kind == "before":
                est = max(est, round(_end_of(timed, where, dep)) + delay(dep, t.op))
            elif kind == "after":
                dep_t = timed[where[dep][0]][where[dep][1]]
                est = max(est, independent[dep] + round(dep_t.end - dep_t.start) + delay(dep, t.op))
        independent[t.op] = est
        floor = max(floor, est + length[t.op])

    ops: list[Op] = [t.op for d, seq in enumerate(timed) for t in seq[lo[d] : hi[d]]]
    index = {op: j for j, op in enumerate(ops)}
    release, tail, hint = [], [], []
    precedences: list[tuple[int, int, int]] = []
    for j, op in enumerate(ops):
        d, k = where[op]
        t = timed[d][k]
        r = round(timed[d][lo[d] - 1].end) if lo[d] > 0 else 0
        dep = _dependency_op(op, S)
        if dep is not None:
            if dep in index:
                precedences.append((index[dep], j, delay(dep, op)))
            else:
                r = max(r, round(_end_of(timed, where, dep)) + delay(dep, op))
        release.append(r)
        q = length[timed[d][hi[d]].op] if hi[d] < len(timed[d]) else 0
        for succ in successors.get(op, ()):
            if succ not in index:
                q = max(q, delay(op, succ) + length[succ])
        tail.append(q)
        hint.append(round(t.start))

    # Keep each (stage, kind) in microbatch order inside the window, as in the incumbent.
    in_order = []
    last_of: dict[tuple[str, int], int] = {}
    for j, op in enumerate(ops):
        key = (op.kind, op.stage)
        if key in last_of:
            in_order.append((last_of[key], j))
        last_of[key] = j

    initial = [0] * p
    for d, seq in enumerate(timed):
        initial[d] = sum(_memory_delta(tables, t.op) for t in seq[: lo[d]])
    return SubProblem(
        num_devices=p,
        ops=ops,
        device=[device_of[op.stage] for op in ops],
        duration=[tables.duration[op.kind][op.stage] for op in ops],
        delta=[_memory_delta(tables, op) for op in ops],
        release=release,
        tail=tail,
        precedences=precedences,
        in_order=in_order,
        initial_memory=initial,
        limit=list(tables.limit),
        floor=floor,
        hint=hint,
        index=index,
    )


def _end_of(timed: Sequence[Sequence[TimedOp]], where: dict[Op, tuple[int, int]], op: Op) -> float:
    d, k = where[op]
    return timed[d][k].end


def splice(timed: Sequence[Sequence[TimedOp]], start: int, stop: int, window_orders: list[list[Op]]) -> list[list[Op]]:
    """The incumbent's order with each device's window segment replaced by the new one."""
    orders = []
    for d, ops in enumerate(timed):
        lo = sum(1 for t in ops if t.start < start)
        hi = sum(1 for t in ops if t.start < stop)
        orders.append([t.op for t in ops[:lo]] + window_orders[d] + [t.op for t in ops[hi:]])
    return orders

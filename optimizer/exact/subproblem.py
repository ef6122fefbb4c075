"""The integer problem the CP-SAT and MILP models solve: some ops free, the rest fixed.

For the whole problem every op is free. For a neighbourhood (a window of the incumbent
in time) only the ops starting inside the window are free; the ops before it keep their
times, and the ops after it keep their per-device order. Because ASAP times of a fixed
order are longest paths, the ops after the window add, to each free op, an exact *tail*:
the longest path from its end to the end of the schedule. The model's makespan
max(floor, end + tail) is then the true makespan of the whole schedule (in ticks).

Fused-or-split backward: where a stage's fused backward BW is shorter than B + W, the
whole model may choose per pair. Each such pair is listed in `fusable` as (B, W, fused
duration): when fused, B takes the fused duration and W takes no time at B's end, so
B's dependents wait for the fused end and W's memory change happens with B's, exactly
BW's semantics; a zero-length W glued to its B reads back as one BW op. Windows offer the
choice for their free backwards (a free BW opens into its B and W, fused in the hint);
the others keep the incumbent's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from optimizer.exact.ticktiming import tick_times
from optimizer.exact.timescale import IntegerTables
from optimizer.ops import SPLIT_KINDS, VOCAB_KINDS, Kind, Op, TimedOp, completion_key, dependencies, dependency_depths, dependency_order
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
    depth: Callable[[Op], int]  # dependency depth (optimizer.ops.dependency_depths): orders ties
    floor: int = 0  # makespan reached regardless of the free ops
    hint: list[int] | None = None  # start of each op in the incumbent
    index: dict[Op, int] = field(default_factory=dict)
    transfer_slack: int = 0  # the most transfer time a one-op-at-a-time schedule can add
    fusable: list[tuple[int, int, int]] = field(default_factory=list)  # (B, W, fused duration)
    # (a, b, f): a ends before b starts unless pair f of `fusable` is fused (symmetry)
    in_order_if_split: list[tuple[int, int, int]] = field(default_factory=list)
    hint_fused: list[bool] | None = None  # per pair of `fusable`, in the incumbent
    # Every op free and no context fixed: a schedule shifted in time is still one, so a
    # span-optimal solution starting at time 0 exists (the span model pins its first op).
    shiftable: bool = False

    def least_durations(self) -> list[int]:
        """Each op's shortest duration, fused or split (for bounds on start times)."""
        return [min(a, b) for a, b in zip(self.duration, self.durations([True] * len(self.fusable)))]

    def durations(self, fused: Sequence[bool] | None) -> list[int]:
        """Each op's duration under a choice of fused pairs (None: all split)."""
        duration = list(self.duration)
        for (b, w, bw), f in zip(self.fusable, fused or ()):
            if f:
                duration[b], duration[w] = bw, 0
        return duration

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
            return max([self.floor] + [s + d + q for s, d, q in zip(self.hint, self.durations(self.hint_fused), self.tail)])
        return sequential

    def sources(self) -> list[int]:
        """The ops nothing precedes (no dependency, no class order): every op follows one."""
        has_predecessor = {b for _, b, _ in self.precedences} | {b for _, b in self.in_order} | {b for _, b, _ in self.in_order_if_split}
        return [j for j in range(len(self.ops)) if j not in has_predecessor]

    def hint_span(self) -> int | None:
        """The hint's longest device span in ticks: no span-optimal solution exceeds it."""
        if self.hint is None:
            return None
        spans = []
        duration = self.durations(self.hint_fused)
        for d in range(self.num_devices):
            mine = [j for j in range(len(self.ops)) if self.device[j] == d]
            if mine:
                spans.append(max(self.hint[j] + duration[j] for j in mine) - min(self.hint[j] for j in mine))
        return max(spans, default=0)

    def orders_from_starts(self, starts: Sequence[int], fused: Sequence[bool] | None = None) -> list[list[Op]]:
        """The free ops of each device sorted by start time; a fused pair becomes one BW."""
        merged: dict[int, Op] = {}
        dropped: set[int] = set()
        for (b, w, _), f in zip(self.fusable, fused or ()):
            if f:
                merged[b] = fused_op(self.ops[b])
                dropped.add(w)
        per_device: list[list[tuple[int, int, int, Op]]] = [[] for _ in range(self.num_devices)]
        for j, op in enumerate(self.ops):
            if j not in dropped:
                per_device[self.device[j]].append((starts[j], self.depth(op), j, merged.get(j, op)))
        # Ties (an op of no ticks starts with its successor) go by dependency depth.
        return [[op for *_, op in sorted(ops)] for ops in per_device]


def fused_op(op: Op) -> Op:
    """The fused backward standing for B `op` and its W."""
    return op._replace(kind=Kind.BW)


def _all_ops(problem: Problem) -> list[Op]:
    ops = [
        Op(kind, s, i, k)
        for s in range(problem.num_stages)
        for i in range(problem.num_microbatches)
        for k in range(problem.num_slices)
        for kind in SPLIT_KINDS
    ]
    if problem.vocab_parallel is not None:
        ops += [Op(kind, d, i) for d in range(problem.num_devices) for i in range(problem.num_microbatches) for kind in VOCAB_KINDS]
    return ops


def _ticks(tables: IntegerTables, op: Op) -> int:
    return tables.op_ticks(op.kind, op.stage, op.slice)


def _memory_delta(tables: IntegerTables, op: Op) -> int:
    return tables.op_delta(op.kind, op.stage, op.slice)


def fusing_can_win_ticks(tables: IntegerTables, op: Op) -> bool:
    """optimizer.ops.fusing_can_win on the tick grid, for the B `op`: the fused
    backward is shorter, or B allocates memory under a limit (B then W holds that
    allocation between them, a fused BW never does)."""
    split = _ticks(tables, op._replace(kind=Kind.B)) + _ticks(tables, op._replace(kind=Kind.W))
    if tables.op_ticks(Kind.BW, op.stage, op.slice) < split:
        return True
    return _memory_delta(tables, op._replace(kind=Kind.B)) > 0 and tables.limit[tables.device[op.stage]] is not None


def full_subproblem(
    problem: Problem,
    tables: IntegerTables,
    hint: Sequence[Sequence[Op]] | None = None,
    symmetry_breaking: bool = True,
) -> SubProblem:
    """Every op free, B and W of each backward apart; `hint` is a canonical order (BW where fused).

    Where the fused backward is shorter than B + W on the grid, each (stage, microbatch,
    slice) may fuse (see the module doc). Symmetry breaking keeps each class (kind,
    stage, slice) in microbatch order, which some optimal schedule does
    (optimizer.exact.canonical): Fs and backwards always; a W after the previous
    microbatch's W only when its own backward is split (a split W may wait past the
    next microbatch's fused backward, whose W sits at that backward's end).
    """
    ops = _all_ops(problem)
    index = {op: j for j, op in enumerate(ops)}
    S, m, K = problem.num_stages, problem.num_microbatches, problem.num_slices
    precedences = []
    for j, op in enumerate(ops):
        for dep in dependencies(op, S, K, tables.vocab):
            precedences.append((index[dep], j, tables.delay(dep, tables.op_device(op))))
    duration = [_ticks(tables, op) for op in ops]
    fusable: list[tuple[int, int, int]] = []
    pair_of: dict[int, int] = {}  # W's index -> its pair's number in `fusable`
    for j, op in enumerate(ops):
        if op.kind == Kind.B:
            w = index[op._replace(kind=Kind.W)]
            if fusing_can_win_ticks(tables, op):
                pair_of[w] = len(fusable)
                fusable.append((j, w, tables.op_ticks(Kind.BW, op.stage, op.slice)))
    in_order, in_order_if_split = [], []
    p = problem.num_devices
    if symmetry_breaking:
        for s in range(S):
            for k in range(K):
                for kind in SPLIT_KINDS:
                    for i in range(m - 1):
                        a, b = index[Op(kind, s, i, k)], index[Op(kind, s, i + 1, k)]
                        if b in pair_of:
                            in_order_if_split.append((a, b, pair_of[b]))
                        else:
                            in_order.append((a, b))
        if tables.vocab is not None:  # a shard's passes are classes too (optimizer.exact.canonical)
            in_order += [(index[Op(kind, d, i)], index[Op(kind, d, i + 1)]) for kind in VOCAB_KINDS for d in range(p) for i in range(m - 1)]
    sub = SubProblem(
        num_devices=p,
        ops=ops,
        device=[tables.op_device(op) for op in ops],
        duration=duration,
        delta=[_memory_delta(tables, op) for op in ops],
        release=[0] * len(ops),
        tail=[0] * len(ops),
        precedences=precedences,
        in_order=in_order,
        initial_memory=[0] * p,
        limit=list(tables.limit),
        depth=dependency_depths(S, K, tables.vocab),
        index=index,
        fusable=fusable,
        in_order_if_split=in_order_if_split,
        shiftable=True,
    )
    sub.transfer_slack = tables.comm * 2 * S * m * K + (tables.barrier * 2 * m if tables.vocab is not None else 0)
    if hint is not None:
        _set_hint(sub, tables, S, hint, pair_of)
    return sub


def _set_hint(sub: SubProblem, tables: IntegerTables, num_stages: int, orders: Sequence[Sequence[Op]], pair_of: dict[int, int]) -> None:
    """Starts (and fused choices) of the whole model from a canonical order timed in ticks.

    A BW starts its B; its W starts at the fused end. Where the grid offers no choice
    (the fused backward is no shorter there), B and W run back to back in BW's place.
    """
    starts = [0] * len(sub.ops)
    fused = [False] * len(sub.fusable)
    for device_ops in tick_times(tables, num_stages, orders):
        for t in device_ops:
            if t.kind != Kind.BW:
                starts[sub.index[t.op]] = round(t.start)
                continue
            b = sub.index[t.op._replace(kind=Kind.B)]
            w = sub.index[t.op._replace(kind=Kind.W)]
            starts[b] = round(t.start)
            if w in pair_of:
                fused[pair_of[w]] = True
                starts[w] = round(t.end)
            else:
                starts[w] = round(t.start) + sub.duration[b]
    sub.hint = starts
    sub.hint_fused = fused


def window_subproblem(
    problem: Problem,
    tables: IntegerTables,
    timed: Sequence[Sequence[TimedOp]],
    start: int,
    stop: int,
) -> SubProblem:
    """Free the ops of a canonical tick-timed schedule that start in [start, stop).

    Ops starting earlier keep their times; later ops keep their per-device order, and
    contribute exact tails and the floor (see the module doc). Free backwards whose
    class can fuse keep the choice, starting from the incumbent's.
    """
    S, K, p = problem.num_stages, problem.num_slices, problem.num_devices
    where: dict[Op, tuple[int, int]] = {}  # op -> (device, position)
    producer: dict[Op, Op] = {}  # completion key -> the op that completes it (B or BW)
    lo = [0] * p
    hi = [0] * p
    for d, device_ops in enumerate(timed):
        lo[d] = sum(1 for t in device_ops if t.start < start)
        hi[d] = sum(1 for t in device_ops if t.start < stop)
        for k, t in enumerate(device_ops):
            where[t.op] = (d, k)
            key = completion_key(t)
            if key is not None:
                producer[key] = t.op

    def part(op: Op) -> str:
        d, k = where[op]
        return "before" if k < lo[d] else ("free" if k < hi[d] else "after")

    def delay(a: Op, b: Op) -> int:
        return tables.delay(a, tables.op_device(b))

    def deps(op: Op) -> list[Op]:
        return [producer[key] for key in dependencies(op, S, K, tables.vocab)]

    # Successors by dependency (invert the relation).
    successors: dict[Op, list[Op]] = {}
    for seq in timed:
        for t in seq:
            for dep in deps(t.op):
                successors.setdefault(dep, []).append(t.op)

    # The ops after the window, every one after its predecessors.
    after = [timed[d][k] for d, k in dependency_order(timed, S, K, tables.vocab, first=hi)]
    # Longest path from each after-op's start to the end, successors first.
    length: dict[Op, int] = {}
    for t in reversed(after):
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
    for t in after:
        d, k = where[t.op]
        est = 0
        if k > 0 and k - 1 < lo[d]:
            est = round(timed[d][k - 1].end)
        elif k > 0 and k - 1 >= hi[d]:
            prev = timed[d][k - 1]
            est = independent[prev.op] + round(prev.end - prev.start)
        for dep in deps(t.op):
            kind = part(dep)
            if kind == "before":
                est = max(est, round(_end_of(timed, where, dep)) + delay(dep, t.op))
            elif kind == "after":
                dep_t = timed[where[dep][0]][where[dep][1]]
                est = max(est, independent[dep] + round(dep_t.end - dep_t.start) + delay(dep, t.op))
        independent[t.op] = est
        floor = max(floor, est + length[t.op])

    # The free ops. Where fusing can win (on the grid), a free BW opens into B and W with
    # the choice (fused in the hint), and a free split B with its free W get it too.
    def can_fuse(op: Op) -> bool:
        return fusing_can_win_ticks(tables, op)

    ops: list[Op] = []
    hint: list[int] = []
    origin: list[Op] = []  # the incumbent's op each window op stands for
    opened: dict[Op, int] = {}  # a free BW -> the index of its B
    for d, seq in enumerate(timed):
        for t in seq[lo[d] : hi[d]]:
            if t.kind == Kind.BW and can_fuse(t.op):
                opened[t.op] = len(ops)
                ops += [t.op._replace(kind=Kind.B), t.op._replace(kind=Kind.W)]
                hint += [round(t.start), round(t.end)]
                origin += [t.op, t.op]
            else:
                ops.append(t.op)
                hint.append(round(t.start))
                origin.append(t.op)
    index = {op: j for j, op in enumerate(ops)}

    def inside(op: Op) -> int | None:
        """The window op that completes the incumbent's `op` (an opened BW: its B), or None."""
        return opened[op] if op in opened else index.get(op)

    release, tail = [], []
    precedences: list[tuple[int, int, int]] = []
    for j, op in enumerate(ops):
        d, k = where[origin[j]]
        r = round(timed[d][lo[d] - 1].end) if lo[d] > 0 else 0
        q = length[timed[d][hi[d]].op] if hi[d] < len(timed[d]) else 0
        if origin[j] in opened and op.kind == Kind.W:  # after its own B; nothing waits for it
            precedences.append((j - 1, j, 0))
            release.append(r)
            tail.append(q)
            continue
        for dep in deps(origin[j]):
            at = inside(dep)
            if at is not None:
                precedences.append((at, j, delay(dep, op)))
            else:
                r = max(r, round(_end_of(timed, where, dep)) + delay(dep, op))
        release.append(r)
        for succ in successors.get(origin[j], ()):
            if inside(succ) is None:
                q = max(q, delay(op, succ) + length[succ])
        tail.append(q)

    fusable: list[tuple[int, int, int]] = []
    hint_fused: list[bool] = []
    pair_of: dict[int, int] = {}  # W's index -> its pair
    for j, op in enumerate(ops):
        w = index.get(op._replace(kind=Kind.W)) if op.kind == Kind.B else None
        if w is not None and (origin[j] in opened or can_fuse(op)):
            pair_of[w] = len(fusable)
            fusable.append((j, w, tables.op_ticks(Kind.BW, op.stage, op.slice)))
            hint_fused.append(origin[j] in opened)

    # Keep each class (kind, stage, slice; B and BW together) in the incumbent's order inside
    # the window; a W of a pair only while it is split (see full_subproblem).
    in_order: list[tuple[int, int]] = []
    in_order_if_split: list[tuple[int, int, int]] = []
    last_of: dict[tuple[str, int, int], int] = {}
    for j, op in enumerate(ops):
        cls = (Kind.B if op.kind == Kind.BW else op.kind, op.stage, op.slice)
        if cls in last_of:
            if j in pair_of:
                in_order_if_split.append((last_of[cls], j, pair_of[j]))
            else:
                in_order.append((last_of[cls], j))
        last_of[cls] = j

    initial = [0] * p
    for d, seq in enumerate(timed):
        initial[d] = sum(_memory_delta(tables, t.op) for t in seq[: lo[d]])
    return SubProblem(
        num_devices=p,
        ops=ops,
        device=[tables.op_device(op) for op in ops],
        duration=[_ticks(tables, op) for op in ops],
        delta=[_memory_delta(tables, op) for op in ops],
        release=release,
        tail=tail,
        precedences=precedences,
        in_order=in_order,
        initial_memory=initial,
        limit=list(tables.limit),
        depth=dependency_depths(S, K, tables.vocab),
        floor=floor,
        hint=hint,
        index=index,
        fusable=fusable,
        in_order_if_split=in_order_if_split,
        hint_fused=hint_fused,
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

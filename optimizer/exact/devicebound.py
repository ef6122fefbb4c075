"""A lower bound from a few devices at a time, each relaxation solved exactly with CP-SAT.

The relaxation for a set of devices keeps, of the whole problem, only the ops of those
devices:

* each op's earliest start (head) and the least work that must follow it (tail), as in
  optimizer.exact.bounds (memory-aware heads where there is a limit);
* one microbatch's path: F through every stage, then B back. Between two consecutive ops
  of the path on kept devices, the ops in between (on dropped devices) still take their
  durations and transfers, but their devices' contention is relaxed away;
* one op at a time per kept device, each stage's ops of a kind in microbatch order
  (optimizer.exact.canonical: an optimal schedule of this form exists);
* each kept device's memory limit, with the simulator's events.

Every schedule of the whole problem, restricted to the kept devices, satisfies all of
these, so the relaxation's optimum, and any bound CP-SAT proves on it, is a lower bound
on the makespan. Unlike the preemptive heads-and-tails bound it sees that, under a
memory limit, the first device must wait for earlier microbatches to come back before
it starts the next forward, while the busiest devices downstream delay that return.
A superset of devices is a tighter relaxation, so sets grow from the most telling
single devices for as long as CP-SAT still closes them.

Span objective: a device's span is measured from its own first start, so one device is
relaxed at a time in that frame (`DeviceRelaxation.span_frame`): heads from the device's
first forward (optimizer.exact.bounds.heads with an origin) and tails to its last op
(device_tails). Every schedule, shifted so that the device's first op starts at 0, meets
these, so the relaxation's optimum bounds that device's span, and the largest over the
devices bounds the longest span. Sets of devices need one common frame: the device that
runs stage 0 gives one, since it starts the schedule's first op (`anchored_sets`). Its
span is bounded with its neighbours kept, their ops counted by their tails to its last
end. On p = 4, m = 8 on the V placement at V-Min's memory that lifts its bound from 476.1
(alone) to 509.1 (three devices) and 531.5 (all four: the optimum).

Integers: durations, transfer time, heads, tails and path lengths are those of the tick
problem, whose durations are the real ones rounded *down* (optimizer.exact.timescale);
memory sizes are rounded down and limits up. Each rounding only loosens the relaxation
(as-soon-as-possible times are monotone in the data), so a bound in ticks divided by the
time scale is a bound in real units.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from ortools.sat.python import cp_model

from optimizer.exact.bounds import device_tails, heads, jackson_preemptive, tails
from optimizer.exact.cpsat import run_cpsat
from optimizer.exact.slicebounds import split_relaxation
from optimizer.exact.timescale import integer_tables, tick_problem
from optimizer.ops import TimedOp
from optimizer.problem import Problem, tolerant

KINDS = ("F", "B", "W")
MEMORY_UNITS = 10**6  # memory grid of the relaxation (rounded in its favour, see above)
# Largest relaxation tried, in ops: p = 8, m = 16 closes 7 devices (336 ops) in ~20 s on
# 2 cores; a single device of 384 ops (p = 16, m = 64, V) proves nothing in 20 s.
MAX_OPS = 360
# One device's span relaxation is a single machine: CP-SAT closes p = 8, m = 64 (192 ops)
# under a tight limit in about a second.
SPAN_MAX_OPS = 400
# Largest set around the first device tried for its span (see anchored_sets).
ANCHORED_MAX_OPS = 600


class DeviceRelaxation:
    """The data shared by every relaxation of one problem (see the module doc)."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.tables = integer_tables(problem)
        self.ticks = tick_problem(problem, self.tables)
        self.memory_aware = problem.memory_limit is not None
        self.head = heads(self.ticks, memory_aware=self.memory_aware)
        self.tail = tails(self.ticks)
        self.pieces, self.limits = _memory_pieces(problem)
        S = problem.num_stages
        dev = self.tables.device
        comm = [self.tables.comm if s + 1 < S and dev[s] != dev[s + 1] else 0 for s in range(S)]
        # One microbatch's path and the transfer after each step of it.
        self.path = [("F", s) for s in range(S)] + [("B", s) for s in reversed(range(S))]
        self.links = [comm[s] if s + 1 < S else 0 for s in range(S)] + [comm[s - 1] if s > 0 else 0 for s in reversed(range(S))]
        # A time no op of some span-optimal schedule reaches (SubProblem.horizon's argument:
        # devices + 1 times every op and transfer in sequence), for ops the objective does
        # not count.
        sequential = sum(self.tables.duration[k][s] for k in KINDS for s in range(S)) * problem.num_microbatches
        self.far = (problem.num_devices + 1) * (sequential + 2 * S * problem.num_microbatches * self.tables.comm)

    def ops_on(self, devices: Sequence[int]) -> int:
        dev = self.tables.device
        return 3 * self.problem.num_microbatches * sum(1 for s in range(self.problem.num_stages) if dev[s] in set(devices))

    def span_frame(self, device: int) -> tuple[dict[str, list[list[float]]], dict[str, list[list[float]]]]:
        """Heads from `device`'s first start and tails to its last end (see the module doc)."""
        origin = min(self.problem.stages_on(device))
        return heads(self.ticks, self.memory_aware, origin=origin), device_tails(self.ticks, device)

    def hint(self, incumbent: Sequence[Sequence[TimedOp]] | None, origin: int) -> dict[tuple[str, int, int], int] | None:
        """A schedule's starts in ticks, in the frame that begins at stage `origin`'s first
        forward (only a hint: rounding may break a constraint by a tick, CP-SAT repairs it)."""
        if incumbent is None:
            return None
        starts = {(str(op.kind), op.stage, op.microbatch): op.start for ops in incumbent for op in ops if op.slice == 0}
        zero = starts.get(("F", origin, 0))
        if zero is None:
            return None
        scale = self.tables.time_scale
        return {key: round((value - zero) * scale) for key, value in starts.items()}

    def solve(
        self,
        devices: Sequence[int],
        *,
        upper: float,
        floor: int,
        time_limit: float,
        seed: int,
        threads: int,
        frame: tuple[dict[str, list[list[float]]], dict[str, list[list[float]]]] | None = None,
        hint: dict[tuple[str, int, int], int] | None = None,
    ) -> tuple[int, bool]:
        """(bound in ticks, closed) for the relaxation keeping `devices`.

        `upper` is the objective of a known schedule (an optimal one is no longer) and
        `floor` a bound in ticks already proven (e.g. for a subset of `devices`). `frame`
        replaces the heads and tails (span_frame of one device under the span objective);
        an op with no path to a counted op (tail -inf) is kept but not counted. `hint`:
        starts in ticks per (kind, stage, microbatch), e.g. `hint(incumbent, origin)`.
        """
        head, tail = frame if frame is not None else (self.head, self.tail)
        # --- data -----------------------------------------------------------------------
        kept = set(devices)
        m = self.problem.num_microbatches
        dur = self.tables.duration
        dev = self.tables.device
        stages = [s for s in range(self.problem.num_stages) if dev[s] in kept]
        horizon = max(floor, math.ceil(upper * self.tables.time_scale) + 1)

        # --- variables ------------------------------------------------------------------
        model = cp_model.CpModel()
        start, interval = {}, {}
        makespan = model.new_int_var(floor, horizon, "makespan")
        for s in stages:
            for kind in KINDS:
                for i in range(m):
                    key = (kind, s, i)
                    r, d = round(head[kind][s][i]), dur[kind][s]
                    if math.isinf(tail[kind][s][i]):  # not followed by a counted op: any time will do
                        start[key] = model.new_int_var(r, max(r, self.far), f"start_{kind}_{s}_{i}")
                    else:
                        # Tick-problem heads and tails are sums of integers: round() drops float noise only.
                        q = round(tail[kind][s][i])
                        start[key] = model.new_int_var(r, max(r, horizon - d - q), f"start_{kind}_{s}_{i}")
                        model.add(makespan >= start[key] + d + q)
                    interval[key] = model.new_fixed_size_interval_var(start[key], d, f"op_{kind}_{s}_{i}")

        def end(key):
            return start[key] + dur[key[0]][key[1]]

        # --- constraints ----------------------------------------------------------------
        for d in kept:
            model.add_no_overlap([iv for key, iv in interval.items() if dev[key[1]] == d])
        for s in stages:
            for kind in KINDS:
                for i in range(1, m):
                    model.add(start[(kind, s, i)] >= end((kind, s, i - 1)))
            for i in range(m):
                model.add(start[("W", s, i)] >= end(("B", s, i)))
        steps = [k for k, (_, s) in enumerate(self.path) if dev[s] in kept]
        for a, b in zip(steps, steps[1:]):
            between = sum(dur[kind][s] for kind, s in self.path[a + 1 : b]) + sum(self.links[a:b])
            for i in range(m):
                model.add(start[(*self.path[b], i)] >= end((*self.path[a], i)) + between)
        if self.pieces is not None:
            pieces = self.pieces
            for d in sorted(kept):
                limit = self.limits[d]
                if limit is None:
                    continue
                # An F allocates both pieces at its start; B and W free theirs at their end.
                # Ops on a device never overlap, so events follow the device's order.
                keys = [key for key in start if dev[key[1]] == d]
                times = [start[key] if key[0] == "F" else end(key) for key in keys]
                changes = [_change(pieces, key) for key in keys]
                model.add_reservoir_constraint(times, changes, -sum(c for c in changes if c > 0) - 1, limit)

        # --- objective and solve --------------------------------------------------------
        model.minimize(makespan)
        for key, value in (hint or {}).items():
            if key in start:
                model.add_hint(start[key], value)
        solver, status = run_cpsat(model, time_limit=time_limit, seed=seed, threads=threads)
        if status == cp_model.OPTIMAL:
            return solver.value(makespan), True
        if status == cp_model.INFEASIBLE:
            # Impossible while `upper` is a real schedule's makespan; claim nothing new.
            return floor, False
        # FEASIBLE or UNKNOWN: the bound CP-SAT proved, never below the makespan's domain.
        return max(floor, math.floor(solver.best_objective_bound + 1e-9)), False


def _change(pieces: dict[str, list[int]], key: tuple[str, int, int]) -> int:
    """The memory change of an op in the relaxation's units: +both pieces at an F, -its piece at a B or W."""
    kind, s, _ = key
    if kind == "F":
        return pieces["B"][s] + pieces["W"][s]
    return -pieces[kind][s]


def _memory_pieces(problem: Problem) -> tuple[dict[str, list[int]] | None, list[int | None]]:
    """Integer sizes of what each B and W frees, rounded down, and the limits rounded up.

    An F allocates exactly what its B and W free (the three deltas sum to 0), so these
    sizes describe the whole memory curve; rounding this way only loosens it. None (no
    memory in the relaxation, still a relaxation) when some B or W allocates.
    """
    t = problem.tables()
    limits = [None if math.isinf(v) else math.ceil(tolerant(v) * MEMORY_UNITS - 1e-6) for v in t.limit]
    if any(v > 0 for v in t.mem_backward_input + t.mem_backward_weight):
        return None, limits
    # 1e-6 of a unit absorbs float noise of exact decimals (0.63 * 1e6 = 629999.9999...).
    pieces = {
        "B": [math.floor(-v * MEMORY_UNITS + 1e-6) for v in t.mem_backward_input],
        "W": [math.floor(-v * MEMORY_UNITS + 1e-6) for v in t.mem_backward_weight],
    }
    return pieces, limits


def applicable(problem: Problem, max_ops: int = MAX_OPS, objective: str = "makespan") -> bool:
    """Worth trying when two devices together (one device for the span) stay within `max_ops` ops."""
    relaxation_ops = 3 * problem.num_microbatches * max(len(problem.stages_on(d)) for d in range(problem.num_devices))
    if objective == "span":
        return relaxation_ops <= SPAN_MAX_OPS
    return problem.num_devices > 1 and 2 * relaxation_ops <= max_ops


def relaxation_applies(problem: Problem, objective: str) -> bool:
    """Whether the relaxations can bound `problem`: they time backwards as B then W with one
    slice, so where a fused backward is shorter they run on the split relaxation
    (optimizer.exact.slicebounds), when there is one; with vocabulary passes they would
    bound the problem without them (valid, and weak), so they are left out there."""
    if problem.vocab_parallel is not None:
        return False
    relaxed = split_relaxation(problem)
    return relaxed is not None and applicable(relaxed, objective=objective)


def device_subset_bound(
    problem: Problem,
    *,
    upper: float,
    deadline: float,
    seed: int = 0,
    threads: int = 2,
    max_ops: int = MAX_OPS,
    on_bound: Callable[[float, str], None] | None = None,
    objective: str = "makespan",
    incumbent: Sequence[Sequence[TimedOp]] | None = None,
) -> float:
    """The best bound (real units) the relaxations prove before `deadline` (time.monotonic).

    Single devices first, each for a short time, to rank them (ties: more work first);
    then sets of the top 2, 3, ... devices, each starting from the last proven bound,
    until one does not close in time or the set grows past `max_ops` ops. `on_bound`
    hears every improvement with a description of the set. `incumbent` (a schedule's
    timed ops, of length `upper`) is every relaxation's hint: a relaxation that starts
    from a solution as long as the bound to beat only has to prove, and closes far
    sooner (p = 4, m = 8, V at V-Min's memory, every device: 2.3 s against none in 30 s).
    """
    built = time.monotonic()
    relax = DeviceRelaxation(problem)
    one_pass = time.monotonic() - built  # heads and tails over the whole problem, as each span frame
    scale = relax.tables.time_scale
    upper_ticks = math.floor(upper * scale + 1e-9)
    p = problem.num_devices
    if objective == "span":
        return _span_bound(
            relax,
            upper=upper,
            deadline=deadline,
            seed=seed,
            threads=threads,
            on_bound=on_bound,
            incumbent=incumbent,
            frame_seconds=one_pass,
        )
    hint = relax.hint(incumbent, origin=0)
    best = _BestBound(scale, on_bound)

    def record(value: int, devices: Sequence[int]) -> None:
        best.offer(value, f"devices {', '.join(map(str, sorted(devices)))} as an exact relaxation")

    singles = {}
    for d in range(p):
        left = deadline - time.monotonic()
        if left <= 0.05:
            return best.value()
        value, _ = relax.solve([d], upper=upper, floor=0, time_limit=min(left, left / (2 * (p - d))), seed=seed, threads=threads, hint=hint)
        singles[d] = value
        record(value, [d])
    work = [sum(relax.tables.duration[k][s] for s in problem.stages_on(d) for k in KINDS) for d in range(p)]
    ranked = sorted(range(p), key=lambda d: (-singles[d], -work[d], d))
    for size in range(2, p):
        devices = ranked[:size]
        left = deadline - time.monotonic()
        if left <= 0.05 or relax.ops_on(devices) > max_ops or best.ticks >= upper_ticks:
            break
        value, closed = relax.solve(devices, upper=upper, floor=best.ticks, time_limit=left, seed=seed, threads=threads, hint=hint)
        record(value, devices)
        if not closed:
            break
    return best.value()


class _BestBound:
    """The highest bound proven so far, in ticks; each rise is reported with its reason."""

    def __init__(self, scale: float, on_bound: Callable[[float, str], None] | None):
        self.ticks = 0
        self.scale = scale
        self.on_bound = on_bound

    def offer(self, ticks: int, reason: str) -> None:
        if ticks > self.ticks:
            self.ticks = ticks
            if self.on_bound is not None:
                self.on_bound(ticks / self.scale, reason)

    def value(self) -> float:
        """The bound in the problem's units."""
        return self.ticks / self.scale


def _span_bound(
    relax: DeviceRelaxation,
    *,
    upper: float,
    deadline: float,
    seed: int,
    threads: int,
    on_bound: Callable[[float, str], None] | None,
    incumbent: Sequence[Sequence[TimedOp]] | None = None,
    frame_seconds: float = 0.0,
) -> float:
    """The longest-span bound: each device alone in its own frame, most telling first,
    and the first device together with its neighbours.

    Every device's frame is computed first (to rank them), about `frame_seconds` each:
    where those would take more than half the time left, nothing is started (at p = 16,
    m = 64 on the V placement they take 1.3 s, and started with 0.35 s left they kept a
    5 s solve to 6.1 s).

    Devices are ranked by their preemptive bound in the same frame (ties: the first device,
    which waits longest for its round trips under a memory limit); the first gets 80% of
    the time (it is the one that proves ZB-H1 optimal at 1F1B's memory), the others share
    the rest. Once the device that runs stage 0 closes alone, sets of it and its
    neighbours along the pipeline follow (`anchored_sets`), as long as each closes.
    """
    problem = relax.problem
    scale = relax.tables.time_scale
    best = _BestBound(scale, on_bound)
    if time.monotonic() + 2 * problem.num_devices * frame_seconds > deadline:
        return best.value()
    frames = [relax.span_frame(d) for d in range(problem.num_devices)]
    preemptive = [jackson_preemptive(_jobs(relax, d, *frames[d])) for d in range(problem.num_devices)]
    order = sorted(range(problem.num_devices), key=lambda d: (-preemptive[d], d))
    upper_ticks = math.floor(upper * scale + 1e-9)
    anchor = relax.tables.device[0]
    for n, d in enumerate(order):
        left = deadline - time.monotonic()
        if left <= 0.05 or best.ticks >= upper_ticks:
            break
        share = 0.8 * left if n == 0 else left / (len(order) - n)
        hint = relax.hint(incumbent, origin=min(problem.stages_on(d)))
        value, closed = relax.solve([d], upper=upper, floor=0, time_limit=share, seed=seed, threads=threads, frame=frames[d], hint=hint)
        best.offer(value, f"device {d}'s span as an exact relaxation")
        if d == anchor and closed:
            for devices in anchored_sets(relax):
                left = deadline - time.monotonic()
                if left <= 0.05 or best.ticks >= upper_ticks:
                    break
                # The other devices' own spans keep a fifth of what is left.
                value, closed = relax.solve(
                    devices, upper=upper, floor=value, time_limit=0.8 * left, seed=seed, threads=threads, frame=frames[d], hint=hint
                )
                names = ", ".join(map(str, devices))
                best.offer(value, f"device {d}'s span with devices {names} as an exact relaxation")
                if not closed:
                    break
    return best.value()


def anchored_sets(relax: DeviceRelaxation, max_ops: int = ANCHORED_MAX_OPS) -> list[list[int]]:
    """Growing sets of devices around the one that runs stage 0, for its span.

    That device starts the first op of the whole schedule (every op waits for a forward
    of stage 0, and forwards of a stage run in microbatch order), so its own frame is
    the schedule's: the other devices of a set keep their heads in it, and the tails to
    its last end (bounds.device_tails) bound its span through their ops too. Neighbours
    come in pipeline order (by their first stage): they are the ones whose contention
    delays the round trips that the first device waits for under a memory limit.
    """
    problem = relax.problem
    anchor = relax.tables.device[0]
    others = sorted((d for d in range(problem.num_devices) if d != anchor), key=lambda d: min(problem.stages_on(d)))
    sets = []
    for size in range(1, len(others) + 1):
        devices = [anchor, *others[:size]]
        if relax.ops_on(devices) > max_ops:
            break
        sets.append(devices)
    return sets


def _jobs(relax: DeviceRelaxation, device: int, head, tail) -> list[tuple[float, float, float]]:
    """(head, duration, tail) of every op of `device`, in ticks."""
    dur = relax.tables.duration
    m = relax.problem.num_microbatches
    return [(head[k][s][i], dur[k][s], tail[k][s][i]) for s in relax.problem.stages_on(device) for k in KINDS for i in range(m)]

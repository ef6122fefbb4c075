"""The one checker: does a timed schedule obey every rule of the problem?

It returns every violation as a line of text naming the device and op, so a user can
see all that is wrong at once. Rules (README, "Semantics"): every op present exactly
once on its stage's device, durations, one op at a time per device, dependencies with
transfer time across devices, and the memory limit.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from optimizer.errors import DeadlockError, ScheduleError
from optimizer.ops import KINDS, VOCAB_KINDS, Op, TimedOp, dependencies, op_device, op_duration, op_memory, transfer_delay
from optimizer.problem import Problem, Tables, require_problem, tolerant
from optimizer.schedule import Schedule

# Times and memory are floats in the user's units; sums of a few thousand of them carry
# rounding of about 1e-12 relative, which a relative slack of 1e-9 absorbs. For times that
# slack is capped at TIME_CAP_SHARE of the problem's shortest op: a timeline shifted far
# from zero (ops at 1e9 lasting 1) or ops of 1e-10 would otherwise hide an op squeezed to
# nothing or two ops overlapping; and it is never below FLOAT_ULPS units in the last place
# of the times compared (what a float there can tell apart). Memory keeps the slack every
# memory check and model of pipesched uses (`tolerant`): relative to the limit, so that a
# limit below 1 is not looser here than where orders are made.
_RELATIVE_TOLERANCE = 1e-9
TIME_CAP_SHARE = 1e-3
FLOAT_ULPS = 8


def _slack(*values: float, cap: float = math.inf) -> float:
    largest = max(abs(v) for v in values)
    return max(FLOAT_ULPS * math.ulp(largest), min(_RELATIVE_TOLERANCE * max(1.0, largest), cap))


def apart(first: float, second: float) -> tuple[str, str]:
    """Both numbers with the fewest significant digits (6 at least) that tell them apart:
    a violation by a hair reads `1.500001 < 1.5`, not `1.5 < 1.5`."""
    for digits in range(6, 18):
        shown = f"{first:.{digits}g}", f"{second:.{digits}g}"
        if shown[0] != shown[1]:
            break
    return shown


def _shortest_op(tables: Tables) -> float:
    """The shortest op's duration (inf where no op lasts)."""
    lasting = [
        *(f * min(tables.slice_cost) for f in tables.forward),
        *(b * min(tables.slice_cost) for b in tables.backward_input),
        *(w * min(tables.slice_share) for w in tables.backward_weight),
        *tables.backward,
    ]
    if tables.vocab_barriers:
        lasting += [tables.vocab_forward, tables.vocab_backward]
    return min((t for t in lasting if t > 0), default=math.inf)


def validate(problem: Problem, devices: Sequence[Sequence[TimedOp]]) -> list[str]:
    """Every rule the timed schedule breaks; an empty list means it is valid."""
    require_problem(problem)
    num_stages, num_slices = problem.num_stages, problem.num_slices
    tables = problem.tables()
    vocab = problem.vocab_rule()
    orders = [[op.op for op in ops] for ops in devices]
    violations = order_violations(problem, orders)
    if violations:
        return violations  # timing checks on a malformed schedule would only add noise
    ends = {key: op.end for ops, keys in zip(devices, orders) for op, key in zip(ops, keys)}

    cap = TIME_CAP_SHARE * _shortest_op(tables)
    for d, ops in enumerate(devices):
        usage, limit = 0.0, tables.limit[d]
        # One line per device for memory: the first op that overflows, the peak and how long it lasts.
        first_over: tuple[Op, float] | None = None
        peak, ops_over = 0.0, 0
        previous: TimedOp | None = None
        for op in ops:
            if not (math.isfinite(op.start) and math.isfinite(op.end)):
                # every comparison below is false for NaN: such an op would pass them all
                violations.append(f"time: {op.op} on device {d} runs from {op.start} to {op.end}; times must be finite numbers")
                previous = None
                continue
            expected = op_duration(tables, op.kind, op.stage, op.slice)
            if abs((op.end - op.start) - expected) > _slack(op.start, op.end, cap=cap):
                lasts, wanted = apart(op.end - op.start, expected)
                violations.append(f"duration: {op.op} on device {d} lasts {lasts}, expected {wanted}")
            if (
                previous is not None
                and op.start < previous.start - _slack(previous.start, cap=cap)
                and op.end <= previous.start + _slack(previous.start, cap=cap)
            ):
                # wholly before the op listed ahead of it (an op of no duration at the same
                # time is not): the list is out of order, no two ops overlap
                runs, ahead = apart(op.start, previous.start)
                violations.append(
                    f"order: {op.op} runs at {runs} on device {d}, before {previous.op} listed ahead of it (at {ahead}); "
                    "list each device's ops in the order they run"
                )
            elif previous is not None and op.start < previous.end - _slack(previous.end, cap=cap):
                starts, ends_at = apart(op.start, previous.end)
                violations.append(f"overlap: {op.op} starts at {starts} on device {d} before {previous.op} ends at {ends_at}")
            for key in dependencies(op, num_stages, num_slices, vocab):
                dep_op = _dependency_op(key, ends)
                ready = ends[dep_op] + transfer_delay(dep_op, d, tables.device, problem.comm_time, tables.barrier_time)
                if op.start < ready - _slack(ready, cap=cap):
                    starts, available = apart(op.start, ready)
                    violations.append(f"dependency: {op.op} starts at {starts}, before {dep_op} is available at {available}")
            usage += op_memory(tables, op.kind, op.stage, op.slice)
            if usage > tolerant(limit):
                first_over = first_over or (op.op, usage)
                peak, ops_over = max(peak, usage), ops_over + 1
            previous = op
        if first_over is not None:
            over_op, held = first_over
            holds, allowed = apart(held, limit)
            violations.append(
                f"memory: device {d} holds {holds} > limit {allowed} after {over_op} (peak {peak:g}; over the limit after {ops_over} op(s))"
            )
    return violations


def order_violations(problem: Problem, orders: Sequence[Sequence[Op]]) -> list[str]:
    """What makes per-device orders not an order of the problem's ops: a device count,
    kind, stage, microbatch or slice the problem does not have, an op on another device
    than its stage's, or an op missing or given twice (timing aside: these hold for an
    order before it is timed, so a missing op is named rather than found as a deadlock)."""
    p, num_stages, m, num_slices = problem.num_devices, problem.num_stages, problem.num_microbatches, problem.num_slices
    tables = problem.tables()
    vocab = problem.vocab_rule()
    violations: list[str] = []
    if len(orders) != p:
        return [f"devices: schedule has {len(orders)} devices, the problem {p}"]
    counts: Counter[Op] = Counter()
    for d, ops in enumerate(orders):
        for op in ops:
            if op.kind not in KINDS:
                violations.append(f"device {d}: unknown op kind {op.kind!r}")
                continue
            if op.kind in VOCAB_KINDS:
                if vocab is None:
                    violations.append(f"device {d}: {op} is a vocabulary pass, and the problem has no vocab_parallel")
                    continue
                if not (0 <= op.stage < p and 0 <= op.microbatch < m and op.slice == 0):
                    violations.append(f"device {d}: {op} is out of range ({p} shards, {m} microbatches)")
                    continue
            elif not (0 <= op.stage < num_stages and 0 <= op.microbatch < m and 0 <= op.slice < num_slices):
                sliced = f", {num_slices} slices" if num_slices > 1 or op.slice != 0 else ""
                violations.append(f"device {d}: {op} is out of range ({num_stages} stages, {m} microbatches{sliced})")
                continue
            home = op_device(tables.device, op)
            if home != d:
                violations.append(
                    f"placement: {op} runs on device {d}, its {'shard' if op.kind in VOCAB_KINDS else 'stage'} is on device {home}"
                )
            counts[op] += 1
    violations += _completeness(counts, num_stages, m, num_slices)
    if vocab is not None:
        violations += [
            f"missing: {Op(kind, d, mb)}" for kind in VOCAB_KINDS for d in range(p) for mb in range(m) if counts[Op(kind, d, mb)] == 0
        ]
    return violations


def _dependency_op(key: Op, ends: dict[Op, float]) -> Op:
    """The op a dependency key names: "B" is the split B when present, else the fused BW."""
    if key.kind != "B":
        return key
    split = Op("B", key.stage, key.microbatch, key.slice)
    return split if split in ends else Op("BW", key.stage, key.microbatch, key.slice)


def _completeness(counts: Counter[Op], num_stages: int, m: int, num_slices: int) -> list[str]:
    problems = []
    for op, count in counts.items():
        if count > 1:
            problems.append(f"duplicate: {op} appears {count} times")
    for stage in range(num_stages):
        for mb in range(m):
            for k in range(num_slices):
                if counts[Op("F", stage, mb, k)] == 0:
                    problems.append(f"missing: {Op('F', stage, mb, k)}")
                fused = counts[Op("BW", stage, mb, k)] > 0
                split = [counts[Op(kind, stage, mb, k)] > 0 for kind in ("B", "W")]
                if fused and any(split):
                    where = f"mb {mb}.{k}" if k > 0 else f"mb {mb}"
                    problems.append(f"mixed: stage {stage} {where} has both BW and split B/W")
                elif not fused and not all(split):
                    missing = "B" if not split[0] else "W"
                    problems.append(f"missing: {Op(missing, stage, mb, k)}")
    return problems


def checked_schedule(
    problem: Problem, orders: Sequence[Sequence[Op]], source: str, method: str, *, memory: bool = True, rules: bool = True
) -> Schedule:
    """Per-device orders timed on `problem` and checked against every rule (with `memory`,
    the memory limit too): ScheduleError naming `source` when they are not an order of
    the problem's ops or break a rule, DeadlockError naming it when they cannot finish.
    Without `rules` the timed schedule is not validated again: times as soon as possible
    keep every rule by construction, and only the memory limit is left to check."""
    from optimizer.simulate import simulate

    malformed = order_violations(problem, orders)
    if malformed:  # an op missing would otherwise show as a deadlock at its successor
        raise ScheduleError(source, malformed)
    try:
        schedule = simulate(problem, orders, method=method)
    except DeadlockError as error:
        raise DeadlockError(f"{source}: {error}", error.blocked) from None
    if not rules:
        return schedule
    checked = problem if memory else problem.model_copy(update={"memory_limit": None})
    violations = validate(checked, schedule.devices)
    if violations:
        raise ScheduleError(source, violations)
    return schedule

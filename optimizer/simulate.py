"""The one timing engine: per-device op orders in, ASAP start and end times out.

An op starts at the later of its device becoming free and its dependencies ending (plus
the transfer time for a dependency that ran on another device); the dependencies are
optimizer/ops.py's rule. Given fixed orders, these earliest times are optimal, so
solvers only need to decide orders. An order that can never finish is a deadlock,
reported with each stuck device's next op.

The pass is event driven: a device whose next op waits on a dependency parks on that
dependency and is woken when it ends, so every op is looked at a constant number of
times (about 25k ops for p=32, m=256 in well under a second).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from optimizer.errors import DeadlockError, InputError
from optimizer.ops import KINDS, VOCAB_KINDS, Op, TimedOp, completion_key, dependencies, new_tuple, op_device, op_duration
from optimizer.problem import Problem, require_problem
from optimizer.schedule import Schedule


def _check_placement(problem: Problem, orders: Sequence[Sequence[Op]]) -> None:
    require_problem(problem)
    if len(orders) != problem.num_devices:
        raise InputError(f"order has {len(orders)} devices, the problem {problem.num_devices}")
    device_of = [stage.device for stage in problem.stages]
    for d, ops in enumerate(orders):
        for op in ops:
            if op.kind in VOCAB_KINDS:
                if problem.vocab_parallel is None:
                    raise InputError(f"device {d}: {op} is a vocabulary pass, and the problem has no vocab_parallel")
                if op.stage != d or op.microbatch not in range(problem.num_microbatches) or op.slice != 0:
                    raise InputError(f"device {d}: {op} is not a vocabulary pass of this device")
                continue
            if not 0 <= op.stage < problem.num_stages:
                raise InputError(f"device {d}: {op} names a stage out of range")
            if not 0 <= op.microbatch < problem.num_microbatches:
                raise InputError(f"device {d}: {op} names a microbatch out of range")
            if not 0 <= op.slice < problem.num_slices:
                raise InputError(f"device {d}: {op} names a slice out of range")
            if device_of[op.stage] != d:
                raise InputError(f"device {d}: {op} belongs on device {op_device(device_of, op)}")


def simulate_times(
    problem: Problem,
    orders: Sequence[Sequence[Op]],
    run_order: list[tuple[int, int]] | None = None,
    factors: Mapping[Op, float] | None = None,
) -> list[list[TimedOp]]:
    """ASAP times for per-device orders; raises DeadlockError when the orders cannot finish.

    `run_order`, when given, receives each op's position (device, index) as it is timed:
    a topological order of the ops (each after its dependencies and the op before it on
    its device), whatever their durations. `factors`, when given, multiplies each op's
    duration (every op of the orders must have one; optimizer.jitter)."""
    _check_placement(problem, orders)
    tables = problem.tables()
    num_stages, num_slices, comm = problem.num_stages, problem.num_slices, problem.comm_time
    device_of = tables.device
    vocab, barrier = tables.vocab_rule(), tables.barrier_time
    # Durations by kind, stage (a vocabulary pass: shard) and slice, looked up rather than
    # computed per op (hot loop).
    rows = {kind: problem.num_devices if kind in VOCAB_KINDS else num_stages for kind in KINDS}
    duration: dict[str, list[list[float]]] = {
        kind: [[op_duration(tables, kind, stage, k) for k in range(num_slices)] for stage in range(rows[kind])] for kind in KINDS
    }
    ended: dict[Op, float] = {}
    waiting: dict[Op, list[int]] = defaultdict(list)
    head = [0] * len(orders)
    free_at = [0.0] * len(orders)
    timed: list[list[TimedOp]] = [[] for _ in orders]
    runnable = list(range(len(orders)))
    # A device waiting at its next op keeps that op's dependencies, how many of them have
    # ended and the latest time they allow, and goes on from there when woken: a
    # vocabulary pass waits for every device's pass, and checking them all again at each
    # wake-up made simulation quadratic in the devices (10.9 s at p = 256, m = 16).
    pending: list[tuple[tuple[Op, ...], int, float] | None] = [None] * len(orders)

    while runnable:
        d = runnable.pop()
        ops = orders[d]
        n = len(ops)
        while head[d] < n:
            op = ops[head[d]]
            resumed = pending[d]
            if resumed is None:
                deps, checked, start = dependencies(op, num_stages, num_slices, vocab), 0, free_at[d]
            else:
                deps, checked, start = resumed
            for key in deps[checked:]:
                dep_end = ended.get(key)
                if dep_end is None:
                    waiting[key].append(d)
                    pending[d] = (deps, checked, start)
                    break
                if vocab is not None and key[0] in VOCAB_KINDS:
                    dep_end += barrier  # a collective, even from this device
                elif device_of[key[1]] != d:
                    dep_end += comm
                if dep_end > start:
                    start = dep_end
                checked += 1
            else:  # every dependency has ended: run the op
                pending[d] = None
                kind, stage, microbatch, k = op.kind, op.stage, op.microbatch, op.slice
                end = start + (duration[kind][stage][k] if factors is None else duration[kind][stage][k] * factors[op])
                timed[d].append(new_tuple(TimedOp, (kind, stage, microbatch, start, end, k)))
                free_at[d] = end
                if run_order is not None:
                    run_order.append((d, head[d]))
                head[d] += 1
                done = completion_key(op)
                if done is not None:
                    ended[done] = end
                    runnable.extend(waiting.pop(done, ()))
                continue
            break

    stuck = {d: str(orders[d][head[d]]) for d in range(len(orders)) if head[d] < len(orders[d])}
    if stuck:
        listing = ", ".join(f"device {d} waits at {op}" for d, op in stuck.items())
        raise DeadlockError(f"deadlock: {listing}", stuck)
    return timed


def simulate(problem: Problem, orders: Sequence[Sequence[Op]], method: str = "custom") -> Schedule:
    """Time an order with the ASAP rule and wrap it, with its metrics, as a Schedule."""
    return Schedule(problem, method, simulate_times(problem, orders))

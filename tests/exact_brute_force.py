"""Brute force for tiny problems: every per-device order, each timed by the simulator.

For a fixed order the simulator's ASAP times minimize the makespan, and
optimizer.exact.spantiming's times the longest device span (checked against a linear
program in tests/test_span_objective.py), so the best over all orders is the optimum.

Every op of every (stage, microbatch, slice) is enumerated, with no symmetry breaking,
and every vocabulary pass (shard, microbatch) where the problem has them.
Backwards are split (B then W), and where the fused backward is shorter than B + W both
choices are enumerated (F, B, W or F, BW), since either can win there; elsewhere a fused
BW is never better (see optimizer.exact.canonical), so nothing is lost. Orders that must
deadlock (an op before one of its own ancestors on the same device) and orders over a
device's memory limit are never generated.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from optimizer.errors import DeadlockError
from optimizer.exact.spantiming import span_times
from optimizer.ops import Kind, Op, completion_key, dependencies, fusing_can_win, op_memory
from optimizer.problem import Problem
from optimizer.schedule import longest_span
from optimizer.simulate import simulate_times


def _ancestors(problem: Problem) -> dict[Op, set[Op]]:
    """Completion keys every op transitively waits for (the same whether backwards are fused or split)."""
    S, K, vocab = problem.num_stages, problem.num_slices, problem.vocab_rule()
    found: dict[Op, set[Op]] = {}

    def of(op: Op) -> set[Op]:
        if op not in found:
            result: set[Op] = set()
            for dep in dependencies(op, S, K, vocab):
                result |= {dep} | of(dep)
            found[op] = result
        return found[op]

    for s in range(S):
        for i in range(problem.num_microbatches):
            for k in range(K):
                for kind in (Kind.F, Kind.B, Kind.W):
                    of(Op(kind, s, i, k))
    for op in _vocab_ops(problem):
        of(op)
    return found


def _vocab_ops(problem: Problem, device: int | None = None) -> list[Op]:
    if problem.vocab_parallel is None:
        return []
    shards = range(problem.num_devices) if device is None else (device,)
    return [Op(kind, d, i) for d in shards for i in range(problem.num_microbatches) for kind in (Kind.S, Kind.T)]


def _alternatives(problem: Problem, device: int) -> list[list[list[Op]]]:
    """Per (stage, microbatch, slice) of the device: its op lists (split, and fused where that can win)."""
    tables = problem.tables()
    result = []
    for s in problem.stages_on(device):
        for i in range(problem.num_microbatches):
            for k in range(problem.num_slices):
                split = [Op(Kind.F, s, i, k), Op(Kind.B, s, i, k), Op(Kind.W, s, i, k)]
                fused = [Op(Kind.F, s, i, k), Op(Kind.BW, s, i, k)]
                result.append([split, fused] if fusing_can_win(tables, s, k) else [split])
    return result + [[[op]] for op in _vocab_ops(problem, device)]


def _extensions(ops: list[Op], must_follow: dict[Op, set[Op]], problem: Problem, device: int) -> Iterator[list[Op]]:
    """Every order of `ops` keeping each op after its ancestors on the device, within the memory limit."""
    tables = problem.tables()
    limit = tables.limit[device] * (1 + 1e-9)
    placed: list[Op] = []
    done: set[Op] = set()

    def walk(usage: float) -> Iterator[list[Op]]:
        if len(placed) == len(ops):
            yield list(placed)
            return
        for op in ops:
            if op in done or not must_follow[op] <= done:
                continue
            after = usage + op_memory(tables, op.kind, op.stage, op.slice)
            if after > limit:
                continue
            placed.append(op)
            done.add(op)
            yield from walk(after)
            placed.pop()
            done.discard(op)

    yield from walk(0.0)


def device_orders(problem: Problem, device: int) -> list[list[Op]]:
    """Every order of one device's ops (each backward split or, where that can win, fused) within its memory limit."""
    ancestors = _ancestors(problem)
    orders: list[list[Op]] = []
    for choice in itertools.product(*_alternatives(problem, device)):
        ops = [op for alternative in choice for op in alternative]
        # The device's own ops an op waits for, directly or through other devices.
        keyed = {completion_key(op): op for op in ops if completion_key(op) is not None}
        must_follow = {}
        for op in ops:
            waits = ancestors[op._replace(kind=Kind.B) if op.kind == Kind.BW else op]
            must_follow[op] = {keyed[key] for key in waits if key in keyed}
        orders.extend(_extensions(ops, must_follow, problem, device))
    return orders


# Optima found so far, by problem (JSON): tests ask for the span and the makespan of the
# same problem in turn, and the span's enumeration finds both.
_FOUND: dict[str, dict[str, float]] = {}


def brute_force_optimum(problem: Problem, objective: str = "makespan") -> float:
    """The least makespan (or longest device span) over every valid order (math.inf when none fits)."""
    found = _FOUND.setdefault(problem.model_dump_json(), {})
    if objective not in found:
        found.update(_optima(problem, with_span=objective == "span"))
    return found[objective]


def _optima(problem: Problem, with_span: bool) -> dict[str, float]:
    """The least makespan, and with `with_span` the least longest span, in one enumeration."""
    per_device = [device_orders(problem, d) for d in range(problem.num_devices)]
    best = {"makespan": math.inf} | ({"span": math.inf} if with_span else {})
    waiting = op_waits(problem, per_device)
    for orders in itertools.product(*per_device):
        if deadlocks(orders, waiting):
            continue
        try:
            asap = simulate_times(problem, orders)
        except DeadlockError:
            continue
        every = [op for ops in asap for op in ops]
        best["makespan"] = min(best["makespan"], max(op.end for op in every) - min(op.start for op in every))
        if with_span:
            best["span"] = min(best["span"], longest_span(span_times(problem, orders)))
    return best


def op_waits(problem: Problem, per_device: list[list[list[Op]]]) -> dict[Op, tuple[frozenset[Op], Op | None]]:
    """Per op of any enumerated order: the completion keys it waits for, and its own."""
    vocab = problem.vocab_rule()
    ops = {op for orders in per_device for order in orders for op in order}
    return {op: (frozenset(dependencies(op, problem.num_stages, problem.num_slices, vocab)), completion_key(op)) for op in ops}


def deadlocks(orders: tuple[list[Op], ...] | list[list[Op]], waits: dict[Op, tuple[frozenset[Op], Op | None]]) -> bool:
    """Whether the orders cannot all finish: each device runs its next op once every key
    it waits for has ended, as the simulator does, without the times (about a tenth of a
    simulation: more than half of the combined orders of a small problem deadlock)."""
    ended: set[Op | None] = set()
    heads = [0] * len(orders)
    moved = True
    while moved:
        moved = False
        for d, order in enumerate(orders):
            head = heads[d]
            while head < len(order) and waits[order[head]][0] <= ended:
                ended.add(waits[order[head]][1])
                head += 1
            if head != heads[d]:
                heads[d], moved = head, True
    return any(head < len(order) for head, order in zip(heads, orders))


def count_orders(problem: Problem) -> int:
    return math.prod(len(device_orders(problem, d)) for d in range(problem.num_devices))

"""Brute force for tiny problems: every per-device order, each timed by the simulator.

For a fixed order the simulator's ASAP times minimize the makespan, and
optimizer.exact.spantiming's times the longest device span (checked against a linear
program in tests/test_span_objective.py), so the best over all orders is the optimum. Backwards are split (B then W); a fused BW is never better (see
optimizer.exact.canonical), so nothing is lost.
"""

from __future__ import annotations

import itertools
import math

from optimizer.errors import DeadlockError
from optimizer.exact.incumbents import objective_value
from optimizer.exact.spantiming import timed_for
from optimizer.ops import Op
from optimizer.problem import Problem
from optimizer.schedule import peak_memory


def _interleavings(chains: list[list[Op]]):
    """Every merge of the chains that keeps each chain's order."""
    if all(not c for c in chains):
        yield []
        return
    for k, chain in enumerate(chains):
        if chain:
            rest = chains[:k] + [chain[1:]] + chains[k + 1 :]
            for tail in _interleavings(rest):
                yield [chain[0]] + tail


def device_orders(problem: Problem, device: int) -> list[list[Op]]:
    """Orders of one device's ops that fit its memory limit (F before B before W per microbatch and stage)."""
    tables = problem.tables()
    chains = [[Op("F", s, i), Op("B", s, i), Op("W", s, i)] for s in problem.stages_on(device) for i in range(problem.num_microbatches)]
    limit = tables.limit[device]
    return [o for o in _interleavings(chains) if peak_memory(tables, o) <= limit * (1 + 1e-9)]


def brute_force_optimum(problem: Problem, objective: str = "makespan") -> float:
    """The least makespan (or longest device span) over every valid order (math.inf when none fits)."""
    per_device = [device_orders(problem, d) for d in range(problem.num_devices)]
    best = math.inf
    for orders in itertools.product(*per_device):
        try:
            best = min(best, objective_value(timed_for(problem, list(orders), objective), objective))
        except DeadlockError:
            continue
    return best


def count_orders(problem: Problem) -> int:
    return math.prod(len(device_orders(problem, d)) for d in range(problem.num_devices))

"""A stronger lower bound: one device scheduled exactly, the rest of the pipeline relaxed.

Keep one device's ops, its no-overlap and its memory reservoir exactly; replace every
other device by pure delays: an op may start no earlier than its head, must be followed
by its tail, and between two ops of this device on the same microbatch's chain lies at
least the chain's work on other devices and the transfers (a minimum time lag). Any
schedule of the whole problem gives a schedule of this relaxation that is no longer, so
CP-SAT's proven bound on it is a bound on the makespan. Under a tight memory limit this
is where the real difficulty sits (device 0 must hold forwards for a whole round trip),
and the relaxation is small enough (one device's ops) to close quickly.
"""

from __future__ import annotations

from typing import Sequence

from optimizer.exact import bounds
from optimizer.exact.cpsat import solve_cpsat_subproblem
from optimizer.exact.subproblem import SubProblem
from optimizer.exact.timescale import IntegerTables, tick_problem
from optimizer.problem import Problem
from optimizer.schedule import Op, TimedOp


def _chain(num_stages: int) -> list[tuple[str, int]]:
    """One microbatch's dependency chain: forwards up the model, backwards down it."""
    return [("F", s) for s in range(num_stages)] + [("B", s) for s in reversed(range(num_stages))]


def device_subproblem(
    problem: Problem,
    tables: IntegerTables,
    device: int,
    hint: Sequence[Sequence[TimedOp]] | None = None,
) -> SubProblem:
    """The one-device relaxation of `device`, in ticks (see the module doc)."""
    ticks = tick_problem(problem, tables)
    head = bounds.heads(ticks, memory_aware=True)
    tail = bounds.tails(ticks)
    S, m = problem.num_stages, problem.num_microbatches
    dev = tables.device
    chain = _chain(S)
    ops: list[Op] = [Op(kind, s, i) for s in problem.stages_on(device) for i in range(m) for kind in ("F", "B", "W")]
    index = {op: j for j, op in enumerate(ops)}

    precedences: list[tuple[int, int, int]] = []
    # Lags between consecutive appearances of this device on the chain (same for every
    # microbatch): the work and transfers in between.
    appearances = [k for k, (_, s) in enumerate(chain) if dev[s] == device]
    lags = []
    for a, b in zip(appearances, appearances[1:]):
        lag = 0
        for k in range(a + 1, b + 1):
            kind, s = chain[k]
            _, prev = chain[k - 1]
            if dev[prev] != dev[s]:
                lag += tables.comm
            if k < b:
                lag += tables.duration[kind][s]
        lags.append((chain[a], chain[b], lag))
    for i in range(m):
        for (ka, sa), (kb, sb), lag in lags:
            precedences.append((index[Op(ka, sa, i)], index[Op(kb, sb, i)], lag))
        for s in problem.stages_on(device):
            precedences.append((index[Op("B", s, i)], index[Op("W", s, i)], 0))
    in_order = [
        (index[Op(kind, s, i)], index[Op(kind, s, i + 1)])
        for s in problem.stages_on(device)
        for kind in ("F", "B", "W")
        for i in range(m - 1)
    ]
    starts = None
    if hint is not None:
        by_op = {t.op: round(t.start) for t in hint[device]}
        if all(op in by_op for op in ops):
            starts = [by_op[op] for op in ops]
    return SubProblem(
        num_devices=problem.num_devices,
        ops=ops,
        device=[device] * len(ops),
        duration=[tables.duration[op.kind][op.stage] for op in ops],
        delta=[tables.memory[op.kind][op.stage] for op in ops],
        release=[round(head[op.kind][op.stage][op.microbatch]) for op in ops],
        tail=[round(tail[op.kind][op.stage][op.microbatch]) for op in ops],
        precedences=precedences,
        in_order=in_order,
        initial_memory=[0] * problem.num_devices,
        limit=list(tables.limit),
        hint=starts,
        index=index,
    )


def device_relaxation_bound(
    problem: Problem,
    tables: IntegerTables,
    device: int,
    *,
    time_limit: float,
    hint: Sequence[Sequence[TimedOp]] | None = None,
    seed: int = 0,
    threads: int = 2,
) -> tuple[float, bool]:
    """(bound in the user's time units, whether the relaxation was solved to optimality)."""
    sub = device_subproblem(problem, tables, device, hint)
    result = solve_cpsat_subproblem(sub, time_limit=time_limit, seed=seed, threads=threads)
    if result.interrupted:
        raise KeyboardInterrupt
    return result.bound / tables.time_scale, result.status == "optimal"

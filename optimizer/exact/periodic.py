"""A periodic steady state, solved once and unrolled: structure for large microbatch counts.

In a 1-periodic schedule every microbatch runs the same pattern shifted by a period T:
op j of microbatch i starts at offset_j + i*T. More generally k copies of the pattern
share a cycle of kT, microbatch i running copy i mod k (`copies`): a larger family, which
can reach rates no 1-periodic pattern does under a memory limit (two microbatches
alternating, one ahead in its round trip). The model has one op per (stage, kind, copy)
only, so it stays small at any p and m:

* dependencies between offsets, with transfer time across devices;
* one op at a time per device *modulo T* (each op as an interval at its phase and a
  copy one period later, all without overlap);
* memory through lifespans (see below).

For a given T it minimizes the latency of one microbatch (its last end) plus the
memory-time its activations are held, so the unrolled makespan is about
(m-1)*T + latency. Unrolling is always a valid order (the simulator then pulls every op
as early as the order allows). Periods from the busiest device's work upward are
tried; an unrolled pattern is kept only when it fits the memory limit (checked exactly
on the order), so tighter limits end up at longer periods. Modelling the steady-state
usage exactly (floor((t-e)/T) - floor((t-f)/T) microbatches hold a piece allocated at e
and freed at f) is possible, but in trials it stopped CP-SAT from finding any pattern
at p = 16 within seconds, so it is left out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ortools.sat.python import cp_model

from optimizer.exact.cpsat import run_cpsat
from optimizer.exact.timescale import IntegerTables, integer_tables
from optimizer.ops import SPLIT_KINDS, Op, dependency_depths
from optimizer.problem import Problem, tolerant

# Periods tried, as multiples of the busiest device's work per microbatch.
PERIOD_STEPS = (1.0, 1.02, 1.05, 1.1, 1.15, 1.2, 1.3, 1.45, 1.6, 1.8, 2.0, 2.5, 3.0)


def applicable(problem: Problem) -> bool:
    """Memory must be allocated by forwards and freed by B and W (the usual case)."""
    t = problem.tables()
    return all(v <= 0 for v in t.mem_backward_input + t.mem_backward_weight)


Key = tuple[str, int, int]  # (kind, stage, copy): copy r of the pattern runs microbatches r, r + k, r + 2k, ...


def _period_model(
    problem: Problem, tables: IntegerTables, period: int, *, exact_memory: bool, copies: int = 1
) -> tuple[cp_model.CpModel, dict[Key, cp_model.IntVar], dict[Key, cp_model.IntVar], dict[Key, cp_model.IntVar]]:
    """The model for one cycle of `period` ticks holding `copies` microbatches: (model,
    offset, phase, lap) of each (kind, stage, copy).

    Objective: the latency plus the memory-time held (lifespans); with `exact_memory`
    the latency alone, and the steady state's memory as constraints (see `period_status`).
    """
    # --- data -------------------------------------------------------------------------
    S = problem.num_stages
    dev = tables.device
    dur = tables.duration
    comm = [tables.comm if s + 1 < S and dev[s] != dev[s + 1] else 0 for s in range(S)]
    latency_cap = 4 * (sum(dur[k][s] for k in SPLIT_KINDS for s in range(S)) + 2 * S * tables.comm) + 2 * period
    wraps = latency_cap // period + 2

    # --- variables --------------------------------------------------------------------
    model = cp_model.CpModel()
    offset, phase, lap, intervals = {}, {}, {}, {}
    for s in range(S):
        for kind in SPLIT_KINDS:
            for r in range(copies):
                key = (kind, s, r)
                name = f"{kind}_{s}_{r}"
                offset[key] = model.new_int_var(0, latency_cap, f"offset_{name}")
                phase[key] = model.new_int_var(0, period - 1, f"phase_{name}")
                lap[key] = model.new_int_var(0, wraps, f"lap_{name}")
                model.add(offset[key] == lap[key] * period + phase[key])
                intervals[key] = [
                    model.new_fixed_size_interval_var(phase[key], dur[kind][s], f"slot_{name}"),
                    model.new_fixed_size_interval_var(phase[key] + period, dur[kind][s], f"next_slot_{name}"),
                ]
    latency = model.new_int_var(0, latency_cap + max(dur["W"]), "latency")
    lifespans = []  # memory * time each activation piece is held

    # --- constraints ------------------------------------------------------------------
    model.add(offset[("F", 0, 0)] == 0)
    # Microbatches enter in order (they are alike, so any schedule can be relabelled so):
    # copy r's first forward after copy r - 1's, the last copy's before the next cycle's first.
    for r in range(1, copies):
        model.add(offset[("F", 0, r)] >= offset[("F", 0, r - 1)] + dur["F"][0])
    model.add(offset[("F", 0, copies - 1)] + dur["F"][0] <= period)
    for r in range(copies):
        for s in range(S):
            if s > 0:
                model.add(offset[("F", s, r)] >= offset[("F", s - 1, r)] + dur["F"][s - 1] + comm[s - 1])
            if s == S - 1:
                model.add(offset[("B", s, r)] >= offset[("F", s, r)] + dur["F"][s])
            else:
                model.add(offset[("B", s, r)] >= offset[("B", s + 1, r)] + dur["B"][s + 1] + comm[s])
            model.add(offset[("W", s, r)] >= offset[("B", s, r)] + dur["B"][s])
            for kind in SPLIT_KINDS:
                model.add(latency >= offset[(kind, s, r)] + dur[kind][s])
    for d in range(problem.num_devices):
        stages = [s for s in range(S) if dev[s] == d]
        model.add_no_overlap([iv for s in stages for kind in SPLIT_KINDS for r in range(copies) for iv in intervals[(kind, s, r)]])
        if exact_memory:
            real_limit = problem.tables().limit[d]
            if not math.isinf(real_limit):
                # Frees are rounded towards zero in the tables; the limit is rounded up here,
                # so the model only relaxes the real one and its "no pattern" is a proof.
                limit = math.ceil(tolerant(real_limit) * tables.memory_scale - 1e-9)
                _steady_state_memory(model, tables, stages, copies, phase, lap, limit)
            continue
        # Memory through the lifespans: by Little's law their sum over the cycle is the
        # device's average usage. The caller keeps a pattern only when its unrolled order
        # fits the limit, trying longer periods.
        for s in stages:
            for kind in ("B", "W"):
                amount = -tables.memory[kind][s]
                if amount > 0:
                    for r in range(copies):
                        lifespans.append(amount * (offset[(kind, s, r)] + dur[kind][s] - offset[("F", s, r)]))

    # --- objective --------------------------------------------------------------------
    model.minimize(latency + sum(lifespans))
    return model, offset, phase, lap


def _steady_state_memory(model: cp_model.CpModel, tables: IntegerTables, stages: list[int], copies: int, phase, lap, limit: int) -> None:
    """The device's usage in the steady state, exactly, at most its limit.

    A piece allocated by F(s) of a copy at offset e and freed at offset f (by that copy's B
    or W) is held, at a time of phase x in the cycle, by lap(f) - lap(e) + [phase(e) <= x]
    - [phase(f) <= x] microbatches of the copy. Usage peaks as a forward starts, so the
    sum over the device's pieces at each forward's phase must stay within `limit` (ticks
    of memory); one order literal per pair of the device's ops (their phases differ: one
    op at a time) says which comes first.
    """
    keys = [(kind, s, r) for s in stages for kind in SPLIT_KINDS for r in range(copies)]
    first: dict[tuple[Key, Key], cp_model.LinearExprT] = {}
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            before = model.new_bool_var(f"{a[0]}{a[1]}_{a[2]}_before_{b[0]}{b[1]}_{b[2]}")
            model.add(phase[a] < phase[b]).only_enforce_if(before)
            model.add(phase[a] > phase[b]).only_enforce_if(~before)
            first[(a, b)], first[(b, a)] = before, 1 - before
    for at in [key for key in keys if key[0] == "F"]:
        held = []
        for s in stages:
            for r in range(copies):
                allocated = ("F", s, r)
                for kind in ("B", "W"):
                    size = -tables.memory[kind][s]
                    if size <= 0:
                        continue
                    freed = (kind, s, r)
                    started = 1 if allocated == at else first[(allocated, at)]
                    held.append(size * (lap[freed] - lap[allocated] + started - first[(freed, at)]))
        model.add(sum(held) <= limit)


def solve_period(
    problem: Problem,
    tables: IntegerTables,
    period: int,
    *,
    time_limit: float,
    seed: int = 0,
    threads: int = 2,
    copies: int = 1,
) -> dict[Key, int] | None:
    """Offsets (ticks) of each (kind, stage, copy) in a cycle of `period` ticks holding
    `copies` microbatches, or None if no pattern fits."""
    model, offset, _, _ = _period_model(problem, tables, period, exact_memory=False, copies=copies)
    solver, status = run_cpsat(model, time_limit=time_limit, seed=seed, threads=threads)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return {key: solver.value(var) for key, var in offset.items()}


def period_status(
    problem: Problem,
    tables: IntegerTables,
    period: int,
    *,
    time_limit: float,
    seed: int = 0,
    threads: int = 2,
    copies: int = 1,
    hint: dict[Key, int] | None = None,
) -> tuple[str, dict[Key, int] | None]:
    """Whether a pattern of `copies` microbatches per cycle of `period` ticks (a
    `copies`-periodic schedule) fits the memory limit in its steady state: ("pattern",
    offsets of the least latency found), ("none", None) when CP-SAT proves that none
    does, or ("unknown", None) when the time runs out first.

    Only patterns whose microbatch latency stays within the model's cap (four times a
    microbatch's work and transfers) are searched; a longer latency only holds memory
    longer. Memory uses the problem's integer sizes (optimizer.exact.timescale) and the limit
    rounded up: exact on decimal inputs, otherwise each free rounded towards zero, so "none"
    is always a proof and a pattern must still be checked on its unrolled order.

    `hint` (an offset for every (kind, stage, copy) of this cycle, e.g. from
    `repeated_pattern`) guides the search; without one the memory-free pattern of least latency and
    memory-time does (CP-SAT then finds patterns or proofs in seconds where it found
    neither in minutes without). A hint never changes what is proven, only how soon.
    """
    if not tables.memory_is_exact:
        # The steady state counts what a device holds by the sizes of the pieces B and W
        # free, so it relaxes only where those round towards zero: the conservative tables
        # (the tables that relax a simulation round frees away from zero, which made "none"
        # false on a device whose pattern fits exactly).
        tables = integer_tables(problem)
    if hint is None:
        hint = solve_period(problem, tables, period, time_limit=min(3.0, time_limit / 4), seed=seed, threads=threads, copies=copies)
    model, offset, phase, lap = _period_model(problem, tables, period, exact_memory=True, copies=copies)
    if hint is not None:
        for key, value in hint.items():
            model.add_hint(offset[key], value)
            model.add_hint(phase[key], value % period)
            model.add_hint(lap[key], value // period)
    solver, status = run_cpsat(model, time_limit=time_limit, seed=seed, threads=threads)
    if status == cp_model.INFEASIBLE:
        return "none", None
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return "unknown", None
    return "pattern", {key: solver.value(var) for key, var in offset.items()}


def repeated_pattern(offsets: dict[Key, int], period: int, cycle: int, copies: int) -> dict[Key, int]:
    """A 1-periodic pattern (`offsets` at `period` ticks) scaled to a per-microbatch period
    of cycle/copies and repeated for `copies` microbatches per `cycle`, copy r shifted by r
    of those periods: a starting point for `period_status` with several copies, where the
    memory-free hint overflows and an exact 1-periodic pattern at a longer period is
    often nearly right (at p = 16 it turned minutes without an answer into proofs in
    20-30 s)."""
    if any(r != 0 for _, _, r in offsets):
        raise ValueError("repeated_pattern takes a 1-periodic pattern (copy 0 only)")
    scale = cycle / (copies * period)
    return {(kind, s, r): round(o * scale + r * cycle / copies) for (kind, s, _), o in offsets.items() for r in range(copies)}


def unroll(problem: Problem, offsets: dict[Key, int], period: int) -> list[list[Op]]:
    """Per-device orders of the pattern repeated for every microbatch: copy r of a cycle
    runs microbatches r, r + k, r + 2k, ... (k copies), one cycle of `period` apart."""
    timed: list[list[tuple[int, int, Op]]] = [[] for _ in range(problem.num_devices)]
    device = problem.tables().device
    depth = dependency_depths(problem.num_stages)  # ties: an op of no ticks before its successor
    copies = 1 + max(r for _, _, r in offsets)
    for (kind, s, r), o in offsets.items():
        for i in range(r, problem.num_microbatches, copies):
            op = Op(kind, s, i)
            timed[device[s]].append((o + (i // copies) * period, depth(op), op))
    return [[op for *_, op in sorted(ops)] for ops in timed]


def periodic_orders(
    problem: Problem,
    tables: IntegerTables,
    *,
    deadline: float,
    seed: int = 0,
    threads: int = 2,
    per_period: float = 2.0,
    fits: Callable[[list[list[Op]]], bool] = lambda orders: True,
) -> list[tuple[str, list[list[Op]]]]:
    """Unrolled patterns (name, orders), shortest period first, up to the first that `fits`."""
    if not applicable(problem):
        return []
    dev = tables.device
    work = [0] * problem.num_devices
    for s in range(problem.num_stages):
        work[dev[s]] += sum(tables.duration[k][s] for k in SPLIT_KINDS)
    busiest = max(work)
    found = []
    tried = set()
    for step in PERIOD_STEPS:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        period = math.ceil(busiest * step)
        if period in tried:
            continue
        tried.add(period)
        offsets = solve_period(problem, tables, period, time_limit=min(left, per_period), seed=seed, threads=threads)
        if offsets is not None:
            orders = unroll(problem, offsets, period)
            found.append((f"periodic(T={period / tables.time_scale:.4g})", orders))
            if fits(orders):
                break
    return found

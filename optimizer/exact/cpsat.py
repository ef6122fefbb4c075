"""CP-SAT model of a (sub)problem: an interval per op, no-overlap per device, memory reservoirs.

Laid out like OR-Tools' job-shop sample: data, variables, constraints, objective,
solve, read the solution. The model decides start times in integer ticks
(optimizer.exact.timescale); callers keep only the resulting per-device orders and
re-simulate them in the user's units.

Determinism: with a fixed seed and a fixed number of workers, a run that ends by
optimality or by `deterministic_limit` repeats exactly. A run cut by the wall-clock
limit (or with several workers racing) may stop at a different incumbent. Whether the
memory constraints are expanded depends on the time limit given (`expansion_fits`), which
inside `solve` is the time left when the model starts: near the estimate's line two runs
may solve differently expanded models.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from optimizer.exact.subproblem import SubProblem
from optimizer.ops import ALLOCATE_AT_START, Op

# CP-SAT's expansion of a memory reservoir costs about this long per squared event count
# (3e-6 measured from 20k to 1.2 million on one loaded core; margin for a slower machine),
# and may take this share of a solve's time limit (expansion_fits).
RESERVOIR_SECONDS_PER_PAIR = 4e-6
RESERVOIR_SHARE = 0.5


@dataclass
class CpsatResult:
    status: str  # "optimal", "feasible", "infeasible", "unknown"
    starts: list[int] | None
    objective: int | None  # makespan (or span) in ticks of the returned solution
    bound: int  # proven lower bound on the objective, in ticks
    interrupted: bool = False
    seconds: float = 0.0
    fused: list[bool] | None = None  # per pair of sub.fusable, with the starts

    def orders(self, sub: SubProblem) -> list[list[Op]]:
        """The solution's per-device orders (fused pairs as BW ops)."""
        assert self.starts is not None, "orders of a solution"
        return sub.orders_from_starts(self.starts, self.fused)


class _Reporter(cp_model.CpSolverSolutionCallback):
    """Forwards each improving solution (objective, bound) to the caller."""

    def __init__(self, makespan: cp_model.IntVar, on_solution: Callable[[int, int], None] | None):
        super().__init__()
        self._makespan = makespan
        self._on_solution = on_solution

    def on_solution_callback(self) -> None:
        if self._on_solution is not None:
            self._on_solution(self.value(self._makespan), int(self.best_objective_bound))


def solve_cpsat_subproblem(
    sub: SubProblem,
    *,
    time_limit: float,
    seed: int = 0,
    threads: int = 2,
    objective: str = "makespan",
    compact: bool = False,
    deterministic_limit: float | None = None,
    on_solution: Callable[[int, int], None] | None = None,
) -> CpsatResult:
    """Minimize the makespan (or longest device span) of `sub`.

    compact: add, with a small weight, the sum of end times, so that among equally long
    schedules the one that finishes its ops earliest wins; neighbourhood search uses it
    to keep making progress when the makespan is set by ops outside the window. The
    reported bound is then on the weighted objective and is not used as a makespan bound.
    """
    # --- data -------------------------------------------------------------------------
    n = len(sub.ops)
    horizon = sub.horizon(objective)  # valid for the objective: see SubProblem.horizon
    devices = range(sub.num_devices)

    # --- variables --------------------------------------------------------------------
    model = cp_model.CpModel()
    fused_of = {}  # op -> its pair's fused literal (B and W of a fusable pair)
    fused = []
    for f, (b, w, _) in enumerate(sub.fusable):
        op = sub.ops[b]
        literal = model.new_bool_var(f"fused_{op.kind}_{op.stage}_{op.microbatch}_{f}")
        fused.append(literal)
        fused_of[b] = fused_of[w] = (f, literal)
    least = sub.least_durations()  # fused or split
    start, end, interval = [], [], []
    for j, op in enumerate(sub.ops):
        name = f"{op.kind}_{op.stage}_{op.microbatch}_{j}"
        latest = max(sub.release[j], horizon - least[j] - sub.tail[j])
        s = model.new_int_var(sub.release[j], latest, f"start_{name}")
        start.append(s)
        if j not in fused_of:
            e = model.new_int_var(sub.release[j] + sub.duration[j], latest + sub.duration[j], f"end_{name}")
            interval.append(model.new_interval_var(s, sub.duration[j], e, f"interval_{name}"))
        else:
            f, literal = fused_of[j]
            b, w, bw = sub.fusable[f]
            e = model.new_int_var(sub.release[j], max(sub.release[j], horizon - sub.tail[j]), f"end_{name}")
            if j == b:  # B: its own duration, or the fused one
                size = model.new_int_var(min(bw, sub.duration[j]), max(bw, sub.duration[j]), f"size_{name}")
                model.add(size == sub.duration[j] + (bw - sub.duration[j]) * literal)
                interval.append(model.new_interval_var(s, size, e, f"interval_{name}"))
            else:  # W: on the device only when split; when fused, no time at B's end
                interval.append(model.new_optional_interval_var(s, sub.duration[j], e, ~literal, f"interval_{name}"))
                model.add(e == s).only_enforce_if(literal)
        end.append(e)
    for (b, w, _), literal in zip(sub.fusable, fused):
        model.add(start[w] == end[b]).only_enforce_if(literal)
    makespan = model.new_int_var(sub.floor, horizon, "makespan")

    # --- constraints ------------------------------------------------------------------
    ops_on = [[j for j in range(n) if sub.device[j] == d] for d in devices]
    for d in devices:
        model.add_no_overlap([interval[j] for j in ops_on[d]])
    for a, b, delay in sub.precedences:
        model.add(start[b] >= end[a] + delay)
    for a, b in sub.in_order:
        model.add(start[b] >= end[a])
    for a, b, f in sub.in_order_if_split:
        model.add(start[b] >= end[a]).only_enforce_if(~fused[f])
    for d in devices:
        limit = sub.limit[d]
        if limit is None:
            continue
        # Memory changes at an F's (or S's) start and at the others' end; ops on one device never
        # overlap, so these events follow the device's order exactly.
        times = [start[j] if sub.ops[j].kind in ALLOCATE_AT_START else end[j] for j in ops_on[d]]
        changes = [sub.delta[j] for j in ops_on[d]]
        if max(changes, default=0) > 0:
            lowest = -sum(-c for c in changes if c < 0) - abs(sub.initial_memory[d]) - 1
            model.add_reservoir_constraint(times, changes, min(lowest, 0), limit - sub.initial_memory[d])
    for j in range(n):
        model.add(makespan >= end[j] + sub.tail[j])

    # --- objective --------------------------------------------------------------------
    target = makespan
    if objective == "span":
        spans = []
        for d in devices:
            if not ops_on[d]:
                continue
            first = model.new_int_var(0, horizon, f"first_start_{d}")
            last = model.new_int_var(0, horizon, f"last_end_{d}")
            model.add_min_equality(first, [start[j] for j in ops_on[d]])
            model.add_max_equality(last, [end[j] for j in ops_on[d]])
            spans.append(last - first)
        # No span-optimal solution is longer than the hint's span (the hint is one solution).
        hint_span = sub.hint_span()
        target = model.new_int_var(0, horizon if hint_span is None else hint_span, "longest_span")
        for span in spans:
            model.add(target >= span)
        if sub.shiftable:
            _pin_first_start(model, sub, start)
    if compact:
        model.minimize(target * (n + 1) + sum(end))
    else:
        model.minimize(target)
    if sub.hint is not None:
        hinted = sub.durations(sub.hint_fused)
        for j in range(n):
            model.add_hint(start[j], sub.hint[j])
            model.add_hint(end[j], sub.hint[j] + hinted[j])
        for literal, f in zip(fused, sub.hint_fused or [False] * len(fused)):
            model.add_hint(literal, f)

    # --- solve ------------------------------------------------------------------------
    began = time.perf_counter()
    interrupted = False
    try:
        solver, status = run_cpsat(
            model,
            time_limit=time_limit,
            seed=seed,
            threads=threads,
            deterministic_limit=deterministic_limit,
            callback=_Reporter(target, on_solution),
        )
    except CpsatInterrupted as stop:  # keep what was found; the caller re-raises
        solver, status, interrupted = stop.solver, stop.status, True
    seconds = time.perf_counter() - began

    # --- read the solution ------------------------------------------------------------
    names: dict[Any, str] = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible"}
    name = names.get(status, "unknown")
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        starts = [solver.value(s) for s in start]
        value = solver.value(target)
        bound = value if status == cp_model.OPTIMAL else int(solver.best_objective_bound)
        if compact and status != cp_model.OPTIMAL:
            bound = 0
        return CpsatResult(name, starts, value, bound, interrupted, seconds, [bool(solver.value(x)) for x in fused])
    return CpsatResult(name, None, None, 0, interrupted, seconds)


def _pin_first_start(model: cp_model.CpModel, sub: SubProblem, start: list[cp_model.IntVar]) -> None:
    """Start the earliest op at 0 (spans do not change when a schedule is shifted).

    Without it the solver may place the whole schedule anywhere in the horizon, and a
    device's span is a difference of two free variables, whose relaxation proves little:
    the whole model closed p = 4, m = 4 on the V placement at V-Min's memory under the
    makespan objective in 0.2 s and left 12% open under the span objective in 90 s. Pinned,
    the first device's span is its last end, as tightly bounded as a makespan. Every op
    follows an op without predecessors, so the earliest op is one of those.
    """
    sources = [start[j] for j in sub.sources()]
    if len(sources) == 1:
        model.add(sources[0] == 0)
    else:
        model.add_min_equality(model.new_constant(0), sources)


def run_cpsat(
    model: cp_model.CpModel,
    *,
    time_limit: float,
    seed: int,
    threads: int,
    deterministic_limit: float | None = None,
    callback: cp_model.CpSolverSolutionCallback | None = None,
) -> tuple[cp_model.CpSolver, Any]:
    """Solve `model` the one way every pipesched model is solved; (solver, status).

    Wall-clock limit, optional deterministic limit (repeatable runs), seed and worker
    count set here once; Ctrl-C stops the search and is raised again as
    KeyboardInterrupt once CP-SAT has returned (the solver then holds the best so far,
    for callers that catch it).
    """
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit)
    solver.parameters.expand_reservoir_constraints = expansion_fits(model, time_limit)
    if deterministic_limit is not None:
        solver.parameters.max_deterministic_time = deterministic_limit
    solver.parameters.num_workers = max(1, threads)
    solver.parameters.random_seed = seed
    status, interrupted = _solve_interruptibly(solver, model, callback)
    if interrupted:
        raise CpsatInterrupted(solver, status)
    return solver, status


def expansion_fits(model: cp_model.CpModel, time_limit: float) -> bool:
    """Whether CP-SAT may expand the model's memory (reservoir) constraints in time.

    Its presolve turns a reservoir of n events into Booleans on their pairs, and does not
    look at the time limit while doing so: 3,120 ops on 8 devices (Σ n² = 1.2 million)
    became 404,560 Booleans in 4 s under a 0.1 s limit, where the unexpanded model took
    0.14 s. The expansion helps the search on small models, so it is kept where its
    estimate fits in a share of the limit.
    """
    events = [len(ct.reservoir.time_exprs) for ct in model.proto.constraints if ct.has_reservoir()]
    return RESERVOIR_SECONDS_PER_PAIR * sum(n * n for n in events) <= RESERVOIR_SHARE * time_limit


class CpsatInterrupted(KeyboardInterrupt):
    """Ctrl-C during a CP-SAT solve; `solver` and `status` hold what it had found."""

    def __init__(self, solver: cp_model.CpSolver, status: Any):
        super().__init__()
        self.solver = solver
        self.status = status


def _solve_interruptibly(solver: cp_model.CpSolver, model: cp_model.CpModel, reporter) -> tuple[Any, bool]:
    """Solve in a worker thread so that Ctrl-C reaches Python; on Ctrl-C stop the search.

    Waiting uses an Event, not Thread.join: a join interrupted by KeyboardInterrupt can
    report the thread finished while it still runs (CPython 3.11), and leaving the
    process with CP-SAT still running aborts it.
    """
    # CP-SAT's own SIGINT handler would take Ctrl-C from Python and end only this solve.
    solver.parameters.catch_sigint_signal = False
    outcome: dict[str, Any] = {}  # the solver's status (a CpSolverStatus)
    done = threading.Event()

    def work() -> None:
        try:
            outcome["status"] = solver.solve(model, reporter) if reporter is not None else solver.solve(model)
        finally:
            done.set()

    try:
        threading.Thread(target=work, daemon=True).start()  # Ctrl-C can arrive inside start()
        while not done.wait(0.05):
            pass
    except KeyboardInterrupt:
        # A stop asked before the solve has begun is lost: ask until it ends, whatever
        # further Ctrl-C arrive meanwhile.
        while True:
            try:
                solver.stop_search()
                if done.wait(0.05):
                    break
            except KeyboardInterrupt:
                continue
        return outcome.get("status", cp_model.UNKNOWN), True
    return outcome["status"], False

"""MILP model (PuLP) of the same (sub)problem as the CP-SAT model: big-M ordering binaries.

Data, variables, constraints, objective, solve, read the solution, as in the CP-SAT
model. A binary `before_a_b` decides the order of two ops on one device whose order is
not already implied by dependencies and the in-order rule; memory at each allocation is
the sum of the deltas of the ops ordered before it. The back end is CBC by default,
HiGHS, or any solver PuLP knows by name (GUROBI, CPLEX_CMD, ...). The model is warm
started from the incumbent. A time-limited run is reported "feasible" even when PuLP's
status says Optimal: only `sol_status == LpSolutionOptimal` counts as a proof.

Big-M models are weak: this one is for small instances and for cross-checking CP-SAT.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

# OR-Tools and highspy bundle different copies of libhighs.so.1 and a process can load
# only one; pulp imports highspy when it is imported. Load OR-Tools first so that CP-SAT
# keeps working in this process; HiGHS then runs in its own interpreter (highs_worker).
with contextlib.suppress(ImportError):
    import ortools.sat.python.cp_model  # noqa: F401
import pulp

from optimizer.errors import InputError
from optimizer.exact.subproblem import SubProblem
from optimizer.ops import Op


@dataclass
class MilpResult:
    status: str  # "optimal", "feasible", "infeasible", "unknown"
    starts: list[int] | None
    objective: float | None  # in ticks
    bound: float  # proven lower bound in ticks (0 when the back end does not report one)
    seconds: float
    solver: str
    interrupted: bool = False
    fused: list[bool] | None = None  # per pair of sub.fusable, with the starts

    def orders(self, sub: SubProblem) -> list[list[Op]]:
        """The solution's per-device orders (fused pairs as BW ops)."""
        assert self.starts is not None, "orders of a solution"
        return sub.orders_from_starts(self.starts, self.fused)


def _implied_order(sub: SubProblem) -> list[int]:
    """For each op, a bitset of the ops that must start after it ends (transitive)."""
    n = len(sub.ops)
    direct = [0] * n
    for a, b, _ in sub.precedences:
        direct[a] |= 1 << b
    for a, b in sub.in_order:
        direct[a] |= 1 << b
    # Ops in topological order of the hint when available, else by index with repetition.
    after = list(direct)
    order = sorted(range(n), key=lambda j: -(sub.hint[j] if sub.hint is not None else 0))
    for _ in range(2 if sub.hint is not None else n):
        changed = False
        for a in order:
            reach = after[a]
            bits, extra = reach, 0
            while bits:
                low = bits & -bits
                extra |= after[low.bit_length() - 1]
                bits ^= low
            if extra & ~reach:
                after[a] = reach | extra
                changed = True
        if not changed:
            break
    return after


_HIGHS_IN_ITS_OWN_PROCESS = "highs"
# The back end gets at least this long, whatever building the model left: with less, CBC
# finds nothing.
MIN_SOLVER_SECONDS = 1.0
# A back end still running this long after its own time limit is stopped, and the
# incumbent stands: CBC ran 6.4 s of a 1 s limit on a 384-op model (preprocessing).
OVERRUN_GRACE_SECONDS = 1.0


def make_solver(name: str, time_limit: float, threads: int):
    """A PuLP solver by our short name ("cbc", "highs") or PuLP's own name."""
    key = name.lower()
    if key == "cbc":
        # The CBC bundled with PuLP; PuLP 3 warns that this class will move in PuLP 4.
        # Not warm-started: from the hint's values CBC proved a wrong optimum ("optimal"
        # 957515 ticks where 950396 fits, on a 3-device problem whose every other
        # model, and CBC itself without the start, finds 950396), and a wrong bound is
        # the one thing a solver must never give. The hint still bounds the horizon, and
        # the best known schedule stands whatever CBC finds.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, warmStart=False, threads=threads)
    if key == "highs":
        return _HIGHS_IN_ITS_OWN_PROCESS
    available = pulp.listSolvers(onlyAvailable=True)
    if name not in pulp.listSolvers():
        raise InputError(f"solver: unknown MILP solver '{name}' (use cbc, highs or one of {', '.join(available)})")
    if name not in available:
        raise InputError(f"solver: '{name}' is not installed here (available: cbc, highs, {', '.join(available)})")
    try:
        return pulp.getSolver(name, msg=False, timeLimit=time_limit, warmStart=True)
    except TypeError:
        return pulp.getSolver(name, msg=False, timeLimit=time_limit)


def solve_milp_subproblem(
    sub: SubProblem, *, time_limit: float, solver: str = "cbc", threads: int = 1, seed: int = 0, objective: str = "makespan"
) -> MilpResult:
    """Minimize the makespan (or the longest device span) of `sub` with a big-M MILP
    within `time_limit` seconds from the call (building the model included), with
    MIN_SOLVER_SECONDS for the back end at least and OVERRUN_GRACE_SECONDS past it at most."""
    deadline = time.monotonic() + time_limit
    # --- data -------------------------------------------------------------------------
    n = len(sub.ops)
    horizon = sub.horizon(objective)  # valid for the objective, and the big M: see SubProblem.horizon
    must_follow = _implied_order(sub)
    names = [f"{op.kind}_{op.stage}_{op.microbatch}_{op.slice}" for op in sub.ops]
    ops_on = [[j for j in range(n) if sub.device[j] == d] for d in range(sub.num_devices)]

    def precedes(a: int, b: int) -> bool:
        return bool(must_follow[a] >> b & 1)

    # --- variables --------------------------------------------------------------------
    model = pulp.LpProblem("pipeline_schedule", pulp.LpMinimize)
    least = sub.least_durations()  # fused or split
    start = [
        model.add_variable(f"start_{names[j]}", lowBound=sub.release[j], upBound=max(sub.release[j], horizon - least[j] - sub.tail[j]))
        for j in range(n)
    ]
    makespan = model.add_variable("makespan", lowBound=sub.floor, upBound=horizon)
    # Fused-or-split pairs: B takes the fused duration and W none, glued to B's end.
    fused = [model.add_variable(f"fused_{names[b]}", 0, 1, pulp.LpBinary) for b, _, _ in sub.fusable]
    duration: list = list(sub.duration)
    for (b, w, bw), f in zip(sub.fusable, fused):
        duration[b] = sub.duration[b] + (bw - sub.duration[b]) * f
        duration[w] = sub.duration[w] * (1 - f)
    fused_pair_of = {b: (w, f) for f, (b, w, _) in enumerate(sub.fusable)}
    before: dict[tuple[int, int], pulp.LpVariable] = {}
    for d_ops in ops_on:
        for x, a in enumerate(d_ops):
            for b in d_ops[x + 1 :]:
                if not precedes(a, b) and not precedes(b, a):
                    before[(a, b)] = model.add_variable(f"before_{names[a]}_{names[b]}", 0, 1, pulp.LpBinary)

    def is_before(a: int, b: int):
        """1 when op a runs before op b on their device (a constant or an expression)."""
        if precedes(a, b):
            return 1
        if precedes(b, a):
            return 0
        return before[(a, b)] if (a, b) in before else 1 - before[(b, a)]

    # --- constraints ------------------------------------------------------------------
    for a, b, delay in sub.precedences:
        model += start[b] >= start[a] + duration[a] + delay
    for a, b in sub.in_order:
        model += start[b] >= start[a] + duration[a]
    for a, b, f in sub.in_order_if_split:
        model += start[b] >= start[a] + duration[a] - horizon * fused[f]
    for (b, w, _), f in zip(sub.fusable, fused):
        model += start[w] <= start[b] + duration[b] + horizon * (1 - f)
    for (a, b), y in before.items():
        model += start[b] >= start[a] + duration[a] - horizon * (1 - y)
        model += start[a] >= start[b] + duration[b] - horizon * y
    for d, d_ops in enumerate(ops_on):
        limit = sub.limit[d]
        if limit is None:
            continue
        for x in d_ops:
            if sub.delta[x] <= 0:
                continue  # usage only rises at allocations; checking there is enough
            usage = sub.initial_memory[d] + sub.delta[x] + pulp.lpSum(sub.delta[y] * is_before(y, x) for y in d_ops if y != x)
            if x in fused_pair_of:
                # A fused B changes memory together with its W, at the fused end.
                w, f = fused_pair_of[x]
                usage += sub.delta[w] * fused[f]
            model += usage <= limit
    for j in range(n):
        model += makespan >= start[j] + duration[j] + sub.tail[j]

    # --- objective --------------------------------------------------------------------
    target = makespan
    if objective == "span":
        target = model.add_variable("longest_span", lowBound=0, upBound=horizon)
        first_start = []
        for d, d_ops in enumerate(ops_on):
            if not d_ops:
                continue
            first = model.add_variable(f"first_start_{d}", lowBound=0, upBound=horizon)
            for j in d_ops:
                model += first <= start[j]
                # The span only needs the device's first start from below and its ends from above.
                model += target >= start[j] + duration[j] - first
            first_start.append((first, d_ops))
    model += target

    if sub.hint is not None:
        hinted = sub.durations(sub.hint_fused)
        for j in range(n):
            start[j].setInitialValue(sub.hint[j])
        for f, value in zip(fused, sub.hint_fused or [False] * len(fused)):
            f.setInitialValue(int(value))
        for (a, b), y in before.items():
            # Ties only between a zero-length fused W and the op starting at its B's end.
            y.setInitialValue(1 if (sub.hint[a], hinted[b]) < (sub.hint[b], hinted[a]) else 0)
        makespan.setInitialValue(max([sub.floor] + [sub.hint[j] + hinted[j] + sub.tail[j] for j in range(n)]))
        if objective == "span":
            for first, d_ops in first_start:
                first.setInitialValue(min(sub.hint[j] for j in d_ops))
            target.setInitialValue(sub.hint_span())

    # --- solve ------------------------------------------------------------------------
    # The limit counts from the call: building the model took part of it (about 2 s at 384 ops).
    left = max(MIN_SOLVER_SECONDS, deadline - time.monotonic())
    backend = make_solver(solver, left, threads)
    kill_at = time.monotonic() + left + OVERRUN_GRACE_SECONDS
    began = time.perf_counter()
    if backend is _HIGHS_IN_ITS_OWN_PROCESS:
        proven, bound, interrupted = _solve_with_highs_worker(model, left, threads, seed, kill_at)
    else:
        proven, bound, interrupted = _solve_with_pulp(model, backend, solver, kill_at)
    seconds = time.perf_counter() - began

    # --- read the solution ------------------------------------------------------------
    if proven is None or any(s.varValue is None for s in start):
        status = "infeasible" if model.sol_status == pulp.LpSolutionInfeasible else "unknown"
        return MilpResult(status, None, None, 0.0, seconds, solver, interrupted)
    starts = [round(s.varValue) for s in start]
    chosen = [round(f.varValue or 0) == 1 for f in fused]
    final = sub.durations(chosen)
    value = max([sub.floor] + [starts[j] + final[j] + sub.tail[j] for j in range(n)])
    if objective == "span":
        value = max(max(starts[j] + final[j] for j in d_ops) - min(starts[j] for j in d_ops) for d_ops in ops_on if d_ops)
    return MilpResult(
        "optimal" if proven else "feasible", starts, float(value), value if proven else bound, seconds, solver, interrupted, chosen
    )


def _solve_with_pulp(model: pulp.LpProblem, backend, name: str, kill_at: float) -> tuple[bool | None, float, bool]:
    """(proven optimal or None when no solution, bound, interrupted) from a PuLP back end.

    PuLP's command-line back ends (CBC) write model files and start a solver process it
    loses track of when Ctrl-C interrupts its wait: the files go into a folder of ours,
    and on Ctrl-C the processes started with that folder on their command line are killed.
    So are they at `kill_at` (time.monotonic()): CBC runs past its own time limit when the
    limit falls in its preprocessing or root LP; killed, it leaves no solution.
    """
    with tempfile.TemporaryDirectory(prefix="pipesched-milp-") as folder:
        if hasattr(backend, "tmpDir"):
            backend.tmpDir = folder
        # On Linux CBC runs under a watcher (cbc_watch.py) started from a script in the
        # folder; where the folder's file system runs no programs (noexec), it runs bare.
        if isinstance(backend, pulp.COIN_CMD) and sys.platform.startswith("linux") and not os.statvfs(folder).f_flag & os.ST_NOEXEC:
            backend.path = _watched(backend.path, folder)
        # Kill only: PuLP's own wait reaps the process.
        watchdog = threading.Timer(max(0.0, kill_at - time.monotonic()), _kill_children_using, (folder, False))
        watchdog.daemon = True
        watchdog.start()
        try:
            model.solve(backend)
        except KeyboardInterrupt:
            _kill_children_using(folder)
            return None, 0.0, True
        except pulp.PulpSolverError:
            # PuLP raises this when the solver left no solution file, which CBC does when
            # its time limit ends during preprocessing: no solution, not a user error (an
            # unknown solver name is refused before, by make_solver).
            return None, 0.0, False
        finally:
            watchdog.cancel()
            _kill_children_using(folder)  # a no-op after a normal solve
    # A time-limited CBC run reports status Optimal; only sol_status tells a proof apart.
    if model.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return None, 0.0, False
    return model.sol_status == pulp.LpSolutionOptimal, 0.0, False


# How long a solver process stopped with SIGTERM may take to end before SIGKILL.
STOP_GRACE_SECONDS = 1.0


def _watched(cbc: str, folder: str) -> str:
    """A program in `folder` that runs `cbc` under cbc_watch.py (CBC then ends with this
    process, even killed outright, and the folder goes with it)."""
    watcher = Path(__file__).with_name("cbc_watch.py")
    command = " ".join(shlex.quote(part) for part in (sys.executable, str(watcher), str(os.getpid()), folder, cbc))
    script = Path(folder) / "cbc"
    script.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
    script.chmod(0o700)
    return str(script)


def _children_using(folder: str) -> list[int]:
    """Our own child processes whose command line mentions `folder` (Linux /proc; [] elsewhere)."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat_fields(entry)
        try:
            if fields and int(fields[1]) == me and folder.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue  # the process ended while we looked
    return found


def _stat_fields(entry: Path) -> list[str]:
    """A /proc/PID entry's stat fields after the command name (state, parent, ...); [] once it has gone."""
    try:
        return (entry / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _kill_children_using(folder: str, reap: bool = True) -> None:
    """Stop them: SIGTERM first (CBC's watcher then kills and reaps CBC), SIGKILL after
    STOP_GRACE_SECONDS; with `reap`, wait for them (the Popen object that would have is gone)."""
    children = _children_using(folder)
    for pid in children:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    until = time.monotonic() + STOP_GRACE_SECONDS
    while children and time.monotonic() < until and any(_alive_child(pid) for pid in children):
        time.sleep(0.01)
    for pid in children:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        if reap:
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)


def _alive_child(pid: int) -> bool:
    """Whether our child `pid` has not ended yet (an ended one not yet reaped has)."""
    fields = _stat_fields(Path("/proc") / str(pid))
    return bool(fields) and fields[0] != "Z"


def _solve_with_highs_worker(
    model: pulp.LpProblem, time_limit: float, threads: int, seed: int, kill_at: float
) -> tuple[bool | None, float, bool]:
    """Solve through highs_worker.py in a fresh interpreter (see its doc for why); stopped
    at `kill_at` (time.monotonic()) without a solution if it is still running then."""
    worker = Path(__file__).with_name("highs_worker.py")
    with tempfile.TemporaryDirectory(prefix="pipesched-highs-") as folder:
        mps, start_file, out = (Path(folder) / name for name in ("model.mps", "start.json", "out.json"))
        model.writeMPS(str(mps))
        start = {v.name: v.varValue for v in model.variables() if v.varValue is not None}
        settings = {"time_limit": time_limit, "threads": threads, "seed": seed, "start": start, "starter": os.getpid()}
        start_file.write_text(json.dumps(settings))
        # Its own session: a terminal's Ctrl-C reaches us only, and we stop the worker.
        # Its output goes nowhere: HiGHS prints a banner, which would break `--json` on stdout.
        process = subprocess.Popen(
            [sys.executable, str(worker), str(mps), str(start_file), str(out)],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            process.wait(timeout=max(0.0, kill_at - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None, 0.0, False  # killed below
        except KeyboardInterrupt:
            process.kill()
            process.wait()
            return None, 0.0, True
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        if process.returncode != 0 or not out.exists():
            raise InputError(f"solver: highs failed (exit {process.returncode})")
        result = json.loads(out.read_text())
    if not result["has_solution"]:
        model.sol_status = pulp.LpSolutionInfeasible if result["status"] == "Infeasible" else pulp.LpSolutionNoSolutionFound
        return None, 0.0, False
    values = result["values"]
    for v in model.variables():
        v.varValue = values.get(v.name)
    bound = result["bound"]
    bound = float(bound) if isinstance(bound, (int, float)) and math.isfinite(bound) else 0.0
    model.sol_status = pulp.LpSolutionOptimal if result["optimal"] else pulp.LpSolutionIntegerFeasible
    return bool(result["optimal"]), bound, False

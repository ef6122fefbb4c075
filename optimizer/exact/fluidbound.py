"""A lower bound that sees every device at once: the time-indexed fluid relaxation.

The per-device relaxations (optimizer.exact.devicebound) are exact on one device but
stand-ins for the others, and the static bounds (optimizer.exact.bounds) count one
device's warm-up and drain. On the V placement at tight memory what is left is an
effect of all devices together (the last microbatches' backwards come back to the first
device at the pace the others can free memory and do their own work). This bound keeps
all devices and counts microbatches as flows:

* N_c(t): how many ops of class c = (kind, stage) have started by time t, a real in
  [0, m]. In any schedule, sorting each class's start times shows that the k-th start of
  a class comes after the k-th end of each predecessor class plus its transfer, so
  N_c(t) <= N_p(t - transfer - duration_p): microbatch labels do not matter;
* per device, the work done by t lies between the durations of the ops ended and of
  the ops started by t, and grows by at most dt in dt (one work curve per device, not per
  class: as strong on every case measured, at a third of the solve time);
* memory at every forward's sampled start: what the started forwards allocated, less
  what the ended B's and W's freed, within the limit (allocations counted low, frees
  counted high: the constraint only relaxes the real one);
* the first op (stage 0's first forward, which every op waits for) starts at 0, so the
  device of stage 0 ends by Z only if all its classes have started m ops by Z minus
  their duration.

Time is sampled at multiples of a step dt (`default_samples`); each class on the grid
shifted by its head modulo dt, so the chain of forwards and backwards (each class aligned
with its critical predecessor) loses nothing to rounding. The grid keeps every step in
the warm-up and the drain and may keep only every few steps in the steady state between
(`grid`): what sets the bound is mostly in the ramps, and at p = 32, m = 256 on the V
placement at V-Half's memory a graded grid of 150 times (every 4th step between the
ramps) refutes 1.5% below `auto`'s span in 8 s, where 250 uniform steps took 23 s and
200 did not refute it. Rounding always goes the relaxing way on any such grid (a count
bounded from above by the next sample, from below by the previous one), so for a given
Z these constraints hold whenever a schedule ends device 0 by Z. The program meets
what ending by Z requires up to one shortfall variable, which it minimizes: a least
shortfall above 0 proves every schedule's span of that device (its first op at 0) above
Z, hence the span objective and the makespan above Z.

The program is solved by HiGHS in a fresh process (`python -m optimizer.exact.fluidbound`,
see optimizer/exact/highs_worker.py for why: OR-Tools and highspy ship different HiGHS
libraries), bisecting Z between a known bound and a known schedule's span. Each answer
is a proof on its own, so a cut-off run still returns the highest Z proven.

Applies to one slice per microbatch, no vocabulary passes, backwards split (where a
fused backward is never shorter than B then W, optimizer.exact.slicebounds), memory
allocated by forwards and freed by B's and W's.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

from optimizer.errors import PipeschedError
from optimizer.exact.bounds import _links, device_tails, heads
from optimizer.interrupts import interrupts_deferred
from optimizer.lifeline import end_with
from optimizer.ops import fusing_can_win
from optimizer.problem import Problem, tolerant
from optimizer.schedule import Schedule

# Grid steps over the span being tested, by default: the program has about one variable
# per class (3 per stage) and sample, so the samples shrink as the classes grow, keeping
# the started counts near `budget`: with SAMPLE_BUDGET 1000 steps up to 48 classes (p = 8
# on the V placement), 500 at p = 16, 250 at p = 32, about 15 s a program on 2 cores.
SAMPLE_BUDGET = 48_000
MAX_SAMPLES = 1000
MIN_SAMPLES = 100


# Op classes per stage: its forwards, B's and W's.
CLASSES_PER_STAGE = 3


def default_samples(num_stages: int, budget: int = SAMPLE_BUDGET) -> int:
    """Grid steps over the tested span for a problem of `num_stages` stages."""
    return max(MIN_SAMPLES, min(MAX_SAMPLES, budget // max(1, CLASSES_PER_STAGE * num_stages)))


# The bisection's first probe, this far (relative) below the known schedule: one
# refutation there settles the gap to within it. 300 steps over the span refute it on
# every V-Half and p case of Zero Bubble's settings measured (p = 8 to 32, m up to 256).
FIRST_PROBE = 0.015

BELOW_PROBE = ("bisect", "stop")

# The grid keeps every COARSE-th step between the ramps (`grid`) where a caller asks for
# graded grids (auto, --certify): from 200 times, 8 proved at least as much as 4 in 50 s
# on the five V cases measured both ways (p = 8 to 32, V-Min's memory to p's).
COARSE = 8

# A refining bisection (`bisect`'s `refine`) grows its samples by this factor each time it
# settles with time left.
REFINE_FACTOR = 1.5

# A worker stops itself at its time limit, between programs; one whose last program's
# build or solve runs over is stopped this long after it (its proofs are already written).
OVERRUN_SECONDS = 2.0

# A proof is reported this much (relative) below the Z the solver refuted, for the
# solver's feasibility tolerance.
SAFETY = 1e-6
# A program refutes its Z when its least shortfall (in ops) is above this: far above the
# interior point method's tolerances (1e-7 relative), far below one op.
SHORTFALL_TOLERANCE = 1e-3

Class = tuple[str, int]  # (kind, stage)


@dataclass(frozen=True)
class _Data:
    """The problem as the program needs it (plain numbers, no pydantic in the loops)."""

    num_stages: int
    num_microbatches: int
    device: tuple[int, ...]
    duration: dict[str, tuple[float, ...]]
    memory: dict[str, tuple[float, ...]]
    limit: tuple[float, ...]
    links: tuple[float, ...]  # transfer after stage s's forward (and before its backward)
    # Per class, each microbatch's earliest start (memory-aware) and least time from its
    # end to the end of stage 0's device (-inf: no path), in microbatch order
    # (optimizer.exact.bounds).
    head: dict[Class, list[float]]
    tail: dict[Class, list[float]]


def applicable(problem: Problem) -> bool:
    """One slice, no vocabulary passes, forwards allocate and B's and W's free."""
    if problem.num_slices != 1 or problem.vocab_parallel is not None:
        return False
    t = problem.tables()
    if any(v < 0 for v in t.mem_forward) or any(v > 0 for v in t.mem_backward_input + t.mem_backward_weight):
        return False
    # Where a fused backward can win, it could beat every split schedule.
    return not any(fusing_can_win(t, s) for s in range(problem.num_stages))


def _data(problem: Problem) -> _Data:
    """The program's numbers, with the per-microbatch heads and tails."""
    t = problem.tables()
    return _Data(
        num_stages=problem.num_stages,
        num_microbatches=problem.num_microbatches,
        device=t.device,
        duration={"F": t.forward, "B": t.backward_input, "W": t.backward_weight},
        memory={"F": t.mem_forward, "B": t.mem_backward_input, "W": t.mem_backward_weight},
        limit=tuple(tolerant(v) for v in t.limit),
        links=tuple(_links(problem)),
        head=_per_class(heads(problem, memory_aware=True)),
        tail=_per_class(device_tails(problem, t.device[0])),
    )


def _per_class(values: dict[str, list[list[float]]]) -> dict[Class, list[float]]:
    return {(kind, s): list(row) for kind, rows in values.items() for s, row in enumerate(rows)}


def _predecessors(data: _Data) -> dict[Class, list[tuple[Class, float]]]:
    """Each class's predecessor classes with the transfer between them."""
    S, links = data.num_stages, data.links
    preds: dict[Class, list[tuple[Class, float]]] = {}
    for s in range(S):
        preds[("F", s)] = [(("F", s - 1), links[s - 1])] if s > 0 else []
        preds[("B", s)] = [(("F", s), 0.0)] + ([(("B", s + 1), links[s])] if s + 1 < S else [])
        preds[("W", s)] = [(("B", s), 0.0)]
    return preds


def _heads(data: _Data, preds: dict[Class, list[tuple[Class, float]]]) -> dict[Class, float]:
    """Earliest start of each class's first op (longest path from stage 0's forward)."""
    S = data.num_stages
    order = [("F", s) for s in range(S)] + [("B", s) for s in reversed(range(S))] + [("W", s) for s in range(S)]
    head: dict[Class, float] = {}
    for c in order:
        head[c] = max((head[p] + data.duration[p[0]][p[1]] + lag for p, lag in preds[c]), default=0.0)
    return head


@dataclass
class _Program:
    """A linear program in row form: variable bounds, rows (lower, upper, columns, values),
    and the variable to minimize (the shortfall, see `build_program`).

    `meaning[v]` says what variable v stands for, so that a schedule's own values can be
    checked against every row: ("started", class, t), the ops of the class started by time
    t (the first op at 0); ("done", device, t), the work the device has done by t; and
    ("shortfall",)."""

    lower: list[float]
    upper: list[float]
    rows: list[tuple[float, float, list[int], list[float]]]
    objective: int = -1
    meaning: list[tuple] = field(default_factory=list)

    def var(self, lower: float, upper: float, meaning: tuple) -> int:
        self.lower.append(lower)
        self.upper.append(upper)
        self.meaning.append(meaning)
        return len(self.lower) - 1

    def row(self, lower: float, upper: float, columns: list[int], values: list[float]) -> None:
        self.rows.append((lower, upper, columns, values))


def ramps(data: _Data) -> tuple[float, float]:
    """(warm-up, drain): how long from the first op until every class can have started,
    and from when on some op must still follow on the way to device 0's end.

    Outside these two ramps the program's constraints repeat microbatch after microbatch
    (the steady state), which a coarser grid samples (see `grid`)."""
    preds = _predecessors(data)
    head = _heads(data, preds)
    warm = max(head[c] + data.duration[c[0]][c[1]] for c in head)
    finite = [q + data.duration[c[0]][c[1]] for c, row in data.tail.items() for q in row if q != -math.inf]
    return warm, max(finite, default=0.0)


def grid(data: _Data, z: float, step: float, coarse: int = 1) -> list[int]:
    """The program's sample times in units of `step`, from 0 to one past `z`.

    Every step in the two ramps (`ramps`), every `coarse`-th one between them. All sample
    times are multiples of `step`, so each class's shift (below one step) keeps its samples
    between two consecutive grid times, which the work rows rely on."""
    last = math.floor(z / step) + 1  # one past z, so every "started by z - d" has a sample
    if coarse <= 1:
        return list(range(last + 1))
    warm, drain = ramps(data)
    fine_until = min(last, math.ceil(warm / step))
    fine_from = max(fine_until, math.floor((z - drain) / step))
    return [*range(fine_until), *range(fine_until, fine_from, coarse), *range(fine_from, last + 1)]


def graded_step(data: _Data, z: float, samples: int, coarse: int) -> float:
    """The finest step that gives about `samples` grid times over `z` with `coarse` (see `grid`)."""
    warm, drain = ramps(data)
    fine = min(z, warm + drain)
    return max(fine + (z - fine) / max(1, coarse), 1e-9) / samples


def build_program(data: _Data, z: float, step: float, coarse: int = 1) -> _Program | None:
    """The program whose least shortfall is 0 if a schedule ends device 0 by `z` (None: z is
    below some class's own duration, so no schedule does).

    What ending by `z` requires (so many ops of a class started by a time) is met up to one
    shortfall variable, the objective: the program is always feasible, and an optimum above
    0 refutes `z`. Posed as pure feasibility, the interior point method ended without a
    verdict on the p = 32 programs of Zero Bubble's settings at 1F1B's memory (14 s, status
    unknown) where the least shortfall (0.66 ops) refutes them.

    Time is sampled every `step` in the ramps and every `coarse` steps between (`grid`).
    """
    inf = math.inf
    m = data.num_microbatches
    preds = _predecessors(data)
    head = _heads(data, preds)
    classes = list(head)
    duration = {c: data.duration[c[0]][c[1]] for c in classes}
    offset = {c: head[c] - math.floor(head[c] / step) * step for c in classes}
    points = grid(data, z, step, coarse)
    # Indices past the last sample are clipped to it (min(..., samples - 1)) and that stays
    # valid: the last time is past z, by which every F and B class, each with a path to
    # stage 0's backward on device 0, has started all m ops, so its count there is final;
    # a W free counted there is memory at that earlier time, when every forward had
    # already allocated, hence within the limit. Precedence rows have F and B predecessors
    # only, and the required counts ask for times up to z.
    samples = len(points)
    base = [k * step for k in points]
    # The end of the last interval, for the work done by then.
    edges = [*base, (points[-1] + 1) * step]

    def at_or_after(c: Class, x: float) -> int:
        return bisect_left(points, (x - offset[c]) / step - 1e-9)

    def at_or_before(c: Class, x: float) -> int | None:
        j = bisect_right(points, (x - offset[c]) / step + 1e-9) - 1
        return j if j >= 0 else None

    lp = _Program([], [], [])
    started = {c: [lp.var(0.0, m, ("started", c, base[k] + offset[c])) for k in range(samples)] for c in classes}
    for c, earliest in data.head.items():
        # Ops of a class start in microbatch order (optimizer.exact.canonical), the j-th no
        # sooner than its head: by time t at most #{j: head_j <= t} have started.
        ordered = sorted(earliest)
        for k, var in enumerate(started[c]):
            lp.upper[var] = min(lp.upper[var], float(bisect_right(ordered, base[k] + offset[c] + 1e-9)))
    required: dict[int, float] = {}  # started count at a sample, at least
    for c, least in data.tail.items():
        # The j-th op of a class with a path to device 0's end starts by z - tail_j - duration.
        for rank, q in enumerate(sorted(least, reverse=True)):
            if q == -math.inf:
                continue
            latest = z - q - duration[c]
            if latest < 0:
                return None
            var = started[c][min(at_or_after(c, latest), samples - 1)]
            if rank + 1 > lp.upper[var]:
                return None  # the ops' heads alone rule it out
            required[var] = max(required.get(var, 0.0), float(rank + 1))
    for c in classes:
        n = started[c]
        for k in range(samples - 1):
            lp.row(0.0, inf, [n[k + 1], n[k]], [1.0, -1.0])
        for k in range(samples):
            t = base[k] + offset[c]
            for p, lag in preds[c]:
                x = t - lag - duration[p]
                if x < 0:
                    lp.row(-inf, 0.0, [n[k]], [1.0])
                else:
                    lp.row(-inf, 0.0, [n[k], started[p][min(at_or_after(p, x), samples - 1)]], [1.0, -1.0])
    for device in range(max(data.device) + 1):
        mine = [c for c in classes if data.device[c[1]] == device]
        # Work done on the device by edges[k]: at least the ops ended by then, at most the
        # ops started, growing by at most dt in dt. Each class's k-th sample lies in
        # [edges[k], edges[k + 1]).
        done = [lp.var(0.0, inf, ("done", device, edges[k])) for k in range(samples + 1)]
        lp.row(-inf, 0.0, [done[0]], [1.0])
        for k in range(samples):
            lp.row(-inf, edges[k + 1] - edges[k], [done[k + 1], done[k]], [1.0, -1.0])
            ended = [(c, j) for c in mine if (j := at_or_before(c, base[k] + offset[c] - duration[c])) is not None]
            lp.row(-inf, 0.0, [*(started[c][j] for c, j in ended), done[k + 1]], [*(duration[c] for c, _ in ended), -1.0])
            lp.row(0.0, inf, [*(started[c][k] for c in mine), done[k]], [*(duration[c] for c in mine), -1.0])
        limit = data.limit[device]
        if math.isfinite(limit):
            for f in (c for c in mine if c[0] == "F"):
                for k in range(samples):
                    t = base[k] + offset[f]
                    columns: list[int] = []
                    values: list[float] = []
                    for c in mine:
                        delta = data.memory[c[0]][c[1]]
                        if delta == 0:
                            continue
                        if c[0] == "F":  # allocated at the start: count starts low
                            j = at_or_before(c, t)
                            if j is not None:
                                columns.append(started[c][min(j, samples - 1)])
                                values.append(delta)
                        elif t - duration[c] >= 0:  # freed at the end: count ends high
                            columns.append(started[c][min(at_or_after(c, t - duration[c]), samples - 1)])
                            values.append(delta)
                    lp.row(-inf, limit, columns, values)
    anchor = data.device[0]
    for c in classes:
        if data.device[c[1]] != anchor:
            continue
        if z - duration[c] < 0:
            return None
        var = started[c][min(at_or_after(c, z - duration[c]), samples - 1)]
        required[var] = max(required.get(var, 0.0), float(m))
    lp.objective = lp.var(0.0, inf, ("shortfall",))
    for var, count in required.items():
        lp.row(count, inf, [var, lp.objective], [1.0, 1.0])
    return lp


def _feasible(lp: _Program, time_limit: float, threads: int) -> bool | None:
    """True (no shortfall), False (a proof: the least shortfall is above SHORTFALL_TOLERANCE),
    or None when HiGHS stops without an answer."""
    least = shortfall(lp, time_limit, threads)
    return None if least is None else least <= SHORTFALL_TOLERANCE


def shortfall(lp: _Program, time_limit: float, threads: int) -> float | None:
    """The program's least shortfall (ops), or None when HiGHS stops without an answer."""
    import highspy  # never in a process that has loaded OR-Tools (see the module doc)
    import numpy as np

    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("solver", "ipm")
    # A feasible answer only moves the bisection; the basis crossover would find is not
    # needed (it took 3 of every 4 seconds on feasible programs at p = 8).
    highs.setOptionValue("run_crossover", "off")
    highs.setOptionValue("threads", threads)
    highs.setOptionValue("time_limit", max(0.1, time_limit))
    highs.addVars(len(lp.lower), np.array(lp.lower), np.array(lp.upper))
    highs.changeColCost(lp.objective, 1.0)
    starts: list[int] = []
    columns: list[int] = []
    values: list[float] = []
    for _, _, cols, vals in lp.rows:
        starts.append(len(columns))
        columns.extend(cols)
        values.extend(vals)
    highs.addRows(
        len(lp.rows),
        np.array([r[0] for r in lp.rows]),
        np.array([r[1] for r in lp.rows]),
        len(columns),
        np.array(starts, dtype=np.int32),
        np.array(columns, dtype=np.int32),
        np.array(values),
    )
    highs.run()
    status = highs.getModelStatus()
    if status == highspy.HighsModelStatus.kOptimal:
        return float(highs.getInfo().objective_function_value)
    return None


def bisect(
    data: _Data,
    low: float,
    high: float,
    *,
    deadline: float,
    step: float | None = None,
    samples: int | None = None,
    coarse: int = 1,
    tolerance: float = 0.002,
    threads: int = 2,
    on_proof: Callable[[float], None] = lambda value: None,
    below_probe: str = "bisect",
    refine: bool = False,
) -> float:
    """The highest Z in [low, high] proven (every schedule's device-0 span is above it),
    `low` if none; stops when high - low is within `tolerance` (relative) or at `deadline`.
    With `refine` (and `samples`), a search settled with time left goes on with
    REFINE_FACTOR times the samples, up to `default_samples` (or `samples` if more), until
    the deadline.

    The grid (`grid`): every `step` in the ramps and every `coarse` steps between. Without
    `step`, about `samples` grid times over `high` (the same step for every probe), or
    `default_samples` over each tested Z.

    The first probe is FIRST_PROBE below `high`: one refutation there settles the gap to it.
    Where it fits (the relaxation is weak there, as at V-Min's memory), `below_probe` says
    what follows: "bisect" goes on halving; "stop" ends the search, leaving the time to
    other bounds.
    """
    if below_probe not in BELOW_PROBE:
        raise ValueError(f"below_probe must be one of {BELOW_PROBE}, not {below_probe!r}")
    probe = max(low, high * (1 - FIRST_PROBE))
    top = high
    # Refined grids stop at the default's size, which keeps a program's memory in bounds.
    largest = max(samples or 0, default_samples(data.num_stages))
    if step is None and samples is not None:
        step = graded_step(data, high, samples, coarse)
    first = True
    while time.monotonic() < deadline:
        if high - low <= tolerance * high:
            if not refine or samples is None or high >= top or samples >= largest:
                break
            # Settled on this grid, with time left: a finer grid is a tighter relaxation.
            # Start again between the proof and the known schedule, first at the Z the
            # coarser grid let through.
            samples = min(largest, math.ceil(samples * REFINE_FACTOR))
            step = graded_step(data, top, samples, coarse)
            probe, high, first = high, top, True
            continue
        z = probe if first and low < probe < high else (low + high) / 2
        lp = build_program(data, z, step or graded_step(data, z, default_samples(data.num_stages), coarse), coarse)
        answer = False if lp is None else _feasible(lp, deadline - time.monotonic(), threads)
        # An answer without a verdict (the time ran out, or the interior point method
        # stalled) proves nothing, like a feasible one; the loop's condition ends the search
        # at the deadline.
        if answer is not False:
            if first and below_probe == "stop":
                break
            high = z
        else:
            low = z * (1 - SAFETY)
            on_proof(low)
        first = False
    return low


class FluidRun:
    """`bisect` on a problem in a fresh process, running while the caller goes on.

    `value()` reads the highest Z proven so far (each proof is written as it comes, see
    `_worker`); `finish(until)` waits for the worker until `until` (time.monotonic) and
    stops it; `close()` stops it at once; `failure()` says why a worker that ended by
    itself failed (the last line it wrote to stderr), or None. As a context manager it is stopped on leaving,
    whatever happens (Ctrl-C included), so no worker outlives its caller.
    """

    def __init__(
        self,
        problem: Problem,
        low: float,
        high: float,
        *,
        time_limit: float,
        step: float | None = None,
        samples: int | None = None,
        coarse: int = 1,
        tolerance: float = 0.002,
        threads: int = 2,
        below_probe: str = "bisect",
        refine: bool = False,
    ) -> None:
        self.low = low
        self._folder = tempfile.TemporaryDirectory()
        problem_path = os.path.join(self._folder.name, "problem.json")
        self._out_path = os.path.join(self._folder.name, "bound.json")
        self._err_path = os.path.join(self._folder.name, "worker.err")
        self._failure: str | None = None
        with open(problem_path, "w") as handle:
            handle.write(problem.model_dump_json())
        settings = {
            "low": low,
            "high": high,
            "time_limit": time_limit,
            "step": step,
            "samples": samples,
            "coarse": coarse,
            "tolerance": tolerance,
            "threads": threads,
            "below_probe": below_probe,
            "refine": refine,
            "starter": os.getpid(),  # the worker ends with this process (optimizer.lifeline)
        }
        command = [sys.executable, "-m", "optimizer.exact.fluidbound", problem_path, json.dumps(settings), self._out_path]
        self._process: subprocess.Popen[bytes] | None = None
        try:
            # Ctrl-C (or SIGTERM) between the start and the assignment would leave the
            # worker unknown to everyone who could stop it.
            with interrupts_deferred(), open(self._err_path, "wb") as errors:
                self._process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors, env=_worker_env()
                )
        except KeyboardInterrupt:
            self.close()
            raise

    def wait(self, until: float) -> None:
        """Wait until the worker ends or `until` (time.monotonic), whichever comes first."""
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=max(0.0, until - time.monotonic()))

    def value(self) -> float:
        """The highest Z proven so far (`low` when none)."""
        try:
            with open(self._out_path) as handle:
                return max(self.low, float(json.load(handle)["bound"]))
        except (OSError, ValueError, KeyError, TypeError):
            return self.low

    def finish(self, until: float) -> float:
        """Wait for the worker until `until` (time.monotonic), stop it, and return its bound."""
        self.wait(until)
        value = self.value()
        self.close()
        return value

    def failure(self) -> str | None:
        """Why the worker failed, where it ended by itself with an error ("the fluid
        bound's worker failed: " and the last line it wrote to stderr, its exception);
        None while it runs, after a clean end, or once stopped by `close()`."""
        found = self._failure if self._process is None else _failure_of(self._process, self._err_path)
        return None if found is None else f"the fluid bound's worker failed: {found}"

    def close(self) -> None:
        """Stop the worker and remove its files (`value()` is `low` afterwards)."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            else:
                self._failure = _failure_of(self._process, self._err_path)
            self._process.wait()
            self._process = None
            self._folder.cleanup()

    def __enter__(self) -> FluidRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _failure_of(process: subprocess.Popen[bytes], err_path: str) -> str | None:
    if process.poll() in (None, 0):
        return None
    try:
        with open(err_path, "rb") as handle:
            lines = [line.strip() for line in handle.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    return lines[-1] if lines else f"exit code {process.returncode}"


class FluidWorkerError(PipeschedError):
    """The fluid bound's worker failed before proving anything."""


def fluid_bound(
    problem: Problem,
    low: float,
    high: float,
    *,
    time_limit: float,
    step: float | None = None,
    samples: int | None = None,
    coarse: int = 1,
    tolerance: float = 0.002,
    threads: int = 2,
    below_probe: str = "bisect",
) -> float:
    """`bisect` on `problem` in a fresh process; `low` when nothing above it was proven.

    `high` is a known schedule's span (or any Z the program is expected to be feasible at).
    FluidWorkerError when the worker failed (a bug, or the machine's resources) with
    nothing proven: said, not taken for "nothing proven".
    """
    if not applicable(problem):
        return low
    began = time.monotonic()
    with FluidRun(
        problem,
        low,
        high,
        time_limit=time_limit,
        step=step,
        samples=samples,
        coarse=coarse,
        tolerance=tolerance,
        threads=threads,
        below_probe=below_probe,
    ) as run:
        value = run.finish(began + time_limit + OVERRUN_SECONDS)
        failure = run.failure()
        if failure is not None and value <= low:
            raise FluidWorkerError(failure)
        return value


def certify(schedule: Schedule, objective: str, seconds: float) -> bool:
    """Raise `schedule`'s lower bound (and lower its gap) with the fluid bound, given
    `seconds`; whether it rose. The bound holds for both objectives (see the module doc)."""
    from optimizer.exact.incumbents import objective_value

    metrics = schedule.metrics
    if metrics.lower_bound is None or not metrics.gap or not applicable(schedule.problem):
        return False
    value = objective_value(schedule, objective)
    samples = default_samples(schedule.problem.num_stages)
    raised = fluid_bound(schedule.problem, metrics.lower_bound, value, time_limit=seconds, samples=samples, coarse=COARSE)
    if raised <= metrics.lower_bound:
        return False
    metrics.lower_bound = raised
    metrics.gap = max(0.0, (value - raised) / value)
    return True


def _worker_env() -> dict[str, str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _worker(problem_path: str, settings_json: str, out_path: str) -> None:
    # Its folder is the solve's, which removes it when it stops the worker: where the solve
    # was killed outright, the worker ends with it and removes the folder itself.
    settings = json.loads(settings_json)
    end_with(settings["starter"], cleanup=lambda: shutil.rmtree(os.path.dirname(out_path), ignore_errors=True))
    with open(problem_path) as handle:
        problem = Problem.model_validate_json(handle.read())
    start = time.monotonic()

    def write(value: float) -> None:
        partial = out_path + ".part"
        with open(partial, "w") as handle:
            json.dump({"bound": value}, handle)
        os.replace(partial, out_path)

    bisect(
        _data(problem),
        settings["low"],
        settings["high"],
        deadline=start + settings["time_limit"],
        step=settings["step"],
        samples=settings["samples"],
        coarse=settings["coarse"],
        tolerance=settings["tolerance"],
        threads=settings["threads"],
        on_proof=write,
        below_probe=settings["below_probe"],
        refine=settings["refine"],
    )


if __name__ == "__main__":
    _worker(*sys.argv[1:4])

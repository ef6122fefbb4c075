"""Integer time and memory for the CP-SAT and MILP models.

CP-SAT works on integers, so durations, transfer time and memory deltas are scaled to
a grid. When the user's numbers have few decimals the grid is exact (e.g. 0.63 -> 63
hundredths) and nothing is lost. Otherwise durations are rounded *down* on a grid fine
enough that the smallest op spans at least `MIN_TICKS` ticks: any real schedule then maps
to a valid integer one that is no longer, so the model's lower bound stays a lower bound
in real units. Memory is rounded conservatively instead (allocations up, frees down, the
limit down), so every order the model accepts fits the real limit.

Every op's duration is on the grid: each kind of each stage and slice (a slice's F and B
take its cost share of the stage's time, its W its token share; optimizer.ops), the
fused backward BW, and the vocabulary passes S and T with the collective's time. Slice
memory deltas are the slice's share of the stage's.

Models only decide orders; the final times always come from re-simulating the order in
the user's floats, so the reported schedule is exact whatever the grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce

from optimizer.ops import SPLIT_KINDS, STAGE_KINDS, VOCAB_KINDS, Op, TimedOp, VocabRule, op_device, op_duration, op_memory, transfer_delay
from optimizer.problem import Problem, tolerant

MIN_TICKS = 1000
# Largest number of ticks we let a horizon reach; CP-SAT handles int64 but keeps its
# linear relaxation well conditioned when values stay moderate.
MAX_HORIZON_TICKS = 10**9
MEMORY_UNITS = 10**6  # resolution of memory when no exact decimal grid exists
MEMORY_DECIMALS = 10  # most decimals of an exact memory grid
MAX_MEMORY_UNITS = 10**15  # largest exact memory integer (sums of a few thousand stay exact in int64)


def _exact_decimal_scale(values: list[float], max_power: int) -> int | None:
    """Smallest 10**k (k <= max_power) making every value an integer, or None.

    A decimal with at most k decimals, read as a float and scaled, lands within a few
    units in the last place of an integer; anything farther is not on the grid. (A
    tolerance relative to the scaled value put every value on a fine enough grid: 1.22 / 3
    counted as exact at 10**10, its third of a unit rounded to nearest.)"""
    for k in range(max_power + 1):
        scale = 10**k
        if all(abs(v * scale - round(v * scale)) <= 1e-9 + 4e-16 * abs(v * scale) for v in values):
            return scale
    return None


@dataclass(frozen=True)
class IntegerTables:
    """Per stage and kind, integer durations and memory deltas; per device, the integer limit."""

    time_scale: float  # ticks per user time unit
    memory_scale: float  # memory units per user memory unit
    exact_time: bool
    exact_memory: bool
    max_time_rounding: float  # largest relative rounding of any duration (0 when exact)
    device: tuple[int, ...]
    duration: dict[str, tuple[int, ...]]  # kind -> stage (slice 0; the whole stage when unsliced)
    memory: dict[str, tuple[int, ...]]
    comm: int
    limit: tuple[int | None, ...]  # None when unlimited
    # kind -> stage -> slice, for every kind including BW (S and T: kind -> shard -> (slice 0,))
    slice_duration: dict[str, tuple[tuple[int, ...], ...]]
    slice_memory: dict[str, tuple[tuple[int, ...], ...]]
    vocab: VocabRule | None = None
    barrier: int = 0  # a collective's ticks (vocabulary parallelism)
    # Off the exact grid, memory rounded the relaxing way (allocations down, frees up, limit
    # up) instead of conservatively: the model's bounds hold, its solutions may not fit.
    relaxed_memory: bool = False

    @property
    def num_slices(self) -> int:
        return len(self.slice_duration["F"][0])

    def op_ticks(self, kind: str, stage: int, slice: int = 0) -> int:
        return self.slice_duration[kind][stage][slice]

    def op_device(self, op: Op | TimedOp) -> int:
        return op_device(self.device, op)

    def delay(self, key: Op, device: int) -> int:
        """Ticks between dependency `key`'s end and its dependent's start on `device` (optimizer.ops)."""
        return int(transfer_delay(key, device, self.device, self.comm, self.barrier))

    def op_delta(self, kind: str, stage: int, slice: int = 0) -> int:
        """Memory change in integer units (F at its start, the others at their end)."""
        return self.slice_memory[kind][stage][slice]

    def ticks(self, value: float) -> int:
        return math.floor(value * self.time_scale + 1e-9)

    def to_time(self, ticks: float) -> float:
        return ticks / self.time_scale

    @property
    def memory_is_exact(self) -> bool:
        """Whether the integer model's memory constraints are the problem's own: an exact
        grid, or no finite limit."""
        return self.exact_memory or all(v is None for v in self.limit)

    @property
    def bounds_hold(self) -> bool:
        """Whether the model's bounds are bounds of the problem: its memory exact or
        relaxed. Rounded conservatively (allocations up, frees down, limit down) its
        constraints can be stricter than the problem's, so its optimum can be longer than
        the problem's and its bounds and proofs say nothing about the problem."""
        return self.memory_is_exact or self.relaxed_memory

    def bound_to_time(self, ticks: float, objective: str, num_devices: int) -> float:
        """A lower bound proven on the integer model, as a lower bound in the user's units
        (0, no claim, where its memory is stricter than the problem's: `bounds_hold`).

        makespan: mapping a real schedule's order to the rounded-down durations and
        timing it as soon as possible gives integer times no later than the real ones
        scaled, so the integer optimum is at most the real one: divide by the scale.
        span: the real optimum may start ops between ticks. Flooring every start of a
        real schedule keeps it valid on the rounded durations and lengthens a span by
        less than one tick, so the real optimum exceeds (integer optimum - 1) ticks. On
        an exact grid the real optimum of an order is a cycle mean of integer path
        lengths over at most `num_devices` devices (optimizer.exact.spantiming), so it
        is a multiple of 1/k for some k <= num_devices and at least (T - 1 + 1/p) ticks.
        """
        if not self.bounds_hold:
            return 0.0
        if objective == "makespan":
            return ticks / self.time_scale
        above = 1.0 / num_devices if self.exact_time else 0.0
        return max(0.0, ticks - 1 + above) / self.time_scale

    def proves_optimality(self, objective: str) -> bool:
        """Whether an integer model's proof of optimality holds for the real problem."""
        return self.exact_time and self.bounds_hold and objective == "makespan"

    def describe(self) -> str:
        if self.exact_time:
            grid = f"exact time grid of 1/{self.time_scale:g} unit"
        else:
            grid = f"time rounded down to 1/{self.time_scale:g} unit (at most {self.max_time_rounding:.2%} per op)"
        rounded = "relaxed" if self.relaxed_memory else "rounded conservatively"
        memory = "exact memory grid" if self.exact_memory else f"memory {rounded} to 1/{self.memory_scale:g} unit"
        return f"{grid}; {memory}"


def _rounded(value: float, *, up: bool) -> int:
    """`value` to an integer, up or down, forgiving float noise of 1e-9 (an integer stays itself)."""
    return math.ceil(value - 1e-9) if up else math.floor(value + 1e-9)


def integer_tables(problem: Problem, relax_memory: bool = False) -> IntegerTables:
    """Scale the problem's times and memory to integers (see the module doc for the rules).

    Off an exact memory grid, memory is rounded conservatively (every solution fits), or
    with `relax_memory` the relaxing way (every bound holds: for whole models that prove)."""
    t = problem.tables()
    S, K, p = problem.num_stages, problem.num_slices, problem.num_devices
    real: dict[str, list[list[float]]] = {kind: [[op_duration(t, kind, s, k) for k in range(K)] for s in range(S)] for kind in STAGE_KINDS}
    vocab = t.vocab_rule()
    kinds: tuple[str, ...] = STAGE_KINDS
    if vocab is not None:  # a pass lasts the same on every shard
        real.update({kind: [[op_duration(t, kind, d)] for d in range(p)] for kind in VOCAB_KINDS})
        kinds += VOCAB_KINDS
    work_kinds = SPLIT_KINDS + (VOCAB_KINDS if vocab is not None else ())
    times = [v for kind in kinds for row in real[kind] for v in row] + [problem.comm_time, t.barrier_time]
    total = (
        sum(sum(row) for kind in work_kinds for row in real[kind]) * problem.num_microbatches
        + problem.comm_time * 2 * problem.num_stages * problem.num_microbatches * K
        + t.barrier_time * 2 * problem.num_microbatches
    )
    exact_scale = _exact_decimal_scale(times, 4)
    exact_time = exact_scale is not None and total * exact_scale <= MAX_HORIZON_TICKS
    if exact_scale is not None and exact_time:
        scale = exact_scale
    else:
        smallest = min(v for v in times if v > 0)
        # Fine enough for the smallest op, but never past the horizon cap: with an op a
        # billionth of the others (a W of 1e-300) the grid would need 10**300 ticks, so
        # such an op rounds down, to no ticks at all (still a lower bound).
        # (In logarithms: MIN_TICKS / smallest overflows below about 1e-305.)
        power = math.ceil(math.log10(MIN_TICKS) - math.log10(smallest))
        if total > 0:
            power = min(power, math.floor(math.log10(MAX_HORIZON_TICKS / total)))
        scale = 10 ** max(0, power)
    rounding = 0.0
    ticks: dict[str, tuple[tuple[int, ...], ...]] = {}
    for kind in kinds:
        rows = []
        for row in real[kind]:
            values = []
            for v in row:
                tick = math.floor(v * scale + 1e-9)
                rounding = max(rounding, abs(v * scale - tick) / (v * scale))
                values.append(tick)
            rows.append(tuple(values))
        ticks[kind] = tuple(rows)
    comm = math.floor(problem.comm_time * scale + 1e-9)
    barrier = math.floor(t.barrier_time * scale + 1e-9)

    deltas = {kind: [[op_memory(t, kind, s, k) for k in range(K)] for s in range(S)] for kind in SPLIT_KINDS}
    if vocab is not None:
        deltas.update({kind: [[op_memory(t, kind, d)] for d in range(p)] for kind in VOCAB_KINDS})
    delta_kinds = tuple(deltas)
    limits = [None if math.isinf(v) else v for v in t.limit]
    mem_values = [v for kind in delta_kinds for row in deltas[kind] for v in row]
    # A slice's delta is its share times the stage's: two-decimal shares of six-decimal
    # deltas need eight. Exact while the integers stay far from overflow.
    memory_values = mem_values + [v for v in limits if v is not None]
    exact_memory_scale = _exact_decimal_scale(memory_values, MEMORY_DECIMALS)
    if exact_memory_scale is not None and max(abs(v) for v in memory_values) * exact_memory_scale > MAX_MEMORY_UNITS:
        exact_memory_scale = None
    exact_memory = exact_memory_scale is not None
    memory: dict[str, tuple[tuple[int, ...], ...]]
    mem_scale: float
    if exact_memory_scale is not None:
        integers = {kind: [[round(v * exact_memory_scale) for v in row] for row in deltas[kind]] for kind in delta_kinds}
        divisor = reduce(math.gcd, (abs(v) for kind in delta_kinds for row in integers[kind] for v in row), 0) or 1
        memory = {kind: tuple(tuple(v // divisor for v in row) for row in integers[kind]) for kind in delta_kinds}
        mem_scale = exact_memory_scale / divisor
    else:
        mem_scale = MEMORY_UNITS / max(abs(v) for v in mem_values)
        # Conservative: every delta up (allocations up, frees towards zero), the limit down.
        # Relaxed: every delta down, the limit up.
        memory = {
            kind: tuple(tuple(_rounded(v * mem_scale, up=not relax_memory) for v in row) for row in deltas[kind]) for kind in delta_kinds
        }
    relaxed = relax_memory and not exact_memory
    # The limit with the checks' slack (Schedule.fits_memory): the model accepts exactly
    # the orders they accept, up to the rounding of inexact memory.
    int_limits = tuple(None if v is None else _rounded(tolerant(v) * mem_scale, up=relaxed) for v in limits)
    # A fused backward changes memory by its B and W together (at its end).
    memory["BW"] = tuple(tuple(b + w for b, w in zip(rb, rw)) for rb, rw in zip(memory["B"], memory["W"]))

    return IntegerTables(
        time_scale=float(scale),
        memory_scale=float(mem_scale),
        exact_time=exact_time,
        exact_memory=exact_memory,
        max_time_rounding=rounding,
        device=t.device,
        duration={kind: tuple(row[0] for row in ticks[kind]) for kind in kinds},
        memory={kind: tuple(row[0] for row in memory[kind]) for kind in kinds},
        comm=comm,
        limit=int_limits,
        slice_duration=ticks,
        slice_memory=memory,
        vocab=vocab,
        barrier=barrier,
        relaxed_memory=relaxed,
    )


def tick_problem(problem: Problem, tables: IntegerTables) -> Problem:
    """The same unsliced problem with durations and transfer time in integer ticks (memory unchanged).

    Simulating an order on it gives the integer times of the relaxations (unsliced only:
    a sliced problem's per-slice ticks are no problem's; optimizer.exact.ticktiming times
    any order in ticks).
    """
    assert problem.num_slices == 1 and problem.vocab_parallel is None, "tick problems are unsliced, without vocabulary passes"
    stages = []
    for s, stage in enumerate(problem.stages):
        stages.append(
            stage.model_copy(
                update={
                    "forward": float(tables.duration["F"][s]),
                    "backward_input": float(tables.duration["B"][s]),
                    "backward_weight": float(tables.duration["W"][s]),
                    "backward": float(tables.duration["BW"][s]) if stage.backward is not None else None,
                }
            )
        )
    return problem.model_copy(update={"stages": stages, "comm_time": float(tables.comm)})

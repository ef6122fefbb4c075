"""Timed schedules and their metrics.

An *order* is what generators and solvers decide: for each device, its ops in execution
order. A *schedule* is an order with start and end times (from the simulator or a
solver), the problem it solves, and metrics derived from the times. Ops themselves are
defined in optimizer/ops.py; the schedule file format in optimizer/formats/schedule_json.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from optimizer.errors import ScheduleError
from optimizer.ops import ALLOCATE_AT_START, KINDS, Op, TimedOp, op_duration, op_memory
from optimizer.problem import Problem, Tables, tolerant

# Names other modules have long imported from here.
__all__ = [
    "KINDS",
    "Metrics",
    "Op",
    "Order",
    "Schedule",
    "ScheduleError",
    "TimedOp",
    "compute_metrics",
    "fits_limits",
    "longest_span",
    "makespan_of",
    "memory_curve",
    "op_duration",
    "orders_fit",
    "peak_memory",
]

Order = Sequence[Sequence[Op]]


def memory_curve(tables: Tables, ops: Sequence[TimedOp]) -> list[tuple[float, float]]:
    """A device's memory usage as (time, usage after the change) steps, starting at 0."""
    usage = 0.0
    points = [(ops[0].start if ops else 0.0, 0.0)]
    for op in ops:
        usage += op_memory(tables, op.kind, op.stage, op.slice)
        points.append((op.start if op.kind in ALLOCATE_AT_START else op.end, usage))
    return points


def peak_memory(tables: Tables, ops: Sequence[Op] | Sequence[TimedOp]) -> float:
    """Highest usage along a device's op sequence; depends on the order only."""
    usage = peak = 0.0
    for op in ops:
        usage += op_memory(tables, op.kind, op.stage, op.slice)
        peak = max(peak, usage)
    return peak


def makespan_of(devices: Sequence[Sequence[TimedOp]]) -> float:
    """First start to last end over every device's ops, 0 when there is none."""
    ops = [op for device in devices for op in device]
    return max(op.end for op in ops) - min(op.start for op in ops) if ops else 0.0


def longest_span(devices: Sequence[Sequence[TimedOp]]) -> float:
    """The longest single-device span (first start to last end), 0 when no device has an op."""
    return max((ops[-1].end - ops[0].start for ops in devices if ops), default=0.0)


def metrics_summary(schedule: Schedule) -> dict:
    """The schedule's metrics and its longest device span (what the span objective
    minimizes and the bubble ratio is counted on), as the commands print them with --json."""
    return {**schedule.metrics.as_dict(), "longest_span": longest_span(schedule.devices)}


def fits_limits(peaks: Sequence[float], limits: Sequence[float]) -> bool:
    """Whether every device's peak is within its limit (optimizer.problem.MEMORY_SLACK)."""
    return all(peak <= tolerant(limit) for peak, limit in zip(peaks, limits))


def orders_fit(problem: Problem, orders: Order) -> bool:
    """Whether per-device orders fit the memory limits, without timing them."""
    tables = problem.tables()
    return fits_limits([peak_memory(tables, seq) for seq in orders], tables.limit)


@dataclass
class Metrics:
    makespan: float
    bubble_ratio: float
    peak_memory: list[float]
    lower_bound: float | None = None
    gap: float | None = None
    status: str | None = None
    method_won: str | None = None
    solve_seconds: float | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def compute_metrics(problem: Problem, devices: Sequence[Sequence[TimedOp]]) -> Metrics:
    """Makespan, bubble ratio (Zero Bubble convention) and per-device peak memory."""
    tables = problem.tables()
    makespan = makespan_of(devices)
    longest_span, busy_on_longest = 0.0, 0.0
    for device in devices:
        if not device:
            continue
        span = max(op.end for op in device) - min(op.start for op in device)
        if span > longest_span:
            longest_span = span
            busy_on_longest = sum(op.end - op.start for op in device)
    bubble = 1.0 - busy_on_longest / longest_span if longest_span > 0 else 0.0
    return Metrics(
        makespan=makespan,
        bubble_ratio=max(0.0, bubble),
        peak_memory=[peak_memory(tables, device) for device in devices],
    )


@dataclass
class Schedule:
    """A timed schedule for a problem; `devices[d]` is device d's ops in execution order."""

    problem: Problem
    method: str
    devices: list[list[TimedOp]]
    metrics: Metrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = compute_metrics(self.problem, self.devices)

    @property
    def makespan(self) -> float:
        return self.metrics.makespan

    def order(self) -> list[list[Op]]:
        return [[op.op for op in device] for device in self.devices]

    def fits_memory(self) -> bool:
        return fits_limits(self.metrics.peak_memory, self.problem.tables().limit)

    def to_json(self) -> dict:
        """The schedule file's JSON (optimizer/formats/schedule_json.py)."""
        # Imported here: the file format builds on this model, not the reverse.
        from optimizer.formats.schedule_json import schedule_to_json

        return schedule_to_json(self)

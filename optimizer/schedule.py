"""Ops, timed schedules, their metrics and the versioned schedule JSON (format v1).

An *order* is what generators and solvers decide: for each device, its ops in execution
order. A *schedule* is an order with start and end times (from the simulator or a
solver), the problem it solves, and metrics derived from the times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from optimizer.errors import InputError, PipeschedError
from optimizer.io import read_json, validate_model, write_json_atomic
from optimizer.problem import MAX_OPS, MAX_VALUE, Problem, Tables

FORMAT = "pipesched.schedule"
VERSION = 1

OpKind = Literal["F", "B", "W", "BW"]
KINDS: tuple[str, ...] = ("F", "B", "W", "BW")


class Op(NamedTuple):
    """One unit of work: a forward, input-gradient, weight-gradient or fused backward."""

    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}(stage {self.stage}, mb {self.microbatch})"


class TimedOp(NamedTuple):
    kind: str
    stage: int
    microbatch: int
    start: float
    end: float

    @property
    def op(self) -> Op:
        return Op(self.kind, self.stage, self.microbatch)


Order = Sequence[Sequence[Op]]


def op_duration(tables: Tables, kind: str, stage: int) -> float:
    if kind == "F":
        return tables.forward[stage]
    if kind == "B":
        return tables.backward_input[stage]
    if kind == "W":
        return tables.backward_weight[stage]
    return tables.backward_input[stage] + tables.backward_weight[stage]


def op_memory(tables: Tables, kind: str, stage: int) -> float:
    """The memory change an op makes (F at its start, the others at their end)."""
    if kind == "F":
        return tables.mem_forward[stage]
    if kind == "B":
        return tables.mem_backward_input[stage]
    if kind == "W":
        return tables.mem_backward_weight[stage]
    return tables.mem_backward_input[stage] + tables.mem_backward_weight[stage]


def memory_curve(tables: Tables, ops: Sequence[TimedOp]) -> list[tuple[float, float]]:
    """A device's memory usage as (time, usage after the change) steps, starting at 0."""
    usage = 0.0
    points = [(ops[0].start if ops else 0.0, 0.0)]
    for op in ops:
        usage += op_memory(tables, op.kind, op.stage)
        points.append((op.start if op.kind == "F" else op.end, usage))
    return points


def peak_memory(tables: Tables, ops: Sequence[Op] | Sequence[TimedOp]) -> float:
    """Highest usage along a device's op sequence; depends on the order only."""
    usage = peak = 0.0
    for op in ops:
        usage += op_memory(tables, op.kind, op.stage)
        peak = max(peak, usage)
    return peak


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
    ops = [op for device in devices for op in device]
    makespan = max(op.end for op in ops) - min(op.start for op in ops) if ops else 0.0
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
        limits = self.problem.tables().limit
        return all(peak <= limit * (1 + 1e-9) for peak, limit in zip(self.metrics.peak_memory, limits))

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "problem": self.problem.to_json(),
            "method": self.method,
            "devices": [
                [{"kind": o.kind, "stage": o.stage, "microbatch": o.microbatch, "start": o.start, "end": o.end} for o in device]
                for device in self.devices
            ],
            "metrics": self.metrics.as_dict(),
        }


# Times of a schedule at the size limit: MAX_OPS ops of at most MAX_VALUE each.
_MAX_TIME = MAX_VALUE * MAX_OPS


class _OpRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    kind: OpKind
    stage: int = Field(ge=0)
    microbatch: int = Field(ge=0)
    start: float = Field(ge=-_MAX_TIME, le=_MAX_TIME)
    end: float = Field(ge=-_MAX_TIME, le=_MAX_TIME)


class _MetricsRecord(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    lower_bound: float | None = None
    gap: float | None = None
    status: str | None = None
    method_won: str | None = None
    solve_seconds: float | None = None


class _ScheduleRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    format: Literal["pipesched.schedule"]
    version: Literal[1]
    problem: Problem
    method: str
    devices: list[list[_OpRecord]]
    metrics: _MetricsRecord = _MetricsRecord()


class ScheduleError(PipeschedError):
    """A schedule that breaks the problem's rules (exit 1); `violations` lists them all."""

    exit_code = 1

    def __init__(self, source: str, violations: list[str]):
        shown = "; ".join(violations[:3]) + (f"; and {len(violations) - 3} more" if len(violations) > 3 else "")
        super().__init__(f"{source}: invalid schedule: {shown}")
        self.violations = violations


def schedule_from_json(data: object, source: str = "schedule", *, check: bool = True) -> Schedule:
    """Build a schedule from JSON data; with `check`, refuse one that breaks any rule."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise InputError(f"{source}: not a pipesched schedule (format is {found!r}, expected {FORMAT!r})")
    if data.get("version") != VERSION:
        raise InputError(f"{source}: schedule format version {data.get('version')!r} is not supported (this pipesched reads {VERSION})")
    record = validate_model(_ScheduleRecord, data, source)
    devices = [[TimedOp(o.kind, o.stage, o.microbatch, o.start, o.end) for o in device] for device in record.devices]
    _check_shape(record.problem, devices, source)
    if check:
        from optimizer.validate import validate

        violations = validate(record.problem, devices)
        if violations:
            raise ScheduleError(source, violations)
    schedule = Schedule(record.problem, record.method, devices)
    extra = record.metrics.model_dump(exclude_none=True)
    for name in ("lower_bound", "gap", "status", "method_won", "solve_seconds"):
        if name in extra:
            setattr(schedule.metrics, name, extra[name])
    return schedule


def _check_shape(problem: Problem, devices: list[list[TimedOp]], source: str) -> None:
    """Refuse ops that name no op of the problem: nothing else (metrics, the validator's
    timing rules, the executor's plans) can make sense of them."""
    total = sum(len(ops) for ops in devices)
    if total > MAX_OPS:  # a complete schedule has at most 3 * stages * microbatches ops
        raise InputError(f"{source}: devices: {total} ops is more than the {MAX_OPS} pipesched takes (README, Size limits)")
    for d, ops in enumerate(devices):
        for k, op in enumerate(ops):
            if op.stage >= problem.num_stages:
                raise InputError(f"{source}: devices.{d}.{k}.stage: {op.stage} is out of range ({problem.num_stages} stages)")
            if op.microbatch >= problem.num_microbatches:
                raise InputError(
                    f"{source}: devices.{d}.{k}.microbatch: {op.microbatch} is out of range ({problem.num_microbatches} microbatches)"
                )


def load_schedule(path: str | Path, *, check: bool = True) -> Schedule:
    return schedule_from_json(read_json(path), str(path), check=check)


def save_schedule(schedule: Schedule, path: str | Path) -> None:
    write_json_atomic(path, schedule.to_json())

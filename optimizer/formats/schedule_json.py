"""The schedule file format (pipesched.schedule, versions 1 to 3): the one place it is read and written.

Version 2 adds each op's `slice` (token slices, optimizer/ops.py); version 3 the
vocabulary passes S and T (vocabulary parallelism; their `stage` is the shard, which is
the device). A schedule is written in the lowest version that holds it: without any op
on a slice > 0 or any vocabulary pass, as version 1, exactly as before those existed, so
older readers keep loading it; every version is read.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from optimizer.errors import InputError, ScheduleError
from optimizer.formats import ScheduleFormat
from optimizer.io import MAX_INPUT_BYTES, json_kind, read_json, validate_model, write_json_atomic
from optimizer.ops import VOCAB_KINDS, TimedOp
from optimizer.problem import MAX_OPS, MAX_VALUE, Problem
from optimizer.schedule import Schedule, longest_span
from optimizer.validate import apart, order_violations, validate

NAME = "pipesched.schedule"
VERSIONS = (1, 2, 3)

# Times of a schedule at the size limit: MAX_OPS ops of at most MAX_VALUE each.
_MAX_TIME = MAX_VALUE * MAX_OPS
# Names the optimizer writes (the method, the phase that won: nested, as
# "lns(local(stretch(...)))") stay far below this.
_MAX_NAME = 1000


class _OpRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    kind: Literal["F", "B", "W", "BW", "S", "T"]
    stage: int = Field(ge=0)
    microbatch: int = Field(ge=0)
    start: float = Field(ge=-_MAX_TIME, le=_MAX_TIME)
    end: float = Field(ge=-_MAX_TIME, le=_MAX_TIME)
    slice: int = Field(default=0, ge=0)


class _MetricsRecord(BaseModel):
    # What the optimizer adds (the rest is computed again on loading); other keys, from
    # newer writers, are accepted and not kept. Ranges as the optimizer writes them: a
    # bound is a time, a gap a share of the makespan (or span).
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
    lower_bound: float | None = Field(default=None, ge=0, le=_MAX_TIME)
    gap: float | None = Field(default=None, ge=0, le=1)
    status: Literal["optimal", "feasible", "heuristic"] | None = None
    method_won: str | None = Field(default=None, max_length=_MAX_NAME)
    solve_seconds: float | None = Field(default=None, ge=0, le=MAX_VALUE)
    # Computed again from the ops on loading; when given, they must agree with them.
    makespan: float | None = Field(default=None, ge=0, le=_MAX_TIME)
    bubble_ratio: float | None = Field(default=None, ge=0, le=1)
    peak_memory: list[float] | None = None


class _ScheduleRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    format: Literal["pipesched.schedule"]
    version: Literal[1, 2, 3]
    problem: Problem
    method: str = Field(max_length=_MAX_NAME)
    devices: list[list[_OpRecord]]
    metrics: _MetricsRecord = _MetricsRecord()


def schedule_to_json(schedule: Schedule) -> dict:
    """The file's JSON: version 1 unless some op is on a slice > 0 (2) or a vocabulary pass (3)."""
    sliced = any(o.slice > 0 for device in schedule.devices for o in device)
    vocab = any(o.kind in VOCAB_KINDS for device in schedule.devices for o in device)

    def record(o: TimedOp) -> dict:
        fields = {"kind": str(o.kind), "stage": o.stage, "microbatch": o.microbatch, "start": o.start, "end": o.end}
        return {**fields, "slice": o.slice} if sliced else fields

    return {
        "format": NAME,
        "version": 3 if vocab else (2 if sliced else 1),
        "problem": schedule.problem.to_json(),
        "method": schedule.method,
        "devices": [[record(o) for o in device] for device in schedule.devices],
        "metrics": schedule.metrics.as_dict(),
    }


def schedule_from_json(data: object, source: str = "schedule", *, check: bool = True) -> Schedule:
    """Build a schedule from JSON data; with `check`, refuse one that breaks any rule."""
    if not isinstance(data, dict):
        raise InputError(
            f'{source}: not a pipesched schedule (the file holds {json_kind(data)}; a schedule is an object with "format": {NAME!r})'
        )
    if data.get("format") != NAME:
        found = f"format is {data['format']!r}" if "format" in data else 'no "format" key'
        raise InputError(f"{source}: not a pipesched schedule ({found}, expected {NAME!r})")
    version = data.get("version")
    if type(version) is not int or version not in VERSIONS:  # true == 1 and 1.0 == 1 in Python
        raise InputError(
            f"{source}: schedule format version {data.get('version')!r} is not supported (this pipesched reads {', '.join(map(str, VERSIONS))})"
        )
    record = validate_model(_ScheduleRecord, data, source)
    devices = [[TimedOp(o.kind, o.stage, o.microbatch, o.start, o.end, o.slice) for o in device] for device in record.devices]
    if record.version == 1 and any(o.slice > 0 for device in devices for o in device):
        raise InputError(f"{source}: version: ops on a slice > 0 need schedule format version 2")
    if record.version < 3 and any(o.kind in VOCAB_KINDS for device in devices for o in device):
        raise InputError(f"{source}: version: vocabulary passes (S, T) need schedule format version 3")
    _check_shape(record.problem, devices, source)
    if check:
        violations = validate(record.problem, devices)
        if violations:
            raise ScheduleError(source, violations)
    schedule = Schedule(record.problem, record.method, devices)
    if check:
        _check_metrics(record.metrics, schedule, source)
    elif not order_violations(record.problem, [[o.op for o in device] for device in devices]):
        # The metrics of a schedule that breaks a rule (an op missing, moved or held twice)
        # cannot be its own: the caller's validation names the rule (`validate`: exit 1),
        # not a metric that differs (exit 2). Validated only when a metric differs.
        try:
            _check_metrics(record.metrics, schedule, source)
        except InputError:
            if not validate(record.problem, devices):
                raise
    extra = record.metrics.model_dump(exclude_none=True)
    for name in ("lower_bound", "gap", "status", "method_won", "solve_seconds"):
        if name in extra:
            setattr(schedule.metrics, name, extra[name])
    return schedule


# A gap is a share: far above float rounding of (value - bound) / value, far below a claim
# that differs (a proof claimed where 93% is open).
_GAP_TOLERANCE = 1e-6
# Relative difference allowed between a file's metrics and the ones computed from its
# ops: far above what a writer's float rounding can make, far below a wrong claim.
_METRICS_TOLERANCE = 1e-6


def _largest_memory_change(problem: Problem) -> float:
    """The largest memory change of any op (1 where no op changes memory): the scale of a
    peak when every device's peak is 0."""
    t = problem.tables()
    changes = [*t.mem_forward, *t.mem_backward_input, *t.mem_backward_weight]
    return max((abs(v) for v in changes), default=0.0) or 1.0


def _check_metrics(metrics: _MetricsRecord, schedule: Schedule, source: str) -> None:
    """Refuse claims the schedule itself contradicts: a makespan, bubble ratio or peak
    memory other than its ops give, a lower bound above its makespan (a bound on the
    longest span is below it too), or "optimal" with a gap."""
    computed = schedule.metrics

    # Relative to each metric's own scale, whatever the units (seconds, GiB): the makespan,
    # the largest peak (a device may hold nothing), and 1 for the bubble ratio, a share.
    def differs(claimed: float, actual: float, scale: float) -> bool:
        return abs(claimed - actual) > _METRICS_TOLERANCE * scale

    scales = {"makespan": abs(computed.makespan), "bubble_ratio": 1.0}
    for name, scale in scales.items():
        claimed, actual = getattr(metrics, name), getattr(computed, name)
        if claimed is not None and differs(claimed, actual, scale):
            shown, real = apart(claimed, actual)
            raise InputError(f"{source}: metrics.{name}: {shown}, but the schedule's ops give {real}")
    claimed_peaks = metrics.peak_memory
    peak_scale = max((abs(v) for v in computed.peak_memory), default=0.0) or _largest_memory_change(schedule.problem)
    if claimed_peaks is not None and (
        len(claimed_peaks) != len(computed.peak_memory)
        or any(differs(claimed, actual, peak_scale) for claimed, actual in zip(claimed_peaks, computed.peak_memory))
    ):
        shown = ", ".join(
            apart(actual, claimed)[0] if claimed is not None else f"{actual:g}"
            for actual, claimed in itertools.zip_longest(computed.peak_memory, claimed_peaks)
            if actual is not None
        )
        raise InputError(f"{source}: metrics.peak_memory: not what the schedule's ops give ([{shown}])")
    makespan = computed.makespan
    if metrics.lower_bound is not None and metrics.lower_bound > makespan * (1 + 1e-9):
        bound, real = apart(metrics.lower_bound, makespan)
        raise InputError(f"{source}: metrics.lower_bound: {bound} is above the schedule's makespan {real}")
    if metrics.status == "optimal" and metrics.gap is not None and metrics.gap > 1e-9:
        raise InputError(f"{source}: metrics.status: optimal with a gap of {metrics.gap:g} (a proof closes the gap)")
    if metrics.lower_bound is not None and metrics.gap is not None:
        # gap = (value - bound) / value, the value being the makespan or the longest span
        # (whichever the solve minimised; the file does not say which).
        values = (makespan, longest_span(schedule.devices))
        implied = [max(0.0, (value - metrics.lower_bound) / value) if value > 0 else 0.0 for value in values]
        if all(abs(metrics.gap - gap) > _GAP_TOLERANCE for gap in implied):
            raise InputError(
                f"{source}: metrics.gap: {metrics.gap:g}, but its lower bound {metrics.lower_bound:g} gives "
                f"{implied[0]:g} against the makespan ({implied[1]:g} against the longest span)"
            )


def _check_shape(problem: Problem, devices: list[list[TimedOp]], source: str) -> None:
    """Refuse ops that name no op of the problem: nothing else (metrics, the validator's
    timing rules, the executor's plans) can make sense of them."""
    if len(devices) != problem.num_devices:
        raise InputError(f"{source}: devices: the schedule has {len(devices)} devices, its problem {problem.num_devices}")
    total = sum(len(ops) for ops in devices)
    if total > MAX_OPS:  # a complete schedule has at most 3 * stages * microbatches * slices ops
        raise InputError(f"{source}: devices: {total} ops is more than the {MAX_OPS} pipesched takes (README, Size limits)")
    for d, ops in enumerate(devices):
        for k, op in enumerate(ops):
            if op.kind in VOCAB_KINDS:
                if problem.vocab_parallel is None:
                    raise InputError(
                        f"{source}: devices.{d}.{k}.kind: {op.kind} is a vocabulary pass, and the problem has no vocab_parallel"
                    )
                if op.stage >= problem.num_devices:
                    raise InputError(f"{source}: devices.{d}.{k}.stage: shard {op.stage} is out of range ({problem.num_devices} devices)")
            elif op.stage >= problem.num_stages:
                raise InputError(f"{source}: devices.{d}.{k}.stage: {op.stage} is out of range ({problem.num_stages} stages)")
            if op.microbatch >= problem.num_microbatches:
                raise InputError(
                    f"{source}: devices.{d}.{k}.microbatch: {op.microbatch} is out of range ({problem.num_microbatches} microbatches)"
                )
            if op.slice >= problem.num_slices:
                raise InputError(f"{source}: devices.{d}.{k}.slice: {op.slice} is out of range ({problem.num_slices} slices)")


# A schedule holds its problem (read up to MAX_INPUT_BYTES) and its ops, about 100 bytes
# each as written: every schedule pipesched writes is read back.
MAX_SCHEDULE_BYTES = MAX_INPUT_BYTES + MAX_OPS * 256


def load_schedule(path: str | Path, *, check: bool = True) -> Schedule:
    return schedule_from_json(read_json(path, MAX_SCHEDULE_BYTES), str(path), check=check)


def save_schedule(schedule: Schedule, path: str | Path) -> None:
    write_json_atomic(path, schedule_to_json(schedule))


def write(schedule: Schedule) -> str:
    return json.dumps(schedule_to_json(schedule), indent=1) + "\n"


FORMAT = ScheduleFormat(
    "schedule-json", "pipesched's schedule JSON (version 1; 2 with token slices, 3 with vocabulary passes)", ".json", write
)

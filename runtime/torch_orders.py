"""torch.distributed.pipelining's built-in schedules as our schedules, from torch's own code.

Each built-in schedule computes every rank's action list (`pipeline_order`) in its
constructor, from counts only: the number of stages, ranks and microbatches. The
stages it is given are only asked for those counts (`num_stages`, `group_size`,
`group_rank`) and for `submod` (a torch.compile check), so stand-ins carrying them
let us build the orders without a process group or a model. The orders then go
through the same path as an imported CSV (optimizer/formats/torch_csv.py), are timed
by our simulator on the problem, and are checked by our validator.

Placements: Schedule1F1B needs the linear placement, the interleaved schedules the
looped one (stage s on device s mod p, linear included), the ZBV and DualPipeV
schedules the V placement. A schedule whose placement does not match, whose
constructor refuses the sizes, or whose order fails our checks is reported with the
reason instead of a schedule.
"""

from __future__ import annotations

import types

from optimizer.errors import InputError, PipeschedError
from optimizer.formats.torch_csv import import_schedule, torchtitan_layout
from optimizer.interrupts import interrupts_deferred
from optimizer.problem import Problem
from optimizer.schedule import Schedule

# torch class name -> the placement its orders assume ("single": linear, one stage per rank)
BUILTIN = {
    "ScheduleGPipe": "single",
    "Schedule1F1B": "single",
    "ScheduleLoopedBFS": "loop",
    "ScheduleInterleaved1F1B": "loop",
    "ScheduleInterleavedZeroBubble": "loop",
    "ScheduleZBVZeroBubble": "v",
    "ScheduleDualPipeV": "v",
}


def row_name(class_name: str) -> str:
    """`torch:` and the name torchtitan's `pipeline_parallel_schedule` gives the class."""
    return "torch:" + class_name.removeprefix("Schedule")


def _stand_in_stages(problem: Problem) -> list[types.SimpleNamespace]:
    p = problem.num_devices
    per_rank = problem.num_stages // p
    return [types.SimpleNamespace(num_stages=problem.num_stages, group_size=p, group_rank=0, submod=None) for _ in range(per_rank)]


def builtin_order_rows(problem: Problem, class_name: str) -> list[list[str]]:
    """torch's pipeline_order for this problem's sizes, as CSV cells per rank (torch's
    own text form of each action). Raises ValueError or AssertionError when torch refuses."""
    from torch.distributed.pipelining import schedules

    cls = getattr(schedules, class_name)
    stages = _stand_in_stages(problem)
    if BUILTIN[class_name] == "single":
        order = cls(stages[0], problem.num_microbatches).pipeline_order
    else:
        order = cls(stages, problem.num_microbatches).pipeline_order
    return [[str(action) for action in order[rank] if action is not None] for rank in range(problem.num_devices)]


def beyond_torch(problem: Problem, named: str = "the problem") -> str | None:
    """What the problem (`named` so) has that no torch schedule can hold ("no token slices
    (...)"), or None."""
    if problem.vocab_parallel is not None:
        return f"no vocabulary passes ({named} has vocab_parallel)"
    if problem.num_slices > 1:
        return f"no token slices ({named} has {problem.num_slices} per microbatch)"
    return None


def builtin_schedule(problem: Problem, class_name: str) -> Schedule:
    """torch's built-in order timed on the problem; PipeschedError with the reason when it
    does not apply (placement, sizes) or breaks a rule (named as torch's)."""
    wanted = BUILTIN[class_name]
    # What torch's orders cannot hold at all, said as such (not as an invalid order).
    missing = beyond_torch(problem)
    if missing is not None:
        raise PipeschedError(f"torch's schedules have {missing}")
    layout = torchtitan_layout(problem)
    if wanted == "single" and not (layout == "loop" and problem.num_stages == problem.num_devices):
        raise PipeschedError(f"needs the linear placement, got {problem.placement()}")
    if wanted != "single" and layout != wanted:
        need = "the looped placement (linear or interleaved:V)" if wanted == "loop" else "the vshape placement"
        raise PipeschedError(f"needs {need}, got {problem.placement()}")
    try:
        rows = builtin_order_rows(problem, class_name)
    except (ValueError, AssertionError, RuntimeError) as error:
        raise PipeschedError(f"torch refuses these sizes: {str(error).strip().splitlines()[0]}") from None
    text = "\n".join(",".join(row) for row in rows) + "\n"
    try:
        schedule, _ = import_schedule(text, problem, class_name, memory=False)
    except PipeschedError as error:
        raise PipeschedError(f"torch's order is invalid: {error}") from None
    schedule.method = row_name(class_name)
    return schedule


def builtin_schedules(problem: Problem) -> tuple[dict[str, Schedule], dict[str, str]]:
    """Every built-in schedule that applies, keyed by `row_name`, and why the others do not."""
    try:
        # Ctrl-C held while torch loads: one that lands in a C extension's import can come
        # out as an ImportError (then misreported as torch missing) or worse.
        with interrupts_deferred():
            import torch.distributed.pipelining  # noqa: F401
    except ImportError:
        raise InputError("torch: --torch needs torch with torch.distributed.pipelining installed") from None
    schedules: dict[str, Schedule] = {}
    refused: dict[str, str] = {}
    for class_name in BUILTIN:
        try:
            schedules[row_name(class_name)] = builtin_schedule(problem, class_name)
        except PipeschedError as error:
            refused[row_name(class_name)] = str(error)
    return schedules, refused

"""A schedule's layer split as the example model's `split=` option (blocks per stage)."""

from __future__ import annotations

from optimizer.formats import ScheduleFormat, missing_split
from optimizer.problem import Problem
from optimizer.schedule import Schedule


def blocks_per_stage(problem: Problem) -> list[int] | None:
    """Transformer blocks per stage when the problem records its split, else None."""
    if any(stage.layers is None for stage in problem.stages):
        return None
    return [sum(1 for layer in stage.layers or [] if layer.kind == "block") for stage in problem.stages]


def write(schedule: Schedule) -> str:
    blocks = blocks_per_stage(schedule.problem)
    if blocks is None:
        raise missing_split("example-split", next(s for s, stage in enumerate(schedule.problem.stages) if stage.layers is None))
    return "split=" + "/".join(map(str, blocks)) + "\n"


FORMAT = ScheduleFormat("example-split", "the layer split as the example model's split= option", ".split.txt", write)

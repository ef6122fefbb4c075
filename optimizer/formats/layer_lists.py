"""A schedule's layer split as per-stage lists of layer names (torchtitan's module lists).

torchtitan builds each pipeline stage from a list of module names
(`module_fqns_per_model_part`); with a layers file whose layer names are the model's
module names, this is that list of lists, one per stage in stage order, as JSON.
"""

from __future__ import annotations

import json

from optimizer.errors import InputError
from optimizer.formats import ScheduleFormat
from optimizer.schedule import Schedule


def layer_names(schedule: Schedule) -> list[list[str]]:
    if schedule.problem.vocab_parallel is not None:
        raise InputError(
            "format: torchtitan-modules lists the embedding and the output layer in stages; this schedule shards them "
            "over every device (vocabulary parallelism), which torchtitan's stages do not: run it with pipesched run"
        )
    names = []
    for s, stage in enumerate(schedule.problem.stages):
        if stage.layers is None:
            raise InputError(f"format: torchtitan-modules needs the layer split; stage {s} lists no layers")
        names.append([layer.name for layer in stage.layers])
    return names


def write(schedule: Schedule) -> str:
    return json.dumps(layer_names(schedule)) + "\n"


FORMAT = ScheduleFormat("torchtitan-modules", "the layer split as per-stage lists of module names (JSON)", ".modules.json", write)

"""A schedule's layer split as per-stage lists of layer names (torchtitan's module lists).

torchtitan builds each pipeline stage from a list of module names
(`module_fqns_per_model_part`); with a layers file whose layer names are the model's
module names, this is that list of lists, one per stage in stage order, as JSON.

A layers file's head (kind `head`) is the final norm, the output layer and the loss;
torchtitan's decoders hold the norm as its own module, `norm`, run just before the output
layer, and delete from a stage every module its list leaves out (their forward then skips
it): so the stage holding the head lists `norm` before it, unless the file names a `norm`
layer itself. `pipesched layers` names its layers as torchtitan's decoders do
(`tok_embeddings`, `layers.N`, `output`).
"""

from __future__ import annotations

import json

from optimizer.errors import InputError
from optimizer.formats import ScheduleFormat, missing_split
from optimizer.schedule import Schedule

# torchtitan's name for a decoder's final norm (the module before the output layer).
NORM = "norm"


def layer_names(schedule: Schedule) -> list[list[str]]:
    if schedule.problem.vocab_parallel is not None:
        raise InputError(
            "format: torchtitan-modules lists the embedding and the output layer in stages; this schedule shards them "
            "over every device (vocabulary parallelism), which torchtitan's stages do not: run it with pipesched run"
        )
    stages = schedule.problem.stages
    names: list[list[str]] = []
    for s, stage in enumerate(stages):
        if stage.layers is None:
            raise missing_split("torchtitan-modules", s)
        names.append([layer.name for layer in stage.layers])
    has_norm = any(NORM in stage_names for stage_names in names)
    for stage, stage_names in zip(stages, names):
        for i, layer in enumerate(stage.layers or ()):
            if layer.kind == "head" and not has_norm:
                stage_names.insert(i, NORM)
    return names


def write(schedule: Schedule) -> str:
    return json.dumps(layer_names(schedule)) + "\n"


FORMAT = ScheduleFormat("torchtitan-modules", "the layer split as per-stage lists of module names (JSON)", ".modules.json", write)

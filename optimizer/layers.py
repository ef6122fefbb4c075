"""A per-layer profile (layers.json): the model as a sequence of layers, before it is split into stages.

A layers file lists every layer of the model in order (the embedding, each transformer
block, the head: final norm + output layer + loss) with the same per-microbatch times and
memory changes a problem gives per stage, plus what a layer holds for the whole step
whatever the schedule does (`parameters`: its weights, gradients and optimizer state).
A *split* (optimizer/split.py) groups consecutive layers into stages; a stage's times and
memory changes are the sums of its layers'. Times and memory are in whatever units the
user picks (the profiler writes milliseconds and GiB), the same units as the memory limit.

The file format is versioned like the schedule JSON and validated with the same rules
as problems: strict numbers, no NaN or Infinity, one-line errors naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from optimizer.problem import MAX_STAGES, MAX_VALUE, Duration, StageMemory, _Strict, misplaced_end

FORMAT = "pipesched.layers"
VERSION = 1

# A layer becomes at most a stage, so a model has at most as many layers as a problem has stages.
MAX_LAYERS = MAX_STAGES

LayerKind = Literal["embedding", "block", "head"]

# Megatron's layout letters for the layer kinds (--pipeline-model-parallel-layout).
LAYOUT_LETTER: dict[str, str] = {"embedding": "E", "block": "t", "head": "L"}


class Layer(_Strict):
    """One layer: its kind, per-microbatch costs and memory changes, and its fixed memory."""

    name: Annotated[str, Field(min_length=1, max_length=64)]
    kind: LayerKind = "block"
    forward: Duration
    backward_input: Duration
    backward_weight: Duration
    backward: Duration | None = None  # the fused backward BW; None: B + W
    memory: StageMemory
    parameters: Annotated[float, Field(ge=0, le=MAX_VALUE)] = 0.0


class LayersProfile(_Strict):
    """The layers of a model in order, and the transfer time of an activation between devices."""

    format: Literal["pipesched.layers"]
    # An int rather than Literal[1], which takes true and 1.0 (both equal to 1).
    version: Annotated[int, Field(ge=1, le=1)]
    layers: Annotated[list[Layer], Field(min_length=1, max_length=MAX_LAYERS)]
    comm_time: Annotated[float, Field(ge=0, le=MAX_VALUE)] = 0.0

    @model_validator(mode="after")
    def _ends_in_place(self) -> LayersProfile:
        fault = misplaced_end([layer.kind for layer in self.layers])
        if fault is not None:
            what = f"only one {fault.kind} layer is allowed" if fault.repeated else f"the {fault.kind} layer must come {fault.where}"
            raise ValueError(f"layers.{fault.position}.kind: {what}")
        # Names identify layers in the exports (torchtitan's module lists): one name, one layer.
        first: dict[str, int] = {}
        for position, layer in enumerate(self.layers):
            if layer.name in first:
                raise ValueError(f"layers.{position}.name: {layer.name!r} is also layer {first[layer.name]}'s name")
            first[layer.name] = position
        return self

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def is_layers_data(data: object) -> bool:
    """Whether parsed JSON claims to be a layers file (so `solve` can take either kind)."""
    return isinstance(data, dict) and data.get("format") == FORMAT


def layers_from_json(data: object, source: str = "layers") -> LayersProfile:
    from optimizer.io import validate_model

    return validate_model(LayersProfile, data, source)


def load_layers(path: str | Path) -> LayersProfile:
    """Read and validate a layers file; errors name the file and the field."""
    from optimizer.io import read_json

    return layers_from_json(read_json(path), str(path))


def layers_to_json(profile: LayersProfile) -> dict:
    return profile.model_dump(mode="json", exclude_none=True)

"""The per-layer profile: a model measured one layer per stage, written as a layers file.

`pipesched profile --per-layer` cuts the model one layer per stage (runtime/models.py,
`model_layers`), profiles it on one rank like any problem (runtime/profile.py: F, B, W
and fused backward times, memory kept by F and B) and turns the stages back into layers.
Each layer's fixed memory is its parameters' bytes times PARAMETER_STATE_COPIES (the
weights, their gradients and Adam's two moments, all in the parameters' dtype; a user
with another optimizer or a distributed optimizer edits `parameters` in the file).
"""

from __future__ import annotations

from collections.abc import Sequence

from optimizer.io import validate_model
from optimizer.layers import FORMAT, VERSION, LayersProfile

GIB = float(2**30)
PARAMETER_STATE_COPIES = 4


def parameter_bytes(stages: Sequence) -> list[float]:
    """Bytes of the parameters of each stage module."""
    return [float(sum(p.numel() * p.element_size() for p in stage.parameters())) for stage in stages]


def layers_profile(
    problem: dict, layers: list[tuple[str, str]], parameters: list[float], fused_backward_ms: list[float] | None
) -> LayersProfile:
    """The layers file from a one-layer-per-stage profile (problem JSON data, stage s = layer s)."""
    entries = []
    for s, ((name, kind), stage) in enumerate(zip(layers, problem["stages"])):
        entry = {
            "name": name,
            "kind": kind,
            "forward": stage["forward"],
            "backward_input": stage["backward_input"],
            "backward_weight": stage["backward_weight"],
            "memory": stage["memory"],
            "parameters": parameters[s] * PARAMETER_STATE_COPIES / GIB,
        }
        backward = stage.get("backward", fused_backward_ms[s] if fused_backward_ms else None)
        if backward is not None:
            entry["backward"] = backward
        entries.append(entry)
    data = {"format": FORMAT, "version": VERSION, "layers": entries, "comm_time": problem.get("comm_time", 0.0)}
    return validate_model(LayersProfile, data, "profile")

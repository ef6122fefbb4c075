"""Units of the 1F1B-style families: microbatches, or with token slices (microbatch, slice).

A stage's forwards run through the units microbatch by microbatch, slices in order; its
backwards microbatch by microbatch, slices in reverse, as the slice dependencies ask (a
slice's backward waits for the later slices' backwards on its stage). With one slice a
unit is a microbatch, so the families built on units are their unsliced selves.
"""

from __future__ import annotations

from optimizer.ops import Op


def forward_unit(stage: int, unit: int, slices: int, kind: str = "F") -> Op:
    """The unit-th forward of a stage: microbatch by microbatch, slices in order."""
    return Op(kind, stage, unit // slices, unit % slices)


def backward_unit(stage: int, unit: int, slices: int, kind: str = "B") -> Op:
    """The unit-th backward of a stage: microbatch by microbatch, slices in reverse (a
    slice's backward waits for the later slices' backwards)."""
    return Op(kind, stage, unit // slices, slices - 1 - unit % slices)

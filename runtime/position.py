"""Where a rank is in its schedule, kept in shared memory for the launcher to read.

A rank that hangs (a user model stuck in an op, a transfer that never comes) is stopped
by the launcher once another rank has failed. Without this the error could only say that
the rank was stopped; with it the launcher names the op the rank was in, read after the
rank has been stopped. The rank writes six integers before each op and after each step:
nothing measurable beside an op.
"""

from __future__ import annotations

from collections.abc import MutableSequence
from multiprocessing.context import BaseContext

from optimizer.ops import KINDS, Op

# Phases of a rank (the first field). UPDATING marks a write in progress: a rank stopped in
# the middle of one leaves the other fields mixed, and they are not read then.
STARTING, IN_STEP, IN_OP, FINISHING, STEP_DONE, UPDATING = range(6)
_FIELDS = 6  # phase, step, kind, stage, microbatch, slice


class RankPosition:
    """The op a rank is in (or its last step's end), as integers another process can read."""

    def __init__(self, cells: MutableSequence[int]):
        assert len(cells) == _FIELDS
        self._cells = cells

    @classmethod
    def shared(cls, context: BaseContext) -> RankPosition:
        """A position in shared memory, to pass to a rank the context starts."""
        return cls(context.RawArray("q", _FIELDS))

    def in_step(self, step: int) -> None:
        """The rank runs `step` on a runtime that does not say which op it is in (torch's)."""
        self._write(IN_STEP, step)

    def enter(self, step: int, op: Op) -> None:
        """The rank starts `op` of `step` (its waits for the op's inputs included)."""
        self._write(IN_OP, step, KINDS.index(op.kind), op.stage, op.microbatch, op.slice)

    def finishing(self, step: int) -> None:
        """The rank has run its last op of `step` and waits for its last sends."""
        self._write(FINISHING, step)

    def step_done(self, step: int) -> None:
        self._write(STEP_DONE, step)

    def _write(self, phase: int, step: int, kind: int = 0, stage: int = 0, microbatch: int = 0, slice: int = 0) -> None:
        cells = self._cells
        cells[0] = UPDATING
        cells[1], cells[2], cells[3], cells[4], cells[5] = step, kind, stage, microbatch, slice
        cells[0] = phase

    def describe(self) -> str:
        """Where the rank is, as a phrase: 'in F(stage 1, mb 3) of step 0'."""
        phase, step, kind, stage, microbatch, slice = self._cells
        if phase == IN_OP:
            return f"in {Op(KINDS[kind], stage, microbatch, slice)} of step {step}"
        if phase == FINISHING:
            return f"after its last op of step {step}, finishing the step's transfers"
        if phase == IN_STEP:
            return f"in step {step}"
        if phase == STEP_DONE:
            return f"after step {step}"
        if phase == UPDATING:
            return f"between two ops of step {step}"
        return "before its first step"

"""One pipeline stage on this rank: F, B, W and BW for a microbatch of an nn.Module.

The stage keeps, per microbatch in flight, what its later ops need: after F the input
and the output (or the loss on the last stage), after B only the weight-gradient work.
Each is dropped by the last op that needs it, which releases the autograd graph.

The last stage computes the loss in F, divided by the number of microbatches so that
the accumulated gradients equal those of the mean loss over the whole batch.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn

from runtime.backward import SplitBackward, WeightWork, backward_fused, backward_weight
from runtime.memory import MemoryMeter
from runtime.models import LossFn


@dataclass
class _InFlight:
    input: torch.Tensor | None
    output: torch.Tensor | None  # the stage output, or the scaled loss on the last stage
    work: WeightWork | None = None


class StageRunner:
    def __init__(
        self,
        module: nn.Module,
        index: int,
        num_stages: int,
        num_microbatches: int,
        loss_fn: LossFn,
        meter: MemoryMeter | None = None,
    ):
        self.module = module
        self.index = index
        self.first = index == 0
        self.last = index == num_stages - 1
        self.num_microbatches = num_microbatches
        self.loss_fn = loss_fn
        self.meter = meter
        self.split = SplitBackward(list(module.parameters()))
        # A first stage has no input gradient to pass on, so its B is skipped unless the
        # module asks for it (the synthetic model, whose B has a time of its own).
        self.input_gradient = getattr(module, "input_gradient_on_first_stage", False)
        self._loss: torch.Tensor | None = None  # this step's loss so far (last stage only)
        self._in_flight: dict[int, _InFlight] = {}

    def forward(self, mb: int, x: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        """Run the stage; returns what goes to the next stage (detached), or the loss."""
        if x.is_floating_point() and (not self.first or self.input_gradient):
            # A leaf of this stage's graph: B asks autograd for its gradient.
            x = x.detach().requires_grad_(True)
        meter = self.meter if self._measuring() else None
        with meter.forward(self.index) if meter is not None else nullcontext(lambda out: None) as keep:
            out = self.module(x)
            if self.last:
                assert target is not None, "the last stage computes the loss from the targets"
                out = self.loss_fn(out, target) / self.num_microbatches
            keep(out)
        self._in_flight[mb] = _InFlight(x, out)
        if self.last:
            self._loss = out.detach() if self._loss is None else self._loss + out.detach()
        return out.detach()

    def backward_input(self, mb: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        """Gradient of this stage's input (None on the first stage); parameters wait for W."""
        state = self._in_flight[mb]
        assert state.output is not None and state.input is not None, f"B of microbatch {mb} before its F, or twice"
        output, inputs = state.output, [state.input]
        held = lambda: state.work.nbytes() if state.work else 0  # noqa: E731
        meter = self.meter if self._measuring() else None
        with meter.backward_input(self.index, held) if meter is not None else nullcontext():
            grads, state.work = self.split.backward_input(output, grad, inputs)
            state.input = state.output = None
        return grads[0]

    def backward_weight(self, mb: int) -> None:
        state = self._in_flight.pop(mb)
        assert state.work is not None, f"W of microbatch {mb} before its B"
        backward_weight(state.work)

    def backward_fused(self, mb: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        state = self._in_flight.pop(mb)
        assert state.output is not None and state.input is not None, f"BW of microbatch {mb} before its F"
        return backward_fused(state.output, grad, [state.input])[0]

    def _measuring(self) -> bool:
        return self.meter is not None and self.meter.enabled

    def start_step(self) -> None:
        self._loss = None
        self._in_flight.clear()

    def step_loss(self) -> float | None:
        """The step's loss (the mean over its microbatches) on the last stage, else None."""
        return None if self._loss is None else float(self._loss)

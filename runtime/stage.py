"""One pipeline stage on this rank: F, B, W and BW for a microbatch (slice) of an nn.Module.

The stage keeps, per microbatch (and token slice) in flight, what its later ops need:
after F the inputs and the outputs (or the loss on the last stage), after B only the
weight-gradient work. Each is dropped by the last op that needs it, which releases the
autograd graph.

The last stage computes the loss in F, divided by the number of microbatches so that
the accumulated gradients equal those of the mean loss over the whole batch; a slice's
loss (the mean over its tokens) is also scaled by its share of the tokens.

Token slices (runtime/slicing.py): slice k's F reads the keys and values that slices
0..k-1 of the same microbatch left on this stage, as leaves; its backward also returns
their gradients, which are summed per slice until that slice's own backward starts from
its keys and values with them (extra roots). That backward is the last to need the
slice's keys and values, so it drops them: the cache is activation memory, freed by B.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn

from runtime.backward import SplitBackward, WeightWork, backward_fused, backward_weight
from runtime.memory import MemoryMeter
from runtime.models import LossFn
from runtime.slicing import SliceCache


@dataclass
class _InFlight:
    inputs: list[torch.Tensor] | None  # the stage input, then the earlier slices' keys and values read
    roots: list[torch.Tensor] | None  # the stage output (or scaled loss), then this slice's keys and values
    work: WeightWork | None = None


class StageRunner:
    def __init__(
        self,
        module: nn.Module,
        index: int,
        num_stages: int,
        num_microbatches: int,
        loss_fn: LossFn | None,  # None: the last stage's output gets its gradient from outside (vocabulary passes)
        meter: MemoryMeter | None = None,
        slice_bounds: list[tuple[int, int]] | None = None,
        input_gradient: bool = False,  # the first stage's input gradient is wanted (a sharded embedding's)
    ):
        self.module = module
        self.index = index
        self.first = index == 0
        self.last = index == num_stages - 1 and loss_fn is not None  # ends with the loss
        self.num_microbatches = num_microbatches
        self.loss_fn = loss_fn
        self.meter = meter
        self.split = SplitBackward(list(module.parameters()))
        # A first stage has no input gradient to pass on, so its B is skipped unless the
        # module asks for it (the synthetic model, whose B has a time of its own).
        self.input_gradient = input_gradient or getattr(module, "input_gradient_on_first_stage", False)
        self._loss: torch.Tensor | None = None  # this step's loss so far (last stage only)
        self._in_flight: dict[tuple[int, int], _InFlight] = {}  # (microbatch, slice) -> state
        # Token slices: [a_k, b_k) per slice, or None for whole sequences.
        self.slice_bounds = slice_bounds
        self._length = slice_bounds[-1][1] if slice_bounds else 0
        # (microbatch, slice) -> that slice's keys and values as leaves, per attention layer,
        # and the gradients the later slices' backwards sent them (flat: K, V per layer).
        self._cache: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._cache_grads: dict[tuple[int, int], list[torch.Tensor | None]] = {}

    def forward(self, mb: int, x: torch.Tensor, target: torch.Tensor | None, slice: int = 0) -> torch.Tensor:
        """Run the stage; returns what goes to the next stage (detached), or the loss."""
        if x.is_floating_point() and (not self.first or self.input_gradient):
            # A leaf of this stage's graph: B asks autograd for its gradient.
            x = x.detach().requires_grad_(True)
        cache, past = self._slice_cache(mb, slice)
        meter = self.meter if self._measuring() else None
        with meter.forward(self.index) if meter is not None else nullcontext(lambda out: None) as keep:
            out = self.module(x) if cache is None else self.module(x, cache)
            if self.last:
                assert target is not None and self.loss_fn is not None, "the last stage computes the loss from the targets"
                out = self.loss_fn(out, target) / self.num_microbatches
                if self.slice_bounds is not None:
                    start, end = self.slice_bounds[slice]
                    out = out * ((end - start) / self._length)
            keep(out)
        roots = [out]
        if cache is not None and slice + 1 < len(self.slice_bounds or ()):
            # Later slices read this slice's keys and values: they become roots of its backward.
            roots += [t for pair in cache.new for t in pair]
            self._cache[(mb, slice)] = cache.leaves()
            self._cache_grads[(mb, slice)] = [None] * (len(roots) - 1)
        self._in_flight[(mb, slice)] = _InFlight([x, *past], roots)
        if self.last:
            self._loss = out.detach() if self._loss is None else self._loss + out.detach()
        return out.detach()

    def _slice_cache(self, mb: int, slice: int) -> tuple[SliceCache | None, list[torch.Tensor]]:
        """The cache slice `slice`'s forward reads (None unsliced) and its leaves, flat."""
        if self.slice_bounds is None:
            return None, []
        earlier = [self._cache[(mb, j)] for j in range(slice)]
        layers = len(earlier[0]) if earlier else 0
        past = [([e[layer][0] for e in earlier], [e[layer][1] for e in earlier]) for layer in range(layers)]
        flat = [t for e in earlier for pair in e for t in pair]
        return SliceCache(slice, self.slice_bounds[slice][0], past), flat

    def _backward_roots(self, mb: int, slice: int, state: _InFlight, grad: torch.Tensor | None) -> tuple[list, list]:
        """The roots of a slice's backward with their gradients (its keys and values' from later slices)."""
        assert state.roots is not None
        roots, grads = [state.roots[0]], [grad]
        # A slice's keys and values got their gradients from every later slice's backward
        # (the dependencies order those first); one that got none has no root.
        for root, g in zip(state.roots[1:], self._cache_grads.pop((mb, slice), [])):
            if g is not None:
                roots.append(root)
                grads.append(g)
        self._cache.pop((mb, slice), None)  # no later slice's backward is left to read it
        return roots, grads

    def _pass_to_earlier_slices(self, mb: int, grads: list[torch.Tensor | None]) -> torch.Tensor | None:
        """Add the gradients of the earlier slices' keys and values; return the input's."""
        offset = 1
        j = 0
        while offset < len(grads):
            pending = self._cache_grads[(mb, j)]
            for i in range(len(pending)):
                g = grads[offset + i]
                if g is not None:
                    current = pending[i]
                    pending[i] = g if current is None else current + g
            offset += len(pending)
            j += 1
        return grads[0]

    def backward_input(self, mb: int, grad: torch.Tensor | None, slice: int = 0) -> torch.Tensor | None:
        """Gradient of this stage's input (None on the first stage); parameters wait for W."""
        state = self._in_flight[(mb, slice)]
        assert state.roots is not None and state.inputs is not None, f"B of microbatch {mb}.{slice} before its F, or twice"
        roots, grads = self._backward_roots(mb, slice, state, grad)
        held = lambda: state.work.nbytes() if state.work else 0  # noqa: E731
        meter = self.meter if self._measuring() else None
        with meter.backward_input(self.index, held) if meter is not None else nullcontext():
            found, state.work = self.split.backward_input(roots, grads, state.inputs)
            state.inputs = state.roots = None
        return self._pass_to_earlier_slices(mb, found)

    def backward_weight(self, mb: int, slice: int = 0) -> None:
        state = self._in_flight.pop((mb, slice))
        assert state.work is not None, f"W of microbatch {mb}.{slice} before its B"
        backward_weight(state.work)

    def backward_fused(self, mb: int, grad: torch.Tensor | None, slice: int = 0) -> torch.Tensor | None:
        state = self._in_flight.pop((mb, slice))
        assert state.roots is not None and state.inputs is not None, f"BW of microbatch {mb}.{slice} before its F"
        roots, grads = self._backward_roots(mb, slice, state, grad)
        return self._pass_to_earlier_slices(mb, backward_fused(roots, grads, state.inputs))

    def _measuring(self) -> bool:
        return self.meter is not None and self.meter.enabled

    def start_step(self) -> None:
        self._loss = None
        self._in_flight.clear()
        self._cache.clear()
        self._cache_grads.clear()

    def step_loss(self) -> float | None:
        """The step's loss (the mean over its microbatches) on the last stage, else None."""
        return None if self._loss is None else float(self._loss)

"""Per-op memory changes of a stage, for the profiler.

On a GPU the CUDA caching allocator's count of allocated bytes before and after an op
is the memory the op keeps. On CPU there is no such counter, so we count what the
autograd graph keeps alive: the storages saved for backward during F (parameters
excluded, each storage once) plus the stage output, and after B the gradients the
weight-gradient work holds until W. W frees what F and B kept, so the profiler sets
W's change to minus their sum and every stage's changes add up to zero.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch.autograd.graph import saved_tensors_hooks


class MemoryMeter:
    """Bytes kept by each F and B of this rank's stages, one sample per op."""

    def __init__(self, device: torch.device, params: list[torch.nn.Parameter]):
        self.cuda = device.type == "cuda"
        self._param_storages = {p.untyped_storage().data_ptr() for p in params}
        self.samples: dict[tuple[str, int], list[int]] = defaultdict(list)
        # Saved-tensor hooks cost time in every F: the profiler measures memory and
        # times in separate steps and switches the meter on for the memory ones only.
        self.enabled = True

    @contextmanager
    def forward(self, stage: int) -> Iterator[Callable[[torch.Tensor], object]]:
        """Measure an F; call the yielded function with the output the stage keeps."""
        if self.cuda:
            before = torch.cuda.memory_allocated()
            yield lambda out: None
            self.samples[("F", stage)].append(torch.cuda.memory_allocated() - before)
            return
        kept: dict[int, int] = {}

        def keep(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in self._param_storages:
                kept[storage.data_ptr()] = storage.nbytes()
            return t

        with saved_tensors_hooks(keep, lambda t: t):
            yield keep
        self.samples[("F", stage)].append(sum(kept.values()))

    @contextmanager
    def backward_input(self, stage: int, held_bytes: Callable[[], int]) -> Iterator[None]:
        """Measure a B; `held_bytes` says what it keeps for W (used on CPU)."""
        before = torch.cuda.memory_allocated() if self.cuda else 0
        yield
        after = torch.cuda.memory_allocated() if self.cuda else held_bytes()
        self.samples[("B", stage)].append(after - before)

"""Token slices in the executor: where each slice's tokens lie, and the keys and values a
slice's attention reads from the earlier slices of its microbatch.

Slice k of a microbatch covers tokens [a_k, b_k) of every sequence (dimension 1 of the
batch inputs, the targets and every stage output, which is how transfers size a slice). The lengths follow the problem's slice shares,
rounded on the running sum so that they add up to the sequence length exactly.

A model runs sliced when its stage modules say `token_slices = True` and take
`forward(x, cache=None)`: `cache` is a `SliceCache`, None for a whole sequence (one
slice with nothing before it), so sliced and unsliced runs share one code path. Each
attention layer hands its own keys and values to `cache.extend` and attends to what it
returns: the earlier slices' keys and values (detached leaves that require grad, one per
earlier slice) followed by its own. The stage runner keeps a slice's keys and values as
extra roots of its backward and the leaves' gradients as their root gradients
(runtime/stage.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from optimizer.errors import InputError


def slice_bounds(shares: tuple[float, ...], length: int, source: str = "schedule") -> list[tuple[int, int]]:
    """[a_k, b_k) per slice: share_k of `length` tokens each, rounded on the running sum.

    Refuses (one line) slices that would hold no token, e.g. more slices than tokens.
    """
    bounds, start, total = [], 0, 0.0
    for k, share in enumerate(shares):
        total += share
        end = length if k == len(shares) - 1 else round(total * length)
        if end <= start:
            raise InputError(
                f"{source}: slice {k} (share {share:g}) of {len(shares)} gets no token of the model's {length}-token sequences"
            )
        bounds.append((start, end))
        start = end
    return bounds


@dataclass
class SliceCache:
    """What one stage's forward of one slice reads and leaves behind.

    `past[layer]` lists the leaves of the earlier slices' keys (then values, see
    `extend`) for each attention layer, in slice order; `new` collects this slice's own.
    """

    slice: int  # the slice's index in its microbatch
    start: int  # position of the slice's first token in the sequence
    past: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = field(default_factory=list)
    new: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def extend(self, keys: torch.Tensor, values: torch.Tensor, dim: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's keys and values along `dim` (the token axis), earlier slices first."""
        layer = len(self.new)
        self.new.append((keys, values))
        if layer >= len(self.past) or not self.past[layer][0]:
            return keys, values
        past_keys, past_values = self.past[layer]
        return torch.cat([*past_keys, keys], dim=dim), torch.cat([*past_values, values], dim=dim)

    def leaves(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This slice's keys and values as leaves for the later slices to read."""
        return [(k.detach().requires_grad_(True), v.detach().requires_grad_(True)) for k, v in self.new]


def causal_mask(queries: int, keys: int, device: torch.device) -> torch.Tensor:
    """True where query i (the last `queries` of `keys` positions) may attend to key j."""
    return torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)

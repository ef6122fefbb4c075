"""The controllable-memory paper's family of V building blocks (Qi et al. 2024, "Pipeline
Parallelism with Controllable Memory", NeurIPS, section 3.1 and appendix A).

A block fixes device 0's four ops (chunk-0 forward first, then chunk-1 forward, chunk-1
backward and chunk-0 backward at any other three slots of the 6-slot period) and how the
slots shift from one device to the next: the chunk-0 forward and chunk-1 backward, which
flow down the V, k slots later (k = 1 to 5), the chunk-1 forward and chunk-0 backward,
which flow back up, one slot earlier; the shift k may change once along the pipeline.
Within the period that fixes every device's slots; the absolute slots follow the
dependency chain (chunk-0 forwards down the devices, chunk-1 forwards back up, then the
backwards the same way), each op in the first slot of its phase after the one before it.

`v_auto`'s own family (optimizer.schedules.v_auto) shifts the two downward flows by
different slopes and leaves the upward ones one slot a device; this family shares one
shift for both and adds shifts of 4 and 5, so the two meet different memory levels. The
peak a block reaches in the steady state (`steady_peak`) ranks it for a limit without
building it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import permutations

from optimizer.schedules.block_reorder import block_slots
from optimizer.schedules.building_block import B0, B1, F0, F1, W0, W1

_PERIOD = 6
# Per-hop shift of [F0, F1, B1, B0]'s phase: downward flows k later, upward ones 1 earlier.
_SHIFTS = tuple((k, -1, k, -1) for k in range(1, _PERIOD))

Block = tuple[tuple[int, ...], ...]


@lru_cache(maxsize=8)
def paper_blocks(p: int) -> tuple[Block, ...]:
    """Every block of the family on p devices as [F0, F1, B1, B0] slots per device, once each
    (in a fixed order: the result is deterministic)."""
    blocks: dict[Block, None] = {}
    for rest in permutations(range(1, _PERIOD), 3):
        first = (0, *rest)
        for i, before in enumerate(_SHIFTS):
            leading = _walk(first, before, p)  # the rows up to any bend
            for after in _SHIFTS[: i + 1]:
                if p == 1:
                    blocks.setdefault(_absolute(leading), None)
                    continue
                # One shift throughout: every bend gives the same block.
                for bend in range(1, p) if after != before else (1,):
                    if bend >= len(leading):
                        break  # two ops of a device share a slot before the bend
                    trailing = _walk(leading[bend], after, p - bend)
                    if len(trailing) == p - bend:
                        blocks.setdefault(_absolute(leading[:bend] + trailing), None)
    return tuple(blocks)


def _walk(row: tuple[int, ...], shift: Sequence[int], count: int) -> list[tuple[int, ...]]:
    """`row` and the next rows, each `shift` after the one before, up to `count` rows in
    all, stopping before the first whose four phases are not distinct (its device would
    run two ops in one slot of the period)."""
    rows = [row]
    while len(rows) < count:
        nxt = tuple((x + s) % _PERIOD for x, s in zip(rows[-1], shift))
        if len(set(nxt)) < 4:
            break
        rows.append(nxt)
    return rows


def _absolute(phases: Sequence[Sequence[int]]) -> Block:
    p = len(phases)
    slots = [[0] * 4 for _ in range(p)]
    last = -1

    def next_at(device: int, kind: int) -> None:
        nonlocal last
        slot = last + 1 + (phases[device][kind] - last - 1) % _PERIOD
        slots[device][kind] = last = slot

    for device in range(p):
        next_at(device, F0)
    for device in reversed(range(p)):
        next_at(device, F1)
    for device in range(p):
        next_at(device, B1)
    for device in reversed(range(p)):
        next_at(device, B0)
    return tuple(tuple(row) for row in slots)


def steady_peak(offsets: Sequence[Sequence[int]], above: int | None = None) -> int:
    """The most chunk activations any device holds once the block repeats every period:
    a chunk's activation lives from its forward to its W (W's as `block_reorder` places
    them); the warm-up and cool-down of a repeated block hold no more. With `above`, the
    first device's count over it as soon as one is found (a value over `above`, not
    necessarily the peak): the other devices are not looked at."""
    peak = 0
    for row in offsets:
        if above is not None and peak > above:
            return peak
        slot = block_slots(row)
        if slot is None:
            raise ValueError("two ops of a device share a slot of the period")
        lives = ((slot[F0], slot[W0]), (slot[F1], slot[W1]))
        base = _PERIOD * (max(slot.values()) // _PERIOD + 1)
        for phase in range(_PERIOD):
            t = base + phase
            peak = max(peak, sum((t - start) // _PERIOD - (t - end) // _PERIOD for start, end in lives))
    return peak


@lru_cache(maxsize=8)
def paper_blocks_within(p: int, cap: int) -> tuple[Block, ...]:
    """The family's blocks on p devices whose steady peak is at most `cap`, highest peak
    first (ties in the family's order): `paper_blocks_by_peak` filtered, without the full
    peak of the blocks over the cap (at p = 256 under a tight limit, most of them: 20 s
    for every block's peak there)."""
    fitting = [(peak, block) for block in paper_blocks(p) if (peak := steady_peak(block, above=cap)) <= cap]
    return tuple(block for _, block in sorted(fitting, key=lambda pair: -pair[0]))


@lru_cache(maxsize=8)
def paper_blocks_by_peak(p: int) -> tuple[tuple[int, Block], ...]:
    """The family on p devices with each block's steady peak, highest peak first (ties in
    the family's order)."""
    return tuple(sorted(((steady_peak(block), block) for block in paper_blocks(p)), key=lambda pair: -pair[0]))

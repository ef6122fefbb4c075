"""Building blocks repeated, squeezed and then reordered (after Qi et al. 2024, "Pipeline
Parallelism with Controllable Memory", NeurIPS, section 3: "repeating, squeezing and
reordering").

`building_block` squeezes a repeated block and stops there: its warm-up and cool-down keep
the block's shape. The paper goes on to reorder both ends, and between V-Min's and
V-Half's memory that is where most of the idle is. This module does it on a slot grid
(one row of unit slots per device, a cell holding one op kind; the k-th cell of a kind on
a row is microbatch k), in this order:

1. repeat: the block's four ops (F and B of both chunks) every 6 slots, each W in the
   first slot after its B that the block leaves free, for max(m, 2p) microbatches (enough
   for the steady state to form before the ends are reshaped);
2. squeeze: every op to the earliest slot after its input and its device's previous op
   (the device order is kept);
3. warm-up: each device's ops before its first chunk-0 backward are laid out anew. Device
   i starts after i slots (the first forward's arrival), runs chunk-0 forwards for
   2(p-1-i) slots (the time the V takes to come back to it), then i+1 pairs of chunk-0
   and chunk-1 forwards, then rounds of (chunk-1 B, its W, a forward). It holds at most
   min(i+1, peak//2) chunk-1 activations in the warm-up and fills the rest of the peak with
   chunk-0 ones, so deeper devices, which the V reaches earlier, start their second chunk
   sooner;
4. the extra microbatches are dropped and the grid squeezed again;
5. cool-down: after its last chunk-1 forward each device takes its last chunk-0 backwards
   ((peak+1)//2 of them) and last chunk-1 backwards (at most i+1) out of the block's
   rhythm and puts them back every other slot, in a staircase that follows the V's
   drain; enough W's are taken out of the tail to free the peak and are run afterwards,
   in free slots or at the end;
6. idle slots are filled: each empty slot takes the first later op of each kind on its
   device whose input is already done, unless it is a forward that would raise the
   device's peak (both the grid before this step and after it are returned: in slots
   filling never loses, with the real op times it sometimes does);
7. W's are relabelled first in, first out (a W slot runs the oldest pending W of either
   chunk).

Memory is counted in chunk activations (a forward +1, a W -1), as the paper does: a
reshaped grid is kept only if its peak stays within the cap, the squeezed block's own
peak or, where the limit leaves more room, the limit in chunk activations (then the
warm-up, cool-down and idle slots use that room: 14.6B p16 m48 at 14, 1678.1 -> 1635.5 ms). Every step
keeps the slot model's dependencies; what does not fit its assumptions (a warm-up that
would run into the first backward, a cool-down slot already taken) is skipped, and a grid
that cannot be built at all gives no order. The result is an order: the simulator times it
with the real op times and says whether it fits the real limit.

Measured (benchmarks/limits.py, 14.6B p16 m48 on the V placement, `v_auto`'s blocks): at a
limit of 8 activations the reordered blocks give 1957.0 ms where the squeezed ones give
2010.6; at 12, 1678.1 against 1729.5. At V-Half's own level the squeezed V-Half block
beats the reordered ones with idle filling (1773.1 against 1792.8) and loses to the best
one without it (1767.3), which is why `v_auto` builds all three kinds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import accumulate

from optimizer.schedules.building_block import B0, B1, CHUNK_DELTAS, F0, F1, W0, W1, slot_op
from optimizer.schedules.registry import Orders

_PERIOD = 6
EMPTY = -1
_KINDS = (F0, F1, B1, B0, W1, W0)
_W_OF = {B1: W1, B0: W0}
# The order in which a slot's ops are placed when the grid is squeezed: those that flow
# from device 0 down the V first (device 0 to p-1), then those that flow back up.
_DOWN = (F0, B1, W1)
_UP = (F1, B0, W0)

Grid = list[list[int]]
# Chunk activations an op kind adds (building_block's count, in whole numbers here).
_CHUNK_DELTA: tuple[int, ...] = tuple(int(d) for d in CHUNK_DELTAS)


class _Unbuildable(Exception):
    """The grid does not fit a step's assumptions (the block's shape is too far off)."""


def reordered_block_orders(offsets: Sequence[Sequence[int]], m: int, caps: Sequence[int] = (0,)) -> list[Orders]:
    """Per-device orders from block offsets [F0, F1, B1, B0] per device (as in
    `building_block`), repeated, squeezed and reordered (see the module doc), once per cap
    in `caps` (the most chunk activations a device may hold; below the squeezed block's own
    peak that peak is the cap instead, so caps that come to the same give one build): each
    with idle slots filled and without (with the real op times, filling can lose: 14.6B
    p16 m48 at V-Half's 9 activations 1792.8 filled, 1767.3 not). Orders that come out the
    same are given once; none when the block cannot be built this way."""
    p = len(offsets)
    repeated = max(m, 2 * p)
    try:
        squeezed = _squeeze(_repeat(offsets, repeated))
    except _Unbuildable:
        return []
    own = _peak(squeezed)
    built: list[Orders] = []
    for cap in sorted({max(c, own) for c in caps}):
        try:
            warmed = _reshaped(squeezed, lambda g, cap=cap: _squeeze(_warm_up(g, repeated, cap)), cap)
            grid = _squeeze(_keep_first([list(row) for row in warmed], m))  # `warmed` may be `squeezed` itself
            grid = _reshaped(grid, lambda g, cap=cap: _squeeze(_cool_down(g, m, cap)), cap)
            unfilled = [list(row) for row in grid]
            for orders in (_orders(_relabel_w(_fill_idle(grid, cap)), m), _orders(_relabel_w(unfilled), m)):
                if orders not in built:
                    built.append(orders)
        except _Unbuildable:
            continue
    return built


def _reshaped(grid: Grid, step, cap: int) -> Grid:
    """The grid after `step` when that works and does not raise its peak; else the grid."""
    try:
        new = step([list(row) for row in grid])
    except _Unbuildable:
        return grid
    return new if _peak(new) <= cap else grid


def _row_peak(row: Sequence[int]) -> int:
    return max(accumulate(_CHUNK_DELTA[kind] for kind in row if kind != EMPTY), default=0)


def _peak(grid: Grid) -> int:
    return max(_row_peak(row) for row in grid)


def _input(kind: int, device: int, p: int) -> tuple[int, int] | None:
    """(device, kind) of the op the same microbatch must finish first; a W's B is on its own
    row before it, which the device order already keeps."""
    if kind == F0:
        return (device - 1, F0) if device > 0 else None
    if kind == F1:
        return (device + 1, F1) if device < p - 1 else (device, F0)
    if kind == B1:
        return (device - 1, B1) if device > 0 else (device, F1)
    if kind == B0:
        return (device + 1, B0) if device < p - 1 else (device, B1)
    return None


# -- 1. repeat -----------------------------------------------------------------------------


def block_slots(row: Sequence[int]) -> dict[int, int] | None:
    """One device's block as {kind: slot} with its two W's, each in the first slot after
    its B that the block leaves free in the period; None when two ops share a slot of it."""
    slot = dict(zip((F0, F1, B1, B0), row))
    taken = {s % _PERIOD for s in row}
    if len(taken) < 4:
        return None
    for b in (B1, B0):
        slot[_W_OF[b]] = next(slot[b] + k for k in range(1, _PERIOD) if (slot[b] + k) % _PERIOD not in taken)
        taken.add(slot[_W_OF[b]] % _PERIOD)
    return slot


def _repeat(offsets: Sequence[Sequence[int]], microbatches: int) -> Grid:
    width = max(max(row) for row in offsets) + _PERIOD * (microbatches + 2)
    grid = [[EMPTY] * width for _ in offsets]
    for device, row in enumerate(offsets):
        slot = block_slots(row)
        if slot is None:
            raise _Unbuildable
        for j in range(microbatches):
            for kind, first in slot.items():
                grid[device][first + _PERIOD * j] = kind
    return grid


# -- 2. squeeze ----------------------------------------------------------------------------


def _squeeze(grid: Grid) -> Grid:
    """Each op to the earliest slot after its input's and its device's previous op."""
    p = len(grid)
    width = len(grid[0])
    # Ops in slot order; within a slot, those flowing down the V by device, then those
    # flowing back up by device from the bottom (an op's input is then always placed).
    rank = {kind: 0 for kind in _DOWN} | {kind: 1 for kind in _UP}
    events = sorted(
        (j * 2 * p + (device if rank[kind] == 0 else 2 * p - 1 - device), device, kind)
        for device, row in enumerate(grid)
        for j, kind in enumerate(row)
        if kind != EMPTY
    )
    out = [[EMPTY] * width for _ in range(p)]
    next_free = [0] * p
    placed: list[list[list[int]]] = [[[] for _ in range(7)] for _ in range(p)]  # device, kind -> slot per microbatch
    inputs = [[_input(kind, device, p) for kind in range(7)] for device in range(p)]
    for _, device, kind in events:
        mine = placed[device][kind]
        at = next_free[device]
        source = inputs[device][kind]
        if source is not None:
            theirs = placed[source[0]][source[1]]
            if len(theirs) <= len(mine):  # the input comes later in the grid: not a valid order
                raise _Unbuildable
            at = max(at, theirs[len(mine)] + 1)
        if at >= width:
            raise _Unbuildable
        out[device][at] = kind
        mine.append(at)
        next_free[device] = at + 1
    used = max(next_free)
    return [row[:used] for row in out]


# -- 3. warm-up ----------------------------------------------------------------------------


def _warm_up(grid: Grid, microbatches: int, cap: int) -> Grid:
    p = len(grid)
    peak = min(cap, 2 * p)
    for device, row in enumerate(grid):
        if B0 not in row:
            raise _Unbuildable
        end = row.index(B0)
        count = [0] * 7
        for j in range(end):
            if row[j] != EMPTY:
                count[row[j]] += 1
                row[j] = EMPTY
        if count[W0]:
            raise _Unbuildable
        second = min(device + 1, peak // 2, microbatches)  # chunk-1 activations held
        first = min(peak - second, microbatches)
        used = [0] * 7
        cursor = device

        def put(kind: int, wanted: bool) -> None:
            nonlocal cursor
            if wanted:
                if cursor >= end:
                    raise _Unbuildable
                row[cursor] = kind
                used[kind] += 1
            cursor += 1

        for _ in range(2 * (p - 1 - device)):
            put(F0, used[F0] < min(first, count[F0]))
        for _ in range(device + 1):
            put(F0, used[F0] < min(first, count[F0]))
            put(F1, used[F1] < min(second, count[F1]))
        while any(used[k] < count[k] for k in (F0, F1, B1, W1)):
            put(B1, used[B1] < count[B1])
            put(W1, used[W1] < count[W1])
            if used[F1] < count[F1]:
                put(F1, True)
            else:
                put(F0, used[F0] < count[F0])
    return grid


# -- 4. drop the extra microbatches ---------------------------------------------------------


def _keep_first(grid: Grid, m: int) -> Grid:
    for row in grid:
        seen = [0] * 7
        for j, kind in enumerate(row):
            if kind == EMPTY:
                continue
            if seen[kind] >= m:
                row[j] = EMPTY
            else:
                seen[kind] += 1
    return grid


# -- 5. cool-down --------------------------------------------------------------------------


def _cool_down(grid: Grid, m: int, cap: int) -> Grid:
    p = len(grid)
    peak = cap
    last_b0s = min((peak + 1) // 2, m)
    last_b1s = min(peak - last_b0s, m)
    if F1 not in grid[0]:
        raise _Unbuildable
    anchor = max(j for j, kind in enumerate(grid[0]) if kind == F1)  # device 0's last chunk-1 F
    for device, row in enumerate(grid):
        taken = [0] * 7
        for j in range(len(row) - 1, -1, -1):
            if row[j] == B1 and taken[B1] < min(device + 1, last_b1s):
                row[j] = EMPTY
                taken[B1] += 1
            elif row[j] == B0 and taken[B0] < last_b0s:
                row[j] = EMPTY
                taken[B0] += 1
        for j in range(len(row) - 1, -1, -1):  # W's out of the tail: they run after the B's
            if taken[W1] >= taken[B1] and taken[W0] >= taken[B0] and taken[W1] + taken[W0] >= peak:
                break
            if row[j] in (W1, W0):
                taken[row[j]] += 1
                row[j] = EMPTY
        row.extend([EMPTY] * max(0, anchor + 2 * p + 1 - len(row)))
        for k in range(taken[B0]):
            _place(row, anchor - device + 2 * p - 2 * k, B0)
        for k in range(taken[B1]):
            _place(row, anchor + 1 + device - 2 * k, B1)
    for row in grid:
        _put_back_w(row)
    width = max(len(row) for row in grid)
    for row in grid:
        row.extend([EMPTY] * (width - len(row)))
    return grid


def _place(row: list[int], slot: int, kind: int) -> None:
    if not 0 <= slot < len(row) or row[slot] != EMPTY:
        raise _Unbuildable
    row[slot] = kind


def _put_back_w(row: list[int]) -> None:
    """The W's taken out: into free slots after the row's last W, then at its end."""
    last_w = max((j for j, kind in enumerate(row) if kind in (W1, W0)), default=-1)
    pending = {W1: 0, W0: 0}
    for j, kind in enumerate(row):
        if kind in _W_OF:
            pending[_W_OF[kind]] += 1
        elif kind in pending:
            pending[kind] -= 1
        elif kind == EMPTY and j > last_w:
            for w in (W1, W0):
                if pending[w] > 0:
                    row[j] = w
                    pending[w] -= 1
                    break
    row.extend([W1] * pending[W1] + [W0] * pending[W0])


# -- 6. fill idle slots --------------------------------------------------------------------


def _fill_idle(grid: Grid, peak: int) -> Grid:
    p = len(grid)
    width = len(grid[0])
    last = [[-1] * 7 for _ in range(p)]
    for device, row in enumerate(grid):
        for j, kind in enumerate(row):
            if kind != EMPTY:
                last[device][kind] = j
    usage = [0] * p
    seen = [[0] * 7 for _ in range(p)]
    placed: dict[tuple[int, int, int], int] = {}

    def run(device: int, kind: int, j: int) -> None:
        placed[(device, kind, seen[device][kind])] = j
        seen[device][kind] += 1
        usage[device] += _CHUNK_DELTA[kind]

    for j in range(width):
        for device, row in enumerate(grid):
            if row[j] != EMPTY:
                run(device, row[j], j)
                continue
            candidates = {k for k in _KINDS if last[device][k] > j}
            change = highest = 0
            for t in range(j + 1, width):
                if not candidates:
                    break
                kind = row[t]
                if kind == EMPTY:
                    continue
                # the highest the row climbs between this slot and t, before t's op
                before, change = highest, change + _CHUNK_DELTA[kind]
                highest = max(highest, change)
                if kind not in candidates:
                    continue
                candidates.discard(kind)
                if _CHUNK_DELTA[kind] > 0 and usage[device] + before >= peak:
                    continue
                if not _ready(kind, device, seen, placed, j, p):
                    continue
                row[j], row[t] = kind, EMPTY
                run(device, kind, j)
                break
    return grid


def _ready(kind: int, device: int, seen: list[list[int]], placed: dict[tuple[int, int, int], int], j: int, p: int) -> bool:
    """Whether the next op of `kind` on `device` has its input done before slot j."""
    mb = seen[device][kind]
    if kind in (W1, W0):
        return seen[device][B1 if kind == W1 else B0] > mb
    source = _input(kind, device, p)
    if source is None:
        return True
    done = placed.get((source[0], source[1], mb))
    return done is not None and done < j


# -- 7. W's first in, first out ---------------------------------------------------------------


def _relabel_w(grid: Grid) -> Grid:
    for row in grid:
        pending: deque[int] = deque()
        for j, kind in enumerate(row):
            if kind in _W_OF:
                pending.append(_W_OF[kind])
            elif kind in (W1, W0):
                if not pending:
                    raise _Unbuildable
                row[j] = pending.popleft()
    return grid


def _orders(grid: Grid, m: int) -> Orders:
    p = len(grid)
    orders: Orders = []
    for device, row in enumerate(grid):
        seen = [0] * 7
        ops = []
        for kind in row:
            if kind == EMPTY:
                continue
            ops.append(slot_op(kind, device, p, seen[kind]))
            seen[kind] += 1
        if any(seen[k] != m for k in _KINDS):
            raise _Unbuildable
        orders.append(ops)
    return orders

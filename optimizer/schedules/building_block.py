"""Schedules from a repeated building block on the V placement (Qi et al. 2024,
"Pipeline Parallelism with Controllable Memory", NeurIPS, section 3).

A building block fixes, for each device, the slot of the four ops of one microbatch:
F of chunk 0, F of chunk 1, B of chunk 1, B of chunk 0 (chunk 0 = stage r, chunk 1 =
stage 2p-1-r on device r). Microbatch j runs the block shifted by 6j slots, so a device
repeats it every six slots; the two free slots per period take the W's. The block's
lifespan sets the peak memory; the offsets in `v_half` and `v_min` are the paper's.

The repeated blocks leave gaps in the warm-up and cool-down. Following the paper, they
are squeezed out greedily: in slot order, each op moves to the earliest free slot after
its dependencies unless that raises the device's peak memory. Two passes: one with the
W's placed (it squeezes warm-up and cool-down), one without (cool-down only, W's then
re-filled into free slots, W of chunk 1 first). Slots are unit time; the simulator
retimes the resulting order with the real op times.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from optimizer.ops import Op
from optimizer.problem import tolerant
from optimizer.schedules.registry import Orders

# Op types of the slot model, in the paper's order.
F0, F1, B1, B0, W, W1, W0 = range(7)
_FORWARDS = (F0, F1)
_BACKWARDS = (B1, B0)
_PERIOD = 6


# Chunk activations, the paper's memory count: F allocates one, W frees one, B leaves it
# (the W still needs it). Indexed by op type.
CHUNK_DELTAS: tuple[float, ...] = (1, 1, 0, 0, -1, -1, -1)


def device_deltas(tables, p: int, r: int) -> tuple[float, ...]:
    """Device r's real memory changes by op type (F0, F1, B1, B0, W, W1, W0) on the V
    placement. W (a W of either chunk, before they are told apart) frees the lesser of
    the two, so the walk never shows less memory than the real order holds."""
    low, high = r, 2 * p - 1 - r
    w1, w0 = tables.mem_backward_weight[high], tables.mem_backward_weight[low]
    return (
        tables.mem_forward[low],
        tables.mem_forward[high],
        tables.mem_backward_input[high],
        tables.mem_backward_input[low],
        max(w1, w0),
        w1,
        w0,
    )


class _Timeline:
    """One device's slots: at most one op per slot, plus a cached memory walk.

    With `implicit_w`, W's are not placed: each free slot runs one pending W, which is
    how the paper measures memory before the W's are decided. `deltas`: the memory
    change of each op type (CHUNK_DELTAS, or a device's real ones).
    """

    def __init__(self, times: dict[int, list[int]], implicit_w: bool, deltas: tuple[float, ...] = CHUNK_DELTAS):
        self.times = times
        self.implicit_w = implicit_w
        self.deltas = deltas
        end = max(t for ts in times.values() for t in ts) + 1
        self.cells: list[int | None] = [None] * end
        for kind, ts in times.items():
            for t in ts:
                assert self.cells[t] is None, "two ops in one slot"
                self.cells[t] = kind
        self.states = self._walk(0, (0, 0), None)
        self.peak = max((s[0] for s in self.states), default=0)
        # With W's placed, the usage after each slot, as an array (earliest_fit and move
        # update it in slices); the walk's states serve the implicit W's.
        self.usage = None if implicit_w else np.array([s[0] for s in self.states], dtype=float)

    def _step(self, kind: int | None, state: tuple[float, int]) -> tuple[float, int]:
        usage, pending = state
        if kind is None:
            if self.implicit_w and pending:
                return usage + self.deltas[W], pending - 1
            return state
        if self.implicit_w and kind in _BACKWARDS:
            pending += 1
        return usage + self.deltas[kind], pending

    def _walk(self, start: int, state: tuple[float, int], cells: list | None) -> list[tuple[float, int]]:
        cells = self.cells if cells is None else cells
        out = []
        for t in range(start, len(cells)):
            state = self._step(cells[t], state)
            out.append(state)
        return out

    def _fits_walking(self, kind: int, old: int, new: int, cap: float) -> bool:
        """Would moving the op of `kind` from slot `old` to free slot `new` keep the peak <= cap?
        (Implicit W's: the walk's states are kept up to date only then.)"""
        cap = tolerant(cap)  # real deltas are float sums
        state = self.states[new - 1] if new > 0 else (0, 0)
        for t in range(new, len(self.cells)):
            cell = kind if t == new else None if t == old else self.cells[t]
            state = self._step(cell, state)
            if state[0] > cap:
                return False
            if t >= old and state == self.states[t]:
                return True  # the walk has rejoined the cached one; the rest is unchanged
        return True

    def earliest_fit(self, kind: int, old: int, lo: int, cap: float) -> int | None:
        """The earliest free slot in [lo, old) the op of `kind` at `old` can move to with
        the peak <= cap (at least the timeline's peak, as the squeeze's caps are), or None.

        With W's placed, a move changes the usage by the op's delta on [new, old) only, so
        the slots that fit are those after the last one where usage + delta exceeds the
        cap: one backward pass finds them, where trying each slot walked the rest of the
        interval every time (quadratic in the gap: 2.5 of v-half's 2.7 s at p = 256).
        """
        if self.usage is None:
            return next((new for new in range(lo, old) if self.cells[new] is None and self._fits_walking(kind, old, new, cap)), None)
        first = lo
        delta = self.deltas[kind]
        if delta > 0 and lo < old:
            over = np.flatnonzero(self.usage[lo:old] > tolerant(cap) - delta)  # real deltas are float sums
            first = lo + int(over[-1]) + 1 if len(over) else lo
        return next((new for new in range(first, old) if self.cells[new] is None), None)

    def move(self, kind: int, index: int, new: int) -> None:
        old = self.times[kind][index]
        self.cells[old], self.cells[new] = None, kind
        self.times[kind][index] = new
        if self.usage is not None:  # the usage moves by the op's delta on [new, old) only (earliest_fit)
            self.usage[new:old] += self.deltas[kind]
            return
        state = self.states[new - 1] if new > 0 else (0, 0)
        for t in range(new, len(self.cells)):
            state = self._step(self.cells[t], state)
            if t >= old and state == self.states[t]:
                break  # the walk has rejoined the cached one; the rest is unchanged
            self.states[t] = state


def _put_w(times: dict[int, list[int]], split: bool) -> dict[int, list[int]]:
    """Fill free slots with the pending W's in B order (split: one list per chunk, chunk 1 first)."""
    events = sorted((t, kind) for kind, ts in times.items() for t in ts)
    out = {kind: list(ts) for kind, ts in times.items()}
    w_kinds = (W1, W0) if split else (W, W)
    for kind in set(w_kinds):
        out[kind] = []
    pending = {B1: 0, B0: 0}
    at = {t: kind for t, kind in events}
    slot = 0
    end = events[-1][0] + 1
    while slot < end or pending[B1] or pending[B0]:
        event = at.get(slot)
        if event is not None:
            if event in _BACKWARDS:
                pending[event] += 1
        else:
            for b, w in zip((B1, B0), w_kinds):
                if pending[b]:
                    pending[b] -= 1
                    out[w].append(slot)
                    break
        slot += 1
    return out


def _deps(all_times: list[dict[int, list[int]]], r: int, kind: int, mb: int) -> int:
    """Latest slot an op must follow (it may take any free slot after it)."""
    p = len(all_times)
    own = all_times[r]
    after = -1
    if kind in (F0, B1) and r > 0:  # chunk 0 forward and chunk 1 backward flow down the devices
        after = max(after, all_times[r - 1][kind][mb])
    if kind in (F1, B0) and r + 1 < p:
        after = max(after, all_times[r + 1][kind][mb])
    if kind in (F1, B1, B0):  # the V's turn: previous op of the same microbatch on this device
        after = max(after, own[kind - 1][mb])
    if kind == W:
        after = max(after, sorted(own[B1] + own[B0])[mb])
    if mb > 0:
        after = max(after, own[kind][mb - 1])
    return after


def _squeeze(
    all_times: list[dict[int, list[int]]],
    with_w: bool,
    caps: Sequence[float] | None,
    deltas: Sequence[tuple[float, ...]] | None,
) -> list[dict[int, list[int]]]:
    """Move ops to earlier free slots (see the module doc) while each device's walk stays
    within its cap: `caps` per device, or the block's own peak (the largest over devices)."""
    lines = [
        _Timeline({k: list(v) for k, v in t.items()}, implicit_w=not with_w, deltas=CHUNK_DELTAS if deltas is None else deltas[r])
        for r, t in enumerate(all_times)
    ]
    times = [line.times for line in lines]
    own = max(line.peak for line in lines)
    cap = [own] * len(lines) if caps is None else [max(c, line.peak) for c, line in zip(caps, lines)]
    m = len(times[0][F0])
    queue = sorted((t, r, kind, mb) for r, ts in enumerate(times) for kind, lst in ts.items() for mb, t in enumerate(lst))
    # The steady state, from device 0's first B of chunk 0 to the first last-microbatch
    # F of chunk 0, stays as the block put it; the warm-up is squeezed only with W's placed.
    phase = 0
    for slot, r, kind, mb in queue:
        if phase == 0 and kind == B0 and r == 0:
            phase = 1
        if phase == 1:
            if kind == F0 and mb == m - 1:
                phase = 2
            continue
        if phase == 0 and not with_w:
            continue
        line = lines[r]
        new = line.earliest_fit(kind, slot, _deps(times, r, kind, mb) + 1, cap[r])
        if new is not None:
            line.move(kind, mb, new)
    return times


def building_block_orders(
    offsets: list[list[int]],
    m: int,
    caps: Sequence[float] | None = None,
    deltas: Sequence[tuple[float, ...]] | None = None,
) -> Orders:
    """Per-device orders from block offsets [F0, F1, B1, B0] per device, for m microbatches.

    The squeeze keeps every device within the block's own peak (the paper's rule), or
    within `caps` per device: a memory limit above the block's peak lets the warm-up and
    cool-down run denser than the block. Memory is counted in chunk activations, or
    with `deltas` per device (`device_deltas`: the problem's own changes, B's frees
    included). Either way the order is a valid order; whether it fits a limit is for the
    simulator to say (the W's are placed anew after the squeeze).
    """
    p = len(offsets)
    times = [{kind: [o + _PERIOD * j for j in range(m)] for kind, o in zip((F0, F1, B1, B0), row)} for row in offsets]
    times = _squeeze([_put_w(t, split=False) for t in times], True, caps, deltas)
    times = [{k: v for k, v in t.items() if k != W} for t in times]
    times = _squeeze(times, False, caps, deltas)
    orders: Orders = []
    for r, t in enumerate(_put_w_all(times)):
        ops = sorted((slot, kind, mb) for kind, lst in t.items() for mb, slot in enumerate(lst))
        orders.append([slot_op(kind, r, p, mb) for _, kind, mb in ops])
    return orders


def slot_op(kind: int, device: int, p: int, microbatch: int) -> Op:
    """The op a slot of `kind` (F0, F1, B1, B0, W1, W0) on `device` runs for `microbatch`:
    chunk 0 is stage `device`, chunk 1 stage 2p-1-device (the V placement)."""
    name = "F" if kind in _FORWARDS else "B" if kind in _BACKWARDS else "W"
    stage = device if kind in (F0, B0, W0) else 2 * p - 1 - device
    return Op(name, stage, microbatch)


def _put_w_all(times: list[dict[int, list[int]]]) -> list[dict[int, list[int]]]:
    return [_put_w(t, split=True) for t in times]

"""Building blocks repeated, squeezed and reordered (optimizer.schedules.block_reorder):
valid orders for any block of v-auto's family, any p and m, within the chunk-activation
cap; and what the reordering buys v-auto between the blocks' memory levels."""

from __future__ import annotations

from itertools import accumulate

import pytest
from factories import published_v_auto

from optimizer.exact.incumbents import objective_value
from optimizer.problem import uniform_problem
from optimizer.schedules.block_reorder import _peak, _repeat, _squeeze, reordered_block_orders
from optimizer.schedules.v_auto import candidate_blocks
from optimizer.schedules.v_half import v_half_offsets
from optimizer.schedules.v_min import v_min_offsets
from optimizer.simulate import simulate
from optimizer.validate import validate


def chunk_peak(order) -> int:
    """The most chunk activations a device's order holds: a forward +1, a W -1."""
    return max(accumulate(1 if op.kind == "F" else -1 if op.kind == "W" else 0 for op in order))


def own_peak(offsets, m: int) -> int:
    p = len(offsets)
    return _peak(_squeeze(_repeat(offsets, max(m, 2 * p))))


@pytest.mark.slow
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("m", [1, 3, 8, 20])
def test_reordered_blocks_are_valid_orders_within_the_cap(p, m):
    problem = uniform_problem(p, m, 1.0, 1.1, 0.6, comm_time=0.05, placement="vshape")
    blocks = [[list(r) for r in b.offsets] for b in candidate_blocks(problem)]
    built = 0
    for offsets in blocks[:12] + [v_min_offsets(p), v_half_offsets(p)]:
        for cap in (0, 2 * p):
            for orders in reordered_block_orders(offsets, m, [cap]):
                built += 1
                schedule = simulate(problem, orders)  # raises on a deadlock
                assert validate(problem, schedule.devices) == []
                assert max(chunk_peak(order) for order in orders) <= max(cap, own_peak(offsets, m))
    assert built > 0  # V-Min's block at least is always buildable


def test_a_block_whose_ops_collide_in_the_period_is_refused():
    # F0 and B1 of device 0 in the same slot modulo 6: the block cannot repeat.
    assert reordered_block_orders([[0, 1, 6, 8]], 4) == []


def test_reordering_is_deterministic():
    offsets = v_min_offsets(6)
    assert reordered_block_orders(offsets, 18, [8]) == reordered_block_orders(offsets, 18, [8])


def test_caps_that_come_to_the_same_build_once_and_distinct_ones_each():
    offsets, m = v_min_offsets(6), 18
    own = own_peak(offsets, m)
    alone = reordered_block_orders(offsets, m)
    assert reordered_block_orders(offsets, m, [0, own - 1, own]) == alone  # all resolve to the own peak
    both = reordered_block_orders(offsets, m, [0, own + 2])
    assert both[: len(alone)] == alone and len(both) > len(alone)
    assert all(orders not in both[:i] for i, orders in enumerate(both))  # each order once


def v_auto_span(limit: float, reorder: bool) -> float:
    return objective_value(published_v_auto("14.6B-p16-m48", limit, reorder=reorder), "span")


@pytest.mark.slow
@pytest.mark.parametrize(
    "limit,measured",
    [
        # between V-Min's and V-Half's levels: the squeezed blocks leave the ends idle
        (8.0, "1957.0 against 2010.6 ms (-2.7%)"),
        # above every block's own peak: reshaped up to the limit
        (14.0, "1635.5 against 1674.3 ms (-2.3%)"),
    ],
)
def test_reordered_blocks_shorten_v_auto_between_the_levels(limit, measured):
    reordered, squeezed = v_auto_span(limit, True), v_auto_span(limit, False)
    assert reordered < squeezed * (1 - 0.02), measured


@pytest.mark.slow
def test_at_v_halfs_level_a_reordered_block_without_idle_filling_wins():
    # Filling idle slots never loses in the slot model, but with the real op times it can:
    # at V-Half's 9 activations the squeezed V-Half block (1773.1 ms) beats every reordered
    # block with filling (1792.8) and loses to the best one without it (1767.3).
    assert v_auto_span(9.0, True) < v_auto_span(9.0, False) * (1 - 0.002)

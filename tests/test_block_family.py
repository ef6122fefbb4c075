"""The controllable-memory paper's family of V building blocks
(optimizer.schedules.block_family): its members follow the V's dependency chain, it holds
V-Min and V-Half, and the steady peak that ranks a block is the peak of the repeated block."""

from __future__ import annotations

import itertools
from dataclasses import astuple

import pytest

from benchmarks.published import Setting, published_problem, setting_named
from optimizer.exact.incumbents import objective_value
from optimizer.schedules import block_family
from optimizer.schedules.block_family import paper_blocks, paper_blocks_by_peak, steady_peak
from optimizer.schedules.block_reorder import _peak, _repeat, reordered_block_orders
from optimizer.schedules.v_auto import v_auto
from optimizer.schedules.v_half import v_half_offsets
from optimizer.schedules.v_min import v_min_offsets
from optimizer.simulate import simulate


@pytest.mark.parametrize("p", [1, 2, 4, 7])
def test_every_block_follows_the_v_chain_with_distinct_phases(p):
    blocks = paper_blocks(p)
    assert len(blocks) == len(set(blocks)) > 0
    for block in blocks:
        f0, f1, b1, b0 = zip(*block)
        assert f0[0] == 0
        assert all(len({slot % 6 for slot in row}) == 4 for row in block)
        assert all(f0[i] < f0[i + 1] and b1[i] < b1[i + 1] for i in range(p - 1))  # down the V
        assert all(f1[i] > f1[i + 1] and b0[i] > b0[i + 1] for i in range(p - 1))  # back up
        assert f1[p - 1] > f0[p - 1] and b1[0] > f1[0] and b0[p - 1] > b1[p - 1]  # the turns


def _family_by_definition(p: int) -> tuple:
    """The family as the module doc defines it, one (device-0 phases, shifts, bend) at a
    time, each device's phases from the one before it."""
    shifts = [(k, -1, k, -1) for k in range(1, 6)]
    blocks: dict = {}
    for rest in itertools.permutations(range(1, 6), 3):
        for i, before in enumerate(shifts):
            for after in shifts[: i + 1]:
                for bend in range(1, p) if p > 1 else (1,):
                    rows: list[tuple[int, ...]] = [(0, *rest)]
                    for device in range(1, p):
                        shift = before if device <= bend else after
                        rows.append(tuple((x + s) % 6 for x, s in zip(rows[-1], shift)))
                    if all(len(set(row)) == 4 for row in rows):
                        blocks.setdefault(block_family._absolute(rows), None)
    return tuple(blocks)


@pytest.mark.slow
@pytest.mark.parametrize("p", [1, 2, 3, 5, 8, 13])
def test_the_family_is_enumerated_as_defined_in_the_same_order(p):
    assert paper_blocks(p) == _family_by_definition(p)


@pytest.mark.parametrize("p", [3, 4, 6, 8, 16])
def test_v_min_and_v_half_are_members_at_twice_their_levels_in_chunk_activations(p):
    blocks = set(paper_blocks(p))
    for offsets, level in ((v_min_offsets(p), (p + 4) // 3), (v_half_offsets(p), (p + 2) // 2)):
        assert tuple(tuple(row) for row in offsets) in blocks
        # the papers' levels count a device's two half-size chunks as one activation
        assert steady_peak(offsets) <= 2 * level


@pytest.mark.parametrize("p", [2, 4, 5])
def test_steady_peak_is_the_peak_of_the_block_repeated_long_enough(p):
    for block in paper_blocks(p):
        # enough microbatches for every lifespan to overlap fully, and no squeeze
        assert steady_peak(block) == _peak(_repeat(block, 4 * p + 8)), block


def test_blocks_by_peak_come_highest_first_and_hold_the_whole_family():
    ranked = paper_blocks_by_peak(6)
    peaks = [peak for peak, _ in ranked]
    assert peaks == sorted(peaks, reverse=True)
    assert {block for _, block in ranked} == set(paper_blocks(6))


@pytest.mark.slow
def test_v_auto_no_worse_than_reordering_every_fitting_block_of_the_family():
    # The repeat-squeeze-reorder search over the whole family (what the paper's automatic
    # scheduler does) against v-auto, which reorders only the best-fitting few of it.
    setting = setting_named("1.5B-p8-m24")
    for p in (4, 6):
        m = 3 * p
        scaled = Setting("scaled", p, m, *astuple(setting)[3:])
        for limit in range((p + 4) // 3, p):
            problem = published_problem(scaled, float(limit), "vshape")
            cap = 2 * limit  # chunk activations: each chunk's forward holds half a stage's
            whole_family = min(
                objective_value(schedule, "span")
                for peak, block in paper_blocks_by_peak(p)
                if peak <= cap
                for orders in reordered_block_orders([list(r) for r in block], m)
                if (schedule := simulate(problem, orders)).fits_memory()
            )
            ours = objective_value(simulate(problem, v_auto(problem)), "span")
            assert ours <= whole_family * (1 + 1e-9), (p, limit)


def _earliest_fit_matches_the_walk(line, times, deltas, rng) -> None:
    for cap in (line.peak, line.peak + max(deltas) / 2, line.peak + max(deltas), line.peak * 2):  # never below the peak
        for kind, slots in times.items():
            for old in rng.sample(slots, min(5, len(slots))):
                lo = rng.randrange(0, old + 1)
                walked = next((new for new in range(lo, old) if line.cells[new] is None and line._fits_walking(kind, old, new, cap)), None)
                assert line.earliest_fit(kind, old, lo, cap) == walked, (cap, kind, old, lo)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_earliest_fit_with_ws_placed_is_the_first_slot_a_walk_accepts(p):
    # With W's placed, the squeeze finds a move's earliest slot from the usage in one pass
    # (a move changes it on [new, old) only); the walk tries each slot. Same answers, on
    # every op kind of a block's timeline, under caps from its peak up (as the squeeze's
    # are), in chunk activations and with a device's own float deltas.
    import random

    from optimizer.problem import uniform_problem
    from optimizer.schedules.building_block import _PERIOD, CHUNK_DELTAS, W, _put_w, _Timeline, device_deltas

    rng = random.Random(p)
    tables = uniform_problem(p, 1, placement="vshape", mem_forward=0.7, mem_backward_input=-0.2).tables()
    for offsets, deltas in ((v_half_offsets(p), CHUNK_DELTAS), (v_min_offsets(p), device_deltas(tables, p, p // 2))):
        for r in range(p):
            placed = _put_w({kind: [o + _PERIOD * j for j in range(3 * p)] for kind, o in zip(range(4), offsets[r])}, split=False)
            # and with holes: a free slot just before a W is where the usage last exceeds a cap
            holed = {**placed, W: [t for i, t in enumerate(placed[W]) if i % 3 != 1]}
            for times in (placed, holed):
                line = _Timeline({k: list(v) for k, v in times.items()}, implicit_w=False, deltas=deltas)
                _earliest_fit_matches_the_walk(line, times, deltas, rng)


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_blocks_within_a_cap_are_the_family_by_peak_filtered(p):
    # paper_blocks_within stops a block's peak at its first device over the cap; the
    # blocks it keeps, and their order, must be those of the full ranking.
    from optimizer.schedules.block_family import paper_blocks_within

    full = paper_blocks_by_peak(p)
    for cap in range(0, max(peak for peak, _ in full) + 2):
        assert list(paper_blocks_within(p, cap)) == [block for peak, block in full if peak <= cap], cap
    assert steady_peak(full[0][1], above=0) > 0  # stopped early, still over the cap

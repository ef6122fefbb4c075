"""The `paced` family: valid, within every limit that allows split backwards, its least
period found, and ahead of the other families on the V placement under tight memory."""

from __future__ import annotations

import random
import time

import pytest
from factories import placed_problem, random_problem, unusual_placements, with_vocab

from optimizer.errors import InfeasibleError, InputError
from optimizer.exact import SolveOptions, portfolio, solve
from optimizer.exact.tracker import Tracker
from optimizer.problem import problem_from_json, uniform_problem
from optimizer.schedule import orders_fit
from optimizer.schedules import generate, vocab_passes
from optimizer.schedules.paced import BISECTION_TOLERANCE, busiest_work, fitting_orders, lone_offsets, scan_order
from optimizer.validate import validate

PLACEMENTS = ("vshape", "interleaved:2", "interleaved:3")


def tight_v(limit: float, m: int = 32):
    """p = 8 on the V placement, W shorter than F and B, an activation of 1 per chunk
    (V-Min's level is 8 there)."""
    return uniform_problem(8, m, 1.0, 1.0, 0.6, comm_time=0.05, placement="vshape", memory_limit=limit)


@pytest.mark.parametrize("seed", range(24))
def test_paced_orders_are_valid_and_fit_any_limit_that_split_backwards_allow(seed):
    rng = random.Random(seed)
    placement = PLACEMENTS[seed % len(PLACEMENTS)]
    p = rng.choice([2, 3, 4, 6])
    m = rng.randint(1, 4 * p)
    unlimited = random_problem(rng, p, m, placement, forward_memory=(0.5, 1.0, 2.0))
    need = max(unlimited.split_memory_limit())
    limits = [None, need, need * rng.uniform(1.0, 3.0)]
    per_device = [need * rng.uniform(1.0, 2.0) for _ in range(p)]
    for limit in limits:
        problem = problem_from_json({**unlimited.to_json(), "memory_limit": limit})
        schedule = generate(problem, "paced")
        assert validate(problem, schedule.devices) == []
        assert schedule.fits_memory(), (seed, limit)
    problem = problem_from_json({**unlimited.to_json(), "memory_limit": per_device})
    schedule = generate(problem, "paced")
    assert validate(problem, schedule.devices) == [] and schedule.fits_memory()


@pytest.mark.parametrize("p", [2, 3, 5])
def test_paced_orders_a_custom_placement_with_two_stages_per_device(p):
    unlimited = placed_problem(p, 3 * p, unusual_placements(p)["blocked"])
    limit = max(unlimited.split_memory_limit())
    for memory_limit in (None, limit, 1.5 * limit):
        problem = problem_from_json({**unlimited.to_json(), "memory_limit": memory_limit})
        schedule = generate(problem, "paced")
        assert validate(problem, schedule.devices) == [] and schedule.fits_memory()


def test_one_stage_per_device_is_left_to_the_list_scheduler():
    with pytest.raises(InputError, match="several stages on a device"):
        generate(uniform_problem(4, 8, memory_limit=2.0), "paced")


@pytest.mark.parametrize("limit", [4.0, 5.0, 6.0, 7.0])
def test_the_least_period_fits_and_a_tolerance_less_does_not(limit):
    problem = tight_v(limit)
    orders_at, least = fitting_orders(problem, lone_offsets(problem))
    assert orders_fit(problem, orders_at(least))
    assert not orders_fit(problem, orders_at(least - BISECTION_TOLERANCE * busiest_work(problem)))


def test_the_offsets_are_a_lone_microbatchs_chain():
    # Stage 0 starts at 0; on the V placement the forward turns at the last device without
    # a transfer, and every other hop costs one.
    problem = tight_v(8.0)
    offsets = lone_offsets(problem)
    assert offsets[("F", 0)] == 0.0
    assert offsets[("F", 1)] == pytest.approx(1.0 + 0.05)
    assert offsets[("F", 8)] == pytest.approx(offsets[("F", 7)] + 1.0)  # stages 7 and 8 share device 7
    assert offsets[("B", 15)] == pytest.approx(offsets[("F", 15)] + 1.0)
    assert offsets[("W", 0)] == pytest.approx(offsets[("B", 0)] + 1.0)


def test_scan_order_visits_every_step_once_coarse_first():
    order = list(scan_order(25))
    assert sorted(order) == list(range(26))
    assert order[:4] == [0, 25, 12, 24]


def test_a_limit_below_one_microbatch_is_refused_naming_the_least_that_fits():
    with pytest.raises(InfeasibleError, match="smallest limit that fits is 2"):
        generate(tight_v(1.5), "paced")


@pytest.mark.parametrize("limit", [4.0, 6.0])
def test_below_v_min_it_beats_the_list_scheduler_and_v_auto_and_starts_auto(limit):
    """On the V placement below V-Min's memory: 356.4 against greedy's 392.6 at 4 and 261.6
    against 304.1 at 6 (module doc); `auto` keeps it as a starting point."""
    problem = tight_v(limit)
    ours = generate(problem, "paced")
    assert ours.fits_memory()
    for other in ("greedy", "v-auto"):
        assert ours.makespan < 0.95 * generate(problem, other).makespan, other
    solved = solve(problem, "auto", SolveOptions(time_limit=5.0, threads=1))
    assert solved.fits_memory() and solved.makespan <= ours.makespan + 1e-9


def test_paced_and_the_dependency_depths_reach_a_thousand_stages():
    # A RecursionError at about 500 stages (compare, solve --method paced) from the
    # recursive depth of a chain 2 x stages long.
    from optimizer.ops import Op, dependency_depths

    stages = 1024
    depth = dependency_depths(stages)
    assert depth(Op("B", 0, 5)) == 2 * stages - 1  # F 0..S-1, then B S-1..0
    assert depth(Op("W", 0, 0)) == 2 * stages
    assert depth(Op("F", 700, 0)) == 700
    problem = uniform_problem(1, 2, placement=f"interleaved:{stages}", memory_limit=1.5 * stages)  # one microbatch and a half
    schedule = generate(problem, "paced")
    assert validate(problem, schedule.devices) == [] and schedule.fits_memory()


def test_below_v_min_auto_builds_it_with_the_automatic_schedulers():
    # In the families' share it went unbuilt under short limits: at p = 32 at 5 s `auto`
    # returned 12-19% longer than `paced` alone.
    from benchmarks.published import published_problem, setting_named
    from optimizer.exact.portfolio import _below_v_min

    setting = setting_named("14.6B-p16-m48")
    assert not _below_v_min(published_problem(setting, 6.0, "vshape"))  # V-Min's level
    assert not _below_v_min(published_problem(setting, 4.0, "interleaved:2"))
    problem = published_problem(setting, 4.0, "vshape")
    assert _below_v_min(problem)
    others = min(generate(problem, name).makespan for name in ("greedy", "v-auto"))
    solved = solve(problem, "auto", SolveOptions(time_limit=1.0, threads=1))
    # paced alone is 11% shorter than both here (3206.6 against 3615.4); `auto` without it
    # at 1 s was 2% shorter (its order search from the list scheduler's schedule).
    assert solved.fits_memory() and solved.makespan <= 0.95 * others


@pytest.mark.parametrize("placement", ["vshape", "interleaved:2"])
@pytest.mark.parametrize("times", [(1.0, 1.0, 0.3), (1e-6, 1e-6, 1e-6)])
def test_a_b_that_allocates_fits_the_least_limit_of_split_backwards(placement, times):
    # At the V's turn a W ends where the next B starts; with the B first, a B that
    # allocates (held until its W) needed more than one microbatch alone needs, and the
    # least limit of split backwards was refused.
    f, b, w = times
    base = uniform_problem(3, 6, f, b, w, placement=placement, mem_backward_input=0.4)
    problem = problem_from_json({**base.to_json(), "memory_limit": max(base.split_memory_limit())})
    schedule = generate(problem, "paced")
    assert validate(problem, schedule.devices) == [] and schedule.fits_memory()


def test_the_bisection_ends_where_the_tolerance_is_below_the_floats_spacing():
    # Ops of 1e-9 and transfers of 1e6: a tolerance of 1% of the work (6e-11) at periods
    # near 1e7, where neighbouring floats are 2e-9 apart; the bisection never ended.
    problem = uniform_problem(4, 8, 1e-9, 1e-9, 1e-9, comm_time=1e6, placement="vshape", memory_limit=2.5)
    schedule = generate(problem, "paced")
    assert validate(problem, schedule.devices) == [] and schedule.fits_memory()


def test_paced_built_first_below_v_min_weaves_vocabulary_passes_within_its_share(monkeypatch):
    """Built before v-auto below V-Min's memory, paced weaves the passes within an even share
    of the time it and the automatic schedulers after it have (as every build does): woven
    until their common deadline, it could leave v-auto nothing."""
    problem = with_vocab(uniform_problem(4, 8, 1.0, 1.0, 0.6, placement="vshape", mem_forward=0.5, memory_limit=1.5), memory=0.0)
    assert portfolio._below_v_min(problem)
    told: list[float] = []
    real = vocab_passes.with_vocab_passes

    def recording(problem, base_orders, deadline=None):
        told.append(deadline)
        return real(problem, base_orders, deadline)

    monkeypatch.setattr(vocab_passes, "with_vocab_passes", recording)
    began = time.monotonic()
    found = portfolio._paced_first(problem, Tracker("makespan", 10.0), began + 1.0, 1)
    assert [c.name for c in found] == ["paced"] and found[0].fits
    assert len(told) == 1 and abs(told[0] - began - 0.5) < 0.1  # half of 1 s (its build's start shifts it)

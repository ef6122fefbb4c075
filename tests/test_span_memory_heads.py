"""Memory in the heads: every device's limit in each device's frame, and the room a device must keep for
its next chunk (optimizer.exact.reservation). Never above an optimum or a valid schedule, and each raises bounds."""

from __future__ import annotations

import random
import time

import pytest
from exact_brute_force import brute_force_optimum, count_orders
from factories import other_schedules, problem_cases, random_problem
from hypothesis import given, settings

from benchmarks.published import published_problem, setting_named
from optimizer.exact import bounds
from optimizer.exact.bounds import device_tails, heads, jackson_preemptive, lower_bound
from optimizer.exact.incumbents import objective_value
from optimizer.exact.listsched import list_schedule, policies
from optimizer.exact.reservation import lags
from optimizer.problem import Problem
from optimizer.simulate import simulate

pytestmark = pytest.mark.solver

TOLERANCE = 1e-9


def own_frame_bounds(problem: Problem) -> list[float]:
    """Each device's preemptive bound in its own frame, with every device's memory in the heads."""
    t = problem.tables()
    duration = {"F": t.forward, "B": t.backward_input, "W": t.backward_weight}
    values = []
    for device in range(problem.num_devices):
        head = heads(problem, problem.memory_limit is not None, origin=min(problem.stages_on(device)))
        tail = device_tails(problem, device)
        ops = [(k, s, i) for s in problem.stages_on(device) for k in "FBW" for i in range(problem.num_microbatches)]
        values.append(jackson_preemptive([(head[k][s][i], duration[k][s], tail[k][s][i]) for k, s, i in ops]))
    return values


def list_schedules(problem: Problem) -> list:
    """The list scheduler's schedules (every policy) that fit the memory limit."""
    schedules = [simulate(problem, list_schedule(problem, policy)) for policy in policies()]
    return [s for s in schedules if s.fits_memory()]


# Two devices, room for one microbatch's two chunks (V) or one and a half (interleaved,
# chunks of 0.5 and 1.0): (seed, placement, limit, forward sizes, bound, brute-force
# optimum). Memory on the bounded device only gave 11.73 / 14.83 / 17.17; every device's
# memory 12.95 / 15.72 / 17.17; the room for the next chunk 13.95 / 15.72 / 19.02, the
# interleaved one the optimum.
RAISED = [
    (1, "vshape", 1.0, (1.0,), 13.95, 14.62),
    (2, "vshape", 1.0, (1.0,), 15.72, 17.19),
    (27, "interleaved:2", 1.5, (1.0, 0.5), 19.02, 19.02),
]


@pytest.mark.slow
@pytest.mark.parametrize("seed, placement, limit, sizes, bound, optimum", RAISED)
def test_raises_tiny_bounds_and_stays_below_the_brute_force_optimum(seed, placement, limit, sizes, bound, optimum):
    problem = random_problem(random.Random(seed), 2, 2, placement, limit=limit, decimals=2, forward_memory=sizes)
    assert count_orders(problem) <= 6000
    best = brute_force_optimum(problem, "span")
    assert best == pytest.approx(optimum)
    value = lower_bound(problem, "span").value
    assert value == pytest.approx(bound, abs=5e-3)
    assert value <= best * (1 + TOLERANCE)
    assert lower_bound(problem, "makespan").value <= brute_force_optimum(problem, "makespan") * (1 + TOLERANCE)


# Seeds whose problems brute force settles in seconds (at most 6000 orders).
TINY_TIGHT = [
    *[(seed, "vshape", 1.0, (1.0,)) for seed in range(10)],
    *[(seed, "interleaved:2", 1.5, (1.0, 0.5)) for seed in (1, 3, 6, 8, 12, 15, 19, 20, 27, 30)],
    *[(seed, "vshape", 1.0, (1.0, 0.5, 2.0)) for seed in (8, 9, 12, 15, 18, 32, 33)],
]


@pytest.mark.slow
@pytest.mark.parametrize("seed, placement, limit, sizes", TINY_TIGHT)
def test_never_above_the_brute_force_optimum_on_tiny_tight_problems(seed, placement, limit, sizes):
    # Two devices, two microbatches, two chunks each, uneven stages and chunk sizes, the
    # limit at (or just above) what one microbatch needs: where the lag and every
    # device's memory bind hardest.
    problem = random_problem(random.Random(seed), 2, 2, placement, limit=limit, decimals=2, forward_memory=sizes)
    assert count_orders(problem) <= 6000
    for objective in ("span", "makespan"):
        assert lower_bound(problem, objective).value <= brute_force_optimum(problem, objective) * (1 + TOLERANCE)


def test_the_room_for_the_next_chunk_is_a_lag_in_microbatches():
    # V-Min's memory on 1.5B, p = 8: a limit of 4 activations, 0.5 per chunk. Device 0
    # holds the first chunk of at most 7 microbatches ahead of the second chunk:
    # F(0, i) waits for F(15, i - 7); so does every device (stage d and 15 - d).
    setting = setting_named("1.5B-p8-m24")
    problem = published_problem(setting, 4.0, "vshape")
    assert lags(problem)[0] == [(15, 7)]
    assert lags(problem)[3] == [(12, 7)]
    assert lags(problem)[15] == []
    # V-Half's 5: 9 ahead; unlimited: no lag.
    assert lags(published_problem(setting, 5.0, "vshape"))[0] == [(15, 9)]
    assert lags(published_problem(setting, None, "vshape"))[0] == []


@pytest.mark.slow
@settings(max_examples=30, deadline=None, derandomize=True)
@given(problem_cases(max_devices=4, max_microbatches=6, placements=("vshape", "linear", "interleaved:2"), limits=(1.0, 1.5, 2.0, 3.0)))
def test_never_above_any_valid_schedule_under_tight_limits(case):
    # Uneven stages (random times and chunk sizes per stage), every placement, limits
    # down to one microbatch's activations; the schedules are the families, the list
    # policies and random orders within memory, timed as soon as possible and for the
    # least span.
    seed, p, m, placement, limit = case
    rng = random.Random(seed)
    problem = random_problem(rng, p, m, placement, limit=limit, forward_memory=(1.0, 0.5, 2.0))
    schedules = other_schedules(problem, rng, count=3) + list_schedules(problem)
    assert schedules
    shortest = min(objective_value(s, "span") for s in schedules)
    assert max(own_frame_bounds(problem)) <= shortest * (1 + TOLERANCE)
    assert lower_bound(problem, "span").value <= shortest * (1 + TOLERANCE)
    assert lower_bound(problem, "makespan").value <= min(objective_value(s, "makespan") for s in schedules) * (1 + TOLERANCE)


@pytest.mark.parametrize(
    "name, limit, old, raised, best_known",
    [
        # The bound before (memory counted on device 0 only), a floor of the bound now,
        # and v-auto's span (benchmarks/results/bounds.md).
        ("1.5B-p8-m24", 4.0, 1196.809, 1237.0, 1619.159),  # V-Min's level: gap 26.1% -> 23.6%
        ("1.5B-p8-m24", 5.0, 1166.660, 1195.0, 1328.772),  # V-Half's level: 12.2% -> 10.0%
        ("6.2B-p8-m24", 4.0, 2024.386, 2094.0, 2545.954),
    ],
)
def test_raises_the_memory_tight_v_bounds(name, limit, old, raised, best_known):
    setting = setting_named(name)
    problem = published_problem(setting, limit, "vshape")
    bound = lower_bound(problem, "span")
    assert bound.value > raised > old
    assert "within device 0's span" in bound.reason
    assert bound.value < best_known


@pytest.mark.parametrize("seed", range(6))
def test_counting_fewer_started_forwards_only_lowers_the_heads_and_stays_below_schedules(seed, monkeypatch):
    # Where a device holds many stages the memory argument counts at most MEMORY_PAIRS
    # (stage, microbatch) pairs and MEMORY_LAG_STAGES lags per forward (a pass counting
    # every one took a minute at 512 stages a device). Leaving pairs out must only weaken
    # it: with tiny caps every head is at most the uncapped one, and the bounds stay below
    # every valid schedule.
    rng = random.Random(seed)
    placement = rng.choice(("interleaved:3", "interleaved:4", "vshape"))
    problem = random_problem(rng, 2, 6, placement, limit=rng.choice((1.5, 2.0, 3.0)), forward_memory=(1.0, 0.5, 2.0))
    full = heads(problem, memory_aware=True)
    monkeypatch.setattr(bounds, "MEMORY_PAIRS", 2)
    monkeypatch.setattr(bounds, "MEMORY_LAG_STAGES", 1)
    capped = heads(problem, memory_aware=True)
    for kind in "FBW":
        for s in range(problem.num_stages):
            for i in range(problem.num_microbatches):
                assert capped[kind][s][i] <= full[kind][s][i] * (1 + TOLERANCE) + TOLERANCE, (kind, s, i)
    schedules = other_schedules(problem, rng, count=3) + list_schedules(problem)
    assert schedules
    assert lower_bound(problem, "span").value <= min(objective_value(s, "span") for s in schedules) * (1 + TOLERANCE)
    assert lower_bound(problem, "makespan").value <= min(objective_value(s, "makespan") for s in schedules) * (1 + TOLERANCE)


def test_a_heads_pass_past_its_deadline_is_left_out_and_the_bound_stays_valid(monkeypatch):
    # A part whose time estimate said it would end in time (here: always) still stops at its
    # deadline, once a microbatch: the bound keeps what ended in time.
    problem = published_problem(setting_named("1.5B-p8-m24"), 4.0, "vshape")
    with pytest.raises(bounds._OutOfTime):
        heads(problem, memory_aware=True, deadline=time.monotonic() - 1.0)
    monkeypatch.setattr(bounds, "_in_time", lambda problem, deadline: True)
    past = time.monotonic() - 1.0
    cut = bounds.makespan_lower_bound(problem, deadline=past)
    whole = bounds.makespan_lower_bound(problem)
    assert cut.reason == "busiest device's work"
    assert cut.value < whole.value
    assert bounds.span_lower_bound(problem, deadline=past).reason.startswith("busy time of device")

"""The warm-up and drain bound: never above an optimum or any valid schedule, tight where theory says so."""

from __future__ import annotations

import itertools
import random

import pytest
from exact_brute_force import brute_force_optimum, count_orders
from factories import other_schedules, problem_cases, random_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.published import SETTINGS, published_problem, setting_named
from optimizer.exact.bounds import device_tails, heads, lower_bound, most_pending_work, warm_up_and_drain
from optimizer.exact.incumbents import objective_value
from optimizer.problem import Problem
from optimizer.schedules import GENERATORS
from optimizer.simulate import simulate

pytestmark = pytest.mark.solver

# Float sums of a few hundred durations: 1e-9 relative is far above their rounding and
# far below any real difference between schedules (durations are >= 0.1).
TOLERANCE = 1e-9


def device_bounds(problem: Problem) -> list[float]:
    """The warm-up and drain bound of every device, each in its own frame."""
    values = []
    for device in range(problem.num_devices):
        origin = min(problem.stages_on(device))
        head = heads(problem, problem.memory_limit is not None, origin=origin)
        values.append(warm_up_and_drain(problem, device, head, device_tails(problem, device)))
    return values


# Tiny problems brute force settles in seconds, most under a tight limit (the drain's
# memory cap is what could be wrong). A V or interleaved device with two microbatches
# already has millions of orders: those placements are checked against valid schedules.
TINY = [
    (1, 2, 3, "linear", 1.0),
    (2, 2, 3, "linear", 1.3),
    (3, 2, 2, "linear", None),
    (4, 3, 2, "linear", 1.0),
    (5, 2, 1, "vshape", None),
    (7, 3, 3, "linear", 1.0),
    (9, 2, 3, "linear", 1.0),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", TINY, ids=lambda c: f"seed{c[0]}-p{c[1]}-m{c[2]}-{c[3]}-limit{c[4]}")
def test_never_above_the_brute_force_optimum(case):
    seed, p, m, placement, limit = case
    problem = random_problem(random.Random(seed), p, m, placement, limit=limit, decimals=2)
    assert count_orders(problem) <= 20000  # keeps brute force to seconds
    optimum = {objective: brute_force_optimum(problem, objective) for objective in ("makespan", "span")}
    for value in device_bounds(problem):
        assert value <= optimum["span"] * (1 + TOLERANCE)
    for objective, value in optimum.items():
        assert lower_bound(problem, objective).value <= value * (1 + TOLERANCE)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, derandomize=True)
@given(problem_cases(max_devices=4, max_microbatches=8, limits=(None, 1.0, 1.5, 2.0, 3.0)))
def test_never_above_any_valid_schedule(case):
    seed, p, m, placement, limit = case
    rng = random.Random(seed)
    problem = random_problem(rng, p, m, placement, limit=limit)
    schedules = other_schedules(problem, rng)
    assert schedules, "the families always include a schedule within one microbatch's memory"
    # Each device's own bound, whether or not it is the best one (lower_bound as a whole,
    # which now includes it for both objectives, is checked in tests/test_span_objective.py).
    shortest = min(objective_value(s, "span") for s in schedules)
    assert max(device_bounds(problem)) <= shortest * (1 + TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["1.5B-p8-m24", "1.5B-p8-m64", "14.6B-p16-m48"])
def test_proves_zb_h1_optimal_at_one_f_one_b_memory(name):
    # Zero Bubble's profiled settings at limit p (1F1B's memory): device 0 waits
    # (p-1)(B + 2c) before its first backward, and after its last forward the
    # round trip (p-1)(F + B) + 2(p-1)c can only be filled with the p-1 backwards (and
    # their W's) that memory lets it leave: exactly ZB-H1's idle, for both objectives.
    setting = setting_named(name)
    problem = published_problem(setting, float(setting.p))
    zb_h1 = simulate(problem, GENERATORS["zb-h1"].build(problem))
    assert zb_h1.fits_memory()
    for objective in ("makespan", "span"):
        assert lower_bound(problem, objective).value == pytest.approx(objective_value(zb_h1, objective), rel=TOLERANCE)
    assert "drain" in lower_bound(problem, "span").reason


def test_proves_zb_2p_optimal_on_the_smallest_setting():
    # 1.5B, p = 8, m = 24 at limit 2p: seen from device 0's first start, device 7 cannot
    # get its first forward before 7(F + c), must then run all 48 forwards and backwards,
    # and its last backward still has 7(B + c) + W to travel before device 0 ends:
    # 133.861 + 878.592 + 140.146 = 1152.599 ms, ZB-2p's span (bubble 4.33%).
    setting = SETTINGS[0]
    problem = published_problem(setting, 2.0 * setting.p)
    zb_2p = simulate(problem, GENERATORS["zb-auto"].build(problem))
    assert zb_2p.metrics.bubble_ratio == pytest.approx(setting.zb_2p, abs=5e-5)
    bound = lower_bound(problem, "span")
    assert bound.value == pytest.approx(objective_value(zb_2p, "span"), rel=TOLERANCE)
    assert "device 7 within device 0's span" in bound.reason


def test_adds_nothing_without_a_memory_limit():
    # Unlimited, everything earlier may be left for the drain: it forces no idle, and the
    # bound is the busy time plus the forwards-only warm-up.
    setting = SETTINGS[0]
    problem = published_problem(setting, None)
    assert max(device_bounds(problem)) < lower_bound(problem, "span").value * (1 + TOLERANCE)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    states=st.lists(st.tuples(st.floats(-0.5, 2.0), st.floats(0.0, 5.0)), min_size=1, max_size=4),
    capacity=st.floats(0.0, 6.0),
    count=st.integers(0, 5),
)
def test_most_pending_work_is_at_least_every_integer_choice(states, capacity, count):
    value = most_pending_work(states, capacity, count)
    # Every integer number of microbatches per state within both limits.
    for numbers in itertools.product(range(count + 1), repeat=len(states)):
        if sum(numbers) <= count and sum(n * h for n, (h, _) in zip(numbers, states)) <= capacity:
            assert sum(n * w for n, (_, w) in zip(numbers, states)) <= value + 1e-9


def test_most_pending_work_mixes_states_when_memory_binds():
    # Room for 7: seven microbatches before their B (1 each, 27.4 work) beat nineteen
    # waiting for W only (0.366 each, 9.3 work); with one microbatch allowed, the richest.
    states = [(1.0, 27.4), (0.366, 9.3), (0.0, 0.0)]
    assert most_pending_work(states, 7.0, 30) == pytest.approx(7 * 27.4)
    assert most_pending_work(states, 7.0, 1) == pytest.approx(27.4)
    # A state rich per microbatch (1 unit, work 10) and one rich per unit of memory (0.2,
    # work 5), room for 2 and at most 5 microbatches: both limits bind at
    # n1 + n2 = 5, n1 + 0.2 n2 = 2, so n1 = 1.25, n2 = 3.75 and the work is 31.25, more
    # than either state alone (20 and 25).
    assert most_pending_work([(1.0, 10.0), (0.2, 5.0)], 2.0, 5) == pytest.approx(31.25)

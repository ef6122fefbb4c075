"""The list-scheduling engine behind `greedy` and the solver's list starting points:
every policy is memory-safe down to the least limit, the policies do what they say, and
the makespans the two users got before they shared the engine are kept."""

from __future__ import annotations

import random

import pytest
from factories import random_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer.exact.listsched import list_schedule, policies
from optimizer.problem import uniform_problem
from optimizer.schedules import generate
from optimizer.schedules.listengine import Policy, schedule_with
from optimizer.simulate import simulate
from optimizer.validate import validate


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    p=st.integers(1, 6),
    m=st.integers(1, 10),
    placement=st.sampled_from(["linear", "vshape", "interleaved:2"]),
    tight=st.booleans(),
)
def test_every_solver_policy_is_valid_and_within_the_limit(seed, p, m, placement, tight):
    # limit 0 is raised to the least limit that fits (one microbatch's peak per device).
    problem = random_problem(random.Random(seed), p, m, placement, limit=0.0 if tight else 2.0 * p, forward_memory=(0.5, 1.0, 2.0))
    for policy in policies():
        schedule = simulate(problem, list_schedule(problem, policy))  # a deadlock would raise here
        assert validate(problem, schedule.devices) == [], str(policy)
        assert schedule.fits_memory(), str(policy)


def test_in_flight_cap_is_the_1f1b_warm_up_on_a_linear_pipeline():
    # Factor 1 admits p - d microbatches on device d, 1F1B's peak, with no memory limit
    # (B frees the activation here, so the peak counts microbatches between F and B).
    p = 4
    problem = uniform_problem(p, 12, 1.0, 2.0, 1.0, mem_backward_input=-1.0)
    orders, _ = schedule_with(problem, Policy("forward", "always", throttle=False, in_flight=1.0))
    peaks = simulate(problem, orders).metrics.peak_memory
    assert peaks == pytest.approx([float(p - d) for d in range(p)])
    unbounded, _ = schedule_with(problem, Policy("forward", "always", throttle=False))
    assert max(simulate(problem, unbounded).metrics.peak_memory) > p


def test_eager_weights_run_right_after_their_backward():
    problem = uniform_problem(3, 6, 1.0, 1.0, 1.0)
    orders, _ = schedule_with(problem, Policy("backward", "eager", throttle=False))
    for device in orders:
        for k, op in enumerate(device):
            if op.kind == "B":
                assert device[k + 1].kind == "W" and device[k + 1].stage == op.stage and device[k + 1].microbatch == op.microbatch


# Makespans measured on these problems before `greedy` and the solver's list policies
# shared one engine (greedy's grid best, the best of the 16 list policies); neither may
# get longer.
BEFORE = [
    (0, 3, 4, "linear", 1.0, 35.566095, 35.566095),
    (1, 5, 8, "vshape", 0.0, 162.748191, 218.206931),
    (2, 6, 12, "interleaved:2", 2.5, 320.323862, 395.520472),
    (3, 4, 10, "vshape", None, 79.393809, 79.393809),
    (4, 8, 24, "linear", 8.0, 124.074923, 124.074923),
    (5, 4, 16, "interleaved:2", 0.0, 275.335992, 346.603114),
]


@pytest.mark.slow
@pytest.mark.parametrize("seed,p,m,placement,limit,greedy_before,list_before", BEFORE)
def test_no_longer_than_before_the_engines_were_merged(seed, p, m, placement, limit, greedy_before, list_before):
    problem = random_problem(random.Random(seed), p, m, placement, limit=limit)
    greedy = generate(problem, "greedy").makespan
    best_list = min(simulate(problem, list_schedule(problem, policy)).makespan for policy in policies())
    # The pins are printed to 6 decimals: allow that rounding and nothing more.
    assert greedy <= greedy_before + 1e-6
    assert best_list <= list_before + 1e-6

"""Lower bounds: never above an optimum or any valid schedule, tight where theory says so."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exact_brute_force import brute_force_optimum
from optimizer.exact.bounds import jackson_preemptive, lower_bound
from optimizer.exact.incumbents import generator_candidates
from optimizer.exact.listsched import list_schedule, policies
from optimizer.problem import Problem, placement_devices, uniform_problem
from optimizer.simulate import simulate


def random_problem(rng: random.Random, p: int, m: int, placement: str, limit: float | None) -> Problem:
    stages = []
    for device in placement_devices(placement, p):
        kept = rng.uniform(0.1, 0.7)
        stages.append(
            {
                "device": device,
                "forward": rng.uniform(0.3, 2.0),
                "backward_input": rng.uniform(0.3, 2.0),
                "backward_weight": rng.uniform(0.1, 1.5),
                "memory": {"forward": 1.0, "backward_input": -(1.0 - kept), "backward_weight": -kept},
            }
        )
    per_device = len(stages) // p
    return Problem.model_validate(
        {
            "num_devices": p,
            "num_microbatches": m,
            "stages": stages,
            "comm_time": rng.uniform(0, 0.3),
            "memory_limit": None if limit is None else max(limit, per_device),
        }
    )


def test_jackson_preemptive_schedule_on_a_textbook_instance():
    # Two jobs: the second arrives at 1 with a long tail and preempts the first.
    assert jackson_preemptive([(0, 3, 0), (1, 1, 5)]) == pytest.approx(7.0)
    assert jackson_preemptive([(0, 2, 1), (0, 2, 3)]) == pytest.approx(5.0)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    p=st.integers(1, 5),
    m=st.integers(1, 8),
    placement=st.sampled_from(["linear", "vshape", "interleaved:2"]),
    limit=st.one_of(st.none(), st.floats(1.0, 6.0)),
)
def test_bound_never_exceeds_any_valid_schedule(seed, p, m, placement, limit):
    problem = random_problem(random.Random(seed), p, m, placement, limit)
    bound = lower_bound(problem).value
    schedules = [c.schedule for c in generator_candidates(problem)[0] if c.fits]
    for policy in policies()[:4]:
        orders = list_schedule(problem, policy)
        if orders is not None:
            schedules.append(simulate(problem, orders))
    for schedule in schedules:
        if schedule.fits_memory():
            assert bound <= schedule.makespan * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_bound_never_exceeds_the_brute_force_optimum(seed):
    rng = random.Random(seed)
    problem = random_problem(rng, 2, 2, "linear", rng.choice([None, 1.3, 1.6]))
    assert lower_bound(problem).value <= brute_force_optimum(problem) * (1 + 1e-9)


def test_unlimited_uniform_bound_is_the_zero_bubble_optimum():
    # With memory to spare and F = B = W, a device can be busy from its first forward
    # to the end: the bound is reached (ZB-H2 / split GPipe reach it).
    problem = uniform_problem(4, 8, 1.0, 1.0, 1.0)
    best = min(c.schedule.makespan for c in generator_candidates(problem)[0])
    assert lower_bound(problem).value == pytest.approx(best)


def test_memory_bound_rises_as_the_limit_falls():
    values = [lower_bound(uniform_problem(4, 8, 1.0, 1.0, 0.6, mem_backward_input=-0.63, memory_limit=limit)).value for limit in (8, 4, 2, 1)]
    assert values == sorted(values)
    assert values[-1] > values[0] * 1.5
    assert "memory" in lower_bound(uniform_problem(4, 8, memory_limit=1.0)).reason


def test_span_bound_is_at_most_the_makespan_bound():
    problem = uniform_problem(4, 8, 1.0, 1.0, 0.6, comm_time=0.05, memory_limit=3.0, mem_backward_input=-0.5)
    assert lower_bound(problem, "span").value <= lower_bound(problem).value

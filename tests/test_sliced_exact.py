"""The exact stack on problems with token slices: optimal on tiny cases (brute force over every
order), bounds never above an optimum or any valid schedule, model times that the simulator
reproduces."""

from __future__ import annotations

import random
import time

import pytest
from exact_brute_force import brute_force_optimum, count_orders
from factories import random_feasible_order
from hypothesis import given, settings
from hypothesis import strategies as st
from sliced_cases import sliced_problem

from optimizer.exact import SolveOptions, solve
from optimizer.exact.canonical import canonical
from optimizer.exact.cpsat import solve_cpsat_subproblem
from optimizer.exact.incumbents import generator_candidates, objective_value
from optimizer.exact.neighbourhood import neighbourhood_search
from optimizer.exact.slicebounds import lower_bound
from optimizer.exact.spantiming import timed_for
from optimizer.exact.subproblem import full_subproblem
from optimizer.exact.timescale import integer_tables
from optimizer.problem import Problem
from optimizer.schedules import get_generator
from optimizer.simulate import simulate
from optimizer.validate import validate

pytestmark = pytest.mark.solver

# Makespans are float sums; two equal optima may differ in the last bits.
CLOSE = 1e-9


def assert_valid(schedule) -> None:
    assert validate(schedule.problem, schedule.devices) == []
    assert schedule.fits_memory()


# Two or three slices of random shares and costs on one to three devices; two microbatches
# only under a memory limit (unlimited, each device has 8316 orders: 69 million pairs).
TINY = [
    pytest.param(sliced_problem(random.Random(11), 2, 1, 2), id="p2-m1-K2"),
    pytest.param(sliced_problem(random.Random(12), 2, 1, 2, limit=1.0), id="p2-m1-K2-limit1"),
    pytest.param(sliced_problem(random.Random(13), 2, 1, 3), id="p2-m1-K3"),
    pytest.param(sliced_problem(random.Random(13), 3, 1, 2), id="p3-m1-K2"),
    pytest.param(sliced_problem(random.Random(13), 2, 2, 2, limit=1.0), id="p2-m2-K2-limit1"),
    # V-shape on one device: it holds both stages of every slice's path.
    pytest.param(sliced_problem(random.Random(1), 1, 1, 2, placement="vshape"), id="p1-m1-K2-vshape"),
]


def test_the_tiny_cases_are_small_enough_and_on_an_exact_grid():
    for case in TINY:
        problem = case.values[0]
        assert isinstance(problem, Problem)
        assert problem.num_slices > 1
        assert count_orders(problem) <= 20_000
        assert integer_tables(problem).exact_time


@pytest.mark.slow
@pytest.mark.parametrize("problem", TINY)
@pytest.mark.parametrize("method", ["cpsat", "milp"])
def test_models_match_brute_force_on_sliced_problems(problem, method):
    optimum = brute_force_optimum(problem)
    schedule = solve(problem, method, SolveOptions(time_limit=30))
    assert_valid(schedule)
    assert schedule.metrics.status == "optimal"
    assert schedule.makespan == pytest.approx(optimum, rel=CLOSE)
    assert lower_bound(problem).value <= optimum * (1 + CLOSE)


@pytest.mark.slow
@pytest.mark.parametrize("problem", TINY[:4])
def test_span_objective_matches_brute_force_on_sliced_problems(problem):
    optimum = brute_force_optimum(problem, "span")
    schedule = solve(problem, "cpsat", SolveOptions(time_limit=30, objective="span"))
    assert_valid(schedule)
    assert objective_value(schedule, "span") == pytest.approx(optimum, rel=1e-7)
    assert lower_bound(problem, "span").value <= optimum * (1 + CLOSE)


@pytest.mark.parametrize("problem", TINY)
def test_symmetry_breaking_keeps_the_optimum_on_sliced_problems(problem):
    broken = solve(problem, "cpsat", SolveOptions(time_limit=30))
    unbroken = solve(problem, "cpsat", SolveOptions(time_limit=30, symmetry_breaking=False))
    assert broken.metrics.status == unbroken.metrics.status == "optimal"
    assert broken.makespan == pytest.approx(unbroken.makespan, rel=CLOSE)


@pytest.mark.parametrize("fused_ratio", [None, 0.7])
def test_model_times_are_the_simulators(fused_ratio):
    # The model's start times are the order's as-soon-as-possible times or later, and
    # on an exact grid its makespan is the simulated one's (both optimal for the order).
    # Where BW's slice times are rounded down the model's makespan is at most the real one.
    problem = sliced_problem(random.Random(21), 3, 2, 3 if fused_ratio is None else 2, fused_ratio=fused_ratio)
    tables = integer_tables(problem)
    sub = full_subproblem(problem, tables)
    result = solve_cpsat_subproblem(sub, time_limit=20)
    assert result.status in ("optimal", "feasible") and result.objective is not None
    schedule = simulate(problem, result.orders(sub))
    assert_valid(schedule)
    if not tables.exact_time:
        assert result.objective <= schedule.makespan * tables.time_scale + 1e-6
        return
    assert result.status == "optimal"
    assert schedule.makespan * tables.time_scale == pytest.approx(result.objective, abs=1e-6)
    simulated = {t.op: t.start * tables.time_scale for ops in schedule.devices for t in ops}
    for op, start in zip(sub.ops, result.starts or []):
        if op in simulated:
            assert simulated[op] <= start + 1e-6


@pytest.mark.slow
@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 10**6),
    p=st.integers(1, 4),
    m=st.integers(1, 4),
    num_slices=st.integers(1, 4),
    placement=st.sampled_from(["linear", "vshape"]),
    fused_ratio=st.sampled_from([None, 0.5, 0.8, 1.2]),
)
def test_bounds_never_exceed_any_valid_sliced_schedule(seed, p, m, num_slices, placement, fused_ratio):
    rng = random.Random(seed)
    problem = sliced_problem(rng, p, m, num_slices, placement, fused_ratio=fused_ratio, decimals=None)
    makespan_bound = lower_bound(problem).value
    span_bound = lower_bound(problem, "span").value
    for _ in range(5):
        orders = random_feasible_order(problem, rng, fused_share=0.5)
        assert makespan_bound <= simulate(problem, orders).makespan * (1 + CLOSE)
        assert span_bound <= objective_value(timed_for(problem, orders, "span"), "span") * (1 + CLOSE)


def test_auto_on_a_sliced_problem_is_no_worse_than_its_starting_points_and_valid():
    problem = sliced_problem(random.Random(31), 4, 2, 4, limit=2.0)
    schedule = solve(problem, "auto", SolveOptions(time_limit=5))
    assert_valid(schedule)
    found, _ = generator_candidates(problem)
    fitting = [c.schedule.makespan for c in found if c.fits]
    assert fitting, "a sliced family fits"
    assert schedule.makespan <= min(fitting) * (1 + CLOSE)
    assert schedule.metrics.lower_bound is not None and schedule.metrics.lower_bound <= schedule.makespan * (1 + CLOSE)


@pytest.mark.slow
@pytest.mark.parametrize("fused_ratio", [None, 0.7])
def test_window_search_on_a_sliced_problem_keeps_valid_schedules_and_never_worsens(fused_ratio):
    # Windows free ops of several slices at once; their precedences, releases and tails
    # follow every slice dependency, so each spliced result is a valid order.
    problem = sliced_problem(random.Random(41), 4, 2, 3, limit=2.0, fused_ratio=fused_ratio)
    tables = integer_tables(problem)
    start = simulate(problem, canonical(get_generator("terapipe").build(problem), problem))
    improved: list = []
    result = neighbourhood_search(problem, tables, start.order(), deadline=time.monotonic() + 3, on_improve=improved.append)
    for schedule in [result, *improved]:
        assert_valid(schedule)
    assert result.makespan <= start.makespan * (1 + CLOSE)

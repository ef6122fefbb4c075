"""Fused-or-split backward as the solvers' choice: fused where splitting does not pay, split where it does."""

from __future__ import annotations

import random

import pytest
from exact_brute_force import brute_force_optimum
from factories import random_feasible_order
from sliced_cases import sliced_problem

from optimizer.exact import SolveOptions, solve
from optimizer.exact.canonical import canonical, split_fused
from optimizer.exact.slicebounds import lower_bound, split_relaxation
from optimizer.ops import Kind
from optimizer.problem import Problem, uniform_problem
from optimizer.schedules import applicable
from optimizer.simulate import simulate
from optimizer.validate import validate

pytestmark = pytest.mark.solver

# Makespans are float sums; two equal optima may differ in the last bits.
CLOSE = 1e-9


def with_fused(problem: Problem, ratio: float) -> Problem:
    """The problem with each stage's fused backward `ratio` times B + W."""
    data = problem.model_dump()
    for stage in data["stages"]:
        stage["backward"] = round(ratio * (stage["backward_input"] + stage["backward_weight"]), 6)
    return Problem.model_validate(data)


def kinds(schedule) -> set[str]:
    return {op.kind for ops in schedule.devices for op in ops}


def assert_valid(schedule) -> None:
    assert validate(schedule.problem, schedule.devices) == []
    assert schedule.fits_memory()


def split_families(problem: Problem) -> dict[str, float]:
    """Makespan of every applicable family whose schedule splits its backwards."""
    found = {}
    for generator in applicable(problem):
        schedule = simulate(problem, generator.build(problem))
        if Kind.W in kinds(schedule) and schedule.fits_memory():
            found[generator.name] = schedule.makespan
    return found


# Zero Bubble's shape, where fusing saves 40% of the backward: splitting never pays.
FUSING_WINS = with_fused(uniform_problem(3, 4, 1.0, 1.0, 1.0, comm_time=0.0, mem_backward_input=-0.5), 0.6)
# Fusing saves only 2%: the split schedules fill the bubbles with W and win.
SPLITTING_WINS = with_fused(uniform_problem(3, 4, 1.0, 1.0, 1.0, comm_time=0.0, mem_backward_input=-0.5), 0.98)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["cpsat", "milp", "auto"])
def test_where_splitting_does_not_pay_the_solvers_fuse_and_beat_every_split_family(method):
    schedule = solve(FUSING_WINS, method, SolveOptions(time_limit=20))
    assert_valid(schedule)
    assert schedule.metrics.status == "optimal"
    # Fused backwards are what make it short: the same order with every backward split is slower.
    assert Kind.BW in kinds(schedule)
    assert schedule.makespan < simulate(FUSING_WINS, split_fused(schedule.order())).makespan * (1 - 1e-6)
    families = split_families(FUSING_WINS)
    assert {"zb-h1", "zb-h2"} <= set(families)  # the comparison is not empty
    assert all(schedule.makespan < makespan * (1 - 1e-6) for makespan in families.values()), families


@pytest.mark.slow
@pytest.mark.parametrize("method", ["cpsat", "milp", "auto"])
def test_where_splitting_pays_the_solvers_split(method):
    schedule = solve(SPLITTING_WINS, method, SolveOptions(time_limit=20))
    assert_valid(schedule)
    assert schedule.metrics.status == "optimal"
    assert Kind.W in kinds(schedule)
    fused_1f1b = simulate(SPLITTING_WINS, applicable_by_name(SPLITTING_WINS, "1f1b").build(SPLITTING_WINS))
    assert kinds(fused_1f1b) == {Kind.F, Kind.BW}
    assert schedule.makespan < fused_1f1b.makespan * (1 - 1e-6)


def applicable_by_name(problem: Problem, name: str):
    return next(g for g in applicable(problem) if g.name == name)


# Tiny cases where either choice can win somewhere: brute force enumerates both.
TINY = [
    pytest.param(with_fused(uniform_problem(2, 2, 1.0, 1.0, 1.0, comm_time=0.1, mem_backward_input=-0.5), 0.7), id="p2-m2-uniform-0.7"),
    pytest.param(sliced_problem(random.Random(1), 2, 2, 1, fused_ratio=0.8), id="p2-m2-random-0.8"),
    pytest.param(sliced_problem(random.Random(2), 2, 2, 1, limit=1.5, fused_ratio=0.9), id="p2-m2-random-0.9-limit"),
    pytest.param(sliced_problem(random.Random(3), 2, 1, 2, fused_ratio=0.75), id="p2-m1-K2-random-0.75"),
    pytest.param(sliced_problem(random.Random(4), 2, 1, 1, placement="vshape", fused_ratio=0.6), id="p2-m1-vshape-0.6"),
]


@pytest.mark.slow
@pytest.mark.parametrize("problem", TINY)
@pytest.mark.parametrize("method", ["cpsat", "milp"])
def test_models_with_the_choice_match_brute_force(problem, method):
    optimum = brute_force_optimum(problem)
    schedule = solve(problem, method, SolveOptions(time_limit=30))
    assert_valid(schedule)
    assert schedule.metrics.status == "optimal"  # an exact time grid: the proof holds
    assert schedule.makespan == pytest.approx(optimum, rel=CLOSE)
    assert lower_bound(problem).value <= optimum * (1 + CLOSE)


@pytest.mark.parametrize("problem", TINY[:3])
def test_without_symmetry_breaking_the_optimum_is_the_same(problem):
    broken = solve(problem, "cpsat", SolveOptions(time_limit=30))
    unbroken = solve(problem, "cpsat", SolveOptions(time_limit=30, symmetry_breaking=False))
    assert broken.makespan == pytest.approx(unbroken.makespan, rel=CLOSE)


def test_canonical_keeps_fused_backwards_that_win_and_is_never_slower():
    rng = random.Random(7)
    for ratio in (0.6, 1.0, 1.3):
        problem = sliced_problem(rng, 3, 3, 2, fused_ratio=ratio)
        for _ in range(20):
            orders = random_feasible_order(problem, rng, fused_share=0.5)
            original = simulate(problem, orders)
            relabelled = simulate(problem, canonical(orders, problem))
            assert relabelled.makespan <= original.makespan * (1 + CLOSE)
            assert max(relabelled.metrics.peak_memory) <= max(original.metrics.peak_memory) + 1e-9
            fused_before = sum(op.kind == Kind.BW for ops in orders for op in ops)
            fused_after = sum(op.kind == Kind.BW for ops in relabelled.order() for op in ops)
            assert fused_after == (fused_before if ratio < 1 else 0)


@pytest.mark.parametrize("problem", TINY)
def test_auto_bound_with_the_split_relaxation_never_exceeds_the_optimum(problem):
    # auto's bound: bounds.py and the device relaxations on the relaxed split problem
    # (slicebounds.split_relaxation) where fusing can win, slicebounds' own with slices.
    optimum = brute_force_optimum(problem)
    schedule = solve(problem, "auto", SolveOptions(time_limit=5))
    assert schedule.metrics.lower_bound is not None
    assert schedule.metrics.lower_bound <= optimum * (1 + CLOSE)
    assert schedule.makespan == pytest.approx(optimum, rel=CLOSE)


def test_split_relaxation_is_a_plain_problem_with_the_cheaper_backward():
    problem = TINY[0].values[0]
    assert isinstance(problem, Problem)
    relaxed = split_relaxation(problem)
    assert relaxed is not None and relaxed is not problem
    for stage, plain in zip(problem.stages, relaxed.stages):
        assert plain.backward is None
        assert plain.backward_input == pytest.approx(min(stage.backward_input, stage.fused_backward()))
        assert plain.backward_input + plain.backward_weight == pytest.approx(stage.fused_backward())
        assert plain.memory == stage.memory

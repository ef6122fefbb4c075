"""The Python API refuses what it cannot use in one InputError naming it, as the command line does.

A start of another problem came back as the result, marked optimal; a NaN time limit
never ended; a NaN or infinite pareto limit became a point "proven infeasible"; a
schedule with NaN times passed the validator; the errors that carry two arguments could
not cross a process pool."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from optimizer.errors import DeadlockError, InputError, ScheduleError
from optimizer.exact import SolveOptions, pareto, solve
from optimizer.exact.options import checked_options
from optimizer.problem import uniform_problem
from optimizer.schedule import Schedule
from optimizer.schedules import generate
from optimizer.validate import validate

pytestmark = pytest.mark.solver

PROBLEM = uniform_problem(4, 8, memory_limit=4)


def test_a_start_of_another_problem_or_order_is_refused_naming_it():
    other = generate(uniform_problem(4, 2), "1f1b")
    with pytest.raises(InputError, match="starts: theirs"):
        solve(PROBLEM, "auto", SolveOptions(time_limit=1), starts=[("theirs", other)])
    full = generate(PROBLEM, "1f1b")
    half = Schedule(PROBLEM, "half", [ops[: len(ops) // 2] for ops in full.devices])
    with pytest.raises(InputError, match="starts: half"):
        solve(PROBLEM, "auto", SolveOptions(time_limit=1), starts=[("half", half)])
    with pytest.raises(InputError, match="a \\(name, Schedule\\) pair"):
        solve(PROBLEM, "auto", SolveOptions(time_limit=1), starts=[full])


def test_a_start_counts_by_its_order_timed_on_the_problem_and_the_limit():
    # Built without the limit, 1F1B holds 4 here; at a limit of 3 it is no result.
    tight = uniform_problem(4, 8, memory_limit=3)
    unlimited_start = generate(uniform_problem(4, 8), "1f1b")
    result = solve(tight, "auto", SolveOptions(time_limit=2), starts=[("theirs", unlimited_start)])
    assert result.problem.memory_limit == 3 and result.fits_memory()
    assert validate(tight, result.devices) == []
    # Times that break every rule (every op at 0): only the order counts, timed here.
    squashed = Schedule(
        PROBLEM, "squashed", [[op._replace(start=0.0, end=1.0) for op in ops] for ops in generate(PROBLEM, "zb-h1").devices]
    )
    result = solve(PROBLEM, "auto", SolveOptions(time_limit=2), starts=[("squashed", squashed)])
    assert validate(PROBLEM, result.devices) == []
    assert result.makespan >= result.metrics.lower_bound * (1 - 1e-9) > 1.0


@pytest.mark.parametrize(
    "options, field",
    [
        (SolveOptions(time_limit=math.nan), "time_limit"),
        (SolveOptions(time_limit=math.inf), "time_limit"),
        (SolveOptions(time_limit=1e12), "time_limit"),
        (SolveOptions(time_limit=10**400), "time_limit"),  # beyond any float
        (SolveOptions(time_limit=-1), "time_limit"),
        (SolveOptions(seed=2**40), "seed"),
        (SolveOptions(seed=1.5), "seed"),
        (SolveOptions(threads=0), "threads"),
        (SolveOptions(threads=10**6), "threads"),
        (SolveOptions(objective="fast"), "objective"),
        (SolveOptions(symmetry_breaking="no"), "symmetry_breaking"),
        (SolveOptions(solver=None), "solver"),
    ],
)
def test_options_out_of_range_are_refused_before_any_work(options, field):
    with pytest.raises(InputError, match=rf"^{field}:"):
        solve(PROBLEM, "auto", options)
    with pytest.raises(InputError, match=rf"^{field}:"):
        pareto(PROBLEM, [4.0], options)


def test_numpy_integers_are_taken_as_integers():
    options = checked_options(SolveOptions(time_limit=np.float64(1.0), seed=np.int64(3), threads=np.int32(1)))
    assert (type(options.seed), type(options.threads), type(options.time_limit)) == (int, int, float)
    assert solve(PROBLEM, "auto", SolveOptions(time_limit=1, seed=np.int64(3))).fits_memory()


def test_a_problem_that_is_not_one_is_named():
    with pytest.raises(InputError, match="problem: expected a Problem"):
        solve({"num_devices": 4}, "auto", SolveOptions(time_limit=1))


@pytest.mark.parametrize("limits", [[math.inf], [math.nan], [-1.0], ["4"], [True], [[1.0, math.nan]], 5, [10**400], [[10**400, 1.0]]])
def test_pareto_limits_given_in_python_are_checked(limits):
    with pytest.raises(InputError, match=r"^limits"):
        pareto(PROBLEM, limits, SolveOptions(time_limit=1))


def test_pareto_takes_at_most_a_thousand_limits():
    with pytest.raises(InputError, match="1001 limits is more than the 1000"):
        pareto(PROBLEM, [4.0] * 1001, SolveOptions(time_limit=1))


def test_the_validator_refuses_times_that_are_not_finite():
    schedule = generate(PROBLEM, "1f1b")
    for bad in (math.nan, math.inf):
        devices = [list(ops) for ops in schedule.devices]
        devices[1][0] = devices[1][0]._replace(start=bad, end=bad)
        assert any(v.startswith("time: F(stage 1, mb 0) on device 1") for v in validate(PROBLEM, devices))


def test_errors_with_two_arguments_cross_processes():
    from optimizer.split import SplitInfeasible
    from runtime.launch import LaunchError

    errors = [
        DeadlockError("deadlock: device 0 waits at F", {0: "F"}),
        ScheduleError("s.json", ["a", "b"]),
        SplitInfeasible("memory_limit: needs 20", 20.0),
        LaunchError("rank 1 failed", 1),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error) and vars(copy) == vars(error)
    assert pickle.loads(pickle.dumps(DeadlockError("x", {1: "B"}))).blocked == {1: "B"}
    assert pickle.loads(pickle.dumps(ScheduleError("s", ["v"]))).violations == ["v"]


def test_numpy_numbers_and_list_pairs_are_taken():
    options = checked_options(SolveOptions(time_limit=np.float32(1.0), seed=np.int64(1)))
    assert options.time_limit == 1.0 and type(options.time_limit) is float
    assert checked_options(SolveOptions(time_limit=np.int64(2))).time_limit == 2.0
    start = generate(PROBLEM, "zb-h1")
    result = solve(PROBLEM, "auto", SolveOptions(time_limit=1), starts=[["mine", start]])
    assert result.makespan <= start.makespan * (1 + 1e-9)


def test_pareto_takes_per_device_limits_and_names_a_list_of_the_wrong_length():
    curve = pareto(uniform_problem(2, 4), [[2.0, 2.0], [3.0, 2.0]], SolveOptions(time_limit=1))
    assert [p.limit for p in curve.points] == [[2.0, 2.0], [3.0, 2.0]] and all(p.feasible for p in curve.points)
    with pytest.raises(InputError, match="a list of 2 of them, one per device"):
        pareto(uniform_problem(2, 4), [[2.0, 2.0, 2.0]], SolveOptions(time_limit=1))
    with pytest.raises(InputError, match="problem: expected a Problem"):
        pareto({"num_devices": 2}, [2.0], SolveOptions(time_limit=1))


def test_the_exported_lower_bound_holds_for_every_problem_kind():
    """`optimizer.exact.lower_bound` was the bound of problems without token slices, fused
    choices or vocabulary passes: with a fused backward of 0.5 against B + W = 2 it said 14
    where `auto` proves 9 optimal."""
    from optimizer.exact import lower_bound

    fused = uniform_problem(3, 4, 1, 1, 1, backward=0.5)
    solved = solve(fused, "auto", SolveOptions(time_limit=5))
    assert solved.metrics.status == "optimal"
    assert lower_bound(fused).value <= solved.makespan * (1 + 1e-9)
    with pytest.raises(InputError, match="objective: 'fastest'"):
        lower_bound(fused, "fastest")
    with pytest.raises(InputError, match="problem: expected a Problem"):
        lower_bound({"num_devices": 3})


@pytest.mark.parametrize("call", ["generate", "applicable", "simulate", "validate"])
def test_functions_that_take_a_problem_name_what_they_got(call):
    from optimizer import schedules, simulate

    calls = {
        "generate": lambda bad: schedules.generate(bad, "1f1b"),
        "applicable": schedules.applicable,
        "simulate": lambda bad: simulate.simulate(bad, []),
        "validate": lambda bad: validate(bad, []),
    }
    with pytest.raises(InputError, match=r"problem: expected a Problem .* got dict"):
        calls[call]({"num_devices": 4})  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [4.0, "4", None, True])
def test_uniform_problem_names_a_count_that_is_not_an_integer(bad):
    with pytest.raises(InputError, match=r"^num_devices: must be an integer"):
        uniform_problem(bad, 8)


def test_uniform_problem_takes_numpy_integers():
    problem = uniform_problem(np.int64(4), np.int32(8))  # type: ignore[arg-type]
    assert (problem.num_devices, problem.num_microbatches) == (4, 8)

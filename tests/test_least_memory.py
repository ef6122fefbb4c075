"""The least limit any schedule fits (fused backwards where a B allocates), the order that reaches it, and `auto` there."""

from __future__ import annotations

import random

import exact_brute_force
import pytest
from factories import PLACEMENTS, random_problem, with_vocab
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.errors import InfeasibleError
from optimizer.exact import SolveOptions, solve
from optimizer.exact.least_memory import least_memory_orders
from optimizer.problem import Problem
from optimizer.simulate import simulate
from optimizer.validate import validate


def allocating(problem: Problem, rng: random.Random) -> Problem:
    """The problem with every B allocating a random share of its forward (held until its W)."""
    data = problem.to_json()
    for stage in data["stages"]:
        forward = stage["memory"]["forward"]
        grows = round(rng.uniform(0.1, 0.5) * forward, 6)
        stage["memory"]["backward_input"] = grows
        stage["memory"]["backward_weight"] = -(forward + grows)
    return Problem.model_validate(data)


def at_limit(problem: Problem, limits: list[float]) -> Problem:
    return problem.model_copy(update={"memory_limit": limits})


CASES = [
    (placement, slices, barriers, allocates)
    for placement in PLACEMENTS
    for slices, barriers in ((1, 0), (2, 0), (1, 1), (1, 2))  # vocabulary passes without token slices
    for allocates in (False, True)
]


@pytest.mark.parametrize(("placement", "slices", "barriers", "allocates"), CASES)
def test_least_memory_order_reaches_exactly_the_least_limit(placement, slices, barriers, allocates):
    rng = random.Random(f"{placement}{slices}{barriers}{allocates}")
    problem = random_problem(rng, rng.randint(2, 4), rng.randint(1, 5), placement, slices=slices)
    if allocates:
        problem = allocating(problem, rng)
    if barriers:
        problem = with_vocab(problem, barriers=barriers, memory=rng.uniform(0.0, 1.0))
    need = problem.min_memory_limit()
    assert all(fused <= split for fused, split in zip(need, problem.split_memory_limit()))
    tight = at_limit(problem, need)
    schedule = simulate(tight, least_memory_orders(tight))
    assert validate(tight, schedule.devices) == []
    assert schedule.fits_memory()
    # Every device reaches its need: the limit is the least the order fits, so it is exact.
    assert schedule.metrics.peak_memory == pytest.approx(need, rel=1e-9)


def test_a_split_peak_is_above_the_fused_one_where_b_allocates():
    problem = allocating(random_problem(random.Random(3), 3, 2, "vshape"), random.Random(3))
    assert all(fused < split for fused, split in zip(problem.min_memory_limit(), problem.split_memory_limit()))


@pytest.mark.solver
@pytest.mark.parametrize("seed", range(4))
def test_between_the_fused_and_the_split_limit_auto_finds_the_optimum(seed, monkeypatch):
    """Where only fused backwards fit, `auto` returns a fitting schedule (before, it said
    none fits) as short as the brute-force optimum over fused and split backwards."""
    rng = random.Random(seed)
    problem = allocating(random_problem(rng, 2, 2, decimals=1), rng)
    fused, split = problem.min_memory_limit(), problem.split_memory_limit()
    limits = [(f + s) / 2 for f, s in zip(fused, split)]
    band = at_limit(problem, limits)
    monkeypatch.setattr(exact_brute_force, "fusing_can_win", lambda tables, stage, slice=0: True)
    optimum = exact_brute_force.brute_force_optimum(band)
    schedule = solve(band, "auto", SolveOptions(time_limit=5, threads=1))
    assert validate(band, schedule.devices) == []
    assert schedule.fits_memory()
    assert schedule.makespan == pytest.approx(optimum, rel=1e-6)
    with pytest.raises(InfeasibleError, match="smallest limit that fits"):
        solve(at_limit(problem, [f * 0.99 for f in fused]), "auto", SolveOptions(time_limit=2, threads=1))


def test_cli_solves_a_limit_only_fused_backwards_fit(tmp_path):
    problem = Problem.model_validate(
        {
            "num_devices": 2,
            "num_microbatches": 2,
            "stages": [
                {
                    "device": d,
                    "forward": 1.0,
                    "backward_input": 1.0,
                    "backward_weight": 1.0,
                    "memory": {"forward": 1.0, "backward_input": 0.5, "backward_weight": -1.5},
                }
                for d in range(2)
            ],
            "memory_limit": 1.2,
        }
    )
    path, out = tmp_path / "p.json", tmp_path / "s.json"
    path.write_text(problem.model_dump_json())
    runner = CliRunner()
    result = runner.invoke(app, ["solve", str(path), "-o", str(out), "--time-limit", "2", "-q"])
    assert result.exit_code == 0, result.output  # exit 3 ("needs 1.5") before
    result = runner.invoke(app, ["solve", str(path), "-o", str(out), "--method", "greedy"])
    assert result.exit_code == 3 and "fused backwards fit" in result.output, result.output


@pytest.mark.solver
def test_split_search_fits_a_limit_only_fused_backwards_fit():
    """Blocks whose B allocates, under a limit between the fused and the split need: the
    split search finds a fitting schedule (no family does) instead of calling it infeasible."""
    from optimizer.balance import choose_split
    from optimizer.layers import layers_from_json
    from optimizer.split import Placement, even_split, memory_need

    block = {
        "kind": "block",
        "forward": 1.0,
        "backward_input": 1.0,
        "backward_weight": 1.0,
        "memory": {"forward": 1.0, "backward_input": 0.5, "backward_weight": -1.5},
    }
    profile = layers_from_json({"format": "pipesched.layers", "version": 1, "layers": [{"name": f"b{i}", **block} for i in range(4)]})
    placement = Placement.named("linear", 2)
    need = max(memory_need(profile, placement, even_split(profile, 2)))  # fused: the two blocks' forwards
    assert need == pytest.approx(2.0)
    result = choose_split(profile, placement, 3, need * 1.1, SolveOptions(time_limit=2, threads=1), lambda p, o: solve(p, "auto", o))
    chosen = result.chosen
    assert chosen.schedule is not None and chosen.problem is not None and chosen.schedule.fits_memory()
    assert validate(chosen.problem, chosen.schedule.devices) == []


@pytest.mark.slow
@pytest.mark.solver
@pytest.mark.parametrize("method", ["auto", "cpsat"])
@pytest.mark.parametrize("above", [0.0, 0.2])
def test_vocabulary_passes_and_an_allocating_b_solve_at_and_above_the_split_need(method, above):
    """The list scheduler orders the problem without the passes under a limit lowered by one
    pass; it must not run (and refuse) where that lowered limit is below its split need."""
    rng = random.Random(7)
    problem = with_vocab(allocating(random_problem(rng, 2, 4), rng), barriers=2, memory=0.1)
    limits = [need + above for need in problem.split_memory_limit()]
    limited = at_limit(problem, limits)
    schedule = solve(limited, method, SolveOptions(time_limit=3, threads=1))
    assert validate(limited, schedule.devices) == []
    assert schedule.fits_memory()

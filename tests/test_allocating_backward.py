"""A B that allocates memory (a gradient buffer its W reads) under a memory limit.

B then W holds that allocation between them and a fused BW never does, so under a tight
limit the fused backward can be the only way to run a microbatch, even where it is no
shorter. Every solver must keep that choice: a status "optimal" that a schedule with
fused backwards beats, or a lower bound above one, is a false proof.
"""

from __future__ import annotations

import random

import exact_brute_force
import pytest

from optimizer.exact import SolveOptions, solve
from optimizer.exact.slicebounds import lower_bound
from optimizer.io import validate_model
from optimizer.ops import fusing_can_win
from optimizer.problem import Problem
from optimizer.validate import validate

pytestmark = [pytest.mark.solver, pytest.mark.slow]


def allocating_problem(seed: int, p: int = 2, m: int = 2, headroom: float | None = None) -> Problem:
    """Random times on a 0.1 grid; each B allocates, W frees it and the forward's allocation."""
    rng = random.Random(seed)
    stages, allocations = [], []
    for d in range(p):
        allocated = round(rng.uniform(0.1, 0.8), 2)
        allocations.append(allocated)
        stages.append(
            {
                "device": d,
                "forward": round(rng.uniform(0.5, 2.0), 1),
                "backward_input": round(rng.uniform(0.5, 2.0), 1),
                "backward_weight": round(rng.uniform(0.5, 2.0), 1),
                "memory": {"forward": 1.0, "backward_input": allocated, "backward_weight": -(1.0 + allocated)},
            }
        )
    data: dict = {"num_devices": p, "num_microbatches": m, "stages": stages}
    if headroom is not None:
        # Between two forwards' worth and what the split path needs, where fusing matters.
        data["memory_limit"] = round(2.0 + headroom * max(allocations), 2)
    return validate_model(Problem, data, "problem")


def test_fusing_counts_as_a_choice_only_under_a_limit():
    limited, unlimited = allocating_problem(0, headroom=0.5), allocating_problem(0)
    assert all(fusing_can_win(limited.tables(), s) for s in range(limited.num_stages))
    assert not any(fusing_can_win(unlimited.tables(), s) for s in range(unlimited.num_stages))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("method", ["auto", "cpsat", "milp"])
def test_no_false_proof_when_backwards_allocate(seed, method, monkeypatch):
    problem = allocating_problem(seed, headroom=random.Random(seed).uniform(0.0, 1.2))
    # Brute force over fused and split backwards everywhere (a BW is always a legal op),
    # independently of the solvers' own rule for where fusing can win.
    monkeypatch.setattr(exact_brute_force, "fusing_can_win", lambda tables, stage, slice=0: True)
    optimum = exact_brute_force.brute_force_optimum(problem)
    assert lower_bound(problem).value <= optimum * (1 + 1e-9)
    schedule = solve(problem, method, SolveOptions(time_limit=10))
    assert validate(problem, schedule.devices) == []
    assert schedule.metrics.lower_bound is not None and schedule.metrics.lower_bound <= optimum * (1 + 1e-9)
    # The solvers work on the problem's exact 0.1 grid, so a proven optimum is the optimum.
    if schedule.metrics.status == "optimal":
        assert schedule.makespan == pytest.approx(optimum, rel=1e-9)
    assert schedule.makespan >= optimum * (1 - 1e-9)

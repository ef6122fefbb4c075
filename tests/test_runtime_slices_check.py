"""Token-sliced schedules run by the executor on 2 and 4 gloo ranks match one process.

The problem has two sequences cut into four uneven slices (TeraPipe's dynamic program
under attention costs, so later slices are shorter); the schedules are the sliced
families and the optimizer's own (also on the V placement). One launch per world size runs them all (starting
ranks is the slow part). Each schedule's transfers must also pair up on a backend that
matches them by order (runtime/pairing.py), since gloo would not notice.
"""

from __future__ import annotations

import pytest
from test_runtime_families import Batch, tiny_model

from optimizer.exact import SolveOptions, solve
from optimizer.problem import Problem, uniform_problem
from optimizer.schedules import generate
from optimizer.slicing import slice_model, with_slices
from runtime.launch import launch
from runtime.pairing import pairing_deadlock
from runtime.plan import build_plans
from runtime.worker import RunJob

pytestmark = [pytest.mark.runtime, pytest.mark.slow]

FAMILIES = ("terapipe", "seq1f1b", "seq1f1b-zb")
SEQUENCE = 16  # tiny_model's seq_len


def sliced_problem(p: int, placement: str = "linear") -> Problem:
    cut = slice_model(SEQUENCE, 4, lengths="dp", cost="attention", hidden=1, stages=p)  # attention-dominated: 6, 4, 3, 3 tokens
    assert len(set(cut.lengths)) > 1, "uneven slices exercise the bounds"
    return with_slices(uniform_problem(p, 2, placement=placement), cut)


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def sliced_runs(request):
    p = request.param
    problem = sliced_problem(p)
    schedules = {family: generate(problem, family) for family in FAMILIES}
    schedules["auto"] = solve(problem, "auto", SolveOptions(time_limit=5, threads=1))
    # Two stages per device: a slice's activation and gradient are also handed over in memory.
    schedules["auto-vshape"] = solve(sliced_problem(p, "vshape"), "auto", SolveOptions(time_limit=5, threads=1))
    pairing = {name: pairing_deadlock(build_plans(schedule, p)) for name, schedule in schedules.items()}
    jobs = tuple(
        RunJob(s.to_json(), name, tiny_model(s.problem.num_stages), steps=1, check=True, timeout_s=60) for name, s in schedules.items()
    )
    return p, pairing, launch(Batch(jobs), p, threads=1)


@pytest.mark.parametrize("name", [*FAMILIES, "auto", "auto-vshape"])
def test_sliced_schedule_matches_single_process(sliced_runs, name):
    p, pairing, results = sliced_runs
    assert pairing[name] is None, pairing[name]
    summary = results[name]
    check = summary["check"]
    assert check["passed"], check.get("first_mismatch")
    assert check["max_relative_error"] < 1e-5
    assert summary["devices"] == p

"""`solve --certify`: the fluid bound, then the exact device relaxations (optimizer.exact.certify)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from factories import with_vocab
from typer.testing import CliRunner

from benchmarks.published import published_problem, setting_named
from optimizer.cli import app
from optimizer.exact import SolveOptions, devicebound, fluidbound, solve
from optimizer.exact.certify import certify
from optimizer.exact.devicebound import relaxation_applies
from optimizer.exact.incumbents import objective_value
from optimizer.formats.schedule_json import load_schedule
from optimizer.problem import uniform_problem

pytestmark = pytest.mark.solver

runner = CliRunner()


def _four_device_v_half():
    return published_problem(dataclasses.replace(setting_named("1.5B-p8-m24"), p=4, m=8), 3.0, "vshape")


@pytest.mark.slow
def test_the_relaxations_close_what_the_fluid_bound_leaves_on_a_small_problem(tmp_path, monkeypatch):
    # Without the fluid bound (made to prove nothing), the relaxations alone take the 1 s
    # solve's bound (389.7) to the schedule's span, 446.6 (15 s on loaded cores).
    monkeypatch.setattr(fluidbound, "certify", lambda schedule, objective, seconds: False)
    path, out = tmp_path / "problem.json", tmp_path / "schedule.json"
    path.write_text(_four_device_v_half().model_dump_json())
    args = ["solve", str(path), "-o", str(out), "--time-limit", "1", "--objective", "span", "--json", "--quiet"]
    plain = json.loads(runner.invoke(app, args).stdout.strip().splitlines()[-1])
    result = runner.invoke(app, [*args, "--certify", "120"])
    assert result.exit_code == 0, result.output
    certified = json.loads(result.stdout.strip().splitlines()[-1])
    assert plain["gap"] > 0.05
    assert certified["gap"] == 0.0 and certified["status"] == "optimal"  # closed, as the solver says it
    assert certified["lower_bound"] == certified["longest_span"]
    assert load_schedule(out).metrics.lower_bound == pytest.approx(certified["lower_bound"])


def test_a_bound_above_the_schedule_is_never_taken(monkeypatch):
    # A relaxation's optimum is at most the schedule's value; should one ever say more, the
    # schedule must not come out "closed" (or with a bound above its own span).
    problem = _four_device_v_half()
    schedule = solve(problem, "auto", SolveOptions(time_limit=0.5, objective="span"))
    value = objective_value(schedule, "span")
    before = schedule.metrics.lower_bound
    assert before is not None and schedule.metrics.gap

    def overclaiming(relaxed, *, on_bound, **options):
        on_bound(value * 1.01, "too high")
        on_bound(before + 1.0, "a rise")
        return before + 1.0

    monkeypatch.setattr(fluidbound, "certify", lambda schedule, objective, seconds: False)
    monkeypatch.setattr(devicebound, "device_subset_bound", overclaiming)
    assert certify(schedule, "span", 5.0)
    assert schedule.metrics.lower_bound == pytest.approx(before + 1.0)
    assert schedule.metrics.gap == pytest.approx((value - before - 1.0) / value)


def test_the_relaxations_are_left_out_where_they_do_not_apply(monkeypatch):
    vocab = with_vocab(uniform_problem(2, 4, memory_limit=3.0))
    big = uniform_problem(8, 256, placement="vshape", memory_limit=4.0)
    assert not relaxation_applies(big, "span") and not relaxation_applies(big, "makespan")
    assert relaxation_applies(_four_device_v_half(), "span") and relaxation_applies(_four_device_v_half(), "makespan")
    assert relaxation_applies(uniform_problem(2, 4, memory_limit=3.0), "span") and not relaxation_applies(vocab, "span")


def test_a_short_certification_goes_to_the_relaxations_where_they_apply(monkeypatch):
    # With half of 2 s the fluid bound (its worker starting) proved nothing and left the
    # relaxations no time: below FLUID_MIN_SECONDS they get it all.
    from optimizer.exact import certify as certify_module

    problem = _four_device_v_half()
    schedule = solve(problem, "auto", SolveOptions(time_limit=0.5, objective="span"))
    calls: list[str] = []

    def fluid(*args) -> bool:
        calls.append("fluid")
        return False

    def relaxations(relaxed, **options) -> float:
        calls.append("relaxations")
        return 0.0

    monkeypatch.setattr(fluidbound, "certify", fluid)
    monkeypatch.setattr(devicebound, "device_subset_bound", relaxations)
    certify(schedule, "span", certify_module.FLUID_MIN_SECONDS / 2)
    assert calls == ["relaxations"]
    calls.clear()
    certify(schedule, "span", certify_module.FLUID_MIN_SECONDS * 2)
    assert calls == ["fluid", "relaxations"]

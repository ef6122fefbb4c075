"""A schedule file's metrics are checked against its ops in the file's own units.

Times in seconds and memory in GiB put every value below 1, where a slack of 1e-6
absolute would let a claim 0.03% off (or twice the makespan at 1e-9 s ops) through."""

from __future__ import annotations

import pytest

from optimizer.errors import InputError
from optimizer.formats.schedule_json import schedule_from_json, schedule_to_json
from optimizer.problem import uniform_problem
from optimizer.schedules import generate
from optimizer.validate import apart


def _file(scale: float, memory_scale: float) -> dict:
    problem = uniform_problem(
        4,
        8,
        1.0 * scale,
        1.0 * scale,
        1.0 * scale,
        mem_forward=1.0 * memory_scale,
        mem_backward_input=-0.6 * memory_scale,
        memory_limit=10 * memory_scale,
    )
    return schedule_to_json(generate(problem, "zb-h1"))


@pytest.mark.parametrize("scale, memory_scale", [(1.0, 1.0), (1e-4, 1e-3), (1e-9, 1e-9), (1e6, 1e9)])
def test_claims_off_by_a_ten_thousandth_are_refused_in_any_unit(scale, memory_scale):
    data = _file(scale, memory_scale)
    schedule_from_json(data)  # as written: accepted
    metrics = data["metrics"]
    for name, edit in [
        ("makespan", lambda m: m.update(makespan=m["makespan"] * (1 + 1e-4))),
        ("peak_memory", lambda m: m.update(peak_memory=[v * (1 + 1e-4) for v in m["peak_memory"]])),
        ("lower_bound", lambda m: m.update(lower_bound=m["makespan"] * (1 + 1e-5), gap=0.0, status="optimal")),
    ]:
        edited = {**data, "metrics": dict(metrics)}
        edit(edited["metrics"])
        with pytest.raises(InputError, match=f"metrics.{name}"):
            schedule_from_json(edited)


def test_claims_within_float_rounding_are_accepted_in_any_unit():
    for scale in (1.0, 1e-9, 1e6):
        data = _file(scale, scale)
        metrics = data["metrics"]
        metrics["makespan"] *= 1 + 1e-12
        metrics["peak_memory"] = [v * (1 + 1e-12) for v in metrics["peak_memory"]]
        schedule_from_json(data)


def test_numbers_in_a_message_are_shown_until_they_differ():
    assert apart(1.5, 1.500001) == ("1.5", "1.500001")
    assert apart(3.0, 3.00000003) == ("3", "3.00000003")
    assert apart(2.0, 1.0) == ("2", "1")

"""`pipesched solve --method auto|cpsat|milp` and `pipesched pareto`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.formats.schedule_json import load_schedule
from optimizer.problem import uniform_problem

pytestmark = pytest.mark.solver

runner = CliRunner()


def write_problem(tmp_path, **kwargs):
    problem = uniform_problem(3, 6, 1.0, 1.0, 0.6, comm_time=0.03, mem_backward_input=-0.63, **kwargs)
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(problem.model_dump(mode="json")))
    return path


def test_solve_auto_writes_a_valid_schedule_with_bound_and_gap(tmp_path):
    problem = write_problem(tmp_path, memory_limit=2.0)
    out = tmp_path / "schedule.json"
    result = runner.invoke(app, ["solve", str(problem), "-o", str(out), "--time-limit", "3", "--json"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"lower_bound", "gap", "status", "method_won", "solve_seconds"} <= metrics.keys()
    schedule = load_schedule(out)  # validates
    assert schedule.metrics.status in ("optimal", "feasible", "heuristic")


def test_solve_milp_with_highs_and_progress_on_stderr(tmp_path):
    problem = write_problem(tmp_path, memory_limit=2.0)
    out = tmp_path / "schedule.json"
    result = runner.invoke(app, ["solve", str(problem), "-o", str(out), "--method", "milp", "--solver", "highs", "--time-limit", "20"])
    assert result.exit_code == 0, result.output
    assert "bound" in result.stderr
    load_schedule(out)


def test_solve_infeasible_limit_exits_3_with_the_smallest_limit(tmp_path):
    problem = uniform_problem(2, 4, placement="vshape", memory_limit=1.5)
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(problem.model_dump(mode="json")))
    result = runner.invoke(app, ["solve", str(path), "-o", str(tmp_path / "s.json"), "-q"])
    assert result.exit_code == 3
    assert "smallest limit that fits is 2" in result.stderr
    assert "Traceback" not in result.output


def test_solve_unknown_objective_is_exit_2(tmp_path):
    problem = write_problem(tmp_path)
    result = runner.invoke(app, ["solve", str(problem), "-o", str(tmp_path / "s.json"), "--objective", "latency", "-q"])
    assert result.exit_code == 2
    assert "objective" in result.stderr


@pytest.mark.slow
def test_pareto_command_writes_curve_and_plot(tmp_path):
    problem = write_problem(tmp_path)
    curve, plot = tmp_path / "curve.json", tmp_path / "curve.svg"
    result = runner.invoke(app, ["pareto", str(problem), "--limits", "1:3:1", "--time-limit", "2", "-o", str(curve), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    data = json.loads(curve.read_text())
    assert [p["limit"] for p in data["points"]] == [1.0, 2.0, 3.0]
    assert all(p["feasible"] for p in data["points"])
    assert plot.exists() and "<svg" in plot.read_text()

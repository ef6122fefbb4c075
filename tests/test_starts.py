"""`solve --start`: a user's schedule (another scheduler's, an earlier solve's) starts the search."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from benchmarks.published import published_problem, setting_named
from optimizer.cli import app
from optimizer.exact import SolveOptions, solve
from optimizer.exact import portfolio as portfolio_module
from optimizer.exact.localsearch import local_search
from optimizer.exact.portfolio import starting_points
from optimizer.exact.tracker import Tracker
from optimizer.formats import torch_csv
from optimizer.formats.schedule_json import load_schedule, save_schedule
from optimizer.problem import uniform_problem
from optimizer.schedules import generate
from optimizer.starts import load_start
from optimizer.validate import validate

pytestmark = pytest.mark.solver

runner = CliRunner()


@pytest.mark.slow
def test_auto_returns_a_start_better_than_everything_it_builds(monkeypatch):
    # 1.5B, p = 8, m = 24 on the V placement at V-Min's memory: the order search shortens
    # v-auto (the best starting point) within a second. With the search phases off, `auto`
    # returns its best starting point, or the start given when that is shorter.
    problem = published_problem(setting_named("1.5B-p8-m24"), 4.0, "vshape")
    built = Tracker("makespan", 60.0)
    starting_points(problem, built)
    assert built.best is not None
    # A count of moves, not a time, so that the start does not depend on the machine's
    # speed (3,000 moves: 1573.6 -> 1564.5 ms, 0.9 s).
    searched = Tracker("makespan", 60.0)
    searched.offer(built.best, "built")
    searched.offer(local_search(problem, built.best.order(), deadline=math.inf, objective="makespan", max_moves=3000), "searched")
    assert searched.best is not None and searched.best_value < built.best_value * (1 - 1e-3)

    monkeypatch.setattr(portfolio_module, "PHASES", ())
    options = SolveOptions(time_limit=30, threads=1)
    alone = solve(problem, "auto", options)
    assert alone.makespan == pytest.approx(built.best_value)
    given = solve(problem, "auto", options, starts=[("start(searched.json)", searched.best)])
    assert given.makespan == pytest.approx(searched.best_value)
    assert given.metrics.method_won == "start(searched.json)"
    assert validate(problem, given.devices) == []


@pytest.mark.parametrize("method", ["auto", "cpsat"])
def test_a_start_is_never_beaten_by_a_worse_result(method):
    # GPipe's order is far from the best here: a start that is worse than what the solver
    # finds changes nothing, one that is the solver's own result is matched.
    problem = uniform_problem(3, 6, 1.0, 1.0, 0.6, comm_time=0.03, mem_backward_input=-0.63, memory_limit=6.0)
    options = SolveOptions(time_limit=5, threads=1)
    gpipe = generate(problem, "gpipe")
    result = solve(problem, method, options, starts=[("start(gpipe.json)", gpipe)])
    assert result.makespan < gpipe.makespan
    again = solve(problem, method, options, starts=[("start(result.json)", result)])
    assert again.makespan <= result.makespan * (1 + 1e-9)


def test_a_start_is_its_order_timed_on_the_problem(tmp_path):
    # Solved for other timings (an earlier profile): its order, timed on these.
    earlier = uniform_problem(3, 6, 1.0, 1.0, 1.0, memory_limit=3.0)
    now = uniform_problem(3, 6, 2.0, 1.0, 0.5, memory_limit=3.0)
    path = tmp_path / "earlier.json"
    save_schedule(generate(earlier, "zb-h1"), path)
    start = load_start(path, now)
    assert start.name == "start(earlier.json)"
    assert start.schedule.order() == generate(earlier, "zb-h1").order()
    assert start.schedule.makespan == pytest.approx(generate(now, "zb-h1").makespan)


def test_a_start_loaded_from_a_path_given_as_text_goes_into_solve(tmp_path):
    # As the README writes it: a str path, then (start.name, start.schedule) into `solve`.
    problem = uniform_problem(3, 6, 1.0, 1.0, 0.6, memory_limit=3.0)
    save_schedule(generate(problem, "zb-h1"), tmp_path / "theirs.json")
    start = load_start(str(tmp_path / "theirs.json"), problem)
    options = SolveOptions(time_limit=1, threads=1)
    result = solve(problem, "auto", options, starts=[(start.name, start.schedule)])
    assert result.makespan <= start.schedule.makespan * (1 + 1e-9)


def _files(tmp_path, problem):
    problem_path = tmp_path / "problem.json"
    problem_path.write_text(json.dumps(problem.model_dump(mode="json")))
    return problem_path


def _problem_and_theirs(tmp_path, limit, family):
    """The problem's file, and `family`'s schedule of it saved as FAMILY.json and FAMILY.csv."""
    problem = uniform_problem(3, 6, 1.0, 1.0, 0.6, comm_time=0.03, mem_backward_input=-0.63, memory_limit=limit)
    theirs = generate(problem, family)
    save_schedule(theirs, tmp_path / f"{family}.json")
    (tmp_path / f"{family}.csv").write_text(torch_csv.export_csv(theirs))
    return _files(tmp_path, problem), theirs


def test_cli_reports_how_much_shorter_than_each_start(tmp_path):
    problem_path, gpipe = _problem_and_theirs(tmp_path, 6.0, "gpipe")
    out = tmp_path / "out.json"
    args = ["solve", str(problem_path), "-o", str(out), "--time-limit", "2", "-q"]
    result = runner.invoke(app, [*args, "--start", str(tmp_path / "gpipe.json"), "--start", str(tmp_path / "gpipe.csv")])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("against --start")]
    assert len(lines) == 2 and all("shorter" in line and "no shorter" not in line for line in lines)
    assert load_schedule(out).makespan < gpipe.makespan

    result = runner.invoke(app, [*args, "--start", str(tmp_path / "gpipe.json"), "--json"])
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert metrics["starts"] == [{"file": str(tmp_path / "gpipe.json"), "makespan": pytest.approx(gpipe.makespan)}]


def test_cli_leaves_out_a_start_over_the_memory_limit(tmp_path):
    problem = uniform_problem(3, 6, 1.0, 1.0, 0.6, comm_time=0.03, mem_backward_input=-0.63, memory_limit=3.0)
    problem_path = _files(tmp_path, problem)
    save_schedule(generate(problem.model_copy(update={"memory_limit": None}), "gpipe"), tmp_path / "gpipe.json")
    out = tmp_path / "out.json"
    result = runner.invoke(
        app, ["solve", str(problem_path), "-o", str(out), "--time-limit", "1", "-q", "--start", str(tmp_path / "gpipe.json")]
    )
    assert result.exit_code == 0, result.output
    assert "over the memory limit" in result.stderr and "not used" in result.stderr
    assert load_schedule(out).fits_memory()


@pytest.mark.parametrize(
    "make_start,expected",
    [
        (lambda tmp: generate(uniform_problem(3, 4, memory_limit=3.0), "1f1b"), "invalid schedule: missing"),
        (
            lambda tmp: generate(uniform_problem(2, 6, memory_limit=3.0), "1f1b"),
            "invalid schedule: devices: schedule has 2 devices, the problem 3",
        ),
        (
            lambda tmp: generate(uniform_problem(3, 8, memory_limit=3.0), "1f1b"),
            "invalid schedule: device 0: F(stage 0, mb 6) is out of range (3 stages, 6 microbatches)",
        ),
        (None, "not a pipesched schedule"),
    ],
)
def test_cli_refuses_a_start_that_is_not_an_order_of_the_problem(tmp_path, make_start, expected):
    problem_path = _files(tmp_path, uniform_problem(3, 6, memory_limit=3.0))
    start = tmp_path / "theirs.json"
    if make_start is None:
        start.write_text("{}")
    else:
        save_schedule(make_start(tmp_path), start)
    out = tmp_path / "out.json"
    result = runner.invoke(app, ["solve", str(problem_path), "-o", str(out), "--time-limit", "1", "-q", "--start", str(start)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: --start: {start}") and expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize(
    "extra,expected",
    [
        (["--method", "1f1b"], "--start: only with --method auto, cpsat or milp"),
        (["--start", "PROBLEM"], "is also the input"),
    ],
)
def test_cli_refuses_start_where_it_cannot_apply(tmp_path, extra, expected):
    problem_path = _files(tmp_path, uniform_problem(3, 6, memory_limit=3.0))
    start = tmp_path / "theirs.json"
    save_schedule(generate(uniform_problem(3, 6, memory_limit=3.0), "1f1b"), start)
    output = str(start) if "PROBLEM" in extra else str(tmp_path / "out.json")
    extra = [str(start) if a == "PROBLEM" else a for a in extra]
    result = runner.invoke(app, ["solve", str(problem_path), "-o", output, "-q", "--start", str(start), *extra])
    assert result.exit_code == 2, result.output
    assert expected in result.stderr


def test_compare_adds_a_row_for_each_given_schedule(tmp_path):
    problem_path, _ = _problem_and_theirs(tmp_path, 3.0, "zb-h1")
    given = [arg for name in ("zb-h1.json", "zb-h1.csv") for arg in ("--schedule", str(tmp_path / name))]
    result = runner.invoke(app, ["compare", str(problem_path), "--json", *given])
    assert result.exit_code == 0, result.output
    rows = {row["method"]: row for row in json.loads(result.stdout)}
    for name in ("zb-h1.json", "zb-h1.csv"):
        assert rows[str(tmp_path / name)]["makespan"] == pytest.approx(rows["zb-h1"]["makespan"])

    save_schedule(generate(uniform_problem(3, 4, memory_limit=3.0), "1f1b"), tmp_path / "other.json")
    result = runner.invoke(app, ["compare", str(problem_path), "--schedule", str(tmp_path / "other.json")])
    assert result.exit_code == 2 and result.stderr.startswith(f"error: --schedule: {tmp_path / 'other.json'}")


def test_cli_reads_starts_within_the_time_limit_and_names_the_ones_left_unread(tmp_path, monkeypatch):
    # Reading a start at the size limit takes about a second: eight of them kept a 1 s
    # solve 9 s long. Reading counts against the limit; once it is spent the others are
    # named and not read, and the solver gets what is left.
    from types import SimpleNamespace

    from optimizer import cli as cli_module
    from optimizer import starts as starts_module

    problem = uniform_problem(3, 6, 1.0, 1.0, 0.6, comm_time=0.03)
    problem_path = _files(tmp_path, problem)
    for name in ("a", "b", "c"):
        save_schedule(generate(problem, "1f1b"), tmp_path / f"{name}.json")
    reading = starts_module.load_start
    # The command's clock, moved by the reads alone (0.3 s each): no dependence on the load.
    clock = SimpleNamespace(now=0.0)

    def slow_load(path, problem):
        clock.now += 0.3
        return reading(path, problem)

    monkeypatch.setattr(cli_module, "time", SimpleNamespace(monotonic=lambda: clock.now))

    given_limits: list[float] = []
    optimize = cli_module._optimize

    def recording_optimize(problem, method, time_limit, *rest):
        given_limits.append(time_limit)
        return optimize(problem, method, time_limit, *rest)

    monkeypatch.setattr(starts_module, "load_start", slow_load)
    monkeypatch.setattr(cli_module, "_optimize", recording_optimize)
    out = tmp_path / "out.json"
    args = ["solve", str(problem_path), "-o", str(out), "--time-limit", "0.5", "-q"]
    result = runner.invoke(app, [*args, *(f"--start={tmp_path / n}.json" for n in "abc")])
    assert result.exit_code == 0, result.output
    # 0.3 s per start: two are read (the limit is not spent after the first), the third is not.
    assert f"--start {tmp_path / 'c.json'}: not read" in result.stderr
    assert str(tmp_path / "b.json") not in result.stderr
    assert [line.split(":")[0] for line in result.stdout.splitlines() if line.startswith("against")] == [
        f"against --start {tmp_path / 'a.json'}",
        f"against --start {tmp_path / 'b.json'}",
    ]
    assert given_limits == [0.01]  # 0.6 s of reading left nothing of the 0.5 s but the least limit
    assert validate(problem, load_schedule(out).devices) == []
    # A file that is not there is refused whatever the time: every start is checked to be a
    # file before any is read.
    missing = tmp_path / "missing.json"
    clock.now = 0.0
    result = runner.invoke(app, [*args, *(f"--start={tmp_path / n}.json" for n in "abc"), f"--start={missing}"])
    assert result.exit_code == 2
    assert f"--start: {missing}: no such file" in result.stderr

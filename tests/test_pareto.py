"""Memory against speed: the sweep, its JSON and its picture."""

from __future__ import annotations

import json

import pytest

from optimizer.errors import InputError
from optimizer.exact import SolveOptions, pareto, parse_limits, plot_pareto, solve
from optimizer.problem import uniform_problem

pytestmark = [pytest.mark.solver, pytest.mark.slow]


def test_parse_limits():
    assert parse_limits("1:3:0.5") == [1.0, 1.5, 2.0, 2.5, 3.0]
    assert parse_limits("4") == [4.0]
    assert parse_limits("0.1:0.5:0.1") == [0.1, 0.2, 0.3, 0.4, 0.5]
    # Significant digits, not decimals: tiny limits stay the ones asked for.
    assert parse_limits("2e-13:8e-13:2e-13") == [2e-13, 4e-13, 6e-13, 8e-13]
    # HIGH reached but for a rounding (3.9999999979 steps) is kept.
    assert parse_limits("3:3.0000004:0.0000001") == [3.0, 3.0000001, 3.0000002, 3.0000003, 3.0000004]
    for bad in ("1:2", "a:b:c", "3:1:1", "1:2:0", "0:2:1"):
        with pytest.raises(InputError):
            parse_limits(bad)


def test_sweep_is_monotone_and_marks_infeasible_limits(tmp_path):
    problem = uniform_problem(3, 4, 1.0, 1.0, 0.6, comm_time=0.03, placement="vshape", mem_forward=0.5, mem_backward_input=-0.3)
    curve = pareto(problem, "0.5:3:0.5", SolveOptions(time_limit=3))
    by_limit = {p.limit: p for p in curve.points}
    assert not by_limit[0.5].feasible and "smallest limit that fits is 1" in by_limit[0.5].note
    assert by_limit[0.5].status == "infeasible"
    solved = [p for p in curve.points if p.feasible]
    assert [p.limit for p in solved] == [1.0, 1.5, 2.0, 2.5, 3.0]
    for p in solved:
        assert p.peak_memory <= p.limit + 1e-9
        assert p.bound <= p.makespan * (1 + 1e-9)
    # Tiny problems are solved to optimality, so more memory never makes them slower.
    makespans = [p.makespan for p in solved]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(makespans, makespans[1:]))
    assert {g.name for g in curve.generators} >= {"gpipe", "zb-v"}

    data = curve.to_json()
    json.dumps(data)
    assert data["format"] == "pipesched.pareto" and len(data["points"]) == 6

    svg = tmp_path / "curve.svg"
    plot_pareto(curve, svg)
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()
    with pytest.raises(InputError, match=r"curve\.png does not end in \.svg"):  # it wrote SVG into it
        plot_pareto(curve, tmp_path / "curve.png")
    assert not (tmp_path / "curve.png").exists()


def test_known_schedules_are_placed_as_their_papers_define_them():
    # GPipe's and 1F1B's backwards are fused (B and W as one op of 2 units here), as
    # `compare` times them, not split as the solver's starting points are.
    from optimizer.schedules import generate

    problem = uniform_problem(4, 8, 1.0, 1.0, 1.0)
    curve = pareto(problem, "4", SolveOptions(time_limit=2))
    placed = {g.name: g for g in curve.generators}
    unlimited = problem.model_copy(update={"memory_limit": None})
    for name in ("gpipe", "1f1b", "zb-h1"):
        own = generate(unlimited, name)
        assert placed[name].makespan == pytest.approx(own.makespan, rel=1e-12), name
        assert placed[name].peak_memory == pytest.approx(max(own.metrics.peak_memory), rel=1e-12), name
    assert placed["gpipe"].makespan == pytest.approx(33.0)  # (m + p - 1) * (F + B + W) = 11 * 3


def test_a_curve_interrupted_before_its_first_limit_plots_without_warnings():
    # Ctrl-C before the first limit left the right panel without labels, and matplotlib
    # printed a UserWarning among the command's lines.
    import warnings

    from optimizer.exact.frontier import ParetoCurve
    from optimizer.formats.pareto_svg import pareto_svg

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = pareto_svg(ParetoCurve(points=[], generators=[], time_limit=1.0, interrupted=True))
    assert text.startswith("<?xml")


def test_each_limit_starts_from_the_schedules_of_the_tighter_limits_that_fit_it(monkeypatch):
    # A looser limit could end with a longer schedule than a tighter one (the search's end
    # point varies: 4 of 132 random curves); the tighter limits' schedules now start it, and
    # `solve` never returns worse than a start that fits.
    from optimizer.exact import frontier

    given: dict[float, list[str]] = {}
    real_solve = frontier.solve

    def recording_solve(problem, method, options, on_progress=None, starts=(), retime_starts=True):
        given[problem.memory_limit] = [name for name, _ in starts]
        for _, schedule in starts:
            # schedules of this very problem, so that taking them untimed is right
            assert schedule.problem is problem and schedule.fits_memory()
        return real_solve(problem, method, options, on_progress, starts=starts, retime_starts=retime_starts)

    monkeypatch.setattr(frontier, "solve", recording_solve)
    curve = pareto(uniform_problem(4, 8), "2:4:1", SolveOptions(time_limit=0.5, threads=1))
    assert given[2.0] == []
    assert given[3.0] == ["point at limit 2"]  # limits named to 12 digits, as parsed
    assert given[4.0] == ["point at limit 2", "point at limit 3"]
    spans = [point.makespan for point in curve.points]
    assert all(later <= earlier + 1e-9 for earlier, later in zip(spans, spans[1:]))


def test_a_start_does_not_keep_the_fallback_families_out():
    # With a start that fits, the hand-made low-memory families (built when no known
    # schedule fits in time) were skipped: a pareto point at 0.1 s kept the tighter limit's
    # 278 where V-Min's schedule, 219, fits.
    from optimizer.schedules import generate

    problem = uniform_problem(8, 32, placement="vshape", memory_limit=8.0)
    v_min = generate(problem, "v-min")
    assert v_min.fits_memory()
    poor = generate(uniform_problem(8, 32, placement="vshape", memory_limit=8.0), "paced")
    assert poor.makespan > v_min.makespan  # the start is the worse of the two here
    solved = solve(problem, "auto", SolveOptions(time_limit=0.1, threads=1), starts=[("poor", poor)])
    assert solved.makespan <= v_min.makespan + 1e-9


def test_a_limit_where_nothing_was_found_in_time_is_unknown_not_infeasible(monkeypatch):
    """Only a proof makes a point infeasible; running out of time leaves it unknown."""
    from optimizer.exact import frontier
    from optimizer.exact.errors import NoScheduleFoundError

    def nothing_in_time(*args, **kwargs):
        raise NoScheduleFoundError("no schedule fitting the limit was found in time")

    monkeypatch.setattr(frontier, "solve", nothing_in_time)
    problem = uniform_problem(3, 4, 1.0, 1.0, 0.6, comm_time=0.03, placement="vshape", mem_forward=0.5, mem_backward_input=-0.3)
    curve = pareto(problem, [0.25, 2.0], SolveOptions(time_limit=1))
    by_limit = {p.limit: p for p in curve.points}
    assert [by_limit[0.25].status, by_limit[2.0].status] == ["infeasible", "unknown"]
    assert not by_limit[2.0].feasible and "in time" in by_limit[2.0].note


def test_the_same_curve_draws_the_same_svg():
    """No date, and element ids that do not change from run to run: users diff these files."""
    from optimizer.exact.frontier import GeneratorPoint, ParetoCurve, ParetoPoint
    from optimizer.formats.pareto_svg import pareto_svg

    curve = ParetoCurve(
        points=[ParetoPoint(1.0, False, status="infeasible"), ParetoPoint(2.0, True, 30.0, 0.2, 28.0, 0.07, "feasible", "greedy", 2.0)],
        generators=[GeneratorPoint("1f1b", 4.0, 27.0, 0.1)],
        time_limit=1.0,
    )
    first, second = pareto_svg(curve), pareto_svg(curve)
    assert first == second
    assert "<dc:date>" not in first
    assert "clip-path=" in first  # ids are still drawn, only fixed


def test_only_a_proven_infeasible_limit_is_shaded_as_no_schedule_fits():
    from optimizer.exact.frontier import GeneratorPoint, ParetoCurve, ParetoPoint
    from optimizer.formats.pareto_svg import pareto_svg

    def curve(status: str) -> ParetoCurve:
        return ParetoCurve(
            points=[ParetoPoint(1.0, False, status=status), ParetoPoint(2.0, True, 30.0, 0.2, 28.0, 0.07, "feasible", "greedy", 2.0)],
            generators=[GeneratorPoint("1f1b", 4.0, 27.0, 0.1)],
            time_limit=1.0,
        )

    assert "no schedule fits" in pareto_svg(curve("infeasible"))
    assert "no schedule fits" not in pareto_svg(curve("unknown"))

"""One format registry, one rule for which format a file gets (`--format`, else its name)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.errors import InputError
from optimizer.exact.frontier import GeneratorPoint, ParetoCurve, ParetoPoint
from optimizer.formats import formats, get_format
from optimizer.formats.choose import choose_format
from optimizer.formats.schedule_json import load_schedule, save_schedule
from optimizer.problem import uniform_problem
from optimizer.schedules import generate

pytestmark: list[pytest.MarkDecorator] = []  # pure Python and fast: no marker

runner = CliRunner()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize(
    ("file_name", "subject", "expected"),
    [
        ("s.json", "schedule", "schedule-json"),
        ("s.trace.json", "schedule", "chrome-trace"),
        ("S.TRACE.JSON", "schedule", "chrome-trace"),
        ("s.csv", "schedule", "torch-csv"),
        ("s.svg", "schedule", "svg"),
        ("s.html", "schedule", "html"),
        ("curve.json", "pareto", "pareto-json"),
        ("curve.svg", "pareto", "pareto-svg"),
    ],
)
def test_the_name_decides_without_format(file_name, subject, expected):
    assert choose_format(file_name, subject=subject).name == expected


def test_format_wins_over_the_name_and_unknowns_are_refused():
    assert choose_format("out.json", "chrome-trace").name == "chrome-trace"
    assert choose_format("out.txt", "torch-csv").name == "torch-csv"
    with pytest.raises(InputError, match=r"out\.txt: no format ends the name like this"):
        choose_format("out.txt")
    with pytest.raises(InputError, match="format: 'pareto-json' is not one of torch-csv, schedule-json"):
        choose_format("out.json", "pareto-json")  # a curve's format is not a schedule's
    with pytest.raises(InputError, match=r"a \.json file is a schedule-json; this command writes \.svg \(svg\)"):
        choose_format("out.json", allowed=("svg", "html", "chrome-trace"))


def test_every_format_is_registered_once_with_its_subject():
    registry = formats()
    assert {name: chosen.subject for name, chosen in registry.items()} == {
        "torch-csv": "schedule",
        "schedule-json": "schedule",
        "chrome-trace": "schedule",
        "svg": "schedule",
        "html": "schedule",
        "pareto-json": "pareto",
        "pareto-svg": "pareto",
        "megatron-layout": "schedule",
        "torchtitan-modules": "schedule",
        "example-split": "schedule",
    }
    for subject in ("schedule", "pareto"):
        suffixes = [chosen.suffix for chosen in registry.values() if chosen.subject == subject]
        assert len(suffixes) == len(set(suffixes)), subject  # the name rule is never ambiguous


def test_pareto_json_module_writes_the_curve():
    curve = ParetoCurve(
        [ParetoPoint(2.0, True, 10.0, 0.1, 9.0, 0.1, "feasible", "zb-h1", 2.0)], [GeneratorPoint("1f1b", 4.0, 12.0, 0.2)], 1.0
    )
    data = json.loads(get_format("pareto-json").write(curve))
    assert data == curve.to_json()
    assert data["format"] == "pipesched.pareto" and data["points"][0]["makespan"] == 10.0 and data["generators"][0]["name"] == "1f1b"


def test_show_refuses_a_schedule_json_and_export_follows_the_name(tmp_path):
    schedule = generate(uniform_problem(2, 2), "1f1b")
    save_schedule(schedule, tmp_path / "s.json")
    refused = cli("show", tmp_path / "s.json", "-o", tmp_path / "picture.json")
    assert refused.exit_code == 2 and "a .json file is a schedule-json" in refused.stderr
    assert not (tmp_path / "picture.json").exists()
    assert cli("show", tmp_path / "s.json", "-o", tmp_path / "t.json", "--format", "chrome-trace").exit_code == 0
    assert "traceEvents" in json.loads((tmp_path / "t.json").read_text())

    for name in ("copy.json", "order.csv", "t.trace.json"):
        result = cli("export", tmp_path / "s.json", "-o", tmp_path / name)
        assert result.exit_code == 0, result.output
    assert load_schedule(tmp_path / "copy.json").order() == schedule.order()
    assert (tmp_path / "order.csv").read_text().splitlines()[0].startswith("0F0,")
    assert "traceEvents" in json.loads((tmp_path / "t.trace.json").read_text())
    unknown = cli("export", tmp_path / "s.json", "-o", tmp_path / "x.txt")
    assert unknown.exit_code == 2 and "x.txt: no format ends the name like this" in unknown.stderr


def test_every_schedule_written_can_be_read_back(tmp_path):
    # A schedule holds its problem (read up to MAX_INPUT_BYTES) and its ops: the reader's
    # limit must cover the largest problem plus MAX_OPS ops as written (long times, the
    # widest fields), or `solve` could write what `validate` refuses.
    from optimizer.formats.schedule_json import MAX_SCHEDULE_BYTES
    from optimizer.io import MAX_INPUT_BYTES
    from optimizer.problem import MAX_OPS

    problem = uniform_problem(4, 64, 123456.789012, 234567.890123, 345678.901234, comm_time=0.123456789)
    path = tmp_path / "s.json"
    save_schedule(generate(problem, "zb-h1"), path)
    problem_bytes = len(json.dumps(problem.model_dump(mode="json"), indent=1))
    per_op = (path.stat().st_size - problem_bytes) / problem.num_ops
    assert MAX_INPUT_BYTES + MAX_OPS * per_op <= MAX_SCHEDULE_BYTES
    assert load_schedule(path).makespan == pytest.approx(generate(problem, "zb-h1").makespan)


def test_export_help_names_every_schedule_format_and_its_suffix():
    result = runner.invoke(app, ["export", "--help"], env={"COLUMNS": "400", "NO_COLOR": "1"})
    assert result.exit_code == 0
    text = "".join(result.output.split())  # the help wraps lines and pads its box
    for name, chosen in formats().items():
        if chosen.subject == "schedule":
            assert name in text and chosen.suffix in text, name


def test_the_gantt_legend_speaks_of_later_chunks_only_where_a_device_has_them():
    from optimizer.formats.gantt_svg import gantt_svg
    from optimizer.problem import uniform_problem
    from optimizer.schedules import generate

    linear = gantt_svg(generate(uniform_problem(2, 2), "1f1b"))
    vshape = gantt_svg(generate(uniform_problem(2, 2, placement="vshape"), "zb-v"))
    assert "blank: idle" in linear and "later chunk" not in linear
    assert "lighter: later chunk on the device; blank: idle" in vshape

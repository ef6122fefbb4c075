"""The CLI's foundation commands and their answers to bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.formats.schedule_json import load_schedule, save_schedule
from optimizer.problem import StageMemory, uniform_problem
from optimizer.schedules import generate

runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def good_problem() -> dict:
    return uniform_problem(2, 4, memory_limit=4.0).model_dump(mode="json")


def write(tmp_path: Path, name: str, data) -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_problem_solve_validate_show_round_trip(tmp_path):
    problem_path = tmp_path / "problem.json"
    result = invoke(
        "problem",
        "--devices",
        4,
        "--microbatches",
        8,
        "--backward-weight",
        0.5,
        "--comm",
        0.1,
        "--memory-limit",
        6,
        "--output",
        problem_path,
    )
    assert result.exit_code == 0, result.output
    data = json.loads(problem_path.read_text())
    assert data["num_devices"] == 4 and len(data["stages"]) == 4
    assert data["stages"][0]["memory"] == {"forward": 1.0, "backward_input": 0.0, "backward_weight": -1.0}

    schedule_path = tmp_path / "schedule.json"
    result = invoke("solve", problem_path, "--method", "1f1b", "--output", schedule_path, "--json")
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)
    schedule = load_schedule(schedule_path)
    assert metrics["makespan"] == pytest.approx(schedule.makespan)
    # the longest device span, which --objective span minimizes, is printed too
    assert metrics["longest_span"] == pytest.approx(max(ops[-1].end - ops[0].start for ops in schedule.devices))
    assert schedule.method == "1f1b"

    assert invoke("validate", schedule_path).exit_code == 0
    for suffix in (".svg", ".html", ".trace.json"):
        picture = tmp_path / f"picture{suffix}"
        assert invoke("show", schedule_path, "--output", picture).exit_code == 0
        assert picture.stat().st_size > 500
    trace = json.loads((tmp_path / "picture.trace.json").read_text())
    complete_events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete_events) == sum(len(d) for d in schedule.devices)


def test_pictures_of_a_schedule_with_a_hostile_method_name_are_well_formed(tmp_path):
    import xml.etree.ElementTree as ElementTree

    data = _solved(tmp_path)
    data["method"] = "x<b>&\"'</title>]]>\u0007\u001b[31m\u202e"
    path = write(tmp_path, "evil.json", data)
    svg, page = tmp_path / "evil.svg", tmp_path / "evil.html"
    assert invoke("show", path, "--output", svg).exit_code == 0
    assert invoke("show", path, "--output", page).exit_code == 0
    root = ElementTree.parse(svg).getroot()  # a raw BEL or ESC is not allowed in XML 1.0
    title = "".join(root.itertext())
    assert "x<b>&\"'</title>]]>\\x07\\x1b[31m" in title  # escaped as on the command line
    assert "\x07" not in page.read_text() and "\x1b" not in page.read_text()


def test_vshape_and_interleaved_placements(tmp_path):
    for placement, stages in (("vshape", 8), ("interleaved:3", 12)):
        path = tmp_path / f"{placement.replace(':', '')}.json"
        result = invoke("problem", "-p", 4, "-m", 8, "--placement", placement, "--mem-forward", 0.5, "-o", path)
        assert result.exit_code == 0, result.output
        assert len(json.loads(path.read_text())["stages"]) == stages


def test_compare_lists_each_family_with_fit(tmp_path):
    path = write(tmp_path, "p.json", good_problem())
    result = invoke("compare", path, "--json")
    assert result.exit_code == 0, result.output
    rows = {row["method"]: row for row in json.loads(result.stdout)}
    assert rows["gpipe"]["peak_memory"] == 4 and rows["gpipe"]["fits_memory"]
    assert rows["1f1b"]["peak_memory"] == 2


def test_file_names_with_brackets_are_printed_as_they_are(tmp_path, monkeypatch):
    # A name is not rich markup: "[/y]" closes no tag (it was a MarkupError traceback) and
    # "[red]" would print the name styled, as "mine.json".
    monkeypatch.setenv("COLUMNS", "500")  # the whole path on one line of the title
    folder = tmp_path / "["
    folder.mkdir()
    problem = write(folder, "y].json", good_problem())
    mine = tmp_path / "[red]mine.json"
    assert invoke("solve", problem, "-o", mine, "-q", "--time-limit", "1").exit_code == 0
    result = invoke("compare", problem, "--schedule", mine)
    assert result.exit_code == 0, result.output
    assert f"{folder}/y].json" in result.stdout
    assert "[red]mine.json" in result.stdout


def test_validate_names_a_missing_op_where_the_files_metrics_no_longer_agree(tmp_path):
    # An op dropped from the middle of device 0 leaves its span and adds to its idle time,
    # so the file's bubble ratio is no longer what the ops give: the op is what is wrong
    # (exit 1), not the metric (exit 2).
    schedule = tmp_path / "s.json"
    save_schedule(generate(uniform_problem(2, 4), "gpipe"), schedule)
    data = json.loads(schedule.read_text())
    dropped = data["devices"][0].pop(2)
    result = invoke("validate", write(tmp_path, "dropped.json", data))
    assert result.exit_code == 1, result.output
    assert f"missing: {dropped['kind']}(stage {dropped['stage']}, mb {dropped['microbatch']})" in result.stdout


def test_validate_lists_the_broken_rules_where_an_edited_time_changed_the_metrics(tmp_path):
    # One forward moved earlier (it now overlaps its neighbour and lasts longer): the
    # file's metrics differ from the ops, but the rules the op breaks are the finding.
    schedule = tmp_path / "s.json"
    save_schedule(generate(uniform_problem(2, 4), "gpipe"), schedule)
    data = json.loads(schedule.read_text())
    data["devices"][0][1]["start"] = 0.5
    result = invoke("validate", write(tmp_path, "moved.json", data))
    assert result.exit_code == 1, result.output
    assert "overlap: F(stage 0, mb 1) starts at 0.5" in result.stdout
    # A valid schedule whose metrics were edited is still refused for them (exit 2).
    data = json.loads(schedule.read_text())
    data["metrics"]["makespan"] += 1
    result = invoke("validate", write(tmp_path, "claimed.json", data))
    assert result.exit_code == 2 and "metrics.makespan" in result.output, result.output


def test_compare_keeps_hand_schedules_when_no_schedule_fits(tmp_path):
    # vshape: each device holds two stages of 0.5, so one microbatch in flight needs 1 > 0.5.
    problem = uniform_problem(4, 8, placement="vshape", mem_forward=0.5, memory_limit=0.5)
    path = write(tmp_path, "tight.json", problem.model_dump(mode="json"))
    result = invoke("compare", path, "--json")
    assert result.exit_code == 0, result.output
    rows = {row["method"]: row for row in json.loads(result.stdout)}
    assert rows["zb-v"]["makespan"] is not None and not rows["zb-v"]["fits_memory"]
    assert rows["greedy"]["makespan"] is None and "smallest limit that fits is 1" in rows["greedy"]["note"]


@pytest.mark.slow
def test_demo_writes_a_solved_schedule_no_worse_than_any_fitting_family(tmp_path, capsys):
    from optimizer.demo import example_problem, main
    from optimizer.schedules import generate_all

    main(tmp_path, time_limit=3.0)
    solved = load_schedule(tmp_path / "schedule.json")  # loading re-validates
    assert (tmp_path / "schedule.svg").read_text().startswith("<svg")
    fitting = [s.makespan for s in generate_all(example_problem())[0].values() if s.fits_memory()]
    assert solved.makespan <= min(fitting) + 1e-9
    assert "auto" in capsys.readouterr().out


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d.pop("num_devices"), "num_devices: Field required"),
        (lambda d: d.update(extra_field=1), "unknown field 'extra_field'"),
        (lambda d: d["stages"][1].update(forward=0), "stages.1.forward: Input should be greater than 0"),
        (lambda d: d["stages"][0].update(backward_weight=-1), "stages.0.backward_weight: Input should be greater than 0"),
        (lambda d: d["stages"][0]["memory"].update(backward_weight=0.0), "memory deltas must sum to 0"),
        (lambda d: d["stages"][1].update(device=5), "stages.1.device: 5 is out of range for 2 devices"),
        (lambda d: d["stages"][1].update(device=0), "stages: device 1 holds no stage"),
        (lambda d: d.update(memory_limit=0.5), "memory_limit: device 0 limit 0.5 is below one forward of stage 0"),
        (lambda d: d.update(memory_limit=[4.0]), "memory_limit: a list needs one value per device (2), got 1"),
        (lambda d: d["stages"][0]["memory"].update(forward=-1), "stages.0.memory.forward: Input should be greater than or equal to 0"),
    ],
)
def test_bad_problem_gets_one_line_naming_the_field(tmp_path, mutate, expected):
    data = good_problem()
    mutate(data)
    path = write(tmp_path, "bad.json", data)
    out = tmp_path / "out.json"
    result = invoke("solve", path, "--method", "1f1b", "--output", out)
    assert result.exit_code == 2
    line = one_error_line(result)
    assert str(path) in line and expected in line
    assert not out.exists()


@pytest.mark.parametrize("command", ["compare", "pareto", "import"])
def test_a_schedule_or_layers_file_given_as_the_problem_says_what_it_is(tmp_path, command):
    # Before: "num_devices: Field required", as if a problem had lost a field.
    schedule = write(tmp_path, "s.json", _solved(tmp_path))
    layers = write(tmp_path, "l.json", {"format": "pipesched.layers", "version": 1, "layers": []})
    for given, expected in ((schedule, "is a schedule, not a problem"), (layers, "is a layers file, not a problem")):
        args = {
            "compare": ["compare", given],
            "pareto": ["pareto", given, "--limits", "2", "-o", tmp_path / "c.json"],
            "import": ["import", tmp_path / "x.csv", "--problem", given, "-o", tmp_path / "i.json"],
        }[command]
        (tmp_path / "x.csv").write_text("F0\n")
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        line = one_error_line(result)
        assert str(given) in line and expected in line


@pytest.mark.parametrize("method", ["auto", "cpsat", "greedy", "milp"])
def test_memory_deltas_within_the_tolerance_leave_nothing_to_pile_up(tmp_path, method):
    # F +1, B -0.5, W -0.4999999: 1e-7 short of zero, within the tolerance. Kept as given,
    # the remainder grew by 1e-7 a microbatch, so at a limit of one forward every schedule
    # overflowed and the list engine stopped with a traceback.
    data = good_problem()
    for stage in data["stages"]:
        stage["memory"] = {"forward": 1.0, "backward_input": -0.5, "backward_weight": -0.4999999}
    data["memory_limit"] = 1.0
    path = write(tmp_path, "p.json", data)
    result = invoke("solve", path, "--method", method, "--time-limit", 2, "-q", "-o", tmp_path / "s.json")
    assert result.exit_code == 0, result.output
    solved = load_schedule(tmp_path / "s.json")  # loading re-validates, memory included
    assert solved.fits_memory()
    memory = solved.problem.stages[0].memory
    # zero up to one float rounding of values of about 1 (the remainder was 1e-7)
    assert abs(memory.forward + memory.backward_input + memory.backward_weight) <= 1e-15
    assert memory.backward_weight == -0.4999999  # the larger free (B's) took up the remainder
    # Deltas off zero by float rounding only are kept as given (written back unchanged).
    kept = StageMemory(forward=1.0, backward_input=-0.6337, backward_weight=-0.3663)
    assert (kept.backward_input, kept.backward_weight) == (-0.6337, -0.3663)


def test_control_characters_quoted_in_an_error_are_escaped(tmp_path):
    # A terminal would run an escape sequence quoted from an option or a file's cell.
    problem = write(tmp_path, "p.json", good_problem())
    result = invoke("solve", problem, "--method", "x\x1b[31m\x07", "-o", tmp_path / "s.json")
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "'x\\x1b[31m\\x07'" in line and "\x1b" not in line and "\x07" not in line
    csv = write(tmp_path, "s.csv", "0F0,0B3\x1b[31m\n1F0\n")
    result = invoke("import", csv, "--problem", problem, "-o", tmp_path / "i.json")
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "'0B3\\x1b[31m'" in line and "\x1b" not in line


@pytest.mark.parametrize(
    "args, expected",
    [
        (["solve", "{P}", "--method", "1f1b", "-o", "{T}/s.svg"], "s.svg: a .svg name, but this writes a schedule as JSON"),
        (["problem", "-p", 2, "-m", 2, "-o", "{T}/p.png"], "p.png: a .png name, but this writes a problem as JSON"),
        (["layers", "-o", "{T}/l.csv"], "l.csv: a .csv name, but this writes a layers file as JSON"),
        (["pareto", "{P}", "--limits", "2", "-o", "{T}/c.svg"], "c.svg: a .svg name, but this writes the curve as JSON"),
        (["pareto", "{P}", "--limits", "2", "-o", "{T}/c.json", "--plot", "{T}/c.png"], "c.png: the plot is an SVG picture"),
    ],
)
def test_a_json_output_named_like_another_format_is_refused(tmp_path, args, expected):
    # They wrote JSON into the .svg, .png or .csv (exit 0): a user opening it finds no picture.
    problem = write(tmp_path, "p.json", good_problem())
    filled = [str(a).replace("{P}", str(problem)).replace("{T}", str(tmp_path)) for a in args]
    result = invoke(*filled)
    assert result.exit_code == 2
    assert expected in one_error_line(result)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["p.json"]  # nothing written


def test_malformed_json_and_missing_file(tmp_path):
    path = write(tmp_path, "broken.json", '{"num_devices": 2,')
    result = invoke("compare", path)
    assert result.exit_code == 2
    assert "not valid JSON (line 1" in one_error_line(result)
    result = invoke("compare", tmp_path / "absent.json")
    assert result.exit_code == 2
    assert "absent.json: no such file" in one_error_line(result)


def test_schedule_of_another_format_is_refused(tmp_path):
    path = write(tmp_path, "other.json", {"format": "something.else", "version": 1})
    result = invoke("validate", path)
    assert result.exit_code == 2
    assert "not a pipesched schedule (format is 'something.else'" in one_error_line(result)
    path = write(tmp_path, "v4.json", {"format": "pipesched.schedule", "version": 4})
    result = invoke("show", path, "--output", tmp_path / "x.svg")
    assert result.exit_code == 2
    assert "version 4 is not supported" in one_error_line(result)
    assert not (tmp_path / "x.svg").exists()


@pytest.mark.parametrize(
    "metrics, expected",
    [
        ({"lower_bound": -1e308}, "metrics.lower_bound: Input should be greater than or equal to 0"),
        ({"gap": 1e308}, "metrics.gap: Input should be less than or equal to 1"),
        ({"status": "optimal\u001b[31m"}, "metrics.status: Input should be 'optimal', 'feasible' or 'heuristic'"),
        ({"solve_seconds": -1.0}, "metrics.solve_seconds: Input should be greater than or equal to 0"),
        ({"method_won": "x" * 5000}, "metrics.method_won: String should have at most 1000 characters"),
        # Claims the schedule contradicts (its makespan is 9): validate printed them as they came.
        ({"lower_bound": 1e6}, "metrics.lower_bound: 1e+06 is above the schedule's makespan 9"),
        ({"status": "optimal", "gap": 0.9}, "metrics.status: optimal with a gap of 0.9"),
        # A proof claimed where the file's own bound leaves most of the makespan open.
        ({"lower_bound": 1.0, "gap": 0.0, "status": "optimal"}, "metrics.gap: 0, but its lower bound 1 gives 0.888889"),
    ],
)
def test_a_schedules_metrics_out_of_their_range_are_refused(tmp_path, metrics, expected):
    # validate printed "lower bound -1e+308, gap inf%" and export copied them on.
    data = _solved(tmp_path)
    data["metrics"].update(metrics)
    path = write(tmp_path, "bad.json", data)
    result = invoke("validate", path)
    assert result.exit_code == 2
    assert expected in one_error_line(result)


def _solved(tmp_path: Path, limit: float | None = None) -> dict:
    problem = uniform_problem(2, 2, memory_limit=limit)
    write(tmp_path, "p.json", problem.model_dump(mode="json"))
    assert invoke("solve", tmp_path / "p.json", "--method", "1f1b", "-o", tmp_path / "s.json").exit_code == 0
    return json.loads((tmp_path / "s.json").read_text())


def test_validate_names_a_dependency_violation(tmp_path):
    data = _solved(tmp_path)
    op = data["devices"][1][0]  # F(stage 1, mb 0), which waits for F(stage 0, mb 0)
    op["start"], op["end"] = op["start"] - 0.5, op["end"] - 0.5
    result = invoke("validate", write(tmp_path, "dep.json", data))
    assert result.exit_code == 1
    assert "dependency: F(stage 1, mb 0) starts at 0.5, before F(stage 0, mb 0) is available at 1" in result.stdout


def test_validate_names_an_overlap(tmp_path):
    data = _solved(tmp_path)
    first, second = data["devices"][0][0], data["devices"][0][1]  # F mb 0 then F mb 1 on device 0
    second["start"], second["end"] = first["start"] + 0.5, first["end"] + 0.5
    result = invoke("validate", write(tmp_path, "overlap.json", data))
    assert result.exit_code == 1
    assert "overlap: F(stage 0, mb 1) starts at 0.5 on device 0 before F(stage 0, mb 0) ends at 1" in result.stdout


def test_validate_names_a_memory_overflow(tmp_path):
    data = _solved(tmp_path, limit=2.0)
    data["problem"]["memory_limit"] = 1.5  # 1f1b holds 2 microbatches on device 0
    result = invoke("validate", write(tmp_path, "memory.json", data))
    assert result.exit_code == 1
    assert "memory: device 0 holds 2 > limit 1.5 after F(stage 0, mb 1)" in result.stdout


def test_solve_refuses_a_hand_schedule_over_the_limit(tmp_path):
    path = write(tmp_path, "p.json", uniform_problem(2, 4, memory_limit=3.0).model_dump(mode="json"))
    result = invoke("solve", path, "--method", "gpipe", "-o", tmp_path / "s.json")
    assert result.exit_code == 3
    assert "device 0 needs 4 > 3" in one_error_line(result)
    assert not (tmp_path / "s.json").exists()


def test_unknown_method_and_picture_type(tmp_path):
    path = write(tmp_path, "p.json", good_problem())
    result = invoke("solve", path, "--method", "nonsense", "-o", tmp_path / "s.json")
    assert result.exit_code == 2
    assert "unknown schedule 'nonsense'" in one_error_line(result)
    _solved(tmp_path)
    result = invoke("show", tmp_path / "s.json", "-o", tmp_path / "s.png")
    assert result.exit_code == 2
    assert "s.png: no format ends the name like this (use .svg, .html, .trace.json" in one_error_line(result)


def test_problem_command_rejects_bad_options(tmp_path):
    out = tmp_path / "p.json"
    # Each option named as typed, not as the field of the problem it would write.
    for option, value, says in (
        ("--forward", -1, "Input should be greater than 0"),
        ("--backward-input", 0, "Input should be greater than 0"),
        ("--backward-weight", -2, "Input should be greater than 0"),
        ("--backward", 0, "Input should be greater than 0"),
        ("--comm", -1, "Input should be greater than or equal to 0"),
        ("--mem-forward", -1, "Input should be greater than or equal to 0"),
        ("--memory-limit", -3, "Input should be greater than 0"),
        ("--memory-limit", 0.5, "device 0 limit 0.5 is below one forward of stage 0"),
    ):
        result = invoke("problem", "-p", 2, "-m", 2, option, value, "-o", out)
        assert result.exit_code == 2
        assert one_error_line(result).startswith(f"error: {option}: {says}"), (option, result.stderr)
    result = invoke("problem", "-p", 2, "-m", 2, "--mem-backward-input", 5, "--mem-backward-weight", 1, "-o", out)
    assert one_error_line(result).startswith(
        "error: --mem-forward, --mem-backward-input, --mem-backward-weight: memory deltas must sum to 0"
    ), result.stderr
    result = invoke("problem", "-p", 2, "-m", 2, "--placement", "zigzag", "-o", out)
    assert result.exit_code == 2
    assert "placement: 'zigzag' is not one of" in one_error_line(result)
    assert not out.exists()


def test_help_lists_every_family_with_its_summary():
    from optimizer.schedules import GENERATORS

    for command in ("solve", "compare"):
        result = invoke(command, "--help")
        assert result.exit_code == 0
        text = " ".join(result.output.split())  # help is wrapped to the terminal width
        for name in GENERATORS:
            assert f"{name}: " in text, (command, name)
        assert "F&B overlap is not modelled" in text


def test_help_shows_every_option_name_whole_at_80_columns():
    # At a terminal's usual 80 columns the boxed help cut long option names to fit its
    # columns ("--mem-backward-weig…", "--flash-attent…"): a user could not read them.
    import typer.main

    from runtime.cli import app as whole_app  # run and profile included

    commands = typer.main.get_command(whole_app).commands  # type: ignore[attr-defined]
    assert {"problem", "layers", "solve", "run", "profile"} <= set(commands)
    for name, command in commands.items():
        result = runner.invoke(whole_app, [name, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80", "NO_COLOR": "1"})
        assert result.exit_code == 0, name
        assert "…" not in result.output, name
        assert max(len(line) for line in result.output.splitlines()) <= 80, name
        for parameter in command.params:
            for option in [*parameter.opts, *parameter.secondary_opts]:
                if option.startswith("--"):
                    assert option in result.output.split() or f"{option}," in result.output or f"{option}/" in result.output, (name, option)


def test_compare_prints_its_title_on_one_line_at_80_columns(tmp_path):
    problem = tmp_path / "a-problem-file-with-a-long-name.json"
    assert invoke("problem", "-p", 8, "-m", 32, "--placement", "vshape", "--memory-limit", 4, "-o", problem).exit_code == 0
    result = runner.invoke(app, ["compare", str(problem)], env={"COLUMNS": "80", "NO_COLOR": "1"})
    assert result.exit_code == 0
    title = f"{problem}: 8 devices, 16 stages, 32 microbatches, memory limit 4.0"
    assert result.stdout.splitlines()[0] == title


def test_the_chart_scales_to_any_time_unit():
    # Times of 1e-300 were drawn at one x (the span was floored at 1e-12).
    import re

    from optimizer.formats.gantt_svg import gantt_svg
    from optimizer.schedules import generate

    for unit in (1e-300, 1.0, 1e9):
        problem = uniform_problem(2, 4, forward=unit, backward_input=unit, backward_weight=unit)
        svg = gantt_svg(generate(problem, "1f1b"))
        starts = {float(x) for x in re.findall(r'<rect x="([0-9.]+)" y="[0-9.]+" width="[0-9.]+" height="[0-9.]+" fill="#', svg)}
        assert len(starts) >= 10, (unit, sorted(starts))


def test_a_huge_integer_is_named_out_of_range_and_a_csv_may_start_with_a_byte_order_mark(tmp_path):
    # Python's own advice ("use sys.set_int_max_str_digits()") was the message before.
    path = write(tmp_path, "big.json", '{"num_devices": 2, "num_microbatches": ' + "9" * 5000 + "}")
    result = invoke("validate", path)
    assert result.exit_code == 2
    assert "an integer of 5000 digits is out of range for every field" in one_error_line(result)
    # Spreadsheet programs start a UTF-8 CSV with a byte order mark; it was refused.
    problem = write(tmp_path, "p.json", uniform_problem(2, 2).model_dump(mode="json"))
    csv = write(tmp_path, "s.csv", "\ufeff0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
    result = invoke("import", csv, "--problem", problem, "-o", tmp_path / "s.json")
    assert result.exit_code == 0, result.output
    assert load_schedule(tmp_path / "s.json").makespan > 0


@pytest.mark.parametrize(("text", "holds"), [("[]", "a list"), ("null", "null"), ("3", "a number"), ('"x"', "a string"), ("true", "true")])
def test_a_file_that_is_no_json_object_says_what_it_holds(tmp_path, text, holds):
    # It said "format is 'NoneType'" or "'list'" (Python's type names) for a schedule, and
    # "Input should be a valid dictionary or instance of Problem" for a problem.
    path = write(tmp_path, "e.json", text)
    result = invoke("validate", path)
    assert result.exit_code == 2
    assert f"e.json: not a pipesched schedule (the file holds {holds}; a schedule is an object" in one_error_line(result)
    result = invoke("compare", path)
    assert result.exit_code == 2
    assert f"e.json: not a problem (the file holds {holds}; a problem is an object" in one_error_line(result)
    result = invoke("validate", write(tmp_path, "o.json", "{}"))
    assert 'not a pipesched schedule (no "format" key' in one_error_line(result)

"""torch's schedule CSV: export loads in torch and passes its own validation, import
round-trips, torch's built-in orders against our families of the same name."""

from __future__ import annotations

import json
import re
import types

import pytest
from factories import hetero_problem, placed_problem, unusual_placements
from torch.distributed.pipelining import schedules as torch_schedules
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.errors import InputError, ScheduleError
from optimizer.exact import SolveOptions, solve
from optimizer.formats import torch_csv
from optimizer.formats.schedule_json import save_schedule
from optimizer.ops import Op
from optimizer.problem import Problem, uniform_problem
from optimizer.schedule import Schedule
from optimizer.schedules import GENERATORS, generate
from runtime.cli import app as runtime_app
from runtime.torch_orders import builtin_order_rows, builtin_schedule, builtin_schedules, row_name

pytestmark = pytest.mark.runtime  # torch's own loader and validator

runner = CliRunner()
PLACEMENTS = ("linear", "interleaved:2", "interleaved:3", "vshape")
SIZES = ((2, 4), (4, 8))


def family_cases() -> list[tuple[str, str, int, int]]:
    cases = []
    for placement in PLACEMENTS:
        for p, m in SIZES:
            problem = uniform_problem(p, m, placement=placement)
            cases += [(name, placement, p, m) for name, g in GENERATORS.items() if g.unsupported(problem) is None]
    return cases


def load_in_torch(path, problem: Problem):
    """torch's runtime loading the CSV as a user would (stand-in stages carry the counts)."""
    stage = types.SimpleNamespace(num_stages=problem.num_stages, group_size=problem.num_devices, group_rank=0, submod=None)
    runtime = torch_schedules._PipelineScheduleRuntime([stage], problem.num_microbatches)
    runtime._load_csv(str(path), format="compute_only")
    return runtime


def assert_torch_accepts(schedule: Schedule, tmp_path) -> None:
    problem = schedule.problem
    path = tmp_path / "schedule.csv"
    path.write_text(torch_csv.export_csv(schedule))
    runtime = load_in_torch(path, problem)
    mapping = torch_schedules._validate_schedule(runtime.pipeline_order, problem.num_devices, problem.num_stages, problem.num_microbatches)
    assert mapping == {s: stage.device for s, stage in enumerate(problem.stages)}
    # torch lowered it with its own send/receive insertion, which fails on an order it cannot run
    assert set(runtime.pipeline_order_with_comms) == set(range(problem.num_devices))
    read = [[a for a in runtime.pipeline_order[r] if a is not None] for r in range(problem.num_devices)]
    assert [[str(a) for a in row] for row in read] == torch_csv.export_rows(schedule)


@pytest.mark.parametrize("family,placement,p,m", family_cases())
def test_every_family_exports_to_a_csv_torch_loads_and_validates(family, placement, p, m, tmp_path):
    schedule = generate(uniform_problem(p, m, placement=placement), family)
    assert_torch_accepts(schedule, tmp_path)
    back, imported = torch_csv.import_schedule(torch_csv.export_csv(schedule), schedule.problem)
    assert back.order() == schedule.order() and back.makespan == schedule.makespan
    assert imported.overlapped_pairs == 0


@pytest.mark.parametrize("placement", ["blocked", "reversed"])
def test_unusual_placements_keep_their_stage_to_rank_mapping(placement, tmp_path):
    problem = placed_problem(4, 8, unusual_placements(4)[placement])
    schedule = generate(problem, "greedy")
    assert_torch_accepts(schedule, tmp_path)  # the mapping torch infers is the problem's
    assert torch_csv.torchtitan_layout(problem) is None


def test_family_cases_cover_every_family():
    # The token-slice families only order sliced problems, which torch's format cannot hold.
    sliced_only = {name for name, g in GENERATORS.items() if g.slices and g.reason(uniform_problem(2, 2)) is not None}
    assert sliced_only == {"terapipe", "seq1f1b", "seq1f1b-zb"}
    # The vocabulary-parallel names need vocabulary passes, which torch's format cannot hold
    # either (test_vocabulary_passes_are_refused).
    vocab_only = {name for name, g in GENERATORS.items() if g.vocab_only}
    assert vocab_only == {"1f1b-vocab", "zb-h1-vocab", "v-half-vocab"}
    assert {case[0] for case in family_cases()} == set(GENERATORS) - sliced_only - vocab_only


@pytest.mark.parametrize("placement", ["linear", "vshape"])
def test_a_solved_schedule_exports_loads_and_round_trips(placement, tmp_path):
    problem = hetero_problem(2, 4, placement, limit=3.0)
    schedule = solve(problem, "auto", SolveOptions(time_limit=2.0, threads=1))
    assert_torch_accepts(schedule, tmp_path)
    back, _ = torch_csv.import_schedule(torch_csv.export_csv(schedule), problem)
    assert back.order() == schedule.order()


@pytest.mark.parametrize("line_end", ["\r\n", "\r"])
def test_import_reads_windows_and_old_mac_line_ends(line_end):
    # A bare CR (old Mac line ends) was refused with the csv module's own words.
    problem = uniform_problem(2, 4)
    schedule = generate(problem, "zb-h1")
    text = torch_csv.export_csv(schedule).replace("\n", line_end)
    back, _ = torch_csv.import_schedule(text, problem)
    assert back.order() == schedule.order()


def test_kinds_map_to_torch_letters():
    assert torch_csv.action_text(Op("F", 3, 1)) == "3F1"
    assert torch_csv.action_text(Op("B", 3, 1)) == "3I1"
    assert torch_csv.action_text(Op("W", 3, 1)) == "3W1"
    assert torch_csv.action_text(Op("BW", 3, 1)) == "3B1"


def test_import_skips_communication_and_splits_overlapped_pairs():
    problem = uniform_problem(2, 2, placement="vshape")
    text = (
        "0F0,0F1,3RECV_F0,3F0,3I0,3W0,3F1,3I1,3W1,0I0,0W0,0I1,0W1\n1F0,1F1,2F0,(2F1;2I0)OVERLAP_F_B,1SEND_F0,2W0,2I1,2W1,1I0,1W0,1I1,1W1\n"
    )
    schedule, imported = torch_csv.import_schedule(text, problem)
    assert imported.overlapped_pairs == 1 and imported.skipped_actions == 2
    assert schedule.order()[1][3:5] == [Op("F", 2, 1), Op("B", 2, 0)]


@pytest.mark.parametrize(
    "text,message",
    [
        ("0F0,0F1\n", "1 rows (ranks), the problem has 2 devices"),
        ("0F0,0X1\n1F0\n", "row 1, column 2: '0X1' is not a torch action"),
        ("0F0,1F1\n1F0\n", "row 1, column 2: stage 1 is on rank 0 here, on device 1 in the problem"),
        ("0F0,0F7\n1F0\n", "row 1, column 2: microbatch 7 does not exist"),
        ("0F0,5F0\n1F0\n", "row 1, column 2: stage 5 does not exist"),
        ("0F\n1F0\n", "'0F' has no microbatch number"),
        ("0F0,(0F1;)OVERLAP_F_B\n1F0\n", "row 1, column 2: '(0F1;)OVERLAP_F_B' has an empty action in its overlapped pair"),
        ("0F0,\u0660F\u0661\n1F0\n", "row 1, column 2: '\u0660F\u0661' is not a torch action"),  # Arabic-Indic digits
        ("0F0,\uff10F\uff11\n1F0\n", "row 1, column 2: '\uff10F\uff11' is not a torch action"),  # full-width digits
        # Another file given for the CSV: said so, not counted as ranks ("52 rows" before).
        (uniform_problem(2, 2).model_dump_json(indent=2), "s.csv: not a torch schedule CSV (it reads as JSON): no cell holds an action"),
        ("step,loss\n1,2.5\n3,2.1\n", "s.csv: not a torch schedule CSV: no cell holds an action such as 0F0"),
    ],
)
def test_import_refuses_malformed_csv_naming_the_cell(text, message):
    with pytest.raises(InputError, match=re.escape(message)):
        torch_csv.parse_csv(text, uniform_problem(2, 2), "s.csv")


def test_import_refuses_an_order_with_a_missing_op():
    problem = uniform_problem(2, 1)
    with pytest.raises(ScheduleError, match=re.escape("s.csv: invalid schedule")):
        torch_csv.import_schedule("0F0,0I0\n1F0,1I0,1W0\n", problem, "s.csv")


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_export_writes_every_registered_format(tmp_path):
    from optimizer.formats import formats
    from optimizer.formats.schedule_json import load_schedule
    from optimizer.layer_costs import DecoderSizes, decoder_layers
    from optimizer.split import Placement, even_split, split_problem

    # A problem made from a layer split, so that the formats of the split have one to write.
    profile = decoder_layers(DecoderSizes(blocks=4))
    schedule = generate(split_problem(profile, Placement.named("linear", 2), even_split(profile, 2), 2), "1f1b")
    save_schedule(schedule, tmp_path / "s.json")
    written = {name: chosen for name, chosen in formats().items() if chosen.subject == "schedule"}
    assert set(written) == {
        "torch-csv",
        "schedule-json",
        "chrome-trace",
        "svg",
        "html",
        "megatron-layout",
        "torchtitan-modules",
        "example-split",
    }
    for name, chosen in written.items():
        output = tmp_path / f"{name}{chosen.suffix}"
        result = cli("export", tmp_path / "s.json", "--format", name, "--output", output)
        assert result.exit_code == 0, result.output
        assert output.read_text() == chosen.write(schedule)
    assert load_schedule(tmp_path / "schedule-json.json").order() == schedule.order()  # reads back
    assert "traceEvents" in json.loads((tmp_path / "chrome-trace.trace.json").read_text())
    assert (tmp_path / "svg.svg").read_text().startswith("<svg")


def test_export_import_commands_and_their_errors(tmp_path):
    problem = uniform_problem(2, 4, memory_limit=2.0)
    save_schedule(generate(problem, "zb-h1"), tmp_path / "s.json")
    (tmp_path / "p.json").write_text(json.dumps(problem.model_dump(mode="json")))
    result = cli("export", tmp_path / "s.json", "--format", "torch-csv", "--output", tmp_path / "s.csv")
    assert result.exit_code == 0, result.output
    assert "2 ranks, 2 stages, 24 actions" in result.stdout
    result = cli("import", tmp_path / "s.csv", "--problem", tmp_path / "p.json", "--output", tmp_path / "back.json", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["makespan"] == generate(problem, "zb-h1").makespan

    bad = cli("export", tmp_path / "s.json", "--format", "megatron", "--output", tmp_path / "x.csv")
    assert bad.exit_code == 2 and "format: 'megatron' is not one of torch-csv, schedule-json, chrome-trace, svg, html" in bad.stderr
    missing = cli("import", tmp_path / "none.csv", "--problem", tmp_path / "p.json", "--output", tmp_path / "x.json")
    assert missing.exit_code == 2 and "none.csv: no such file" in missing.stderr
    # 1F1B's order fits 2 activations per device here but not a limit of 1: exit 1, nothing written
    tight = uniform_problem(2, 4, memory_limit=1.0)
    (tmp_path / "tight.json").write_text(json.dumps(tight.model_dump(mode="json")))
    over = cli("import", tmp_path / "s.csv", "--problem", tmp_path / "tight.json", "--output", tmp_path / "x.json")
    assert over.exit_code == 1 and "memory" in over.stderr and not (tmp_path / "x.json").exists()
    (tmp_path / "small.json").write_text(json.dumps(uniform_problem(2, 2).model_dump(mode="json")))
    (tmp_path / "dead.csv").write_text("0I0,0F0,0W0,0F1,0I1,0W1\n1F0,1I0,1W0,1F1,1I1,1W1\n")
    dead = cli("import", tmp_path / "dead.csv", "--problem", tmp_path / "small.json", "--output", tmp_path / "x.json")
    assert dead.exit_code == 1 and "deadlock" in dead.stderr.lower()


def test_an_order_whose_last_stage_runs_forwards_out_of_order_is_not_handed_to_torch(tmp_path):
    """torch's runtime pairs the last stage's losses with its forwards in the order they
    ran: such an order trained on the wrong losses with exit 0 (gradients off by 89%), or
    stopped at a loss not computed yet. It is valid (our engine keys losses by microbatch),
    so `import` takes it; `export --format torch-csv` and `run --engine torch` refuse it."""
    problem = uniform_problem(2, 2)
    (tmp_path / "p.json").write_text(json.dumps(problem.model_dump(mode="json")))
    (tmp_path / "swapped.csv").write_text("0F0,0F1,0B0,0B1\n1F1,1F0,1B1,1B0\n")
    imported = cli("import", tmp_path / "swapped.csv", "--problem", tmp_path / "p.json", "--output", tmp_path / "s.json")
    assert imported.exit_code == 0, imported.output
    reason = "runs F(stage 1, mb 1) before F(stage 1, mb 0): torch's runtime pairs the last stage's losses"
    exported = cli("export", tmp_path / "s.json", "--format", "torch-csv", "--output", tmp_path / "x.csv")
    assert exported.exit_code == 2 and reason in exported.stderr and not (tmp_path / "x.csv").exists()
    ran = runner.invoke(runtime_app, ["run", str(tmp_path / "s.json"), "--engine", "torch", "--model", "example", "--steps", "1"])
    assert ran.exit_code == 2 and f"--engine torch: {tmp_path / 's.json'} {reason}" in ran.stderr, ran.stderr
    # Only the last stage's forwards matter: the first may run them in any order.
    (tmp_path / "first.csv").write_text("0F1,0F0,0B1,0B0\n1F0,1B0,1F1,1B1\n")
    assert torch_csv.losses_out_of_order(torch_csv.parse_csv((tmp_path / "first.csv").read_text(), problem).orders, 2) is None


# ------------------------------------------------------------------ torch's built-in orders

SAME_NAME = [
    ("ScheduleGPipe", "gpipe", "linear"),
    ("ScheduleInterleaved1F1B", "interleaved-1f1b", "interleaved:2"),
    ("ScheduleInterleaved1F1B", "interleaved-1f1b", "interleaved:3"),
    ("ScheduleZBVZeroBubble", "zb-v", "vshape"),
    ("ScheduleDualPipeV", "dualpipe-v", "vshape"),
    ("ScheduleInterleavedZeroBubble", "interleaved-zb", "interleaved:2"),
    ("ScheduleInterleavedZeroBubble", "interleaved-zb", "interleaved:3"),
    # on one stage per rank torch's interleaved zero bubble is ZB-H1
    ("ScheduleInterleavedZeroBubble", "zb-h1", "linear"),
]


@pytest.mark.parametrize("class_name,family,placement", SAME_NAME)
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 12)])
def test_torch_builtin_order_equals_our_family(class_name, family, placement, p, m):
    problem = hetero_problem(p, m, placement)
    ours = generate(problem, family)
    theirs = builtin_schedule(problem, class_name)
    # DualPipeV's OVERLAP_F_B pairs are two ops back to back in ours too
    assert theirs.order() == ours.order()
    assert theirs.makespan == ours.makespan


@pytest.mark.parametrize("class_name,family,placement", [row for row in SAME_NAME if row[2] != "vshape"])
@pytest.mark.parametrize("p", [2, 4])
def test_torch_builtin_order_equals_our_family_at_as_many_microbatches_as_devices(class_name, family, placement, p):
    # Megatron's interleaved 1F1B runs every forward as warm-up at m = p; torch does not,
    # and with uneven stages its order is the shorter and holds fewer activations.
    problem = hetero_problem(p, p, placement)
    ours = generate(problem, family)
    theirs = builtin_schedule(problem, class_name)
    assert theirs.order() == ours.order()
    assert theirs.makespan == ours.makespan


@pytest.mark.parametrize("placement", ["linear", "interleaved:2", "interleaved:3"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 6)])
def test_torch_looped_bfs_is_gpipe_with_backwards_from_the_last_microbatch(placement, p, m):
    problem = hetero_problem(p, m, placement)
    ours = generate(problem, "gpipe")
    theirs = builtin_schedule(problem, "ScheduleLoopedBFS")
    for mine, torchs in zip(ours.order(), theirs.order(), strict=True):
        assert [op for op in torchs if op.kind == "F"] == [op for op in mine if op.kind == "F"]
        backwards = [op for op in mine if op.kind != "F"]
        by_stage = sorted({op.stage for op in backwards}, reverse=True)
        assert [op for op in torchs if op.kind != "F"] == [op for s in by_stage for op in reversed([b for b in backwards if b.stage == s])]
    assert theirs.makespan == pytest.approx(ours.makespan)
    assert max(theirs.metrics.peak_memory) == max(ours.metrics.peak_memory)


def test_torch_1f1b_order_numbers_the_last_ranks_forwards_from_one():
    """torch 2.13's Schedule1F1B builds `pipeline_order` (used for display and CSV dumps,
    not by its runtime) with the last rank's forwards as microbatches 1..m instead of
    0..m-1; every other rank equals our 1f1b, and the last one does after renumbering."""
    p, m = 4, 8
    problem = uniform_problem(p, m)
    rows = [[cell for cell in row if "REDUCE_GRAD" not in cell] for row in builtin_order_rows(problem, "Schedule1F1B")]
    ours = torch_csv.export_rows(generate(problem, "1f1b"))
    assert rows[:-1] == ours[:-1]
    renumbered = [f"{p - 1}F{int(cell.split('F')[1]) - 1}" if "F" in cell else cell for cell in rows[-1]]
    assert renumbered == ours[-1]
    _, refused = builtin_schedules(problem)
    assert f"microbatch {m} does not exist" in refused["torch:1F1B"]


@pytest.mark.parametrize(
    "class_name,family", [("ScheduleInterleaved1F1B", "interleaved-1f1b"), ("ScheduleInterleavedZeroBubble", "interleaved-zb")]
)
@pytest.mark.parametrize("m", [3, 6, 10])
def test_torch_interleaved_microbatch_counts_not_a_multiple_of_p(class_name, family, m):
    """m not a multiple of p: both go in max(1, m // p) rounds of m // rounds microbatches."""
    problem = hetero_problem(4, m, "interleaved:2")
    assert builtin_schedule(problem, class_name).order() == generate(problem, family).order()


@pytest.mark.parametrize(
    "class_name,family", [("ScheduleInterleaved1F1B", "interleaved-1f1b"), ("ScheduleInterleavedZeroBubble", "interleaved-zb")]
)
def test_torch_and_ours_refuse_the_same_microbatch_count(class_name, family):
    problem = hetero_problem(4, 9, "interleaved:2")  # 9 does not split into 2 rounds
    assert GENERATORS[family].unsupported(problem) is not None
    _, refused = builtin_schedules(problem)
    assert "multiple of the number of rounds" in refused[row_name(class_name)]


def test_compare_with_torch_rows(tmp_path):
    problem = uniform_problem(4, 8, placement="vshape", memory_limit=8.0)
    (tmp_path / "p.json").write_text(json.dumps(problem.model_dump(mode="json")))
    result = cli("compare", tmp_path / "p.json", "--torch", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["method"]: row for row in json.loads(result.stdout)}
    assert rows["torch:ZBVZeroBubble"]["makespan"] == rows["zb-v"]["makespan"]
    assert rows["torch:DualPipeV"]["makespan"] == rows["dualpipe-v"]["makespan"]
    assert "needs the linear placement" in rows["torch:1F1B"]["note"]


@pytest.mark.parametrize(
    "class_name,family,placement", [("ScheduleZBVZeroBubble", "zb-v", "vshape"), ("ScheduleDualPipeV", "dualpipe-v", "vshape")]
)
def test_import_reads_a_file_torch_dumped_itself(class_name, family, placement, tmp_path):
    """torch's own `_dump_csv(..., "compute_only")` (blank cells, overlapped pairs) imports."""
    problem = uniform_problem(4, 8, placement=placement)
    stages = [types.SimpleNamespace(num_stages=8, group_size=4, group_rank=0, submod=None) for _ in range(2)]
    getattr(torch_schedules, class_name)(stages, 8)._dump_csv(str(tmp_path / "dumped.csv"), format="compute_only")
    schedule, imported = torch_csv.import_schedule((tmp_path / "dumped.csv").read_text(), problem, memory=False)
    assert schedule.order() == generate(problem, family).order()
    assert (imported.overlapped_pairs > 0) == (class_name == "ScheduleDualPipeV")


def test_torch_schedules_are_refused_on_vocabulary_passes_as_such():
    # They were reported as "torch's order is invalid": the order is fine, the problem
    # has passes a torch CSV cannot hold.
    plain = uniform_problem(2, 4)
    problem = Problem.model_validate({**plain.model_dump(), "vocab_parallel": {"forward": 1.0, "backward": 1.0}})
    schedules, refused = builtin_schedules(problem)
    assert not schedules and refused
    assert all(reason.startswith("torch's schedules have no vocabulary passes") for reason in refused.values()), refused

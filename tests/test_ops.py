"""The op model (optimizer/ops.py): kinds, identity, slice durations and memory, the
dependency rule; the problem's slice and fused-backward fields; schedule files v1 and v2."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from factories import random_feasible_order, random_problem
from factories import with_slices as sliced

from optimizer.errors import InputError
from optimizer.formats.schedule_json import load_schedule, save_schedule, schedule_from_json, schedule_to_json
from optimizer.io import validate_model
from optimizer.ops import Kind, Op, TimedOp, dependencies, op_duration, op_memory
from optimizer.problem import MAX_OPS, Problem, uniform_problem
from optimizer.schedules import generate
from optimizer.schedules.gpipe import gpipe
from optimizer.schedules.terapipe import terapipe
from optimizer.simulate import simulate
from optimizer.validate import validate

pytestmark: list[pytest.MarkDecorator] = []  # fast, pure-Python checks: no marker

DATA = Path(__file__).parent / "data"


# --- kinds and identity ---------------------------------------------------------------


def test_kind_is_a_string_that_prints_as_its_letter():
    assert Kind.BW == "BW" and f"{Kind.F}" == "F" and json.dumps([Kind.W]) == '["W"]'
    assert Op(Kind.F, 1, 2) == Op("F", 1, 2) and hash(Op(Kind.F, 1, 2)) == hash(Op("F", 1, 2))


def test_op_text_shows_the_slice_only_when_positive():
    assert str(Op("F", 1, 2)) == "F(stage 1, mb 2)"
    assert str(Op("F", 1, 2, 3)) == "F(stage 1, mb 2.3)"
    assert TimedOp("B", 0, 4, 1.0, 2.0, 1).op == Op("B", 0, 4, 1)


# --- the dependency rule --------------------------------------------------------------


def keys(*ops: tuple) -> set[Op]:
    return {Op(*op) for op in ops}


def test_dependencies_without_slices_are_the_single_pipeline_rule():
    S = 3
    assert dependencies(Op("F", 0, 5), S) == ()
    assert set(dependencies(Op("F", 2, 5), S)) == keys(("F", 1, 5))
    assert set(dependencies(Op("B", 2, 5), S)) == keys(("F", 2, 5))
    assert set(dependencies(Op("BW", 0, 5), S)) == keys(("B", 1, 5))
    assert set(dependencies(Op("W", 1, 5), S)) == keys(("B", 1, 5))


def test_dependencies_with_slices():
    S, K = 3, 4
    # forward: the previous stage's same slice, and the previous slice on the same stage
    assert set(dependencies(Op("F", 0, 1, 0), S, K)) == set()
    assert set(dependencies(Op("F", 0, 1, 2), S, K)) == keys(("F", 0, 1, 1))
    assert set(dependencies(Op("F", 2, 1, 2), S, K)) == keys(("F", 1, 1, 2), ("F", 2, 1, 1))
    # backward (split or fused): the next stage's same slice (or the last forward), and the next slice
    assert set(dependencies(Op("B", 2, 1, 3), S, K)) == keys(("F", 2, 1, 3))
    assert set(dependencies(Op("B", 2, 1, 1), S, K)) == keys(("F", 2, 1, 1), ("B", 2, 1, 2))
    assert set(dependencies(Op("BW", 0, 1, 1), S, K)) == keys(("B", 1, 1, 1), ("B", 0, 1, 2))
    assert set(dependencies(Op("BW", 0, 1, 3), S, K)) == keys(("B", 1, 1, 3))
    # weight gradient: its own slice's B only
    assert set(dependencies(Op("W", 1, 1, 2), S, K)) == keys(("B", 1, 1, 2))


def test_one_slice_general_rule_agrees_with_the_fast_path():
    """The K=1 fast path is the general rule with no neighbouring slices."""
    S = 4
    for kind in ("F", "B", "W", "BW"):
        for s in range(S):
            op = Op(kind, s, 0)
            general = set(dependencies(op, S, 2)) - {Op("B", s, 0, 1)}  # slice 0 of 2, minus the next slice
            assert set(dependencies(op, S, 1)) == general


# --- durations and memory --------------------------------------------------------------

SLICES = [{"share": 0.25, "cost": 0.125}, {"share": 0.75, "cost": 0.875}]


def test_slice_durations_and_memory_scale_as_documented():
    problem = sliced(uniform_problem(2, 1, 2.0, 3.0, 1.0, mem_forward=4.0, mem_backward_input=-1.0), 2, SLICES, backward=3.2)
    t = problem.tables()
    assert op_duration(t, "F", 0, 1) == pytest.approx(2.0 * 0.875)
    assert op_duration(t, "B", 0, 0) == pytest.approx(3.0 * 0.125)
    assert op_duration(t, "W", 0, 1) == pytest.approx(1.0 * 0.75)
    # BW of slice k: the fused time scaled by the mix of its split parts
    assert op_duration(t, "BW", 1, 0) == pytest.approx(3.2 * (3.0 * 0.125 + 1.0 * 0.25) / 4.0)
    assert op_memory(t, "F", 0, 0) == pytest.approx(1.0) and op_memory(t, "B", 0, 1) == pytest.approx(-0.75)
    assert op_memory(t, "BW", 0, 1) == pytest.approx(-3.0)
    # a microbatch's slices add up to the whole microbatch
    for kind in ("F", "B", "W", "BW"):
        assert sum(op_duration(t, kind, 0, k) for k in range(2)) == pytest.approx(
            {"F": 2.0, "B": 3.0, "W": 1.0, "BW": 3.2 * (3.0 * 1 + 1.0 * 1) / 4.0}[kind]
        )


def test_fused_backward_time_is_what_bw_ops_take():
    problem = sliced(uniform_problem(3, 4, 1.0, 1.0, 1.0), 1, backward=1.5)
    schedule = generate(problem, "1f1b")
    durations = {round(op.end - op.start, 9) for d in schedule.devices for op in d if op.kind == "BW"}
    assert durations == {1.5}
    assert validate(problem, schedule.devices) == []
    # the default: B + W
    default = generate(uniform_problem(3, 4, 1.0, 1.0, 1.0), "1f1b")
    assert {round(op.end - op.start, 9) for d in default.devices for op in d if op.kind == "BW"} == {2.0}
    # a wrong BW duration is a violation
    bad = [[op._replace(end=op.start + 2.0) if op.kind == "BW" else op for op in d] for d in schedule.devices]
    assert any(v.startswith("duration:") for v in validate(problem, bad))


# --- problem fields -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slices", "message"),
    [
        ([{"share": 0.5, "cost": 0.5}], "slices: 1 slices listed, num_slices is 2"),
        ([{"share": 0.5, "cost": 0.5}, {"share": 0.6, "cost": 0.5}], "the shares sum to 1.1"),
        ([{"share": 0.5, "cost": 0.2}, {"share": 0.5, "cost": 0.7}], "the costs sum to 0.9"),
    ],
)
def test_bad_slices_are_refused_naming_the_field(slices, message):
    with pytest.raises(InputError, match=message):
        sliced(uniform_problem(2, 2), 2, slices)


def test_the_size_contract_counts_slices():
    m = MAX_OPS // (3 * 4) // 4 + 1  # within the contract unsliced, not with 4 slices
    problem = uniform_problem(4, m)
    with pytest.raises(InputError, match=r"4 slices = \d+ ops is more than"):
        sliced(problem, 4)


def test_problem_json_leaves_the_new_fields_out_at_their_defaults():
    plain = uniform_problem(2, 3).to_json()
    assert "num_slices" not in plain and "slices" not in plain and all("backward" not in s for s in plain["stages"])
    with_fields = sliced(uniform_problem(2, 3), 2, SLICES, backward=1.5).to_json()
    assert with_fields["num_slices"] == 2 and with_fields["slices"] == SLICES and with_fields["stages"][0]["backward"] == 1.5


# --- schedule files ------------------------------------------------------------------------


def test_version_1_files_still_load():
    schedule = load_schedule(DATA / "span-objective" / "schedule.json")
    assert schedule.problem.num_slices == 1 and all(op.slice == 0 for d in schedule.devices for op in d)


def test_unsliced_schedules_are_written_as_version_1_exactly_as_before(tmp_path):
    schedule = generate(uniform_problem(2, 3), "1f1b")
    data = schedule_to_json(schedule)
    assert data["version"] == 1
    assert set(data["devices"][0][0]) == {"kind", "stage", "microbatch", "start", "end"}
    assert set(data["problem"]) == {"num_devices", "num_microbatches", "stages", "comm_time", "memory_limit"}


def test_version_2_round_trip(tmp_path):
    problem = sliced(uniform_problem(3, 2), 3, [{"share": 0.2, "cost": 0.1}, {"share": 0.3, "cost": 0.3}, {"share": 0.5, "cost": 0.6}])
    schedule = generate(problem, "terapipe")
    save_schedule(schedule, tmp_path / "s.json")
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["version"] == 2 and data["problem"]["num_slices"] == 3
    loaded = load_schedule(tmp_path / "s.json")
    assert loaded.devices == schedule.devices and loaded.problem == problem


def test_slices_need_version_2_and_must_be_in_range():
    problem = sliced(uniform_problem(2, 1), 2)
    data = schedule_to_json(generate(problem, "terapipe"))
    with pytest.raises(InputError, match="need schedule format version 2"):
        schedule_from_json({**data, "version": 1})
    data["devices"][0][0]["slice"] = 2
    with pytest.raises(InputError, match=r"devices\.0\.0\.slice: 2 is out of range \(2 slices\)"):
        schedule_from_json(data)


# --- the sliced family at one slice, and random sliced orders --------------------------------------


def test_terapipe_at_one_slice_is_gpipe():
    for placement in ("linear", "vshape", "interleaved:2"):
        problem = uniform_problem(3, 4, placement=placement)
        assert terapipe(problem) == gpipe(problem)


def test_random_sliced_orders_simulate_to_valid_schedules():
    rng = random.Random(7)
    for _ in range(20):
        problem = random_problem(rng, rng.randint(1, 3), rng.randint(1, 3), rng.choice(["linear", "vshape"]), slices=rng.randint(2, 4))
        schedule = simulate(problem, random_feasible_order(problem, rng, fused_share=0.5))
        assert validate(problem, schedule.devices) == []
        assert len({op.slice for d in schedule.devices for op in d}) == problem.num_slices


# --- the op model is a leaf ------------------------------------------------------------------


def _modules_after_import(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(m for m in sys.modules if m.startswith('optimizer')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1])
    return set(out.stdout.split())


def test_ops_is_a_leaf_and_schedule_reads_no_files():
    assert _modules_after_import("optimizer.ops") == {"optimizer", "optimizer.ops"}
    loaded = _modules_after_import("optimizer.schedule")
    assert not loaded & {"optimizer.simulate", "optimizer.validate", "optimizer.formats", "optimizer.io"}, loaded


def test_compare_sees_when_fusing_wins():
    """B = W = 1 split, 1.2 fused (a 40% price for splitting): 1F1B's fused backwards beat
    ZB-H1's split ones, which they did not when BW was timed as B + W."""
    fused_cheap = uniform_problem(4, 8, 1.0, 1.0, 1.0, backward=1.2)
    assert generate(fused_cheap, "1f1b").makespan == pytest.approx((8 + 3) * 2.2)
    assert generate(fused_cheap, "1f1b").makespan < generate(fused_cheap, "zb-h1").makespan
    split_free = uniform_problem(4, 8, 1.0, 1.0, 1.0)
    assert generate(split_free, "1f1b").makespan > generate(split_free, "zb-h1").makespan


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"num_slices": 0}, "num_slices: Input should be greater than or equal to 1"),
        ({"num_slices": True}, "num_slices: Input should be a valid integer"),
        ({"num_slices": 2.0}, "num_slices: Input should be a valid integer"),
        (
            {"num_slices": 2, "slices": [{"share": 0.0, "cost": 0.5}, {"share": 1.0, "cost": 0.5}]},
            "slices.0.share: Input should be greater than 0",
        ),
        ({"num_slices": 1, "slices": [{"share": 1.0, "cost": 1.0, "x": 1}]}, "slices.0: unknown field 'x'"),
    ],
)
def test_slice_fields_are_strict(patch, message):
    with pytest.raises(InputError, match=re.escape(message)):
        validate_model(Problem, {**uniform_problem(2, 2).model_dump(mode="json"), **patch}, "problem")

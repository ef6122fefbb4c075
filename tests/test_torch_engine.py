"""`run --engine torch`: every family and a solved schedule on torch's
_PipelineScheduleRuntime (loaded from our CSV) match one process on 2 and 4 gloo ranks.

As in test_runtime_families.py, one launch per world size runs every schedule in the
same process group, and the model is the example GPT with uneven stages.
"""

from __future__ import annotations

import json

import pytest
from factories import hetero_problem, placed_problem, unusual_placements
from test_runtime_families import FAMILIES, Batch, microbatches, tiny_model
from typer.testing import CliRunner

from optimizer.exact import SolveOptions, solve
from optimizer.formats.schedule_json import save_schedule
from optimizer.ops import Op
from optimizer.problem import uniform_problem
from optimizer.schedules import GENERATORS, generate
from optimizer.simulate import simulate
from runtime.cli import app
from runtime.launch import launch
from runtime.torch_engine import TorchRunJob

pytestmark = [pytest.mark.runtime, pytest.mark.slow]

runner = CliRunner()


def mixed_backward(p: int, m: int):
    """1F1B with microbatch 0's fused backward split into B then W on every stage: torch
    takes a stage that mixes its B (fused) with I and W."""
    problem = uniform_problem(p, m)
    orders = []
    for device in generate(problem, "1f1b").order():
        ops: list[Op] = []
        for op in device:
            ops += [Op("B", op.stage, 0), Op("W", op.stage, 0)] if op.kind == "BW" and op.microbatch == 0 else [op]
        orders.append(ops)
    return simulate(problem, orders, method="mixed")


def schedules(world_size: int) -> dict:
    found = {}
    for family, placement in FAMILIES.items():
        problem = uniform_problem(world_size, microbatches(world_size), placement=placement)
        assert GENERATORS[family].unsupported(problem) is None, family
        found[family] = generate(problem, family)
    problem = hetero_problem(world_size, microbatches(world_size), "linear", limit=world_size - 0.5)
    found["solved"] = solve(problem, "auto", SolveOptions(time_limit=2.0, threads=1))
    found["mixed"] = mixed_backward(world_size, microbatches(world_size))
    for name, devices in unusual_placements(world_size).items():
        found[name] = generate(placed_problem(world_size, microbatches(world_size), devices), "greedy")
    return found


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def torch_runs(request):
    world_size = request.param
    jobs = tuple(
        TorchRunJob(s.to_json(), name, tiny_model(s.problem.num_stages), steps=1, check=True, timeout_s=60)
        for name, s in schedules(world_size).items()
    )
    return world_size, launch(Batch(jobs), world_size, threads=1)


@pytest.mark.parametrize("name", [*FAMILIES, "solved", "mixed", "blocked", "reversed"])
def test_torch_runtime_matches_single_process(torch_runs, name):
    world_size, results = torch_runs
    summary = results[name]
    assert summary["engine"] == "torch" and summary["devices"] == world_size
    check = summary["check"]
    assert check["passed"], check.get("first_mismatch")
    # float32 sums in another order than one process; see runtime/check.py
    assert check["max_relative_error"] < 1e-5


def test_run_engine_torch_command_and_a_bad_engine(tmp_path):
    schedule = generate(uniform_problem(2, 4), "zb-h1")
    save_schedule(schedule, tmp_path / "s.json")
    model = tiny_model(2)
    args = ["run", str(tmp_path / "s.json"), "--model", model, "--steps", "2", "--check", "--json", "--engine"]
    result = runner.invoke(app, [*args, "torch"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["engine"] == "torch" and summary["check"]["passed"] and len(summary["losses"]) == 2
    ours = runner.invoke(app, [*args, "pipesched"])
    assert ours.exit_code == 0, ours.output
    # the same model, data and optimizer: the same losses up to float32 summation order
    assert json.loads(ours.stdout)["losses"] == pytest.approx(summary["losses"], rel=1e-5)
    bad = runner.invoke(app, [*args, "megatron"])
    assert bad.exit_code == 2 and "engine: 'megatron' is not one of pipesched, torch" in bad.stderr


def test_the_schedule_csv_torch_loads_is_never_a_file_in_the_temporary_folder(tmp_path, monkeypatch):
    # A rank stopped by SIGKILL while loading (the launcher stops ranks so after Ctrl-C)
    # left its pipesched-torch-* folder behind; the CSV now lives in memory only.
    import tempfile

    from runtime.torch_engine import csv_file

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    text = "0F0,0B0,0W0\n"
    with csv_file(text) as path:
        assert list(tmp_path.iterdir()) == []
        with open(path, newline="") as read:
            assert read.read() == text
        with open(path, newline="") as read:  # torch may open it again: it reads from the start
            assert read.read() == text
    assert list(tmp_path.iterdir()) == []

"""`pipesched run` and `pipesched profile` end to end: profile -> solve -> run --check."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from optimizer.formats.schedule_json import load_schedule
from optimizer.problem import load_problem
from runtime.cli import app

pytestmark = [pytest.mark.runtime, pytest.mark.slow]

runner = CliRunner()
MODEL = "example:layers=3,hidden=32,heads=2,vocab=64,seq_len=16,split=1/2"


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output + (result.stderr or "")
    return result


def test_profile_solve_run_closes_the_loop(tmp_path):
    problem_path = tmp_path / "problem.json"
    invoke("profile", "--model", MODEL, "--devices", 2, "--microbatches", 4, "--steps", 2, "--memory-limit", 1.5, "--output", problem_path)
    problem = load_problem(problem_path)
    assert problem.num_devices == 2 and problem.num_stages == 2 and problem.comm_time > 0
    assert problem.memory_limit == 1.5
    for stage in problem.stages:
        assert stage.forward > 0 and stage.backward_input > 0 and stage.backward_weight > 0
        memory = stage.memory
        assert memory.forward > 0
        assert abs(memory.forward + memory.backward_input + memory.backward_weight) < 1e-12
    # The first stage reads token ids: its B has no input gradient to compute.
    assert problem.stages[0].backward_input < problem.stages[1].backward_input

    schedule_path = tmp_path / "schedule.json"
    invoke("solve", problem_path, "--method", "zb-h1", "--output", schedule_path)
    predicted = load_schedule(schedule_path).makespan
    result = invoke("run", schedule_path, "--model", MODEL, "--steps", 2, "--check", "--json")
    summary = json.loads(result.stdout)
    assert summary["method"] == "zb-h1"
    assert summary["check"]["passed"]
    assert summary["predicted_makespan"] == predicted
    assert len(summary["losses"]) == 2 and summary["median_step_ms"] > 0


def test_run_prints_a_readable_summary(tmp_path):
    invoke("problem", "--devices", 2, "--microbatches", 2, "--output", tmp_path / "p.json")
    invoke("solve", tmp_path / "p.json", "--method", "gpipe", "--output", tmp_path / "s.json")
    result = invoke("run", tmp_path / "s.json", "--model", MODEL, "--steps", 1, "--check")
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ran gpipe on 2 ranks (gloo), 2 stages, 2 microbatches: 1 steps")
    assert lines[-1].startswith("check passed: loss and ")


def test_profile_refuses_a_memory_limit_below_one_forward(tmp_path):
    output = tmp_path / "problem.json"
    args = ["profile", "--model", MODEL, "--devices", 2, "--microbatches", 2, "--steps", 1, "--memory-limit", 1e-12, "--output", output]
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    assert "memory_limit: device 0 limit 1e-12 is below one forward of stage 0" in result.stderr
    assert not output.exists()


def test_per_layer_profile_then_a_chosen_split_runs_and_checks(tmp_path):
    model = "example:layers=3,hidden=32,heads=2,vocab=64,seq_len=16"
    layers_path = tmp_path / "layers.json"
    invoke("profile", "--model", model, "--devices", 1, "--microbatches", 2, "--steps", 1, "--per-layer", "--output", layers_path)
    layers = json.loads(layers_path.read_text())["layers"]
    assert [(layer["name"], layer["kind"]) for layer in layers] == [
        ("embedding", "embedding"),
        ("blocks.0", "block"),
        ("blocks.1", "block"),
        ("blocks.2", "block"),
        ("head", "head"),
    ]
    assert all(layer["forward"] > 0 and layer["parameters"] > 0 for layer in layers)
    schedule_path = tmp_path / "schedule.json"
    invoke("solve", layers_path, "--devices", 2, "--microbatches", 4, "--time-limit", 2, "-q", "--output", schedule_path)
    stages = load_schedule(schedule_path).problem.stages
    chosen = [sum(1 for layer in stage.layers or [] if layer.kind == "block") for stage in stages]
    assert sum(chosen) == 3
    result = invoke("run", schedule_path, "--model", model, "--steps", 1, "--check", "--json")
    summary = json.loads(result.stdout)
    assert summary["check"]["passed"]
    # A split= that contradicts the schedule's split is refused, not silently replaced.
    other = "1/2" if chosen != [1, 2] else "2/1"
    result = runner.invoke(app, ["run", str(schedule_path), "--model", f"{model},split={other}", "--steps", "1"])
    assert result.exit_code == 2 and "differs from the schedule's layer split" in result.output
    # So is a layers= that contradicts it (it was silently replaced by the split's count).
    result = runner.invoke(app, ["run", str(schedule_path), "--model", model.replace("layers=3", "layers=5"), "--steps", "1"])
    assert result.exit_code == 2 and "layers=5 differs from the schedule's layer split (3 blocks)" in result.output


def test_a_ctrl_c_while_the_first_is_handled_still_exits_130(monkeypatch):
    # A second Ctrl-C arriving while the first one's schedule was written (or during the
    # rank server's stop) escaped as KeyboardInterrupt: the process died of SIGINT.
    import runtime.cli as console

    stopped: list[bool] = []

    def interrupted_twice(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(console, "run_app", interrupted_twice)
    monkeypatch.setattr(console, "stop_rank_server", lambda: stopped.append(True))
    assert console.main() == 130
    assert stopped == [True]  # the rank server is stopped all the same

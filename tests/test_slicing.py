"""Slice lengths and costs (optimizer/slicing.py): the cost rules, TeraPipe's dynamic
program against brute force, and `pipesched problem --slices`."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.problem import load_problem, uniform_problem
from optimizer.slicing import dp_lengths, even_lengths, slice_model, token_costs, with_slices

pytestmark: list[pytest.MarkDecorator] = []  # fast: small sequences

runner = CliRunner()


def objective(costs: np.ndarray, lengths: list[int], stages: int, overhead: float) -> float:
    """TeraPipe's pipeline time for these slices: sum of slice times + (p - 1) x the longest."""
    ends = np.cumsum([0, *lengths])
    times = [costs[a:b].sum() + overhead * costs.sum() for a, b in zip(ends, ends[1:])]
    return sum(times) + (stages - 1) * max(times)


def test_token_costs_follow_the_stated_formula():
    assert list(token_costs(3, 2, "attention")) == [24 * 4 + 4 * 2 * 1, 24 * 4 + 4 * 2 * 2, 24 * 4 + 4 * 2 * 3]
    assert list(token_costs(3, 2, "linear")) == [1.0, 1.0, 1.0]
    assert even_lengths(10, 4) == [3, 3, 2, 2]


@pytest.mark.parametrize("length", [9, 14])
@pytest.mark.parametrize("slices", [2, 3, 4])
@pytest.mark.parametrize("stages", [1, 2, 8])
@pytest.mark.parametrize("overhead", [0.0, 0.05])
def test_dp_matches_brute_force_on_whole_tokens(length, slices, stages, overhead):
    """Sequences shorter than DP_BLOCKS are cut on whole tokens: every cut is enumerated.
    A steep attention term (h = 2) makes the later tokens several times dearer."""
    costs = token_costs(length, 2, "attention")
    found = dp_lengths(costs, slices, stages, overhead)
    assert sum(found) == length and len(found) == slices and min(found) >= 1
    best = min(
        objective(costs, [b - a for a, b in zip((0, *cut), (*cut, length))], stages, overhead)
        for cut in itertools.combinations(range(1, length), slices - 1)
    )
    assert objective(costs, found, stages, overhead) == pytest.approx(best, rel=1e-12)


def test_dp_gives_later_slices_fewer_tokens_under_attention_and_even_ones_under_linear():
    attention = slice_model(32768, 8, lengths="dp", cost="attention", hidden=1024, stages=8)
    assert list(attention.lengths) == sorted(attention.lengths, reverse=True) and attention.lengths[0] > attention.lengths[-1]
    # balanced within one DP block's cost (a block is 1/128 of the sequence, the dearest cost about 2x the mean)
    assert max(attention.costs) - min(attention.costs) < 2 * 2 / 128
    even = slice_model(32768, 8, lengths="even", cost="attention", hidden=1024)
    assert even.costs[-1] > 1.5 * even.costs[0]  # the last of even slices is the dearest
    assert slice_model(4096, 4, lengths="dp", cost="linear", stages=4).lengths == (1024,) * 4


def test_overhead_lengthens_f_and_b_and_keeps_the_fractions_summing_to_one():
    model = slice_model(1000, 4, cost="linear", overhead=0.05)
    assert model.time_scale == pytest.approx(1.2)
    assert sum(model.costs) == pytest.approx(1.0) and sum(model.shares) == pytest.approx(1.0)
    problem = with_slices(uniform_problem(2, 1, 1.0, 2.0, 1.0, backward=2.5), model)
    stage = problem.stages[0]
    assert (stage.forward, stage.backward_input, stage.backward_weight) == pytest.approx((1.2, 2.4, 1.0))
    assert stage.backward == pytest.approx(2.5 + 0.2 * 2.0)


def test_problem_command_writes_slices(tmp_path):
    out = tmp_path / "p.json"
    result = runner.invoke(
        app,
        ["problem", "-p", "4", "-m", "1", "--slices", "4", "--slice-lengths", "dp", "--slice-cost", "attention",
         "--sequence-length", "8192", "--hidden", "1024", "--backward", "1.6", "-o", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "slices: " in result.stdout
    problem = load_problem(out)
    assert problem.num_slices == 4 and problem.slices is not None and problem.stages[0].backward == 1.6
    data = json.loads(out.read_text())
    assert len(data["slices"]) == 4


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--slices", "2", "--slice-lengths", "uneven"], "--slice-lengths: 'uneven' is not one of even, dp"),
        (["--slices", "2", "--slice-cost", "cubic"], "--slice-cost: 'cubic' is not one of linear, attention"),
        (["--slices", "9", "--sequence-length", "8"], "--slices: 9 slices need at least as many tokens"),
        (["--slices", "2", "--slice-overhead", "-0.1"], "--slice-overhead: must be >= 0"),
        (["--slices", "2000", "-m", "100", "--sequence-length", "100000"], "x 2000 slices = 1200000 ops is more than"),
    ],
)
def test_problem_command_refuses_bad_slice_options(tmp_path, options, message):
    result = runner.invoke(app, ["problem", "-p", "2", "-m", "1", "-o", str(tmp_path / "p.json"), *options])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "p.json").exists()


def test_sliced_schedules_go_through_solve_validate_show_and_refuse_torch_formats(tmp_path):
    def run(*args: str):
        return runner.invoke(app, [str(a) for a in args])

    problem = tmp_path / "p.json"
    assert run("problem", "-p", "3", "-m", "2", "--slices", "3", "--slice-cost", "attention", "--hidden", "64",
               "--sequence-length", "90", "-o", problem).exit_code == 0  # fmt: skip
    schedule = tmp_path / "s.json"
    assert run("solve", problem, "--method", "auto", "--time-limit", "1", "-q", "-o", schedule).exit_code == 0
    assert json.loads(schedule.read_text())["version"] == 2
    assert run("validate", schedule).exit_code == 0
    assert run("show", schedule, "-o", tmp_path / "s.svg").exit_code == 0 and ">0.2<" in (tmp_path / "s.svg").read_text()
    solved = tmp_path / "cpsat.json"  # the whole models take slices too
    assert run("solve", problem, "--method", "cpsat", "--time-limit", "1", "-q", "-o", solved).exit_code == 0
    assert run("validate", solved).exit_code == 0
    for args, message in (
        (
            ("export", schedule, "--format", "torch-csv", "-o", tmp_path / "x.csv"),
            "torch-csv: this schedule has 3 token slices per microbatch",
        ),
        (("compare", problem, "--torch"), "--torch: torch.distributed.pipelining's schedules have no token slices"),
    ):
        result = run(*args)
        assert result.exit_code == 2 and message in result.stderr, result.stderr

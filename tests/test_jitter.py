"""`compare --jitter`: each schedule's order re-timed under random op times (optimizer.jitter)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from factories import random_problem, with_vocab
from typer.testing import CliRunner

from optimizer import jitter
from optimizer.cli import app
from optimizer.jitter import every_op, jittered_makespans, lognormal_factors, summarize
from optimizer.problem import uniform_problem
from optimizer.schedules import generate
from optimizer.simulate import simulate_times

runner = CliRunner()


def _makespan(timed) -> float:
    return max(ops[-1].end for ops in timed) - min(ops[0].start for ops in timed)


def test_factors_of_one_give_the_nominal_times_and_factors_of_two_double_them():
    problem = uniform_problem(4, 8, 1.0, 1.2, 0.7, comm_time=0.0, memory_limit=6.0)
    orders = generate(problem, "zb-h1").order()
    nominal = simulate_times(problem, orders)
    ones = dict.fromkeys(every_op(problem), 1.0)
    assert simulate_times(problem, orders, factors=ones) == nominal
    doubled = simulate_times(problem, orders, factors=dict.fromkeys(every_op(problem), 2.0))
    # With no transfers every time is a sum of durations: all of them double.
    assert _makespan(doubled) == pytest.approx(2 * _makespan(nominal), rel=1e-12)


def test_the_factors_have_mean_one_and_the_asked_coefficient_of_variation():
    # 400,000 draws: the sample mean's standard error is cv / sqrt(n) (0.05% at cv 0.3) and
    # the sample CV's about as small, so 1% is many standard errors wide.
    for cv in (0.05, 0.3, 1.0):
        draws = lognormal_factors(400_000, cv, np.random.default_rng(1))
        assert draws.min() > 0
        assert draws.mean() == pytest.approx(1.0, rel=0.01)
        assert draws.std() / draws.mean() == pytest.approx(cv, rel=0.01 if cv < 1 else 0.05)


@pytest.mark.parametrize("placement", ["linear", "vshape", "interleaved:2"])
def test_the_mean_makespan_is_at_least_the_nominal_one_and_the_summary_is_ordered(placement):
    # The makespan of a fixed order is a longest path, convex in the durations: under
    # mean-one factors its mean is at least the nominal makespan (Jensen; seeded, so the
    # same 300 samples every run).
    problem = random_problem(random.Random(3), 4, 8, placement)
    schedules = [generate(problem, name) for name in ("gpipe", "greedy")]
    for schedule, values in zip(schedules, jittered_makespans(problem, schedules, 0.2, 300, seed=5), strict=True):
        summary = summarize(schedule.metrics.makespan, values)
        assert summary.mean >= summary.nominal
        assert min(values) <= summary.p50 <= summary.p95 <= summary.worst == max(values)


def test_an_ops_factor_does_not_depend_on_the_other_schedules_compared_and_the_seed_decides():
    problem = uniform_problem(4, 8, 1.0, 1.0, 1.0, comm_time=0.1)
    one, two = generate(problem, "1f1b"), generate(problem, "zb-h1")
    alone = jittered_makespans(problem, [one], 0.1, 20, seed=7)
    together = jittered_makespans(problem, [two, one], 0.1, 20, seed=7)
    assert alone[0] == together[1]
    assert jittered_makespans(problem, [one], 0.1, 20, seed=7) == alone
    assert jittered_makespans(problem, [one], 0.1, 20, seed=8) != alone


def test_slices_vocabulary_passes_and_fused_backwards_are_varied_too():
    sliced = random_problem(random.Random(2), 2, 4, slices=3)
    vocab = with_vocab(uniform_problem(2, 4, 1.0, 1.0, 1.0))
    for problem, family in ((sliced, "seq1f1b"), (vocab, "1f1b-vocab"), (uniform_problem(2, 4, 1.0, 1.0, 1.0), "1f1b")):
        schedule = generate(problem, family)
        values = jittered_makespans(problem, [schedule], 0.3, 10, seed=0)[0]
        assert len(set(values)) == 10, family  # every sample moved the makespan


def _problem_file(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(uniform_problem(4, 8, 1.0, 1.0, 1.0, comm_time=0.05, memory_limit=6.0).to_json()))
    return path


def test_compare_with_jitter_adds_each_schedules_spread_the_same_every_run(tmp_path):
    path = _problem_file(tmp_path)
    args = ["compare", str(path), "--jitter", "0.1", "--samples", "30", "--seed", "4", "--json"]
    first, second = runner.invoke(app, args), runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert first.stdout == second.stdout
    rows = [row for row in json.loads(first.stdout) if row["makespan"] is not None]
    assert rows
    for row in rows:
        spread = row["jitter"]
        assert (spread["cv"], spread["samples"], spread["seed"]) == (0.1, 30, 4)
        assert spread["nominal"] == row["makespan"]
        assert spread["p50"] <= spread["p95"] <= spread["max"]
    table = runner.invoke(app, ["compare", str(path), "--jitter", "0.1", "--samples", "30"])
    assert table.exit_code == 0, table.output
    assert "coefficient of variation 0.1, 30 samples, seed 0" in table.stdout
    # The spread has a table of its own: every name whole at 80 columns.
    assert table.stdout.count("zb-auto") == 2
    plain = runner.invoke(app, ["compare", str(path), "--json"])
    assert all("jitter" not in row for row in json.loads(plain.stdout))


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--jitter", "nan"], "--jitter"),
        (["--jitter", "0"], "--jitter"),
        (["--jitter", "1.5"], "--jitter"),
        (["--jitter", "-0.1"], "--jitter"),
        (["--jitter", "0.1", "--samples", "0"], "--samples"),
        (["--jitter", "0.1", "--samples", "10001"], "--samples"),
        (["--samples", "5"], "--samples: only with --jitter"),
        (["--seed", "3"], "--seed: only with --jitter"),
        (["--seed", "0"], "--seed: only with --jitter"),
        (["--jitter", "1.0000001"], "got 1.0000001"),
        (["--jitter", "0.1", "--seed", str(2**40)], "--seed"),
    ],
)
def test_compare_refuses_bad_jitter_options_in_one_line(tmp_path, extra, message):
    result = runner.invoke(app, ["compare", str(_problem_file(tmp_path)), *extra])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.output


def test_more_timing_than_allowed_is_refused_naming_the_samples_that_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(jitter, "MAX_TIMED_OPS", 10_000)
    result = runner.invoke(app, ["compare", str(_problem_file(tmp_path)), "--jitter", "0.1", "--samples", "100"])
    assert result.exit_code == 2
    assert "--samples: 100 samples x" in result.stderr and "at most" in result.stderr

"""The token-slice families (terapipe, seq1f1b, seq1f1b-zb): their unsliced parents at one
slice, their closed forms on uniform slices, and their refusal of unsliced problems."""

from __future__ import annotations

import random

import factories
import pytest
from factories import random_slices

from optimizer.errors import InputError
from optimizer.exact import SolveOptions, solve
from optimizer.formats.chrome_trace import chrome_trace
from optimizer.formats.gantt_svg import gantt_svg
from optimizer.io import validate_model
from optimizer.problem import Problem, uniform_problem
from optimizer.schedules import GENERATORS, generate, generate_all
from optimizer.schedules.gpipe import gpipe
from optimizer.schedules.one_f_one_b import one_f_one_b
from optimizer.schedules.seq1f1b import seq1f1b
from optimizer.schedules.seq1f1b_zb import seq1f1b_zb
from optimizer.schedules.terapipe import terapipe
from optimizer.schedules.zb_h1 import zb_h1
from optimizer.validate import validate

pytestmark: list[pytest.MarkDecorator] = []  # fast: closed forms on small pipelines

SLICED = ("terapipe", "seq1f1b", "seq1f1b-zb")


def sliced(p: int, m: int, k: int, f: float = 1.0, b: float = 1.0, w: float = 1.0, **options) -> Problem:
    """Uniform stages cut into k even slices (share = cost = 1/k: linear cost)."""
    return factories.with_slices(uniform_problem(p, m, f, b, w, **options), k)


@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("m", [1, 3, 6])
def test_at_one_slice_each_is_its_parent_family(p, m):
    problem = uniform_problem(p, m, 1.0, 1.5, 0.5)
    assert terapipe(problem) == gpipe(problem)
    assert seq1f1b(problem) == one_f_one_b(problem)
    assert seq1f1b_zb(problem) == zb_h1(problem)


def test_they_refuse_unsliced_problems_and_the_others_refuse_sliced_ones():
    for name in SLICED:
        with pytest.raises(InputError, match="needs token slices"):
            generate(uniform_problem(2, 2), name)
    with pytest.raises(InputError, match="does not order token slices"):
        generate(sliced(2, 2, 2), "1f1b")
    assert set(generate_all(sliced(2, 2, 2))[0]) == {*SLICED, "greedy"}  # greedy orders slices too
    assert not set(generate_all(uniform_problem(2, 2))[0]) & set(SLICED)


CASES = [(p, m, k, times) for p in (2, 4, 8) for m in (1, 2, 5) for k in (2, 4, 8) for times in ((1.0, 1.0, 1.0), (1.0, 2.0, 0.7))]


@pytest.mark.parametrize(("p", "m", "k", "times"), CASES)
def test_terapipe_and_seq1f1b_closed_form(p, m, k, times):
    """GPipe's and 1F1B's (m + p - 1)(F + BW) with m·K units of 1/K the work: slicing
    shrinks the fill and drain from p - 1 microbatch times to p - 1 slice times,
    (m·K + p - 1)(F + BW)/K, exactly (comm 0, even slices of linear cost)."""
    f, b, w = times
    problem = sliced(p, m, k, f, b, w)
    expected = (m * k + p - 1) * (f + b + w) / k
    unsliced = generate(uniform_problem(p, m, f, b, w), "gpipe").makespan
    assert unsliced == pytest.approx((m + p - 1) * (f + b + w), rel=1e-12)
    for name in ("terapipe", "seq1f1b"):
        schedule = generate(problem, name)
        assert validate(problem, schedule.devices) == []
        assert schedule.makespan == pytest.approx(expected, rel=1e-12), name
    # activations held: all m·K slices for TeraPipe, (p + K - 1) slices on device 0 for Seq1F1B
    assert max(generate(problem, "terapipe").metrics.peak_memory) == pytest.approx(m)
    assert generate(problem, "seq1f1b").metrics.peak_memory[0] == pytest.approx(min(p + k - 1, m * k) / k)


@pytest.mark.parametrize(("p", "m", "k", "times"), CASES)
def test_seq1f1b_zb_closed_form(p, m, k, times):
    """ZB-H1's m(F+B+W) + (p-1)(F+B-W) over units of 1/K (W <= F, B; comm 0), once the
    units after the first microbatch's cover the pipeline's depth, (m-1)K >= p-1; with
    fewer the deeper warm-up leaves the cool-down W's less to fill and it is longer."""
    f, b, w = times
    problem = sliced(p, m, k, f, b, w)
    schedule = generate(problem, "seq1f1b-zb")
    assert validate(problem, schedule.devices) == []
    formula = (m * k * (f + b + w) + (p - 1) * (f + b - w)) / k
    if (m - 1) * k >= p - 1:
        assert schedule.makespan == pytest.approx(formula, rel=1e-12)
    else:
        assert schedule.makespan > formula


def test_one_sequence_sliced_against_gpipe():
    """One sequence (m = 1), p = 8, K = 8 even slices: (K + p - 1)/K = 15/8 of a
    microbatch's work against GPipe's p = 8, over 4x shorter."""
    problem = sliced(8, 1, 8)
    assert generate(problem, "terapipe").makespan == pytest.approx(15 / 8 * 3)
    assert generate(uniform_problem(8, 1), "gpipe").makespan == pytest.approx(8 * 3)


def test_every_sliced_family_is_valid_on_uneven_attention_slices():
    rng = random.Random(3)
    for k in (2, 3, 5):
        data = sliced(4, 3, k, 1.0, 1.3, 0.6, comm_time=0.1).model_dump(mode="json")
        data["slices"] = random_slices(rng, k)
        problem = validate_model(Problem, data, "problem")
        for name in SLICED:
            assert GENERATORS[name].reason(problem) is None
            assert validate(problem, generate(problem, name).devices) == [], name


def test_pictures_and_traces_label_ops_mb_dot_slice():
    schedule = generate(sliced(2, 2, 3), "seq1f1b")
    svg = gantt_svg(schedule)
    assert ">1.2</text>" in svg and "BW stage 0 mb 1.2:" in svg
    names = {event["name"] for event in chrome_trace(schedule)["traceEvents"] if event["ph"] == "X"}
    assert "F0 mb1.2" in names and "BW1 mb0.0" in names
    unsliced = gantt_svg(generate(uniform_problem(2, 2), "1f1b"))
    assert "F stage 0 mb 1:" in unsliced and "mb 1.0" not in unsliced


@pytest.mark.slow
def test_greedy_orders_slices_within_the_memory_limit():
    """The list engine over units: valid (hence never over the limit and never stuck) for
    limits from one microbatch's peak up, on every placement."""
    rng = random.Random(11)
    for _ in range(80):
        p, m, k = rng.randint(1, 4), rng.randint(1, 4), rng.randint(2, 4)
        placement = rng.choice(["linear", "vshape", "interleaved:2", "interleaved:3"])
        limit = rng.choice([None, 1.0, 1.5, 3.0])
        problem = factories.random_problem(rng, p, m, placement, slices=k, limit=limit, forward_memory=(0.5, 1.0, 2.0))
        schedule = generate(problem, "greedy")
        assert validate(problem, schedule.devices) == []


def test_greedy_refuses_slices_where_its_memory_bound_does_not_hold():
    """Several stages per device, a limit, and a B that allocates (held until its W): the
    order of a microbatch's slices there sets its peak, which the engine does not bound."""
    data = uniform_problem(2, 2, placement="vshape", mem_forward=1.0, mem_backward_input=0.5, memory_limit=8.0).model_dump(mode="json")
    data["num_slices"] = 2
    problem = validate_model(Problem, data, "problem")
    with pytest.raises(InputError, match="one stage per device, or with B and W only freeing memory"):
        generate(problem, "greedy")
    unlimited = validate_model(Problem, {**data, "memory_limit": None}, "problem")
    assert validate(unlimited, generate(unlimited, "greedy").devices) == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_auto_on_sliced_problems_is_valid_and_no_worse_than_any_sliced_family(seed):
    rng = random.Random(seed)
    problem = factories.random_problem(rng, rng.randint(2, 4), rng.randint(1, 3), slices=rng.randint(2, 4), limit=rng.choice([None, 2.0]))
    schedule = solve(problem, "auto", SolveOptions(time_limit=2.0))
    assert validate(problem, schedule.devices) == []
    families, _ = generate_all(problem)
    fitting = [s.makespan for s in families.values() if s.fits_memory()]
    assert fitting and schedule.makespan <= min(fitting) * (1 + 1e-9)
    assert schedule.metrics.lower_bound is not None and schedule.metrics.lower_bound <= schedule.makespan * (1 + 1e-9)

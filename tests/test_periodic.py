"""Periodic patterns: unrolled orders are valid, and the steady state's memory is exact."""

from __future__ import annotations

import math

import pytest

from optimizer.exact.periodic import period_status, repeated_pattern, solve_period, unroll
from optimizer.exact.timescale import integer_tables
from optimizer.ops import SPLIT_KINDS
from optimizer.problem import Problem, uniform_problem
from optimizer.simulate import simulate
from optimizer.validate import validate

pytestmark = pytest.mark.solver


def busiest_work(problem: Problem) -> int:
    tables = integer_tables(problem)
    work = [0] * problem.num_devices
    for s in range(problem.num_stages):
        work[tables.device[s]] += sum(tables.duration[kind][s] for kind in SPLIT_KINDS)
    return max(work)


def zb_shape(p: int, m: int, placement: str, limit: float | None) -> Problem:
    """Zero Bubble's shape (F = B = 1, W = 0.6, comm 0.03; B frees 0.63 of F's 1)."""
    return uniform_problem(
        p, m, 1.0, 1.0, 0.6, comm_time=0.03, placement=placement, mem_forward=1.0, mem_backward_input=-0.63, memory_limit=limit
    )


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["linear", "vshape"])
def test_an_unrolled_pattern_is_a_valid_order(placement):
    problem = zb_shape(4, 12, placement, None)
    tables = integer_tables(problem)
    period = busiest_work(problem)
    offsets = solve_period(problem, tables, period, time_limit=2)
    assert offsets is not None
    schedule = simulate(problem, unroll(problem, offsets, period))
    assert validate(problem, schedule.devices) == []


@pytest.mark.slow
@pytest.mark.parametrize("placement,limit", [("linear", 3.0), ("vshape", 2.0)])
def test_a_pattern_found_fits_its_limit_and_none_is_said_only_where_the_memory_free_ones_overflow(placement, limit):
    # Periods from the busiest device's work up. A pattern returned must fit once unrolled
    # (m is large enough to reach the steady state); "none" must never be said at a
    # period where a memory-free pattern already fits (that would be a false proof).
    problem = zb_shape(4, 24, placement, limit)
    tables = integer_tables(problem)
    work = busiest_work(problem)
    answers = []
    for step in (1.0, 1.5, 3.0):
        period = math.ceil(work * step)
        # 4 s: a quarter of it for the memory-free hint, which runs to its limit where it
        # cannot prove its latency least; the proofs and patterns take under 0.3 s.
        status, offsets = period_status(problem, tables, period, time_limit=4)
        answers.append(status)
        free = solve_period(problem, tables, period, time_limit=1)
        free_fits = free is not None and simulate(problem, unroll(problem, free, period)).fits_memory()
        if status == "pattern":
            assert offsets is not None
            schedule = simulate(problem, unroll(problem, offsets, period))
            assert validate(problem, schedule.devices) == [] and schedule.fits_memory()
        if free_fits:
            assert status != "none"
    assert "pattern" in answers  # a long enough period always has room


@pytest.mark.slow
def test_no_pattern_at_full_rate_when_the_first_device_holds_too_few_round_trips():
    # Linear p = 4 with room for 2 activations on every device: device 0 holds each
    # microbatch from its F until its B frees it, a round trip through all 4 stages (about
    # 8 units) while a period at full rate is 2.6, so no 1-periodic pattern at that rate
    # fits (about 3 microbatches would be in flight), which the model proves.
    problem = zb_shape(4, 24, "linear", 2.0)
    tables = integer_tables(problem)
    status, offsets = period_status(problem, tables, busiest_work(problem), time_limit=20)
    assert (status, offsets) == ("none", None)


def test_none_is_never_said_off_the_decimal_grid_where_a_pattern_fits_exactly():
    # One device, one stage: F, B, W back to back in a period of their work hold exactly
    # F's allocation at every forward, which the limit allows. Thirds are off the decimal
    # grid, so memory is rounded: rounding the frees away from zero counts 1 unit more than
    # the limit and "proves" that no pattern fits.
    third = 1 / 3
    problem = Problem.model_validate(
        {
            "num_devices": 1,
            "num_microbatches": 4,
            "comm_time": 0.0,
            "stages": [
                {
                    "device": 0,
                    "forward": 1.0,
                    "backward_input": 1.0,
                    "backward_weight": 1.0,
                    "memory": {"forward": 1.0, "backward_input": -third, "backward_weight": -2 * third},
                }
            ],
            "memory_limit": 1.0,
        }
    )
    for relax_memory in (False, True):
        tables = integer_tables(problem, relax_memory=relax_memory)
        assert not tables.memory_is_exact
        status, offsets = period_status(problem, tables, busiest_work(problem), time_limit=2)
        assert status == "pattern" and offsets is not None
        assert simulate(problem, unroll(problem, offsets, busiest_work(problem))).fits_memory()


@pytest.mark.slow
def test_two_copies_per_cycle_reach_a_rate_no_single_copy_does_and_never_say_none_where_one_fits():
    # Linear p = 4 with room for 3 activations: at 1.5 times the busiest device's work per
    # microbatch no 1-periodic pattern fits (proven), but alternating two patterns does,
    # unrolled and checked. At 3 times a 1-periodic pattern fits; repeated, it is a pattern
    # of two microbatches per cycle of twice the period, so "none" there would be false.
    problem = zb_shape(4, 24, "linear", 3.0)
    tables = integer_tables(problem)
    work = busiest_work(problem)
    tight, loose = math.ceil(1.5 * work), math.ceil(3.0 * work)
    assert period_status(problem, tables, tight, time_limit=4) == ("none", None)
    status, offsets = period_status(problem, tables, 2 * tight, time_limit=4, copies=2)
    assert status == "pattern" and offsets is not None and {r for _, _, r in offsets} == {0, 1}
    schedule = simulate(problem, unroll(problem, offsets, 2 * tight))
    assert validate(problem, schedule.devices) == [] and schedule.fits_memory()
    assert period_status(problem, tables, loose, time_limit=4)[0] == "pattern"
    assert period_status(problem, tables, 2 * loose, time_limit=4, copies=2)[0] != "none"


def test_a_repeated_pattern_is_the_same_schedule_and_a_hint_never_changes_what_is_proven():
    # The 1-periodic pattern at 3 times the work, repeated at its own rate, is the same
    # schedule; squeezed to 1.5 times it is only a hint (it overlaps), and the 2-copy search
    # it starts still finds a pattern there, and still proves "none" where none exists.
    problem = zb_shape(4, 24, "linear", 3.0)
    tables = integer_tables(problem)
    work = busiest_work(problem)
    tight, loose = math.ceil(1.5 * work), math.ceil(3.0 * work)
    status, one = period_status(problem, tables, loose, time_limit=4)
    assert status == "pattern" and one is not None
    assert unroll(problem, repeated_pattern(one, loose, 2 * loose, 2), 2 * loose) == unroll(problem, one, loose)
    status, found = period_status(problem, tables, 2 * tight, time_limit=4, copies=2, hint=repeated_pattern(one, loose, 2 * tight, 2))
    assert status == "pattern" and found is not None
    schedule = simulate(problem, unroll(problem, found, 2 * tight))
    assert validate(problem, schedule.devices) == [] and schedule.fits_memory()
    below = math.floor(0.9 * work)  # below the busiest device's work: nothing fits
    assert period_status(problem, tables, 2 * below, time_limit=4, copies=2, hint=repeated_pattern(one, loose, 2 * below, 2)) == (
        "none",
        None,
    )
    with pytest.raises(ValueError, match="1-periodic"):
        repeated_pattern(found, 2 * tight, 4 * tight, 2)

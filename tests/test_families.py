"""The schedule families against their published closed forms, and their validity.

Conventions: F = B = W = 1 and comm 0 unless a test says otherwise. On the linear
placement a stage's F allocates 1 and its W frees 1 (B frees nothing), so peaks count
microbatch activations. On vshape and interleaved:V each chunk allocates 1/V of that
(0.5 on vshape), so peaks again count whole microbatch activations.
"""

from __future__ import annotations

import math
import random

import pytest
from factories import hetero_problem, random_slices
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from benchmarks.published import published_problem, setting_named
from optimizer.errors import InputError
from optimizer.problem import Problem, placement_devices, uniform_problem
from optimizer.schedules import GENERATORS, generate
from optimizer.simulate import simulate
from optimizer.validate import validate

EXACT = 1e-9  # closed forms are sums of a few hundred exact binary fractions


def run(name: str, problem: Problem):
    schedule = generate(problem, name)
    assert validate(problem, schedule.devices) == []
    return schedule


def longest_span(schedule) -> tuple[float, float]:
    """(span, idle time) of the device with the longest span: the bubble convention."""
    best = (0.0, 0.0)
    for ops in schedule.devices:
        span = max(o.end for o in ops) - min(o.start for o in ops)
        if span > best[0]:
            best = (span, span - sum(o.end - o.start for o in ops))
    return best


# -- GPipe and 1F1B ---------------------------------------------------------------------


@pytest.mark.parametrize("p,m", [(2, 1), (2, 5), (4, 4), (4, 9), (8, 16)])
def test_gpipe_and_1f1b_bubble_rate_and_peaks(p, m):
    problem = uniform_problem(p, m)
    gpipe, one_f_one_b = run("gpipe", problem), run("1f1b", problem)
    rate = (p - 1) / (m + p - 1)
    assert gpipe.metrics.bubble_ratio == pytest.approx(rate, abs=EXACT)
    assert one_f_one_b.metrics.bubble_ratio == pytest.approx(rate, abs=EXACT)
    assert max(gpipe.metrics.peak_memory) == m
    assert max(one_f_one_b.metrics.peak_memory) == min(p, m)


# -- ZB-H1 and ZB-H2 --------------------------------------------------------------------

# ZB-H1's bubble (p-1)(F+B-W) holds exactly when W <= F and W <= B (comm 0, any m):
# the deferred W's then always fit in the waits they are meant to fill.
UNEQUAL = [(1.2, 1.0, 0.7), (1.0, 1.5, 0.5), (2.0, 1.1, 1.1), (1.0, 1.0, 1.0)]


@pytest.mark.parametrize("f,b,w", UNEQUAL)
@pytest.mark.parametrize("p,m", [(2, 3), (3, 8), (4, 4), (4, 12), (8, 16)])
def test_zb_h1_bubble_time_and_peak(p, m, f, b, w):
    problem = uniform_problem(p, m, f, b, w)
    schedule = run("zb-h1", problem)
    assert schedule.makespan - m * (f + b + w) == pytest.approx((p - 1) * (f + b - w), abs=EXACT)
    assert max(schedule.metrics.peak_memory) == min(p, m)


@pytest.mark.parametrize("f,b,w", [(1.0, 0.5, 1.0), (0.5, 1.0, 1.0), (1.0, 1.0, 1.5)])
def test_zb_h1_formula_needs_w_at_most_f_and_b(f, b, w):
    p, m = 4, 8
    schedule = run("zb-h1", uniform_problem(p, m, f, b, w))
    assert schedule.makespan - m * (f + b + w) > (p - 1) * (f + b - w) + 0.1


# ZB-H2's span formula holds when W <= F, W <= B and m >= 2p-1 (its warm-up fits), for
# any comm c: each comm hop is paid twice per stage on the round trip.
@pytest.mark.parametrize("f,b,w", UNEQUAL)
@pytest.mark.parametrize("c", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("p,m", [(2, 3), (3, 5), (4, 7), (4, 16), (8, 24)])
def test_zb_h2_span_and_peak(p, m, f, b, w, c):
    problem = uniform_problem(p, m, f, b, w, comm_time=c)
    schedule = run("zb-h2", problem)
    span, _ = longest_span(schedule)
    assert span - m * (f + b + w) == pytest.approx((p - 1) * (f + b + 2 * c - 2 * w), abs=EXACT)
    assert max(schedule.metrics.peak_memory) == 2 * p - 1


# -- V placement: ZB-V, V-Half, V-Min, DualPipeV ---------------------------------------


def vshape(p: int, m: int, f: float = 1.0, b: float = 1.0, w: float = 1.0) -> Problem:
    return uniform_problem(p, m, f, b, w, placement="vshape", mem_forward=0.5)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("extra", [0, 1, 5])
def test_zb_v_zero_bubble_and_peak(p, extra):
    # "Zero" is the bubble ratio of the longest-span device (device 0), exactly 0 once
    # m >= 2p-1, the microbatches its warm-up needs; shorter devices idle only before
    # their first op and after their last, outside their span.
    m = 2 * p - 1 + extra
    schedule = run("zb-v", vshape(p, m))
    assert schedule.metrics.bubble_ratio == pytest.approx(0.0, abs=EXACT)
    assert max(schedule.metrics.peak_memory) == p


def test_zb_v_has_a_bubble_with_too_few_microbatches():
    assert run("zb-v", vshape(4, 5)).metrics.bubble_ratio > 0.05


PEAKS = {"v-half": lambda p: (p + 2) // 2, "v-min": lambda p: (p + 4) // 3}


@pytest.mark.parametrize("name", ["v-half", "v-min"])
@pytest.mark.parametrize("p", [4, 6, 8, 16])
def test_controllable_memory_peaks(name, p):
    schedule = run(name, vshape(p, 3 * p))
    assert max(schedule.metrics.peak_memory) == PEAKS[name](p)


def _extra_slots(name: str, p: int) -> int:
    """Idle chunk slots the greedy squeeze leaves above the paper's count: V-Half one at
    odd p from 9; V-Min 1 where p % 3 == 0 and 4 where p % 3 == 2."""
    if name == "v-half":
        return 1 if p % 2 and p >= 9 else 0
    return {0: 1, 1: 0, 2: 4}[p % 3]


@pytest.mark.parametrize("name,target", [("v-half", 1 / 2), ("v-min", 2 / 3)])
@pytest.mark.parametrize("p", [4, 5, 6, 8, 9, 11, 16, 17, 20])
def test_controllable_memory_bubbles_against_1f1b(name, target, p):
    """Bubble time relative to 1F1B's on the same work (each of the 2p chunks does half a
    stage's work). The paper counts 6p-1-3M idle chunk slots at a peak of M chunk
    activations; with the integer peaks above (M = 2*peak) that is within
    5/(6(p-1)) of 1/2 (V-Half) and 2/3 (V-Min) of 1F1B's 3(p-1), and exactly 1/2 and 2/3
    as p grows. The greedy squeeze may leave a few extra slots (`_extra_slots`)."""
    m = 3 * p
    one_f_one_b = run("1f1b", uniform_problem(p, m))
    _, idle_1f1b = longest_span(one_f_one_b)
    assert idle_1f1b == pytest.approx(3 * (p - 1), abs=EXACT)
    schedule = run(name, vshape(p, m, 0.5, 0.5, 0.5))
    _, idle = longest_span(schedule)
    ratio = idle / idle_1f1b
    slots = idle / 0.5
    paper = 6 * p - 1 - 3 * 2 * PEAKS[name](p)
    extra = _extra_slots(name, p)
    assert paper - EXACT <= slots <= paper + extra + EXACT
    # within 5/(6(p-1)) of the target, plus the extra slots (half a time unit each)
    assert abs(ratio - target) <= 5 / (6 * (p - 1)) + extra * 0.5 / idle_1f1b


@pytest.mark.slow
@pytest.mark.parametrize("name", ["v-half", "v-min"])
@pytest.mark.parametrize("p", [5, 8, 9, 11])
def test_v_auto_leaves_none_of_the_squeezes_extra_slots(name, p):
    """At V-Half's and V-Min's peaks `v-auto` meets the paper's 6p-1-3M idle slots where
    the fixed blocks' squeeze leaves 1 to 4 more (p = 5, 8, 9, 11)."""
    m = 3 * p
    limited = uniform_problem(p, m, 0.5, 0.5, 0.5, placement="vshape", mem_forward=0.5, memory_limit=PEAKS[name](p))
    _, idle = longest_span(run("v-auto", limited))
    assert idle / 0.5 <= 6 * p - 1 - 3 * 2 * PEAKS[name](p) + EXACT


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("extra", [0, 3])
def test_dualpipe_v_peak_and_bubble_at_equal_times(p, extra):
    """DeepSeek's README: activation PP+1 (PP = 2p stages) and bubble (PP/2-1)(F&B+B-3W),
    with B a full backward (B + W here) and F&B a forward and a backward overlapped. This
    model runs one op at a time, so the formula does not apply as such; at F = B = W = 1
    per chunk the longest device idles p-1 over its 6m of work, what the formula gives
    with a perfect overlap (F&B = B = 2: (p-1)(2+2-3)). Peak 2p+1 chunk activations."""
    m = 2 * p + extra
    schedule = run("dualpipe-v", vshape(p, m))
    assert schedule.makespan - 6 * m == pytest.approx((p - 1) * (2 + 2 - 3), abs=EXACT)
    assert max(schedule.metrics.peak_memory) == pytest.approx((2 * p + 1) * 0.5)


def test_dualpipe_v_refuses_too_few_microbatches():
    with pytest.raises(InputError, match="at least 2p = 8 microbatches"):
        generate(vshape(4, 7), "dualpipe-v")


# -- Interleaved 1F1B -------------------------------------------------------------------


@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize("p,groups", [(2, 1), (2, 4), (4, 1), (4, 3), (8, 2)])
def test_interleaved_bubble_of_ideal_time(p, groups, v):
    m = p * groups
    problem = uniform_problem(p, m, placement=f"interleaved:{v}", mem_forward=1 / v)
    schedule = run("interleaved-1f1b", problem)
    ideal = m * v * 3.0
    assert (schedule.makespan - ideal) / ideal == pytest.approx((p - 1) / (v * m), abs=EXACT)
    # p + (p-1)/V microbatches on device 0 once the steady state exists (m >= 2p).
    expected_peak = p + (p - 1) / v if m >= 2 * p else p
    assert max(schedule.metrics.peak_memory) == pytest.approx(expected_peak)


def test_interleaved_takes_microbatches_in_rounds_and_refuses_what_does_not_divide():
    """m not a multiple of p goes in m // p rounds (torch's rule); 9 microbatches do not
    split into 2 rounds at p = 4."""
    assert generate(uniform_problem(4, 6, placement="interleaved:2"), "interleaved-1f1b").makespan > 0
    for name in ("interleaved-1f1b", "interleaved-zb"):
        with pytest.raises(InputError, match="multiple of its 2 rounds"):
            generate(uniform_problem(4, 9, placement="interleaved:2"), name)


# Interleaved zero bubble: ZB-H1's bubble time in chunk units, (p-1)(F+B-W) for W <= F, B
# at comm 0, once m >= p (also when m is not a multiple of p); 1F1B's peak of p
# microbatches (V*p chunk activations of 1/V each) when the rounds are of p microbatches.
@pytest.mark.slow
@pytest.mark.parametrize("f,b,w", UNEQUAL)
@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("p,m", [(2, 2), (2, 6), (4, 4), (4, 6), (4, 12), (8, 16), (8, 20)])
def test_interleaved_zb_bubble_time_and_peak(p, m, v, f, b, w):
    problem = uniform_problem(p, m, f, b, w, placement=f"interleaved:{v}", mem_forward=1 / v)
    schedule = run("interleaved-zb", problem)
    assert schedule.makespan - m * v * (f + b + w) == pytest.approx((p - 1) * (f + b - w), abs=EXACT)
    if m % p == 0:
        assert max(schedule.metrics.peak_memory) == pytest.approx(p)
    # Never more memory, nor longer, than interleaved 1F1B's on the same problem.
    fused = run("interleaved-1f1b", problem)
    assert max(schedule.metrics.peak_memory) <= max(fused.metrics.peak_memory) + EXACT
    assert schedule.makespan <= fused.makespan + EXACT


@pytest.mark.parametrize(
    "name,placement",
    [("zb-v", "linear"), ("v-half", "interleaved:2"), ("zb-h1", "vshape"), ("interleaved-1f1b", "linear")],
)
def test_families_refuse_other_placements_with_a_reason(name, placement):
    reason = GENERATORS[name].unsupported(uniform_problem(4, 8, placement=placement))
    assert reason is not None and "\n" not in reason and "placement" in reason


# -- Every family is valid on heterogeneous times ---------------------------------------

PLACEMENT_OF = {
    "gpipe": "linear",
    "1f1b": "linear",
    "zb-h1": "linear",
    "zb-h2": "linear",
    "zb-auto": "linear",
    "interleaved-1f1b": "interleaved:2",
    "interleaved-zb": "interleaved:3",
    "interleaved-auto": "interleaved:2",
    "zb-v": "vshape",
    "v-half": "vshape",
    "v-min": "vshape",
    "v-auto": "vshape",
    "v-greedy": "vshape",
    "dualpipe-v": "vshape",
    "greedy": "interleaved:3",
    "paced": "vshape",
    "terapipe": "vshape",
    "seq1f1b": "linear",
    "seq1f1b-zb": "linear",
    "1f1b-vocab": "linear",
    "zb-h1-vocab": "linear",
    "v-half-vocab": "vshape",
}


def test_every_registered_family_is_covered():
    assert set(PLACEMENT_OF) == set(GENERATORS)


times = st.floats(min_value=0.1, max_value=3.0, allow_nan=False)


@st.composite
def heterogeneous(draw, placement: str, sliced: bool = False, vocab: bool = False) -> Problem:
    p = draw(st.sampled_from([2, 3, 4, 8]))
    m = p * draw(st.integers(1, 4)) if placement.startswith("interleaved") else draw(st.integers(1, 3 * p))
    devices = placement_devices(placement, p)
    stages = [
        {
            "device": d,
            "forward": draw(times),
            "backward_input": draw(times),
            "backward_weight": draw(times),
            "memory": {"forward": 1.0, "backward_input": -0.5, "backward_weight": -0.5},
        }
        for d in devices
    ]
    comm = draw(st.sampled_from([0.0, 0.05, 0.5]))
    data = {"num_devices": p, "num_microbatches": m, "stages": stages, "comm_time": comm}
    if sliced:  # the token-slice families: uneven shares, attention-like costs
        data["num_slices"] = k = draw(st.integers(2, 4))
        data["slices"] = random_slices(random.Random(draw(st.integers(0, 10**6))), k)
    if vocab:  # vocabulary passes with random times, memory and collectives
        data["vocab_parallel"] = {
            "barriers": draw(st.sampled_from([1, 2])),
            "forward": draw(times),
            "backward": draw(times),
            "memory": draw(st.sampled_from([0.0, 0.5])),
            "barrier_time": draw(st.sampled_from([0.0, 0.1])),
        }
    return Problem.model_validate(data)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PLACEMENT_OF))
def test_family_orders_are_valid_on_random_times(name):
    generator = GENERATORS[name]

    @settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(heterogeneous(PLACEMENT_OF[name], generator.slices, generator.vocab_only))
    def check(problem):
        assume(generator.reason(problem) is None)  # Unsatisfiable if it never applies
        schedule = simulate(problem, generator.build(problem), method=name)
        assert validate(problem, schedule.devices) == []
        assert math.isfinite(schedule.makespan)

    check()


# -- interleaved-auto: the interleaved walk fitted to any limit --------------------------


def _span(schedule) -> float:
    return max(ops[-1].end - ops[0].start for ops in schedule.devices if ops)


@pytest.mark.slow
@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 9), (4, 12), (8, 16), (8, 19)])
@pytest.mark.parametrize("limit_share", [None, 1.0, 0.75, 0.5])
def test_interleaved_auto_fits_where_the_walks_do_and_is_never_longer(p, m, v, limit_share):
    """Limits as a share of interleaved zero bubble's own peak: where interleaved zero
    bubble or interleaved 1F1B fits, interleaved-auto fits too and its longest span is no
    longer; it is always a valid order."""
    unlimited = hetero_problem(p, m, f"interleaved:{v}")
    reference = generate(unlimited, "interleaved-zb") if GENERATORS["interleaved-zb"].unsupported(unlimited) is None else None
    peak = max(reference.metrics.peak_memory) if reference is not None else float(p * v)
    limit = None if limit_share is None else max(peak * limit_share, float(v))
    problem = hetero_problem(p, m, f"interleaved:{v}", limit)
    ours = generate(problem, "interleaved-auto")
    assert [e for e in validate(problem, ours.devices) if "memory" not in e] == []
    for name in ("interleaved-zb", "interleaved-1f1b"):
        if GENERATORS[name].unsupported(problem) is not None:
            continue
        theirs = generate(problem, name)
        if theirs.fits_memory():
            assert ours.fits_memory()
            assert _span(ours) <= _span(theirs) + EXACT


def test_interleaved_auto_fits_below_the_walks_memory_and_beats_the_list_schedule():
    """Zero Bubble's 1.5B timings, p = 8, m = 24, interleaved:2, 6 activations: neither
    interleaved walk of the papers fits; rounds of 4 microbatches do, shorter than greedy."""
    problem = published_problem(setting_named("1.5B-p8-m24"), 6.0, "interleaved:2")
    assert not generate(problem, "interleaved-zb").fits_memory()
    assert not generate(problem, "interleaved-1f1b").fits_memory()
    ours = generate(problem, "interleaved-auto")
    assert ours.fits_memory()
    assert ours.makespan < generate(problem, "greedy").makespan


@pytest.mark.parametrize(
    "problem",
    [
        # A fused backward shorter than B then W.
        uniform_problem(4, 12, 1.0, 1.0, 0.6, placement="interleaved:2", mem_forward=0.5, backward=1.2),
        # B allocates, at m = p.
        uniform_problem(4, 4, 1.0, 1.0, 0.6, placement="interleaved:2", mem_forward=0.5, mem_backward_input=0.5, memory_limit=4.0),
    ],
    ids=["fused-shorter", "b-allocates-m-equals-p"],
)
def test_interleaved_auto_is_never_longer_than_the_walks_where_fusing_wins(problem):
    ours = generate(problem, "interleaved-auto")
    for name in ("interleaved-1f1b", "interleaved-zb"):
        theirs = generate(problem, name)
        if theirs.fits_memory():
            assert ours.fits_memory()
            assert _span(ours) <= _span(theirs) + EXACT

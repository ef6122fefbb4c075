"""The greedy list scheduler: never over the memory limit, never deadlocked, clear
infeasibility, and at least as good as ZB-H1 with ZB-H1's memory on uneven stages."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optimizer.errors import InfeasibleError
from optimizer.problem import Problem, placement_devices, uniform_problem
from optimizer.schedules import generate
from optimizer.schedules.greedy import GENERATOR, greedy, policy_grid
from optimizer.schedules.listengine import best_of
from optimizer.schedules.registry import Orders
from optimizer.validate import validate


def with_limit(problem: Problem, limit) -> Problem:
    return Problem.model_validate({**problem.model_dump(), "memory_limit": limit})


def greedy_schedule(problem: Problem):
    schedule = generate(problem, "greedy")  # a deadlock would raise DeadlockError here
    assert validate(problem, schedule.devices) == []  # includes the memory limit
    assert schedule.fits_memory()
    return schedule


# -- Memory safety and deadlock freedom on random problems ------------------------------

times = st.floats(min_value=0.1, max_value=3.0, allow_nan=False)


@st.composite
def memory_problems(draw, allocating_backward: bool = False) -> Problem:
    p = draw(st.integers(1, 6))
    m = draw(st.integers(1, 10))
    placement = draw(st.sampled_from(["linear", "vshape", "interleaved:2", "custom"]))
    if placement == "custom":
        extra = draw(st.lists(st.integers(0, p - 1), max_size=2 * p))
        devices = list(range(p)) + extra
        devices = draw(st.permutations(devices))
    else:
        devices = placement_devices(placement, p)
    stages = []
    for d in devices:
        a = draw(st.sampled_from([0.0, 0.5, 1.0, 2.5]))
        if allocating_backward:
            b = draw(st.sampled_from([-a, -a / 2, 0.0, a / 2]))
        else:
            b = draw(st.sampled_from([-a, -a / 2, 0.0]))
        stages.append(
            {
                "device": d,
                "forward": draw(times),
                "backward_input": draw(times),
                "backward_weight": draw(times),
                "memory": {"forward": a, "backward_input": b, "backward_weight": -(a + b)},
            }
        )
    comm = draw(st.sampled_from([0.0, 0.1, 1.0]))
    problem = Problem.model_validate({"num_devices": p, "num_microbatches": m, "stages": stages, "comm_time": comm})
    # From exactly the least workable limit up to generous; 1e-3 where a device holds
    # only zero-size activations (limits must be positive).
    factors = draw(st.lists(st.sampled_from([1.0, 1.0, 1.25, 2.0, 4.0]), min_size=p, max_size=p))
    # greedy splits every backward: its least limit is the split one (above the fused one where a B allocates).
    return with_limit(problem, [max(1e-3, need * f) for need, f in zip(problem.split_memory_limit(), factors)])


@pytest.mark.slow
@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(memory_problems())
def test_never_over_the_limit_never_deadlocked(problem):
    greedy_schedule(problem)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(memory_problems(allocating_backward=True))
def test_safe_when_backward_allocates(problem):
    # A B that allocates holds its memory until its W: the least limit is then above the
    # forward allocations, and the scheduler must still fit it exactly.
    greedy_schedule(problem)


def test_min_memory_limit_is_the_forward_allocations_when_backward_frees():
    problem = uniform_problem(4, 8, placement="vshape", mem_forward=0.5, mem_backward_input=-0.2)
    assert problem.min_memory_limit() == pytest.approx([1.0] * 4)  # two chunks of 0.5 per device


@pytest.mark.parametrize("placement", ["linear", "vshape", "interleaved:2"])
def test_runs_at_exactly_the_minimum_limit(placement):
    problem = uniform_problem(4, 12, 1.0, 1.3, 0.7, placement=placement, comm_time=0.1)
    tight = with_limit(problem, problem.min_memory_limit())
    schedule = greedy_schedule(tight)
    assert max(schedule.metrics.peak_memory) == pytest.approx(max(problem.min_memory_limit()))


# -- Infeasible limits ------------------------------------------------------------------


# The problem model already refuses a limit below one stage's forward, so the limits
# here sit between that and the peak of one microbatch: several stages per device, or
# a B that allocates (held until its W, so the peak is F + B).
# A B that allocates only raises the limit split backwards need: greedy then names both ways out.
@pytest.mark.parametrize(
    "placement,backward,device,smallest,says",
    [
        ("vshape", 0.0, 1, 1.0, "smallest limit that fits is 1"),
        ("interleaved:3", 0.0, 3, 1.5, "smallest limit that fits is 1.5"),
        ("linear", 0.25, 2, 0.75, "fused backwards fit: use --method auto, or a limit of at least 0.75"),
    ],
)
def test_limit_below_one_microbatch_is_infeasible(placement, backward, device, smallest, says):
    problem = uniform_problem(4, 8, placement=placement, mem_forward=0.5, mem_backward_input=backward)
    need = problem.split_memory_limit()
    assert need[device] == pytest.approx(smallest)
    limits = [x * 2 for x in need]
    limits[device] = need[device] * 0.99
    with pytest.raises(InfeasibleError) as raised:
        generate(with_limit(problem, limits), "greedy")
    message = str(raised.value)
    assert f"device {device}" in message
    assert says in message
    assert "\n" not in message


# -- Quality ----------------------------------------------------------------------------


def uneven(p: int, m: int, seed: int, comm: float) -> Problem:
    """First and last stages 30% heavier (embedding, LM head), the others jittered."""
    rng = random.Random(seed)
    stages = []
    for d in range(p):
        k = 1.3 if d in (0, p - 1) else 1.0
        stages.append(
            {
                "device": d,
                "forward": k * rng.uniform(0.8, 1.2),
                "backward_input": k * rng.uniform(0.8, 1.4),
                "backward_weight": k * rng.uniform(0.5, 1.2),
                "memory": {"forward": 1.0, "backward_input": 0.0, "backward_weight": -1.0},
            }
        )
    return Problem.model_validate({"num_devices": p, "num_microbatches": m, "stages": stages, "comm_time": comm})


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("comm", [0.0, 0.1])
@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (8, 16), (8, 32)])
def test_matches_or_beats_zb_h1_with_its_memory(p, m, comm, seed):
    problem = uneven(p, m, seed, comm)
    zb_h1 = generate(problem, "zb-h1")
    limited = with_limit(problem, zb_h1.metrics.peak_memory)
    greedy = greedy_schedule(limited)
    assert greedy.makespan <= zb_h1.makespan * (1 + 1e-9)  # float slack only


@pytest.mark.parametrize("seed", range(2))
def test_degrades_gracefully_as_memory_shrinks(seed):
    """From ample memory down to one microbatch per device: always valid, never slower
    with more memory (2% slack: a heuristic), and at the minimum no slower than running
    microbatches one at a time (the trivially safe schedule)."""
    p, m = 4, 16
    problem = uneven(p, m, seed, 0.05)
    makespans = []
    for limit in [1.0, 1.5, 2.0, 3.0, float(p), float(2 * p)]:
        makespans.append(greedy_schedule(with_limit(problem, limit)).makespan)
    for tighter, looser in zip(makespans, makespans[1:]):
        assert looser <= tighter * 1.02
    one_at_a_time = m * sum(s.forward + s.backward_input + s.backward_weight for s in problem.stages)
    one_at_a_time += m * 2 * (p - 1) * problem.comm_time
    assert makespans[0] <= one_at_a_time * (1 + 1e-9)
    assert makespans[-1] <= generate(problem, "1f1b").makespan


def test_vshape_with_half_of_1f1b_memory():
    """At V-Half's memory ((p+2)//2 microbatches) on the V placement, greedy's bubble is
    0.55 of 1F1B's at p=8 (V-Half's own construction: 0.45); asserted below 0.6."""
    p, m = 8, 32
    vshape = uniform_problem(p, m, 0.5, 0.5, 0.5, placement="vshape", mem_forward=0.5, memory_limit=(p + 2) // 2)
    linear = uniform_problem(p, m)
    assert greedy_schedule(vshape).metrics.bubble_ratio < 0.6 * generate(linear, "1f1b").metrics.bubble_ratio


@pytest.mark.slow
def test_large_problem_beats_1f1b():
    # p=32, m=256: about 25k ops (its speed is measured in benchmarks/simulate.py).
    problem = uneven(32, 256, 0, 0.05)
    schedule = greedy_schedule(with_limit(problem, 32.0))
    assert schedule.makespan <= generate(problem, "1f1b").makespan


# -- Within a deadline (the solver's time for known schedules) ----------------------------


def test_greedy_past_its_deadline_keeps_the_policies_it_ran():
    # The solver gives the families a share of its time limit; a greedy that had not
    # finished its grid then gave nothing (p = 8, m = 24 on interleaved:3 at 2 s: `auto`
    # returned 494.4 where greedy's first policy alone gives about 414).
    problem = uniform_problem(4, 8, 1.0, 1.0, 0.6, placement="interleaved:2", mem_forward=0.5, memory_limit=3.0)
    grid = policy_grid(problem)
    assert len(grid) > 1
    heard: list[Orders] = []
    past = greedy(problem, deadline=time.monotonic() - 1, keep=heard.append)
    assert past == best_of(problem, grid[:1])[0]  # the first policy only, not the grid's best
    assert heard == [past]
    whole = GENERATOR.build_within(problem, time.monotonic() + 60)
    assert whole == greedy(problem)


# -- Which settings lead ------------------------------------------------------------------


def test_below_1f1b_depth_the_throttled_settings_lead_the_grid():
    from optimizer.schedules.greedy import GRID, MULTI_STAGE_GRID, TIGHT_FIRST, below_one_f_one_b

    linear = uniform_problem(8, 24, 1.0, 1.0, 0.6, mem_forward=1.0)
    # 1F1B keeps p - s forwards in flight on stage s: 8 on the first device.
    assert not below_one_f_one_b(with_limit(linear, 8.0))
    assert below_one_f_one_b(with_limit(linear, 7.0))
    # Per device: only the first device short of its depth.
    assert below_one_f_one_b(with_limit(linear, [7.0] + [8.0] * 7))
    assert not below_one_f_one_b(with_limit(linear, [8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]))
    # Fewer microbatches than devices: 1F1B never holds more than m.
    assert not below_one_f_one_b(with_limit(uniform_problem(8, 3, 1.0, 1.0, 0.6, mem_forward=1.0), 3.0))
    assert policy_grid(with_limit(linear, 8.0)) == GRID
    tight = policy_grid(with_limit(linear, 4.0))
    assert tight[: len(TIGHT_FIRST)] == TIGHT_FIRST and sorted(map(str, tight)) == sorted(map(str, GRID))
    # Several stages per device keep their own order.
    v = with_limit(uniform_problem(4, 8, 1.0, 1.0, 0.6, placement="vshape", mem_forward=0.5), 2.0)
    assert not below_one_f_one_b(v) and policy_grid(v)[: len(MULTI_STAGE_GRID)] == MULTI_STAGE_GRID


# -- The advice an infeasible limit gets --------------------------------------------------


@given(st.floats(min_value=1e-9, max_value=1e12, allow_nan=False))
def test_an_advised_limit_is_never_below_the_need_it_stands_for(need):
    from optimizer.schedules.listengine import rounded_up

    text = rounded_up(need)
    assert float(text) >= need
    assert float(text) <= need * (1 + 1e-5)  # six significant digits: at most one step up
    assert len(text.replace(".", "").replace("-", "").split("e")[0].lstrip("0")) <= 6


def test_the_per_device_advice_can_be_pasted_into_the_problem():
    from optimizer.schedules.listengine import _smallest

    # Printed to 6 digits, 2.1455249 read 2.14552 (below the need), and a device that holds
    # nothing read 0, which no problem may hold as a limit.
    text = _smallest([2.0, 2.1455249, 0.5, 0.0, 2.5])
    assert text.startswith("2.5 (per device: ")
    advised = [float(v) for v in text.split("per device: ")[1].rstrip(")").split(", ")]
    assert advised == [2.0, 2.14553, 0.5, 0.5, 2.5]

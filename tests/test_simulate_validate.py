"""The simulator and the validator agree: on random orders, valid and invalid."""

from __future__ import annotations

import random

import factories
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer.errors import DeadlockError, InputError
from optimizer.ops import Op, TimedOp, completion_key, dependencies, op_duration
from optimizer.problem import Problem, uniform_problem
from optimizer.schedule import peak_memory
from optimizer.schedules import applicable, generate, generate_all
from optimizer.simulate import simulate, simulate_times
from optimizer.validate import validate


def random_problem(rng: random.Random, p: int, m: int, placement: str, comm: float, limit: float | None, slices: int = 1) -> Problem:
    """Forward allocations of several sizes, so memory checks see uneven stages; fused
    backwards up to 40% cheaper than B + W, so durations check BW's own time."""
    return factories.random_problem(
        rng, p, m, placement, comm=comm, limit=limit, forward_memory=(0.5, 1.0, 2.0), slices=slices, fused_saving=0.4
    )


def random_feasible_order(problem: Problem, rng: random.Random) -> list[list[Op]]:
    return factories.random_feasible_order(problem, rng, fused_share=0.3)


def random_shuffled_order(problem: Problem, rng: random.Random) -> list[list[Op]]:
    orders: list[list[Op]] = [[] for _ in range(problem.num_devices)]
    for op in factories.all_ops(problem, rng, fused_share=0.3):
        orders[problem.stages[op.stage].device].append(op)
    for ops in orders:
        rng.shuffle(ops)
    return orders


problems = st.builds(
    lambda seed, p, m, placement, comm, slices: (seed, p, m, placement, comm, slices),
    st.integers(0, 10**6),
    st.integers(1, 4),
    st.integers(1, 5),
    st.sampled_from(["linear", "vshape", "interleaved:2"]),
    st.sampled_from([0.0, 0.1, 1.5]),
    st.sampled_from([1, 1, 2, 3]),  # token slices: half the cases unsliced
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, derandomize=True)
@given(problems)
def test_simulated_feasible_orders_are_valid(case):
    seed, p, m, placement, comm, slices = case
    rng = random.Random(seed)
    problem = random_problem(rng, p, m, placement, comm, None, slices)
    schedule = simulate(problem, random_feasible_order(problem, rng))
    assert validate(problem, schedule.devices) == []


@settings(max_examples=60, deadline=None, derandomize=True)
@given(problems)
def test_deadlock_iff_no_valid_timing(case):
    """A shuffled order either simulates to a valid schedule or deadlocks; a deadlocked
    order has no valid timing, so back-to-back times in its order break a dependency."""
    seed, p, m, placement, comm, slices = case
    rng = random.Random(seed)
    problem = random_problem(rng, p, m, placement, comm, None, slices)
    orders = random_shuffled_order(problem, rng)
    try:
        schedule = simulate(problem, orders)
    except DeadlockError as error:
        assert error.blocked, "a deadlock names the blocked op of each stuck device"
        back_to_back = _back_to_back(problem, orders)
        assert any(v.startswith("dependency:") for v in validate(problem, back_to_back))
    else:
        assert validate(problem, schedule.devices) == []


def _back_to_back(problem: Problem, orders: list[list[Op]]) -> list[list[TimedOp]]:
    tables = problem.tables()
    timed = []
    for ops in orders:
        clock, device = 0.0, []
        for op in ops:
            length = op_duration(tables, op.kind, op.stage, op.slice)
            device.append(TimedOp(op.kind, op.stage, op.microbatch, clock, clock + length, op.slice))
            clock += length
        timed.append(device)
    return timed


@settings(max_examples=40, deadline=None, derandomize=True)
@given(problems)
def test_any_op_moved_earlier_is_caught(case):
    """ASAP times are tight: starting any op earlier breaks a dependency or overlaps."""
    seed, p, m, placement, comm, slices = case
    rng = random.Random(seed)
    problem = random_problem(rng, p, m, placement, comm, None, slices)
    devices = simulate_times(problem, random_feasible_order(problem, rng))
    movable = [(d, k) for d, ops in enumerate(devices) for k, op in enumerate(ops) if op.start > 1e-6]
    assert movable  # every device's backward starts after its forward
    d, k = rng.choice(movable)
    op = devices[d][k]
    shift = min(op.start, 0.05)
    devices[d][k] = op._replace(start=op.start - shift, end=op.end - shift)
    violations = validate(problem, devices)
    assert any(v.startswith(("dependency:", "overlap:")) for v in violations), violations


@pytest.mark.slow
@settings(max_examples=40, deadline=None, derandomize=True)
@given(problems, st.floats(0.3, 1.5))
def test_memory_violation_iff_peak_over_limit(case, fraction):
    seed, p, m, placement, comm, slices = case
    rng = random.Random(seed)
    unlimited = random_problem(random.Random(seed), p, m, placement, comm, None, slices)
    order = random_feasible_order(unlimited, rng)
    tables = unlimited.tables()
    peaks = [peak_memory(tables, ops) for ops in order]
    limit = max(max(peaks) * fraction, max(tables.mem_forward))
    # Any limit from one forward up, below a microbatch's need too: the validator must say so.
    limited = Problem.model_validate({**unlimited.model_dump(), "memory_limit": limit})
    violations = validate(limited, simulate_times(limited, order))
    over = any(peak > limit * (1 + 1e-9) for peak in peaks)
    assert any(v.startswith("memory:") for v in violations) == over


@pytest.mark.parametrize("limit", [0.25, 1.0, 3.0])
def test_validator_and_fits_memory_take_the_same_memory_slack(limit):
    # A peak just over the limit's relative slack: below 1 the validator once allowed 1e-9
    # absolute (four times the relative slack at 0.25), accepting peaks the models refuse.
    from optimizer.problem import MEMORY_SLACK
    from optimizer.schedule import Schedule

    for excess, fits in ((0.5, True), (2.0, False)):
        peak = limit * (1 + excess * MEMORY_SLACK)
        # two forwards held at once make the peak (one alone fits, so the problem is valid)
        problem = uniform_problem(1, 2, mem_forward=peak / 2, memory_limit=limit)
        order = [[Op("F", 0, 0), Op("F", 0, 1), Op("B", 0, 0), Op("W", 0, 0), Op("B", 0, 1), Op("W", 0, 1)]]
        violations = validate(problem, simulate_times(problem, order))
        assert (not any(v.startswith("memory:") for v in violations)) == fits, (limit, excess, violations)
        schedule = Schedule(problem, "test", simulate_times(problem, order))
        assert schedule.fits_memory() == fits


def test_a_forward_within_the_memory_slack_is_a_valid_problem():
    # The problem's own check refused a forward every schedule check accepts.
    from optimizer.problem import MEMORY_SLACK

    problem = uniform_problem(1, 1, mem_forward=2 * (1 + 0.5 * MEMORY_SLACK), memory_limit=2.0)
    schedule = generate(problem, "1f1b")
    assert schedule.fits_memory() and not validate(problem, schedule.devices)
    with pytest.raises(InputError, match="below one forward"):
        uniform_problem(1, 1, mem_forward=2 * (1 + 2 * MEMORY_SLACK), memory_limit=2.0)


def test_deadlock_names_each_blocked_device():
    problem = random_problem(random.Random(0), 2, 1, "linear", 0.0, None)
    # device 0 waits for its backward before doing its forward: a cycle across devices
    orders = [[Op("BW", 0, 0), Op("F", 0, 0)], [Op("F", 1, 0), Op("BW", 1, 0)]]
    with pytest.raises(DeadlockError) as caught:
        simulate(problem, orders)
    assert set(caught.value.blocked) == {0, 1}
    assert "device 0 waits at BW(stage 0, mb 0)" in str(caught.value)


def test_comm_time_delays_cross_device_dependencies():
    problem = random_problem(random.Random(1), 2, 1, "linear", 0.25, None)
    tables = problem.tables()
    orders = [[Op("F", 0, 0), Op("BW", 0, 0)], [Op("F", 1, 0), Op("BW", 1, 0)]]
    f1 = simulate_times(problem, orders)[1][0]
    assert f1.start == pytest.approx(tables.forward[0] + 0.25)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(problems)
def test_the_run_order_puts_every_op_after_its_dependencies_even_between_equal_times(case):
    # A backward of 1e-17 vanishes in the float sum of its start and duration, so the op it
    # feeds starts at the same time: start times alone cannot order them (sorted by start,
    # device and index, 132 of 200 such orders at p = 3, m = 3 put an op before a
    # dependency), the order in which they were timed can (the span's timing relies on it).
    seed, p, m, placement, comm, slices = case
    rng = random.Random(seed)
    data = random_problem(rng, p, m, placement, comm, None, slices).to_json()
    for stage in data["stages"]:
        if rng.random() < 0.5:
            stage["backward_input"] = stage["backward_weight"] = 1e-17
    problem = Problem.model_validate(data)
    run_order: list[tuple[int, int]] = []
    timed = simulate_times(problem, random_feasible_order(problem, rng), run_order=run_order)
    assert sorted(run_order) == [(d, k) for d, ops in enumerate(timed) for k in range(len(ops))]
    position = {place: i for i, place in enumerate(run_order)}
    produced = {completion_key(timed[d][k]): position[(d, k)] for d, k in run_order if completion_key(timed[d][k]) is not None}
    tables = problem.tables()
    for (d, k), i in position.items():
        assert k == 0 or position[(d, k - 1)] < i
        for dep in dependencies(timed[d][k], problem.num_stages, problem.num_slices, tables.vocab_rule()):
            assert produced[dep] < i


def _shifted(devices, offset, squeeze=lambda op: op):
    return [[squeeze(op._replace(start=op.start + offset, end=op.end + offset)) for op in ops] for ops in devices]


@pytest.mark.parametrize("offset", [1e6, 1e9, 1e12])
def test_a_timeline_far_from_zero_is_judged_at_its_ops_scale(offset):
    # The slack was 1e-9 of the times compared: at 1e9 an op squeezed to nothing (ends
    # where it starts) passed, as did an overlap of half an op (at 1e6 it caught both).
    problem = uniform_problem(3, 4, 1.0, 1.0, 0.6, comm_time=0.03)
    devices = simulate(problem, generate(problem, "zb-h1").order()).devices
    assert validate(problem, _shifted(devices, offset)) == []
    collapsed = _shifted(devices, offset, lambda op: op._replace(end=op.start))
    assert any(v.startswith("duration:") for v in validate(problem, collapsed))
    first = devices[0][1]  # the second op of device 0 moved onto the first's last half
    early = [[op._replace(start=op.start - 0.5, end=op.end - 0.5) if op is first else op for op in devices[0]], *devices[1:]]
    assert any(v.startswith(("overlap:", "dependency:")) for v in validate(problem, _shifted(early, offset)))


def test_ops_far_shorter_than_the_slack_still_count():
    problem = uniform_problem(2, 3, 1e-10, 1e-10, 1e-10)
    devices = simulate(problem, generate(problem, "1f1b").order()).devices
    assert validate(problem, devices) == []
    collapsed = [[op._replace(start=0.0, end=0.0) for op in ops] for ops in devices]
    assert any(v.startswith("duration:") for v in validate(problem, collapsed))


@pytest.mark.parametrize(
    ("placement", "activations"),
    [("linear", 4), ("linear", 6), ("vshape", 4), ("vshape", 6)],
)
def test_memory_units_do_not_change_any_family(placement, activations):
    # Memory in large units (GiB where the profile said bytes) makes every value small: a
    # slack of 1e-9 absolute is then 1e-3 of the limit, and a family that fitted a peak
    # 1e-4 over its limit built a schedule the validator refuses. Limits a hair below a
    # whole number of activations must give, at any unit, the families' orders at 1 unit.
    def family_orders(unit: float) -> dict[str, list]:
        problem = uniform_problem(4, 8, mem_forward=unit, memory_limit=activations * (1 - 1e-4) * unit, placement=placement)
        built, _ = generate_all(problem)
        for name, schedule in built.items():
            if name in memory_aware:
                assert not validate(problem, schedule.devices), (unit, name)
        return {name: s.order() for name, s in built.items() if name in memory_aware}

    memory_aware = {g.name for g in applicable(uniform_problem(4, 8, placement=placement)) if g.within_limit}
    reference = family_orders(1.0)
    assert reference  # some memory-aware family fits below this many activations
    for unit in (1e-3, 1e-6, 1e-9):
        assert family_orders(unit) == reference, unit


def test_a_device_list_out_of_time_order_is_an_order_violation_not_an_overlap():
    # Two ops swapped in a device's list, each at its own time: nothing overlaps, but the
    # list (the device's order, which every export and the executor follow) is wrong.
    problem = uniform_problem(2, 2)
    devices = [list(ops) for ops in generate(problem, "1f1b").devices]
    devices[0][0], devices[0][1] = devices[0][1], devices[0][0]
    violations = validate(problem, devices)
    assert any(v.startswith("order: ") and "list each device's ops in the order they run" in v for v in violations), violations
    assert not any(v.startswith("overlap: ") for v in violations), violations


def test_a_violation_by_a_hair_shows_numbers_that_differ():
    """`starts at 1.5, before ... available at 1.5` reads as no violation at all."""
    problem = uniform_problem(2, 2, 1.0, 1.0, 1.0, comm_time=0.5, mem_forward=1.0, mem_backward_input=-1.0, memory_limit=2 / (1 + 1e-8))
    devices = [list(ops) for ops in simulate_times(problem, generate(problem, "gpipe").order())]
    first = devices[1][0]
    assert (first.kind, first.start) == ("F", 1.5)
    devices[1][0] = first._replace(start=first.start - 1e-6, end=first.end - 1e-6)
    messages = validate(problem, devices)
    dependency = next(v for v in messages if v.startswith("dependency:"))
    assert "starts at 1.499999, before F(stage 0, mb 0) is available at 1.5" in dependency, dependency
    memory = next(v for v in messages if v.startswith("memory:"))
    assert "holds 2 > limit 1.99999998" in memory, memory

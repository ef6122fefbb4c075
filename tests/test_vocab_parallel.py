"""Vocabulary parallelism in the op model: the passes S and T, their collectives, and
every part of the optimizer that must obey them (simulator, validator, schedule file,
families, bounds, exact models, auto).

Claims are checked against means that share no code with them: hand-computed times,
random valid orders (a random walk over the dependency rule), brute force over all
orders of tiny problems.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from exact_brute_force import brute_force_optimum
from factories import other_schedules, random_feasible_order, random_problem, with_vocab
from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer.errors import InfeasibleError, InputError
from optimizer.exact import SolveOptions, solve
from optimizer.exact.canonical import canonical
from optimizer.exact.slicebounds import lower_bound
from optimizer.formats.schedule_json import schedule_from_json, schedule_to_json
from optimizer.ops import Op, VocabRule, dependencies
from optimizer.problem import problem_from_json, uniform_problem
from optimizer.schedules import GENERATORS, applicable, generate
from optimizer.simulate import simulate
from optimizer.validate import validate

pytestmark = pytest.mark.solver

# Float sums of a few hundred durations: 1e-9 relative is far above their rounding.
TOLERANCE = 1e-9


def test_dependency_rule_ties_the_passes_with_one_or_two_barriers():
    two, one = VocabRule(3, 2), VocabRule(3, 1)
    # 4 stages, last = 3.
    assert dependencies(Op("S", 1, 5), 4, 1, two) == (Op("F", 3, 5),)
    assert dependencies(Op("T", 0, 5), 4, 1, two) == tuple(Op("S", d, 5) for d in range(3))
    assert dependencies(Op("B", 3, 5), 4, 1, two) == (Op("F", 3, 5), *(Op("T", d, 5) for d in range(3)))
    assert dependencies(Op("BW", 3, 5), 4, 1, one) == (Op("F", 3, 5), *(Op("S", d, 5) for d in range(3)))
    # Other stages are untouched.
    assert dependencies(Op("B", 2, 5), 4, 1, two) == (Op("B", 3, 5),)
    assert dependencies(Op("F", 2, 5), 4, 1, two) == (Op("F", 1, 5),)
    assert dependencies(Op("W", 3, 5), 4, 1, one) == (Op("B", 3, 5),)


def hand_problem(barriers: int):
    return with_vocab(uniform_problem(2, 1, 1.0, 2.0, 0.5, comm_time=0.1), barriers=barriers, forward=0.3, backward=0.4, barrier_time=0.05)


@pytest.mark.parametrize("barriers", [1, 2])
def test_simulator_times_a_hand_order_as_computed_by_hand(barriers):
    problem = hand_problem(barriers)
    orders = [
        [Op("F", 0, 0), Op("S", 0, 0), Op("T", 0, 0), Op("B", 0, 0), Op("W", 0, 0)],
        [Op("F", 1, 0), Op("S", 1, 0), Op("T", 1, 0), Op("B", 1, 0), Op("W", 1, 0)],
    ]
    times = {t.op: (t.start, t.end) for device in simulate(problem, orders).devices for t in device}
    # F0 [0, 1], F1 [1.1, 2.1]; S on device 1 at 2.1, on device 0 after the transfer at 2.2.
    assert times[Op("S", 1, 0)] == pytest.approx((2.1, 2.4))
    assert times[Op("S", 0, 0)] == pytest.approx((2.2, 2.5))
    # T after every S plus the collective: 2.5 + 0.05.
    assert times[Op("T", 0, 0)] == pytest.approx((2.55, 2.95))
    assert times[Op("T", 1, 0)] == pytest.approx((2.55, 2.95))
    # The last stage's B after every T plus the collective (2 barriers), or after every S
    # plus the collective (1 barrier) but behind its own T in this order.
    b_start = 2.95 + 0.05 if barriers == 2 else 2.95
    assert times[Op("B", 1, 0)] == pytest.approx((b_start, b_start + 2.0))
    assert times[Op("B", 0, 0)][0] == pytest.approx(b_start + 2.0 + 0.1)


def test_one_barrier_lets_the_backward_start_before_the_t_pass():
    problem = hand_problem(1)
    orders = [
        [Op("F", 0, 0), Op("S", 0, 0), Op("T", 0, 0), Op("B", 0, 0), Op("W", 0, 0)],
        [Op("F", 1, 0), Op("S", 1, 0), Op("B", 1, 0), Op("T", 1, 0), Op("W", 1, 0)],
    ]
    times = {t.op: t.start for device in simulate(problem, orders).devices for t in device}
    assert times[Op("B", 1, 0)] == pytest.approx(2.5 + 0.05)


def test_validator_names_each_broken_rule_of_the_passes():
    problem = hand_problem(2)
    good = simulate(
        problem,
        [
            [Op("F", 0, 0), Op("S", 0, 0), Op("T", 0, 0), Op("B", 0, 0), Op("W", 0, 0)],
            [Op("F", 1, 0), Op("S", 1, 0), Op("T", 1, 0), Op("B", 1, 0), Op("W", 1, 0)],
        ],
    )
    assert validate(problem, good.devices) == []
    missing = [[t for t in good.devices[0] if t.kind != "T"], good.devices[1]]
    assert any("missing: T(shard 0" in v for v in validate(problem, missing))
    early = [list(good.devices[0]), [t._replace(start=t.start - 0.04, end=t.end - 0.04) if t.kind == "B" else t for t in good.devices[1]]]
    assert any(v.startswith("dependency: B(stage 1, mb 0)") and "T(shard" in v for v in validate(problem, early))
    moved = [good.devices[0] + [good.devices[1][2]], [t for t in good.devices[1] if t.kind != "T"]]
    assert any(v.startswith("placement: T(shard 1, mb 0) runs on device 0") for v in validate(problem, moved))
    plain = problem.without_vocab()
    assert any("has no vocab_parallel" in v for v in validate(plain, good.devices))


def test_problem_refuses_bad_vocabulary_fields():
    base = uniform_problem(2, 2).to_json()
    for bad, field in (
        ({"barriers": 3, "forward": 1, "backward": 1}, "barriers"),
        ({"forward": float("nan"), "backward": 1}, "forward"),
        ({"forward": 1, "backward": 0}, "backward"),
        ({"forward": 1, "backward": 1, "memory": -1}, "memory"),
        ({"forward": 1, "backward": 1, "barrier_time": float("inf")}, "barrier_time"),
    ):
        with pytest.raises(InputError, match=f"vocab_parallel.{field}"):
            problem_from_json({**base, "vocab_parallel": bad})
    with pytest.raises(InputError, match="token slices"):
        problem_from_json({**base, "num_slices": 2, "vocab_parallel": {"forward": 1, "backward": 1}})
    with pytest.raises(InputError, match="below one vocabulary pass"):
        problem_from_json({**base, "memory_limit": 2.0, "vocab_parallel": {"forward": 1, "backward": 1, "memory": 3.0}})
    # Written only when set: a problem without the passes reads as before they existed.
    assert "vocab_parallel" not in uniform_problem(2, 2).to_json()
    assert with_vocab(uniform_problem(2, 2)).to_json()["vocab_parallel"]["barriers"] == 2


def test_size_counts_the_passes():
    data = uniform_problem(256, 60).to_json()  # 3 x 256 x 60 = 46080 ops: within the limit
    problem_from_json(data)
    with pytest.raises(InputError, match="2 x 256 devices x 60 microbatches"):
        problem_from_json({**data, "vocab_parallel": {"forward": 1, "backward": 1}})


PLACEMENTS = ("linear", "vshape", "interleaved:2")


@pytest.mark.slow
@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.integers(0, 10**6), st.integers(2, 4), st.integers(1, 6), st.sampled_from(PLACEMENTS), st.sampled_from([1, 2]))
def test_every_family_places_the_passes_validly(seed, p, m, placement, barriers):
    rng = random.Random(seed)
    base = random_problem(rng, p, m if not placement.startswith("interleaved") else p * (1 + m % 2), placement)
    problem = with_vocab(base, barriers, rng.uniform(0.1, 2), rng.uniform(0.1, 2), rng.choice([0.0, 0.5]), rng.choice([0.0, 0.2]))
    families = applicable(problem)
    assert families, "some family applies to every placement"
    for generator in families:
        schedule = simulate(problem, generator.build(problem))
        assert validate(problem, schedule.devices) == [], generator.name
        kinds = {t.kind for device in schedule.devices for t in device}
        assert {"S", "T"} <= kinds


def test_vocabulary_variants_are_the_paper_families_with_passes():
    problem = with_vocab(uniform_problem(4, 8))
    for name in ("1f1b", "zb-h1"):
        assert generate(problem, f"{name}-vocab").order() == generate(problem, name).order()
    vshape = with_vocab(uniform_problem(4, 8, placement="vshape"))
    assert generate(vshape, "v-half-vocab").order() == generate(vshape, "v-half").order()
    with pytest.raises(InputError, match="needs vocabulary parallelism"):
        generate(uniform_problem(4, 8), "1f1b-vocab")
    assert not any(g.alias for g in applicable(problem)), "an alias is not built twice"
    assert {"1f1b-vocab", "zb-h1-vocab", "v-half-vocab"} <= set(GENERATORS)


@pytest.mark.parametrize("barriers", [1, 2])
def test_schedule_file_round_trips_as_version_3(barriers):
    problem = with_vocab(uniform_problem(3, 4), barriers)
    schedule = generate(problem, "zb-h1")
    data = schedule_to_json(schedule)
    assert data["version"] == 3 and data["problem"]["vocab_parallel"]["barriers"] == barriers
    back = schedule_from_json(json.loads(json.dumps(data)))
    assert back.order() == schedule.order() and back.makespan == schedule.makespan
    with pytest.raises(InputError, match="need schedule format version 3"):
        schedule_from_json({**data, "version": 2})
    assert schedule_to_json(generate(uniform_problem(3, 4), "zb-h1"))["version"] == 1


def test_canonical_relabelling_keeps_each_shard_in_microbatch_order_and_the_makespan():
    rng = random.Random(3)
    problem = with_vocab(uniform_problem(3, 4, comm_time=0.1))
    for _ in range(20):
        orders = random_feasible_order(problem, rng)
        before = simulate(problem, orders)
        relabelled = canonical(orders, problem)
        after = simulate(problem, relabelled)
        assert validate(problem, after.devices) == []
        assert after.makespan <= before.makespan * (1 + TOLERANCE)
        for d, ops in enumerate(relabelled):
            for kind in ("S", "T"):
                assert [op.microbatch for op in ops if op.kind == kind] == list(range(4)), (d, kind)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    st.integers(0, 10**6),
    st.integers(1, 4),
    st.integers(1, 5),
    st.sampled_from(("linear", "vshape")),
    st.sampled_from([None, 3.0]),
    st.sampled_from([1, 2]),
)
def test_bound_is_never_above_any_valid_schedule(seed, p, m, placement, limit, barriers):
    rng = random.Random(seed)
    problem = with_vocab(
        random_problem(rng, p, m, placement, limit=limit), barriers, rng.uniform(0.1, 3), rng.uniform(0.1, 3), 0.5, rng.choice([0.0, 0.3])
    )
    schedules = other_schedules(problem, rng)
    assert schedules, "families and random orders give some valid schedule"
    for objective in ("makespan", "span"):
        bound = lower_bound(problem, objective).value
        best = min(_objective(s, objective) for s in schedules)
        assert bound <= best * (1 + TOLERANCE), (objective, bound, best)


def _objective(schedule, objective: str) -> float:
    if objective == "makespan":
        return schedule.makespan
    return max(ops[-1].end - ops[0].start for ops in schedule.devices if ops)


def test_bound_sees_the_passes():
    # Passes much longer than the stages: the bound without them would be far too low.
    problem = with_vocab(uniform_problem(2, 4), forward=3.0, backward=3.0)
    assert lower_bound(problem).value >= 4 * 6.0
    assert lower_bound(problem).value > lower_bound(problem.without_vocab()).value


TINY = [
    (with_vocab(uniform_problem(2, 1, 1.0, 2.0, 0.5, comm_time=0.1), 1, 0.3, 0.4, 0.5, 0.05), "makespan"),
    (with_vocab(uniform_problem(2, 1, 1.0, 2.0, 0.5, comm_time=0.1), 2, 0.7, 0.2, 0.5, 0.1), "span"),
    (with_vocab(uniform_problem(3, 1, 1.0, 1.0, 1.0), 2, 0.5, 0.5, 0.0, 0.0), "makespan"),
    (with_vocab(uniform_problem(1, 2, 1.0, 1.0, 1.0, memory_limit=1.5), 1, 0.5, 0.5, 0.5, 0.0), "makespan"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(TINY)))
def test_solver_optimum_equals_brute_force_and_bounds_hold(case):
    problem, objective = TINY[case]
    optimum = brute_force_optimum(problem, objective)
    assert math.isfinite(optimum)
    assert lower_bound(problem, objective).value <= optimum * (1 + TOLERANCE)
    for method in ("auto", "cpsat"):
        schedule = solve(problem, method, SolveOptions(time_limit=10.0, threads=1, objective=objective))
        assert validate(problem, schedule.devices) == []
        value = _objective(schedule, objective)
        assert value >= optimum * (1 - TOLERANCE), "no schedule beats the brute-force optimum"
        if schedule.metrics.status == "optimal":
            assert value <= optimum * (1 + TOLERANCE), f"{method} claims optimal at {value}, optimum {optimum}"
        assert schedule.metrics.lower_bound <= optimum * (1 + TOLERANCE)


@pytest.mark.slow
def test_two_microbatches_brute_force_agrees_with_cpsat():
    problem = with_vocab(uniform_problem(2, 2, 1.0, 1.0, 1.0, comm_time=0.1), 2, 0.3, 0.4, 0.5, 0.05)
    optimum = brute_force_optimum(problem)
    schedule = solve(problem, "cpsat", SolveOptions(time_limit=20.0, threads=1))
    assert schedule.metrics.status == "optimal"
    assert schedule.makespan == pytest.approx(optimum, rel=TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["linear", "vshape"])
@pytest.mark.parametrize("limit", [None, 6.0])
def test_auto_is_never_worse_than_any_family_and_fits(placement, limit):
    problem = with_vocab(uniform_problem(4, 8, placement=placement, memory_limit=limit, comm_time=0.05), 2, 0.5, 0.6, 0.5, 0.1)
    schedule = solve(problem, "auto", SolveOptions(time_limit=4.0, threads=1))
    assert validate(problem, schedule.devices) == [] and schedule.fits_memory()
    for generator in applicable(problem):
        family = simulate(problem, generator.build(problem))
        if family.fits_memory():
            assert schedule.makespan <= family.makespan * (1 + TOLERANCE), generator.name
    assert schedule.metrics.lower_bound <= schedule.makespan


def test_least_memory_limit_counts_one_pass_and_is_reachable():
    problem = with_vocab(uniform_problem(2, 3, placement="vshape"), memory=0.5)
    assert problem.min_memory_limit() == [2.5, 2.5]  # a microbatch's two forwards and one pass per device
    tight = problem_from_json({**problem.to_json(), "memory_limit": 2.5})
    schedule = solve(tight, "auto", SolveOptions(time_limit=3.0, threads=1))
    assert validate(tight, schedule.devices) == [] and schedule.fits_memory()


@pytest.mark.parametrize("suffix", [".svg", ".html", ".trace.json"])
def test_pictures_and_traces_show_the_passes(tmp_path, suffix):
    from optimizer.formats.choose import choose_format

    schedule = generate(with_vocab(uniform_problem(2, 3, placement="vshape")), "v-half")
    text = choose_format(f"s{suffix}").write(schedule)
    assert "shard" in text and text.count("shard") >= 2 * 2 * 3  # every pass named by its shard


@pytest.mark.parametrize("family", ["v-auto", "greedy"])
def test_a_memory_aware_family_names_the_whole_problems_smallest_limit(family):
    # The families build on the problem without the passes, its limit lowered by their
    # memory (0.5 here): the error must still speak of the limit the user gave (2) and of
    # what fits with the passes (one activation of each of the device's 2 stages + 0.5).
    problem = uniform_problem(2, 3, placement="vshape", mem_forward=1.0, mem_backward_input=-0.5, memory_limit=2.0)
    problem = problem_from_json({**problem.model_dump(mode="json"), "vocab_parallel": {"forward": 0.5, "backward": 0.5, "memory": 0.5}})
    assert problem.min_memory_limit() == [2.5, 2.5]
    with pytest.raises(InfeasibleError, match=r"needs 2\.5 > limit 2\b.*smallest limit that fits is 2\.5"):
        generate(problem, family)


def test_greedy_names_the_smallest_limit_where_the_passes_leave_the_base_no_memory():
    # Lowered by the passes' memory (5) the limit (5) leaves the base problem no valid limit,
    # so greedy built for the limit itself and the passes were then placed ignoring it:
    # greedy, which never exceeds the limit, returned a schedule with peak 9.
    problem = uniform_problem(2, 4, memory_limit=5.0)
    problem = problem_from_json({**problem.model_dump(mode="json"), "vocab_parallel": {"forward": 1.0, "backward": 1.0, "memory": 5.0}})
    assert problem.min_memory_limit() == [6.0, 6.0]
    with pytest.raises(InfeasibleError, match=r"needs 6 > limit 5\b.*smallest limit that fits is 6"):
        generate(problem, "greedy")
    roomier = problem_from_json({**problem.model_dump(mode="json"), "memory_limit": 6.0})
    assert generate(roomier, "greedy").fits_memory()


def test_compare_torch_refuses_vocabulary_passes_in_one_line(tmp_path):
    # It printed every torch schedule as a row of "-" and the same reason seven times, where
    # token slices (which torch's schedules lack too) are refused: now both are refused.
    from typer.testing import CliRunner

    from optimizer.cli import app

    path = tmp_path / "vocab.json"
    path.write_text(json.dumps(with_vocab(uniform_problem(2, 3)).to_json()))
    result = CliRunner().invoke(app, ["compare", str(path), "--torch"])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.stderr
    assert "--torch: torch.distributed.pipelining's schedules have no vocabulary passes" in lines[0]
    assert result.stdout == ""

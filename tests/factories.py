"""Shared test data: random problems, random valid orders and their hypothesis strategies.

Every test module that needs a random problem takes it from here, so that a property
checked in one place (simulator, validator, bounds, solvers) is checked on the same
kind of input everywhere.
"""

from __future__ import annotations

import functools
import random

from hypothesis import strategies as st

from benchmarks.published import published_problem, setting_named
from optimizer.exact.incumbents import generator_candidates
from optimizer.exact.spantiming import span_times
from optimizer.io import validate_model
from optimizer.ops import Op, completion_key, dependencies, op_device, op_memory
from optimizer.problem import Problem, placement_devices, uniform_problem
from optimizer.schedule import Schedule
from optimizer.schedules.v_auto import v_auto
from optimizer.simulate import simulate
from optimizer.validate import validate

PLACEMENTS = ("linear", "vshape", "interleaved:2")


def published_v_auto(name: str, limit: float, *, bends: bool = True, denser: bool = True, reorder: bool = True) -> Schedule:
    """v-auto's schedule (with its switches, as `v_auto` takes them) of a Zero Bubble
    setting on the V placement at `limit` stage activations, checked valid and within the
    limit. Kept for the session: several tests measure the same p = 16 case (seconds each)."""
    return _published_v_auto(name, limit, bends, denser, reorder)


@functools.cache
def _published_v_auto(name: str, limit: float, bends: bool, denser: bool, reorder: bool) -> Schedule:
    problem = published_problem(setting_named(name), limit, "vshape")
    schedule = simulate(problem, v_auto(problem, bends=bends, denser=denser, reorder=reorder))
    assert validate(problem, schedule.devices) == []  # includes the memory limit
    return schedule


def random_problem(
    rng: random.Random,
    p: int,
    m: int,
    placement: str = "linear",
    *,
    comm: float | None = None,
    limit: float | None = None,
    decimals: int | None = None,
    forward_memory: tuple[float, ...] = (1.0,),
    slices: int = 1,
    fused_saving: float | None = None,
) -> Problem:
    """A problem with random stage times and memory deltas that sum to zero.

    comm: the transfer time (random in [0, 0.3] when None). limit: the memory limit, raised
    to what one microbatch needs so the problem is feasible (None: unlimited). decimals:
    round times to this many decimals (an exact time grid for the integer models).
    forward_memory: the forward allocations to draw from. slices: the number of token
    slices, with random shares and costs (both summing to 1). fused_saving: when given,
    each stage's fused backward takes (B + W) x (1 - a random fraction up to it).
    """

    def time(low: float, high: float) -> float:
        value = rng.uniform(low, high)
        return value if decimals is None else max(10.0**-decimals, round(value, decimals))

    stages, forwards = [], []
    for device in placement_devices(placement, p):
        allocated = rng.choice(forward_memory)
        forwards.append(allocated)
        kept = round(rng.uniform(0.2, 0.6) * allocated, 6)
        f, b, w = time(0.3, 2.0), time(0.3, 2.0), time(0.1, 1.5)  # drawn in this order since the first seeds
        stage = {
            "device": device,
            "forward": f,
            "backward_input": b,
            "backward_weight": w,
            "memory": {"forward": allocated, "backward_input": -(allocated - kept), "backward_weight": -kept},
        }
        if fused_saving is not None:
            stage["backward"] = (b + w) * (1 - rng.uniform(0, fused_saving))
        stages.append(stage)
    data = {
        "num_devices": p,
        "num_microbatches": m,
        "stages": stages,
        "comm_time": time(0.0, 0.3) if comm is None else comm,
        "memory_limit": None,
    }
    if slices > 1:
        data["num_slices"] = slices
        data["slices"] = random_slices(rng, slices)
    if limit is not None:
        need = max(Problem.model_validate(data).min_memory_limit())
        # A slice's share of a stage's forward rounds: the sliced peak may come out a few ulps
        # below one whole forward, which every limit must hold.
        data["memory_limit"] = max(limit, need, max(forwards))
    return Problem.model_validate(data)


def random_slices(rng: random.Random, k: int) -> list[dict[str, float]]:
    """k slices with random shares, and costs growing with the prefix as attention's do."""
    weights = [rng.uniform(0.5, 1.5) for _ in range(k)]
    shares = [w / sum(weights) for w in weights]
    prefix = [sum(shares[: j + 1]) for j in range(k)]
    raw = [share * (1 + end) for share, end in zip(shares, prefix)]
    return [{"share": share, "cost": c / sum(raw)} for share, c in zip(shares, raw)]


def with_slices(problem: Problem, k: int, slices: list[dict] | None = None, **stage_fields: float) -> Problem:
    """The problem with k token slices (None: even) and `stage_fields` set on every stage."""
    data = problem.model_dump(mode="json")
    data["num_slices"] = k
    data["slices"] = slices
    for stage in data["stages"]:
        stage.update(stage_fields)
    return validate_model(Problem, data, "problem")


def all_ops(problem: Problem, rng: random.Random | None = None, fused_share: float = 0.0) -> list[Op]:
    """Every op of the problem; with `rng`, each backward is fused with probability `fused_share`."""
    ops = []
    for s in range(problem.num_stages):
        for i in range(problem.num_microbatches):
            for k in range(problem.num_slices):
                ops.append(Op("F", s, i, k))
                fused = rng is not None and rng.random() < fused_share
                ops += [Op("BW", s, i, k)] if fused else [Op("B", s, i, k), Op("W", s, i, k)]
    if problem.vocab_parallel is not None:
        ops += [Op(kind, d, i) for d in range(problem.num_devices) for i in range(problem.num_microbatches) for kind in ("S", "T")]
    return ops


def with_vocab(
    problem: Problem, barriers: int = 2, forward: float = 0.3, backward: float = 0.4, memory: float = 0.5, barrier_time: float = 0.05
) -> Problem:
    """The problem with vocabulary passes."""
    data = problem.to_json()
    data["vocab_parallel"] = {
        "barriers": barriers,
        "forward": forward,
        "backward": backward,
        "memory": memory,
        "barrier_time": barrier_time,
    }
    return validate_model(Problem, data, "problem")


def random_feasible_order(problem: Problem, rng: random.Random, *, fused_share: float = 0.0) -> list[list[Op]]:
    """A random topological order of all ops, split per device: it never deadlocks."""
    orders = _random_walk(problem, rng, fused_share, respect_memory=False)
    assert orders is not None  # without memory, some op is always ready
    return orders


def random_order_within_memory(problem: Problem, rng: random.Random) -> list[list[Op]] | None:
    """Like random_feasible_order, taking an op only while its device stays within the limit.

    The walk can get stuck (every ready op overflows); None then.
    """
    return _random_walk(problem, rng, 0.0, respect_memory=True)


def _random_walk(problem: Problem, rng: random.Random, fused_share: float, respect_memory: bool) -> list[list[Op]] | None:
    tables = problem.tables()
    pending = all_ops(problem, rng, fused_share)
    done: set[Op] = set()
    usage = [0.0] * problem.num_devices
    orders: list[list[Op]] = [[] for _ in range(problem.num_devices)]
    vocab = problem.vocab_rule()
    while pending:
        ready = [op for op in pending if all(key in done for key in dependencies(op, problem.num_stages, problem.num_slices, vocab))]
        if respect_memory:
            ready = [op for op in ready if _fits(tables, usage, op)]
        if not ready:
            return None
        op = rng.choice(ready)
        pending.remove(op)
        key = completion_key(op)
        if key is not None:
            done.add(key)
        device = op_device(tables.device, op)
        usage[device] += op_memory(tables, op.kind, op.stage, op.slice)
        orders[device].append(op)
    return orders


def _fits(tables, usage: list[float], op: Op) -> bool:
    device = op_device(tables.device, op)
    delta = op_memory(tables, op.kind, op.stage, op.slice)
    return usage[device] + delta <= tables.limit[device] * (1 + 1e-9) or delta <= 0


def problem_cases(max_devices: int = 4, max_microbatches: int = 5, placements=PLACEMENTS, limits=(None, 1.0, 2.0, 4.0)):
    """A hypothesis strategy of (seed, p, m, placement, limit) for `random_problem`."""
    return st.tuples(
        st.integers(0, 10**6),
        st.integers(1, max_devices),
        st.integers(1, max_microbatches),
        st.sampled_from(placements),
        st.sampled_from(limits),
    )


def hetero_problem(p: int, m: int, placement: str = "linear", limit: float | None = None) -> Problem:
    """First stage x1.3, last x1.8, as profiled models look."""
    data = uniform_problem(p, m, placement=placement, memory_limit=limit).model_dump(mode="json")
    for s, stage in enumerate(data["stages"]):
        scale = 1.3 if s == 0 else 1.8 if s == len(data["stages"]) - 1 else 1.0
        for key in ("forward", "backward_input", "backward_weight"):
            stage[key] *= scale
    return validate_model(Problem, data, "problem")


def unusual_placements(p: int) -> dict[str, list[int]]:
    """Placements neither looped nor V: two neighbouring stages per device, and the
    first stage on the last device."""
    return {"blocked": [d for d in range(p) for _ in range(2)], "reversed": [p - 1 - s for s in range(p)]}


def placed_problem(p: int, m: int, devices: list[int]) -> Problem:
    data = uniform_problem(p, m).model_dump(mode="json")
    data["stages"] = [{**data["stages"][0], "device": d} for d in devices]
    return validate_model(Problem, data, "problem")


def other_schedules(problem: Problem, rng: random.Random, count: int = 6) -> list[Schedule]:
    """Valid schedules found without the solver: families and random orders, both timings."""
    schedules = [c.schedule for c in generator_candidates(problem)[0] if c.fits]
    for _ in range(count):
        orders = random_order_within_memory(problem, rng)
        if orders is not None:
            schedules.append(simulate(problem, orders))
    schedules += [Schedule(problem, "retimed", span_times(problem, s.order())) for s in list(schedules)]
    fitting = [s for s in schedules if s.fits_memory()]
    for schedule in fitting:
        assert validate(problem, schedule.devices) == []
    return fitting

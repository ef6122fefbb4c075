"""The `paced` family: every microbatch runs a lone microbatch's timing, shifted by a period.

A lone microbatch (every device free for it) starts each op at the end of the chain of
dependencies and transfers before it: those start times are the op classes' offsets. With
a period P, op (kind, stage) of microbatch i is keyed offset + i·P and every device runs its
ops in key order (ties by dependency depth, then kind). One key for all devices is a topological order
of the whole problem, so the orders never deadlock.

The period sets the memory: the longer it is, the fewer microbatches are in flight at once,
and from one lone microbatch's whole chain on they run one after another (each device's
peak is then one microbatch's). The least period whose orders fit the limit is found by
bisection on the orders alone (memory on a device depends on its order only); the periods
from it up to a quarter of the busiest device's work per microbatch longer are timed, the
shortest result wins. Fitting grew with the period in every case tried, but the bisection
does not rely on it: whatever period it ends at, the orders it times fit.

Where it helps: the V placement under tight memory, below V-Min's level, where each
device's long-lived first chunk and short-lived second chunk pace well and the list
scheduler's choices fill the memory unevenly. On Zero Bubble's settings on the V placement
(benchmarks/below_vmin.py) it is 7.6-21.3% shorter than `greedy` and `v-auto` below V-Min's
level; at V-Min's level and above `v-auto` is shorter. On one stage per device the list
scheduler was as good or better in every case tried, so the family leaves that placement to
it; on the interleaved placement it rarely wins but costs little.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator

import numpy as np

from optimizer.errors import InfeasibleError
from optimizer.ops import Op, dependencies, dependency_depths, op_duration, transfer_delay
from optimizer.problem import Problem
from optimizer.schedule import orders_fit
from optimizer.schedules.listengine import check_split_memory
from optimizer.schedules.registry import Generator, Keep, Orders
from optimizer.simulate import simulate_times

_KINDS = ("F", "B", "W")
# Periods timed above the least that fits, in steps of a hundredth of the busiest device's
# work per microbatch: the best of the cases tried lay 0 to 0.22 of it above the least.
SCAN_STEPS = 25
SCAN_STEP = 0.01
# Large problems time fewer of those periods (coarse ones first, see `scan_order`): about
# this many ops simulated in all, at least MIN_SCAN_STEPS + 1 periods (a timing of 49k ops
# takes about 0.25 s).
SCAN_OPS = 400_000
MIN_SCAN_STEPS = 4
# The bisection stops when its bracket is this share of that work.
BISECTION_TOLERANCE = 1e-2
BISECTION_STEPS = 64


def lone_offsets(problem: Problem) -> dict[tuple[str, int], float]:
    """Each (kind, stage)'s start in a microbatch that has every device to itself."""
    tables = problem.tables()
    device_of = tables.device
    starts: dict[tuple[str, int], float] = {}
    depth = dependency_depths(problem.num_stages)
    ops = sorted((Op(kind, stage, 0) for stage in range(problem.num_stages) for kind in _KINDS), key=depth)
    for op in ops:
        device = device_of[op.stage]
        starts[(op.kind, op.stage)] = max(
            (
                starts[(dep.kind, dep.stage)]
                + op_duration(tables, dep.kind, dep.stage)
                + transfer_delay(dep, device, device_of, problem.comm_time, 0.0)
                for dep in dependencies(op, problem.num_stages)
            ),
            default=0.0,
        )
    return starts


class PacedOrders:
    """Per-device orders for any period: each device's ops built once, sorted per period.

    Ties (same key and depth: at the V's turn a W ends where the next B starts) go to the
    B, which carries the chain on, or with `weights_first` to the W, which frees memory: a
    B that allocates holds its memory until its W, and one microbatch alone then fits the
    least limit of split backwards only with the W first."""

    def __init__(self, problem: Problem, offsets: dict[tuple[str, int], float], weights_first: bool = False):
        depth = dependency_depths(problem.num_stages)
        device_of = problem.tables().device
        m = problem.num_microbatches
        microbatch = np.arange(m)
        rank_of_kind = {"W": 0, "B": 1, "F": 2} if weights_first else {"B": 0, "W": 1, "F": 2}
        self._devices = []
        for device in range(problem.num_devices):
            classes = [(kind, stage) for (kind, stage) in offsets if device_of[stage] == device]
            ops = [Op(kind, stage, i) for kind, stage in classes for i in range(m)]
            base = np.repeat([offsets[c] for c in classes], m)
            depths = np.repeat([depth(Op(kind, stage, 0)) for kind, stage in classes], m)
            kinds = np.repeat([rank_of_kind[kind] for kind, _ in classes], m)
            self._devices.append((ops, base, depths, kinds, np.tile(microbatch, len(classes))))

    def __call__(self, period: float) -> Orders:
        """Microbatch i's ops keyed by offset + i·period (ties: depth, kind, microbatch)."""
        orders = []
        for ops, base, depths, kinds, microbatch in self._devices:
            rank = np.lexsort((microbatch, kinds, depths, base + microbatch * period))
            orders.append([ops[k] for k in rank])
        return orders


def busiest_work(problem: Problem) -> float:
    """The busiest device's F, B and W time per microbatch."""
    tables = problem.tables()
    work = [0.0] * problem.num_devices
    for stage, device in enumerate(tables.device):
        work[device] += sum(op_duration(tables, kind, stage) for kind in _KINDS)
    return max(work)


def fitting_orders(problem: Problem, offsets: dict[tuple[str, int], float]) -> tuple[PacedOrders, float]:
    """The orders (B's first at ties, else W's) and their least period (to
    BISECTION_TOLERANCE of the busiest device's work per microbatch) that fit the memory
    limit; InfeasibleError when microbatches one after another do not fit either way."""
    tables = problem.tables()
    sequential = max(offsets[(kind, stage)] + op_duration(tables, kind, stage) for kind, stage in offsets)
    for weights_first in (False, True):
        orders_at = PacedOrders(problem, offsets, weights_first)
        if orders_fit(problem, orders_at(sequential)):
            return orders_at, least_fitting_period(problem, orders_at, sequential)
    check_split_memory(problem)
    raise InfeasibleError("memory_limit: one microbatch after another does not fit the limit with its backwards split; try --method auto")


def least_fitting_period(problem: Problem, orders_at: PacedOrders, sequential: float) -> float:
    """The least period whose orders fit, given that the `sequential` one does."""
    if orders_fit(problem, orders_at(0.0)):
        return 0.0
    low, high = 0.0, sequential
    tolerance = BISECTION_TOLERANCE * busiest_work(problem)
    # At most BISECTION_STEPS halvings: where the chain is 1e15 times the work (transfers of
    # 1e6 against ops of 1e-9) the tolerance lies below the floats' spacing at `high`, and
    # the bracket never shrank to it.
    for _ in range(BISECTION_STEPS):
        if high - low <= tolerance:
            break
        middle = (low + high) / 2
        if orders_fit(problem, orders_at(middle)):
            high = middle
        else:
            low = middle
    return high


def scan_order(steps: int) -> Iterator[int]:
    """0..steps, coarse first (0, steps, then halves and quarters...), so that a deadline
    that cuts the scan still leaves it spread over the range."""
    seen: set[int] = set()
    stride = steps
    while stride >= 1:
        for k in range(0, steps + 1, stride):
            if k not in seen:
                seen.add(k)
                yield k
        stride //= 2


def paced(problem: Problem, deadline: float | None = None, keep: Keep | None = None) -> Orders:
    """The shortest of the fitting periods' orders (by makespan, then the longest device
    span); with a `deadline` the periods not timed by then are left out, and `keep` hears
    each shorter result."""
    orders_at, least = fitting_orders(problem, lone_offsets(problem))
    step = SCAN_STEP * busiest_work(problem)
    best: tuple[float, float] = (math.inf, math.inf)
    best_orders: Orders | None = None
    periods = max(MIN_SCAN_STEPS, min(SCAN_STEPS, SCAN_OPS // problem.num_ops)) + 1
    for k in itertools.islice(scan_order(SCAN_STEPS), periods):
        if best_orders is not None and deadline is not None and time.monotonic() >= deadline:
            break
        orders = orders_at(least + k * step)
        if not orders_fit(problem, orders):
            continue
        timed = simulate_times(problem, orders)
        ends = [device[-1].end - device[0].start for device in timed if device]
        score = (max(device[-1].end for device in timed if device), max(ends))
        if score < best:
            best, best_orders = score, orders
            if keep is not None:
                keep(orders)
    assert best_orders is not None  # the least fitting period fits
    return best_orders


def several_stages_per_device(problem: Problem) -> str | None:
    """On one stage per device the list scheduler (`greedy`) was as good or better in every
    case tried, so the family leaves that placement to it."""
    if problem.num_stages > problem.num_devices:
        return None
    return "needs several stages on a device (vshape, interleaved:V or a custom placement); on one stage per device use greedy"


GENERATOR = Generator(
    "paced",
    "Every microbatch runs a lone microbatch's timing, shifted by the least period that fits the memory limit; several stages per device",
    paced,
    several_stages_per_device,
    build_by=lambda problem, deadline, keep, abandoned: paced(problem, deadline, keep),
    within_limit=True,
)

"""The `greedy` family: the list-scheduling engine (optimizer.schedules.listengine) run
over a grid of policies, in the spirit of Zero Bubble's automatic scheduler (Qi et al.
2024, "Zero Bubble Pipeline Parallelism", section 3.1); the order with the smallest
makespan is kept.

Works for any placement, heterogeneous stage times and per-device memory limits, and
orders token slices (under a memory limit, with one stage per device); never
over the limit and never deadlocked for any limit from `Problem.split_memory_limit()` up
(the engine's memory safety; it splits every backward); below that InfeasibleError says
so, and where only fused backwards fit (a B that allocates) points to `auto`.
"""

from __future__ import annotations

from optimizer.problem import Problem
from optimizer.schedules.listengine import Policy, best_of, sliced_support
from optimizer.schedules.registry import Generator, Keep, Orders

# A covering subset of the full product of priority x fill_w x hold_forward x throttle
# (4 x 4 x 2 x 2): on 120 random problems (linear, V, interleaved, custom; no, tight and
# 1F1B-sized memory) these reach the full grid's best makespan to within 0.3%. The
# second is ZB-H1's own rule set (1F1B alternation and warm-up, r W's kept on device r),
# which keeps the result at least as good as ZB-H1 on linear pipelines with ZB-H1's memory.
GRID = (
    Policy("backward", "fit-defer", hold_forward=False, throttle=False),
    Policy("strict", "fit-defer", hold_forward=False, throttle=True),
    Policy("alternate", "fit-defer", hold_forward=False, throttle=True),
    Policy("strict", "fit-defer", hold_forward=False, throttle=False),
    Policy("strict", "fit", hold_forward=True, throttle=True),
    Policy("strict", "defer", hold_forward=True, throttle=True),
    Policy("forward", "always", hold_forward=False, throttle=False),
    Policy("strict", "always", hold_forward=True, throttle=False),
    Policy("forward", "fit", hold_forward=False, throttle=True),
)


# Extra settings for devices holding several stages (V, interleaved, custom).
MULTI_STAGE_GRID = tuple(
    Policy(priority, fill_w, hold_forward=False, throttle=False, reserve="each")
    for priority in ("backward", "strict")
    for fill_w in ("always", "fit-defer")
)


# On one stage per device below 1F1B's depth (a device cannot hold a forward per stage
# after it), the throttled and held-forward settings lead: on Zero Bubble's 12 profiled
# settings at a quarter, half and three quarters of p activations and at p - 1
# (44 cases), GRID's first setting came within 3.1% of its best on average (9.3% at
# worst) and its first three within 0.8% (4.8%); these, in this order, within 1.9% (8.1%)
# and 0.03% (0.7%). Under a short deadline only the first settings run.
TIGHT_FIRST = (GRID[2], GRID[4], GRID[1])


def below_one_f_one_b(problem: Problem) -> bool:
    """Whether some device's limit holds fewer forwards than 1F1B keeps in flight there
    (p - d on device d), on a placement with one stage per device."""
    if problem.num_stages != problem.num_devices:
        return False
    tables = problem.tables()
    depth = min(problem.num_devices, problem.num_microbatches)
    return any(
        tables.limit[device] < min(depth, problem.num_devices - stage) * tables.mem_forward[stage]
        for stage, device in enumerate(tables.device)
    )


# Above this many ops, only the first settings run (they win most often), so that
# p=32, m=256 stays within a few seconds on any placement.
_FULL_GRID_OPS = 30_000


def policy_grid(problem: Problem) -> tuple[Policy, ...]:
    if problem.num_stages > problem.num_devices:
        grid = MULTI_STAGE_GRID + GRID  # usually best there: run first for a tight cutoff
    elif below_one_f_one_b(problem):
        grid = TIGHT_FIRST + tuple(policy for policy in GRID if policy not in TIGHT_FIRST)
    else:
        grid = GRID
    ops = 3 * problem.num_stages * problem.num_microbatches * problem.num_slices
    if ops <= _FULL_GRID_OPS:
        return grid
    return grid[: max(len(MULTI_STAGE_GRID), len(grid) * _FULL_GRID_OPS // ops)]


def greedy(problem: Problem, deadline: float | None = None, keep: Keep | None = None) -> Orders:
    """The grid's best; with a `deadline` the policies not started by then are left out
    (`keep` hears each shorter result: the solver keeps it when it cannot wait)."""
    return best_of(problem, policy_grid(problem), deadline, keep)[0]


GENERATOR = Generator(
    "greedy",
    "Memory-aware list scheduler: any placement and timings, never over the memory limit",
    greedy,
    sliced_support,
    slices=True,
    build_by=lambda problem, deadline, keep, abandoned: greedy(problem, deadline, keep),
    within_limit=True,
)

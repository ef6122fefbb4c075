"""The `auto` method: known schedules first, then declared phases of exact models and search.

The starting points (every applicable generator and a few list-scheduler policies) give
the incumbent: the best that fits the memory limit, so `auto` is never worse than any of
them. Then each phase of PHASES that applies to the problem runs in order, for its share
of the time left, until the time limit or until the incumbent meets the lower bound:
device relaxations raise the bound (optimizer.exact.devicebound); small problems (up to
FULL_MODEL_OPS ops) get a short window search and then the whole CP-SAT model, which can
prove optimality (tiny ones, up to QUICK_MODEL_OPS, also a short try of it first); larger ones a periodic steady state solved once and unrolled
(optimizer.exact.periodic), then window search (optimizer.exact.neighbourhood). The
progress line names the phase that runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from optimizer.errors import PipeschedError
from optimizer.exact import devicebound, fluidbound, localsearch, stretch
from optimizer.exact.canonical import canonical
from optimizer.exact.cpsat import solve_cpsat_subproblem
from optimizer.exact.incumbents import Candidate, candidate, generator_candidates, share_end
from optimizer.exact.least_memory import least_memory_candidate, split_backwards_fit
from optimizer.exact.listsched import Policy, list_schedule, policies
from optimizer.exact.neighbourhood import neighbourhood_search
from optimizer.exact.options import SolveOptions
from optimizer.exact.periodic import periodic_orders
from optimizer.exact.slicebounds import busy_bound, cut_by_deadline, lower_bound, round_trip_bound, split_relaxation, stronger
from optimizer.exact.subproblem import SubProblem, full_subproblem
from optimizer.exact.timescale import IntegerTables, integer_tables
from optimizer.exact.tracker import Tracker
from optimizer.interrupts import interrupts_deferred
from optimizer.ops import Op
from optimizer.problem import Problem
from optimizer.schedule import orders_fit
from optimizer.schedules import GENERATORS, applicable
from optimizer.schedules.listengine import sliced_support
from optimizer.schedules.support import vshape_only
from optimizer.schedules.v_auto import leaves_blocks_out, more_reordered_blocks
from optimizer.simulate import simulate

# Up to this many ops the whole model is worth running: CP-SAT proves p=4, m=16
# (192 ops) optimal in seconds when hinted, and stalls far beyond ~1000.
FULL_MODEL_OPS = 600
# Up to this many ops the whole model also gets a first try in front of every other phase,
# for QUICK_MODEL_SHARE of the time left: hinted with the incumbent it proves the makespan
# optimal on random problems of p = 2-4, m = 2-8 (12-192 ops, linear and V, with and
# without a limit) in 0.02-0.74 s, where the phases before it took their shares first
# (4.4 s at p = 2, m = 2 with a 10 s limit). Under the span objective it ends as fast with
# a schedule and a bound, not a proof (the model's span is a relaxation of the real one).
QUICK_MODEL_OPS = 200
QUICK_MODEL_SHARE = 0.1
# Share of the time the window search gets before the whole model on small problems.
WINDOW_SHARE_SMALL = 0.25
# Window search first times the incumbent twice (ticks and the objective's own timing):
# about 0.7 s at p = 32, m = 256 (49k ops) on 2 loaded cores. With less time left than
# this estimate it does not start, so that it does not run past the time limit.
WINDOW_START_SECONDS_PER_OP = 2e-5
# Share of the time left after the starting points that periodic patterns may take.
PERIODIC_SHARE = 0.2
# Share of the time left after the starting points that the device relaxations may take.
# Under the span objective one device's relaxation is often the proof that the best
# known schedule is optimal (ZB-H1 at 1F1B's memory: 2-36 s at p = 8-16 on 2 loaded
# cores), and nothing else can close the gap, so it gets more.
RELAXATION_SHARE = {"makespan": 0.3, "span": 0.5}
# The search on fewer microbatches whose steady state is stretched to all of them
# (optimizer.exact.stretch) gets this share of the time left, most of it for the search
# on the smaller problem, the rest for trying stretches. It runs where the gap is wider
# than STRETCH_MIN_GAP (the known steady state is then far from the bound: V-Min's memory)
# and with at least STRETCH_MIN_SECONDS left.
STRETCH_SHARE = 0.4
STRETCH_SEARCH_SHARE = 0.85
STRETCH_MIN_GAP = 0.03
STRETCH_MIN_SECONDS = 10.0
# Share of the time left that reordering more of the paper's V blocks may take on large
# problems (optimizer.schedules.v_auto.more_reordered_blocks: about 1 s a block at p = 32,
# m = 96, six blocks), once the fluid bound's worker has started.
MORE_BLOCKS_SHARE = 0.25
# Share of the time left after the starting points that the order search takes.
ORDER_SEARCH_SHARE = 0.6
# On small problems the whole model both searches and proves, so the order search leaves
# it more: at 30 s on 4 devices (benchmarks/small_proofs.py) a 0.6 share left it too
# little time to close cases the incumbent already solved.
ORDER_SEARCH_SHARE_SMALL = 0.25
# The fluid bound (every device at once) within `auto`: the span over at least
# FLUID_SAMPLES steps whatever the size (a program's rounding loss depends on the steps
# over the span more than on the step against the ops: 250 steps refuted 2% below `auto`'s
# span at V-Half's memory from p = 8 to 32, 150-180 did not), more where programs are small
# (FLUID_BUDGET started counts: 1000 steps on 4 devices of the V placement, 500 at p = 8).
# A program then takes 3-6 s at p = 8 on the V placement and 15-25 s at p = 32 on 2 cores.
# On small problems (in front of the relaxations) it gets this share of the time left when
# the bound leaves more than FLUID_MIN_GAP open, and at least FLUID_MIN_SECONDS; on large
# ones it runs alongside the search for the whole time left (fluid_bound_alongside).
FLUID_SAMPLES = 300
FLUID_BUDGET = 24_000
# Alongside the search, the bisection starts from a grid of this many times and refines it
# each time it settles (fluidbound.bisect's `refine`): at 50 s on one core, 200 graded
# times then finer gave the highest bound or near it on six V cases from p = 8 to 32
# (p32 m256 at V-Half's memory: gap 1.13% where 300 uniform steps proved 1.50%; 6.2B p8
# m64 at V-Min's: 9.28% against 10.03%; 14.6B p16 m128 at V-Half's: 0.38% against 1.31%).
FLUID_FIRST_SAMPLES = 200
FLUID_SHARE = 0.5
FLUID_MIN_GAP = 0.005
FLUID_MIN_SECONDS = 5.0
# One program's time grows about with the square of its started counts (classes x
# steps): 25 s to refute 1.5% below `auto`'s span at p = 32, m = 128 on the V placement
# at p's memory (192 classes x 300 steps), 5-6 s at p = 8 (48 x 500), alone on 2 cores.
# Where the share would end the phase inside its first program, the phase gets the time
# of one program and the worker's start, as far as the time left allows.
FLUID_PROGRAM_SECONDS = 25.0
FLUID_PROGRAM_COUNTS = 57_600
FLUID_WORKER_SECONDS = 2.0
# With less time than this part of that estimate the first program would be cut off and
# prove nothing, so the phase does not start (p = 32 at a 20 s limit).
FLUID_START_SHARE = 0.75


# Share of the time left (when the starting points begin) the known schedules may take
# at most (they are usually far quicker; the cap protects the time limit from a family
# that runs long).
GENERATOR_SHARE = 0.4
# The automatic schedulers users compare `auto` with may run longer: `auto` must never
# return worse than they do, even at a short limit (v-auto takes 2-4 s at p = 32, m = 96
# on the V placement on 2 loaded cores, more than 40% of a 5 s limit). interleaved-auto
# (1-3 s at p = 32, m = 256) is ours only and keeps the families' share: as essential it
# pushed the list policy that is optimal there (7432.6 ms against its 7501.1) out of 5 s.
AUTOMATIC_SCHEDULERS = ("zb-auto", "v-auto")
# Nor worse than the schedules torch.distributed.pipelining ships (torchtitan's choices),
# here under our names (runtime/torch_orders.py checks each against torch's own order):
# what most users run today. They are walks over the ops, built in 0.01-0.06 s and timed
# in 0.2-0.3 s at p = 32, m = 256 (49k ops), so they come first.
TORCH_BUILT_INS = ("gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "interleaved-zb", "zb-v", "dualpipe-v")
ESSENTIAL = AUTOMATIC_SCHEDULERS + TORCH_BUILT_INS
# When none of those fits in time (v-auto unfinished under a tight limit at a short time
# limit), the hand-made low-memory families come before the list scheduler's fallback,
# the shorter first, up to the first that fits: at p = 32, m = 256 on the V placement at
# V-Min's memory and 1 s they take 0.35 s (V-Half's, over the limit) and 0.65 s (V-Min's:
# 9354.2 ms) where the first list policy took 1.4-2.2 s for 11559.5 ms.
FALLBACK_FAMILIES = ("v-half", "v-min")
# Their peak memory is the same from p microbatches up (measured at p = 4 to 32, m = p to
# 8p): one built on p microbatches first says whether the whole build can fit. Where
# neither fits (p = 32, m = 256 on the V placement at a limit of 20 uniform activations)
# the two whole builds took 2.2 s of a 5 s limit before the list scheduler's fallback,
# the two on p microbatches 0.5 s.
# The family built before the automatic schedulers where V-Min's schedule does not fit
# (`_below_v_min`).
PACED_BELOW_V_MIN = "paced"
AUTOMATIC_SHARE = 0.9
# The automatic schedulers take about this long per op, built and timed (v-auto at
# p = 32, m = 256 on the V placement: 2.5 s and 0.2 s for 49k ops on 2 cores).
AUTOMATIC_SECONDS_PER_OP = 6e-5
# Up to 10,000 ops v-auto reorders every block of its family, far more per op: to its
# best candidate 0.9 s at p = 16, m = 64 at V-Min's memory, 2.0 s at p = 16, m = 48 at
# V-Half's, 3.4 s at p = 8, m = 64 (1.5e-4 to 1.1e-3 s per op on 2 cores; 9e-5 at p = 32,
# m = 96, above 10,000 ops).
V_AUTO_SMALL_SECONDS_PER_OP = 1e-3
# And each of torch's built-ins that applies (0.55-0.75 s each at p = 32, m = 256 on
# interleaved:2, 49k ops, in a loaded process).
BUILT_IN_SECONDS_PER_OP = 1.5e-5
# The problem's lower bound (heads and tails, memory-aware, device passes; optimizer.exact.
# slicebounds) takes 0.1-0.4 ms per stage-microbatch cell on 2 loaded cores and stops at
# its own cell budget: 0.9-1.7 s at p = 32, m = 256 on the V placement.
BOUND_SECONDS_PER_CELL = 4e-4
BOUND_SECONDS_CAP = 2.0
# Share of the time limit the bound may take before the starting points. A dearer bound
# waits until they have run (a 1 s limit at p = 16, m = 64 on the V placement left v-auto
# no time after a 0.8 s bound, and `auto` returned 22% worse than v-auto). Nor does it
# when the bound, the automatic schedulers and torch's built-ins would take more than
# BOUND_AND_AUTOMATIC_SHARE of the limit: at p = 32, m = 256 on the V placement at 5 s a
# 1.3 s bound and v-auto ended at 4.8 s, past v-auto's 4.5 s, and `auto` returned 9%
# worse than torch's DualPipeV (the margin is for a loaded machine).
BOUND_FIRST_SHARE = 0.4
BOUND_AND_AUTOMATIC_SHARE = 0.6
# A bound that comes after the starting points with less time left than it may take
# keeps its parts that end within this share of what is left (each part is a bound alone).
CUT_BOUND_SHARE = 0.5
# A list schedule costs about a simulation and a memory check: 1.2 s at p = 32, m = 256
# on the V placement (49k ops) on 2 cores. Once a fitting schedule is known, a policy
# does not start with less time left than this estimate.
LIST_SECONDS_PER_OP = 2.5e-5


def starting_points(problem: Problem, tracker: Tracker) -> list[Candidate]:
    """Offer every generator and list-scheduler policy to the tracker; return them all.

    The families torch ships run first (`auto` must never return worse than they do;
    each is all or nothing, and quick), then the automatic schedulers (nor worse than
    those; each hands over the best it has at its deadline, so a loaded machine costs
    them some quality, not the whole schedule: at p = 32, m = 256 on the V placement at
    5 s, v-auto's 2.7-4 s before them left torch's ZB-V unbuilt and `auto` 0.01% longer),
    then the first list-scheduler policy (as quick as a simulation, and the best known
    schedule wherever memory is to spare: 0.00% on the V placement at limit 2p where
    v-auto has 1.5-4%), then the other generators and policies while their share of the
    time lasts. When no known schedule fits, the first policy runs even past the time
    limit, so there is a schedule that fits whenever one exists, however short the limit.
    Where the limit fits only fused backwards (a B that allocates, between
    `Problem.min_memory_limit` and `split_memory_limit`) the list scheduler, which splits
    them, cannot run, and the least-memory order (optimizer.exact.least_memory) is that
    schedule.
    """
    # The families' share counts from here, of the time left: a lower bound that ran first
    # (up to BOUND_FIRST_SHARE of the limit) would otherwise leave them nothing (p = 8,
    # m = 24 on interleaved:3 at 1 s: greedy, 414 ms, was not started and `auto` gave 493).
    # The essential ones keep theirs of the whole limit, which bound_first leaves them. (Of
    # the limit less the time kept for the span's final timing, v-auto gave no schedule in
    # time at p = 32, m = 256 at V-Min's and V-Half's memory at 5 s: 11559.5 and 9538.9 ms
    # against 9338.6 and 7937.5, and its thread, left running, slowed the rest.)
    essential_until = tracker.began + AUTOMATIC_SHARE * tracker.time_limit
    families_until = min(essential_until, time.monotonic() + GENERATOR_SHARE * tracker.left())
    automatic = [name for name in AUTOMATIC_SCHEDULERS if GENERATORS[name].reason(problem) is None]
    paced_first = _below_v_min(problem)
    later = len(automatic) + paced_first  # essential builds after torch's (their weaving's shares)
    found = _generators(problem, tracker, lambda name: name in TORCH_BUILT_INS, families_until, essential_until, later)
    tried = set(ESSENTIAL)
    if paced_first:
        # Below V-Min's memory `paced` is 7.6-21.3% ahead of v-auto (the list scheduler's there)
        # on Zero Bubble's settings, and quicker: it comes before them (in the families'
        # share a 5 s limit at p = 32 left it unbuilt, and `auto` 12-19% longer).
        found += _paced_first(problem, tracker, essential_until, len(automatic))
        tried.add(PACED_BELOW_V_MIN)
    found += _generators(problem, tracker, lambda name: name in AUTOMATIC_SCHEDULERS, families_until, essential_until)
    for name in FALLBACK_FAMILIES:
        # A start of the user's (or pareto's, from a tighter limit) is no reason to skip
        # them: at 0.1 s a pareto point kept its start's 278 where V-Min's 219 fit.
        if any(c.fits for c in found):
            break
        if not _fallback_may_fit(problem, name):
            continue
        # Without a deadline, as the list scheduler's fallback below runs.
        found += _generators(problem, tracker, name.__eq__, None, None)
        tried.add(name)
    # The list-scheduler policies order token slices where the engine can (listengine), and
    # split every backward, which needs problem.split_memory_limit().
    grid = policies() if sliced_support(problem) is None and split_backwards_fit(problem) else []
    found += _list_policies(problem, tracker, grid[:1], essential_until)
    # Where the builds above took the families' share (vocabulary passes woven into each:
    # 0.46 s of a 1 s limit at p = 4, m = 16), the rest get theirs of what is left, as far as
    # the limit allows: V-Half's 108.55 there had been left out for a list schedule's 112.15.
    families_until = max(families_until, min(essential_until, time.monotonic() + GENERATOR_SHARE * tracker.left()))
    found += _generators(problem, tracker, lambda name: name not in tried, families_until, essential_until)
    found += _list_policies(problem, tracker, grid[1:], families_until)
    if tracker.best is None:
        c = least_memory_candidate(problem)
        found.append(c)
        tracker.offer(c.schedule, c.name)
    return found


def _paced_first(problem: Problem, tracker: Tracker, until: float, essential_after: int) -> list[Candidate]:
    """`paced`, its periods timed until `until` and its least fitting period at least,
    even past it: it fits wherever split backwards do, in a bisection and one timing, where
    the list scheduler's fallback (when nothing else fits in time) runs whole (p = 256,
    m = 32 on the V placement at a limit of 3 activations: 6.2 s at a 1 s limit). Any
    vocabulary passes are woven within its even share of the time, as every build's
    (optimizer.exact.incumbents.generator_candidates), counting the `essential_after`
    builds that follow it."""
    weave_by = share_end(time.monotonic(), until, 1 + essential_after)
    try:
        orders = GENERATORS[PACED_BELOW_V_MIN].build_within(problem, until, weave_by=weave_by)
    except PipeschedError:  # split backwards do not fit: the least-memory order follows
        return []
    c = candidate(problem, PACED_BELOW_V_MIN, orders)
    tracker.offer(c.schedule, c.name)
    return [c]


def _below_v_min(problem: Problem) -> bool:
    """On the V placement, whether V-Min's schedule is over the memory limit."""
    return problem.placement() == "vshape" and _fits_on_fewer(problem, "v-min") is False


def _fallback_may_fit(problem: Problem, name: str) -> bool:
    """Whether a fallback family built on p microbatches fits the limit (see
    FALLBACK_FAMILIES); True where it does not apply or has no fewer microbatches to try."""
    if problem.num_microbatches <= problem.num_devices:
        return True
    return _fits_on_fewer(problem, name) is not False


def _fits_on_fewer(problem: Problem, name: str) -> bool | None:
    """Whether family `name` built on at most p microbatches fits the limit (its peak is the
    same from p up, see FALLBACK_FAMILIES); None where it does not apply or refuses them.

    Without vocabulary passes, whose weaving costs as much on p microbatches as the whole
    build (4.5 s at p = 32, m = 192): they only add memory, so an order over the limit
    without them is over it with them."""
    generator = GENERATORS[name]
    if generator.reason(problem) is not None:
        return None
    fewer = stretch.fewer_microbatches(problem.without_vocab(), min(problem.num_devices, problem.num_microbatches))
    try:
        return orders_fit(fewer, generator.build(fewer))
    except PipeschedError:
        return None


def _generators(
    problem: Problem,
    tracker: Tracker,
    which: Callable[[str], bool],
    until: float | None,
    essential_until: float | None,
    essential_after: int = 0,
) -> list[Candidate]:
    found, _ = generator_candidates(
        problem,
        deadline=until,
        essential=ESSENTIAL,
        essential_deadline=essential_until,
        essential_after=essential_after,
        which=which,
        # `auto` never returns a schedule over the limit, so one is not timed: that saves
        # 0.2-0.7 s a family at p = 32, m = 256 (torch's three built-ins on the V placement at
        # V-Half's memory took 2.2 s before v-auto could start, at a 5 s limit).
        fitting_only=True,
    )
    for c in found:
        tracker.offer(c.schedule, c.name)
    return found


def _list_policies(problem: Problem, tracker: Tracker, grid: list[Policy], until: float) -> list[Candidate]:
    found = []
    for policy in grid:
        # Once a fitting schedule is known and the time for these is spent, a list
        # schedule (as slow as a simulation) would overrun a short limit.
        too_late = tracker.left() < LIST_SECONDS_PER_OP * problem.num_ops or time.monotonic() >= until
        if tracker.best is not None and too_late:
            break
        c = candidate(problem, str(policy), list_schedule(problem, policy, tracker.deadline))
        found.append(c)
        tracker.offer(c.schedule, c.name)
    return found


def whole_model(problem: Problem, tables: IntegerTables, options: SolveOptions, tracker: Tracker, until: float) -> None:
    """The whole CP-SAT model hinted with the incumbent; offers its solution, raises the bound.

    Off an exact memory grid the model's memory is relaxed, so that what it proves holds;
    a solution that then overflows the real limit by a rounding is not offered."""
    if not tables.memory_is_exact:
        tables = integer_tables(problem, relax_memory=True)
    time_limit = max(0.1, until - time.monotonic())
    hint = canonical(tracker.best.order(), problem) if tracker.best is not None else None
    sub = full_subproblem(problem, tables, hint, options.symmetry_breaking)
    scale = tables.time_scale
    tracker.models_ran = True
    tracker.report(f"cpsat, {tables.describe()}")  # says whether the time grid is exact

    def on_solution(value: int, bound: int) -> None:
        tracker.report("cpsat", incumbent=value / scale)

    result = solve_cpsat_subproblem(
        sub, time_limit=time_limit, seed=options.seed, threads=options.threads, objective=options.objective, on_solution=on_solution
    )
    take_whole_model_result(problem, tables, sub, result, options, tracker, "cpsat", "CP-SAT's proven bound")


class WholeModelResult(Protocol):
    """What a whole model returns (optimizer.exact.cpsat.CpsatResult, optimizer.exact.milp.MilpResult)."""

    @property
    def status(self) -> str: ...
    @property
    def starts(self) -> list[int] | None: ...
    @property
    def bound(self) -> float: ...
    @property
    def interrupted(self) -> bool: ...
    def orders(self, sub: SubProblem) -> list[list[Op]]: ...


def take_whole_model_result(
    problem: Problem,
    tables: IntegerTables,
    sub: SubProblem,
    result: WholeModelResult,
    options: SolveOptions,
    tracker: Tracker,
    label: str,
    reason: str,
) -> None:
    """Offer a whole model's solution, raise the bound it proved, and call the incumbent
    optimal when its proof holds for the problem: on an exact time grid, for the
    makespan, and with its solution fitting (a relaxed model's may overflow by a rounding)."""
    fits = False
    if result.starts is not None:
        solution = simulate(problem, result.orders(sub))
        fits = solution.fits_memory()
        tracker.offer(solution, label)
    tracker.raise_bound(tables.bound_to_time(result.bound, options.objective, problem.num_devices), reason)
    if result.status == "optimal" and tables.proves_optimality(options.objective) and fits:
        tracker.proven = True
    if result.interrupted:
        raise KeyboardInterrupt


def window_search(problem: Problem, tables: IntegerTables, options: SolveOptions, tracker: Tracker, until: float) -> None:
    start = tracker.best
    assert start is not None, "window search starts from an incumbent"
    if until - time.monotonic() < WINDOW_START_SECONDS_PER_OP * problem.num_ops:
        return  # it would still be timing the incumbent at the deadline
    origin = tracker.best_by
    tracker.models_ran = True
    neighbourhood_search(
        problem,
        tables,
        canonical(start.order(), problem),
        deadline=until,
        seed=options.seed,
        threads=options.threads,
        objective=options.objective,
        target=tracker.bound,
        on_improve=lambda schedule: tracker.offer(schedule, f"lns({origin})"),
    )


def order_search(problem: Problem, tables: IntegerTables, options: SolveOptions, tracker: Tracker, until: float) -> None:
    start = tracker.best
    assert start is not None, "the order search starts from an incumbent"
    origin = tracker.best_by
    localsearch.local_search(
        problem,
        start.order(),
        deadline=until,
        seed=options.seed,
        objective=options.objective,
        on_improve=lambda schedule: tracker.offer(schedule, f"local({origin})"),
    )


@dataclass(frozen=True)
class Phase:
    """One step of `auto` after the starting points.

    applies: whether it runs on this problem and objective; share: the part of the time
    left when it starts that it may use (1.0: until the time limit), per objective when
    a mapping; run: the step,
    offering schedules and bounds to the tracker until `until` (time.monotonic()).
    """

    name: str
    applies: Callable[[Problem, SolveOptions], bool]
    share: float | dict[str, float]
    run: Callable[[Problem, IntegerTables, SolveOptions, Tracker, float], None]
    # Whether the phase starts from the incumbent. The whole model does not: on a problem
    # no starting point fits (the list schedulers, which always find one, do not order
    # token slices) it is the one way to a schedule.
    needs_incumbent: bool = True
    # Seconds the phase needs to prove or find anything (None: no minimum); it gets them
    # when its share is shorter and the time left allows.
    min_seconds: Callable[[Problem], float] | None = None

    def seconds(self, problem: Problem, objective: str, left: float) -> float:
        """How long the phase may run when `left` seconds are left."""
        share = self.share[objective] if isinstance(self.share, dict) else self.share
        wanted = 0.0 if self.min_seconds is None else self.min_seconds(problem)
        return max(share * left, min(wanted, left))


def _small(problem: Problem, options: SolveOptions) -> bool:
    return problem.num_ops <= FULL_MODEL_OPS


def _tiny(problem: Problem, options: SolveOptions) -> bool:
    return problem.num_ops <= QUICK_MODEL_OPS


def _large(problem: Problem, options: SolveOptions) -> bool:
    return not _small(problem, options)


def _large_unsliced(problem: Problem, options: SolveOptions) -> bool:
    # The periodic pattern knows one slice per microbatch; B then W is always allowed,
    # so it still applies where fusing could win (it just never fuses).
    # Nor vocabulary passes (their collectives tie every device to every microbatch).
    return _large(problem, options) and problem.num_slices == 1 and problem.vocab_parallel is None


def _orderable_large(problem: Problem, options: SolveOptions) -> bool:
    return localsearch.applicable(problem) and _large(problem, options)


def _orderable_small(problem: Problem, options: SolveOptions) -> bool:
    return localsearch.applicable(problem) and _small(problem, options)


def _relaxable(problem: Problem, options: SolveOptions) -> bool:
    return devicebound.relaxation_applies(problem, options.objective)


def bound_seconds(problem: Problem) -> float:
    """About how long the problem's lower bound takes (at most)."""
    cells = problem.num_stages * problem.num_microbatches * problem.num_slices
    return min(BOUND_SECONDS_CAP, BOUND_SECONDS_PER_CELL * cells)


def bound_first(problem: Problem, options: SolveOptions) -> bool:
    """Whether the lower bound is cheap enough to come before the starting points."""
    bound = bound_seconds(problem)
    names = {g.name for g in applicable(problem)}
    automatic = AUTOMATIC_SECONDS_PER_OP * problem.num_ops * len(names & set(AUTOMATIC_SCHEDULERS))
    if "v-auto" in names and not leaves_blocks_out(problem):
        # At p = 16, m = 64 at V-Half's memory at 5 s a 2.0-2.6 s bound left v-auto 1.9 s,
        # and `auto` returned its first candidate, 2% longer than its best.
        automatic += (V_AUTO_SMALL_SECONDS_PER_OP - AUTOMATIC_SECONDS_PER_OP) * problem.num_ops
    # At p = 32, m = 256 on interleaved:2 at 5 s, a 1.6-2.9 s bound and torch's three
    # built-ins (1.6-2.2 s) ended past their 4.5 s: `auto` returned 2.7% longer than
    # torch's interleaved zero bubble.
    built_ins = BUILT_IN_SECONDS_PER_OP * problem.num_ops * len(names & set(TORCH_BUILT_INS))
    limit = options.time_limit
    return bound <= BOUND_FIRST_SHARE * limit and bound + automatic + built_ins <= BOUND_AND_AUTOMATIC_SHARE * limit


def problem_bound(problem: Problem, options: SolveOptions, tracker: Tracker, *, within_time: bool) -> None:
    """Raise the tracker's bound with the problem's lower bound. With `within_time` and
    less time left than it may take, the parts of it that end in time (where it comes in
    parts), else the busiest device's work and one microbatch's round trip (instant, weaker)."""
    if within_time and tracker.left() < bound_seconds(problem):
        # The search after it keeps the other half of what is left.
        until = time.monotonic() + CUT_BOUND_SHARE * tracker.left()
        if cut_by_deadline(problem):
            found = lower_bound(problem, options.objective, deadline=until)
        else:
            found = stronger(busy_bound(problem), round_trip_bound(problem, options.objective))
    else:
        # Before the starting points its estimate decided; the parts that come in time are
        # kept within its share of the limit all the same (at p = 16, m = 64 on the V
        # placement the estimate said 0.8 s, a slower machine took 2.6 s of a 5 s limit,
        # and v-auto, left 1.9 s, handed over its first candidate: 2299.2 ms against 2254.8).
        deadline = None if within_time else tracker.began + BOUND_FIRST_SHARE * tracker.time_limit
        found = lower_bound(problem, options.objective, deadline=deadline)
    tracker.raise_bound(found.value, found.reason)


def solve_auto(problem: Problem, options: SolveOptions, tracker: Tracker, *, bound_later: bool = False) -> None:
    """The starting points, then every phase of PHASES that applies, in order (the lower
    bound after the starting points when `bound_later`)."""
    starting_points(problem, tracker)
    if bound_later:
        problem_bound(problem, options, tracker, within_time=True)
    tables = integer_tables(problem)
    try:
        for phase in PHASES:
            tracker.collect()
            if tracker.closed() or tracker.left() <= 0:
                return
            if tracker.best is None and phase.needs_incumbent:
                continue
            if phase.applies(problem, options):
                tracker.report(phase.name)
                phase.run(problem, tables, options, tracker, time.monotonic() + phase.seconds(problem, options.objective, tracker.left()))
    finally:
        tracker.release()  # a bound proven alongside until the end counts; its worker stops


def relaxation_bounds(problem: Problem, tables: IntegerTables, options: SolveOptions, tracker: Tracker, until: float) -> None:
    """Raise the bound with exact relaxations on sets of devices (single devices for the span)."""
    relaxed = split_relaxation(problem)  # the problem itself unless a fused backward is shorter
    assert relaxed is not None, "runs only where the relaxations apply"
    devicebound.device_subset_bound(
        relaxed,
        upper=tracker.best_value,
        deadline=until,
        seed=options.seed,
        threads=options.threads,
        on_bound=lambda value, reason: tracker.raise_bound(value, reason),
        objective=options.objective,
        incumbent=tracker.best.devices if tracker.best is not None and relaxed is problem else None,
    )


def _fluid_in_front(problem: Problem, options: SolveOptions) -> bool:
    return fluidbound.applicable(problem) and _small(problem, options)


def _fluid_alongside(problem: Problem, options: SolveOptions) -> bool:
    return fluidbound.applicable(problem) and _large(problem, options)


def _fluid_samples(problem: Problem) -> int:
    return max(FLUID_SAMPLES, fluidbound.default_samples(problem.num_stages, FLUID_BUDGET))


def fluid_program_seconds(problem: Problem, samples: int | None = None) -> float:
    """About how long the fluid phase's first answer takes (one program of `samples` grid
    times, by default the phase in front's, and the worker's start)."""
    counts = fluidbound.CLASSES_PER_STAGE * problem.num_stages * (samples or _fluid_samples(problem))
    return FLUID_WORKER_SECONDS + FLUID_PROGRAM_SECONDS * (counts / FLUID_PROGRAM_COUNTS) ** 2


FLUID_REASON = "fluid bound: every device at once (optimizer.exact.fluidbound)"


def _fluid_worth_starting(problem: Problem, tracker: Tracker, seconds: float, samples: int) -> bool:
    """Whether the gap is open and the time left is enough for a first answer."""
    best = tracker.best_value
    too_short = seconds < max(FLUID_MIN_SECONDS, FLUID_START_SHARE * fluid_program_seconds(problem, samples))
    return not too_short and best > 0 and (best - tracker.bound) > FLUID_MIN_GAP * best


def _fluid_run(
    problem: Problem,
    tracker: Tracker,
    until: float,
    *,
    threads: int,
    below_probe: str,
    samples: int,
    coarse: int = 1,
    refine: bool = False,
) -> fluidbound.FluidRun | None:
    """A fluid worker bisecting between the tracker's bound and incumbent until `until`
    (None where it is not worth starting), from about `samples` grid times (every
    `coarse`-th step between the ramps, fluidbound.grid)."""
    seconds = until - time.monotonic()
    if not _fluid_worth_starting(problem, tracker, seconds, samples):
        return None
    return fluidbound.FluidRun(
        problem,
        tracker.bound,
        tracker.best_value,
        time_limit=seconds,
        samples=samples,
        coarse=coarse,
        threads=threads,
        below_probe=below_probe,
        refine=refine,
    )


def fluid_bound(problem: Problem, tables: IntegerTables, options: SolveOptions, tracker: Tracker, until: float) -> None:
    """Raise the bound with the fluid relaxation of every device, between the bound and the incumbent."""
    # Where the relaxation is weak (V-Min's memory) a fitting first probe hands these small
    # problems to the device relaxations and the whole model, which prove more.
    # A uniform grid: small problems are mostly ramps, and FIRST_PROBE was measured on it.
    with contextlib.ExitStack() as stopping:
        # Started and entered with Ctrl-C held: one in between would leave the worker running.
        with interrupts_deferred():
            run = _fluid_run(problem, tracker, until, threads=options.threads, below_probe="stop", samples=_fluid_samples(problem))
            if run is not None:
                stopping.enter_context(run)
        if run is not None:
            tracker.raise_bound(run.finish(until + fluidbound.OVERRUN_SECONDS), FLUID_REASON)
            if (failure := run.failure()) is not None:
                tracker.warn(failure)


def fluid_bound_alongside(problem: Problem, tables: IntegerTables, options: SolveOptions, tracker: Tracker, until: float) -> None:
    """Start the fluid relaxation of every device in a worker that proves until `until`
    while the search phases run; the tracker takes its bound at each phase and at the end.

    On large problems the order search, which takes most of the time, runs on one core,
    and HiGHS's interior point method is as fast on one thread as on two (3.2 s a program
    at p = 8, 14.7 s at p = 32, either way): side by side each keeps its core, and the
    bound gets the whole time instead of a share after the search (20 s at p = 32 at a
    60 s limit, one program). With the time its own, the bisection goes on below a
    fitting first probe.
    """
    # Started and handed to the tracker with Ctrl-C held: one in between would leave the
    # worker running. Once the search closes the gap to FLUID_MIN_GAP the worker stops: its
    # core goes back to the search (CP-SAT's window search takes both).
    with interrupts_deferred():
        run = _fluid_run(
            problem, tracker, until, threads=1, below_probe="bisect", samples=FLUID_FIRST_SAMPLES, coarse=fluidbound.COARSE, refine=True
        )
        if run is not None:
            tracker.watch(run, FLUID_REASON, until_gap=FLUID_MIN_GAP)


def _stretchable(problem: Problem, options: SolveOptions) -> bool:
    # The order search's problems (one slice, no vocabulary passes) are the stretch's too.
    return _orderable_large(problem, options) and stretch.fewer_count(problem) is not None


def stretched_search(problem: Problem, tables: IntegerTables, options: SolveOptions, tracker: Tracker, until: float) -> None:
    """Search the problem with fewer microbatches (its starting points, then the order
    search), and offer its schedule stretched to all of them (optimizer.exact.stretch)."""
    seconds = until - time.monotonic()
    if seconds < STRETCH_MIN_SECONDS or tracker.best_value - tracker.bound <= STRETCH_MIN_GAP * tracker.best_value:
        return
    count = stretch.fewer_count(problem)
    assert count is not None, "runs only where there are fewer microbatches to search"
    small = stretch.fewer_microbatches(problem, count)
    inner = Tracker(options.objective, STRETCH_SEARCH_SHARE * seconds)
    starting_points(small, inner)
    if inner.best is not None and inner.left() > 0:
        order_search(small, integer_tables(small), options, inner, inner.deadline)
    if inner.best is None:
        return
    for name, orders in stretch.stretches(problem, inner.best, until):
        if orders_fit(problem, orders):
            tracker.offer(simulate(problem, orders), name)


def _more_blocks(problem: Problem, options: SolveOptions) -> bool:
    plain = problem.num_slices == 1 and problem.vocab_parallel is None
    return plain and vshape_only(problem) is None and leaves_blocks_out(problem)


def more_blocks(problem: Problem, tables: IntegerTables, options: SolveOptions, tracker: Tracker, until: float) -> None:
    """Offer the paper's V building blocks that v-auto leaves out on large problems, reordered."""
    for name, orders in more_reordered_blocks(problem, until):
        tracker.offer(simulate(problem, orders), name)


def periodic_patterns(problem: Problem, tables: IntegerTables, options: SolveOptions, tracker: Tracker, until: float) -> None:
    """Offer unrolled periodic patterns, shortest period first, until one fits the limit."""

    for name, orders in periodic_orders(
        problem, tables, deadline=until, seed=options.seed, threads=options.threads, fits=lambda orders: orders_fit(problem, orders)
    ):
        tracker.offer(simulate(problem, orders), name)


# The steps of `auto` after the starting points, in order. Adding a model or a heuristic
# is one module plus one line here.
PHASES: tuple[Phase, ...] = (
    # Tiny problems: the whole model first, for a short share; it usually proves the
    # optimum outright, and the phases below then never start.
    Phase("whole CP-SAT model (first try)", _tiny, QUICK_MODEL_SHARE, whole_model, needs_incumbent=False),
    # Under a tight memory limit the known schedules' steady state and warm-up are far
    # from the bound (V placement at V-Min's level: 25-30% bubble); moving single ops
    # and repeating swaps in every round shortens them, cheaply, for any placement.
    # On large problems the fluid bound proves in a worker of its own alongside the rest.
    Phase("fluid bound (every device, alongside the search)", _fluid_alongside, 1.0, fluid_bound_alongside),
    # The rest of the paper's V blocks, where v-auto reorders only the first few (above
    # 10,000 ops): after the fluid worker has started, so that its bound keeps its time
    # (p = 32, m = 96 at 20 activations: 3243.3 -> 3213.4 ms, where the order search from
    # v-auto's reached 3230.8 in 60 s).
    Phase("more of the paper's V blocks, reordered", _more_blocks, MORE_BLOCKS_SHARE, more_blocks),
    # Where the known steady state is far from the bound, a search on fewer microbatches
    # finds a better one, stretched to all of them (1.5B p8 m64 at V-Min's memory: 3576
    # after the order search, where the order search alone reached 3734).
    Phase("search on fewer microbatches, stretched", _stretchable, STRETCH_SHARE, stretched_search),
    Phase("order search", _orderable_large, ORDER_SEARCH_SHARE, order_search),
    Phase("order search", _orderable_small, ORDER_SEARCH_SHARE_SMALL, order_search),
    # At p = 8, m = 16 under a tight limit the relaxations lift the makespan bound from
    # 88.7 to 92.5 (optimum <= 94) in ~15 s, where the whole model proves nothing above
    # 88.7 in minutes; under the span objective one device alone proves ZB-H1 optimal at
    # 1F1B's memory on Zero Bubble's settings.
    # What the relaxations of single devices and their neighbours leave open on the V
    # placement at V-Half's memory and at p is the devices together (p = 4, m = 8 at
    # V-Half's: 12.7% -> 0.5%). On small problems one program first: where it cannot refute
    # 1.5% below the incumbent (V-Min's memory, where memory's discreteness binds) the
    # relaxations and the whole model get the time; larger ones run it alongside (above).
    Phase("fluid bound (every device)", _fluid_in_front, FLUID_SHARE, fluid_bound, min_seconds=fluid_program_seconds),
    Phase("device relaxations (lower bound)", _relaxable, RELAXATION_SHARE, relaxation_bounds),
    Phase("window search", _small, WINDOW_SHARE_SMALL, window_search),
    Phase("whole CP-SAT model", _small, 1.0, whole_model, needs_incumbent=False),
    Phase("periodic steady state", _large_unsliced, PERIODIC_SHARE, periodic_patterns),
    Phase("window search", _large, 1.0, window_search),
)

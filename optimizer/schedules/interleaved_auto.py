"""Automatic interleaved schedule: the interleaved walk shaped to any memory limit.

Interleaved zero bubble (optimizer.schedules.interleaved_zb) holds about p + (V-1)·g
chunk activations on device 0 (g: microbatches per round, p or more; m when m < p), interleaved 1F1B
more; below that neither fits and only list schedules did (p = 8, m = 24 on the Zero
Bubble paper's 1.5B timings at 6 activations: 1344.7 ms after 10 s of search). This
family searches the walk's shape under the limit, as the Zero Bubble paper's automatic
scheduler searches ZB-H1's and ZB-H2's:

* the round size g, from the rounds rule's (or p) down, larger first (a last round of
  fewer microbatches where g does not divide m): a device runs (V-1)·g forwards before
  its first backward can start, so smaller rounds fit in less memory, at the price of
  more waiting;
* the warm-up: one or two forwards more per device downstream (interleaved zero
  bubble's and interleaved 1F1B's);
* the W's kept pending after each B: r on device r (ZB-H1's) or none.

Warm-ups cut short to fit a limit were measured and left out: on Zero Bubble's settings
they were 2 to 6 times longer than a smaller round at its full warm-up (14.6B p16 m48 at
12 activations: 1698.7 ms with rounds of 8, 5118.8 with rounds of 12 cut to fit).
Memory depends on the order alone, so every shape is checked against the limit before
it is timed (first what its warm-up allocates, from counts, then its whole order); the
shapes of the two largest round sizes that fit are timed, the second only where the
first did not fit whole (a smaller round was never shorter there), and the one with the
shortest longest-device span is kept
(the Zero Bubble convention, as zb-auto and v-auto). A shape that cannot finish (rounds
smaller than p may deadlock) is skipped. Where none fits, the first shape that finishes
is returned, over the limit, as the hand-made families are. With a deadline
(time.monotonic()) the search stops once it has passed and a shape has been timed; past
it with none timed yet, the next shape that fits is returned untimed (the caller times
it), and with none that fits, the first shape.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from optimizer.errors import DeadlockError
from optimizer.ops import fusing_can_win, op_memory
from optimizer.problem import Problem, tolerant
from optimizer.schedule import fits_limits, longest_span, peak_memory
from optimizer.schedules.interleaved import Walk, family_walk, looped_only, rounds, walk, walk_sequence
from optimizer.schedules.registry import Generator, Keep, Orders
from optimizer.simulate import simulate_times

# Warm-up forwards per device downstream: interleaved 1F1B's 2, interleaved zero bubble's 1.
HOPS = (2, 1)
# Round sizes timed once one fits (see the module doc).
GROUPS_TIMED = 2


def shapes(problem: Problem) -> list[Walk]:
    """Every shape tried, largest rounds first (see the module doc): interleaved 1F1B's
    and interleaved zero bubble's own first where the rounds rule applies, so that the
    result is never longer than theirs where they fit; fused backwards too where a fused
    backward can beat B then W (optimizer.ops.fusing_can_win)."""
    p, m = problem.num_devices, problem.num_microbatches
    v = problem.num_stages // p
    tables = problem.tables()
    largest = rounds(p, m)
    found = [family_walk(problem, split=False), family_walk(problem, split=True)] if largest is not None else []
    keeps: list[tuple[int, ...] | None] = [tuple(range(p)), tuple(0 for _ in range(p))]
    if any(fusing_can_win(tables, s) for s in range(problem.num_stages)):
        keeps.append(None)
    top = largest[1] if largest is not None else p
    for group in range(min(m, max(top, p)), 0, -1):
        for hop in HOPS:
            warmup = tuple(min(hop * (p - 1 - r) + (v - 1) * group, m * v) for r in range(p))
            found += [Walk(group, warmup, deferred) for deferred in keeps if Walk(group, warmup, deferred) not in found]
    return found


def warm_up_held(problem: Problem, group: int) -> Callable[[int, int], float]:
    """held(r, k): what the first k forwards of device r allocate (a forward allocates
    at its start, nothing is freed before the first backward), from per-chunk counts."""
    tables = problem.tables()
    p, v = problem.num_devices, problem.num_stages // problem.num_devices
    counts = [[0] * v]
    for c, _ in walk_sequence(problem, group, forward=True):
        row = list(counts[-1])
        row[c] += 1
        counts.append(row)
    sizes = [[op_memory(tables, "F", c * p + r, 0) for c in range(v)] for r in range(p)]

    def held(r: int, k: int) -> float:
        row = counts[min(k, len(counts) - 1)]
        return sum(n * size for n, size in zip(row, sizes[r]))

    return held


def warm_up_fits(problem: Problem, shape: Walk, held: Callable[[int, int], float]) -> bool:
    """Whether every device's warm-up and the forward after it (all allocated before its
    first backward frees anything) fit its limit: necessary for the shape to fit, and
    cheap, so shapes far over the limit are never built."""
    limit = problem.tables().limit
    return all(held(r, shape.warmup[r] + 1) <= tolerant(limit[r]) for r in range(problem.num_devices))


def interleaved_auto(problem: Problem, deadline: float | None = None, keep: Keep | None = None) -> Orders:
    """The shortest fitting walk (see the module doc); `keep` hears each shorter one as it
    is found."""
    tables = problem.tables()
    best: tuple[float, Orders] | None = None
    fitting: list[int] = []  # round sizes with a shape that fits, in the order met
    whole: dict[int, bool] = {}  # round size -> every shape of it fitted and finished
    held: dict[int, Callable[[int, int], float]] = {}
    every = shapes(problem)

    def late() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    for shape in every:
        group = shape.group
        # Smaller rounds only wait more: they are tried only while the larger ones do not
        # all fit, and for at most GROUPS_TIMED round sizes that fit.
        if (late() and best is not None) or (group not in fitting and fitting and (len(fitting) == GROUPS_TIMED or whole[fitting[-1]])):
            break
        if group not in held:
            held[group] = warm_up_held(problem, group)
        whole.setdefault(group, True)
        orders = walk(problem, shape) if warm_up_fits(problem, shape, held[group]) else None
        if orders is None or not fits_limits([peak_memory(tables, ops) for ops in orders], tables.limit):
            whole[group] = False
            continue
        if late():
            return orders  # past the deadline with nothing timed yet: the first that fits, untimed
        try:
            timed = simulate_times(problem, orders)
        except DeadlockError:
            whole[group] = False
            continue
        if group not in fitting:
            fitting.append(group)
        span = longest_span(timed)
        if best is None or span < best[0] * (1 - 1e-9):  # relative: times may be in any unit
            best = (span, orders)
            if keep is not None:
                keep(orders)
    if best is not None:
        return best[1]
    # Nothing fits: the first shape that finishes, largest rounds first, over the limit
    # (smaller rounds would be no nearer to a fit worth having, and often cannot finish).
    for shape in every:
        orders = walk(problem, shape)
        if late():
            return orders  # untimed, over the limit: the caller times it (and says so if it cannot finish)
        try:
            simulate_times(problem, orders)
        except DeadlockError:
            continue
        return orders
    # Not met on any problem tried (p up to 8, m up to 3p, V = 2 and 3): rounds of p or
    # more microbatches (torch's) finish, and they are among the shapes.
    raise DeadlockError("interleaved-auto: every walk of the interleaved placement deadlocks on this problem", {})


GENERATOR = Generator(
    "interleaved-auto",
    "Automatic interleaved schedule for any memory limit: the interleaved zero-bubble walk with its rounds, warm-up and deferred W's fitted",
    interleaved_auto,
    looped_only,
    build_by=lambda problem, deadline, keep, abandoned: interleaved_auto(problem, deadline=deadline, keep=keep),
)

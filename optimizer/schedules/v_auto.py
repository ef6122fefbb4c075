"""Automatic scheduling on the V placement for any memory limit (after Qi et al. 2024,
"Pipeline Parallelism with Controllable Memory", NeurIPS, sections 3-4, and the ZB-V
schedule of "Zero Bubble Pipeline Parallelism", section 6).

The controllable-memory paper's point is that a building block's lifespan sets the peak
memory and fewer idle slots come with a longer lifespan. V-Min and V-Half are two points
of a family of blocks; this module searches that family for the block that best fits the
problem's limit, and keeps the best of:

* generalised building blocks: for device i, F of chunk 0 at a·i, F of chunk 1 after the
  turn at a(p-1) + e + (p-1-i), B of chunk 1 at that plus 1 + d + b·i, B of chunk 0
  after a turn gap g, falling back one slot per device (a, b: slopes 1 to 3; d: the delay
  at the bottom of the V; e, g: the turns). V-Min is (1, 1, d, 1, 1) and V-Half
  (2, 2, d, 2, 1). Blocks whose four ops collide modulo the 6-slot period are skipped;
  the others are ranked by their peak memory in the slot model (W's filling free slots,
  the problem's own memory deltas), and the largest that fit the limit are built with
  the shared squeezing of `building_block` and simulated;
* denser squeezes: where the limit leaves room above a constant-slope block's (or
  V-Half's) own peak, the same block squeezed up to the limit instead (in chunk
  activations, and in the problem's own memory changes), so that its warm-up and
  cool-down run denser than the block; this fills the levels between V-Half's and ZB-V's
  memory (14.6B p16 m48 at 13, 14, 15: 1737.0 -> 1704.5, 1674.3, 1644.6 ms) and helps
  between V-Min's and V-Half's at p = 8 (1.5B m24 at 7: 1314.0 -> 1277.9);
* bent blocks: the same with slopes that change once along the pipeline (a and b up to
  a bend at a quarter, half or three quarters of the devices, other slopes after it).
  Constant slopes give few memory levels (at p = 16 peaks of 6, 6.5, 7, then 9); a bend
  gives the levels between, where a limit between V-Min's and V-Half's otherwise gets
  V-Min's block (14.6B p16 m48 at a limit of 8: 2051.7 -> 2010.6 ms). They are built
  besides the constant-slope ones, not instead, on problems small enough to afford it;
* reordered blocks: the chosen blocks, V-Min's and (on small problems) the best-fitting
  blocks of the paper's own family (optimizer.schedules.block_family), repeated,
  squeezed and then reordered at both ends as the paper describes
  (optimizer.schedules.block_reorder), within their own peak and up to the limit. They
  fill the levels between the blocks' own (14.6B p16 m48 at 8, 12, 14 activations:
  2010.6, 1729.5, 1674.3 -> 1957.0, 1675.2, 1613.7 ms) and gain 0.1-2% at V-Min's and
  V-Half's levels (1.5B p8 m24 at V-Min's 4: 1609.1 -> 1573.6);
* ZB-V's handcrafted order, when it fits, and then also the ZB-V-style rounds of
  optimizer.schedules.v_greedy (0.05-0.4% shorter than ZB-V at its memory);
* the memory-aware list scheduler (`greedy`), which uses spare memory for a deeper
  warm-up at limits above ZB-V's and always finds an order that fits when any does.

Every candidate is simulated with the real times; the shortest longest-device span among
those within the limit wins (the Zero Bubble objective). V-Min's, V-Half's and ZB-V's
blocks are always among the candidates when they fit, so the result is never worse than
theirs, nor than v-greedy's where ZB-V fits or the problem is small (below ZB-V's memory
v-greedy's rounds cannot fill the V and are far behind the blocks: 1,967.7 ms against 1,737.0
at p = 16, m = 48, limit 14).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain, product

from optimizer.errors import DeadlockError, InfeasibleError
from optimizer.problem import Problem
from optimizer.schedule import fits_limits, longest_span, peak_memory
from optimizer.schedules.block_family import paper_blocks_within
from optimizer.schedules.block_reorder import reordered_block_orders
from optimizer.schedules.building_block import building_block_orders, device_deltas
from optimizer.schedules.greedy import greedy
from optimizer.schedules.registry import Abandoned, Generator, Keep, Orders
from optimizer.schedules.support import vshape_only
from optimizer.schedules.v_greedy import v_greedy
from optimizer.schedules.v_half import v_half_offsets
from optimizer.schedules.v_min import v_min_offsets
from optimizer.schedules.zb_v import zb_v
from optimizer.simulate import simulate_times

_PERIOD = 6
_REL_TOLERANCE = 1e-9
# Squeezing a block costs about a second at p = 32, m = 128; above this many ops only the
# best-ranked blocks are built.
_MANY_OPS = 10_000
_BLOCKS_BUILT_SMALL, _BLOCKS_BUILT_LARGE = 6, 2
# Bent blocks built besides those, on problems up to _MANY_OPS ops only (above it the
# automatic scheduler must stay well inside a 5 s limit at p = 32).
_BENT_BUILT_SMALL = 6
# Where the slopes may change, as shares of the devices.
_BENDS = (0.25, 0.5, 0.75)
_SLOPES = (1, 2, 3)
# Blocks of the controllable-memory paper's own family reordered for the limit (small
# problems): the 8 with the highest steady peak that fit. Against reordering every block
# of the family that fits, on the paper's timings at p = 4 to 12 and every limit from
# V-Min's to p - 1 (22 cases), the best block was among the first 7 (the 7th once: 1284.7
# against 1284.9 ms at p = 12, m = 36, limit 8); at p = 16 among the first 6.
_PAPER_BLOCKS_REORDERED = 8
# Above 10,000 ops the 2 best (each costs about 1 s at p = 32, m = 96, ranking the family
# 0.16 s once); the solver reorders the others up to the 8th later, alongside its bound
# (`more_reordered_blocks`): at p = 32, m = 96 the 3rd to 7th win at every limit from 12
# to 28 activations (at 20: 3243.3 -> 3213.4 ms).
_PAPER_BLOCKS_REORDERED_LARGE = 2
# What reordering one block and timing its orders costs, per op (about 1 s at p = 32, m =
# 96 on 2 cores, with room for a slower machine).
_BLOCK_SECONDS_PER_OP = 1e-4


@dataclass(frozen=True)
class Block:
    """Slot offsets [F0, F1, B1, B0] per device and the block's estimated peak per device."""

    offsets: tuple[tuple[int, ...], ...]
    peak: tuple[float, ...]
    bent: bool = False


def wave(p: int, slope: int, after: int | None = None, bend: int = 0) -> list[int]:
    """Slot of each device along a wave: `slope` slots a device up to device `bend`,
    `after` slots a device beyond it (the same slope when None)."""
    positions = [0]
    for i in range(1, p):
        positions.append(positions[-1] + (slope if after is None or i <= bend else after))
    return positions


def block_offsets(forward: list[int], backward: list[int], d: int, g: int, e: int) -> list[list[int]]:
    """[F0, F1, B1, B0] slots per device for chunk-0 forward slots `forward` and chunk-1
    backward slots `backward` (both from `wave`), bottom delay d, turns g and e."""
    p = len(forward)
    f1_bottom = forward[-1] + e + (p - 1)  # F of chunk 1 on device 0: the bottom of the V
    b1_top = f1_bottom + 1 + d + backward[-1]
    return [[forward[i], forward[-1] + e + (p - 1 - i), f1_bottom + 1 + d + backward[i], b1_top + g + (p - 1 - i)] for i in range(p)]


def slot_model_peak(problem: Problem, offsets: list[list[int]], m: int) -> list[float]:
    """Per device, the block's peak memory before squeezing: ops at their slots, each free
    slot running the oldest pending W (squeezing never raises this peak)."""
    tables, p = problem.tables(), problem.num_devices
    peaks = []
    for i, row in enumerate(offsets):
        chunk = (i, 2 * p - 1 - i)
        at: dict[int, tuple[str, int]] = {}
        for kind, stage, start in zip("FFBB", (chunk[0], chunk[1], chunk[1], chunk[0]), row):
            for j in range(m):
                at[start + _PERIOD * j] = (kind, stage)
        usage = peak = 0.0
        pending: list[int] = []
        slot, end, head = 0, max(at) + 1, 0
        while slot < end or head < len(pending):
            op = at.get(slot)
            if op is None:
                if head < len(pending):
                    usage += tables.mem_backward_weight[pending[head]]
                    head += 1
            elif op[0] == "F":
                usage += tables.mem_forward[op[1]]
            else:
                usage += tables.mem_backward_input[op[1]]
                pending.append(op[1])
            peak = max(peak, usage)
            slot += 1
        peaks.append(peak)
    return peaks


def _peak_microbatches(p: int, m: int) -> int:
    """Microbatches enough for the slot model to reach a block's peak: it is reached once
    the lifespans overlap fully."""
    return min(m, 2 * p + 2)


def candidate_blocks(problem: Problem, bent: bool = False) -> list[Block]:
    """Collision-free blocks of the family, with V-Min's and V-Half's own offsets; with
    `bent`, the bent blocks that are not already among those."""
    p, m = problem.num_devices, problem.num_microbatches
    m_est = _peak_microbatches(p, m)
    turns = list(product(range(_PERIOD), (1, 2, 3), (1, 2, 3)))
    constant = [v_min_offsets(p), v_half_offsets(p)]
    constant += [block_offsets(wave(p, a), wave(p, b), *t) for a, b in product(_SLOPES, _SLOPES) for t in turns]
    seen = {tuple(tuple(r) for r in rows) for rows in constant}
    families: list[list[list[int]]] = constant
    if bent:
        bends = sorted({round(p * share) for share in _BENDS} - {0, p - 1})
        families = [
            block_offsets(wave(p, a, a2, bend), wave(p, b, b2, bend), *t)
            for bend in bends
            for a, a2, b, b2 in product(_SLOPES, repeat=4)
            if (a, b) != (a2, b2)
            for t in turns
        ]
    blocks, kept = [], set()
    for rows in families:
        key = tuple(tuple(r) for r in rows)
        if key in kept or (bent and key in seen) or any(len({x % _PERIOD for x in r}) < 4 for r in rows):
            continue
        kept.add(key)
        blocks.append(Block(key, tuple(slot_model_peak(problem, rows, m_est)), bent))
    return blocks


def _chunk_caps(problem: Problem) -> list[float]:
    """Per device, the limit in chunk activations: its limit over its larger forward allocation."""
    tables, p = problem.tables(), problem.num_devices
    caps = []
    for r, limit in enumerate(tables.limit):
        forward = max(tables.mem_forward[r], tables.mem_forward[2 * p - 1 - r])
        # No limit (infinity) stays infinite: math.floor of it raised OverflowError.
        caps.append(math.floor(limit / forward + _REL_TOLERANCE) if forward > 0 and math.isfinite(limit) else limit)
    return caps


def _limit_cap(problem: Problem) -> int | None:
    """The fewest chunk activations a device may hold (None: no limit)."""
    chunk_caps = _chunk_caps(problem)
    return int(min(chunk_caps)) if all(math.isfinite(c) for c in chunk_caps) else None


def _fitting_family(problem: Problem, limit_cap: int) -> list[tuple[tuple[int, ...], ...]]:
    """The paper's family blocks whose steady peak fits `limit_cap`, highest peak first."""
    return list(paper_blocks_within(problem.num_devices, limit_cap))


def _denser_squeezes(problem: Problem) -> list[tuple[list[float], list[tuple[float, ...]] | None]]:
    """(caps, deltas) of the squeezes up to the limit: in chunk activations and in the
    problem's own memory changes."""
    tables, p = problem.tables(), problem.num_devices
    deltas = [device_deltas(tables, p, r) for r in range(p)]
    return [(_chunk_caps(problem), None), (list(tables.limit), deltas)]


def _has_room(problem: Problem, peaks: tuple[float, ...]) -> bool:
    """Whether the limit leaves every device room for one more forward above the block's peak."""
    tables, p = problem.tables(), problem.num_devices
    room = [limit - peak for limit, peak in zip(tables.limit, peaks)]
    return all(r >= max(tables.mem_forward[d], tables.mem_forward[2 * p - 1 - d]) * (1 - _REL_TOLERANCE) for d, r in enumerate(room))


def _fits(problem: Problem, peaks: tuple[float, ...] | list[float]) -> bool:
    limits = problem.tables().limit
    return fits_limits(peaks, limits)


def _reordered_chosen(
    problem: Problem,
    chosen: list[tuple[tuple[int, ...], ...]],
    v_min: tuple[tuple[int, ...], ...],
    small: bool,
    due: Callable[[], bool],
) -> Iterator[Orders]:
    """The chosen blocks and V-Min's with their warm-up and cool-down reordered
    (optimizer.schedules.block_reorder), each with and without idle filling.

    They pay between the blocks' levels (p16 m48 at 8: 2010.6 -> 1957.0 ms), and built up to
    the limit where it is above a block's own peak (at 14: 1678.1 -> 1635.5; that cap can
    also lose, 7724.0 -> 7821.8 ms at p32 m256 limit 24, so small problems get both). The
    blocks: the chosen ones and V-Min's (V-Half's never won reordered: at its level the
    chosen blocks reordered without idle filling do, p16 m48 at 9: 1773.1 -> 1767.3); above
    10,000 ops the best-ranked one alone (a reordering and its two timings take about 0.4 s
    at p = 32, m = 256, and v-auto must stay inside a 5 s solve). No block is built once
    `due()`.
    """
    limit_cap = _limit_cap(problem)
    caps = [0, limit_cap] if small and limit_cap is not None else [0]
    for offsets in [*chosen, v_min] if small else chosen[:1] or [v_min]:
        if due():
            return
        yield from reordered_block_orders([list(r) for r in offsets], problem.num_microbatches, caps)


def _reordered_family(problem: Problem, small: bool, due: Callable[[], bool]) -> Iterator[Orders]:
    """The paper's own family blocks (optimizer.schedules.block_family) reordered, whose
    shifts meet other memory levels: the blocks whose steady peak fits the limit, highest
    first (p16 m48 at 10, 13, 14: 1748.8 -> 1736.9, 1655.1 -> 1644.4, 1635.5 -> 1613.7 ms;
    p32 m96 at 14, 16, 28: 3851.4 -> 3767.4, 3631.2, 2987.7), fewer above 10,000 ops. No
    block is built once `due()`."""
    limit_cap = _limit_cap(problem)
    if limit_cap is None or due():
        return
    for offsets in _fitting_family(problem, limit_cap)[: _PAPER_BLOCKS_REORDERED if small else _PAPER_BLOCKS_REORDERED_LARGE]:
        if due():
            return
        yield from reordered_block_orders([list(r) for r in offsets], problem.num_microbatches)


def v_auto(
    problem: Problem,
    bends: bool = True,
    denser: bool = True,
    reorder: bool = True,
    deadline: float | None = None,
    keep: Keep | None = None,
    abandoned: Abandoned | None = None,
) -> Orders:
    """The best V-shape order within the limit (see the module docstring); `bends=False`
    leaves the bent blocks out (what the constant-slope family alone reaches),
    `denser=False` the squeezes up to the limit, and `reorder=False` the reordered blocks.
    With a `deadline` (time.monotonic()) no further candidate is built once one fits and
    the longest step so far would end past it, and none is timed once it has passed: the
    candidates come cheapest and strongest first (ZB-V, the chosen blocks, V-Min's and
    V-Half's; above 10,000 ops the first block reordered right after it, and where ZB-V
    fits the rounds and the list scheduler before the blocks), so a solver's time limit
    holds at the largest sizes. `keep` hears each shorter order that fits as it is found;
    once `abandoned()` is true (the caller stopped waiting) it raises TimeoutError at its
    next step."""
    p, m = problem.num_devices, problem.num_microbatches
    tables = problem.tables()
    best: tuple[float, Orders] | None = None

    def passed() -> bool:
        return deadline is not None and best is not None and time.monotonic() >= deadline

    def give_up_if_abandoned() -> None:
        """Once the caller (the solver's starting points) has stopped waiting, a build
        going on in its thread would only slow the solver down: at p = 32, m = 256 at
        V-Min's memory and a 1 s limit, v-auto went on for 5 s with nothing that fit, and
        the solve took 4.3-6.3 s instead of 2.5-2.7."""
        if abandoned is not None and abandoned():
            raise TimeoutError("v-auto: abandoned by its caller")

    # The longest time between two of due()'s checks so far: a candidate is not started
    # when one more such step would end past the deadline (at p = 32, m = 256 a reordered
    # block takes 0.5-1 s, and one started just before the deadline kept the build 0.8 s
    # past it, on a core the solver needed for its final timing).
    last_check, longest_step = time.monotonic(), 0.0

    def due() -> bool:
        nonlocal last_check, longest_step
        give_up_if_abandoned()
        now = time.monotonic()
        longest_step, last_check = max(longest_step, now - last_check), now
        return deadline is not None and best is not None and now + longest_step >= deadline

    def peaks(orders: Orders) -> list[float]:
        return [peak_memory(tables, ops) for ops in orders]

    def consider(orders: Orders) -> bool:
        """Keep `orders` if it fits and is the shortest so far; False if it cannot finish.
        Memory depends on the order alone, so what does not fit is not timed; nothing is
        once the deadline has passed."""
        nonlocal best
        give_up_if_abandoned()
        if passed() or not fits_limits(peaks(orders), tables.limit):
            return True
        try:
            timed = simulate_times(problem, orders)
        except DeadlockError:
            return False
        span = longest_span(timed)
        if best is None or span < best[0]:
            best = (span, orders)
            if keep is not None:
                keep(orders)
        return True

    zb_v_orders = zb_v(problem)
    zb_v_runs = consider(zb_v_orders)
    zb_v_peaks = peaks(zb_v_orders)
    zb_v_fits = zb_v_runs and fits_limits(zb_v_peaks, tables.limit)
    # V-Min's and V-Half's blocks are always built (the slot-model peak only estimates the
    # real one), so the result is never worse than theirs where they fit. Where ZB-V fits,
    # the generalised blocks (below V-Half's memory or just above) do not come near it.
    known = [tuple(tuple(r) for r in rows) for rows in (v_min_offsets(p), v_half_offsets(p))]
    small = not leaves_blocks_out(problem)
    chosen: list[Block] = []
    if not zb_v_fits:
        for bent, budget in (
            (False, _BLOCKS_BUILT_SMALL if small else _BLOCKS_BUILT_LARGE),
            (True, _BENT_BUILT_SMALL if small and bends else 0),
        ):
            if budget == 0:
                continue
            fitting = [b for b in candidate_blocks(problem, bent) if _fits(problem, b.peak)]
            chosen += [b for b in sorted(fitting, key=lambda b: -max(b.peak)) if b.offsets not in known][:budget]

    def squeeze(blocks: list[tuple[tuple[int, ...], ...]]) -> None:
        for offsets in blocks:
            if due():
                return
            consider(building_block_orders([list(r) for r in offsets], m))

    # The ZB-V-style rounds fill the V only where ZB-V's memory fits (there they are
    # 0.05-0.4% shorter than ZB-V); below it they are far behind the blocks, and they
    # are built there only where they cost nothing (0.03 s at p = 8, 1.2 s at p = 32).
    def rounds() -> None:
        if (zb_v_fits or small) and not due():
            with contextlib.suppress(InfeasibleError):  # its rounds stuck: the other candidates stand
                consider(v_greedy(problem))

    # The list scheduler pays where memory exceeds ZB-V's (a deeper warm-up), and it is
    # the fallback that fits whenever any split-backward schedule can; at tighter limits the blocks
    # beat it by far, so it does not run there.
    above_zb_v = zb_v_runs and any(limit > peak * (1 + _REL_TOLERANCE) for limit, peak in zip(tables.limit, zb_v_peaks))

    def listed() -> None:
        give_up_if_abandoned()
        if best is None or (above_zb_v and not due()):
            try:
                # Its policies end before the deadline by one step (a policy takes 0.6 s at
                # p = 32, m = 256), so that its orders are still timed.
                consider(greedy(problem, None if deadline is None else deadline - longest_step))
            except InfeasibleError:
                if best is None:
                    raise

    chosen_offsets = [b.offsets for b in chosen]
    reordering = reorder and not zb_v_fits
    if small:
        squeeze(chosen_offsets + known)
        if reordering:
            for orders in chain(_reordered_chosen(problem, chosen_offsets, known[0], small, due), _reordered_family(problem, small, due)):
                consider(orders)
    elif zb_v_fits:
        # Above 10,000 ops where ZB-V fits, the rounds and then the list scheduler (above
        # ZB-V's memory) come before V-Min's and V-Half's blocks, which do not come near
        # ZB-V there. The rounds are the shorter and the cheaper of the two on every such
        # setting of Zero Bubble's (p16 m128 to p32 m256 at limits p and 2p: e.g. p32 m256
        # at 2p 7262.0 ms in 0.5 s against the list scheduler's 7370.3 in 0.8 s; at p
        # 7420.2 in 1.3 s against 7740.7 in 1.9 s), so a solve cut short still has them.
        rounds()
        listed()
        squeeze(known)
    else:
        # Above 10,000 ops v-auto may not get to every candidate in a short solve (2-3 s of a
        # 5 s limit at p = 32, m = 256): the best-ranked block reordered comes right after the
        # block itself, ahead of V-Half's, V-Min's and the other chosen ones. It was the
        # shortest at V-Min's and V-Half's levels at p32 m256 (9320.1 and 7845.5 ms against
        # V-Half's 7858.0 and the first block's 9338.6) and p16 m128 at V-Half's (4228.2
        # against 4233.7), and came after them, past a 5 s solve's deadline.
        lead = chosen_offsets[:1] or known[:1]  # V-Min's where no block was chosen
        squeeze(lead)
        if reordering:
            for orders in _reordered_chosen(problem, chosen_offsets, known[0], small, due):
                consider(orders)
        squeeze([b for b in [known[1], known[0], *chosen_offsets[1:]] if b not in lead])
        if reordering:
            for orders in _reordered_family(problem, small, due):
                consider(orders)
    # Memory above a block's own peak: squeezed up to the limit instead, its warm-up and
    # cool-down run denser (p16 m48 at limit 15: 1737.0 -> 1644.6 ms). The constant-slope
    # blocks and V-Half's gain there (the bent ones did not on the paper's settings); a
    # block without room for one more activation on some device would squeeze as before.
    if denser and small and not zb_v_fits and all(math.isfinite(x) for x in tables.limit):
        v_half = Block(known[1], tuple(slot_model_peak(problem, v_half_offsets(p), _peak_microbatches(p, m))))
        squeezes = _denser_squeezes(problem)
        for block in [b for b in chosen if not b.bent] + [v_half]:
            if _has_room(problem, block.peak):
                for caps, deltas in squeezes:
                    if not due():
                        consider(building_block_orders([list(r) for r in block.offsets], m, caps, deltas))
    if small or not zb_v_fits:
        rounds()
        listed()
    if best is None:
        raise InfeasibleError("v-auto: no V-shape schedule fits the memory limit")
    return best[1]


def leaves_blocks_out(problem: Problem) -> bool:
    """Whether `v_auto` reorders fewer of the paper's blocks than it would on a smaller
    problem (above 10,000 ops)."""
    return 6 * problem.num_devices * problem.num_microbatches > _MANY_OPS


def more_reordered_blocks(problem: Problem, deadline: float) -> Iterator[tuple[str, Orders]]:
    """On problems above 10,000 ops, the paper's family blocks `v_auto` leaves out (the 3rd
    to 8th best-fitting), reordered, each as (name, orders) within the limit, for as long
    as the next one is expected to end before `deadline` (time.monotonic()). Nothing
    where `v_auto` reorders them itself (smaller problems), where ZB-V fits (the blocks
    do not come near it) or where there is no limit."""
    if not leaves_blocks_out(problem) or vshape_only(problem) is not None:
        return
    tables = problem.tables()
    limit_cap = _limit_cap(problem)
    if limit_cap is None or fits_limits([peak_memory(tables, ops) for ops in zb_v(problem)], tables.limit):
        return

    def block_ends_in_time() -> bool:
        return time.monotonic() + _BLOCK_SECONDS_PER_OP * problem.num_ops <= deadline

    if not block_ends_in_time():  # ranking the family (1.4 s at p = 32) would be for nothing
        return
    fitting = _fitting_family(problem, limit_cap)
    for rank in range(_PAPER_BLOCKS_REORDERED_LARGE, min(_PAPER_BLOCKS_REORDERED, len(fitting))):
        if not block_ends_in_time():
            return
        for orders in reordered_block_orders([list(r) for r in fitting[rank]], problem.num_microbatches):
            if fits_limits([peak_memory(tables, ops) for ops in orders], tables.limit):
                yield f"v-auto's family block {rank + 1}, reordered", orders


GENERATOR = Generator(
    "v-auto",
    "Automatic V-shape schedule for the memory limit: building blocks searched, squeezed and reordered between V-Min and ZB-V, "
    "ZB-V-style rounds, list scheduler",
    v_auto,
    vshape_only,
    build_by=lambda problem, deadline, keep, abandoned: v_auto(problem, deadline=deadline, keep=keep, abandoned=abandoned),
)

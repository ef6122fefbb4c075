"""A round-based greedy on the V placement, in the spirit of the automatic ZB-V scheduler
of the Zero Bubble authors (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 6),
for any memory limit, uneven stages and transfer time.

Device d holds chunk 0 (stage d, forwards flow d-1 -> d) and chunk 1 (stage 2p-1-d,
forwards flow d+1 -> d). Every op is timed as it is placed (ASAP, as the simulator times
the final order). The order is built in three parts:

* Warm-up down the V: microbatch 0's chunk-0 forward runs down the devices. Then, from the
  last device up, each device runs chunk-0 forwards of further microbatches (on itself and
  every device before it, so their inputs exist) while they end before its chunk-1 forward
  of microbatch 0 can arrive and while it keeps room for 2 + 2d more activations (the
  chunk-1 forwards coming back, more on the devices nearer the turn), then that chunk-1
  forward.
* Filling the V: device by device, later devices catch up with their upstream neighbour's
  forward count, alternating chunk-0 forwards (down the devices) and chunk-1 forwards (up
  them), as far as memory allows.
* Rounds: each device runs one backward and then one forward per round. The backward is
  chunk 1's (it starts the microbatch's way back) unless chunk 0 is behind it and its
  input already exists; the forward is chunk 1's when its input exists, else chunk 0's.
  Before either, pending W's fill the wait for its input: a W that ends before the input
  arrives always runs, one that would overrun it runs when the wait exceeds the device's
  idle allowance (knobs: `fill_before_chunk1_b` for the chunk-1 backward, `fill_before_f`
  for forwards; the chunk-0 backward, which releases the microbatch's activation, always
  fills). W's are forced first whenever a forward or backward would not fit in memory.

The allowance of a device is the worst idle time of any device so far; a second pass
lets each device idle at least as long as the first pass's worst idle minus its own
(devices that idled less may idle more), and is kept when its span is shorter (small
problems only: it rarely helps). The four knob settings
are run and the order with the shortest longest-device span is kept.

Where the limit leaves room for ZB-V's p microbatches (2p chunk activations) on the first
device, this is 0.05-0.4% shorter than the handcrafted ZB-V on Zero Bubble's profiled
settings; below that the warm-up cannot fill the V and the building blocks of
optimizer.schedules.v_auto are far better (v-auto keeps whichever is shorter).
"""

from __future__ import annotations

import math
from collections import deque
from itertools import product

from optimizer.errors import InfeasibleError
from optimizer.ops import Op
from optimizer.problem import Problem, tolerant
from optimizer.schedules.registry import Generator, Orders
from optimizer.schedules.support import vshape_only

# Room kept on device d during the warm-up, in chunk-0 activations: 2 + 2d (the chunk-1
# forwards that will come back before its first backward). Other slopes measured on the
# paper's settings at limit p: (2, 1), (3, 2), (4, 2) and (2, 3) are never shorter (at
# best equal at p = 8; 0.2% to more than 2x longer at p = 16 and 32), and (1, 1), (0, 2)
# and (1, 2) find no order within the limit at p = 16 and 32.
_RESERVE = (2, 2)
# Passes with per-device idle allowances (the second already finds what further passes
# would: the allowance stops changing). The second pass shortened 3 of 300 random V
# problems and none of the paper's 24 settings at limits p and 2p, so above _MANY_OPS
# (where each run costs about 0.1 s per 10,000 ops) only the first runs.
_PASSES = 2
_MANY_OPS = 10_000

# A device's ops by role: forwards of chunk 0 and 1, backwards of chunk 0 and 1, W's.
F0, F1, B0, B1 = "F0", "F1", "B0", "B1"


class _Stuck(Exception):
    """A run whose rounds can no longer place an op (memory, or inputs that never come)."""


class _Abandoned(Exception):
    """A run that can no longer beat the best span so far."""


class _Build:
    """One run: per-device clocks, memory, counts and the orders."""

    def __init__(
        self,
        problem: Problem,
        fill_before_chunk1_b: bool,
        fill_before_f: bool,
        allowance: list[float] | None = None,
        cutoff: float = math.inf,
    ):
        tables = problem.tables()
        self.cutoff = cutoff
        self.p, self.m, self.comm = problem.num_devices, problem.num_microbatches, problem.comm_time
        self.fill_before_chunk1_b = fill_before_chunk1_b
        self.fill_before_f = fill_before_f
        self.cost = {"F": tables.forward, "B": tables.backward_input, "W": tables.backward_weight}
        self.delta = {"F": tables.mem_forward, "B": tables.mem_backward_input, "W": tables.mem_backward_weight}
        self.limit = [tolerant(x) for x in tables.limit]
        p = self.p
        self.extra_allowance = allowance or [0.0] * p
        self.done = [dict.fromkeys((F0, F1, B0, B1), 0) for _ in range(p)]
        self.free_at = [0.0] * p
        self.used = [0.0] * p
        self.idle = [0.0] * p
        self.worst_idle = 0.0
        self.first_start = [0.0] * p
        # Work each device has left: with its span so far, a bound on its final span.
        self.work_left = [self.m * sum(self.cost[kind][self.stage(d, role)] for kind in "FBW" for role in (F0, F1)) for d in range(p)]
        self.pending_w: list[deque[tuple[int, int]]] = [deque() for _ in range(p)]  # (stage, mb) of B's without W
        self.end: dict[tuple[str, int, int], float] = {}
        self.orders: Orders = [[] for _ in range(p)]

    # -- the V ---------------------------------------------------------------------------

    def stage(self, device: int, role: str) -> int:
        return device if role in (F0, B0) else 2 * self.p - 1 - device

    def input_of(self, device: int, role: str, mb: int) -> tuple[tuple[str, int, int], float] | None:
        """The op whose end (key) and the transfer after it an op waits for (None: nothing)."""
        last = self.p - 1
        if role == F0:
            return ((F0, device - 1, mb), self.comm) if device > 0 else None
        if role == F1:
            return ((F1, device + 1, mb), self.comm) if device < last else ((F0, device, mb), 0.0)
        if role == B1:
            return ((B1, device - 1, mb), self.comm) if device > 0 else ((F1, device, mb), 0.0)
        return ((B0, device + 1, mb), self.comm) if device < last else ((B1, device, mb), 0.0)

    def arrival(self, device: int, role: str) -> float | None:
        """When the next op of `role` on `device` may start by its input (None: not placed)."""
        found = self.input_of(device, role, self.done[device][role])
        if found is None:
            return -math.inf
        key, transfer = found
        end = self.end.get(key)
        return None if end is None else end + transfer

    # -- placing ops ---------------------------------------------------------------------

    def fits(self, device: int, role: str) -> bool:
        kind = role[0]
        return self.used[device] + max(0.0, self.delta[kind][self.stage(device, role)]) <= self.limit[device]

    def put(self, device: int, role: str) -> None:
        mb = self.done[device][role]
        arrival = self.arrival(device, role)
        if mb >= self.m or arrival is None or not self.fits(device, role):
            raise _Stuck
        kind, stage = role[0], self.stage(device, role)
        self._place(device, kind, stage, mb, arrival)
        self.end[role, device, mb] = self.free_at[device]
        self.done[device][role] += 1
        if kind == "B":
            self.pending_w[device].append((stage, mb))

    def put_w(self, device: int) -> None:
        stage, mb = self.pending_w[device].popleft()
        self._place(device, "W", stage, mb, -math.inf)

    def _place(self, device: int, kind: str, stage: int, mb: int, arrival: float) -> None:
        start = self.free_at[device]
        if self.orders[device] and arrival > start:
            self.idle[device] += arrival - start
            self.worst_idle = max(self.worst_idle, self.idle[device])
        start = max(start, arrival)
        if not self.orders[device]:
            self.first_start[device] = start
        self.free_at[device] = start + self.cost[kind][stage]
        self.work_left[device] -= self.cost[kind][stage]
        self.used[device] += self.delta[kind][stage]
        self.orders[device].append(Op(kind, stage, mb))

    def make_room(self, device: int, role: str) -> bool:
        """Force W's until the op fits in memory; False when even that is not enough."""
        while not self.fits(device, role) and self.pending_w[device]:
            self.put_w(device)
        return self.fits(device, role)

    def fill_wait(self, device: int, arrival: float, overrun: bool) -> None:
        """W's into the wait before an input arriving at `arrival` (see the module doc)."""
        if not math.isfinite(arrival):
            return
        pending = self.pending_w[device]
        while pending and self.free_at[device] + self.cost["W"][pending[0][0]] <= arrival:
            self.put_w(device)
        allowance = max(self.worst_idle, self.extra_allowance[device]) - self.idle[device]
        if overrun and pending and arrival - self.free_at[device] > allowance:
            self.put_w(device)

    # -- the three parts -----------------------------------------------------------------

    def warm_up(self) -> None:
        p, m = self.p, self.m
        for device in range(p):
            self.put(device, F0)
        for device in range(p - 1, -1, -1):
            if device < p - 1:
                arrival = self.end[F1, device + 1, 0] + self.comm
                keep = (_RESERVE[0] + _RESERVE[1] * device) * self.delta["F"][device]
                while (
                    self.done[device][F0] < m
                    and self.used[device] + keep <= self.limit[device]
                    and self.free_at[device] + self.cost["F"][device] <= arrival
                    and all(self.fits(d, F0) for d in range(device + 1))
                ):
                    for d in range(device + 1):
                        self.put(d, F0)
            self.put(device, F1)

    def fill_v(self) -> None:
        m, role = self.m, F0
        for device in range(1, self.p):
            here, before = self.done[device], self.done[device - 1]
            while here[F0] + here[F1] < before[F0] + before[F1] or here[F1] <= before[F1] < m:
                devices = range(device, self.p) if role == F0 else range(self.p - 1, device - 1, -1)
                placed = False
                for d in devices:
                    if self.done[d][role] < m and self.fits(d, role) and self.arrival(d, role) is not None:
                        self.put(d, role)
                        placed = True
                if not placed and role == F1:
                    break
                role = F1 if role == F0 else F0

    def backward_role(self, device: int) -> str:
        done = self.done[device]
        if done[B0] >= done[B1]:
            return B1
        if device == self.p - 1 or done[B1] >= self.m or (B0, device + 1, done[B0]) in self.end:
            return B0
        return B1

    def forward_role(self, device: int) -> str | None:
        done = self.done[device]
        if done[F1] >= done[F0]:
            return F0
        if device == self.p - 1 or (F1, device + 1, done[F1]) in self.end:
            return F1
        if done[F0] < self.m and (device == 0 or (F0, device - 1, done[F0]) in self.end):
            return F0
        return None

    def round(self) -> bool:
        """One backward and one forward per device where possible; False: nothing placed."""
        p, m = self.p, self.m
        placed = False
        roles = [(d, self.backward_role(d)) for d in range(p)]
        # Chunk 0's backwards flow up the devices, chunk 1's down them.
        ordered = [(d, r) for d, r in reversed(roles) if r == B0] + [(d, r) for d, r in roles if r == B1]
        for device, role in ordered:
            if self.done[device][role] >= m or not self.make_room(device, role):
                continue
            arrival = self.arrival(device, role)
            if arrival is None:
                continue
            self.fill_wait(device, arrival, role == B0 or self.fill_before_chunk1_b)
            self.put(device, role)
            placed = True
        for device in range(p):
            if self.done[device][F1] >= m:
                continue
            forward = self.forward_role(device)
            if forward is None or not self.make_room(device, forward):
                continue
            arrival = self.arrival(device, forward)
            if arrival is None:
                continue
            self.fill_wait(device, arrival, self.fill_before_f)
            self.put(device, forward)
            placed = True
        return placed

    def run(self) -> Orders:
        self.warm_up()
        self.fill_v()
        while any(self.done[d][B0] < self.m for d in range(self.p)):
            if not self.round():
                raise _Stuck
            if any(end - start + left >= self.cutoff for end, start, left in zip(self.free_at, self.first_start, self.work_left)):
                raise _Abandoned
        for device in range(self.p):
            while self.pending_w[device]:
                self.put_w(device)
        return self.orders

    def longest_span(self) -> float:
        return max(end - start for end, start in zip(self.free_at, self.first_start))


def v_greedy(problem: Problem) -> Orders:
    """The shortest order of the knob grid and its allowance passes (see the module doc)."""
    best: tuple[float, Orders] | None = None
    passes = _PASSES if 6 * problem.num_devices * problem.num_microbatches <= _MANY_OPS else 1
    for before_b1, before_f in product((True, False), repeat=2):
        allowance: list[float] | None = None
        last_worst = math.inf
        for _ in range(passes):
            cutoff = math.inf if best is None else best[0] * (1 - 1e-12)
            build = _Build(problem, before_b1, before_f, allowance, cutoff)
            try:
                orders = build.run()
            except (_Stuck, _Abandoned):
                break
            if build.worst_idle >= last_worst:
                break
            span = build.longest_span()
            if best is None or span < best[0]:
                best = (span, orders)
            last_worst = build.worst_idle
            allowance = [build.worst_idle - idle for idle in build.idle]
    if best is None:
        raise InfeasibleError("v-greedy: its rounds cannot place every op within the memory limit; v-auto covers tighter limits")
    return best[1]


GENERATOR = Generator(
    "v-greedy",
    "Automatic ZB-V-style rounds on the V placement: one B and one F per device per round, W's fill waits and free memory",
    v_greedy,
    vshape_only,
)

"""ZB-V (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 6): the handcrafted
zero-bubble schedule on the V placement (stage r and stage 2p-1-r on device r).

Device r's phases, with chunk 0 = stage r and chunk 1 = stage 2p-1-r:
1. 2(p-r)-1 forwards of chunk 0;
2. r pairs (F chunk 1, F chunk 0);
3. p-r triples (F1, B1, W1);
4. steady state (F0, B0, W0, F1, B1, W1) until every forward is issued;
5. cool-down: r pairs (B0, B1), then p-r pairs (B0, W0), then the pending W1's and W0's.
The phases need at least 2p-1 microbatches; for fewer, the order is built for 2p-1 and
the ops of the missing microbatches are dropped (removing a microbatch only removes
dependencies, so the order stays deadlock free).

Peak 2p chunk activations (p microbatches) on device 0; zero bubble on the longest
device at F=B=W and comm 0.
"""

from __future__ import annotations

from optimizer.ops import Op
from optimizer.problem import Problem
from optimizer.schedules.registry import Generator, Orders
from optimizer.schedules.support import vshape_only


def _device_order(p: int, r: int, n: int) -> list[Op]:
    chunk = (r, 2 * p - 1 - r)
    count = {(kind, c): 0 for kind in "FBW" for c in (0, 1)}
    ops: list[Op] = []

    def put(kind: str, c: int) -> None:
        ops.append(Op(kind, chunk[c], count[kind, c]))
        count[kind, c] += 1

    for _ in range(2 * (p - r) - 1):
        put("F", 0)
    for _ in range(r):
        put("F", 1)
        put("F", 0)
    for _ in range(p - r):
        put("F", 1)
        put("B", 1)
        put("W", 1)
    while count["F", 1] < count["F", 0] or count["F", 0] < n:
        if count["F", 0] < n:
            put("F", 0)
        put("B", 0)
        put("W", 0)
        put("F", 1)
        put("B", 1)
        put("W", 1)
    for _ in range(r):
        put("B", 0)
        put("B", 1)
    for _ in range(p - r):
        put("B", 0)
        put("W", 0)
    while count["W", 1] < count["B", 1]:
        put("W", 1)
    while count["W", 0] < count["B", 0]:
        put("W", 0)
    return ops


def zb_v(problem: Problem) -> Orders:
    p, m = problem.num_devices, problem.num_microbatches
    n = max(m, 2 * p - 1)
    return [[op for op in _device_order(p, r, n) if op.microbatch < m] for r in range(p)]


GENERATOR = Generator(
    "zb-v",
    "ZB-V: handcrafted zero-bubble schedule on the V placement, 1F1B memory",
    zb_v,
    vshape_only,
)

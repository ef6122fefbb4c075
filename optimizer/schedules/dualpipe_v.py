"""DualPipeV (DeepSeek-AI 2025, the "V" variant of DualPipe from the DeepSeek-V3
technical report; github.com/deepseek-ai/DualPipe, dualpipev.py).

On the V placement (chunk 0 = stage r, chunk 1 = stage 2p-1-r on device r), device r
runs eight named phases, mirrored here one to one:
1. nF0:     2(p-r-1) forwards of chunk 0;
2. nF0F1:   r+1 pairs (F0, F1);
3. nB1W1F1: p-r-1 triples (B1, W, F1), the backward split so its W runs at once;
4. main:    m-2p+r+1 rounds of (F0 with fused backward BW1, F1 with fused BW0);
5. nB1F1B0: p-r-1 rounds (BW1, F1, BW0);
6. nB1B0:   r+1 pairs (B1, B0), the second half split into B and a queued W;
7. nWB0:    p-r-1 pairs (W, B0 split);
8. nW:      the queued W's.
W's run first in, first out, as DualPipe's WeightGradStore. Needs m >= 2p.

DualPipeV overlaps a forward and a backward of different chunks on one device (the
"F&B" steps of phases 4 and 5). This model runs one op at a time per device, so each
overlapped pair runs back to back (forward first, as DualPipe does without overlap);
the measured bubble is therefore larger than the overlapped figure in DeepSeek's README.
"""

from __future__ import annotations

from collections import deque

from optimizer.ops import Op
from optimizer.problem import Problem
from optimizer.schedules.registry import Generator, Orders
from optimizer.schedules.support import vshape_only


def _device_order(p: int, r: int, m: int) -> list[Op]:
    stage = (r, 2 * p - 1 - r)
    next_f, next_b = [0, 0], [0, 0]
    weights: deque[Op] = deque()
    ops: list[Op] = []

    def forward(c: int) -> None:
        ops.append(Op("F", stage[c], next_f[c]))
        next_f[c] += 1

    def backward(c: int, split: bool = False) -> None:
        mb = next_b[c]
        next_b[c] += 1
        if split:
            ops.append(Op("B", stage[c], mb))
            weights.append(Op("W", stage[c], mb))
        else:
            ops.append(Op("BW", stage[c], mb))

    def weight() -> None:
        ops.append(weights.popleft())

    for _ in range(2 * (p - r - 1)):  # 1: nF0
        forward(0)
    for _ in range(r + 1):  # 2: nF0F1
        forward(0)
        forward(1)
    for _ in range(p - r - 1):  # 3: nB1W1F1
        backward(1, split=True)
        weight()
        forward(1)
    for _ in range(m - 2 * p + r + 1):  # 4: main, F&B pairs
        forward(0)
        backward(1)
        forward(1)
        backward(0)
    for _ in range(p - r - 1):  # 5: nB1F1B0
        backward(1)
        forward(1)
        backward(0)
    steps = r + 1
    split = False
    for i in range(steps):  # 6: nB1B0, the second half split
        if i == steps // 2 and r % 2 == 1:
            split = True
        backward(1, split)
        if i == steps // 2 and r % 2 == 0:
            split = True
        backward(0, split)
    for _ in range(p - r - 1):  # 7: nWB0
        weight()
        backward(0, split=True)
    while weights:  # 8: nW
        weight()
    return ops


def dualpipe_v(problem: Problem) -> Orders:
    p, m = problem.num_devices, problem.num_microbatches
    return [_device_order(p, r, m) for r in range(p)]


def unsupported(problem: Problem) -> str | None:
    reason = vshape_only(problem)
    if reason is not None:
        return reason
    p, m = problem.num_devices, problem.num_microbatches
    if m < 2 * p:
        return f"needs at least 2p = {2 * p} microbatches, got {m}"
    return None


GENERATOR = Generator(
    "dualpipe-v",
    "DualPipeV op order on the V placement; its F&B overlap is not modelled (one op at a time per device)",
    dualpipe_v,
    unsupported,
)

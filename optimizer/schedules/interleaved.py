"""Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", section 2.2.2) and its zero-bubble form.

Each device holds V model chunks (stage k*p + r on device r). A device walks "virtual
microbatches": rounds of g microbatches go through chunk 0, then chunk 1, ..., so a
device's k-th forward is chunk (k mod gV) // g and its k-th backward the mirror chunk
V-1-that. Warm-up is (p-r-1)*2 + (V-1)*g forwards, then one forward and one fused
backward, then the remaining backwards, exactly as Megatron's
`forward_backward_pipelining_with_interleaving` when m is a multiple of p (g = p).
Other microbatch counts go in max(1, m // p) rounds of g = m // rounds microbatches, as
torch's ScheduleInterleaved1F1B takes them (Megatron refuses them); m must then be a
multiple of the round count.

Bubble (p-1)/(V*m) of the ideal time at F=B=W, comm 0; peak about p + (p-1)/V
microbatches on device 0.

The same walk with the backward split is `interleaved-zb` (optimizer.schedules.interleaved_zb).
"""

from __future__ import annotations

from collections import deque

from optimizer.ops import Op
from optimizer.problem import Problem
from optimizer.schedules.registry import Generator, Orders
from optimizer.schedules.support import interleaved_chunks


def rounds(num_devices: int, num_microbatches: int) -> tuple[int, int] | None:
    """(round count, microbatches per round) of the walk, None when m does not divide."""
    count = max(1, num_microbatches // num_devices)
    if num_microbatches % count != 0:
        return None
    return count, num_microbatches // count


def _chunk(k: int, group: int, v: int, forward: bool) -> int:
    chunk = (k % (group * v)) // group
    return chunk if forward else v - 1 - chunk


def walk(problem: Problem, *, split: bool) -> Orders:
    """Every device's order: the depth-first walk with warm-up, steady F/backward pairs and
    cool-down; with `split` the zero-bubble form (optimizer.schedules.interleaved_zb)."""
    p, m = problem.num_devices, problem.num_microbatches
    v = problem.num_stages // p
    shape = rounds(p, m)
    assert shape is not None, "unsupported() refuses this microbatch count"
    group = shape[1]
    total = m * v
    orders: Orders = []
    for r in range(p):
        if split:
            warmup = min(p - r - 1 + (v - 1) * group, total)
        else:
            # Megatron runs everything as warm-up when m == p: the steady state would
            # otherwise wait for a backward that needs forwards not yet issued.
            warmup = total if m == p else min((p - r - 1) * 2 + (v - 1) * group, total)
        next_f = [0] * v  # per chunk, the next microbatch to run forward
        next_b = [0] * v
        ops: list[Op] = []
        pending: deque[Op] = deque()  # split: W's kept back, r of them on device r (as ZB-H1)

        def forward(k: int) -> None:
            c = _chunk(k, group, v, forward=True)
            next_f[c] += 1
            ops.append(Op("F", c * p + r, next_f[c] - 1))

        def backward(k: int) -> None:
            c = _chunk(k, group, v, forward=False)
            next_b[c] += 1
            op = Op("B" if split else "BW", c * p + r, next_b[c] - 1)
            ops.append(op)
            if split:
                pending.append(op._replace(kind="W"))
                while len(pending) > r:
                    ops.append(pending.popleft())

        for k in range(warmup):
            forward(k)
        for k in range(total - warmup):
            forward(warmup + k)
            backward(k)
        for k in range(total - warmup, total):
            backward(k)
        ops += pending
        orders.append(ops)
    return orders


def interleaved_1f1b(problem: Problem) -> Orders:
    return walk(problem, split=False)


def unsupported(problem: Problem) -> str | None:
    v = interleaved_chunks(problem)
    if v is None or v < 2:
        return f"needs the interleaved:V placement with V >= 2 (stage s on device s % p), got {problem.placement()}"
    p, m = problem.num_devices, problem.num_microbatches
    if rounds(p, m) is None:
        count = max(1, m // p)
        return f"needs the microbatch count to be a multiple of its {count} rounds of microbatches (m={m}, p={p}: rounds = m // p)"
    return None


GENERATOR = Generator(
    "interleaved-1f1b",
    "Megatron interleaved 1F1B: V chunks per device, depth-first over rounds of p microbatches",
    interleaved_1f1b,
    unsupported,
)

"""Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", section 2.2.2).

Each device holds V model chunks (stage k*p + r on device r). A device walks "virtual
microbatches": groups of p microbatches go through chunk 0, then chunk 1, ..., so a
device's k-th forward is chunk (k mod pV) // p and its k-th backward the mirror chunk
V-1-that. Warm-up is (p-r-1)*2 + (V-1)*p forwards, then one forward and one fused
backward, then the remaining backwards, exactly as Megatron's
`forward_backward_pipelining_with_interleaving`. The group walk needs m % p == 0.

Bubble (p-1)/(V*m) of the ideal time at F=B=W, comm 0; peak about p + (p-1)/V
microbatches on device 0.
"""

from __future__ import annotations

from optimizer.ops import Op
from optimizer.problem import Problem
from optimizer.schedules.registry import Generator, Orders
from optimizer.schedules.support import interleaved_chunks


def _chunk(k: int, p: int, v: int, forward: bool) -> int:
    chunk = (k % (p * v)) // p
    return chunk if forward else v - 1 - chunk


def interleaved_1f1b(problem: Problem) -> Orders:
    p, m = problem.num_devices, problem.num_microbatches
    v = problem.num_stages // p
    total = m * v
    orders: Orders = []
    for r in range(p):
        # Megatron runs everything as warm-up when m == p: the steady state would
        # otherwise wait for a backward that needs forwards not yet issued.
        warmup = total if m == p else min((p - r - 1) * 2 + (v - 1) * p, total)
        next_f = [0] * v  # per chunk, the next microbatch to run forward
        next_b = [0] * v

        def forward(k: int) -> Op:
            c = _chunk(k, p, v, forward=True)
            next_f[c] += 1
            return Op("F", c * p + r, next_f[c] - 1)

        def backward(k: int) -> Op:
            c = _chunk(k, p, v, forward=False)
            next_b[c] += 1
            return Op("BW", c * p + r, next_b[c] - 1)

        ops = [forward(k) for k in range(warmup)]
        for k in range(total - warmup):
            ops.append(forward(warmup + k))
            ops.append(backward(k))
        ops += [backward(k) for k in range(total - warmup, total)]
        orders.append(ops)
    return orders


def unsupported(problem: Problem) -> str | None:
    v = interleaved_chunks(problem)
    if v is None or v < 2:
        return f"needs the interleaved:V placement with V >= 2 (stage s on device s % p), got {problem.placement()}"
    if problem.num_microbatches % problem.num_devices != 0:
        return f"needs the microbatch count to be a multiple of the device count (m={problem.num_microbatches}, p={problem.num_devices})"
    return None


GENERATOR = Generator(
    "interleaved-1f1b",
    "Megatron interleaved 1F1B: V chunks per device, depth-first over groups of p microbatches",
    interleaved_1f1b,
    unsupported,
)

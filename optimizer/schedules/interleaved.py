"""Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", section 2.2.2) and its zero-bubble form.

Each device holds V model chunks (stage k*p + r on device r). A device walks "virtual
microbatches": rounds of g microbatches go through chunk 0, then chunk 1, ..., so a
device's k-th forward is chunk (k mod gV) // g and its k-th backward the mirror chunk
V-1-that. Warm-up is (p-r-1)*2 + (V-1)*g forwards, then one forward and one fused
backward, then the remaining backwards, exactly as Megatron's
`forward_backward_pipelining_with_interleaving` when m is a multiple of p (g = p) other
than p itself (there Megatron runs every forward as warm-up; torch, and this family, do not).
Other microbatch counts go in max(1, m // p) rounds of g = m // rounds microbatches, as
torch's ScheduleInterleaved1F1B takes them (Megatron refuses them); m must then be a
multiple of the round count.

Bubble (p-1)/(V*m) of the ideal time at F=B=W, comm 0; peak about p + (p-1)/V
microbatches on device 0.

The same walk with the backward split is `interleaved-zb` (optimizer.schedules.interleaved_zb).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from optimizer.ops import Op
from optimizer.problem import Problem
from optimizer.schedules.registry import Generator, Orders
from optimizer.schedules.support import interleaved_chunks
from optimizer.schedules.zero_bubble import run_backward


def rounds(num_devices: int, num_microbatches: int) -> tuple[int, int] | None:
    """(round count, microbatches per round) of the walk, None when m does not divide."""
    count = max(1, num_microbatches // num_devices)
    if num_microbatches % count != 0:
        return None
    return count, num_microbatches // count


def _sequence(num_microbatches: int, group: int, v: int, forward: bool) -> list[tuple[int, int]]:
    """A device's forwards (or backwards) in walk order, as (chunk, microbatch): round by
    round of `group` microbatches (the last round may be shorter), each round through
    the chunks in order (backwards: in reverse)."""
    chunks = range(v) if forward else range(v - 1, -1, -1)
    return [
        (c, i) for start in range(0, num_microbatches, group) for c in chunks for i in range(start, min(start + group, num_microbatches))
    ]


def walk_sequence(problem: Problem, group: int, forward: bool) -> list[tuple[int, int]]:
    """Every device's forwards (or backwards) in walk order, as (chunk, microbatch)."""
    return _sequence(problem.num_microbatches, group, problem.num_stages // problem.num_devices, forward)


@dataclass(frozen=True)
class Walk:
    """The shape of a walk: microbatches per round, each device's warm-up (forwards before
    its first backward) and, with the backward split, the W's each device keeps pending."""

    group: int
    warmup: tuple[int, ...]
    deferred: tuple[int, ...] | None  # None: fused backwards (BW)


def family_walk(problem: Problem, *, split: bool) -> Walk:
    """The shape of interleaved 1F1B (fused) or of interleaved zero bubble (`split`)."""
    p, m = problem.num_devices, problem.num_microbatches
    v = problem.num_stages // p
    shape = rounds(p, m)
    assert shape is not None, "unsupported() refuses this microbatch count"
    group, total = shape[1], m * v
    if split:
        warmup = [min(p - r - 1 + (v - 1) * group, total) for r in range(p)]
    else:
        # At m == p Megatron runs everything as warm-up (its blocking sends would otherwise
        # wait on each other). torch keeps this warm-up, which holds fewer activations and,
        # with asynchronous sends, can be shorter (up to 6.7% with uneven stages), so the
        # family takes torch's.
        warmup = [min((p - r - 1) * 2 + (v - 1) * group, total) for r in range(p)]
    return Walk(group, tuple(warmup), tuple(range(p)) if split else None)


def walk(problem: Problem, shape: Walk) -> Orders:
    """Every device's order: the depth-first walk with warm-up, steady F/backward pairs and
    cool-down; with the backward split, W's kept pending as `shape.deferred` says (r on
    device r in the zero-bubble form, as ZB-H1)."""
    p, m = problem.num_devices, problem.num_microbatches
    v = problem.num_stages // p
    total = m * v
    forwards = walk_sequence(problem, shape.group, forward=True)
    backwards = walk_sequence(problem, shape.group, forward=False)
    orders: Orders = []
    for r in range(p):
        warmup = min(shape.warmup[r], total)
        keep = None if shape.deferred is None else shape.deferred[r]
        ops: list[Op] = []
        pending: deque[Op] = deque()

        def forward(k: int) -> None:
            c, i = forwards[k]
            ops.append(Op("F", c * p + r, i))

        def backward(k: int) -> None:
            c, i = backwards[k]
            if keep is None:
                ops.append(Op("BW", c * p + r, i))
            else:
                run_backward(ops, pending, Op("B", c * p + r, i), keep)

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
    return walk(problem, family_walk(problem, split=False))


def looped_only(problem: Problem) -> str | None:
    """Why a walk does not apply to the problem's placement (None: interleaved:V, V >= 2)."""
    v = interleaved_chunks(problem)
    if v is None or v < 2:
        return f"needs the interleaved:V placement with V >= 2 (stage s on device s % p), got {problem.placement()}"
    return None


def unsupported(problem: Problem) -> str | None:
    reason = looped_only(problem)
    if reason is not None:
        return reason
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

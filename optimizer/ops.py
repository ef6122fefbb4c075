"""The op model: op kinds, op identity, durations, memory deltas and the dependency rule.

Every other module asks here what an op is, how long it takes, what memory it changes and
what must end before it may start; nothing here reads files or times schedules.

An op is (kind, stage, microbatch, slice). A slice is a contiguous run of a microbatch's
tokens (token-level pipelining, TeraPipe/Seq1F1B); an unsliced problem has one slice, 0.
Slice k of a stage's forward and input-gradient backward takes cost_k x the stage's time
(causal attention makes later slices dearer), its weight gradient share_k x (linear in
tokens); its memory deltas are share_k x the stage's. The fused backward BW of slice k
takes the stage's fused time scaled by the same mix as its split parts, so that fusing
saves the same fraction on every slice.

Vocabulary parallelism (Problem.vocab_parallel): the output layer is sharded over all
devices, and every device runs two passes of its shard per microbatch, S and T. A
vocabulary op is (S or T, shard, microbatch): its `stage` field holds the shard, which is
the device that runs it. S follows the last stage's F (its output goes to every device);
T follows every device's S (a collective, the first barrier); the last stage's backward
follows every device's T with two barriers, every device's S with one (the collective
after S then carries the input gradient). S allocates the pass's memory at its start, T
frees it at its end.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from enum import StrEnum
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from optimizer.problem import Tables


class Kind(StrEnum):
    """An op's kind. A str-enum: `Kind.F == "F"`, it hashes like "F" and prints as "F"."""

    F = "F"  # forward
    B = "B"  # input gradient (the split backward's first half)
    W = "W"  # weight gradient (the split backward's second half)
    BW = "BW"  # fused backward: B and W in one op
    S = "S"  # vocabulary pass after the forward: shard logits and softmax statistics
    T = "T"  # vocabulary pass after the first collective: shard gradients


KINDS: tuple[Kind, ...] = (Kind.F, Kind.B, Kind.W, Kind.BW, Kind.S, Kind.T)
STAGE_KINDS: tuple[Kind, ...] = (Kind.F, Kind.B, Kind.W, Kind.BW)
VOCAB_KINDS: tuple[str, ...] = (Kind.S, Kind.T)
ALLOCATE_AT_START: tuple[str, ...] = (Kind.F, Kind.S)  # memory changes at the start; the others at the end
SPLIT_KINDS: tuple[str, ...] = (Kind.F, Kind.B, Kind.W)  # a schedule whose backwards are all split; str: dict keys with "F"


class Op(NamedTuple):
    """One unit of work: a forward, input-gradient, weight-gradient or fused backward of a
    stage, or a vocabulary pass (S, T) of a shard (then `stage` is the shard: see the module doc)."""

    kind: str
    stage: int
    microbatch: int
    slice: int = 0

    def __str__(self) -> str:
        where = "shard" if self.kind in VOCAB_KINDS else "stage"
        return f"{self.kind}({where} {self.stage}, mb {_microbatch_label(self.microbatch, self.slice)})"


class TimedOp(NamedTuple):
    """An op with its start and end times (the problem's unit)."""

    kind: str
    stage: int
    microbatch: int
    start: float
    end: float
    slice: int = 0

    @property
    def op(self) -> Op:
        return Op(self.kind, self.stage, self.microbatch, self.slice)

    def __str__(self) -> str:
        return f"{self.op} [{self.start:g}, {self.end:g}]"


def _microbatch_label(microbatch: int, slice: int) -> str:
    return f"{microbatch}.{slice}" if slice > 0 else str(microbatch)


def op_label(op: Op | TimedOp, num_slices: int) -> str:
    """The short label of an op's microbatch in pictures: "mb" or, with slices, "mb.slice"."""
    return f"{op.microbatch}.{op.slice}" if num_slices > 1 else str(op.microbatch)


class VocabRule(NamedTuple):
    """What the dependency rule needs of vocabulary parallelism: devices and barriers (1 or 2)."""

    num_devices: int
    barriers: int


def op_device(device_of: Sequence[int], op: Op | TimedOp) -> int:
    """The device an op runs on: its stage's, or its shard for a vocabulary pass."""
    return op.stage if op.kind in VOCAB_KINDS else device_of[op.stage]


def transfer_delay(key: Op, device: int, device_of: Sequence[int], comm: float, barrier: float) -> float:
    """Time between a dependency's end and the op on `device` that waits for it.

    A vocabulary pass's end reaches others through a collective (`barrier`, even on its
    own device); any other op's output crosses devices in `comm`.
    """
    if key[0] in VOCAB_KINDS:
        return barrier
    return comm if device_of[key[1]] != device else 0


def op_duration(tables: Tables, kind: str, stage: int, slice: int = 0) -> float:
    """How long an op lasts (see the module docstring for slices)."""
    if kind == "S":
        return tables.vocab_forward
    if kind == "T":
        return tables.vocab_backward
    if kind == "F":
        return tables.forward[stage] * tables.slice_cost[slice]
    if kind == "B":
        return tables.backward_input[stage] * tables.slice_cost[slice]
    if kind == "W":
        return tables.backward_weight[stage] * tables.slice_share[slice]
    b, w = tables.backward_input[stage], tables.backward_weight[stage]
    # With one slice the factor is exactly 1.0 (x / x), so BW takes `backward` exactly.
    return tables.backward[stage] * ((b * tables.slice_cost[slice] + w * tables.slice_share[slice]) / (b + w))


def op_memory(tables: Tables, kind: str, stage: int, slice: int = 0) -> float:
    """The memory change an op makes (F and S at their start, the others at their end)."""
    if kind == "S":
        return tables.vocab_memory
    if kind == "T":
        return -tables.vocab_memory
    share = tables.slice_share[slice]
    if kind == "F":
        return tables.mem_forward[stage] * share
    if kind == "B":
        return tables.mem_backward_input[stage] * share
    if kind == "W":
        return tables.mem_backward_weight[stage] * share
    return (tables.mem_backward_input[stage] + tables.mem_backward_weight[stage]) * share


# A fused backward shorter than B + W by less than this (relative) is float rounding of
# B + W itself (a slice's BW time is computed through a ratio), not a saving.
FUSED_SAVING_TOLERANCE = 1e-9


def fusing_can_win(tables: Tables, stage: int, slice: int = 0) -> bool:
    """Whether a fused backward can beat B then W on this stage and slice
    (optimizer.exact.canonical says why): it is shorter, or B allocates memory under a
    memory limit, which only the fused backward never holds."""
    split = op_duration(tables, Kind.B, stage, slice) + op_duration(tables, Kind.W, stage, slice)
    if op_duration(tables, Kind.BW, stage, slice) < split * (1 - FUSED_SAVING_TOLERANCE):
        return True
    return op_memory(tables, Kind.B, stage, slice) > 0 and math.isfinite(tables.limit[tables.device[stage]])


# Ops and timed ops are built in hot loops (dependency keys in the simulator's inner loop,
# timed ops there and in the span timing): new_tuple(Op, (...)) skips the named tuple's
# argument handling (about 5x faster than Op(...)). The kinds are looked up once.
new_tuple = tuple.__new__
_F, _B, _S, _T = Kind.F, Kind.B, Kind.S, Kind.T


def completion_key(op: Op | TimedOp) -> Op | None:
    """The key under which an op's end is what others wait for: F as F, B and BW as "B".

    W ends nothing any other op waits for: None. A vocabulary pass as itself.
    """
    kind = op.kind
    if kind == "F":
        return new_tuple(Op, (_F, op.stage, op.microbatch, op.slice))
    if kind == "B" or kind == "BW":
        return new_tuple(Op, (_B, op.stage, op.microbatch, op.slice))
    if kind == "S" or kind == "T":
        return new_tuple(Op, (op.kind, op.stage, op.microbatch, 0))
    return None


def dependencies(op: Op | TimedOp, num_stages: int, num_slices: int = 1, vocab: VocabRule | None = None) -> tuple[Op, ...]:
    """What must end before `op` may start, as completion keys (see `completion_key`).

    "B" stands for the stage's backward, whether split (B) or fused (BW). With slices:
    a forward also waits for the previous slice's forward on its stage (attention reads
    the earlier slices' keys and values); a backward also waits for the next slice's
    backward on its stage (the later slices' attention sends gradients to this slice's
    keys and values). With vocabulary parallelism (`vocab`), see the module doc.
    """
    kind, stage, mb = op.kind, op.stage, op.microbatch
    if vocab is not None:
        return _vocab_dependencies(kind, stage, mb, num_stages, vocab)
    if num_slices == 1:  # the fast path: one dependency at most
        if kind == "F":
            return (new_tuple(Op, (_F, stage - 1, mb, 0)),) if stage > 0 else ()
        if kind == "W":
            return (new_tuple(Op, (_B, stage, mb, 0)),)
        return (new_tuple(Op, (_B, stage + 1, mb, 0)) if stage < num_stages - 1 else new_tuple(Op, (_F, stage, mb, 0)),)
    k = op.slice
    if kind == "F":
        deps = (new_tuple(Op, (_F, stage - 1, mb, k)),) if stage > 0 else ()
        return deps + (new_tuple(Op, (_F, stage, mb, k - 1)),) if k > 0 else deps
    if kind == "W":
        return (new_tuple(Op, (_B, stage, mb, k)),)
    first = new_tuple(Op, (_B, stage + 1, mb, k)) if stage < num_stages - 1 else new_tuple(Op, (_F, stage, mb, k))
    return (first, new_tuple(Op, (_B, stage, mb, k + 1))) if k < num_slices - 1 else (first,)


def _vocab_dependencies(kind: str, stage: int, mb: int, num_stages: int, vocab: VocabRule) -> tuple[Op, ...]:
    last = num_stages - 1
    if kind == "S":
        return (new_tuple(Op, (_F, last, mb, 0)),)
    if kind == "T":
        return _every_shard(_S, mb, vocab.num_devices)
    if kind == "F":
        return (new_tuple(Op, (_F, stage - 1, mb, 0)),) if stage > 0 else ()
    if kind == "W":
        return (new_tuple(Op, (_B, stage, mb, 0)),)
    if stage < last:
        return (new_tuple(Op, (_B, stage + 1, mb, 0)),)
    passes = _S if vocab.barriers == 1 else _T
    return (new_tuple(Op, (_F, stage, mb, 0)),) + _every_shard(passes, mb, vocab.num_devices)


@lru_cache(maxsize=1 << 14)
def _every_shard(kind: str, mb: int, num_devices: int) -> tuple[Op, ...]:
    """Every shard's pass of a microbatch: built once, asked for by every device (hot loop)."""
    return tuple(new_tuple(Op, (kind, d, mb, 0)) for d in range(num_devices))


def dependency_order(
    timed: Sequence[Sequence[TimedOp]],
    num_stages: int,
    num_slices: int = 1,
    vocab: VocabRule | None = None,
    first: Sequence[int] | None = None,
) -> list[tuple[int, int]]:
    """Positions (device, index) of the timed ops from index first[d] on (all by default),
    each after the op before it on its device and after its dependencies among them.

    Start times alone do not give such an order: an op that takes a few nanoseconds
    (or rounds to no ticks) starts at the same time as the op after it, on its device or,
    over a free transfer, on another. Ties go to the earlier start, then device and index.
    """
    lo = list(first) if first is not None else [0] * len(timed)
    where: dict[Op, tuple[int, int]] = {}
    for d, ops in enumerate(timed):
        for k in range(lo[d], len(ops)):
            key = completion_key(ops[k])
            if key is not None:
                where[key] = (d, k)
    waiting: dict[tuple[int, int], int] = {}
    followers: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for d, ops in enumerate(timed):
        for k in range(lo[d], len(ops)):
            preds = [where[dep] for dep in dependencies(ops[k], num_stages, num_slices, vocab) if dep in where]
            if k > lo[d]:
                preds.append((d, k - 1))
            waiting[(d, k)] = len(preds)
            for pred in preds:
                followers.setdefault(pred, []).append((d, k))
    ready = [(timed[d][k].start, d, k) for (d, k), n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order: list[tuple[int, int]] = []
    while ready:
        _, d, k = heapq.heappop(ready)
        order.append((d, k))
        for follower in followers.get((d, k), ()):
            waiting[follower] -= 1
            if waiting[follower] == 0:
                heapq.heappush(ready, (timed[follower[0]][follower[1]].start, *follower))
    if len(order) != len(waiting):
        raise ValueError("the timed ops' dependencies form a cycle")
    return order


def dependency_depths(num_stages: int, num_slices: int = 1, vocab: VocabRule | None = None) -> Callable[[Op | TimedOp], int]:
    """The length of the longest chain of dependencies ending at an op (0: it waits for
    nothing), as a function of the op.

    Along a dependency the depth grows by one, so ops sorted by start time and then depth
    follow every dependency even where an op takes no time (its successor starts at the
    same tick): orders cut from such a sort cannot deadlock. Chains stay inside a
    microbatch, so the depth depends on kind, stage and slice only.
    """
    known: dict[tuple[str, int, int], int] = {}

    def depth(op: Op | TimedOp) -> int:
        key = (op.kind, op.stage, op.slice)
        # Depth first with an explicit stack: a chain is about 2 x stages x slices long,
        # past Python's recursion limit at 1,024 stages.
        stack = [key]
        while stack:
            kind, stage, piece = stack[-1]
            if (kind, stage, piece) in known:
                stack.pop()
                continue
            deps = dependencies(Op(kind, stage, 0, piece), num_stages, num_slices, vocab)
            missing = [(d.kind, d.stage, d.slice) for d in deps if (d.kind, d.stage, d.slice) not in known]
            if missing:
                stack.extend(missing)
                continue
            known[(kind, stage, piece)] = 1 + max((known[(d.kind, d.stage, d.slice)] for d in deps), default=-1)
            stack.pop()
        return known[key]

    return depth

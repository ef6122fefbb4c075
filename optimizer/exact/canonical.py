"""Canonical orders: fused backwards split where that is no worse, microbatches in order.

Two facts make every solver's search space smaller without losing any schedule:

* Where a fused backward BW takes at least as long as B then W (the default: BW's time
  is B + W) and B frees memory (or allocates none), BW is never better than B
  immediately followed by W: no more device time, the input gradient reaches the
  previous stage no later, and memory is freed no later. Such BWs are split. Where BW is
  shorter, fusing can win and the choice is kept. Where B *allocates* (a gradient buffer
  its W reads) under a memory limit, B then W holds that allocation between them and
  BW never does, so under a tight limit only the fused backward fits: the choice is kept
  there too.
* Microbatches are interchangeable. Call a *class* the ops of one kind, stage and slice
  (B and BW together: the stage's backward), or of one vocabulary pass and shard. Every
  dependency links an op to ops of fixed other classes with the same microbatch and
  slice (a barrier: one in each shard's class; the argument below holds class by class). Take any valid timed
  schedule and, for each class, hand its k-th earliest slot to microbatch k (a slot
  keeps its kind and duration: BW stays BW). Every dependency still holds: by the time
  the k-th slot of a class starts, k ops of it have started, each after its own
  dependency ended, so k ops of the dependency's class had ended, microbatch k's among
  them (all ops of a class run on one device, one at a time, so start order is end
  order). The W slots of a stage and slice go, in time order, to the microbatches whose
  backward was split, in their order: the j-th W starts after j split Bs ended, for the
  same reason. Each device runs the same kinds at the same times, so its memory curve is
  unchanged. Hence some optimal schedule runs each class in microbatch order, and any
  order can be relabelled that way without getting slower. Slices are not
  interchangeable (later slices cost more and depend on earlier ones): only whole
  sequences (microbatches) are relabelled.
"""

from __future__ import annotations

from collections.abc import Sequence

from optimizer.ops import Kind, Op, fusing_can_win
from optimizer.problem import Problem, Tables

Orders = list[list[Op]]


def split_fused(orders: Sequence[Sequence[Op]], tables: Tables | None = None) -> Orders:
    """Replace each BW by B then W on the same device (with `tables`: only where fusing cannot win)."""
    result: Orders = []
    for ops in orders:
        split: list[Op] = []
        for op in ops:
            if op.kind == Kind.BW and (tables is None or not fusing_can_win(tables, op.stage, op.slice)):
                split += [op._replace(kind=Kind.B), op._replace(kind=Kind.W)]
            else:
                split.append(op)
        result.append(split)
    return result


def relabel_in_order(orders: Sequence[Sequence[Op]]) -> Orders:
    """Give the k-th op of each class microbatch k (Ws: the split backwards' microbatches in order)."""
    result: Orders = []
    for ops in orders:
        seen: dict[tuple[str, int, int], int] = {}
        split_backwards: dict[tuple[int, int], list[int]] = {}
        relabelled = []
        for op in ops:
            if op.kind == Kind.W:
                microbatch = split_backwards[(op.stage, op.slice)].pop(0)
            else:
                key = (Kind.B if op.kind == Kind.BW else op.kind, op.stage, op.slice)
                microbatch = seen.get(key, 0)
                seen[key] = microbatch + 1
                if op.kind == Kind.B:
                    split_backwards.setdefault((op.stage, op.slice), []).append(microbatch)
            relabelled.append(op._replace(microbatch=microbatch))
        result.append(relabelled)
    return result


def canonical(orders: Sequence[Sequence[Op]], problem: Problem) -> Orders:
    """Split fused backwards where fusing cannot win, relabel microbatches in order (never slower, same memory)."""
    return relabel_in_order(split_fused(orders, problem.tables()))

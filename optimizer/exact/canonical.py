"""Canonical orders: fused backwards split, microbatches of each op kind in order per stage.

Two facts make every solver's search space smaller without losing any schedule:

* A fused backward BW is never better than B immediately followed by W: the same device
  time, the input gradient reaches the previous stage earlier, and memory is freed no
  later. Solvers therefore use B and W only.
* Microbatches are interchangeable. Take any valid timed schedule and, for each stage and
  op kind, hand the k-th earliest slot to microbatch k. Every dependency still holds (by
  time T, k slots of the predecessor kind had ended, so microbatch k's predecessor had),
  and each device runs the same kinds in the same positions, so its memory curve is
  unchanged. Hence some optimal schedule runs each (stage, kind) in microbatch order,
  and any order can be relabelled that way without getting slower.
"""

from __future__ import annotations

from collections.abc import Sequence

from optimizer.schedule import Op

Orders = list[list[Op]]


def split_fused(orders: Sequence[Sequence[Op]]) -> Orders:
    """Replace each BW by B then W on the same device."""
    result: Orders = []
    for ops in orders:
        split: list[Op] = []
        for op in ops:
            if op.kind == "BW":
                split += [Op("B", op.stage, op.microbatch), Op("W", op.stage, op.microbatch)]
            else:
                split.append(op)
        result.append(split)
    return result


def relabel_in_order(orders: Sequence[Sequence[Op]]) -> Orders:
    """Give the k-th op of each (stage, kind) on its device microbatch k."""
    result: Orders = []
    for ops in orders:
        seen: dict[tuple[str, int], int] = {}
        relabelled = []
        for op in ops:
            k = seen.get((op.kind, op.stage), 0)
            seen[(op.kind, op.stage)] = k + 1
            relabelled.append(Op(op.kind, op.stage, k))
        result.append(relabelled)
    return result


def canonical(orders: Sequence[Sequence[Op]]) -> Orders:
    """Split fused backwards and relabel microbatches in order (never slower, same memory)."""
    return relabel_in_order(split_fused(orders))

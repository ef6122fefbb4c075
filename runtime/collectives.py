"""Which op feeds and which op waits for each vocabulary collective, and when a rank issues it.

A vocabulary-parallel schedule ties all devices with collectives per microbatch j
(runtime/vocab.py): the statistics stream (fed by every device's S(d, j); with two
barriers awaited by T(d, j), with one barrier also by the last stage's backward of j)
and, with two barriers, the input-gradient stream (fed by every T(d, j), awaited by the
last stage's backward of j). Each stream runs on a process group of its own, and every
rank issues a stream's collectives in microbatch order, each as soon as the rank has fed
it and issued the one before: all ranks then agree on the order without talking. A
collective completes once every rank has issued it.

`collective_deadlock` replays a step under these rules together with the point-to-point
transfers (issued as runtime/issue.py says, matched by tag as gloo does), and names where
the ranks would wait forever: a rank that feeds microbatch 1 before 0 and waits on 1 in
between, or such a wait behind a transfer from a rank in the same state. Nothing here
touches torch, so the executor and the up-front check share it.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.schedule import Op
from runtime.issue import IssueOrder, op_transfers
from runtime.plan import RankPlan

STATS, INPUT_GRADIENT = "statistics", "input gradient"


def streams(barriers: int) -> tuple[str, ...]:
    return (STATS, INPUT_GRADIENT) if barriers == 2 else (STATS,)


@dataclass(frozen=True)
class OpCollectives:
    """The collectives an op waits for before it runs, and those it feeds."""

    waits: tuple[tuple[str, int], ...] = ()  # (stream, microbatch)
    feeds: tuple[tuple[str, int], ...] = ()


def op_collectives(plan: RankPlan) -> tuple[OpCollectives, ...]:
    """Per op of `plan.ops`, in order, its collectives (none without vocabulary passes)."""
    found = []
    last = plan.num_stages - 1
    dh_stream = INPUT_GRADIENT if plan.vocab_barriers == 2 else STATS
    for op in plan.ops:
        j = op.microbatch
        if not plan.vocab_barriers:
            found.append(OpCollectives())
        elif op.kind == "S":
            found.append(OpCollectives(feeds=((STATS, j),)))
        elif op.kind == "T":
            found.append(OpCollectives(waits=((STATS, j),), feeds=((INPUT_GRADIENT, j),) if plan.vocab_barriers == 2 else ()))
        elif op.kind in ("B", "BW") and op.stage == last:
            found.append(OpCollectives(waits=((dh_stream, j),)))
        else:
            found.append(OpCollectives())
    return tuple(found)


class CollectiveOrder:
    """One rank's position in each stream during one step: collectives go in microbatch order."""

    def __init__(self, barriers: int, num_microbatches: int):
        self.num_microbatches = num_microbatches
        self.names = streams(barriers) if barriers else ()
        self.start()

    def start(self) -> None:
        self._next = dict.fromkeys(self.names, 0)
        self._fed: set[tuple[str, int]] = set()

    def fed(self, stream: str, microbatch: int) -> list[int]:
        """This rank's share of (stream, microbatch) exists: the microbatches to issue now, in order."""
        self._fed.add((stream, microbatch))
        ready = []
        while (stream, self._next[stream]) in self._fed:
            self._fed.discard((stream, self._next[stream]))
            ready.append(self._next[stream])
            self._next[stream] += 1
        return ready

    def finished(self) -> bool:
        return all(self._next[name] == self.num_microbatches for name in self.names)


def collective_deadlock(plans: list[RankPlan]) -> str | None:
    """None when every rank finishes one step; else where each stuck rank waits."""
    transfers = [op_transfers(plan) for plan in plans]
    collectives = [op_collectives(plan) for plan in plans]
    p2p = [IssueOrder(plan) for plan in plans]
    orders = [CollectiveOrder(plan.vocab_barriers, plan.num_microbatches) for plan in plans]
    issued_transfers: list[set[int]] = [set() for _ in plans]  # per rank: tags it issued
    issued_collectives: dict[tuple[str, int], int] = {}  # how many ranks issued it
    world = len(plans)
    head = [0] * world
    for rank, order in enumerate(p2p):
        issued_transfers[rank].update(m.tag for m in order.start())

    def blocked(rank: int) -> str | None:
        """What the rank's next op waits for, or None when it may run."""
        receive = transfers[rank][head[rank]].receive
        if receive is not None and not (receive.tag in issued_transfers[rank] and receive.tag in issued_transfers[receive.src]):
            return f"{receive.describe()} from rank {receive.src}"
        for stream, j in collectives[rank][head[rank]].waits:
            if issued_collectives.get((stream, j), 0) < world:
                return f"the {stream} collective of mb {j}"
        return None

    moved = True
    while moved:
        moved = False
        for rank, plan in enumerate(plans):
            while head[rank] < len(plan.ops) and blocked(rank) is None:
                for send in transfers[rank][head[rank]].sends:
                    issued_transfers[rank].update(m.tag for m in p2p[rank].produced(send))
                for stream, j in collectives[rank][head[rank]].feeds:
                    for ready in orders[rank].fed(stream, j):
                        issued_collectives[(stream, ready)] = issued_collectives.get((stream, ready), 0) + 1
                head[rank] += 1
                moved = True
    stuck = [rank for rank, plan in enumerate(plans) if head[rank] < len(plan.ops)]
    if not stuck:
        return None
    return "; ".join(f"rank {rank} at {_name(plans[rank].ops[head[rank]])} waits for {blocked(rank)}" for rank in stuck)


def _name(op: Op) -> str:
    return f"{op.kind}(shard {op.stage}, mb {op.microbatch})" if op.kind in ("S", "T") else str(op)

"""Would the executor's transfers pair up on a backend that matches them by order (NCCL)?

NCCL matches the point-to-point transfers between two ranks by their order, on one
stream for both directions (torch gives single isend/irecv one communicator and stream
per rank pair): a transfer completes only once both ranks have issued it and every
earlier transfer between them has completed. A transfer queued behind one the peer has
not reached yet waits for it; if that peer in turn waits for something behind this
rank's wait, both hang. gloo matches by tag and would not notice, so the tests run this
check for every schedule they run on gloo.

The replay runs the executor's own rules, not a model of them: the per-op transfers and
the issue order come from runtime/issue.py, which runtime/executor.py and runtime/comm.py
run. Each rank runs its ops in order; an op first waits for the message it consumes;
once it ran, its output is handed to the issue order, which releases what may now be
issued with that peer, one transfer per message.
"""

from __future__ import annotations

from runtime.issue import IssueOrder, op_transfers
from runtime.plan import Message, RankPlan


def pairing_deadlock(plans: list[RankPlan]) -> str | None:
    """None when every rank finishes one step under order-matched transfers; else where
    each stuck rank waits (its next op and the message it waits for)."""
    transfers = [op_transfers(plan) for plan in plans]
    orders = [IssueOrder(plan) for plan in plans]
    head = [0] * len(plans)  # next op per rank
    issued: set[tuple[int, int]] = set()  # (rank, tag)
    done: set[int] = set()  # tags of completed transfers
    pair_order: dict[tuple[int, int], tuple[Message, ...]] = {}
    for plan in plans:
        for peer, messages in plan.peer_messages.items():
            pair_order[(min(plan.rank, peer), max(plan.rank, peer))] = messages
    pair_next = dict.fromkeys(pair_order, 0)  # index of the next transfer to complete

    def issue(rank: int, messages: list[Message]) -> None:
        issued.update((rank, message.tag) for message in messages)

    def complete() -> bool:
        moved = False
        for pair, messages in pair_order.items():
            i = pair_next[pair]
            while i < len(messages) and (pair[0], messages[i].tag) in issued and (pair[1], messages[i].tag) in issued:
                done.add(messages[i].tag)
                i += 1
                moved = True
            pair_next[pair] = i
        return moved

    def run() -> bool:
        moved = False
        for rank, plan in enumerate(plans):
            while head[rank] < len(plan.ops):
                receive, send = transfers[rank][head[rank]].receive, transfers[rank][head[rank]].send
                if receive is not None and receive.tag not in done:
                    break
                if send is not None:
                    issue(rank, orders[rank].produced(send))
                head[rank] += 1
                moved = True
        return moved

    for rank, order in enumerate(orders):
        issue(rank, order.start())
    while complete() | run():
        pass
    stuck = [rank for rank, plan in enumerate(plans) if head[rank] < len(plan.ops)]
    unfinished = [pair for pair, messages in pair_order.items() if pair_next[pair] < len(messages)]
    if not stuck and not unfinished:
        return None
    parts = []
    for rank in stuck:
        op = plans[rank].ops[head[rank]]
        receive = transfers[rank][head[rank]].receive
        parts.append(f"rank {rank} at {op} waits for {receive.describe()}" if receive is not None else f"rank {rank} at {op}")
    for low, high in unfinished:
        message = pair_order[(low, high)][pair_next[(low, high)]]
        parts.append(f"ranks {low} and {high} never complete {message.describe()} after their last ops")
    return "; ".join(parts)

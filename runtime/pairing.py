"""Would the executor's transfers pair up on a backend that matches them by order (NCCL)?

NCCL matches the point-to-point transfers between two ranks by their order, on one
stream for both directions (torch gives single isend/irecv one communicator and stream
per rank pair): the k-th transfer one rank issues with a peer pairs with the k-th the
peer issues with it (tags are ignored; two sides that disagree pair wrong tensors), and
it completes only once both have issued it and every earlier one between them has
completed. A transfer queued behind one the peer has
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
    """None when every rank finishes one step under order-matched transfers; else the
    first pair of different messages matched with each other, or where each stuck rank
    waits (its next op and the message it waits for)."""
    transfers = [op_transfers(plan) for plan in plans]
    orders = [IssueOrder(plan) for plan in plans]
    head = [0] * len(plans)  # next op per rank
    # What each rank issued with each peer, in issue order: NCCL pairs the k-th of one
    # side with the k-th of the other, whatever the tags say.
    issued: dict[tuple[int, int], list[Message]] = {(plan.rank, peer): [] for plan in plans for peer in plan.peer_messages}
    done: set[int] = set()  # tags of completed transfers
    pairs = {(min(rank, peer), max(rank, peer)) for rank, peer in issued}
    pair_next = dict.fromkeys(pairs, 0)  # index of the next transfer to complete
    mismatches: list[str] = []

    def issue(rank: int, messages: list[Message]) -> None:
        for message in messages:
            issued[(rank, message.dst if message.src == rank else message.src)].append(message)

    def complete() -> bool:
        moved = False
        for low, high in pairs:
            i = pair_next[(low, high)]
            mine, theirs = issued[(low, high)], issued[(high, low)]
            while i < len(mine) and i < len(theirs):
                if mine[i] != theirs[i]:
                    mismatches.append(f"ranks {low} and {high} pair {mine[i].describe()} with {theirs[i].describe()}")
                    return False
                done.add(mine[i].tag)
                i += 1
                moved = True
            pair_next[(low, high)] = i
        return moved

    def run() -> bool:
        moved = False
        for rank, plan in enumerate(plans):
            while head[rank] < len(plan.ops):
                receive = transfers[rank][head[rank]].receive
                if receive is not None and receive.tag not in done:
                    break
                for send in transfers[rank][head[rank]].sends:
                    issue(rank, orders[rank].produced(send))
                head[rank] += 1
                moved = True
        return moved

    for rank, order in enumerate(orders):
        issue(rank, order.start())
    while complete() | run():
        pass
    if mismatches:
        return mismatches[0]
    stuck = [rank for rank, plan in enumerate(plans) if head[rank] < len(plan.ops)]
    unfinished = [pair for pair in sorted(pairs) if pair_next[pair] < len(plans[pair[0]].peer_messages[pair[1]])]
    if not stuck and not unfinished:
        return None
    parts = []
    for rank in stuck:
        op = plans[rank].ops[head[rank]]
        receive = transfers[rank][head[rank]].receive
        parts.append(f"rank {rank} at {op} waits for {receive.describe()}" if receive is not None else f"rank {rank} at {op}")
    for low, high in unfinished:
        message = plans[low].peer_messages[high][pair_next[(low, high)]]
        parts.append(f"ranks {low} and {high} never complete {message.describe()} after their last ops")
    return "; ".join(parts)

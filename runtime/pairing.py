"""Would the executor's transfers and collectives pair up, on a backend that matches
point-to-point transfers by order (NCCL) or by tag (gloo)?

NCCL matches the point-to-point transfers between two ranks by their order, on one
stream for both directions (torch gives single isend/irecv one communicator and stream
per rank pair): the k-th transfer one rank issues with a peer pairs with the k-th the
peer issues with it (tags are ignored; two sides that disagree pair wrong tensors), and
it completes only once both have issued it and every earlier one between them has
completed. A transfer queued behind one the peer has
not reached yet waits for it; if that peer in turn waits for something behind this
rank's wait, both hang. gloo matches by tag and would not notice, so the tests run this
check for every schedule they run on gloo. With `by_order=False` the replay matches by
tag, as gloo does: a transfer completes once both sides issued it.

Vocabulary passes add collectives (runtime/collectives.py): an op may wait for one, and
a rank issues each stream's collectives in microbatch order as its ops feed them; a
collective completes once every rank issued it. `run` replays every vocabulary-parallel
schedule with tag matching before any rank starts, and refuses one that would hang.

The replay runs the executor's own rules, not a model of them: the per-op transfers and
the issue order come from runtime/issue.py, which runtime/executor.py and runtime/comm.py
run, the collectives' order from runtime/collectives.py, which runtime/vocab_runner.py
runs. Each rank runs its ops in order; an op first waits for the message it consumes
and the collectives it needs; once it ran, its outputs are handed to the issue orders,
which release what may now be issued, one transfer per message.
"""

from __future__ import annotations

from runtime.collectives import CollectiveOrder, op_collectives
from runtime.issue import IssueOrder, op_transfers
from runtime.plan import Message, RankPlan


def pairing_deadlock(plans: list[RankPlan], by_order: bool = True) -> str | None:
    """None when every rank finishes one step; else the first pair of different messages
    matched with each other (by order only), or where each stuck rank waits (its next op
    and the message or collective it waits for)."""
    transfers = [op_transfers(plan) for plan in plans]
    collectives = [op_collectives(plan) for plan in plans]
    orders = [IssueOrder(plan) for plan in plans]
    collective_orders = [CollectiveOrder(plan.vocab_barriers, plan.num_microbatches) for plan in plans]
    head = [0] * len(plans)  # next op per rank
    # What each rank issued with each peer, in issue order: NCCL pairs the k-th of one
    # side with the k-th of the other, whatever the tags say.
    issued: dict[tuple[int, int], list[Message]] = {(plan.rank, peer): [] for plan in plans for peer in plan.peer_messages}
    done: set[int] = set()  # tags of completed transfers
    pairs = {(min(rank, peer), max(rank, peer)) for rank, peer in issued}
    pair_next = dict.fromkeys(pairs, 0)  # by order: index of the next transfer to complete
    issued_collectives: dict[tuple[str, int], int] = {}  # (stream, microbatch) -> ranks that issued it
    mismatches: list[str] = []

    def issue(rank: int, messages: list[Message]) -> None:
        for message in messages:
            issued[(rank, message.dst if message.src == rank else message.src)].append(message)

    def complete() -> bool:
        moved = False
        for low, high in pairs:
            mine, theirs = issued[(low, high)], issued[(high, low)]
            if not by_order:  # by tag: whatever both sides issued
                both = {m.tag for m in mine} & {m.tag for m in theirs}
                moved |= not both <= done
                done.update(both)
                continue
            i = pair_next[(low, high)]
            while i < len(mine) and i < len(theirs):
                if mine[i] != theirs[i]:
                    mismatches.append(f"ranks {low} and {high} pair {mine[i].describe()} with {theirs[i].describe()}")
                    return False
                done.add(mine[i].tag)
                i += 1
                moved = True
            pair_next[(low, high)] = i
        return moved

    def waits_for(rank: int) -> str | None:
        """What the rank's next op waits for, None when it may run."""
        receive = transfers[rank][head[rank]].receive
        if receive is not None and receive.tag not in done:
            return receive.describe()
        for stream, j in collectives[rank][head[rank]].waits:
            if issued_collectives.get((stream, j), 0) < len(plans):
                return f"the {stream} collective of mb {j}"
        return None

    def run() -> bool:
        moved = False
        for rank, plan in enumerate(plans):
            while head[rank] < len(plan.ops) and waits_for(rank) is None:
                for send in transfers[rank][head[rank]].sends:
                    issue(rank, orders[rank].produced(send))
                for stream, j in collectives[rank][head[rank]].feeds:
                    for ready in collective_orders[rank].fed(stream, j):
                        issued_collectives[(stream, ready)] = issued_collectives.get((stream, ready), 0) + 1
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
    unfinished = [message for plan in plans for messages in plan.peer_messages.values() for message in messages if message.tag not in done]
    if not stuck and not unfinished:
        return None
    parts = []
    for rank in stuck:
        op = plans[rank].ops[head[rank]]
        waiting = waits_for(rank)
        parts.append(f"rank {rank} at {op} waits for {waiting}" if waiting is not None else f"rank {rank} at {op}")
    for low, high in sorted(pairs):
        message = next((m for m in plans[low].peer_messages[high] if m.tag not in done), None)
        if message is not None:
            parts.append(f"ranks {low} and {high} never complete {message.describe()} after their last ops")
    return "; ".join(parts)

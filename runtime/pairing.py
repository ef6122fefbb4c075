"""Would the plans' transfers pair up on a backend that matches them by order (NCCL)?

NCCL matches the point-to-point transfers between two ranks by their order, on one
stream for both directions: a transfer completes only once both ranks have issued it
and every earlier transfer between them has completed. A transfer queued behind one
the peer has not reached yet waits for it; if that peer in turn waits for something
behind this rank's wait, both hang. gloo matches by tag and would not notice, so the
tests run this check for every schedule they run on gloo.

The rules follow the executor (runtime/comm.py): each rank runs its ops in order; an
op waits for the messages it consumes; with each peer a rank issues messages strictly
in the plan's order, a receive as soon as its turn comes, a send once its tensor exists
(the producing op has run) and its turn has come.
"""

from __future__ import annotations

from runtime.plan import ACTIVATION, GRADIENT, Message, RankPlan


def _consumed(plan: RankPlan) -> dict[tuple[int, int], list[Message]]:
    """Per (op index) on this rank, the messages the op waits for."""
    incoming = {(m.kind, m.stage, m.microbatch): m for msgs in plan.peer_messages.values() for m in msgs if m.dst == plan.rank}
    needs: dict[int, list[Message]] = {}
    for index, op in enumerate(plan.ops):
        key = (ACTIVATION, op.stage, op.microbatch) if op.kind == "F" else (GRADIENT, op.stage, op.microbatch)
        if op.kind != "W" and key in incoming:
            needs[index] = [incoming[key]]
    return needs


def _produced(plan: RankPlan) -> dict[int, list[Message]]:
    """Per op index on this rank, the messages it makes (sends)."""
    outgoing = {(m.kind, m.stage, m.microbatch): m for msgs in plan.peer_messages.values() for m in msgs if m.src == plan.rank}
    makes: dict[int, list[Message]] = {}
    for index, op in enumerate(plan.ops):
        if op.kind == "F":
            key = (ACTIVATION, op.stage + 1, op.microbatch)
        elif op.kind in ("B", "BW"):
            key = (GRADIENT, op.stage - 1, op.microbatch)
        else:
            continue
        if key in outgoing:
            makes[index] = [outgoing[key]]
    return makes


def pairing_deadlock(plans: list[RankPlan], batched: bool = False) -> str | None:
    """None when every rank finishes under order-matched transfers; else where each stuck
    rank waits (its next op and the message it waits for).

    `batched` models the executor's NCCL groups: the messages one rank issues with one
    peer at one moment (at the step start, or right after an op made a send) go out as one
    `batch_isend_irecv` group, and waiting for any of them waits for the whole group.
    """
    needs = [_consumed(plan) for plan in plans]
    makes = [_produced(plan) for plan in plans]
    head = [0] * len(plans)  # next op per rank
    cursor = {(plan.rank, peer): 0 for plan in plans for peer in plan.peer_messages}  # next message to issue
    issued: set[tuple[int, int]] = set()  # (rank, tag)
    group_of: dict[tuple[int, int], list[int]] = {}  # (rank, tag) -> tags issued with it
    done: set[int] = set()  # tags of completed transfers
    produced: set[int] = set()  # tags whose tensor exists on the sender
    pair_next = {}  # (low rank, high rank) -> index of the next transfer to complete
    pair_list = {}
    for plan in plans:
        for peer, messages in plan.peer_messages.items():
            pair = (min(plan.rank, peer), max(plan.rank, peer))
            pair_list[pair] = messages
            pair_next[pair] = 0

    def issue(rank: int, peer: int) -> None:
        messages = plans[rank].peer_messages[peer]
        i = cursor[(rank, peer)]
        group: list[int] = []
        while i < len(messages) and (messages[i].dst == rank or messages[i].tag in produced):
            issued.add((rank, messages[i].tag))
            group.append(messages[i].tag)
            i += 1
        cursor[(rank, peer)] = i
        for tag in group:
            group_of[(rank, tag)] = group if batched else [tag]

    def complete() -> bool:
        moved = False
        for pair, messages in pair_list.items():
            i = pair_next[pair]
            while i < len(messages) and (pair[0], messages[i].tag) in issued and (pair[1], messages[i].tag) in issued:
                done.add(messages[i].tag)
                i += 1
                moved = True
            pair_next[pair] = i
        return moved

    def ready(rank: int, message: Message) -> bool:
        return (rank, message.tag) in group_of and all(tag in done for tag in group_of[(rank, message.tag)])

    def run() -> bool:
        moved = False
        for rank, plan in enumerate(plans):
            while head[rank] < len(plan.ops) and all(ready(rank, m) for m in needs[rank].get(head[rank], [])):
                for message in makes[rank].get(head[rank], []):
                    produced.add(message.tag)
                    issue(rank, message.dst)
                head[rank] += 1
                moved = True
        return moved

    for plan in plans:
        for peer in plan.peer_messages:
            issue(plan.rank, peer)
    while complete() | run():
        pass
    stuck = [rank for rank, plan in enumerate(plans) if head[rank] < len(plan.ops)]
    if not stuck:
        return None
    parts = []
    for rank in stuck:
        op = plans[rank].ops[head[rank]]
        waits = [m for m in needs[rank].get(head[rank], []) if not ready(rank, m)]
        parts.append(f"rank {rank} at {op} waits for {waits[0].describe()}" if waits else f"rank {rank} at {op}")
    return "; ".join(parts)

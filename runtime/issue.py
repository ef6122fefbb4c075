"""When one rank issues each of its transfers: the single rule the executor runs and the
pairing check replays.

Per op, the messages it consumes (a received input) and makes (a sent output) follow
from the plan: a message exists exactly when the other stage sits on another rank. With
each peer, a rank issues messages strictly in the plan's global order, one transfer per
message (never grouped): a receive as soon as every earlier message with that peer has
been issued, a send once its tensor exists (the producing op has run) and its turn has
come. Nothing here touches torch, so runtime/comm.py (which issues) and
runtime/pairing.py (which proves the order pairs up) share it.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.plan import ACTIVATION, GRADIENT, HIDDEN, Message, RankPlan


@dataclass(frozen=True)
class OpTransfers:
    """The message an op waits for before it runs and those its output becomes."""

    receive: Message | None
    sends: tuple[Message, ...] = ()


def op_transfers(plan: RankPlan) -> tuple[OpTransfers, ...]:
    """Per op of `plan.ops`, in order, what it receives and sends (None, (): local or none).

    A vocabulary-parallel last stage's F sends its output to every other device's S.
    """
    incoming: dict[tuple[str, int, int, int], Message] = {}
    outgoing: dict[tuple[str, int, int, int], list[Message]] = {}
    for messages in plan.peer_messages.values():
        for message in messages:
            key = (message.kind, message.stage, message.microbatch, message.slice)
            if message.dst == plan.rank:
                incoming[key] = message
            else:
                outgoing.setdefault(key, []).append(message)
    last = plan.num_stages - 1
    found = []
    for op in plan.ops:
        mb, k = op.microbatch, op.slice
        if op.kind == "F":
            sends = outgoing.get((ACTIVATION, op.stage + 1, mb, k), [])
            if op.stage == last:
                sends = outgoing.get((HIDDEN, plan.num_stages, mb, k), [])
            found.append(OpTransfers(incoming.get((ACTIVATION, op.stage, mb, k)), tuple(sends)))
        elif op.kind in ("B", "BW"):
            found.append(OpTransfers(incoming.get((GRADIENT, op.stage, mb, k)), tuple(outgoing.get((GRADIENT, op.stage - 1, mb, k), []))))
        elif op.kind == "S":
            found.append(OpTransfers(incoming.get((HIDDEN, plan.num_stages, mb, k))))
        else:
            found.append(OpTransfers(None))
    return tuple(found)


class IssueOrder:
    """One rank's position, per peer, in the global message order during one step."""

    def __init__(self, plan: RankPlan):
        self.plan = plan
        self._cursor = {peer: 0 for peer in plan.peer_messages}
        self._produced: set[int] = set()  # tags whose tensor exists and is not yet issued

    def start(self) -> list[Message]:
        """A new step: everything issuable before any op runs (leading receives)."""
        self._cursor = {peer: 0 for peer in self.plan.peer_messages}
        self._produced.clear()
        return [m for peer in self.plan.peer_messages for m in self._advance(peer)]

    def produced(self, message: Message) -> list[Message]:
        """`message`'s tensor now exists: what may be issued with its peer, in order."""
        self._produced.add(message.tag)
        return self._advance(message.dst)

    def finished(self) -> bool:
        return all(self._cursor[peer] == len(messages) for peer, messages in self.plan.peer_messages.items())

    def _advance(self, peer: int) -> list[Message]:
        messages = self.plan.peer_messages[peer]
        i = self._cursor[peer]
        ready = []
        while i < len(messages) and (messages[i].dst == self.plan.rank or messages[i].tag in self._produced):
            self._produced.discard(messages[i].tag)
            ready.append(messages[i])
            i += 1
        self._cursor[peer] = i
        return ready

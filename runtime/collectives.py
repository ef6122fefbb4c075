"""Which op feeds and which op waits for each vocabulary collective, and when a rank issues it.

A vocabulary-parallel schedule ties all devices with collectives per microbatch j
(runtime/vocab.py): the statistics stream (fed by every device's S(d, j); with two
barriers awaited by T(d, j), with one barrier also by the last stage's backward of j)
and, with two barriers, the input-gradient stream (fed by every T(d, j), awaited by the
last stage's backward of j). Each stream runs on a process group of its own, and every
rank issues a stream's collectives in microbatch order, each as soon as the rank has fed
it and issued the one before: all ranks then agree on the order without talking. A
collective completes once every rank has issued it.

runtime/pairing.py replays a step under these rules together with the point-to-point
transfers and names where the ranks would wait forever: a rank that feeds microbatch 1
before 0 and waits on 1 in between, or such a wait behind a transfer from a rank in the
same state. Nothing here touches torch, so the executor and that check share it.
"""

from __future__ import annotations

from dataclasses import dataclass

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

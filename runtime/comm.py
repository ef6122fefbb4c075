"""Point-to-point transfers for one rank: issue in the plan's order, wait only when consumed.

Per peer, messages are issued in the plan's global order (see runtime/plan.py): a
receive as soon as every earlier message with that peer has been issued, a send as
soon as its tensor exists and its turn has come. Sends never block the rank; a
receive is waited for only by the op that consumes it, with a timeout, and a failure
names the op, the peer and the microbatch on this rank rather than hanging.

On NCCL the transfers newly issued with one peer go out as one batch
(`batch_isend_irecv`, one NCCL group); gloo takes plain isend/irecv matched by tag.
"""

from __future__ import annotations

import datetime
import re
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from optimizer.errors import PipeschedError
from optimizer.schedule import Op
from runtime.plan import ACTIVATION, Message, RankPlan

Key = tuple[str, int, int]  # (kind, consuming stage, microbatch)


class CommError(PipeschedError):
    """A transfer that timed out or whose peer failed (exit 1)."""

    exit_code = 1


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype


def _key(message: Message) -> Key:
    return (message.kind, message.stage, message.microbatch)


class P2P:
    """This rank's transfers for one step at a time."""

    def __init__(
        self,
        plan: RankPlan,
        outputs: list[TensorSpec],  # outputs[s]: what stage s returns (and its gradient)
        device: torch.device,
        timeout_s: float,
        batched: bool,
    ):
        self.plan = plan
        self.outputs = outputs
        self.device = device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.batched = batched
        self._by_key = {_key(m): m for msgs in plan.peer_messages.values() for m in msgs}
        self._cursor: dict[int, int] = {}
        self._produced: dict[Key, torch.Tensor] = {}
        self._receives: dict[Key, tuple[torch.Tensor, list]] = {}
        self._sends: list[tuple[list, torch.Tensor, Message]] = []
        self.wait_seconds = 0.0

    # ------------------------------------------------------------------ step boundaries

    def start_step(self) -> None:
        self._cursor = {peer: 0 for peer in self.plan.peer_messages}
        self.wait_seconds = 0.0
        self._advance(self.plan.peer_messages)

    def finish_step(self) -> None:
        """Wait for this step's sends, so their buffers can go and the next step starts clean."""
        for works, _, message in self._sends:
            self._wait(works, message, f"after its last op (sending {message.describe()})")
        self._sends.clear()
        if self._receives or self._produced:
            left = len(self._receives) + len(self._produced)
            raise CommError(f"rank {self.plan.rank}: the step ended with {left} transfers never consumed or sent")

    # ------------------------------------------------------------------ sends and receives

    def send(self, kind: str, stage: int, microbatch: int, tensor: torch.Tensor) -> None:
        message = self._by_key[(kind, stage, microbatch)]
        self._produced[_key(message)] = tensor.detach().contiguous()
        self._advance((message.dst,))

    def take(self, kind: str, stage: int, microbatch: int, op: Op) -> torch.Tensor:
        key = (kind, stage, microbatch)
        message = self._by_key[key]
        if key not in self._receives:  # the plan guarantees it was issued; this is a bug guard
            raise CommError(f"rank {self.plan.rank}: {op} needs {message.describe()}, which was never received")
        buffer, works = self._receives.pop(key)
        start = time.perf_counter()
        self._wait(works, message, f"at {op}")
        self.wait_seconds += time.perf_counter() - start
        self._advance((message.src,))
        return buffer

    # ------------------------------------------------------------------ internals

    def _advance(self, peers) -> None:
        """Issue, per peer, every message whose turn has come."""
        for peer in peers:
            messages = self.plan.peer_messages[peer]
            i = self._cursor[peer]
            round_ops: list[tuple[dist.P2POp, Message]] = []
            while i < len(messages):
                message = messages[i]
                key = _key(message)
                if message.dst == self.plan.rank:
                    spec = self.outputs[message.stage - 1 if message.kind == ACTIVATION else message.stage]
                    buffer = torch.empty(spec.shape, dtype=spec.dtype, device=self.device)
                    round_ops.append((dist.P2POp(dist.irecv, buffer, peer, tag=message.tag), message))
                elif key in self._produced:
                    tensor = self._produced.pop(key)
                    round_ops.append((dist.P2POp(dist.isend, tensor, peer, tag=message.tag), message))
                else:
                    break
                i += 1
            self._cursor[peer] = i
            self._issue(round_ops)
        self._reap_sends()

    def _issue(self, round_ops: list[tuple[dist.P2POp, Message]]) -> None:
        if not round_ops:
            return
        if self.batched:
            # One group per peer: a wait then couples only transfers with that peer.
            works = dist.batch_isend_irecv([p2p for p2p, _ in round_ops])
            per_op = [works] * len(round_ops)
        else:
            per_op = [[p2p.op(p2p.tensor, p2p.peer, tag=p2p.tag)] for p2p, _ in round_ops]
        for (p2p, message), works in zip(round_ops, per_op):
            if message.dst == self.plan.rank:
                self._receives[_key(message)] = (p2p.tensor, works)
            else:
                self._sends.append((works, p2p.tensor, message))

    def _reap_sends(self) -> None:
        # Completed sends release their tensors early; the rest wait for finish_step.
        self._sends = [entry for entry in self._sends if not all(w.is_completed() for w in entry[0])]

    def _wait(self, works: list, message: Message, where: str) -> None:
        rank = self.plan.rank
        peer = message.src if message.dst == rank else message.dst
        direction = "from" if message.dst == rank else "to"
        try:
            for work in works:
                work.wait(self.timeout)
        except Exception as exc:  # the backends raise RuntimeError or DistBackendError
            text = str(exc).strip()
            first_line = text.splitlines()[0] if text else exc.__class__.__name__
            first_line = re.sub(r"^\[[^\]]*\]\s*", "", first_line)  # gloo's "[file.cc:line]" prefix
            if "timed out" in first_line.lower() or "timeout" in first_line.lower():
                reason = f"no transfer within {self.timeout.total_seconds():g} s"
            else:
                reason = f"the transfer failed ({first_line[:160]})"
            raise CommError(f"rank {rank} {where}: {message.describe()} {direction} rank {peer}: {reason}") from None

"""Point-to-point transfers for one rank: issue in the plan's order, wait only when consumed.

One path for every backend. With each peer, messages are issued one by one in the plan's
global order (runtime/issue.py: a receive as soon as every earlier message with that
peer has been issued, a send as soon as its tensor exists and its turn has come), each
as its own isend/irecv. NCCL pairs them by that order, on one stream per rank pair;
gloo also matches the tag; runtime/pairing.py replays the same rule to prove no transfer
waits behind one its peer has not reached. Nothing is grouped with
`batch_isend_irecv`: a wait there covers the whole group, which couples an activation
needed now with one needed a pipeline round later (interleaved placements hang), and
torch runs such groups on the rank's one collective stream, coupling peers too.

Sends never block the rank; a receive is waited for only by the op that consumes it,
with a timeout, and a failure names the op, the peer and the microbatch on this rank
rather than hanging.
"""

from __future__ import annotations

import contextlib
import datetime
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from optimizer.errors import PipeschedError
from optimizer.schedule import Op
from runtime.issue import IssueOrder
from runtime.plan import ACTIVATION, HIDDEN, Message, RankPlan


class CommError(PipeschedError):
    """A transfer that timed out or whose peer failed (exit 1)."""

    exit_code = 1


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype


class P2P:
    """This rank's transfers for one step at a time."""

    def __init__(
        self,
        plan: RankPlan,
        outputs: list[TensorSpec],  # outputs[s]: what stage s returns (and its gradient)
        device: torch.device,
        timeout_s: float,
        slice_bounds: list[tuple[int, int]] | None = None,  # token slices: [a_k, b_k) on dimension 1
    ):
        self.plan = plan
        self.outputs = outputs
        self.slice_bounds = slice_bounds
        self.device = device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._order = IssueOrder(plan)
        self._tensors: dict[int, torch.Tensor] = {}  # tag -> produced, not yet issued
        self._receives: dict[int, tuple[torch.Tensor, list]] = {}  # tag -> (buffer, works)
        self._sends: list[tuple[list, torch.Tensor, Message]] = []
        self.wait_seconds = 0.0

    # ------------------------------------------------------------------ step boundaries

    def start_step(self) -> None:
        self.wait_seconds = 0.0
        self._issue(self._order.start())

    def finish_step(self) -> None:
        """Wait for this step's sends, so their buffers can go and the next step starts clean."""
        for works, _, message in self._sends:
            self._wait(works, message, f"after its last op (sending {message.describe()})")
        self._sends.clear()
        if self._receives or self._tensors or not self._order.finished():
            left = len(self._receives) + len(self._tensors)
            raise CommError(f"rank {self.plan.rank}: the step ended with {left} transfers never consumed or sent")

    # ------------------------------------------------------------------ sends and receives

    def send(self, message: Message, tensor: torch.Tensor) -> None:
        self._tensors[message.tag] = tensor.detach().contiguous()
        self._issue(self._order.produced(message))

    def take(self, message: Message, op: Op) -> torch.Tensor:
        if message.tag not in self._receives:  # the issue order guarantees it was issued; this is a bug guard
            raise CommError(f"rank {self.plan.rank}: {op} needs {message.describe()}, which was never received")
        buffer, works = self._receives.pop(message.tag)
        start = time.perf_counter()
        self._wait(works, message, f"at {op}")
        self.wait_seconds += time.perf_counter() - start
        self._reap_sends()
        return buffer

    # ------------------------------------------------------------------ internals

    def _issue(self, messages: list[Message]) -> None:
        """One isend/irecv per message, in the order given (the per-peer global order)."""
        rank = self.plan.rank
        for message in messages:
            if message.dst == rank:
                # An activation (or the hidden states, "stage" num_stages) is the previous stage's output.
                spec = self.outputs[message.stage - 1 if message.kind in (ACTIVATION, HIDDEN) else message.stage]
                shape = spec.shape
                if self.slice_bounds is not None:  # a slice's tensor holds its own tokens only
                    start, end = self.slice_bounds[message.slice]
                    shape = (shape[0], end - start, *shape[2:])
                buffer = torch.empty(shape, dtype=spec.dtype, device=self.device)
                with self._failing_as(message, "posting a receive"):
                    self._receives[message.tag] = (buffer, [dist.irecv(buffer, message.src, tag=message.tag)])
            else:
                tensor = self._tensors.pop(message.tag)
                # gloo sends at once: a dead peer's closed connection shows here, not at a wait.
                with self._failing_as(message, "sending"):
                    self._sends.append(([dist.isend(tensor, message.dst, tag=message.tag)], tensor, message))
        self._reap_sends()

    def _reap_sends(self) -> None:
        # Completed sends release their tensors early; the rest wait for finish_step.
        self._sends = [entry for entry in self._sends if not all(w.is_completed() for w in entry[0])]

    def _wait(self, works: list, message: Message, where: str) -> None:
        with self._failing_as(message, where):
            for work in works:
                work.wait(self.timeout)

    @contextlib.contextmanager
    def _failing_as(self, message: Message, where: str) -> Iterator[None]:
        """A backend's failure on `message` as a CommError naming this rank, where it was,
        the transfer and the peer (not as the model's error, which a caller would make of it)."""
        rank = self.plan.rank
        try:
            yield
        except Exception as exc:  # the backends raise RuntimeError or DistBackendError
            peer = message.src if message.dst == rank else message.dst
            direction = "from" if message.dst == rank else "to"
            reason = failure_reason(exc, self.timeout, "transfer")
            raise CommError(f"rank {rank} {where}: {message.describe()} {direction} rank {peer}: {reason}") from None


def all_ranks_meet(rank: int, where: str, call: Callable[[], object]) -> None:
    """Run a collective every rank must reach (a barrier, the results' gathering); when one
    never arrives (stuck in an op past its last transfer, or dead), say so, not what the
    backend's timeout looks like from here."""
    try:
        call()
    except Exception as exc:  # the backends raise RuntimeError or DistBackendError
        raise CommError(f"rank {rank} {where}: not every rank arrived, one is stuck in an op or died ({backend_line(exc)})") from None


def failure_reason(exc: BaseException, timeout: datetime.timedelta, what: str) -> str:
    """A backend's failure in a few words: a timeout, or its message's first line."""
    first_line = backend_line(exc)
    if "timed out" in first_line.lower() or "timeout" in first_line.lower():
        return f"no {what} within {timeout.total_seconds():g} s"
    return f"the {what} failed ({first_line})"


def backend_line(exc: BaseException) -> str:
    """The first line of a backend's error, without gloo's "[file.cc:line]" prefix, at most 160 characters."""
    text = str(exc).strip()
    first_line = text.splitlines()[0] if text else exc.__class__.__name__
    return re.sub(r"^\[[^\]]*\]\s*", "", first_line)[:160]

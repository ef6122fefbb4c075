"""One rank's vocabulary shard during a step: its S and T passes, their collectives and
the sharded token embedding around the pipeline.

S(d, j) takes the last stage's output for microbatch j and makes this rank's share of
the statistics collective; T(d, j) uses its result and, with two barriers, makes the
share of the input-gradient collective; the last stage's backward of j takes dh.
The executor says when, by runtime/collectives.py's rule (the one the up-front check
replays): it feeds a share once the op that made it has run, and waits before an op
that needs a result. Each stream is a process group of its own; a collective is issued
asynchronously as soon as the rank's order allows, and waited for with the run's
timeout.

The token embedding is not scheduled per microbatch: before the pipeline each rank looks
up its rows for every microbatch's tokens (zeros elsewhere) and the sum is reduced onto
the first stage's rank; after the pipeline that rank broadcasts the gradients of its
inputs, and every rank backpropagates them into its rows. Both run on the default
group, when no transfer of the step is in flight.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from optimizer.errors import PipeschedError
from runtime.collectives import INPUT_GRADIENT, STATS, CollectiveOrder
from runtime.comm import failure_reason
from runtime.plan import RankPlan
from runtime.vocab import (
    Global,
    VocabShard,
    backward_one,
    backward_two,
    combine_one,
    combine_stats,
    forward_one,
    forward_two,
    local_targets,
)


class CollectiveError(PipeschedError):
    """A vocabulary collective that timed out or failed (exit 1)."""

    exit_code = 1


class VocabRunner:
    def __init__(self, shard: VocabShard, plan: RankPlan, groups: dict[str, dist.ProcessGroup], timeout_s: float):
        self.shard = shard
        self.plan = plan
        self.barriers = plan.vocab_barriers
        self.scale = 1.0 / plan.num_microbatches  # each microbatch's loss counts 1/m of the step's mean
        self.first_device = plan.stage_device[0]
        self.last_device = plan.stage_device[-1]  # the only rank that needs dh
        self.groups = groups
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.order = CollectiveOrder(self.barriers, plan.num_microbatches)
        self.wait_seconds = 0.0
        self._shares: dict[tuple[str, int], torch.Tensor] = {}  # this rank's share, not yet issued
        self._works: dict[tuple[str, int], tuple[dist.Work, list[torch.Tensor]]] = {}
        self._kept: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # S -> T: h, logits, local targets
        self._stats: dict[int, Global] = {}
        self._dh: dict[int, torch.Tensor] = {}
        self._shape: dict[int, torch.Size] = {}  # the last stage's output shape per microbatch
        self._loss: torch.Tensor | None = None
        self._embedded: torch.Tensor | None = None
        self._input_grads: dict[int, torch.Tensor] = {}

    # ------------------------------------------------------------------ around the pipeline

    def start_step(self, tokens: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every microbatch's token embedding, summed over the shards on the first stage's
        rank (its stage-0 inputs); other ranks get []."""
        self.order.start()
        self.wait_seconds = 0.0
        self._loss = None
        self._embedded = self.shard.embed(torch.cat(tokens))
        total = self._embedded.detach().clone()
        dist.reduce(total, self.first_device)
        return list(total.chunk(len(tokens))) if self.plan.rank == self.first_device else []

    def embedding_gradient(self, mb: int, grad: torch.Tensor) -> None:
        """The gradient of stage 0's input for microbatch `mb` (first stage's rank only)."""
        self._input_grads[mb] = grad

    def finish_step(self) -> float:
        """Wait for the collectives no op waited for, send the embedding's gradient to every
        shard and accumulate it; returns the step's loss (every rank knows it)."""
        for stream, mb in list(self._works):
            self.wait(stream, mb, "at the step's end")
        assert self._embedded is not None and self._loss is not None and not self._shares and not self._kept
        assert self.order.finished(), "every collective of the step was issued"
        if self.plan.rank == self.first_device:
            grad = torch.cat([self._input_grads.pop(mb) for mb in range(self.plan.num_microbatches)])
        else:
            grad = torch.empty_like(self._embedded)
        dist.broadcast(grad, self.first_device)
        self._embedded.backward(grad)
        self._embedded = None
        self._stats.clear()
        self._dh.clear()
        self._shape.clear()
        return float(self._loss)

    # ------------------------------------------------------------------ the passes

    def forward(self, mb: int, h: torch.Tensor, targets: torch.Tensor) -> None:
        """S: the shard's logits and its share of the statistics collective."""
        self._shape[mb] = h.shape
        flat = h.reshape(-1, h.shape[-1])
        local = local_targets(targets.reshape(-1), self.shard.bounds)
        with torch.no_grad():
            weight = self.shard.head
            logits, packet = forward_two(flat, weight, local) if self.barriers == 2 else forward_one(flat, weight, local)
        self._kept[mb] = (flat, logits, local)
        self._shares[(STATS, mb)] = packet

    def backward(self, mb: int) -> None:
        """T, after the statistics collective: the shard's weight gradient (and, with two
        barriers, its share of dh for the input-gradient collective)."""
        stats = self._stats[mb]
        h, logits, local = self._kept.pop(mb)
        with torch.no_grad():
            if self.barriers == 2:
                dweight, self._shares[(INPUT_GRADIENT, mb)] = backward_two(h, self.shard.head, logits, local, stats, self.scale)
            else:
                dweight = backward_one(h, logits, local, stats, self.scale)
        head = self.shard.head
        head.grad = dweight if head.grad is None else head.grad + dweight

    def input_gradient(self, mb: int) -> torch.Tensor:
        """dh of microbatch `mb` for the last stage's backward, after its collective."""
        return self._dh.pop(mb).reshape(self._shape.pop(mb))

    # ------------------------------------------------------------------ collectives

    def feed(self, stream: str, mb: int) -> None:
        """The op that made this rank's share of (stream, mb) has run: issue what the order allows."""
        for ready in self.order.fed(stream, mb):
            key = (stream, ready)
            share = self._shares.pop(key).contiguous()
            group = self.groups[stream]
            if stream == STATS:
                gathered = [torch.empty_like(share) for _ in range(self.plan.world_size)]
                self._works[key] = (dist.all_gather(gathered, share, group=group, async_op=True), gathered)
            else:
                self._works[key] = (dist.all_reduce(share, group=group, async_op=True), [share])

    def wait(self, stream: str, mb: int, where: str) -> None:
        """Before an op that needs (stream, mb): wait for it, once, and keep what it delivers
        (statistics and loss, dh on the last stage's rank)."""
        key = (stream, mb)
        if key not in self._works:  # an earlier op waited for it already
            return
        work, buffers = self._works.pop(key)
        start = time.perf_counter()
        try:
            work.wait(self.timeout)
        except Exception as exc:  # the backends raise RuntimeError or DistBackendError
            reason = failure_reason(exc, self.timeout, "collective")
            raise CollectiveError(f"rank {self.plan.rank} {where}: the {stream} collective of mb {mb}: {reason}") from None
        self.wait_seconds += time.perf_counter() - start
        keep_dh = self.plan.rank == self.last_device
        if stream != STATS:
            if keep_dh:
                self._dh[mb] = buffers[0]
            return
        if self.barriers == 2:
            stats = combine_stats(buffers)
        else:
            stats, dh = combine_one(buffers, self.scale)
            if keep_dh:
                self._dh[mb] = dh
        self._stats[mb] = stats
        loss = stats.token_losses().mean() * self.scale
        self._loss = loss if self._loss is None else self._loss + loss

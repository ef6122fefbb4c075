"""The executor: one rank runs exactly its device's ops, in the schedule's order.

F takes the microbatch on the first stage, or the activation from the previous stage
(handed over in memory when that stage is on this rank, received otherwise), runs the
stage and passes the output on the same way. B takes the output gradient (the last
stage starts from its loss), computes the input gradient only, and passes it upstream.
W accumulates the parameter gradients of one microbatch; BW does B and W in one call.
The optimizer step is the caller's, after the step.

With token slices every op is one slice's: the first stage takes the slice's tokens,
the last stage the slice's targets, and what passes between stages is the slice's part
(runtime/slicing.py, runtime/stage.py).

With vocabulary passes (runtime/vocab_runner.py) the first stage takes the summed
sharded embeddings and gives its input gradient back to them; the last stage's F output
goes to this rank's S and to every other rank's; S and T run this rank's shard; the last
stage's backward starts from dh, delivered by a collective.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from optimizer.ops import VOCAB_KINDS
from optimizer.schedule import Op
from runtime.collectives import op_collectives
from runtime.comm import P2P
from runtime.issue import op_transfers
from runtime.memory import MemoryMeter
from runtime.models import LossFn
from runtime.plan import ACTIVATION, GRADIENT, HIDDEN, Message, RankPlan
from runtime.position import RankPosition
from runtime.stage import StageRunner
from runtime.vocab_runner import VocabRunner


@dataclass
class OpTiming:
    """When an op ran, in seconds from the step start; `wait` is time blocked on a receive."""

    op: Op
    start: float
    end: float
    wait: float

    @property
    def busy(self) -> float:
        return self.end - self.start - self.wait


@dataclass
class StepResult:
    seconds: float  # from the step start to the last op and send done on this rank
    loss: float | None  # on the rank holding the last stage (on every rank with vocabulary passes)
    timings: list[OpTiming] = field(default_factory=list)


class Executor:
    def __init__(
        self,
        plan: RankPlan,
        modules: dict[int, nn.Module],
        loss_fn: LossFn,
        p2p: P2P,
        device: torch.device,
        meter: MemoryMeter | None = None,
        synchronize: bool = False,
        slice_bounds: list[tuple[int, int]] | None = None,  # token slices: [a_k, b_k) per slice
        vocab: VocabRunner | None = None,  # this rank's vocabulary shard, for a plan with vocabulary passes
        position: RankPosition | None = None,  # where the launcher reads the op this rank is in
    ):
        self.plan = plan
        self.position = position
        self.p2p = p2p
        self.device = device
        # Whole sequences for every slice's op would count each token K times.
        assert (slice_bounds is None) == (plan.num_slices == 1), "a sliced plan runs with its slices' token ranges"
        assert (vocab is None) == (plan.vocab_barriers == 0), "a plan with vocabulary passes runs with a shard"
        self.slice_bounds = slice_bounds
        self.vocab = vocab
        stage_loss = loss_fn if vocab is None else None  # the vocabulary passes compute the loss
        self.runners = {
            s: StageRunner(
                module, s, plan.num_stages, plan.num_microbatches, stage_loss, meter, slice_bounds, input_gradient=vocab is not None
            )
            for s, module in modules.items()
        }
        # Per-op timings on a GPU need the device idle at each boundary (profiling only).
        self.synchronize = synchronize and device.type == "cuda"
        self._handed: dict[tuple[str, int, int, int], torch.Tensor] = {}
        # The same per-op transfers and collectives the pairing check replays (runtime/pairing.py).
        self._transfers = op_transfers(plan)
        self._collectives = op_collectives(plan)

    def run_step(self, inputs: list[torch.Tensor], targets: list[torch.Tensor], record: bool = False, step: int = 0) -> StepResult:
        """Run this rank's ops for one step; `inputs`/`targets` are per microbatch (with
        vocabulary passes every rank gets both: the tokens are embedded on every rank)."""
        for runner in self.runners.values():
            runner.start_step()
        self._handed.clear()
        timings: list[OpTiming] = []
        start = time.perf_counter()
        if self.vocab is not None:
            inputs = self.vocab.start_step(inputs)  # before any transfer of the step is issued
        self.p2p.start_step()
        for op, transfers, collectives in zip(self.plan.ops, self._transfers, self._collectives, strict=True):
            op_start = time.perf_counter()
            waited_before = self._waited()
            if self.position is not None:
                self.position.enter(step, op)
            if self.vocab is not None:
                for stream, j in collectives.waits:
                    self.vocab.wait(stream, j, f"at {op}")
            self._run(op, transfers.receive, transfers.sends, inputs, targets)
            if self.vocab is not None:
                for stream, j in collectives.feeds:
                    self.vocab.feed(stream, j)
            if self.synchronize:
                torch.cuda.synchronize(self.device)
            if record:
                now = time.perf_counter()
                timings.append(OpTiming(op, op_start - start, now - start, self._waited() - waited_before))
        if self.position is not None:
            self.position.finishing(step)
        self.p2p.finish_step()
        last = self.plan.num_stages - 1
        loss = self.runners[last].step_loss() if last in self.runners else None
        if self.vocab is not None:
            loss = self.vocab.finish_step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        if self.position is not None:
            self.position.step_done(step)
        return StepResult(seconds, loss, timings)

    def _waited(self) -> float:
        return self.p2p.wait_seconds + (self.vocab.wait_seconds if self.vocab is not None else 0.0)

    def _run(
        self, op: Op, receive: Message | None, sends: tuple[Message, ...], inputs: list[torch.Tensor], targets: list[torch.Tensor]
    ) -> None:
        s, mb, k = op.stage, op.microbatch, op.slice
        if op.kind in VOCAB_KINDS:  # `stage` is the shard: this rank's
            assert self.vocab is not None, "vocabulary passes run with a shard"
            if op.kind == "S":
                self.vocab.forward(mb, self._take((HIDDEN, self.plan.num_stages, mb, k), receive, op), targets[mb])
            else:
                self.vocab.backward(mb)
            return
        runner = self.runners[s]
        hidden = self.vocab is not None and s == self.plan.num_stages - 1  # its output goes to the vocabulary passes
        if op.kind == "F":
            x = self._tokens(inputs[mb], k) if s == 0 else self._take((ACTIVATION, s, mb, k), receive, op)
            out = runner.forward(mb, x, self._tokens(targets[mb], k) if runner.last else None, k)
            if hidden:
                self._give((HIDDEN, s + 1, mb, k), out, sends, local=True)  # every rank's S, this one's too
            elif not runner.last:
                self._give((ACTIVATION, s + 1, mb, k), out, sends, local=not sends)
        elif op.kind in ("B", "BW"):
            if runner.last:
                grad = None
            elif hidden:
                assert self.vocab is not None
                grad = self.vocab.input_gradient(mb)
            else:
                grad = self._take((GRADIENT, s, mb, k), receive, op)
            grad_in = runner.backward_input(mb, grad, k) if op.kind == "B" else runner.backward_fused(mb, grad, k)
            if s > 0:
                assert grad_in is not None, "a stage after the first passes an input gradient on"
                self._give((GRADIENT, s - 1, mb, k), grad_in, sends, local=not sends)
            elif self.vocab is not None:
                assert grad_in is not None, "the first stage gives its input gradient to the sharded embedding"
                self.vocab.embedding_gradient(mb, grad_in)
        else:
            runner.backward_weight(mb, k)

    def _tokens(self, batch: torch.Tensor, slice: int) -> torch.Tensor:
        """A microbatch's inputs or targets of one token slice (dimension 1)."""
        if self.slice_bounds is None:
            return batch
        start, end = self.slice_bounds[slice]
        return batch[:, start:end]

    def _take(self, key: tuple[str, int, int, int], receive: Message | None, op: Op) -> torch.Tensor:
        """The input `op` consumes (key: kind, consuming stage, microbatch, slice): handed over on this rank, or received."""
        if receive is None:  # the producing op is on this rank
            return self._handed.pop(key)
        return self.p2p.take(receive, op)

    def _give(self, key: tuple[str, int, int, int], tensor: torch.Tensor, sends: tuple[Message, ...], local: bool) -> None:
        if local:
            self._handed[key] = tensor  # same device: no communication
        for send in sends:
            self.p2p.send(send, tensor)

"""`--check`: the pipeline's first step against the same model trained in one process.

Every rank builds a fresh copy of the whole model (same seeds, so the same weights),
runs the step's whole batch through it in one forward and one backward, and compares
the loss and each of its own stages' parameter gradients with the pipeline's.

Tolerance (float32): a parameter passes when max|pipeline - reference| <= 1e-4 x
max|reference| (and the loss within 1e-5 relative). The two sides add the same terms in
different orders (per microbatch and per op here, one batched GEMM there), which moves
results by a few float32 roundings, 1e-7 to 1e-6 of the gradient's scale in practice;
a real fault (a microbatch lost or counted twice, a gradient sent to the wrong stage)
changes a gradient by at least 1/M of its scale, i.e. percents.

With vocabulary passes each rank's shard of the token embedding and of the output layer
is compared with the same rows of the reference's full weights' gradients.

Token-sliced schedules are compared with the same unsliced reference: their slices'
losses add up to the batch mean (runtime/stage.py), so the gradients must agree to the
same tolerance; attention over a concatenated cache only reorders sums again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from runtime.models import PipelineModel
from runtime.vocab import VocabShard

GRAD_RTOL = 1e-4
LOSS_RTOL = 1e-5


@dataclass(frozen=True)
class Reference:
    loss: float
    grads: list[dict[str, torch.Tensor]]  # per stage: parameter name -> gradient


def reference_step(model: PipelineModel, inputs: torch.Tensor, targets: torch.Tensor) -> Reference:
    """Loss and gradients of one step of the whole model in this process."""
    whole = nn.Sequential(*model.stages)
    whole.zero_grad(set_to_none=True)
    loss = model.loss_fn(whole(inputs), targets)
    loss.backward()
    grads = [{name: p.grad.detach().clone() for name, p in stage.named_parameters() if p.grad is not None} for stage in model.stages]
    return Reference(float(loss.detach()), grads)


@dataclass(frozen=True)
class Mismatch:
    stage: int
    parameter: str
    error: float  # max abs difference relative to the reference's largest magnitude

    def describe(self) -> str:
        return f"stage {self.stage} parameter {self.parameter}: relative error {self.error:.2e} > {GRAD_RTOL:g}"


def compare_gradients(modules: dict[int, nn.Module], reference: Reference) -> tuple[list[Mismatch], float, int]:
    """Mismatching parameters of this rank's stages (in stage order), the largest relative
    error seen, and how many parameters were compared."""
    found = [_compare(s, name, p.grad, reference.grads[s].get(name)) for s in sorted(modules) for name, p in modules[s].named_parameters()]
    return _summary(found)


def compare_shard(shard: VocabShard, reference: Reference) -> tuple[list[Mismatch], float, int]:
    """A vocabulary shard's gradients against the same rows of the reference's token
    embedding (in the first stage) and output layer (in the last stage)."""
    start, end = shard.bounds
    rows = f"[{start}:{end}]"
    found = []
    for stage, name, p in ((0, shard.names[0], shard.embedding), (len(reference.grads) - 1, shard.names[1], shard.head)):
        full = reference.grads[stage].get(name)
        found.append(_compare(stage, name + rows, p.grad, None if full is None else full[start:end]))
    return _summary(found)


def _compare(stage: int, name: str, grad: torch.Tensor | None, expected: torch.Tensor | None) -> tuple[Mismatch | None, float]:
    """One parameter's mismatch (None when it matches) and its relative error."""
    if expected is None:  # no gradient in the reference: none, or zeros, here
        return (Mismatch(stage, name, float("inf")) if grad is not None and grad.abs().max() > 0 else None), 0.0
    if grad is None:
        return Mismatch(stage, name, float("inf")), 0.0
    scale = float(expected.abs().max())
    error = float((grad.detach().cpu() - expected).abs().max()) / max(scale, 1e-30)
    return (None if error <= GRAD_RTOL else Mismatch(stage, name, error)), error  # the test also catches NaN


def _summary(found: list[tuple[Mismatch | None, float]]) -> tuple[list[Mismatch], float, int]:
    return [m for m, _ in found if m is not None], max((error for _, error in found), default=0.0), len(found)


def loss_matches(pipeline_loss: float, reference_loss: float) -> bool:
    return abs(pipeline_loss - reference_loss) <= LOSS_RTOL * max(abs(reference_loss), 1e-30)

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

Token-sliced schedules are compared with the same unsliced reference: their slices'
losses add up to the batch mean (runtime/stage.py), so the gradients must agree to the
same tolerance; attention over a concatenated cache only reorders sums again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from runtime.models import PipelineModel

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
    mismatches: list[Mismatch] = []
    worst, count = 0.0, 0
    for s in sorted(modules):
        expected = reference.grads[s]
        for name, p in modules[s].named_parameters():
            count += 1
            if name not in expected:
                if p.grad is not None and p.grad.abs().max() > 0:
                    mismatches.append(Mismatch(s, name, float("inf")))
                continue
            if p.grad is None:
                mismatches.append(Mismatch(s, name, float("inf")))
                continue
            ref = expected[name]
            scale = float(ref.abs().max())
            error = float((p.grad.detach().cpu() - ref).abs().max()) / max(scale, 1e-30)
            worst = max(worst, error)
            if not error <= GRAD_RTOL:  # also catches NaN
                mismatches.append(Mismatch(s, name, error))
    return mismatches, worst, count


def loss_matches(pipeline_loss: float, reference_loss: float) -> bool:
    return abs(pipeline_loss - reference_loss) <= LOSS_RTOL * max(abs(reference_loss), 1e-30)

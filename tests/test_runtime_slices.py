"""Token slices in the executor, in one process: sliced attention against the whole
sequence, the cache's lifetime, slice bounds and refusals, per-slice messages, and the
synthetic model's per-slice ops.

Tolerance of the gradient comparisons: 1e-5 of the reference's largest magnitude. The
sliced run adds the same terms in another order (per slice, attention over a
concatenated cache), which moves float32 results by about 1e-6 of their scale here;
losing the gradients that later slices send to earlier slices' keys and values changes
them by tens of percent (checked below, so the comparison can fail).
"""

from __future__ import annotations

import weakref
from typing import cast

import pytest
import torch
import torch.nn as nn

from optimizer.errors import InputError
from optimizer.problem import uniform_problem
from optimizer.schedules import generate
from optimizer.slicing import slice_model, with_slices
from runtime.models import GPTConfig, PipelineModel, build_example, load_model
from runtime.plan import ACTIVATION, build_plans
from runtime.session import token_slices
from runtime.slicing import slice_bounds
from runtime.stage import StageRunner
from runtime.synthetic import SleepingStage

pytestmark = pytest.mark.runtime

torch.set_num_threads(1)
TINY = GPTConfig(layers=4, hidden=32, heads=2, vocab=64, seq_len=16)
RTOL = 1e-5
UNEVEN = [(0, 8), (8, 13), (13, 16)]


def _run(bounds: list[tuple[int, int]] | None, split: bool, drop_cache_gradients: bool = False):
    """One microbatch through a 3-stage example GPT, slice by slice (F in order, backward
    in reverse, W last, as a sliced schedule may); returns the loss, every parameter's
    gradient, and the runners."""
    model = build_example(TINY, 3, [1, 2, 1])
    inputs, targets = model.make_batch(0, 1)
    runners = [StageRunner(m, s, 3, 1, model.loss_fn, None, bounds) for s, m in enumerate(model.stages)]
    ranges = bounds or [(0, TINY.seq_len)]
    loss = 0.0
    for k, (a, b) in enumerate(ranges):
        h = runners[0].forward(0, inputs[:, a:b], None, k)
        h = runners[1].forward(0, h, None, k)
        loss += float(runners[2].forward(0, h, targets[:, a:b], k))
    for k in reversed(range(len(ranges))):
        grad = None
        for runner in reversed(runners):
            if drop_cache_gradients:
                runner._cache_grads.pop((0, k), None)
            grad = runner.backward_input(0, grad, k) if split else runner.backward_fused(0, grad, k)
    if split:
        for runner in runners:
            for k in range(len(ranges)):
                runner.backward_weight(0, k)
    grads = {f"{s}.{n}": p.grad.clone() for s, m in enumerate(model.stages) for n, p in m.named_parameters() if p.grad is not None}
    return loss, grads, runners


def _worst(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    assert grads.keys() == reference.keys()
    return max(float((grads[n] - reference[n]).abs().max() / reference[n].abs().max()) for n in reference)


@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
@pytest.mark.parametrize("bounds", [[(0, 4), (4, 8), (8, 12), (12, 16)], UNEVEN], ids=["even", "uneven"])
def test_sliced_attention_gives_the_whole_sequence_gradients(bounds, split):
    ref_loss, reference, _ = _run(None, split=False)
    loss, grads, runners = _run(bounds, split)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert _worst(grads, reference) <= RTOL
    for runner in runners:  # every slice's cache went with its backward
        assert not runner._cache and not runner._cache_grads and not runner._in_flight


def test_the_comparison_sees_lost_cache_gradients():
    _, reference, _ = _run(None, split=False)
    _, grads, _ = _run(UNEVEN, split=True, drop_cache_gradients=True)
    assert _worst(grads, reference) > 1e-2


def test_a_slices_cache_lives_from_its_forward_to_its_backward():
    model = build_example(TINY, 1, [4])
    inputs, targets = model.make_batch(0, 1)
    runner = StageRunner(model.stages[0], 0, 1, 1, model.loss_fn, None, UNEVEN)
    for k, (a, b) in enumerate(UNEVEN):
        runner.forward(0, inputs[:, a:b], targets[:, a:b], k)
    # The last slice's keys and values are read by no later slice: not kept.
    assert sorted(runner._cache) == [(0, 0), (0, 1)]
    assert len(runner._cache[(0, 1)]) == TINY.layers  # keys and values per attention layer
    runner.backward_input(0, None, 2)
    assert sorted(runner._cache) == [(0, 0), (0, 1)]
    runner.backward_input(0, None, 1)
    assert sorted(runner._cache) == [(0, 0)]
    runner.backward_input(0, None, 0)
    assert not runner._cache


@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
def test_a_slices_keys_and_values_are_freed_by_its_backward(split):
    """Not only dropped from the cache: nothing else (later slices' graphs, their inputs)
    keeps them once the slice's own backward (and, split, the later W's) ran."""
    model = build_example(TINY, 1, [4])
    inputs, targets = model.make_batch(0, 1)
    runner = StageRunner(model.stages[0], 0, 1, 1, model.loss_fn, None, UNEVEN)
    for k, (a, b) in enumerate(UNEVEN):
        runner.forward(0, inputs[:, a:b], targets[:, a:b], k)
    kept = [weakref.ref(t) for pair in runner._cache[(0, 0)] for t in pair]
    for k in (2, 1):
        runner.backward_input(0, None, k) if split else runner.backward_fused(0, None, k)
        if split:
            runner.backward_weight(0, k)
    assert all(ref() is not None for ref in kept)  # slice 0's backward still reads them
    runner.backward_input(0, None, 0) if split else runner.backward_fused(0, None, 0)
    assert all(ref() is None for ref in kept)


def test_slice_bounds_follow_the_shares_and_cover_the_sequence():
    assert slice_bounds((0.25,) * 4, 16) == [(0, 4), (4, 8), (8, 12), (12, 16)]
    assert slice_bounds((0.5, 0.3, 0.2), 16) == UNEVEN  # 8, 12.8 -> 13, 16
    bounds = slice_bounds((1 / 3,) * 3, 10)
    assert bounds[0][0] == 0 and bounds[-1][1] == 10 and all(a < b for a, b in bounds)
    assert all(end == start for (_, end), (start, _) in zip(bounds, bounds[1:]))


def test_slices_that_get_no_token_are_refused():
    with pytest.raises(InputError, match=r"^s\.json: slice 2 \(share 0\.25\) of 4 gets no token of the model's 3-token sequences$"):
        slice_bounds((0.25,) * 4, 3, "s.json")


def test_a_model_without_token_slices_is_refused():
    problem = with_slices(uniform_problem(2, 2), slice_model(16, 4))
    plan = build_plans(generate(problem, "terapipe"), 2)[0]
    plain = PipelineModel([nn.Linear(4, 4), nn.Linear(4, 4)], nn.functional.mse_loss, lambda step, m: (torch.zeros(m, 16, 4),) * 2)
    with pytest.raises(InputError, match="model: mine does not run token slices"):
        token_slices(plain, plan, torch.zeros(1, 16, 4), "mine", "s.json")
    example = build_example(TINY, 2)
    assert token_slices(example, plan, example.make_batch(0, 1)[0], "example", "s.json") == [(0, 4), (4, 8), (8, 12), (12, 16)]


def test_each_slice_is_its_own_message():
    problem = with_slices(uniform_problem(2, 2), slice_model(16, 4))
    plans = build_plans(generate(problem, "seq1f1b"), 2)
    messages = plans[0].peer_messages[1]
    assert len(messages) == 2 * 2 * 4  # both directions, 2 microbatches, 4 slices
    assert {(m.kind, m.microbatch, m.slice) for m in messages if m.kind == ACTIVATION} == {
        (ACTIVATION, mb, k) for mb in range(2) for k in range(4)
    }
    assert any(m.describe().endswith("mb 1.3") for m in messages)


def test_synthetic_slices_hold_their_share_of_memory_and_give_the_whole_gradient():
    problem = with_slices(uniform_problem(2, 1, mem_forward=2.0, mem_backward_input=-1.5), slice_model(8, 2))
    model = load_model("synthetic:width=8,mib_per_unit=0.5", 2, problem)
    stages = [cast(SleepingStage, stage) for stage in model.stages]
    inputs, targets = model.make_batch(0, 1)
    whole = nn.Sequential(*model.stages)
    model.loss_fn(whole(inputs), targets).backward()
    reference = [stage.weight.grad for stage in stages]
    whole.zero_grad(set_to_none=True)

    bounds = [(0, 4), (4, 8)]
    runners = [StageRunner(stage, s, 2, 1, model.loss_fn, None, bounds) for s, stage in enumerate(model.stages)]
    ledger = stages[0].ledger
    unit = 0.5 * 2**20
    for k, (a, b) in enumerate(bounds):
        runners[1].forward(0, runners[0].forward(0, inputs[:, a:b], None, k), targets[:, a:b], k)
        assert ledger.bytes == pytest.approx(2.0 * unit * (k + 1) / 2, abs=2)  # F holds its share
    for k in reversed(range(2)):
        runners[0].backward_fused(0, runners[1].backward_fused(0, None, k), k)
    assert ledger.bytes == 0
    for stage, expected in zip(stages, reference):
        torch.testing.assert_close(stage.weight.grad, expected, rtol=RTOL, atol=0.0)

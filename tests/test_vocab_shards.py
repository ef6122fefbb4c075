"""The vocabulary-sharded output layer, loss and embedding, p shards simulated in one process.

Each collective is replaced by what it delivers (the list of every shard's tensors, or
their sum), and the result is compared with torch's full `F.cross_entropy` and autograd.

Tolerance (float32): max|sharded - reference| <= 1e-5 x max|reference| per tensor. The
two sides add the same terms in different orders (per shard, then across shards, against
one GEMM and one log-sum-exp over the whole vocabulary), which moves results by a few
float32 roundings (about 1e-7 relative each) over sums of up to a few hundred terms; a
wrong term (a target row rescaled, a shard left out, a wrong normaliser) changes them by
percents.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.vocab import (
    VocabShard,
    backward_one,
    backward_two,
    combine_one,
    combine_stats,
    forward_one,
    forward_two,
    local_targets,
    shard_bounds,
)

pytestmark = pytest.mark.runtime

RTOL = 1e-5
TOKENS, HIDDEN, VOCAB, SCALE = 24, 8, 23, 0.25  # 23 rows over 4 shards: 5/5/5/8


def close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    actual, expected = actual.detach(), expected.detach()
    return float((actual - expected).abs().max()) <= RTOL * float(expected.abs().max())


def case(parts: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states, output weights (logits spread over ~+-20, so the shards' maxima
    differ and rescaling matters) and targets with one in every shard."""
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(TOKENS, HIDDEN, generator=generator) * 3
    weight = torch.randn(VOCAB, HIDDEN, generator=generator)
    targets = torch.randint(VOCAB, (TOKENS,), generator=generator)
    targets[:parts] = torch.tensor([start for start, _ in shard_bounds(VOCAB, parts)])
    return h, weight, targets


def reference(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loss, dh and dW of the full output layer and loss."""
    h, weight = h.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    loss = F.cross_entropy(h @ weight.T, targets) * SCALE
    loss.backward()
    assert h.grad is not None and weight.grad is not None
    return loss.detach(), h.grad, weight.grad


def test_shard_bounds_cover_the_vocabulary_once():
    assert shard_bounds(23, 4) == [(0, 5), (5, 10), (10, 15), (15, 23)]
    assert shard_bounds(8, 2) == [(0, 4), (4, 8)]


@pytest.mark.parametrize("parts", [1, 2, 4])
def test_two_barriers_match_the_full_loss(parts):
    h, weight, targets = case(parts)
    loss, dh, dweight = reference(h, weight, targets)
    bounds = shard_bounds(VOCAB, parts)
    locals_ = [local_targets(targets, b) for b in bounds]
    passes = [forward_two(h, weight[a:b], local) for (a, b), local in zip(bounds, locals_)]  # S on every shard
    stats = combine_stats([packet for _, packet in passes])  # collective 1: an all-gather
    assert abs(float(stats.token_losses().mean() * SCALE - loss)) <= RTOL * float(loss)
    partial = []
    for (a, b), local, (logits, _) in zip(bounds, locals_, passes):  # T on every shard
        dw, dh_part = backward_two(h, weight[a:b], logits, local, stats, SCALE)
        assert close(dw, dweight[a:b]), f"shard {a}:{b}"
        partial.append(dh_part)
    assert close(torch.stack(partial).sum(dim=0), dh)  # collective 2: an all-reduce


@pytest.mark.parametrize("parts", [1, 2, 4])
def test_one_barrier_matches_the_full_loss(parts):
    h, weight, targets = case(parts, seed=1)
    loss, dh, dweight = reference(h, weight, targets)
    bounds = shard_bounds(VOCAB, parts)
    locals_ = [local_targets(targets, b) for b in bounds]
    passes = [forward_one(h, weight[a:b], local) for (a, b), local in zip(bounds, locals_)]  # S on every shard
    stats, found_dh = combine_one([packet for _, packet in passes], SCALE)  # the one all-gather
    assert abs(float(stats.token_losses().mean() * SCALE - loss)) <= RTOL * float(loss)
    assert close(found_dh, dh)
    for (a, b), local, (logits, _) in zip(bounds, locals_, passes):  # T on every shard
        assert close(backward_one(h, logits, local, stats, SCALE), dweight[a:b]), f"shard {a}:{b}"


def test_one_barrier_rescaling_is_needed():
    """Summing the local shares without the global rescaling is wrong: the check can fail."""
    h, weight, targets = case(4, seed=2)
    _, dh, _ = reference(h, weight, targets)
    bounds = shard_bounds(VOCAB, 4)
    packets = [forward_one(h, weight[a:b], local_targets(targets, (a, b)))[1] for a, b in bounds]
    naive = torch.stack([p[:, 3 : 3 + HIDDEN] - p[:, 3 + HIDDEN :] for p in packets]).sum(dim=0) * (SCALE / TOKENS)
    assert not close(naive, dh)


def test_sharded_embedding_matches_the_full_lookup():
    _, weight, targets = case(4, seed=3)  # weight as the embedding table, targets as tokens
    tokens = targets.view(4, 6)
    grad = torch.randn(4, 6, HIDDEN, generator=torch.Generator().manual_seed(4))
    table = weight.clone().requires_grad_(True)
    expected = F.embedding(tokens, table)
    expected.backward(grad)
    assert table.grad is not None
    shards = [VocabShard(weight, weight, bounds) for bounds in shard_bounds(VOCAB, 4)]
    parts = [shard.embed(tokens) for shard in shards]
    assert close(torch.stack(parts).sum(dim=0), expected.detach())  # the sum formed on the first stage
    for shard, part in zip(shards, parts):  # the output gradient sent to every shard
        part.backward(grad)
        a, b = shard.bounds
        assert shard.embedding.grad is not None and close(shard.embedding.grad, table.grad[a:b]), f"shard {a}:{b}"

"""The vocabulary-sharded output layer, loss and input embedding: the math of one shard.

Device d of p holds vocabulary rows [d*(V//p), (d+1)*(V//p)) of the output layer and of
the token embedding (the last shard also the remainder V % p). Per microbatch, with h
the last stage's hidden states (N tokens x H) and W_d the shard's output-layer rows:

- S (every barrier count): the shard's logits h W_d^T, their row maximum m_d, the sum
  s_d of exp(logit - m_d) and the target's logit t_d where the target is in the shard
  (0 elsewhere). The global statistics are M = max_d m_d, Z = sum_d s_d exp(m_d - M),
  and the token's loss is M + log Z - sum_d t_d.
- barriers == 2: collective 1 gathers (m_d, s_d, t_d); T then forms the shard's softmax
  with the global statistics, the logits' gradient, the shard's weight gradient and
  the partial input gradient dlogits_d W_d; collective 2 sums those into dh.
- barriers == 1: S also forms the input gradient's share with the shard's own
  normalisation, a_d = softmax_local_d W_d, and the target's row r_d of W_d (0 where the
  target is elsewhere). One collective gathers (m_d, s_d, t_d, a_d, r_d); then
  dh = sum_d (s_d exp(m_d - M) / Z) a_d - sum_d r_d exactly (the target's row is not
  rescaled, so it travels apart from a_d). T is only the weight gradient, with the
  global statistics.

Every gradient is of the microbatch's mean token loss times `scale` (1 / microbatches,
as the pipeline's last stage scales its loss). The functions are pure: the collectives
(runtime/vocab_runner.py) and the single-process tests feed them the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

STATS = 3  # per token: shard maximum, shard sum of exp, target logit (0 off the shard)


def shard_bounds(vocab: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) of each shard's vocabulary rows; the last shard takes the remainder."""
    size = vocab // parts
    assert size >= 1, "every shard holds at least one vocabulary row"
    return [(d * size, (d + 1) * size if d < parts - 1 else vocab) for d in range(parts)]


def local_targets(targets: torch.Tensor, bounds: tuple[int, int]) -> torch.Tensor:
    """Each target's row in the shard, -1 where the target belongs to another shard."""
    start, end = bounds
    inside = (targets >= start) & (targets < end)
    return torch.where(inside, targets - start, torch.full_like(targets, -1))


class Global(NamedTuple):
    """Per token: the global maximum logit M, the sum Z of exp(logit - M), the target logit."""

    maximum: torch.Tensor
    sumexp: torch.Tensor
    target_logit: torch.Tensor

    def token_losses(self) -> torch.Tensor:
        return self.maximum + torch.log(self.sumexp) - self.target_logit


def _stats(logits: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """(N, 3): the shard's row maximum, sum of exp(logit - maximum), target logit or 0."""
    maximum = logits.max(dim=1).values
    sumexp = torch.exp(logits - maximum[:, None]).sum(dim=1)
    owned = local >= 0
    target = torch.where(owned, logits.gather(1, local.clamp(min=0)[:, None])[:, 0], torch.zeros_like(maximum))
    return torch.stack([maximum, sumexp, target], dim=1)


def _weights(stats: Sequence[torch.Tensor]) -> tuple[Global, torch.Tensor]:
    """The global statistics from every shard's (N, >=3) stats, and each shard's share
    s_d exp(m_d - M) / Z of the normaliser, (p, N)."""
    stacked = torch.stack([s[:, :STATS] for s in stats])  # (p, N, 3)
    maximum = stacked[:, :, 0].max(dim=0).values
    rescaled = stacked[:, :, 1] * torch.exp(stacked[:, :, 0] - maximum)
    sumexp = rescaled.sum(dim=0)
    return Global(maximum, sumexp, stacked[:, :, 2].sum(dim=0)), rescaled / sumexp


def combine_stats(stats: Sequence[torch.Tensor]) -> Global:
    """Collective 1's result (barriers == 2): the global statistics."""
    return _weights(stats)[0]


def logit_gradient(logits: torch.Tensor, local: torch.Tensor, stats: Global, scale: float, per_token: float) -> torch.Tensor:
    """d(loss)/d(shard logits): (softmax - one-hot of the target) x scale / tokens."""
    probs = torch.exp(logits - stats.maximum[:, None]) / stats.sumexp[:, None]
    owned = torch.nonzero(local >= 0)[:, 0]
    probs[owned, local[owned]] -= 1.0
    return probs * (scale * per_token)


# ------------------------------------------------------------------ barriers == 2


def forward_two(h: torch.Tensor, weight: torch.Tensor, local: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """S: the shard's logits (kept for T) and its (N, 3) statistics for collective 1."""
    logits = h @ weight.T
    return logits, _stats(logits, local)


def backward_two(
    h: torch.Tensor, weight: torch.Tensor, logits: torch.Tensor, local: torch.Tensor, stats: Global, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """T: the shard's weight gradient and its partial input gradient (summed by collective 2)."""
    dlogits = logit_gradient(logits, local, stats, scale, 1.0 / h.shape[0])
    return dlogits.T @ h, dlogits @ weight


# ------------------------------------------------------------------ barriers == 1


def forward_one(h: torch.Tensor, weight: torch.Tensor, local: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """S: the shard's logits (kept for T) and its (N, 3 + 2H) packet for the one collective:
    statistics, the locally normalised input-gradient share a_d and the target row r_d."""
    logits = h @ weight.T
    stats = _stats(logits, local)
    local_softmax = torch.exp(logits - stats[:, :1]) / stats[:, 1:2]
    owned = (local >= 0)[:, None]
    target_rows = torch.where(owned, weight[local.clamp(min=0)], torch.zeros((), dtype=weight.dtype))
    return logits, torch.cat([stats, local_softmax @ weight, target_rows], dim=1)


def combine_one(packets: Sequence[torch.Tensor], scale: float) -> tuple[Global, torch.Tensor]:
    """The one collective's result: the global statistics and the input gradient dh."""
    stats, shares = _weights(packets)
    hidden = (packets[0].shape[1] - STATS) // 2
    stacked = torch.stack(list(packets))  # (p, N, 3 + 2H)
    softmax_part = (shares[:, :, None] * stacked[:, :, STATS : STATS + hidden]).sum(dim=0)
    target_part = stacked[:, :, STATS + hidden :].sum(dim=0)
    return stats, (softmax_part - target_part) * (scale / stacked.shape[1])


def backward_one(h: torch.Tensor, logits: torch.Tensor, local: torch.Tensor, stats: Global, scale: float) -> torch.Tensor:
    """T: the shard's weight gradient with the global statistics."""
    return logit_gradient(logits, local, stats, scale, 1.0 / h.shape[0]).T @ h


# ------------------------------------------------------------------ the shard's parameters


class VocabShard(nn.Module):
    """One device's rows of the token embedding and of the output layer (bias-free).

    `names`: the full weights' names in the model's first and last stage (for `--check`).
    """

    def __init__(self, embedding: torch.Tensor, head: torch.Tensor, bounds: tuple[int, int], names: tuple[str, str] = ("", "")):
        super().__init__()
        start, end = bounds
        self.bounds = bounds
        self.names = names
        self.embedding = nn.Parameter(embedding[start:end].detach().clone())
        self.head = nn.Parameter(head[start:end].detach().clone())

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The shard's part of the token embedding: its rows, zeros for other tokens."""
        local = local_targets(tokens, self.bounds)
        rows = F.embedding(local.clamp(min=0), self.embedding)
        return rows * (local >= 0)[..., None].to(rows.dtype)

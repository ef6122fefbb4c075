"""Token slices of a sequence: their lengths and their costs under a per-token cost model.

A microbatch is one sequence of L tokens cut into K contiguous slices. A token's work in
a transformer layer has a linear part, about 24·h² FLOPs-equivalent per token (the QKV,
attention-output and MLP matrix products: 2·(3 + 1 + 8)·h²), and an attention part, about
4·h per key it attends to (scores and weighted values: 2·2·h per key); under causal
attention the token at position t (1-based) attends to t keys, its slice's own earlier
tokens and every earlier slice's (the prefix). So

    token_cost(t) = 24·h² + 4·h·t                       ("attention")
    token_cost(t) = 1                                    ("linear": cost follows tokens)

and a slice's cost is the sum over its tokens plus a fixed `overhead` per slice (kernel
launches and transfers that do not shrink with the slice), as a fraction of the whole
sequence's cost. Backward passes scale the same way, so one rule serves F and B; weight
gradients follow tokens (the problem's `share`).

`dp_lengths` is TeraPipe's dynamic program (Li et al. 2021): with slice
times t_1..t_K, a pipeline of p stages ends after about sum(t_i) + (p - 1)·max(t_i); for
each candidate bound on the longest slice, a DP finds the K slices of least total time
whose times stay within it, and the best total plus (p - 1) times the bound wins. It
works on blocks of L / DP_BLOCKS tokens (whole tokens when L <= DP_BLOCKS). With an
additive cost and K fixed the total is the same for every cut, so the program balances
the slices' costs: the later slices, dearer per token, get fewer tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optimizer.errors import InputError
from optimizer.io import validate_model
from optimizer.problem import Problem

COST_RULES = ("linear", "attention")
LENGTH_RULES = ("even", "dp")
# The DP's token granularity: the sequence is cut on boundaries of L / DP_BLOCKS tokens.
# 128 blocks: each candidate bound costs a K-step min-plus product of 129 x 129, and the
# search starts at the least feasible bound, so the program takes 0.03 s at most up to
# 131072 tokens and K = 16 (benchmarks/slicing.py); the slices stay within 1/128 of the
# sequence of the best cut on whole tokens.
DP_BLOCKS = 128


@dataclass(frozen=True)
class SliceModel:
    """What `pipesched problem` writes for the slices: lengths in tokens, each slice's
    share of the tokens and of the F/B cost, and how much longer the sliced sequence's
    F and B take than the unsliced one (1 + K·overhead)."""

    lengths: tuple[int, ...]
    shares: tuple[float, ...]
    costs: tuple[float, ...]
    time_scale: float

    def as_json(self) -> list[dict[str, float]]:
        return [{"share": s, "cost": c} for s, c in zip(self.shares, self.costs, strict=True)]


def token_costs(sequence_length: int, hidden: int, rule: str) -> np.ndarray:
    """Cost of each token of the sequence (position 1..L) under `rule`."""
    if rule == "linear":
        return np.ones(sequence_length)
    if rule == "attention":
        positions = np.arange(1, sequence_length + 1, dtype=float)
        return 24.0 * hidden * hidden + 4.0 * hidden * positions
    raise InputError(f"--slice-cost: '{rule}' is not one of {', '.join(COST_RULES)}")


def even_lengths(sequence_length: int, slices: int) -> list[int]:
    """K lengths as equal as whole tokens allow (the first ones one token longer)."""
    base, extra = divmod(sequence_length, slices)
    return [base + (1 if k < extra else 0) for k in range(slices)]


def dp_lengths(costs: np.ndarray, slices: int, stages: int, overhead: float = 0.0) -> list[int]:
    """TeraPipe's DP: K slice lengths minimising sum(t) + (stages - 1)·max(t) (module doc)."""
    length = len(costs)
    blocks = min(length, DP_BLOCKS)
    bounds = [round(b * length / blocks) for b in range(blocks + 1)]  # block edges in tokens
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    edge = prefix[bounds]
    fixed = overhead * prefix[-1]
    # time[i, j]: a slice from block edge i to block edge j (i < j), else infinity
    time = edge[None, :] - edge[:, None] + fixed
    time[np.tril_indices(blocks + 1)] = np.inf
    candidates = np.unique(time[np.isfinite(time)])
    # Feasibility grows with the bound: start at the least bound under which K slices fit.
    low, high = 0, len(candidates) - 1
    while low < high:
        middle = (low + high) // 2
        if np.isfinite(_least_total(np.where(time <= candidates[middle], time, np.inf), slices)[0]):
            high = middle
        else:
            low = middle + 1
    best_value, best_cut = np.inf, None
    for bound in candidates[low:]:
        if (stages - 1) * bound + slices * fixed + prefix[-1] >= best_value:
            break  # the totals are at least the whole sequence's cost: no larger bound can win
        allowed = np.where(time <= bound, time, np.inf)
        total, choice = _least_total(allowed, slices)
        if np.isfinite(total) and total + (stages - 1) * bound < best_value:
            best_value, best_cut = total + (stages - 1) * bound, choice
    if best_cut is None:
        if blocks < length:  # the DP cuts on block edges, not on every token
            raise InputError(
                f"--slices: {slices} slices with --slice-lengths dp: the DP cuts the sequence on {blocks} blocks, so at most {blocks} slices"
            )
        raise InputError(f"--slices: {slices} slices do not fit {length} tokens")
    return [bounds[j] - bounds[i] for i, j in zip(best_cut, best_cut[1:])]


def _least_total(allowed: np.ndarray, slices: int) -> tuple[float, list[int]]:
    """Least total time of `slices` consecutive slices from edge 0 to the last edge, and the cut."""
    edges = allowed.shape[0]
    total = np.full(edges, np.inf)
    total[0] = 0.0
    parents = []
    for _ in range(slices):
        candidates = total[:, None] + allowed  # from edge i (reached with one slice fewer) to edge j
        parents.append(np.argmin(candidates, axis=0))
        total = candidates[parents[-1], np.arange(edges)]
    if not np.isfinite(total[-1]):
        return np.inf, []
    cut = [edges - 1]
    for parent in reversed(parents):
        cut.append(int(parent[cut[-1]]))
    return float(total[-1]), cut[::-1]


def slice_model(
    sequence_length: int,
    slices: int,
    *,
    lengths: str = "even",
    cost: str = "linear",
    hidden: int = 4096,
    stages: int = 1,
    overhead: float = 0.0,
) -> SliceModel:
    """The slices of one sequence under the named length and cost rules (module doc)."""
    if slices > sequence_length:
        raise InputError(f"--slices: {slices} slices need at least as many tokens, --sequence-length is {sequence_length}")
    costs = token_costs(sequence_length, hidden, cost)
    if lengths == "even":
        cut = even_lengths(sequence_length, slices)
    elif lengths == "dp":
        cut = dp_lengths(costs, slices, stages, overhead)
    else:
        raise InputError(f"--slice-lengths: '{lengths}' is not one of {', '.join(LENGTH_RULES)}")
    ends = np.cumsum([0, *cut])
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    work = [(prefix[b] - prefix[a]) / prefix[-1] + overhead for a, b in zip(ends, ends[1:])]
    scale = 1.0 + slices * overhead
    shares = _normalised([n / sequence_length for n in cut])
    return SliceModel(tuple(cut), shares, _normalised([w / scale for w in work]), scale)


def _normalised(values: list[float]) -> tuple[float, ...]:
    """Fractions that sum to 1 up to float rounding (the problem's check allows 1e-6)."""
    total = float(sum(values))
    return tuple(float(v) / total for v in values)


def with_slices(problem: Problem, model: SliceModel) -> Problem:
    """The problem with its microbatches cut as `model` says: its slices, and its stages'
    F and B (and a fused BW's B part) longer by the per-slice overhead."""
    data = problem.model_dump(mode="json")
    data["num_slices"] = len(model.lengths)
    data["slices"] = model.as_json() if len(model.lengths) > 1 else None
    for stage in data["stages"]:
        if stage.get("backward") is not None:  # the B part of the fused time pays the overhead, W does not
            stage["backward"] += (model.time_scale - 1.0) * stage["backward_input"]
        stage["forward"] *= model.time_scale
        stage["backward_input"] *= model.time_scale
    return validate_model(Problem, data, "problem")

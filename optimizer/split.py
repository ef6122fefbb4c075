"""Layer splits: which consecutive layers each stage holds, and the problem a split makes.

A split is a tuple of layer counts, one per stage in stage order (stage s holds the next
`counts[s]` layers of the layers file). The problem it makes has, per stage, the sums of
its layers' times and memory changes; per device, the memory limit left once the
device's layers' fixed memory (parameters, gradients, optimizer state: held all step,
whatever the schedule) is taken. The candidates users reach for by hand are here too:
the even split and the "fewer layers on the first and last stages" rules.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from optimizer.errors import InfeasibleError, InputError
from optimizer.io import validate_model
from optimizer.layers import LayersProfile
from optimizer.problem import Problem, placement_devices, tolerant
from optimizer.vocab_layers import VocabSharding

Split = tuple[int, ...]


class SplitInfeasible(InfeasibleError):
    """No schedule of this split fits the memory limit; `need` is the least limit that would."""

    def __init__(self, message: str, need: float):
        super().__init__(message)
        self.need = need


@dataclass(frozen=True)
class Placement:
    """The stage layout a split fills: how many stages and the device of each."""

    name: str
    num_devices: int
    device_of: tuple[int, ...]

    @classmethod
    def named(cls, name: str, num_devices: int) -> Placement:
        return cls(name, num_devices, tuple(placement_devices(name, num_devices)))

    @property
    def num_stages(self) -> int:
        return len(self.device_of)


def check_split(profile: LayersProfile, placement: Placement, split: Sequence[int]) -> None:
    """Refuse a split that does not give every stage at least one layer and every layer a stage."""
    if len(split) != placement.num_stages:
        raise InputError(f"split: {len(split)} stages given, the {placement.name} placement has {placement.num_stages}")
    if any(count < 1 for count in split):
        raise InputError(f"split: every stage needs at least one layer, got {list(split)}")
    if sum(split) != profile.num_layers:
        raise InputError(f"split: {sum(split)} layers given, the layers file has {profile.num_layers}")


def stage_ranges(split: Sequence[int]) -> list[range]:
    """The layer indices of each stage."""
    ranges, first = [], 0
    for count in split:
        ranges.append(range(first, first + count))
        first += count
    return ranges


def fixed_memory(profile: LayersProfile, placement: Placement, split: Sequence[int], vocab: VocabSharding | None = None) -> list[float]:
    """Per device, the memory its layers hold for the whole step (parameters and their state),
    with its shards of the vocabulary layers under vocabulary parallelism."""
    held = [vocab.held_per_device if vocab is not None else 0.0] * placement.num_devices
    for stage, layers in enumerate(stage_ranges(split)):
        held[placement.device_of[stage]] += sum(profile.layers[i].parameters for i in layers)
    return held


def stage_payload(profile: LayersProfile, layers: range, device: int) -> dict:
    """A problem stage made of consecutive layers: every time and memory change summed."""
    chosen = [profile.layers[i] for i in layers]
    stage: dict = {
        "device": device,
        "forward": sum(layer.forward for layer in chosen),
        "backward_input": sum(layer.backward_input for layer in chosen),
        "backward_weight": sum(layer.backward_weight for layer in chosen),
        "memory": {
            "forward": sum(layer.memory.forward for layer in chosen),
            "backward_input": sum(layer.memory.backward_input for layer in chosen),
            "backward_weight": sum(layer.memory.backward_weight for layer in chosen),
        },
        "layers": [{"name": layer.name, "kind": layer.kind} for layer in chosen],
    }
    if any(layer.backward is not None for layer in chosen):
        # A layer without a measured fused backward costs B + W fused as split.
        stage["backward"] = sum(layer.backward or layer.backward_input + layer.backward_weight for layer in chosen)
    return stage


def _problem(
    profile: LayersProfile,
    placement: Placement,
    split: Sequence[int],
    num_microbatches: int,
    limits: list[float] | None,
    vocab: VocabSharding | None,
) -> Problem:
    stages = [stage_payload(profile, layers, placement.device_of[s]) for s, layers in enumerate(stage_ranges(split))]
    data = {
        "num_devices": placement.num_devices,
        "num_microbatches": num_microbatches,
        "stages": stages,
        "comm_time": profile.comm_time,
        "memory_limit": limits,
    }
    if vocab is not None:
        data["vocab_parallel"] = vocab.passes.model_dump()
    return validate_model(Problem, data, "split")


def split_problem(
    profile: LayersProfile,
    placement: Placement,
    split: Sequence[int],
    num_microbatches: int,
    memory_limit: float | None = None,
    vocab: VocabSharding | None = None,
) -> Problem:
    """The scheduling problem of `split`; SplitInfeasible when no schedule can fit the limit.

    With `vocab`, `profile` is the trunk (optimizer.vocab_layers) and the problem has the
    vocabulary passes."""
    check_split(profile, placement, split)
    unlimited = _problem(profile, placement, split, num_microbatches, None, vocab)
    if memory_limit is None:
        return unlimited
    held = fixed_memory(profile, placement, split, vocab)
    least = unlimited.min_memory_limit()
    need = [h + room for h, room in zip(held, least)]
    worst = max(range(placement.num_devices), key=lambda d: need[d])
    if need[worst] > tolerant(memory_limit):
        raise SplitInfeasible(
            f"memory_limit: device {worst} needs {need[worst]:g} ({held[worst]:g} of parameters and one "
            f"microbatch's activations), more than {memory_limit:g}",
            need[worst],
        )
    # What is left for activations, never below what one microbatch needs: a split admitted
    # within the slack leaves a hair less (or nothing, or less than nothing), which no
    # problem takes as a limit.
    rooms = [max(memory_limit - h, room) for h, room in zip(held, least)]
    return _problem(profile, placement, split, num_microbatches, [room if room > 0 else math.ulp(memory_limit) for room in rooms], vocab)


def memory_need(profile: LayersProfile, placement: Placement, split: Sequence[int], vocab: VocabSharding | None = None) -> list[float]:
    """Per device, the least memory limit under which any schedule of `split` exists.

    Its layers' fixed memory plus one microbatch's activation peak there (the least any
    schedule needs: Problem.min_memory_limit).
    """
    check_split(profile, placement, split)
    unlimited = _problem(profile, placement, split, 1, None, vocab)
    return [held + need for held, need in zip(fixed_memory(profile, placement, split, vocab), unlimited.min_memory_limit())]


def layer_memory(profile: LayersProfile) -> list[float]:
    """Per layer, the memory it needs on its device at least: fixed memory plus one activation."""
    return [layer.parameters + layer.memory.forward for layer in profile.layers]


def layer_work(profile: LayersProfile) -> list[float]:
    """Per layer, its compute per microbatch (F + B + W, or F + the fused backward when cheaper)."""
    work = []
    for layer in profile.layers:
        split_backward = layer.backward_input + layer.backward_weight
        work.append(layer.forward + min(split_backward, layer.backward or split_backward))
    return work


# ------------------------------------------------------------------------------ candidates


def spread_evenly(total: int, slots: int) -> list[int]:
    """`total` items over `slots` as evenly as possible, the extra ones in the middle slots."""
    base, extra = divmod(total, slots)
    counts = [base] * slots
    # The middle slots take the remainder: the ends already carry the embedding and the head.
    order = sorted(range(slots), key=lambda s: (abs(s - (slots - 1) / 2), s))
    for s in order[:extra]:
        counts[s] += 1
    return counts


def _block_counts_to_split(profile: LayersProfile, blocks_per_stage: Sequence[int]) -> Split | None:
    """Layer counts once the embedding joins stage 0 and the head joins the last stage."""
    counts = list(blocks_per_stage)
    if profile.layers[0].kind == "embedding":
        counts[0] += 1
    if profile.layers[-1].kind == "head":
        counts[-1] += 1
    if any(c < 1 for c in counts) or sum(counts) != profile.num_layers:
        return None
    return tuple(counts)


def even_split(profile: LayersProfile, num_stages: int) -> Split:
    """The same number of transformer blocks on every stage; embedding first, head last."""
    blocks = sum(1 for layer in profile.layers if layer.kind == "block")
    split = _block_counts_to_split(profile, spread_evenly(blocks, num_stages))
    if split is None:
        raise InputError(f"layers: {profile.num_layers} layers cannot fill {num_stages} stages (one layer each at least)")
    return split


def fewer_at_ends_split(profile: LayersProfile, num_stages: int, first: int, last: int) -> Split | None:
    """The hand rule: the first stage `first` and the last stage `last` blocks fewer than the rest.

    It is what Megatron's --decoder-first/last-pipeline-num-layers and torchtitan's
    first/last-stage-fewer-layers options express: the embedding and the head count as
    that many blocks. The rest are spread as evenly as possible; None if it does not fit.
    """
    blocks = sum(1 for layer in profile.layers if layer.kind == "block")
    if num_stages < 3:
        return None
    # The ends get b - first and b - last blocks, the middle stages the rest (b or more each).
    b = (blocks + first + last) // num_stages
    middle_total = blocks - max(0, b - first) - max(0, b - last)
    if middle_total < num_stages - 2:
        return None
    counts = [max(0, b - first)] + spread_evenly(middle_total, num_stages - 2) + [max(0, b - last)]
    return _block_counts_to_split(profile, counts)


HAND_RULES = {"first-1,last-1": (1, 1), "last-1": (0, 1), "last-2": (0, 2), "first-1,last-2": (1, 2)}


def hand_rule_splits(profile: LayersProfile, num_stages: int) -> dict[str, Split]:
    """The hand rules users apply, by name, where they fit (and differ from the even split)."""
    found: dict[str, Split] = {}
    even = even_split(profile, num_stages)
    for name, (first, last) in HAND_RULES.items():
        split = fewer_at_ends_split(profile, num_stages, first, last)
        if split is not None and split != even and split not in found.values():
            found[name] = split
    return found


# Up to this many splits `least_memory_split` tries them all.
LEAST_MEMORY_EXHAUSTIVE = 20_000


def least_memory_split(weights: Sequence[float], device_of: Sequence[int]) -> Split:
    """Consecutive layers per stage keeping the most any device holds (the sum of `weights`
    over its stages' layers) low. Where each device holds one stage, the bottleneck split
    (exact). Where devices hold several (V, interleaved) the loads of a device's stages add
    up, which the per-stage bottleneck ignores (it needed up to 35% more on a device): up to
    LEAST_MEMORY_EXHAUSTIVE splits every one is tried (exact); above, the best of up to three
    starts improved by moving one stage boundary at a time to any place between its
    neighbours, while the largest device load, then the sum of squared loads, falls."""
    num_stages, n = len(device_of), len(weights)
    first_try = bottleneck_split(weights, num_stages)
    if len(set(device_of)) == num_stages:
        return first_try
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    num_devices = max(device_of) + 1

    def score(cuts: Sequence[int]) -> tuple[float, float]:
        held = [0.0] * num_devices
        for stage in range(num_stages):
            held[device_of[stage]] += prefix[cuts[stage + 1]] - prefix[cuts[stage]]
        return max(held), sum(h * h for h in held)

    def as_split(cuts: Sequence[int]) -> Split:
        return tuple(cuts[k + 1] - cuts[k] for k in range(num_stages))

    def as_cuts(split: Sequence[int]) -> list[int]:
        cuts = [0]
        for count in split:
            cuts.append(cuts[-1] + count)
        return cuts

    if math.comb(n - 1, num_stages - 1) <= LEAST_MEMORY_EXHAUSTIVE:
        every = ((0, *inner, n) for inner in itertools.combinations(range(1, n), num_stages - 1))
        return as_split(min(every, key=score))
    best: tuple[tuple[float, float], list[int]] | None = None
    # A move costs a pass over the stages: on the largest shapes (1024 layers, 256 stages, 1 s
    # for three starts) only the first start is improved.
    starts = [first_try]
    if n * num_stages <= LEAST_MEMORY_EXHAUSTIVE * 4:
        starts += [tuple(spread_evenly(n, num_stages)), bottleneck_split([1.0] * n, num_stages)]
    for start in starts:
        cuts = as_cuts(start)
        current = score(cuts)
        for _ in range(2 * num_stages):  # each pass lowers the score strictly; the cap bounds the time
            improved = False
            for k in range(1, num_stages):
                keep = cuts[k]
                for place in range(cuts[k - 1] + 1, cuts[k + 1]):
                    if place == keep:
                        continue
                    cuts[k] = place
                    trial = score(cuts)
                    if trial < current:
                        current, keep, improved = trial, place, True
                cuts[k] = keep
            if not improved:
                break
        if best is None or current < best[0]:
            best = (current, cuts)
    assert best is not None
    return as_split(best[1])


def bottleneck_split(work: Sequence[float], num_stages: int) -> Split:
    """Consecutive layers per stage minimising the largest stage's work (linear partition DP).

    best[k][i]: the least bottleneck of the first i layers in k stages, the min over the
    last cut j of max(best[k-1][j], work of layers j..i), taking the first j that attains
    it. With work >= 0 the first term never falls as j grows and the second never rises,
    so the min sits where they cross, found by bisection: O(stages x layers x log layers)
    (0.1 s at 256 stages of 1024 layers, where trying every j took 33 s).
    """
    n = len(work)
    if num_stages > n:
        raise InputError(f"layers: {n} layers cannot fill {num_stages} stages (one layer each at least)")
    prefix = [0.0]
    for w in work:
        prefix.append(prefix[-1] + w)
    inf = math.inf
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        before = best[k - 1]
        for i in range(k, n - (num_stages - k) + 1):
            # The first cut j in [k - 1, i) where the stages before weigh at least the last one.
            lo, hi = k - 1, i
            while lo < hi:
                mid = (lo + hi) // 2
                if before[mid] >= prefix[i] - prefix[mid]:
                    hi = mid
                else:
                    lo = mid + 1
            crossing = lo
            # Before the crossing the last stage decides, from the crossing on the stages before.
            last_decides = prefix[i] - prefix[crossing - 1] if crossing > k - 1 else inf
            before_decides = before[crossing] if crossing < i else inf
            if last_decides <= before_decides:
                value = last_decides
                # The first j whose last stage weighs no more (equal weights: zero-work layers).
                lo, hi = k - 1, crossing - 1
                while lo < hi:
                    mid = (lo + hi) // 2
                    if prefix[i] - prefix[mid] <= value:
                        hi = mid
                    else:
                        lo = mid + 1
                best[k][i], cut[k][i] = value, lo
            else:
                best[k][i], cut[k][i] = before_decides, crossing
    counts, i = [], n
    for k in range(num_stages, 0, -1):
        j = cut[k][i]
        counts.append(i - j)
        i = j
    return tuple(reversed(counts))


def neighbours(split: Split) -> list[Split]:
    """Splits one boundary move away: one layer handed across a stage boundary."""
    found = []
    for s in range(len(split) - 1):
        for give in (1, -1):
            counts = list(split)
            counts[s] -= give
            counts[s + 1] += give
            if counts[s] >= 1 and counts[s + 1] >= 1:
                found.append(tuple(counts))
    return found

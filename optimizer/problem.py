"""The scheduling problem: stages with F/B/W times and memory deltas, pinned to devices.

A problem is the one input every generator, solver and the simulator take. It is a
pydantic model because it crosses the file boundary (problem.json); hot loops read
the plain tuples from :meth:`Problem.tables` instead of the models.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from optimizer.errors import InputError
from optimizer.ops import VocabRule

# Memory deltas must sum to zero per stage; the slack is relative to the allocation so
# that values profiled in bytes and values in activation units both pass.
_SUM_TOLERANCE = 1e-6
# A sum of three deltas off zero by no more than this (relative) is float rounding, not a
# remainder to take up.
_ROUNDING = 1e-15

PLACEMENTS = ("linear", "interleaved:V", "vshape")

# A device's peak memory fits its limit up to this relative slack: peaks are float sums.
# Every check and every model uses the same (`tolerant`): an integer model whose limit is
# the exact one refused orders the checks accept (a limit of 1.999999999 for a peak of 2:
# the model's optimum 41 where 35 fits), and a bound on it could exceed a fitting schedule.
MEMORY_SLACK = 1e-9


def tolerant(limit: float) -> float:
    """The largest peak that fits `limit` (MEMORY_SLACK)."""
    return limit * (1 + MEMORY_SLACK)


# Magnitude of any time or memory value: sums over every op of a problem at the size
# limit (5e4 ops) stay far below float overflow (1.8e308).
MAX_VALUE = 1e12

# The size contract (README, "Size limits"): what every command handles within its
# time limit on a 2-core machine. At MAX_OPS, `solve --time-limit 2` returns in about
# 4 s (loading, known schedules and writing the file come on top of the limit).
MAX_DEVICES = 256  # at 1024 devices, solve --time-limit 2 took 12 s (the known schedules, per device)
MAX_MICROBATCHES = 4096  # the memory-aware lower bound is quadratic in microbatches: 5 s at 8333
MAX_STAGES = 1024  # the lower bound and the generators grow faster than linearly in stages
MAX_OPS = 50_000  # 3 ops (F, B, W) per stage and microbatch

# Strict numbers: "2" or true are not numbers, 2.0 is not a count; NaN and +-Infinity are
# refused wherever a number enters.
_NUMBERS = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
Count = Annotated[int, Field(ge=1)]
Duration = Annotated[float, Field(gt=0, le=MAX_VALUE)]
MemoryValue = Annotated[float, Field(ge=-MAX_VALUE, le=MAX_VALUE)]
Limit = Annotated[float, Field(gt=0, le=MAX_VALUE)]


class _Strict(BaseModel):
    model_config = _NUMBERS


class StageMemory(_Strict):
    """Memory change of one op of this stage: F at its start, B and W at their end.

    The three must sum to zero within _SUM_TOLERANCE (relative to the allocation); where
    they are off by more than float rounding, the larger of B's and W's changes takes up
    the rest. A remainder left in place would pile up one microbatch after another: 1e-7
    a microbatch, at a limit of one forward's allocation, made every schedule overflow.
    """

    forward: Annotated[float, Field(ge=0, le=MAX_VALUE)]
    backward_input: MemoryValue
    backward_weight: MemoryValue

    @model_validator(mode="after")
    def _deltas_sum_to_zero(self) -> StageMemory:
        total = self.forward + self.backward_input + self.backward_weight
        scale = max(1.0, self.forward)
        if abs(total) > _SUM_TOLERANCE * scale:
            raise ValueError(f"memory deltas must sum to 0 (forward + backward_input + backward_weight = {total:g})")
        if abs(total) <= _ROUNDING * scale:
            return self  # float rounding only (1 - 0.6337 - 0.3663 is -5.6e-17): values kept as given
        # Frozen: the validator is the one place the value is still being built.
        if abs(self.backward_weight) >= abs(self.backward_input):
            object.__setattr__(self, "backward_weight", -(self.forward + self.backward_input))
        else:
            object.__setattr__(self, "backward_input", -(self.forward + self.backward_weight))
        return self


class EndLayerFault(NamedTuple):
    """An embedding or head out of place among a pipeline's layers: `position` is the layer's,
    `where` the place it must have ("first", "last"), `repeated` whether it is a second one."""

    position: int
    kind: str
    where: str
    repeated: bool


def misplaced_end(kinds: Sequence[str]) -> EndLayerFault | None:
    """The first embedding or head out of place in a pipeline's layer kinds, in order:
    Megatron's layout (and every pipeline runtime) has one embedding, first, and one head, last."""
    for kind, at, where in (("embedding", 0, "first"), ("head", len(kinds) - 1, "last")):
        places = [i for i, k in enumerate(kinds) if k == kind]
        if len(places) > 1:
            return EndLayerFault(places[1], kind, where, True)
        if places and places[0] != at:
            return EndLayerFault(places[0], kind, where, False)
    return None


class StageLayer(_Strict):
    """A model layer a stage holds (a split of a layers file, optimizer/split.py)."""

    name: Annotated[str, Field(min_length=1, max_length=64)]
    kind: Literal["embedding", "block", "head"]


class Stage(_Strict):
    """One model chunk: which device runs it and how long its ops take.

    `backward` is the fused backward's (BW's) time; None means backward_input +
    backward_weight (splitting costs nothing).
    """

    device: Annotated[int, Field(ge=0)]
    forward: Duration
    backward_input: Duration
    backward_weight: Duration
    memory: StageMemory
    backward: Duration | None = None
    # The layers this stage holds, in order, when the problem comes from a split; exports
    # (Megatron's layout) and `run` read the split from here.
    layers: Annotated[list[StageLayer], Field(min_length=1, max_length=1024)] | None = None

    def fused_backward(self) -> float:
        return self.backward if self.backward is not None else self.backward_input + self.backward_weight


class Slice(_Strict):
    """One token slice of every microbatch: its share of the tokens and of the attention-weighted cost.

    Slice k's F and B take cost x the stage's time, its W share x, its memory deltas share x
    the stage's (optimizer/ops.py).
    """

    share: Annotated[float, Field(gt=0, le=1)]
    cost: Annotated[float, Field(gt=0, le=1)]


class VocabParallel(_Strict):
    """The output layer sharded by vocabulary over all devices (optimizer/ops.py, README).

    Per microbatch every device runs an S pass (`forward`) and a T pass (`backward`) of its
    shard; `memory` is held from S's start to T's end; each collective between the passes
    takes `barrier_time`; `barriers` is 2 (statistics, then input gradient) or 1 (one
    collective after S carries both).
    """

    # An int in 1..2 rather than Literal[1, 2], which takes 1.0 (equal to 1), where every
    # other count of the file must be an integer.
    barriers: Annotated[int, Field(ge=1, le=2)] = 2
    forward: Duration
    backward: Duration
    memory: Annotated[float, Field(ge=0, le=MAX_VALUE)] = 0.0
    barrier_time: Annotated[float, Field(ge=0, le=MAX_VALUE)] = 0.0


# Shares and costs are fractions a user or a cost model rounds; they must sum to 1 within
# this (absolute) slack, far above float rounding of a few thousand terms (1e-12) and far
# below any meaningful share.
SLICE_SUM_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Tables:
    """Plain per-stage tuples for hot loops (simulator, solvers)."""

    device: tuple[int, ...]
    forward: tuple[float, ...]
    backward_input: tuple[float, ...]
    backward_weight: tuple[float, ...]
    mem_forward: tuple[float, ...]
    mem_backward_input: tuple[float, ...]
    mem_backward_weight: tuple[float, ...]
    limit: tuple[float, ...]  # per device; math.inf when unlimited
    # Defaults keep Tables built by hand (tests, relaxations) unsliced with B + W fused times.
    backward: tuple[float, ...] = ()  # fused backward (BW) time per stage
    slice_share: tuple[float, ...] = (1.0,)  # per slice: its share of tokens (W time, memory)
    slice_cost: tuple[float, ...] = (1.0,)  # per slice: its share of F and B time
    # Vocabulary parallelism (ops S and T on every device); barriers 0: none.
    vocab_barriers: int = 0
    vocab_forward: float = 0.0
    vocab_backward: float = 0.0
    vocab_memory: float = 0.0
    barrier_time: float = 0.0

    def __post_init__(self) -> None:
        if not self.backward:
            fused = tuple(b + w for b, w in zip(self.backward_input, self.backward_weight, strict=True))
            object.__setattr__(self, "backward", fused)

    @property
    def num_slices(self) -> int:
        return len(self.slice_share)

    @property
    def num_devices(self) -> int:
        return len(self.limit)

    def vocab_rule(self) -> VocabRule | None:
        """The dependency rule's view of vocabulary parallelism, None without it."""
        return VocabRule(self.num_devices, self.vocab_barriers) if self.vocab_barriers else None


class Problem(_Strict):
    """A pipeline-scheduling problem (see the README for its exact semantics)."""

    num_devices: Count
    num_microbatches: Count
    stages: Annotated[list[Stage], Field(min_length=1)]
    comm_time: Annotated[float, Field(ge=0, le=MAX_VALUE)] = 0.0
    memory_limit: Limit | list[Limit] | None = None
    num_slices: Count = 1
    slices: list[Slice] | None = None  # None: even slices (share = cost = 1 / num_slices)
    vocab_parallel: VocabParallel | None = None

    @model_validator(mode="before")
    @classmethod
    def _within_size(cls, data: object) -> object:
        # Before the stages are validated one by one: a huge problem is refused at once.
        if isinstance(data, dict):
            stages = data.get("stages")
            check_size(
                data.get("num_devices"),
                len(stages) if isinstance(stages, list) else None,
                data.get("num_microbatches"),
                data.get("num_slices", 1),
                data.get("vocab_parallel") is not None,
            )
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Problem:
        p = self.num_devices
        for s, stage in enumerate(self.stages):
            if stage.device >= p:
                raise ValueError(f"stages.{s}.device: {stage.device} is out of range for {p} devices")
        used = {stage.device for stage in self.stages}
        for d in range(p):
            if d not in used:
                raise ValueError(f"stages: device {d} holds no stage")
        if isinstance(self.memory_limit, list) and len(self.memory_limit) != p:
            raise ValueError(f"memory_limit: a list needs one value per device ({p}), got {len(self.memory_limit)}")
        for s, stage in enumerate(self.stages):
            limit = self.device_limit(stage.device)
            if stage.memory.forward > tolerant(limit):
                raise ValueError(
                    f"memory_limit: device {stage.device} limit {limit!r} is below one forward of stage {s} ({stage.memory.forward!r})"
                )
        if self.vocab_parallel is not None:
            if self.num_slices > 1:
                raise ValueError("vocab_parallel: vocabulary parallelism with token slices (num_slices > 1) is not supported")
            for d in range(p):
                if self.vocab_parallel.memory > tolerant(self.device_limit(d)):
                    raise ValueError(
                        f"memory_limit: device {d} limit {self.device_limit(d):g} is below one vocabulary pass ({self.vocab_parallel.memory:g})"
                    )
        self._check_layers()
        if self.slices is not None:
            if len(self.slices) != self.num_slices:
                raise ValueError(f"slices: {len(self.slices)} slices listed, num_slices is {self.num_slices}")
            for name in ("share", "cost"):
                total = sum(getattr(piece, name) for piece in self.slices)
                if abs(total - 1.0) > SLICE_SUM_TOLERANCE:
                    raise ValueError(f"slices: the {name}s sum to {total:g}, not 1 (within {SLICE_SUM_TOLERANCE:g})")
        return self

    def _check_layers(self) -> None:
        """The layers the stages list (a split, for the exports) follow a layers file's rules:
        every stage lists them or none does, each name once, the embedding first and the head
        last of the whole pipeline."""
        listed = [stage.layers for stage in self.stages]
        if all(layers is None for layers in listed):
            return
        missing = next((s for s, layers in enumerate(listed) if layers is None), None)
        if missing is not None:
            raise ValueError(f"stages.{missing}.layers: missing, where other stages list theirs")
        places = [(s, j, layer) for s, layers in enumerate(listed) for j, layer in enumerate(layers or [])]
        seen: dict[str, int] = {}
        for s, j, layer in places:
            if layer.name in seen:
                raise ValueError(f"stages.{s}.layers.{j}.name: {layer.name!r} is held by stage {seen[layer.name]} too")
            seen[layer.name] = s
        fault = misplaced_end([layer.kind for _, _, layer in places])
        if fault is not None:
            s, j, _ = places[fault.position]
            raise ValueError(f"stages.{s}.layers.{j}.kind: one {fault.kind} at most, the {fault.where} layer of the pipeline")

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def device_limit(self, device: int) -> float:
        if self.memory_limit is None:
            return math.inf
        if isinstance(self.memory_limit, list):
            return self.memory_limit[device]
        return self.memory_limit

    def stages_on(self, device: int) -> list[int]:
        return [s for s, stage in enumerate(self.stages) if stage.device == device]

    def placement(self) -> str:
        """The name of the placement this problem follows, or "custom"."""
        p, n = self.num_devices, self.num_stages
        devices = [stage.device for stage in self.stages]
        if devices == list(range(p)):
            return "linear"
        if n == 2 * p and devices == vshape_devices(p):
            return "vshape"
        if n % p == 0 and devices == [s % p for s in range(n)]:
            return f"interleaved:{n // p}"
        return "custom"

    def tables(self) -> Tables:
        st = self.stages
        vocab = self.vocab_parallel
        return Tables(
            device=tuple(s.device for s in st),
            forward=tuple(s.forward for s in st),
            backward_input=tuple(s.backward_input for s in st),
            backward_weight=tuple(s.backward_weight for s in st),
            mem_forward=tuple(s.memory.forward for s in st),
            mem_backward_input=tuple(s.memory.backward_input for s in st),
            mem_backward_weight=tuple(s.memory.backward_weight for s in st),
            limit=tuple(self.device_limit(d) for d in range(self.num_devices)),
            backward=tuple(s.fused_backward() for s in st),
            slice_share=self.slice_shares(),
            slice_cost=self.slice_costs(),
            vocab_barriers=vocab.barriers if vocab else 0,
            vocab_forward=vocab.forward if vocab else 0.0,
            vocab_backward=vocab.backward if vocab else 0.0,
            vocab_memory=vocab.memory if vocab else 0.0,
            barrier_time=vocab.barrier_time if vocab else 0.0,
        )

    def vocab_rule(self) -> VocabRule | None:
        """The dependency rule's view of vocabulary parallelism (optimizer.ops), None without it."""
        return VocabRule(self.num_devices, self.vocab_parallel.barriers) if self.vocab_parallel else None

    def without_vocab(self) -> Problem:
        """The same problem without the vocabulary passes: a relaxation (fewer ops, fewer
        dependencies, less memory), so its lower bounds hold for this problem."""
        return self.model_copy(update={"vocab_parallel": None})

    @property
    def num_ops(self) -> int:
        """Ops of a complete schedule with split backwards: F, B, W per stage, microbatch and
        slice, and S, T per device and microbatch with vocabulary parallelism."""
        vocab = 2 * self.num_devices * self.num_microbatches if self.vocab_parallel else 0
        return 3 * self.num_stages * self.num_microbatches * self.num_slices + vocab

    def slice_shares(self) -> tuple[float, ...]:
        if self.slices is None:
            return (1.0 / self.num_slices,) * self.num_slices
        return tuple(piece.share for piece in self.slices)

    def slice_costs(self) -> tuple[float, ...]:
        if self.slices is None:
            return (1.0 / self.num_slices,) * self.num_slices
        return tuple(piece.cost for piece in self.slices)

    def to_json(self) -> dict:
        """The problem as JSON, leaving out the optional fields at their defaults.

        A problem that uses no slices and no fused backward time then reads exactly as
        before those fields existed, so older readers (which refuse unknown fields) load it.
        """
        data = self.model_dump(mode="json")
        if data["num_slices"] == 1:
            del data["num_slices"]
        if data["slices"] is None:
            del data["slices"]
        if data["vocab_parallel"] is None:
            del data["vocab_parallel"]
        for stage in data["stages"]:
            for optional in ("backward", "layers"):
                if stage[optional] is None:
                    del stage[optional]
        return data

    def min_memory_limit(self) -> list[float]:
        """Per device, the least limit under which any schedule exists: one microbatch's peak there.

        A microbatch's activation on a stage lives from its F to its B/W, and the later
        stages' ops of that microbatch happen in between, so the device must hold the peak
        of one microbatch's own trajectory (`one_microbatch_peaks`); running microbatches
        one at a time, each backward fused, reaches exactly that. A fused backward BW is
        always allowed and changes memory once, at its end, by B's and W's deltas together,
        so it never holds more than B then W: where a B allocates (held until its W) the
        split peak is higher (`split_memory_limit`). With token slices all of a
        microbatch's forwards still precede its backwards, so the forward sum stands.
        """
        tables = self.tables()
        return [one_microbatch_peaks(tables, self.stages_on(d), fused=True)[0] for d in range(self.num_devices)]

    def split_memory_limit(self) -> list[float]:
        """Per device, the least limit under which a schedule with every backward split into
        B then W exists: `min_memory_limit` where no B allocates, more where one does (the
        allocation is held until the W; with token slices counted slice by slice in the order
        of one stage per device, on devices with several stages a limit under which one
        order fits). The list engine and every family that splits need this much."""
        tables = self.tables()
        return [one_microbatch_peaks(tables, self.stages_on(d))[0] for d in range(self.num_devices)]


def one_microbatch_peaks(tables: Tables, stages: list[int], fused: bool = False) -> list[float]:
    """Memory one microbatch can still add on a device after its first k F's and B's there.

    Its ops on the device's `stages` follow the F's in stage order, then the B's in reverse
    stage order (the only order the dependencies allow), each W counted right after its B
    (the earliest it can free), or with `fused` both deltas at once (a fused backward BW).
    With token slices, each stage's F's run slice by slice and its B's in reverse, each a
    share of the stage's deltas (the order the dependencies ask for on a device with one
    stage). Entry 0 is the microbatch's peak on the device.
    """
    shares = tables.slice_share
    slices = range(len(shares))
    steps = [(tables.mem_forward[s] * shares[k], 0.0) for s in stages for k in slices]
    if tables.vocab_barriers:
        # A device's S of the microbatch follows all its F's and precedes all its B's (they
        # wait for the last stage's backward, which waits for every S); its T may come
        # right after it, before any B, which is the least it can hold.
        steps.append((tables.vocab_memory, -tables.vocab_memory))
    steps += [
        (
            (tables.mem_backward_input[s] + tables.mem_backward_weight[s]) * shares[k]
            if fused
            else tables.mem_backward_input[s] * shares[k],
            0.0 if fused else tables.mem_backward_weight[s] * shares[k],
        )
        for s in reversed(stages)
        for k in reversed(slices)
    ]
    peaks = [0.0] * (len(steps) + 1)
    for k in range(len(steps) - 1, -1, -1):
        first, then = steps[k]
        peaks[k] = max(0.0, first + max(0.0, then + peaks[k + 1]))
    return peaks


def check_size(devices: object, stages: object, microbatches: object, slices: object = 1, vocab: bool = False) -> None:
    """Raise ValueError naming the size when it is beyond the size contract (see MAX_OPS)."""
    counts = {"num_devices": (devices, MAX_DEVICES), "num_microbatches": (microbatches, MAX_MICROBATCHES), "stages": (stages, MAX_STAGES)}
    known = {name: value for name, (value, _) in counts.items() if isinstance(value, int) and not isinstance(value, bool)}
    for name, value in known.items():
        limit = counts[name][1]
        if value > limit:
            raise ValueError(f"{name}: {value} is more than the {limit} pipesched takes (README, Size limits)")
    if "stages" in known and "num_microbatches" in known:
        k = slices if isinstance(slices, int) and not isinstance(slices, bool) and slices > 1 else 1
        ops = 3 * known["stages"] * known["num_microbatches"] * k
        passes = ""
        if vocab and "num_devices" in known:
            ops += 2 * known["num_devices"] * known["num_microbatches"]
            passes = f" + 2 x {known['num_devices']} devices x {known['num_microbatches']} microbatches"
        if ops > MAX_OPS:
            sliced = f" x {k} slices" if k > 1 else ""
            raise ValueError(
                f"size: 3 x {known['stages']} stages x {known['num_microbatches']} microbatches{sliced}{passes} = {ops} ops "
                f"is more than the {MAX_OPS} pipesched takes (README, Size limits)"
            )


def vshape_devices(p: int) -> list[int]:
    """Device of each of the 2p stages in the V placement: down the pipeline and back."""
    return [s if s < p else 2 * p - 1 - s for s in range(2 * p)]


def placement_devices(placement: str, num_devices: int) -> list[int]:
    """The device of each stage for a named placement."""
    p = num_devices
    if placement == "linear":
        return list(range(p))
    if placement == "vshape":
        return vshape_devices(p)
    if placement.startswith("interleaved:"):
        chunks_text = placement.split(":", 1)[1]
        if not (chunks_text.isascii() and chunks_text.isdigit()) or int(chunks_text[:12]) < 1:
            raise InputError(f"placement: '{placement}' needs a positive chunk count, e.g. interleaved:2")
        # Digits are cut at 12: more than that is over the limit anyway, and never converted whole.
        if len(chunks_text) > 12 or int(chunks_text) * p > MAX_STAGES:
            raise InputError(f"placement: '{placement[:24]}' on {p} devices is more than the {MAX_STAGES} stages pipesched takes")
        return [s % p for s in range(int(chunks_text) * p)]
    raise InputError(f"placement: '{placement}' is not one of linear, interleaved:V, vshape")


def require_problem(value: object) -> Problem:
    """`value` when it is a Problem, else InputError saying what it is: a dict or a path
    given to a function that takes a Problem would fail deep inside otherwise."""
    if not isinstance(value, Problem):
        raise InputError(
            f"problem: expected a Problem (load_problem reads a file, Problem.model_validate a dict), got {type(value).__name__}"
        )
    return value


def uniform_problem(
    num_devices: int,
    num_microbatches: int,
    forward: float = 1.0,
    backward_input: float = 1.0,
    backward_weight: float = 1.0,
    *,
    comm_time: float = 0.0,
    placement: str = "linear",
    mem_forward: float = 1.0,
    mem_backward_input: float = 0.0,
    mem_backward_weight: float | None = None,
    memory_limit: float | list[float] | None = None,
    backward: float | None = None,
) -> Problem:
    """A problem whose stages all have the same times and memory deltas.

    ``mem_backward_weight`` defaults to whatever makes the three deltas sum to zero;
    ``backward`` (the fused BW time) to B + W.
    """
    for name, count in (("num_devices", num_devices), ("num_microbatches", num_microbatches)):
        if isinstance(count, bool) or not hasattr(count, "__index__"):
            raise InputError(f"{name}: must be an integer, got {count!r}")
    num_devices, num_microbatches = operator.index(num_devices), operator.index(num_microbatches)  # numpy ints too
    if not isinstance(placement, str):
        raise InputError(f"placement: must be a name such as linear, vshape or interleaved:2, got {placement!r}")
    try:
        check_size(num_devices, None, num_microbatches)  # before the placement lists a stage per device
    except ValueError as error:
        raise InputError(str(error)) from None
    if mem_backward_weight is None:
        mem_backward_weight = -(mem_forward + mem_backward_input)
    stage = {
        "forward": forward,
        "backward_input": backward_input,
        "backward_weight": backward_weight,
        "memory": {
            "forward": mem_forward,
            "backward_input": mem_backward_input,
            "backward_weight": mem_backward_weight,
        },
        **({"backward": backward} if backward is not None else {}),
    }
    from optimizer.io import validate_model

    return validate_model(
        Problem,
        {
            "num_devices": num_devices,
            "num_microbatches": num_microbatches,
            "stages": [{"device": d, **stage} for d in placement_devices(placement, num_devices)],
            "comm_time": comm_time,
            "memory_limit": memory_limit,
        },
        "problem",
    )


def load_problem(path: str | Path) -> Problem:
    """Read and validate a problem JSON file; errors name the file and the field."""
    from optimizer.io import read_json

    return problem_from_json(read_json(path), str(path))


# Other pipesched files given where a problem is wanted, by their "format", and what to do.
_NOT_A_PROBLEM = {
    "pipesched.schedule": 'a schedule, not a problem (its problem is the file\'s "problem" field)',
    "pipesched.layers": "a layers file, not a problem (`solve LAYERS.json -p P -m M` chooses the split and writes the schedule)",
}


def problem_from_json(data: object, source: str = "problem") -> Problem:
    """Validate parsed problem JSON; errors name the source and the field."""
    from optimizer.errors import InputError
    from optimizer.io import json_kind, validate_model

    if not isinstance(data, dict):
        raise InputError(
            f"{source}: not a problem (the file holds {json_kind(data)}; a problem is an object with num_devices, num_microbatches and stages)"
        )
    kind = data.get("format")
    if isinstance(kind, str) and kind in _NOT_A_PROBLEM:
        raise InputError(f"{source}: is {_NOT_A_PROBLEM[kind]}")
    return validate_model(Problem, data, source)

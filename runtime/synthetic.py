"""The `synthetic` model: stages that take exactly a problem's op times, by sleeping.

Each stage spends the problem's times, read as milliseconds: F sleeps `forward`, B
`backward_input`, W `backward_weight`, a fused BW `backward` (its own time, often
shorter than B + W). Sleeping, not computing, lets
8-16 ranks share two cores and still run as the problem says, so an executor's
overhead and a schedule's predicted step time can be measured at real pipeline depths.

Real work still flows: a small tensor (`batch_size` x `width` per microbatch) passes
between stages, each stage computes tanh(x + weight) with a real weight and gradient
(so `--check` compares real gradients), and the loss is the mean squared error to
random targets. Memory is held as real tensors of the problem's sizes (`mib_per_unit`
MiB per memory unit; allocated, not written): F allocates the stage's `memory.forward`; when B ends, the part B
frees (-`memory.backward_input`) is released, or B's extra (+) allocated; W releases
the rest. A ledger per stage counts the bytes held, for tests and benchmarks.

How the split backward lands on the sleeps: the stage output is tanh(h + w), where h
comes from an autograd function on the input path (its backward sleeps B) and w from
one on the weight (its backward sleeps W). An input-gradient pass reaches only the
first, a weight-gradient pass only the second, and a fused backward both in one
autograd call: the second of the two to run there sleeps until BW's time has passed
since the first began. Every deadline counts from the op's start, so allocation time is
part of the op's time.

Token slices: the tensor's columns are the tokens (`width` of them), slice k runs its
columns with its part of the weight, spends op k's times (optimizer.ops.op_duration:
F and B cost_k x the stage's, W share_k x) and holds share_k of the memory.

The first stage has no input gradient to compute, and runtimes skip its B (torch's
does). `input_gradient_on_first_stage` asks ours to run it, so that stage 0's B
sleeps too; on torch's runtime stage 0's B time is spent in its W instead.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from optimizer.errors import InputError
from optimizer.ops import op_duration, op_memory
from optimizer.problem import Problem, Tables
from runtime.slicing import SliceCache

MIB = 2**20
# Upper bounds of the options, checked before any rank starts: past them torch fails
# inside the ranks (a seed past 64 bits, a tensor of 1e300 MiB) or a build runs for
# minutes (a width of 1e8).
SYNTHETIC_MAX_OPTION = {"width": 1_000_000, "batch_size": 1_000_000, "mib_per_unit": 65_536.0, "seed": 1_000_000}
# Numbers in one microbatch's tensor (batch_size x width): 10 million, 40 MB.
SYNTHETIC_MAX_NUMBERS = 10_000_000


@dataclass(frozen=True)
class SyntheticConfig:
    width: int = 16  # features of the tensor passed between stages
    batch_size: int = 2  # rows per microbatch
    mib_per_unit: float = 1.0  # MiB held per memory unit of the problem
    seed: int = 0


def sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


class Ledger:
    """Bytes of the tensors a stage holds for its microbatches in flight."""

    def __init__(self) -> None:
        self.bytes = 0

    def allocate(self, nbytes: int) -> torch.Tensor | None:
        if nbytes <= 0:
            return None
        self.bytes += nbytes
        # Not filled: writing every page costs milliseconds per MiB on a loaded CPU, which
        # would add to the op's time; the operating system commits the pages when touched.
        return torch.empty(nbytes, dtype=torch.uint8)

    def release(self, tensor: torch.Tensor | None) -> None:
        if tensor is not None:
            self.bytes -= tensor.numel()


class _Held:
    """One microbatch's held tensors (freed by B, freed by W, and B's own extra) and its
    backward passes so far: (autograd pass, start) of the input path and of the weight
    path, so that the second of them in one pass knows the backward is fused."""

    def __init__(self, ledger: Ledger, until_b: int, until_w: int, bw_seconds: float):
        self.ledger = ledger
        self.until_b = ledger.allocate(until_b)
        self.until_w = ledger.allocate(until_w)
        self.from_b: torch.Tensor | None = None
        self.bw_seconds = bw_seconds
        self.input_pass: tuple[int, float] | None = None
        self.weight_pass: tuple[int, float] | None = None

    def at_b(self, extra: int) -> None:
        self.ledger.release(self.until_b)
        self.until_b = None
        if self.weight_pass is None:  # in a fused pass after W, nothing is held past it
            self.from_b = self.ledger.allocate(extra)

    def at_w(self) -> None:
        for tensor in (self.until_b, self.until_w, self.from_b):
            self.ledger.release(tensor)
        self.until_b = self.until_w = self.from_b = None


def _current_pass() -> int:
    """The autograd call running now (torch numbers them): a fused backward (BW) runs both
    paths in one call, a split one each path in its own."""
    return torch._C._current_graph_task_id()


class _InputPath(torch.autograd.Function):
    """Identity on the input path; its backward is B: release, then sleep B (in a fused
    backward, until BW's time from the pass's start)."""

    @staticmethod
    def forward(ctx, x, held, b_seconds, b_extra):
        ctx.held, ctx.b_seconds, ctx.b_extra = held, b_seconds, b_extra
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        start, held, now = time.perf_counter(), ctx.held, _current_pass()
        fused_from = held.weight_pass[1] if held.weight_pass is not None and held.weight_pass[0] == now else None
        held.input_pass = (now, start)
        held.at_b(ctx.b_extra)
        sleep_until(start + ctx.b_seconds if fused_from is None else fused_from + held.bw_seconds)
        return grad, None, None, None


class _WeightPath(torch.autograd.Function):
    """Identity on the weight; its backward is W: release the rest, then sleep W.

    In a fused backward (torch runs this path first) it sleeps nothing and the input
    path sleeps until BW's time has passed; should the input path come first, this one
    sleeps until then."""

    @staticmethod
    def forward(ctx, weight, held, w_seconds, has_input_path):
        ctx.held, ctx.w_seconds, ctx.has_input_path = held, w_seconds, has_input_path
        return weight.clone()

    @staticmethod
    def backward(ctx, grad):
        start, held, now = time.perf_counter(), ctx.held, _current_pass()
        if held.input_pass is not None and held.input_pass[0] == now:
            deadline = held.input_pass[1] + held.bw_seconds  # fused, the input path first
        elif held.input_pass is None and ctx.has_input_path:
            deadline = start  # fused, the input path next: it sleeps BW's time
        else:
            deadline = start + ctx.w_seconds
        held.weight_pass = (now, start)
        held.at_w()
        sleep_until(deadline)
        return grad, None, None, None


class SleepingStage(nn.Module):
    input_gradient_on_first_stage = True  # see the module docstring
    token_slices = True  # see the module docstring

    def __init__(self, config: SyntheticConfig, problem: Problem, index: int):
        super().__init__()
        self.index = index
        self.unit = config.mib_per_unit * MIB
        self.tables = problem.tables()
        self.whole = _whole(self.tables)  # an unsliced forward (the reference, shape probing)
        self.ledger = Ledger()
        generator = torch.Generator().manual_seed(config.seed * 100_003 + index)
        self.weight = nn.Parameter(torch.randn(config.width, generator=generator) * 0.1)

    def forward(self, x: torch.Tensor, cache: SliceCache | None = None) -> torch.Tensor:
        start = time.perf_counter()
        slice = cache.slice if cache is not None else None
        tables = self.tables if slice is not None else self.whole
        k = slice or 0
        forward_bytes = round(op_memory(tables, "F", self.index, k) * self.unit)
        b_change = round(op_memory(tables, "B", self.index, k) * self.unit)
        until_b = min(forward_bytes, max(0, -b_change))  # F's part that B frees
        bw_seconds = op_duration(tables, "BW", self.index, k) / 1e3
        held = _Held(self.ledger, until_b, forward_bytes - until_b, bw_seconds) if torch.is_grad_enabled() else None
        weight = self.weight if cache is None else self.weight[cache.start : cache.start + x.shape[1]]
        if held is None:  # no backward will come (shape probing): hold and sleep nothing
            return torch.tanh(x + weight)
        b_seconds = op_duration(tables, "B", self.index, k) / 1e3
        w_seconds = op_duration(tables, "W", self.index, k) / 1e3
        h = _InputPath.apply(x, held, b_seconds, max(0, b_change))  # B's extra beyond F's, freed by W
        # No input gradient (a first stage fed a plain batch): B has nothing to run, and
        # its time goes to W, where the runtime does this stage's whole backward.
        w = _WeightPath.apply(weight, held, w_seconds if x.requires_grad else b_seconds + w_seconds, x.requires_grad)
        out = torch.tanh(h + w)
        sleep_until(start + op_duration(tables, "F", self.index, k) / 1e3)
        return out


def _whole(tables: Tables) -> Tables:
    """The tables of whole microbatches: one slice with all the tokens and all the cost."""
    return dataclasses.replace(tables, slice_share=(1.0,), slice_cost=(1.0,))


def parse_options(options: str) -> tuple[SyntheticConfig, str | None]:
    """`width=16,batch_size=2,mib_per_unit=1,seed=0,problem=PATH` (all optional)."""
    kinds = {f.name: f.type for f in dataclasses.fields(SyntheticConfig)}
    values: dict[str, Any] = {}  # option name -> int or float, as SyntheticConfig declares
    problem_path = None
    seen: set[str] = set()
    for item in filter(None, options.split(",")):
        key, _, value = item.partition("=")
        key = key.strip()
        if key in seen:
            raise InputError(f"model: synthetic option {key} is given twice")
        seen.add(key)
        if key == "problem":
            if not value:
                raise InputError("model: synthetic option problem= needs a problem file's name")
            problem_path = value
            continue
        if key not in kinds:
            raise InputError(f"model: unknown synthetic option '{key}' (known: {', '.join(sorted(kinds))}, problem)")
        try:
            number = float(value) if kinds[key] == "float" else int(value)
        except ValueError:
            raise InputError(f"model: synthetic option {key}='{value}' is not a number") from None
        if key == "seed" and number < 0:
            raise InputError(f"model: synthetic option seed={value} must be 0 or more")
        if key != "seed" and (not number >= 1e-12 or number == float("inf")):
            raise InputError(f"model: synthetic option {key}={value} must be positive and finite")
        if number > SYNTHETIC_MAX_OPTION[key]:
            raise InputError(
                f"model: synthetic option {key}={value} is more than the {SYNTHETIC_MAX_OPTION[key]:.0f} the synthetic model takes"
            )
        values[key] = number
    config = SyntheticConfig(**values)
    if config.width * config.batch_size > SYNTHETIC_MAX_NUMBERS:
        raise InputError(
            f"model: the synthetic model's tensor of batch_size x width = {config.width * config.batch_size} numbers "
            f"is more than the {SYNTHETIC_MAX_NUMBERS:.0e} it passes (make width or batch_size smaller)"
        )
    return config, problem_path


def build_synthetic(config: SyntheticConfig, problem: Problem, num_stages: int):
    """The synthetic model of `problem` (see the module docstring) as a PipelineModel."""
    from runtime.models import PipelineModel

    if problem.num_stages != num_stages:
        raise InputError(f"model: the synthetic model's problem has {problem.num_stages} stages, the pipeline {num_stages}")
    stages = [SleepingStage(config, problem, s) for s in range(num_stages)]

    def make_batch(step: int, num_microbatches: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
        shape = (num_microbatches * config.batch_size, config.width)
        return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)

    return PipelineModel(stages, F.mse_loss, make_batch)

"""One rank's training session for a schedule: model stages, plan, transfers, optimizer.

`open_session` runs inside an initialized process group. It checks the schedule against
the world, builds the model (every rank the same way, keeping its own stages), learns
the shape of every stage output with one no-grad forward of the first microbatch, cuts
the token slices of a sliced schedule from the model's sequence length, and wires the
executor. A vocabulary-parallel schedule runs the model's stages without the token
embedding and output layer, and this rank's shard of those two (runtime/vocab_runner.py)
with one process group per collective stream. `step` runs one timed training step with the ranks started
together, so a step's time is comparable with a simulated makespan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from optimizer.errors import InputError
from optimizer.problem import Problem
from optimizer.schedule import Schedule
from runtime.collectives import streams
from runtime.comm import P2P, TensorSpec, all_ranks_meet
from runtime.executor import Executor, StepResult
from runtime.memory import MemoryMeter
from runtime.models import PipelineModel, VocabularyStages, load_model, vocabulary_stages
from runtime.plan import RankPlan, build_plans
from runtime.position import RankPosition
from runtime.slicing import slice_bounds
from runtime.vocab import VocabShard, shard_bounds
from runtime.vocab_runner import VocabRunner


@dataclass
class Session:
    plan: RankPlan
    model: PipelineModel
    modules: dict[int, nn.Module]  # this rank's stages
    executor: Executor
    optimizer: torch.optim.Optimizer | None
    device: torch.device
    meter: MemoryMeter | None
    vocab: VocabRunner | None = None  # this rank's vocabulary shard (vocabulary-parallel schedules)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.make_batch(step, self.plan.num_microbatches)

    def step(self, step: int, record: bool = False) -> StepResult:
        """One step's ops on this rank (no optimizer update; see `update`)."""
        inputs, targets = self.batch(step)
        m = self.plan.num_microbatches
        if inputs.shape[0] % m:
            raise InputError(f"model: batch of {inputs.shape[0]} does not split into {m} equal microbatches")
        first, last = 0 in self.modules, self.plan.num_stages - 1 in self.modules
        if self.plan.vocab_barriers:  # every rank embeds its shard's tokens and scores its shard's logits
            first = last = True
        mb_inputs = [x.to(self.device) for x in inputs.chunk(m)] if first else []
        mb_targets = [y.to(self.device) for y in targets.chunk(m)] if last else []
        # Start together: a step's time is then the pipeline's, not a straggler's.
        all_ranks_meet(self.plan.rank, "at the step's start", dist.barrier)
        return self.executor.run_step(mb_inputs, mb_targets, record=record, step=step)

    def update(self) -> None:
        if self.optimizer is not None:
            self.optimizer.step()
        for module in self.modules.values():
            module.zero_grad(set_to_none=True)
        if self.vocab is not None:
            self.vocab.shard.zero_grad(set_to_none=True)


def output_specs(stages: Sequence[nn.Module], example_input: torch.Tensor) -> list[TensorSpec]:
    """Shape and dtype of each stage's output, from one no-grad forward."""
    specs: list[TensorSpec] = []
    x = example_input
    with torch.no_grad():
        for stage in stages:
            x = stage(x)
            if not isinstance(x, torch.Tensor):
                raise InputError(f"model: stage {len(specs)} returns {type(x).__name__}, not one tensor")
            specs.append(TensorSpec(tuple(x.shape), x.dtype))
    return specs


def token_slices(
    model: PipelineModel, plan: RankPlan, microbatch: torch.Tensor, model_name: str, source: str
) -> list[tuple[int, int]] | None:
    """The slices' token ranges, None for an unsliced schedule; refuses a model that cannot slice."""
    if plan.num_slices == 1:
        return None
    if not all(getattr(stage, "token_slices", False) for stage in model.stages):
        raise InputError(f"model: {model_name} does not run token slices ({source} has {plan.num_slices} per microbatch)")
    if microbatch.dim() < 2:
        raise InputError(f"model: {model_name}'s inputs have no token dimension to slice")
    return slice_bounds(plan.slice_shares, microbatch.shape[1], source)


def open_session(
    schedule: Schedule,
    model_name: str,
    rank: int,
    world_size: int,
    device: torch.device,
    timeout_s: float,
    measure_memory: bool = False,
    source: str = "schedule",
    model_problem: Problem | None = None,
    position: RankPosition | None = None,
) -> Session:
    """`model_problem`: the problem a synthetic model takes its op times from; `position`:
    where the executor keeps the op it is in, for the launcher (runtime/position.py)."""
    plan = build_plans(schedule, world_size, source)[rank]
    model = load_model(model_name, plan.num_stages, model_problem)
    example_inputs, _ = model.make_batch(0, plan.num_microbatches)
    first_microbatch = example_inputs.chunk(plan.num_microbatches)[0]
    stages, vocab = model.stages, None
    if plan.vocab_barriers:
        offered = vocabulary_stages(model, model_name, source)
        stages = offered.stages
        vocab = VocabRunner(vocab_shard(offered, world_size, rank, model_name).to(device), plan, vocab_groups(plan), timeout_s)
        first_microbatch = F.embedding(first_microbatch, offered.embedding)  # what stage 0 takes
    specs = output_specs(stages, first_microbatch)
    bounds = token_slices(model, plan, first_microbatch, model_name, source)
    modules = {s: stages[s].to(device) for s in plan.stages}
    params = [p for module in modules.values() for p in module.parameters()]
    if vocab is not None:
        params += list(vocab.shard.parameters())
    meter = MemoryMeter(device, params) if measure_memory else None
    p2p = P2P(plan, specs, device, timeout_s, bounds)
    executor = Executor(
        plan,
        modules,
        model.loss_fn,
        p2p,
        device,
        meter=meter,
        synchronize=measure_memory,
        slice_bounds=bounds,
        vocab=vocab,
        position=position,
    )
    optimizer = torch.optim.AdamW(params, lr=1e-3) if params else None
    return Session(plan, model, modules, executor, optimizer, device, meter, vocab)


def vocab_shard(offered: VocabularyStages, world_size: int, rank: int, model_name: str) -> VocabShard:
    """This rank's rows of the model's token embedding and output layer."""
    vocab = offered.embedding.shape[0]
    if vocab < world_size:
        raise InputError(f"model: {model_name} has a vocabulary of {vocab}, fewer rows than the {world_size} devices to shard it over")
    names = (offered.embedding_name, offered.head_name)
    return VocabShard(offered.embedding, offered.head, shard_bounds(vocab, world_size)[rank], names)


def vocab_groups(plan: RankPlan) -> dict[str, dist.ProcessGroup]:
    """One process group per collective stream, so that each stream's order is its own."""
    groups = {}
    for stream in streams(plan.vocab_barriers):
        group = dist.new_group(list(range(plan.world_size)))
        assert group is not None, "every rank is a member"
        groups[stream] = group
    return groups

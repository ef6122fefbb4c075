"""`pipesched run --engine torch`: the schedule on torch.distributed.pipelining's runtime.

Each rank exports the schedule to torch's compute-only CSV (optimizer/formats/
torch_csv.py), wraps its own stages of the same model as torch `PipelineStage`s, and
loads the CSV into `_PipelineScheduleRuntime`, which inserts its sends and receives
itself and runs the ops in our order. Data, loss, optimizer (AdamW, lr 1e-3) and the
`--check` reference are the executor's (runtime/worker.py), so the two engines are
compared on identical work; the summary has the same fields.

Loss scaling differs in form, not in result: torch computes each microbatch's mean loss
and divides the accumulated gradients by the microbatch count at the end (scale_grads),
our executor divides each microbatch's loss by it; both give the gradient of the mean
loss over the batch.

torch's stage skips the input-gradient part of B on the first stage (it has no input
to differentiate) and runs that stage's whole backward in W, as our executor does for
a first stage fed token ids.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from optimizer.formats.torch_csv import export_csv
from optimizer.schedule import schedule_from_json


@dataclass(frozen=True)
class TorchRunJob:
    schedule: dict  # schedule JSON v1
    source: str
    model: str
    steps: int = 3
    check: bool = False
    timeout_s: float = 60.0

    def execute(self, rank: int, world_size: int, device: torch.device) -> dict | None:
        return run_torch_rank(self, rank, world_size, device)


def load_runtime(schedule, stages: list, loss_fn):
    """torch's runtime for this rank's PipelineStages, loaded from the schedule's CSV."""
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    runtime = _PipelineScheduleRuntime(stages, schedule.problem.num_microbatches, loss_fn=loss_fn, scale_grads=True)
    with tempfile.TemporaryDirectory(prefix="pipesched-torch-") as folder:
        path = Path(folder) / "schedule.csv"
        path.write_text(export_csv(schedule))
        runtime._load_csv(str(path), format="compute_only")
    return runtime


def run_torch_rank(job: TorchRunJob, rank: int, world_size: int, device: torch.device) -> dict | None:
    from torch.distributed.pipelining import PipelineStage

    from runtime.check import compare_gradients, loss_matches, reference_step
    from runtime.models import load_model
    from runtime.plan import build_plans
    from runtime.worker import summarize

    schedule = schedule_from_json(job.schedule, job.source, check=False)
    plan = build_plans(schedule, world_size, job.source)[rank]  # the executor's refusals, word for word
    m, num_stages = plan.num_microbatches, plan.num_stages
    model = load_model(job.model, num_stages, schedule.problem)
    modules = {s: model.stages[s].to(device) for s in plan.stages}
    stages = [PipelineStage(modules[s], s, num_stages, device) for s in plan.stages]
    runtime = load_runtime(schedule, stages, model.loss_fn)
    params = [p for module in modules.values() for p in module.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-3) if params else None
    first, last = 0 in modules, num_stages - 1 in modules

    steps, check_report = [], None
    for step in range(job.steps):
        inputs, targets = model.make_batch(step, m)
        args = (inputs.to(device),) if first else ()
        losses: list[torch.Tensor] = []
        kwargs = {"target": targets.to(device), "losses": losses} if last else {}
        dist.barrier()  # start together, as the executor does
        start = time.perf_counter()
        runtime.step(*args, return_outputs=False, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        loss = float(torch.stack([x.detach() for x in losses]).mean()) if last else None
        steps.append((seconds, loss))
        if step == 0 and job.check:
            reference = reference_step(load_model(job.model, num_stages, schedule.problem), inputs, targets)
            mismatches, worst, count = compare_gradients(modules, reference)
            loss_ok = loss is None or loss_matches(loss, reference.loss)
            check_report = (mismatches, worst, count, loss_ok, loss, reference.loss)
        if optimizer is not None:
            optimizer.step()
        for module in modules.values():
            module.zero_grad(set_to_none=True)

    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, (steps, check_report))
    if rank != 0:
        return None
    return {**summarize(job, schedule, plan.predicted_makespan, gathered), "engine": "torch"}

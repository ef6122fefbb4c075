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

import contextlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from optimizer.formats.schedule_json import schedule_from_json
from optimizer.formats.torch_csv import export_csv
from runtime.comm import CommError, all_ranks_meet, backend_line
from runtime.position import RankPosition
from runtime.worker import RunJob


@dataclass(frozen=True)
class TorchRunJob(RunJob):
    """The same run as RunJob (schedule, model, steps, check), on torch's runtime."""

    def execute(self, rank: int, world_size: int, device: torch.device, position: RankPosition | None = None) -> dict | None:
        # torch's runtime logs a failed action with its whole schedule (20+ lines on
        # stderr) before raising: the log is kept from stderr, the action it names goes
        # into the one line the launcher prints. The rank is a process of its own, so the
        # logger's setting ends with it.
        failed = _FailedAction()
        logger = logging.getLogger("torch.distributed.pipelining")
        for handler in list(logger.handlers):  # torch's own, to stderr
            logger.removeHandler(handler)
        logger.addHandler(failed)
        logger.propagate = False
        try:
            return run_torch_rank(self, rank, world_size, device, position)
        except RuntimeError as error:
            if failed.action is not None:
                raise CommError(f"rank {rank} at torch's action {failed.action}: {backend_line(error)}") from None
            if "Timed out" in str(error):  # outside the actions (the stages' shape inference)
                raise CommError(f"rank {rank} in torch's runtime: {backend_line(error)}") from None
            raise


class _FailedAction(logging.Handler):
    """The action torch's runtime names when one fails ("... when running action 0B1")."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.action: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"when running action (\S+?)\.?(\s|$)", record.getMessage())
        if found is not None:
            self.action = found.group(1)


@contextlib.contextmanager
def csv_file(text: str) -> Iterator[str]:
    """A path that reads as `text` for as long as the block runs (torch's runtime loads its
    schedule from a file name). On Linux an anonymous in-memory file, which nothing on disk
    names: a rank stopped by SIGKILL inside the block (the launcher's way of stopping ranks
    after Ctrl-C) left its temporary folder behind. Elsewhere a temporary folder."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        descriptor = os.memfd_create("pipesched-torch-schedule.csv")
        try:
            with os.fdopen(os.dup(descriptor), "w", encoding="utf-8") as writer:
                writer.write(text)
            yield f"/proc/self/fd/{descriptor}"
        finally:
            os.close(descriptor)
        return
    with tempfile.TemporaryDirectory(prefix="pipesched-torch-") as folder:
        path = Path(folder) / "schedule.csv"
        path.write_text(text, encoding="utf-8")
        yield str(path)


def load_runtime(schedule, stages: list, loss_fn):
    """torch's runtime for this rank's PipelineStages, loaded from the schedule's CSV."""
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    runtime = _PipelineScheduleRuntime(stages, schedule.problem.num_microbatches, loss_fn=loss_fn, scale_grads=True)
    with csv_file(export_csv(schedule)) as path:
        runtime._load_csv(path, format="compute_only")
    return runtime


class TorchSession:
    """One rank's stages of a model on torch's runtime, loaded from the schedule's CSV."""

    def __init__(self, schedule, model_name: str, rank: int, world_size: int, device: torch.device, source: str = "schedule"):
        from torch.distributed.pipelining import PipelineStage

        from runtime.models import load_model
        from runtime.plan import build_plans

        self.schedule = schedule
        self.plan = build_plans(schedule, world_size, source)[rank]  # the executor's refusals, word for word
        self.model = load_model(model_name, self.plan.num_stages, schedule.problem)
        self.device = device
        self.modules = {s: self.model.stages[s].to(device) for s in self.plan.stages}
        stages = [PipelineStage(self.modules[s], s, self.plan.num_stages, device) for s in self.plan.stages]
        self.runtime = load_runtime(schedule, stages, self.model.loss_fn)
        params = [p for module in self.modules.values() for p in module.parameters()]
        self.optimizer = torch.optim.AdamW(params, lr=1e-3) if params else None

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.make_batch(step, self.plan.num_microbatches)

    def step(self, step: int) -> tuple[float, float | None]:
        """One timed step (no optimizer update; see `update`): seconds, and the loss on
        the rank holding the last stage."""
        inputs, targets = self.batch(step)
        first, last = 0 in self.modules, self.plan.num_stages - 1 in self.modules
        args = (inputs.to(self.device),) if first else ()
        losses: list[torch.Tensor] = []
        kwargs = {"target": targets.to(self.device), "losses": losses} if last else {}
        all_ranks_meet(self.plan.rank, "at the step's start", dist.barrier)  # start together, as the executor does
        start = time.perf_counter()
        self.runtime.step(*args, return_outputs=False, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        return seconds, float(torch.stack([x.detach() for x in losses]).mean()) if last else None

    def update(self) -> None:
        if self.optimizer is not None:
            self.optimizer.step()
        for module in self.modules.values():
            module.zero_grad(set_to_none=True)


def run_torch_rank(job: TorchRunJob, rank: int, world_size: int, device: torch.device, position: RankPosition | None = None) -> dict | None:
    from runtime.check import compare_gradients, loss_matches, reference_step
    from runtime.models import load_model
    from runtime.worker import summarize

    schedule = schedule_from_json(job.schedule, job.source, check=False)
    session = TorchSession(schedule, job.model, rank, world_size, device, job.source)
    steps, check_report = [], None
    for step in range(job.steps):
        if position is not None:
            position.in_step(step)
        seconds, loss = session.step(step)
        steps.append((seconds, loss))
        if step == 0 and job.check:
            inputs, targets = session.batch(0)
            reference = reference_step(load_model(job.model, session.plan.num_stages, schedule.problem), inputs, targets)
            mismatches, worst, count = compare_gradients(session.modules, reference)
            loss_ok = loss is None or loss_matches(loss, reference.loss)
            check_report = (mismatches, worst, count, loss_ok, loss, reference.loss)
        session.update()

    gathered: list = [None] * world_size
    all_ranks_meet(rank, "gathering the results", lambda: dist.all_gather_object(gathered, (steps, check_report)))
    if rank != 0:
        return None
    return {**summarize(job, schedule, session.plan.predicted_makespan, gathered), "engine": "torch"}

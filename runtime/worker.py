"""What each rank does for `pipesched run`: train N steps of a schedule, optionally check.

A job is a small picklable description that the launcher hands to every rank; its
`execute` runs on one rank inside the process group and returns the run's summary on
rank 0 (None elsewhere).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist

from optimizer.errors import PipeschedError
from optimizer.formats.schedule_json import schedule_from_json
from runtime.comm import all_ranks_meet
from runtime.position import RankPosition


class CheckError(PipeschedError):
    """The pipeline's gradients differ from the single-process reference (exit 1)."""

    exit_code = 1


@dataclass(frozen=True)
class RunJob:
    schedule: dict  # schedule JSON v1
    source: str  # where it came from, for messages
    model: str
    steps: int = 3
    check: bool = False
    timeout_s: float = 60.0

    def execute(self, rank: int, world_size: int, device: torch.device, position: RankPosition | None = None) -> dict | None:
        return run_rank(self, rank, world_size, device, position)


def run_rank(job: RunJob, rank: int, world_size: int, device: torch.device, position: RankPosition | None = None) -> dict | None:
    from runtime.check import compare_gradients, compare_shard, loss_matches, reference_step
    from runtime.models import load_model
    from runtime.session import open_session

    schedule = schedule_from_json(job.schedule, job.source, check=False)
    session = open_session(
        schedule, job.model, rank, world_size, device, job.timeout_s, source=job.source, model_problem=schedule.problem, position=position
    )
    steps = []
    check_report = None
    for step in range(job.steps):
        result = session.step(step)
        steps.append((result.seconds, result.loss))
        if step == 0 and job.check:
            inputs, targets = session.batch(0)
            reference = reference_step(load_model(job.model, session.plan.num_stages, schedule.problem), inputs, targets)
            mismatches, worst, count = compare_gradients(session.modules, reference)
            if session.vocab is not None:
                more, worst_shard, shard_count = compare_shard(session.vocab.shard, reference)
                mismatches, worst, count = mismatches + more, max(worst, worst_shard), count + shard_count
            loss_ok = result.loss is None or loss_matches(result.loss, reference.loss)
            check_report = (mismatches, worst, count, loss_ok, result.loss, reference.loss)
        session.update()

    gathered: list = [None] * world_size
    all_ranks_meet(rank, "gathering the results", lambda: dist.all_gather_object(gathered, (steps, check_report)))
    if rank != 0:
        return None
    return summarize(job, schedule, session.plan.predicted_makespan, gathered)


def summarize(job: RunJob, schedule, predicted: float, gathered: list) -> dict:
    """Rank 0's report: per-step time (slowest rank) and loss, and the check's verdict."""
    num_steps = len(gathered[0][0])
    seconds = [max(rank_steps[i][0] for rank_steps, _ in gathered) for i in range(num_steps)]
    losses = [next(rank_steps[i][1] for rank_steps, _ in gathered if rank_steps[i][1] is not None) for i in range(num_steps)]
    timed = seconds[1:] if num_steps > 1 else seconds  # the first step warms up allocators and caches
    summary = {
        "method": schedule.method,
        "devices": schedule.problem.num_devices,
        "stages": schedule.problem.num_stages,
        "microbatches": schedule.problem.num_microbatches,
        "slices": schedule.problem.num_slices,
        "model": job.model,
        "steps": num_steps,
        "step_ms": [round(s * 1e3, 4) for s in seconds],
        "median_step_ms": statistics.median(timed) * 1e3,
        "predicted_makespan": predicted,  # in the problem's time unit (ms when profiled)
        "losses": losses,
    }
    if job.check:
        reports = [report for _, report in gathered]
        mismatches = sorted((m for r in reports for m in r[0]), key=lambda m: m.stage)
        loss_report = next(r for r in reports if r[4] is not None)
        check = {
            "passed": not mismatches and loss_report[3],
            "parameters": sum(r[2] for r in reports),
            "max_relative_error": max(r[1] for r in reports),
            "loss": loss_report[4],
            "reference_loss": loss_report[5],
        }
        # A parameter names where to look; the loss only says that something differs.
        if mismatches:
            check["first_mismatch"] = mismatches[0].describe()
        elif not loss_report[3]:
            check["first_mismatch"] = f"loss {loss_report[4]:.8g} != reference {loss_report[5]:.8g}"
        summary["check"] = check
    return summary

"""The profiler: run the model on P ranks and write the problem the solver takes.

It runs a profiling schedule (GPipe order with split backward: every F, then per stage
from the last one each microbatch's B then W; valid for any placement) for a warm-up
step, `steps` timed steps and one step measuring memory, and takes per stage:

- F, B, W times: the median over the measured steps and microbatches of each op's busy
  time (its wall time minus time blocked on a receive), in milliseconds;
- memory changes: median bytes kept by F and by B (runtime/memory.py), W = -(F + B) so
  they sum to zero, in GiB;
- comm_time: half the median round trip of one stage output between each pair of
  neighbouring devices, in milliseconds.

Times are those of this executor on this machine, so a schedule solved from the
profile predicts the executor's step time (the executor benchmark compares them).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist

from optimizer.problem import Problem, placement_devices, uniform_problem
from optimizer.schedule import Op, Schedule
from optimizer.simulate import simulate

GIB = float(2**30)
_PING_ROUNDS, _PING_WARMUP = 12, 3
_MIN_MS = 1e-4  # the problem needs positive times; a no-op B measures about this much


@dataclass(frozen=True)
class ProfileJob:
    model: str
    devices: int
    microbatches: int
    placement: str = "linear"
    steps: int = 5
    timeout_s: float = 60.0

    def execute(self, rank: int, world_size: int, device: torch.device) -> dict | None:
        return profile_rank(self, rank, world_size, device)


def profiling_schedule(devices: int, microbatches: int, placement: str) -> Schedule:
    """All forwards, then each stage's B and W per microbatch from the last stage back."""
    problem = uniform_problem(devices, microbatches, placement=placement)
    orders = []
    for device in range(devices):
        stages = problem.stages_on(device)
        ops = [Op("F", s, i) for s in stages for i in range(microbatches)]
        ops += [Op(kind, s, i) for s in reversed(stages) for i in range(microbatches) for kind in ("B", "W")]
        orders.append(ops)
    return simulate(problem, orders, method="profile")


def profile_rank(job: ProfileJob, rank: int, world_size: int, device: torch.device) -> dict | None:
    from runtime.session import open_session

    schedule = profiling_schedule(job.devices, job.microbatches, job.placement)
    session = open_session(schedule, job.model, rank, world_size, device, job.timeout_s, measure_memory=True)
    busy: dict[tuple[str, int], list[float]] = defaultdict(list)
    # Step 0 warms up; the timed steps run without the memory meter's hooks; the last
    # step measures memory.
    for step in range(job.steps + 2):
        measuring_memory = step == job.steps + 1
        session.meter.enabled = measuring_memory
        result = session.step(step, record=not measuring_memory)
        session.update()
        if 1 <= step <= job.steps:
            for timing in result.timings:
                busy[(timing.op.kind, timing.op.stage)].append(timing.busy)
    times = {key: statistics.median(values) * 1e3 for key, values in busy.items()}
    memory = {key: statistics.median(values) for key, values in session.meter.samples.items()}
    round_trips = _ping_pong(session, device)

    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, (times, memory, round_trips))
    if rank != 0:
        return None
    return {"problem": assemble_problem(job, gathered).model_dump(mode="json"), "steps": job.steps}


def _ping_pong(session, device: torch.device) -> list[float]:
    """Round trips (seconds) of one stage output between each pair of neighbouring devices."""
    plan = session.plan
    specs = session.executor.p2p.outputs
    pairs_done: set[tuple[int, int]] = set()
    measured = []
    for s in range(plan.num_stages - 1):
        a, b = plan.stage_device[s], plan.stage_device[s + 1]
        pair = (min(a, b), max(a, b))
        if a == b or pair in pairs_done:
            continue
        pairs_done.add(pair)
        if plan.rank not in pair:
            continue
        tensor = torch.zeros(specs[s].shape, dtype=specs[s].dtype, device=device)
        for round_ in range(_PING_WARMUP + _PING_ROUNDS):
            start = time.perf_counter()
            if plan.rank == a:
                dist.send(tensor, b)
                dist.recv(tensor, b)
            else:
                dist.recv(tensor, a)
                dist.send(tensor, a)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if plan.rank == a and round_ >= _PING_WARMUP:
                measured.append(time.perf_counter() - start)
    return measured


def assemble_problem(job: ProfileJob, gathered: list) -> Problem:
    """The problem JSON from every rank's medians."""
    times: dict[tuple[str, int], float] = {}
    memory: dict[tuple[str, int], float] = {}
    round_trips: list[float] = []
    for rank_times, rank_memory, rank_trips in gathered:
        times.update(rank_times)
        memory.update(rank_memory)
        round_trips += rank_trips
    stages = []
    for s, device in enumerate(placement_devices(job.placement, job.devices)):
        kept_forward = max(0.0, memory[("F", s)]) / GIB
        kept_backward = memory[("B", s)] / GIB
        stages.append(
            {
                "device": device,
                "forward": max(times[("F", s)], _MIN_MS),
                "backward_input": max(times[("B", s)], _MIN_MS),
                "backward_weight": max(times[("W", s)], _MIN_MS),
                "memory": {
                    "forward": kept_forward,
                    "backward_input": kept_backward,
                    "backward_weight": -(kept_forward + kept_backward),
                },
            }
        )
    comm_ms = statistics.median(round_trips) / 2 * 1e3 if round_trips else 0.0
    return Problem.model_validate(
        {"num_devices": job.devices, "num_microbatches": job.microbatches, "stages": stages, "comm_time": comm_ms}
    )

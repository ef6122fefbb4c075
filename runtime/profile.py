"""The profiler: run the model on P ranks and write the problem the solver takes.

It runs a profiling schedule (GPipe order with split backward: every F, then per stage
from the last one each microbatch's B then W; valid for any placement) for a warm-up
step, `steps` timed steps and one step measuring memory, and takes per stage:

- F, B, W times: the median over the measured steps and microbatches of each op's busy
  time (its wall time minus time blocked on a receive), in milliseconds; also the fused
  backward BW, from a second pass in GPipe order, written as the stage's `backward` (a
  BW op lasts as measured, often less than B + W);
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

from optimizer.ops import Op
from optimizer.problem import Problem, placement_devices, uniform_problem
from optimizer.schedule import Schedule
from optimizer.simulate import simulate
from runtime.position import RankPosition

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

    def execute(self, rank: int, world_size: int, device: torch.device, position: RankPosition | None = None) -> dict | None:
        return profile_rank(self, rank, world_size, device, position)


def profiling_schedule(devices: int, microbatches: int, placement: str, fused: bool = False) -> Schedule:
    """All forwards, then each stage's B and W (or BW) per microbatch from the last stage back."""
    problem = uniform_problem(devices, microbatches, placement=placement)
    backward = ("BW",) if fused else ("B", "W")
    orders = []
    for device in range(devices):
        stages = problem.stages_on(device)
        ops = [Op("F", s, i) for s in stages for i in range(microbatches)]
        ops += [Op(kind, s, i) for s in reversed(stages) for i in range(microbatches) for kind in backward]
        orders.append(ops)
    return simulate(problem, orders, method="profile")


def timed_steps(session, steps: int, first_step: int) -> dict[tuple[str, int], list[float]]:
    """Busy seconds of each (kind, stage) over `steps` steps of a session."""
    busy: dict[tuple[str, int], list[float]] = defaultdict(list)
    for step in range(first_step, first_step + steps):
        result = session.step(step, record=True)
        session.update()
        for timing in result.timings:
            busy[(timing.op.kind, timing.op.stage)].append(timing.busy)
    return busy


def profile_rank(job: ProfileJob, rank: int, world_size: int, device: torch.device, position: RankPosition | None = None) -> dict | None:
    from runtime.session import open_session

    schedule = profiling_schedule(job.devices, job.microbatches, job.placement)
    session = open_session(schedule, job.model, rank, world_size, device, job.timeout_s, measure_memory=True, position=position)
    meter = session.meter
    assert meter is not None, "open_session(measure_memory=True) gives a meter"
    # One warm-up step, the timed steps without the memory meter's hooks (they cost time
    # in every F), then one step measuring memory.
    meter.enabled = False
    timed_steps(session, 1, 0)
    busy = timed_steps(session, job.steps, 1)
    meter.enabled = True
    timed_steps(session, 1, job.steps + 1)
    times = {key: statistics.median(values) * 1e3 for key, values in busy.items()}
    memory = {key: statistics.median(values) for key, values in meter.samples.items()}
    round_trips = ping_pong(session, device)

    # The fused backward (BW) is often cheaper than B + W: measured in its own pass, it
    # becomes each stage's `backward`, so that solvers see when fusing wins.
    fused = open_session(
        profiling_schedule(job.devices, job.microbatches, job.placement, fused=True),
        job.model,
        rank,
        world_size,
        device,
        job.timeout_s,
        position=position,
    )
    timed_steps(fused, 1, 0)
    fused_busy = timed_steps(fused, job.steps, 1)
    times.update({key: statistics.median(values) * 1e3 for key, values in fused_busy.items()})

    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, (times, memory, round_trips))
    if rank != 0:
        return None
    return {**profile_result(job.devices, job.microbatches, job.placement, gathered), "steps": job.steps}


def profile_result(devices: int, microbatches: int, placement: str, gathered: list) -> dict:
    """The problem and the fused backward times from every rank's (times in ms per
    (kind, stage), memory bytes per (kind, stage), round trips in seconds)."""
    times: dict[tuple[str, int], float] = {}
    memory: dict[tuple[str, int], float] = {}
    round_trips: list[float] = []
    for rank_times, rank_memory, rank_trips in gathered:
        times.update(rank_times)
        memory.update(rank_memory)
        round_trips += rank_trips
    problem = assemble_problem(devices, microbatches, placement, times, memory, round_trips)
    return {
        "problem": problem.to_json(),
        "fused_backward_ms": [times[("BW", s)] for s in range(problem.num_stages)],
    }


def with_fused_backward(problem: Problem, fused_backward_ms: list[float]) -> Problem:
    """The problem with W set to (measured BW - B) and `backward` to the measured BW.

    A profiled problem already holds the measured BW as `backward`; this also makes its
    split B + W add up to it (what predictions made before `backward` existed used)."""
    data = problem.model_dump(mode="json")
    for stage, bw in zip(data["stages"], fused_backward_ms):
        stage["backward_weight"] = max(bw - stage["backward_input"], _MIN_MS)
        stage["backward"] = max(bw, _MIN_MS)
    return Problem.model_validate(data)


def ping_pong(session, device: torch.device) -> list[float]:
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


def assemble_problem(
    devices: int,
    microbatches: int,
    placement: str,
    times: dict[tuple[str, int], float],
    memory: dict[tuple[str, int], float],
    round_trips: list[float],
) -> Problem:
    """The problem from per-stage median times (ms; BW's, when measured, as `backward`)
    and memory (bytes; absent: 0)."""
    stages = []
    for s, device in enumerate(placement_devices(placement, devices)):
        kept_forward = max(0.0, memory.get(("F", s), 0.0)) / GIB
        kept_backward = memory.get(("B", s), 0.0) / GIB
        stages.append(
            {
                "device": device,
                "forward": max(times[("F", s)], _MIN_MS),
                "backward_input": max(times[("B", s)], _MIN_MS),
                "backward_weight": max(times[("W", s)], _MIN_MS),
                **({"backward": max(times[("BW", s)], _MIN_MS)} if ("BW", s) in times else {}),
                "memory": {
                    "forward": kept_forward,
                    "backward_input": kept_backward,
                    "backward_weight": -(kept_forward + kept_backward),
                },
            }
        )
    comm_ms = statistics.median(round_trips) / 2 * 1e3 if round_trips else 0.0
    return Problem.model_validate({"num_devices": devices, "num_microbatches": microbatches, "stages": stages, "comm_time": comm_ms})

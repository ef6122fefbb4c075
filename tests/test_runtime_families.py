"""Every schedule family, run by the executor on 2 and 4 gloo ranks, matches one process.

One launch per world size runs all families one after another in the same process
group (starting ranks is the slow part); each family is then its own test. The model is
the example GPT with uneven stages: one block in the first and last stage (which also
hold the embeddings and the head), two in the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from optimizer.problem import uniform_problem
from optimizer.schedules import GENERATORS, generate
from runtime.launch import launch
from runtime.worker import RunJob

pytestmark = [pytest.mark.runtime, pytest.mark.slow]

FAMILIES = {
    "gpipe": "linear",
    "1f1b": "linear",
    "zb-h1": "linear",
    "zb-h2": "linear",
    "interleaved-1f1b": "interleaved:2",
    "interleaved-zb": "interleaved:2",
    "zb-v": "vshape",
    "v-half": "vshape",
    "v-min": "vshape",
    "dualpipe-v": "vshape",
}


def microbatches(world_size: int) -> int:
    return 2 * world_size  # the least every family takes (DualPipeV needs 2p)


def tiny_model(num_stages: int) -> str:
    split = "1/3" if num_stages == 2 else "/".join(["1"] + ["2"] * (num_stages - 2) + ["1"])
    return f"example:hidden=32,heads=2,vocab=64,seq_len=16,batch_size=2,split={split}"


@dataclass(frozen=True)
class Batch:
    """Several runs in one process group, one after another."""

    jobs: tuple[RunJob, ...]
    timeout_s: float = 60.0

    def execute(self, rank, world_size, device, position=None):
        results = {job.source: job.execute(rank, world_size, device, position) for job in self.jobs}
        return results if rank == 0 else None


def _jobs(world_size: int) -> tuple[dict[str, str], tuple[RunJob, ...]]:
    skipped, jobs = {}, []
    for family, placement in FAMILIES.items():
        if family not in GENERATORS:
            skipped[family] = f"schedule family {family} is not registered yet"
            continue
        problem = uniform_problem(world_size, microbatches(world_size), placement=placement)
        reason = GENERATORS[family].unsupported(problem)
        if reason is not None:
            skipped[family] = f"{family} does not apply to {world_size} devices x {microbatches(world_size)} microbatches: {reason}"
            continue
        schedule = generate(problem, family)
        jobs.append(RunJob(schedule.to_json(), family, tiny_model(problem.num_stages), steps=1, check=True, timeout_s=60))
    return skipped, tuple(jobs)


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def family_runs(request):
    world_size = request.param
    skipped, jobs = _jobs(world_size)
    results = launch(Batch(jobs), world_size, threads=1) if jobs else {}
    return world_size, skipped, results


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_matches_single_process(family_runs, family):
    world_size, skipped, results = family_runs
    assert family not in skipped, skipped[family]  # every family must run here
    summary = results[family]
    check = summary["check"]
    assert check["passed"], check.get("first_mismatch")
    assert check["max_relative_error"] < 1e-5
    assert summary["devices"] == world_size

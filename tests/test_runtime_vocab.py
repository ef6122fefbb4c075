"""Vocabulary-parallel schedules run by the executor on 2 and 4 gloo ranks match one process.

The reference is the example GPT with its full token embedding and output layer in one
process; the pipeline runs the same weights with both sharded over every rank. Cases:
the paper's families with both barrier counts (V-Half on the V placement: 2 stages per
rank), a solved schedule, and a chosen layer split. One launch per world size runs them
all (starting ranks is the slow part). Each schedule's transfers must also pair up on a
backend that matches them by order (runtime/pairing.py), since gloo would not notice.
"""

from __future__ import annotations

import pytest
from test_runtime_families import Batch, tiny_model
from test_runtime_vocab_plan import hand_made, with_vocab

from optimizer.balance import choose_vocab_split
from optimizer.exact import SolveOptions, solve
from optimizer.formats.example_split import blocks_per_stage
from optimizer.layers import LayersProfile
from optimizer.problem import uniform_problem
from optimizer.schedule import Schedule
from optimizer.schedules import generate
from optimizer.split import Placement
from runtime.launch import launch
from runtime.models import load_model
from runtime.pairing import pairing_deadlock
from runtime.plan import build_plans
from runtime.worker import RunJob

pytestmark = [pytest.mark.runtime, pytest.mark.slow]

FAMILIES = {"1f1b-vocab": "linear", "zb-h1-vocab": "linear", "v-half-vocab": "vshape"}
CASES = [f"{family}/{barriers}" for family in FAMILIES for barriers in (1, 2)] + ["auto/1", "auto/2", "split/2", "reordered/2"]
# Odd-sized shards: 61 rows over 2 or 4 ranks leave a remainder for the last shard.
VOCAB = 61
MEMORY = {"forward": 1, "backward_input": -0.5, "backward_weight": -0.5}


def layer_split_schedule(p: int, barriers: int) -> Schedule:
    """What `pipesched solve layers.json --vocab-parallel` writes for a layers file of the
    example model: blocks of uneven cost split with the schedule, the head sharded."""
    costs = {"embedding": 0.2, "head": 3.0}
    kinds = ["embedding"] + ["block"] * (2 * p) + ["head"]
    layers = []
    for i, kind in enumerate(kinds):
        cost = costs.get(kind, 3.0 if i == 1 else 1.0)  # a heavy first block: the even split is not the best
        layers.append({"name": f"l{i}", "kind": kind, "forward": cost, "backward_input": cost, "backward_weight": cost, "memory": MEMORY})
    profile = LayersProfile.model_validate({"format": "pipesched.layers", "version": 1, "layers": layers})
    options = SolveOptions(time_limit=2, threads=1)
    result = choose_vocab_split(
        profile, Placement.named("linear", p), 2 * p, None, options, lambda problem, o: solve(problem, "auto", o), (barriers,)
    )
    schedule = result.chosen.schedule
    assert schedule is not None
    assert blocks_per_stage(schedule.problem) != [2] * p  # the search moved blocks off the heavy one's stage
    return schedule


def schedule_of(case: str, p: int) -> Schedule:
    name, barriers = case.split("/")
    if name == "split":
        return layer_split_schedule(p, int(barriers))
    if name == "reordered":  # microbatch 1's passes fed before 0's: collectives issued late, in order
        return hand_made(p, int(barriers), [("S", 1), ("S", 0), ("T", 1), ("T", 0)])
    placement = FAMILIES.get(name, "linear")
    problem = with_vocab(uniform_problem(p, 2 * p, placement=placement), int(barriers))
    if name == "auto":
        return solve(problem, "auto", SolveOptions(time_limit=5, threads=1))
    return generate(problem, name)


def model_for(schedule: Schedule) -> str:
    if any(stage.layers for stage in schedule.problem.stages):
        return f"example:hidden=32,heads=2,vocab={VOCAB},seq_len=16,batch_size=2"  # the split comes from the schedule
    return tiny_model(schedule.problem.num_stages).replace("vocab=64", f"vocab={VOCAB}")


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def vocab_runs(request):
    p = request.param
    schedules = {case: schedule_of(case, p) for case in CASES}
    pairing = {case: pairing_deadlock(build_plans(schedule, p)) for case, schedule in schedules.items()}
    jobs = tuple(RunJob(s.to_json(), case, model_for(s), steps=1, check=True, timeout_s=60) for case, s in schedules.items())
    # Three training steps with and without the passes: the optimizer updates the shards too.
    plain = generate(uniform_problem(p, 2 * p), "1f1b")
    trained = tuple(
        RunJob(s.to_json(), f"trained {name}", model_for(s), steps=3)
        for name, s in (("plain", plain), ("vocab", schedules["1f1b-vocab/2"]))
    )
    return p, schedules, pairing, launch(Batch(jobs + trained), p, threads=1)


@pytest.mark.parametrize("case", CASES)
def test_vocab_schedule_matches_single_process(vocab_runs, case):
    p, schedules, pairing, results = vocab_runs
    assert schedules[case].problem.vocab_parallel is not None
    m = schedules[case].problem.num_microbatches
    assert sum(op.kind in ("S", "T") for ops in schedules[case].devices for op in ops) == 2 * p * m  # S and T per device and mb
    assert pairing[case] is None, pairing[case]
    summary = results[case]
    check = summary["check"]
    assert check["passed"], check.get("first_mismatch")
    assert check["max_relative_error"] < 1e-5  # the same float32 reorderings as without the passes (runtime/check.py)
    # Every stage parameter but the full embedding and output layer, and per rank their rows.
    full = load_model(model_for(schedules[case]), schedules[case].problem.num_stages, schedules[case].problem)
    assert check["parameters"] == sum(len(list(stage.parameters())) for stage in full.stages) - 2 + 2 * p
    assert summary["devices"] == p


def test_training_steps_match_the_plain_schedule(vocab_runs):
    _, _, _, results = vocab_runs
    plain, vocab = results["trained plain"]["losses"], results["trained vocab"]["losses"]
    assert len(vocab) == 3 and len(set(vocab)) == 3  # three different batches
    # Gradients agree to ~1e-6 relative (runtime/check.py); AdamW's steps of 1e-3 keep the
    # losses within float32 rounding of each other, far below 1e-5 relative.
    assert vocab == pytest.approx(plain, rel=1e-5)

"""The executor's transfer order pairs up on order-matching backends (NCCL) for every
schedule it runs, and the check catches an order that would hang there."""

from __future__ import annotations

import dataclasses

import pytest
from factories import placed_problem, unusual_placements

from optimizer.problem import uniform_problem
from optimizer.schedules import GENERATORS, generate
from runtime.pairing import pairing_deadlock
from runtime.plan import build_plans


def cases():
    found = []
    for placement in ("linear", "interleaved:2", "vshape"):
        for p, m in ((2, 4), (4, 8), (8, 16)):
            problem = uniform_problem(p, m, placement=placement, comm_time=0.1)
            found += [(name, placement, p, m) for name, g in GENERATORS.items() if g.unsupported(problem) is None]
    return found


@pytest.mark.parametrize("family,placement,p,m", cases())
def test_every_family_pairs_up_in_order(family, placement, p, m):
    schedule = generate(uniform_problem(p, m, placement=placement, comm_time=0.1), family)
    assert pairing_deadlock(build_plans(schedule, p)) is None


@pytest.mark.parametrize("placement", ["blocked", "reversed"])
def test_unusual_placements_pair_up(placement):
    problem = placed_problem(4, 8, unusual_placements(4)[placement])
    assert pairing_deadlock(build_plans(generate(problem, "greedy"), 4)) is None


def test_a_transfer_queued_behind_one_the_peer_has_not_reached_is_caught():
    plans = build_plans(generate(uniform_problem(2, 2), "1f1b"), 2)
    messages = plans[0].peer_messages[1]
    # rank 1's gradient for microbatch 0 first: rank 1 can send it only after receiving
    # microbatch 0's activation, which now sits behind it in the one shared order
    gradient = next(m for m in messages if m.src == 1 and m.microbatch == 0)
    swapped = (gradient, *(m for m in messages if m != gradient))
    bad = [dataclasses.replace(plan, peer_messages={peer: swapped for peer in plan.peer_messages}) for plan in plans]
    found = pairing_deadlock(bad)
    assert found is not None
    assert "rank 1 at F(stage 1, mb 0) waits for activation for stage 1 mb 0" in found


def test_batched_groups_couple_receives_and_hang_interleaved_placements():
    """The executor's NCCL path issues the messages it can issue with one peer at one
    moment as one group, and a wait covers the whole group. On interleaved placements the
    step-start group of rank 1 holds both stage 1's and stage 5's activations from rank 0;
    stage 5's needs a full round of the pipeline, so every rank waits at its first F (the
    same hang gloo shows when it runs that path). Issued one by one, in the same order,
    the messages pair up."""
    plans = build_plans(generate(uniform_problem(4, 8, placement="interleaved:2"), "interleaved-1f1b"), 4)
    assert pairing_deadlock(plans) is None
    found = pairing_deadlock(plans, batched=True)
    assert found is not None and "rank 1 at F(stage 1, mb 0) waits for activation for stage 1 mb 0" in found
    # linear and V placements have no such cross-round group
    for placement, family in (("linear", "zb-h1"), ("vshape", "zb-v")):
        plans = build_plans(generate(uniform_problem(4, 8, placement=placement), family), 4)
        assert pairing_deadlock(plans, batched=True) is None

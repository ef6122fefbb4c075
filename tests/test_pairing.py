"""The executor's transfer order pairs up on order-matching backends (NCCL) for every
schedule it runs, and the check catches an order that would hang there."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from factories import placed_problem, unusual_placements

from optimizer.problem import uniform_problem
from optimizer.schedules import GENERATORS, generate
from runtime import comm
from runtime.issue import op_transfers
from runtime.pairing import pairing_deadlock
from runtime.plan import build_plans


def cases():
    found = []
    for placement in ("linear", "interleaved:2", "vshape"):
        for p, m in ((2, 4), (4, 8), (8, 16)):
            problem = uniform_problem(p, m, placement=placement, comm_time=0.1)
            found += [(name, placement, p, m) for name, g in GENERATORS.items() if g.unsupported(problem) is None]
    return found


@pytest.mark.slow
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


def test_two_sides_that_disagree_on_the_order_are_caught():
    plans = build_plans(generate(uniform_problem(2, 2), "1f1b"), 2)
    messages = plans[0].peer_messages[1]
    first, second = (m for m in messages if m.src == 0)  # the two activations, mb 0 then mb 1
    swapped = tuple(second if m == first else first if m == second else m for m in messages)
    bad = [dataclasses.replace(plans[0], peer_messages={1: swapped}), plans[1]]  # rank 1 keeps the agreed order
    assert pairing_deadlock(bad) == "ranks 0 and 1 pair activation for stage 1 mb 1 with activation for stage 1 mb 0"


class _Work:
    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


def test_the_executor_issues_one_transfer_per_message_in_the_checked_order(monkeypatch):
    """runtime/comm.py, driven op by op as the executor drives it, issues every message
    with each peer as its own isend/irecv, in the plan's order: the order the check
    replays. Grouping (batch_isend_irecv) would make a wait cover several transfers."""
    plans = build_plans(generate(uniform_problem(4, 8, placement="interleaved:2"), "interleaved-1f1b"), 4)
    assert pairing_deadlock(plans) is None
    issued: list[tuple[str, int, int]] = []

    def recording(kind):
        def call(tensor, peer, tag):
            issued.append((kind, peer, tag))
            return _Work()

        return call

    def grouped(ops):
        raise AssertionError("transfers must not be grouped")

    monkeypatch.setattr(comm.dist, "isend", recording("send"))
    monkeypatch.setattr(comm.dist, "irecv", recording("recv"))
    monkeypatch.setattr(comm.dist, "batch_isend_irecv", grouped)
    plan = plans[1]  # two peers, interleaved: receives from both sides
    p2p = comm.P2P(plan, [comm.TensorSpec((2,), torch.float32)] * plan.num_stages, torch.device("cpu"), timeout_s=1.0)
    p2p.start_step()
    for op, transfers in zip(plan.ops, op_transfers(plan), strict=True):
        if transfers.receive is not None:
            p2p.take(transfers.receive, op)
        for send in transfers.sends:
            p2p.send(send, torch.zeros(2))
    p2p.finish_step()
    for peer, messages in plan.peer_messages.items():
        expected = [("recv" if m.dst == plan.rank else "send", peer, m.tag) for m in messages]
        assert [call for call in issued if call[1] == peer] == expected


@pytest.mark.parametrize("placement,family", [("linear", "1f1b"), ("interleaved:2", "interleaved-1f1b"), ("vshape", "zb-v")])
def test_a_reversed_order_is_caught_on_every_placement(placement, family):
    plans = build_plans(generate(uniform_problem(4, 8, placement=placement), family), 4)
    # the last gradient first: it needs every earlier transfer of the step
    bad = [dataclasses.replace(plan, peer_messages={peer: msgs[::-1] for peer, msgs in plan.peer_messages.items()}) for plan in plans]
    found = pairing_deadlock(bad)
    assert found is not None and "waits for activation for stage" in found


def test_a_transfer_that_fails_as_it_is_issued_names_the_rank_the_transfer_and_the_peer(monkeypatch):
    """On gloo a send goes out when issued: a dead peer's closed connection is raised by
    `isend` itself. It is said as the transfer's failure (it was reported as the model's)."""
    plan = build_plans(generate(uniform_problem(2, 2), "1f1b"), 2)[0]

    def closed(tensor, peer, tag):
        raise RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:5")

    monkeypatch.setattr(comm.dist, "isend", closed)
    monkeypatch.setattr(comm.dist, "irecv", lambda tensor, peer, tag: _Work())
    p2p = comm.P2P(plan, [comm.TensorSpec((2,), torch.float32)] * plan.num_stages, torch.device("cpu"), timeout_s=1.0)
    p2p.start_step()
    send = next(s for transfers in op_transfers(plan) for s in transfers.sends)
    with pytest.raises(comm.CommError) as raised:
        p2p.send(send, torch.zeros(2))
    assert str(raised.value) == (
        f"rank 0 sending: {send.describe()} to rank 1: the transfer failed (Connection closed by peer [127.0.0.1]:5)"
    )

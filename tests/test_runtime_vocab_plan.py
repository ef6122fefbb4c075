"""Vocabulary passes without starting ranks: the plan's messages, the collectives' order,
the example model without its vocabulary layers, what `run` refuses, and how a failed
collective is reported."""

from __future__ import annotations

import json
from typing import cast

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from typer.testing import CliRunner

from optimizer.errors import InputError
from optimizer.ops import Op
from optimizer.problem import Problem, uniform_problem
from optimizer.schedule import Schedule
from optimizer.schedules import generate
from optimizer.simulate import simulate_times
from runtime.cli import app
from runtime.collectives import CollectiveOrder
from runtime.issue import op_transfers
from runtime.models import GPTConfig, build_example
from runtime.plan import HIDDEN, build_plans
from runtime.vocab import VocabShard
from runtime.vocab_runner import CollectiveError, VocabRunner

pytestmark = pytest.mark.runtime


def with_vocab(base: Problem, barriers: int) -> Problem:
    """`base` with vocabulary passes (S and T half a stage's forward, a collective 0.1)."""
    data = {**base.to_json(), "vocab_parallel": {"barriers": barriers, "forward": 0.5, "backward": 0.5, "barrier_time": 0.1}}
    return Problem.model_validate(data)


def vocab_problem(p: int, m: int, barriers: int) -> Problem:
    return with_vocab(uniform_problem(p, m), barriers)


def hand_made(p: int, barriers: int, passes: list[tuple[str, int]]) -> Schedule:
    """Two microbatches on a linear pipeline; each rank runs F, F, then the vocabulary
    passes `passes` ((kind, microbatch) in order), then B, W of each microbatch."""
    problem = vocab_problem(p, 2, barriers)
    orders = [
        [Op("F", d, 0), Op("F", d, 1)] + [Op(kind, d, j) for kind, j in passes] + [Op(k, d, j) for j in (0, 1) for k in ("B", "W")]
        for d in range(p)
    ]
    return Schedule(problem, "hand-made", simulate_times(problem, orders))


def test_the_last_stage_output_goes_to_every_rank():
    p, m = 4, 8
    plans = build_plans(generate(vocab_problem(p, m, 2), "1f1b-vocab"), p)
    last_device = 3
    for plan in plans:
        hidden = [msg for msgs in plan.peer_messages.values() for msg in msgs if msg.kind == HIDDEN]
        assert len(hidden) == ((p - 1) * m if plan.rank == last_device else m)  # sent to each other rank, or received
        for op, transfers in zip(plan.ops, op_transfers(plan)):
            if op.kind == "S":  # the last rank hands its own over in memory
                assert (transfers.receive is None) == (plan.rank == last_device)
            if op.kind == "F" and op.stage == p - 1:
                assert sorted(send.dst for send in transfers.sends) == [0, 1, 2]


def test_collectives_go_in_microbatch_order_per_stream():
    order = CollectiveOrder(2, 3)
    assert order.fed("statistics", 1) == []  # waits for microbatch 0
    assert order.fed("input gradient", 0) == [0]  # another stream: its own order
    assert order.fed("statistics", 0) == [0, 1]
    assert order.fed("statistics", 2) == [2]
    assert not order.finished()
    assert order.fed("input gradient", 2) == [] and order.fed("input gradient", 1) == [1, 2]
    assert order.finished()


@pytest.mark.parametrize("barriers", [1, 2])
def test_feeding_out_of_order_is_fine_without_a_wait_in_between(barriers):
    schedule = hand_made(2, barriers, [("S", 1), ("S", 0), ("T", 1), ("T", 0)])
    assert len(build_plans(schedule, 2)) == 2


@pytest.mark.parametrize("barriers", [1, 2])
def test_a_wait_before_the_earlier_microbatch_is_fed_is_refused(barriers):
    schedule = hand_made(2, barriers, [("S", 1), ("T", 1), ("S", 0), ("T", 0)])
    with pytest.raises(InputError) as raised:
        build_plans(schedule, 2, "hand.json")
    message = str(raised.value)
    assert message.startswith("hand.json: its vocabulary collectives cannot run in microbatch order on every rank:")
    assert "rank 0 at T(shard 0, mb 1) waits for the statistics collective of mb 1" in message
    assert "\n" not in message


def test_the_example_without_vocabulary_layers_computes_the_same_logits():
    config = GPTConfig(layers=2, hidden=16, heads=2, vocab=37, seq_len=8)
    model = build_example(config, 2)
    assert model.vocabulary is not None
    offered = model.vocabulary()
    tokens, _ = model.make_batch(0, 2)
    with torch.no_grad():
        expected = model.stages[1](model.stages[0](tokens))
        h = offered.stages[1](offered.stages[0](F.embedding(tokens, offered.embedding)))
    # The same float32 ops on the same weights; only the output GEMM's blocking may differ (logits are O(1)).
    assert torch.allclose(h @ offered.head.T, expected, rtol=0, atol=1e-6)
    names = {name for stage in offered.stages for name, _ in stage.named_parameters()}
    assert offered.embedding_name not in names and offered.head_name not in names  # no longer in the stages
    assert offered.embedding_name in dict(model.stages[0].named_parameters())
    assert offered.head_name in dict(model.stages[1].named_parameters())


@pytest.mark.parametrize(
    "extra,expected",
    [
        (
            ["--engine", "torch"],
            "--engine torch: {path} has vocabulary passes (S, T), which torch's actions cannot name; use --engine pipesched",
        ),
        (
            ["--model", "synthetic"],
            "model: synthetic offers no vocabulary-sharded output layer (PipelineModel.vocabulary), which {path} needs",
        ),
    ],
)
def test_run_refuses_what_cannot_run_vocabulary_passes(tmp_path, extra, expected):
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps(generate(vocab_problem(2, 4, 2), "1f1b-vocab").to_json()))
    args = ["run", str(path), "--model", "example", *extra] if "--model" not in extra else ["run", str(path), *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == "error: " + expected.format(path=path)


def test_run_refuses_collectives_out_of_order_in_one_line(tmp_path):
    path = tmp_path / "hand.json"
    path.write_text(json.dumps(hand_made(2, 2, [("S", 1), ("T", 1), ("S", 0), ("T", 0)]).to_json()))
    result = CliRunner().invoke(app, ["run", str(path), "--model", "example"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {path}: its vocabulary collectives cannot run in microbatch order")
    assert result.stderr.count("\n") == 1


class _FailingWork:
    def __init__(self, text: str):
        self.text = text

    def wait(self, timeout=None):
        raise RuntimeError(self.text)


@pytest.mark.parametrize(
    "text,reason",
    [
        ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 2000ms for recv", "no collective within 2 s"),
        (
            "[../gloo/pair.cc:589] Connection closed by peer [127.0.0.1]:5",
            "the collective failed (Connection closed by peer [127.0.0.1]:5)",
        ),
    ],
)
def test_a_failed_collective_names_the_rank_op_stream_and_microbatch(text, reason):
    plan = build_plans(generate(vocab_problem(2, 2, 2), "1f1b-vocab"), 2)[0]
    shard = VocabShard(torch.zeros(8, 4), torch.zeros(8, 4), (0, 4))
    runner = VocabRunner(shard, plan, {}, timeout_s=2.0)
    runner._works[("statistics", 1)] = (cast(dist.Work, _FailingWork(text)), [])
    with pytest.raises(CollectiveError) as raised:
        runner.wait("statistics", 1, "at T(shard 0, mb 1)")
    assert str(raised.value) == f"rank 0 at T(shard 0, mb 1): the statistics collective of mb 1: {reason}"

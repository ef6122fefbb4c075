"""Vocabulary parallelism from a layers file: the sharded head's passes, the trunk's split, the search, the CLI."""

from __future__ import annotations

import json
import random

import pytest
from test_balance import random_layers
from typer.testing import CliRunner

from optimizer.balance import choose_split, choose_vocab_split
from optimizer.cli import app
from optimizer.errors import InputError
from optimizer.exact import SolveOptions, solve
from optimizer.layers import layers_from_json
from optimizer.split import Placement, SplitInfeasible, even_split, fixed_memory, memory_need, split_problem
from optimizer.validate import validate
from optimizer.vocab_layers import shard_vocabulary

pytestmark = [pytest.mark.solver]


def _auto(problem, options):
    return solve(problem, "auto", options)


def heavy_head_layers(blocks: int, head: float = 4.0) -> dict:
    """Uniform blocks (F = B = W = 1) and a head `head` times a block, the embedding light."""

    def layer(name: str, kind: str, cost: float, parameters: float) -> dict:
        return {
            "name": name,
            "kind": kind,
            "forward": cost,
            "backward_input": cost,
            "backward_weight": cost,
            "memory": {"forward": cost, "backward_input": -0.5 * cost, "backward_weight": -0.5 * cost},
            "parameters": parameters,
        }

    layers = [layer("embedding", "embedding", 0.05, 4.0)]
    layers += [layer(f"block{i}", "block", 1.0, 1.0) for i in range(blocks)]
    layers.append(layer("head", "head", head, 4.0))
    return {"format": "pipesched.layers", "version": 1, "layers": layers, "comm_time": 0.1}


@pytest.mark.parametrize("barriers", [1, 2])
def test_passes_are_the_heads_work_divided_over_the_devices(barriers):
    profile = layers_from_json(random_layers(random.Random(barriers), 6))
    head, embedding = profile.layers[-1], profile.layers[0]
    p = 3
    trunk, vocab = shard_vocabulary(profile, p, barriers)
    assert [layer.kind for layer in trunk.layers] == ["block"] * 6
    passes = vocab.passes
    assert passes.barriers == barriers
    # S and T share the head's F + B + W (hand arithmetic of the module doc).
    assert passes.forward + passes.backward == pytest.approx((head.forward + head.backward_input + head.backward_weight) / p, rel=1e-12)
    if barriers == 1:
        assert passes.forward == pytest.approx((head.forward + head.backward_input) / p, rel=1e-12)
    else:
        assert passes.forward == pytest.approx(head.forward / p, rel=1e-12)
    assert passes.memory == pytest.approx(head.memory.forward / p, rel=1e-12)
    assert passes.barrier_time == profile.comm_time
    assert vocab.held_per_device == pytest.approx((head.parameters + embedding.parameters) / p, rel=1e-12)


def test_a_cheaper_fused_head_backward_is_the_two_barrier_t():
    data = heavy_head_layers(4)
    data["layers"][-1]["backward"] = 6.0  # B + W = 8 split, 6 fused
    _, vocab = shard_vocabulary(layers_from_json(data), 2, 2)
    assert vocab.passes.backward == pytest.approx(3.0)


def test_sharding_refuses_what_it_cannot_shard():
    no_head = random_layers(random.Random(0), 3)
    no_head["layers"] = no_head["layers"][:-1]
    with pytest.raises(InputError, match="no head layer"):
        shard_vocabulary(layers_from_json(no_head), 2, 2)
    with pytest.raises(InputError, match="--vocab-barriers"):
        shard_vocabulary(layers_from_json(random_layers(random.Random(0), 3)), 2, 3)


def test_split_problem_with_vocab_has_the_passes_and_the_shards_memory():
    profile = layers_from_json(heavy_head_layers(6))
    trunk, vocab = shard_vocabulary(profile, 3, 2)
    placement = Placement.named("linear", 3)
    split = even_split(trunk, 3)
    assert split == (2, 2, 2)
    held = fixed_memory(trunk, placement, split, vocab)
    assert held == pytest.approx([2.0 + 8.0 / 3] * 3)  # two blocks and a third of embedding and head, on every device
    need = memory_need(trunk, placement, split, vocab)
    problem = split_problem(trunk, placement, split, 6, max(need), vocab)
    assert problem.vocab_parallel == vocab.passes
    assert [stage.forward for stage in problem.stages] == [2.0, 2.0, 2.0]
    assert list(problem.tables().limit) == pytest.approx([max(need) - h for h in held])
    with pytest.raises(SplitInfeasible):
        split_problem(trunk, placement, split, 6, max(need) * 0.99, vocab)


@pytest.mark.slow
@pytest.mark.parametrize("placement_name", ["linear", "vshape"])
def test_vocab_parallel_beats_the_naive_head_and_balances_memory(placement_name):
    """A head 4 blocks heavy: sharding it is shorter than any split with the head on the last
    stage, and every schedule validates and fits the limit."""
    profile = layers_from_json(heavy_head_layers(8))
    placement = Placement.named(placement_name, 4)
    limit = 40.0
    options = SolveOptions(time_limit=4, threads=1)
    naive = choose_split(profile, placement, 8, limit, options, _auto)
    vocab = choose_vocab_split(profile, placement, 8, limit, options, _auto, (1, 2))
    chosen = vocab.chosen
    assert chosen.schedule is not None and chosen.problem is not None and vocab.vocab is not None
    assert chosen.problem.vocab_parallel == vocab.vocab.passes
    assert validate(chosen.problem, chosen.schedule.devices) == []
    assert chosen.schedule.fits_memory()
    assert chosen.value("makespan") < naive.chosen.value("makespan") * 0.95
    # Busy time per device: the blocks split evenly and 1/p of the head's work on each.
    busy = [sum(op.end - op.start for op in ops) for ops in chosen.schedule.devices]
    assert max(busy) == pytest.approx(min(busy), rel=1e-9)


def test_no_barrier_count_fits_names_the_least_limit():
    profile = layers_from_json(heavy_head_layers(4))
    placement = Placement.named("linear", 2)
    with pytest.raises(SplitInfeasible) as error:
        choose_vocab_split(profile, placement, 4, 1.0, SolveOptions(time_limit=2, threads=1), _auto, (1, 2))
    need = error.value.need
    # Uniform blocks: the even split needs least, with either barrier count's passes.

    def even_need(barriers: int) -> float:
        trunk, vocab = shard_vocabulary(profile, 2, barriers)
        return max(memory_need(trunk, placement, (2, 2), vocab))

    least = min(even_need(1), even_need(2))
    assert need == pytest.approx(least, rel=1e-12) and "raise the limit" in str(error.value)
    result = choose_vocab_split(profile, placement, 4, need, SolveOptions(time_limit=2, threads=1), _auto, (1, 2))
    assert result.chosen.schedule is not None and result.chosen.schedule.fits_memory()


@pytest.mark.slow
def test_cli_solves_a_layers_file_with_vocab_parallel(tmp_path):
    runner = CliRunner()
    layers_file, schedule_file = tmp_path / "layers.json", tmp_path / "s.json"
    layers_file.write_text(json.dumps(heavy_head_layers(4)))
    args = ["solve", str(layers_file), "-p", "2", "-m", "4", "--time-limit", "2", "-q", "--threads", "1", "-o", str(schedule_file)]
    result = runner.invoke(app, [*args, "--vocab-parallel", "--vocab-barriers", "1", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["vocab_parallel"]["barriers"] == 1
    saved = json.loads(schedule_file.read_text())
    assert saved["problem"]["vocab_parallel"]["barriers"] == 1
    assert sum(op["kind"] == "S" for ops in saved["devices"] for op in ops) == 2 * 4
    result = runner.invoke(app, [*args, "--vocab-parallel"])
    assert result.exit_code == 0, result.output
    assert "vocabulary parallelism: embedding and head sharded over 2 devices" in result.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--vocab-barriers", "3", "--vocab-parallel"], "--vocab-barriers: '3' is not 1, 2 or best"),
        (["--vocab-barriers", "1"], "--vocab-barriers: only with --vocab-parallel"),
    ],
)
def test_cli_refuses_bad_vocab_options(tmp_path, extra, message):
    layers_file = tmp_path / "layers.json"
    layers_file.write_text(json.dumps(heavy_head_layers(4)))
    result = CliRunner().invoke(app, ["solve", str(layers_file), "-p", "2", "-m", "4", "-o", str(tmp_path / "s.json"), *extra])
    assert result.exit_code == 2 and message in result.output, result.output


def test_cli_refuses_vocab_parallel_without_a_head_or_on_a_problem(tmp_path):
    no_head = heavy_head_layers(4)
    no_head["layers"] = no_head["layers"][:-1]
    layers_file, problem_file = tmp_path / "layers.json", tmp_path / "problem.json"
    layers_file.write_text(json.dumps(no_head))
    out = str(tmp_path / "s.json")
    result = CliRunner().invoke(app, ["solve", str(layers_file), "-p", "2", "-m", "4", "-o", out, "--vocab-parallel"])
    assert result.exit_code == 2 and "no head layer" in result.output, result.output
    assert CliRunner().invoke(app, ["problem", "-p", "2", "-m", "4", "-o", str(problem_file)]).exit_code == 0
    result = CliRunner().invoke(app, ["solve", str(problem_file), "-o", out, "--vocab-parallel"])
    assert result.exit_code == 2 and "--vocab-parallel: only for a layers file" in result.output, result.output


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "message"), [("megatron-layout", "cannot express"), ("torchtitan-modules", "do not")])
def test_split_exports_refuse_a_vocab_parallel_schedule(tmp_path, fmt, message):
    layers_file, schedule_file = tmp_path / "layers.json", tmp_path / "s.json"
    layers_file.write_text(json.dumps(heavy_head_layers(4)))
    runner = CliRunner()
    args = ["solve", str(layers_file), "-p", "2", "-m", "2", "--time-limit", "1", "-q", "--threads", "1", "--vocab-parallel"]
    assert runner.invoke(app, [*args, "-o", str(schedule_file)]).exit_code == 0
    result = runner.invoke(app, ["export", str(schedule_file), "--format", fmt, "-o", str(tmp_path / "out.txt")])
    assert result.exit_code == 2 and message in result.output, result.output
    result = runner.invoke(app, ["export", str(schedule_file), "--format", "example-split", "-o", str(tmp_path / "x.split.txt")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "x.split.txt").read_text() == "split=2/2\n"


def test_cli_counts_only_blocks_for_the_stages_under_vocab_parallel(tmp_path):
    layers_file = tmp_path / "layers.json"
    layers_file.write_text(json.dumps(heavy_head_layers(4)))  # 6 layers, 4 of them blocks
    args = ["solve", str(layers_file), "-p", "3", "-m", "4", "--placement", "vshape", "-o", str(tmp_path / "s.json"), "--vocab-parallel"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "4 blocks (embedding and head sharded) cannot fill the 6 stages" in result.output, result.output

"""Layer splits chosen with the schedule: the layers format, splits, the search, Megatron's layout."""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from optimizer import balance
from optimizer.balance import candidate_splits, choose_split
from optimizer.cli import app
from optimizer.errors import InputError
from optimizer.exact import SolveOptions, solve
from optimizer.formats.megatron_layout import expand_layout, layout_for, parse_layout
from optimizer.formats.schedule_json import load_schedule
from optimizer.layer_costs import DecoderSizes, decoder_layers
from optimizer.layers import FORMAT, VERSION, layers_from_json, load_layers
from optimizer.problem import problem_from_json
from optimizer.split import (
    Placement,
    SplitInfeasible,
    bottleneck_split,
    even_split,
    fewer_at_ends_split,
    fixed_memory,
    layer_memory,
    least_memory_split,
    memory_need,
    neighbours,
    split_problem,
)
from optimizer.validate import validate

pytestmark = [pytest.mark.solver]

DATA = Path(__file__).parent / "data"


def random_layers(rng: random.Random, blocks: int, *, ends: bool = True) -> dict:
    """A layers file: random positive costs, memory deltas summing to zero, fixed memory."""

    def layer(name: str, kind: str) -> dict:
        forward = rng.uniform(0.5, 3.0)
        activation = rng.uniform(0.1, 1.0)
        kept = activation * rng.uniform(0.0, 0.6)
        return {
            "name": name,
            "kind": kind,
            "forward": forward,
            "backward_input": forward * rng.uniform(0.8, 1.3),
            "backward_weight": forward * rng.uniform(0.5, 1.1),
            "memory": {"forward": activation, "backward_input": kept - activation, "backward_weight": -kept},
            "parameters": rng.uniform(0.0, 2.0),
        }

    layers = [layer(f"block{i}", "block") for i in range(blocks)]
    if ends:
        layers = [layer("embedding", "embedding"), *layers, layer("head", "head")]
    return {"format": FORMAT, "version": VERSION, "layers": layers, "comm_time": rng.uniform(0.0, 0.3)}


def test_layers_file_refuses_bad_values_naming_the_field():
    data = random_layers(random.Random(0), 4)
    bad = json.loads(json.dumps(data))
    bad["layers"][2]["forward"] = -1.0
    with pytest.raises(InputError, match=r"layers\.2\.forward"):
        layers_from_json(bad, "l.json")
    bad = json.loads(json.dumps(data))
    bad["layers"][0], bad["layers"][1] = bad["layers"][1], bad["layers"][0]
    with pytest.raises(InputError, match="embedding layer must come first"):
        layers_from_json(bad, "l.json")
    bad = json.loads(json.dumps(data))
    bad["layers"][1]["memory"]["backward_weight"] += 0.5
    with pytest.raises(InputError, match="sum to 0"):
        layers_from_json(bad, "l.json")


def _move_layer(data: dict, source: tuple[int, int], target: tuple[int, int]) -> None:
    layer = data["stages"][source[0]]["layers"].pop(source[1])
    data["stages"][target[0]]["layers"].insert(target[1], layer)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        # The head moved to the first stage, the embedding into the middle: exports wrote them so.
        (lambda d: _move_layer(d, (2, -1), (0, 1)), "stages.0.layers.1.kind: one head at most, the last layer"),
        (lambda d: _move_layer(d, (0, 0), (1, 1)), "stages.1.layers.1.kind: one embedding at most, the first layer"),
        (lambda d: d["stages"][1]["layers"][0].update(name=d["stages"][0]["layers"][1]["name"]), "is held by stage 0 too"),
        (lambda d: d["stages"][1]["layers"][0].update(kind="embedding"), "one embedding at most"),
        (lambda d: d["stages"][1].pop("layers"), "stages.1.layers: missing, where other stages list theirs"),
    ],
)
def test_a_problems_stage_layers_follow_the_layers_file_rules(mutate, expected):
    profile = layers_from_json(random_layers(random.Random(1), 6))
    data = split_problem(profile, Placement.named("linear", 3), (3, 2, 3), 4).model_dump(mode="json", exclude_none=True)
    problem_from_json(data)  # as split, it passes
    mutate(data)
    with pytest.raises(InputError, match=re.escape(expected)):
        problem_from_json(data, "p.json")


def test_split_problem_sums_layers_and_leaves_the_limit_after_fixed_memory():
    profile = layers_from_json(random_layers(random.Random(1), 6))
    placement = Placement.named("linear", 3)
    split = (3, 2, 3)
    problem = split_problem(profile, placement, split, 4)
    tables = problem.tables()
    first = 0
    for s, count in enumerate(split):
        layers = profile.layers[first : first + count]
        assert tables.forward[s] == pytest.approx(sum(layer.forward for layer in layers), rel=1e-12)
        assert tables.mem_backward_input[s] == pytest.approx(sum(layer.memory.backward_input for layer in layers), rel=1e-12)
        assert [layer.name for layer in problem.stages[s].layers or []] == [layer.name for layer in layers]
        first += count
    need = memory_need(profile, placement, split)
    limit = max(need)
    limited = split_problem(profile, placement, split, 4, limit)
    assert list(limited.tables().limit) == pytest.approx([limit - held for held in fixed_memory(profile, placement, split)], rel=1e-12)
    with pytest.raises(SplitInfeasible) as error:
        split_problem(profile, placement, split, 4, limit * 0.99)
    assert error.value.need == pytest.approx(limit, rel=1e-12)


def _every_cut_dp(work: list[float], num_stages: int) -> tuple[int, ...]:
    """The linear partition DP trying every last cut, first minimum kept: the reference."""
    n = len(work)
    prefix = [0.0, *itertools.accumulate(work)]
    best = [[float("inf")] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, n - (num_stages - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    counts, i = [], n
    for k in range(num_stages, 0, -1):
        counts.append(i - cut[k][i])
        i = cut[k][i]
    return tuple(reversed(counts))


@pytest.mark.parametrize("seed", range(40))
def test_bottleneck_split_is_the_every_cut_dps_split(seed):
    # Ties included: integer works, zero-work layers, equal layers.
    rng = random.Random(seed)
    n = rng.randint(1, 60)
    stages = rng.randint(1, n)
    kind = seed % 3
    work = [float(rng.randint(0, 3)) if kind == 0 else 1.0 if kind == 1 else rng.uniform(0.0, 5.0) for _ in range(n)]
    assert bottleneck_split(work, stages) == _every_cut_dp(work, stages)


@pytest.mark.parametrize("seed", range(12))
def test_bottleneck_split_is_the_least_bottleneck_of_all_splits(seed):
    rng = random.Random(seed)
    n, stages = rng.randint(3, 9), rng.randint(2, 4)
    stages = min(stages, n)
    work = [rng.uniform(0.1, 5.0) for _ in range(n)]
    split = bottleneck_split(work, stages)
    assert sum(split) == n and len(split) == stages and min(split) >= 1

    def bottleneck(counts) -> float:
        bounds = [0, *itertools.accumulate(counts)]
        return max(sum(work[bounds[k] : bounds[k + 1]]) for k in range(len(counts)))

    # Every composition of n into `stages` positive parts, by its cut positions.
    best = min(bottleneck([b - a for a, b in zip((0, *cuts), (*cuts, n))]) for cuts in itertools.combinations(range(1, n), stages - 1))
    assert bottleneck(split) == pytest.approx(best, rel=1e-12)


def test_hand_rules_and_even_split_place_every_layer():
    profile = decoder_layers(DecoderSizes(blocks=32, vocab=128_000))
    assert even_split(profile, 8) == (5, 4, 4, 4, 4, 4, 4, 5)
    assert fewer_at_ends_split(profile, 8, 1, 1) == (4, 4, 4, 5, 5, 4, 4, 4)  # 3 blocks at each end, 5 in two middle stages
    for split in candidate_splits(profile, Placement.named("linear", 8)).values():
        assert sum(split) == profile.num_layers and min(split) >= 1
    assert set(neighbours((2, 1, 3))) == {(1, 2, 3), (2, 2, 2)}  # (3, 0, 3) and (2, 0, 4) leave a stage empty


def _auto(problem, options):
    return solve(problem, "auto", options)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_chosen_split_is_never_worse_than_the_even_split_or_a_hand_rule(seed):
    rng = random.Random(seed)
    profile = layers_from_json(random_layers(rng, rng.randint(4, 8)))
    placement = Placement.named("linear", 3)
    limit = None
    if seed % 2:
        # A limit that the even split meets with room for about two microbatches.
        limit = max(memory_need(profile, placement, even_split(profile, 3))) * 1.3
    result = choose_split(profile, placement, 6, limit, SolveOptions(time_limit=3), _auto)
    chosen = result.chosen
    assert chosen.schedule is not None and chosen.problem is not None
    assert validate(chosen.problem, chosen.schedule.devices) == []
    assert chosen.schedule.fits_memory()
    named = [t for t in result.trials if not t.name.startswith("search")]
    assert named[0].name == "even" and named[0].schedule is not None  # the baseline is always scored
    for trial in named:
        if trial.schedule is not None:
            assert chosen.value("makespan") <= trial.value("makespan") * (1 + 1e-9), trial.name


def test_no_split_fits_says_the_least_limit_and_that_limit_works():
    profile = layers_from_json(random_layers(random.Random(5), 5))
    placement = Placement.named("linear", 3)
    with pytest.raises(SplitInfeasible) as error:
        choose_split(profile, placement, 3, 0.01, SolveOptions(time_limit=2), _auto)
    need = error.value.need
    assert "raise the limit" in str(error.value)
    result = choose_split(profile, placement, 3, need, SolveOptions(time_limit=2), _auto)
    assert result.chosen.schedule is not None and result.chosen.schedule.fits_memory()


@pytest.mark.parametrize("limit", [None, 1e6])
@pytest.mark.parametrize("seconds", [0.01, 0.5])
def test_a_split_is_solved_past_the_limit_when_time_ran_out_before_any_had_a_schedule(monkeypatch, limit, seconds):
    # Many stages and a short limit: the families give nothing in time for any split. With
    # time left the named splits get the solver; with none, the first split is solved past
    # the limit (without a limit the report of no split failed).
    monkeypatch.setattr(balance, "generator_candidates", lambda problem, **options: ([], {}))
    profile = layers_from_json(random_layers(random.Random(3), 6))
    placement = Placement.named("linear", 3)
    result = choose_split(profile, placement, 4, limit, SolveOptions(time_limit=seconds), _auto)
    chosen = result.chosen
    assert chosen.schedule is not None and chosen.problem is not None
    assert validate(chosen.problem, chosen.schedule.devices) == []
    if seconds == 0.01:  # no time for the solver's share: the rescue of the first split
        assert chosen.name == "even" and [t.name for t in result.trials if t.schedule is not None] == ["even"]
    else:
        assert not chosen.name.startswith("search")


def test_named_splits_left_unscored_for_time_get_the_solver_with_the_time_left(monkeypatch):
    # At a short limit the even split's automatic schedulers took most of the candidates'
    # share, the other named splits found no schedule in theirs and were never scored,
    # with time left (a hand rule 2.7% shorter than the even split chosen).
    found = balance.generator_candidates
    calls: list[int] = []

    def only_the_first(problem, **options):
        calls.append(1)
        return found(problem, **options) if len(calls) == 1 else ([], {})

    monkeypatch.setattr(balance, "generator_candidates", only_the_first)
    profile = layers_from_json(random_layers(random.Random(6), 7))
    placement = Placement.named("linear", 3)
    result = choose_split(profile, placement, 4, None, SolveOptions(time_limit=3), _auto)
    named = [t for t in result.trials if not t.name.startswith("search")]
    assert len(named) >= 3 and named[0].name == "even"
    for trial in named:
        assert trial.schedule is not None and trial.solver_seconds is not None, trial.name
        assert trial.reason is None, (trial.name, trial.reason)  # no "not found in time" beside a schedule
        assert result.chosen.value("makespan") <= trial.value("makespan") * (1 + 1e-9), trial.name


def test_a_layers_solve_cut_by_ctrl_c_says_so_and_writes_the_best_split(tmp_path, monkeypatch):
    # Ctrl-C during the second split's solve: the first split's schedule is written and
    # exit 130, with "interrupted" on stderr, as for a problem file (the report alone
    # looked like a finished solve).
    import optimizer.exact

    calls = []

    def cut_second(problem, method, options):
        calls.append(problem)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return solve(problem, method, options)

    monkeypatch.setattr(optimizer.exact, "solve", cut_second)
    layers_file, schedule_file = tmp_path / "l.json", tmp_path / "s.json"
    layers_file.write_text(json.dumps(random_layers(random.Random(5), 6)))
    result = CliRunner().invoke(app, ["solve", str(layers_file), "-p", "3", "-m", "4", "--time-limit", "2", "-q", "-o", str(schedule_file)])
    assert result.exit_code == 130, result.output
    assert len(calls) == 2
    assert "interrupted" in result.stderr
    load_schedule(schedule_file)  # validates it


@pytest.mark.slow
def test_cli_layers_solve_with_a_very_short_limit_still_writes_a_schedule(tmp_path):
    runner = CliRunner()
    layers_file, schedule_file = tmp_path / "l.json", tmp_path / "s.json"
    assert runner.invoke(app, ["layers", "--blocks", "32", "-o", str(layers_file)]).exit_code == 0
    result = runner.invoke(app, ["solve", str(layers_file), "-p", "32", "-m", "8", "--time-limit", "0.01", "-q", "-o", str(schedule_file)])
    assert result.exit_code == 0, result.output
    assert "chosen split" in result.stdout
    # Both peaks, each named: the schedule's (activations) and the table's (with parameters).
    chosen = next(line for line in result.stdout.splitlines() if line.startswith("chosen split"))
    assert "peak activation memory" in chosen and "peak memory with parameters" in chosen
    load_schedule(schedule_file)  # validates it


# ------------------------------------------------------------------------------ Megatron layout


def test_layout_parser_reads_the_documented_examples():
    stages = parse_layout("Et*3|(tt|)*29,m|L", 16)
    assert len(stages) == 32
    assert stages[0] == "Ettt" and stages[1] == "tt" and stages[30] == "m" and stages[31] == "L"
    assert parse_layout("E||t|L", 2) == ["E", "", "t", "L"]
    assert expand_layout("(t*2|)*2,L") == "tt|tt|L"
    for bad, rule in (
        ("tE|L", "'E' must be the first"),
        ("E|L|t|t", "'L' must be the last"),
        ("E|t|L", "multiple of the pipeline size"),
        ("t|L", "'E' appears 0 times"),  # Megatron needs both, once each
        ("E|t", "'L' appears 0 times"),
    ):
        with pytest.raises(InputError, match=rule):
            parse_layout(bad, 2)
    with pytest.raises(InputError, match="transformer layers"):
        parse_layout("Et|tL", 2, num_layers=3)


def test_a_split_without_its_loss_layer_is_not_exported_as_a_layout_megatron_refuses():
    # It was written as "Et*3|t*3"; Megatron's layout check needs E first and L last.
    profile = decoder_layers(DecoderSizes(blocks=6, vocab=1000))
    place = Placement.named("linear", 2)
    problem = split_problem(profile, place, bottleneck_split([1.0] * profile.num_layers, place.num_stages), 2)
    data = problem.model_dump(mode="json")
    data["stages"][-1]["layers"] = [layer for layer in data["stages"][-1]["layers"] if layer["kind"] != "head"]
    with pytest.raises(InputError, match=r"breaks Megatron's rules \(layout: 'L' appears 0 times"):
        layout_for(problem_from_json(data))


@pytest.mark.parametrize("placement", ["linear", "interleaved:2"])
def test_exported_layout_is_valid_and_names_each_stages_layers(placement):
    profile = decoder_layers(DecoderSizes(blocks=14, vocab=64_000))
    place = Placement.named(placement, 4)
    split = bottleneck_split([1.0] * profile.num_layers, place.num_stages)
    problem = split_problem(profile, place, split, 4)
    stages = parse_layout(layout_for(problem), 4, num_layers=14)
    letters = {"embedding": "E", "block": "t", "head": "L"}
    assert stages == ["".join(letters[layer.kind] for layer in stage.layers or []) for stage in problem.stages]


def test_layout_refuses_the_v_placement():
    profile = decoder_layers(DecoderSizes(blocks=6))
    place = Placement.named("vshape", 2)
    problem = split_problem(profile, place, even_split(profile, 4), 2)
    with pytest.raises(InputError, match="Megatron cannot express"):
        layout_for(problem)


# ------------------------------------------------------------------------------ command line


@pytest.mark.slow
def test_cli_layers_solve_and_export(tmp_path):
    runner = CliRunner()
    layers_file, schedule_file, layout = tmp_path / "l.json", tmp_path / "s.json", tmp_path / "layout.txt"
    result = runner.invoke(app, ["layers", "--blocks", "8", "--vocab", "128000", "-o", str(layers_file)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        app, ["solve", str(layers_file), "-p", "4", "-m", "8", "--time-limit", "3", "-q", "--json", "-o", str(schedule_file)]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    chosen = next(row for row in report["splits"] if row["chosen"])
    even = next(row for row in report["splits"] if row["split"] == "even")
    assert chosen["makespan"] <= even["makespan"] * (1 + 1e-9)
    result = runner.invoke(app, ["export", str(schedule_file), "--format", "megatron-layout", "-o", str(layout)])
    assert result.exit_code == 0, result.output
    stages = parse_layout(layout.read_text().strip(), 4, num_layers=8)
    assert [len(stage) for stage in stages] == chosen["layers_per_stage"]
    result = runner.invoke(app, ["solve", str(layers_file), "-o", str(tmp_path / "x.json")])
    assert result.exit_code == 2 and "needs --devices and --microbatches" in result.output


@pytest.mark.parametrize(("sizes", "args"), [
    (["--blocks", "3", "--hidden", "512", "--vocab", "32000", "--sequence", "1024"], ["-p", "2", "-m", "4"]),
    (["--blocks", "6", "--hidden", "512", "--vocab", "32000", "--sequence", "1024"], ["-p", "3", "-m", "8", "--placement", "vshape", "--vocab-parallel"]),
])  # fmt: skip
def test_the_least_limit_named_when_no_split_fits_is_one_that_fits(tmp_path, sizes, args):
    # It was printed to 4 digits, rounded down: 0.467 for a need of 0.46704..., and the
    # limit named failed in its turn.
    runner = CliRunner()
    layers_file = tmp_path / "layers.json"
    assert runner.invoke(app, ["layers", *sizes, "-o", str(layers_file)]).exit_code == 0
    out = tmp_path / "s.json"
    common = ["solve", str(layers_file), *args, "--time-limit", "1", "-q", "-o", str(out)]
    refused = runner.invoke(app, [*common, "--memory-limit", "0.01"])
    assert refused.exit_code == 3, refused.output
    named = re.search(r"the least any split tried needs is ([0-9.e+-]+) ", refused.stderr)
    assert named is not None, refused.stderr
    solved = runner.invoke(app, [*common, "--memory-limit", named.group(1)])
    assert solved.exit_code == 0, solved.output


# ------------------------------------------------------------------------------ torchtitan modules


def test_torchtitan_modules_hold_every_module_a_decoder_has(tmp_path):
    # torchtitan deletes from a stage every module its list leaves out: the generated
    # names were "embedding" (torchtitan's is tok_embeddings) and the head's "output"
    # alone (its final norm, "norm", was dropped, and a decoder skips a missing norm).
    from optimizer.formats.layer_lists import layer_names
    from optimizer.schedules import generate

    runner = CliRunner()
    layers_file, schedule_file = tmp_path / "l.json", tmp_path / "s.json"
    assert runner.invoke(app, ["layers", "--blocks", "6", "--vocab", "1000", "-o", str(layers_file)]).exit_code == 0
    result = runner.invoke(app, ["solve", str(layers_file), "-p", "2", "-m", "4", "--time-limit", "1", "-q", "-o", str(schedule_file)])
    assert result.exit_code == 0, result.output
    names = layer_names(load_schedule(schedule_file))
    assert names[0][0] == "tok_embeddings" and names[-1][-2:] == ["norm", "output"]
    assert [n for stage in names for n in stage] == ["tok_embeddings", *(f"layers.{i}" for i in range(6)), "norm", "output"]
    # A layers file that names its own norm layer keeps it once.
    data = json.loads(layers_file.read_text())
    data["layers"].insert(-1, {**data["layers"][1], "name": "norm"})
    problem = split_problem(layers_from_json(data), Placement.named("linear", 2), [4, 5], 4)
    listed = layer_names(generate(problem, "1f1b"))
    assert [n for stage in listed for n in stage].count("norm") == 1


def _device_loads(weights: list[float], device_of: tuple[int, ...], split: tuple[int, ...]) -> list[float]:
    loads, first = [0.0] * (max(device_of) + 1), 0
    for stage, count in enumerate(split):
        loads[device_of[stage]] += sum(weights[first : first + count])
        first += count
    return loads


@pytest.mark.parametrize("seed", range(12))
def test_the_least_memory_split_counts_every_stage_a_device_holds(seed, monkeypatch):
    """On the V and interleaved placements a device holds several stages: the per-stage
    bottleneck split needed up to 35% more there than the best split. Small cases are
    solved by trying every split; above that, moving boundaries never ends above the
    per-stage bottleneck it starts from."""
    rng = random.Random(seed)
    placement = Placement.named(rng.choice(["vshape", "interleaved:2"]), rng.choice([2, 3]))
    n = rng.randint(placement.num_stages, placement.num_stages + 6)
    weights = [rng.uniform(0.1, 1.0) * (10 if rng.random() < 0.15 else 1) for _ in range(n)]
    every = (tuple(b - a for a, b in zip((0, *cuts), (*cuts, n))) for cuts in itertools.combinations(range(1, n), placement.num_stages - 1))
    best = min(max(_device_loads(weights, placement.device_of, split)) for split in every)
    chosen = least_memory_split(weights, placement.device_of)
    assert sum(chosen) == n and min(chosen) >= 1
    assert max(_device_loads(weights, placement.device_of, chosen)) == pytest.approx(best, rel=1e-12)
    monkeypatch.setattr("optimizer.split.LEAST_MEMORY_EXHAUSTIVE", 0)
    moved = least_memory_split(weights, placement.device_of)
    start = bottleneck_split(weights, placement.num_stages)
    assert max(_device_loads(weights, placement.device_of, moved)) <= max(_device_loads(weights, placement.device_of, start)) + 1e-12


def test_a_v_split_within_the_limit_is_found_where_the_per_stage_bottleneck_needs_more(tmp_path):
    # Every named split needed more than 18 (the per-stage least-memory one 20.71): exit 3,
    # where 3/1/1/3/1/2 needs 15.6 at most.
    layers_file = DATA / "vshape-least-memory-layers.json"
    profile = load_layers(layers_file)
    placement = Placement.named("vshape", 3)
    assert max(memory_need(profile, placement, least_memory_split(layer_memory(profile), placement.device_of))) <= 18
    schedule_file = tmp_path / "s.json"
    args = [str(layers_file), "-p", "3", "-m", "4", "--placement", "vshape", "--memory-limit", "18", "--time-limit", "1", "-q"]
    result = CliRunner().invoke(app, ["solve", *args, "-o", str(schedule_file)])
    assert result.exit_code == 0, result.output
    assert validate(load_schedule(schedule_file).problem, load_schedule(schedule_file).devices) == []


def test_a_split_whose_stage_sums_pass_the_largest_value_is_left_out_not_fatal(tmp_path):
    # Six blocks of 4e11 each: every layer within 1e12, a stage of three is not. The even
    # split (2/2/2) fits; a hand rule's 3-block stage aborted the whole solve with exit 2.
    data = random_layers(random.Random(3), 6, ends=False)
    for layer in data["layers"]:
        layer.update(forward=4e11, backward_input=4e11, backward_weight=4e11)
    layers_file = tmp_path / "big.json"
    layers_file.write_text(json.dumps(data))
    schedule_file = tmp_path / "s.json"
    result = CliRunner().invoke(app, ["solve", str(layers_file), "-p", "3", "-m", "2", "--time-limit", "1", "-q", "-o", str(schedule_file)])
    assert result.exit_code == 0, result.output
    assert load_schedule(schedule_file).problem.num_stages == 3


def test_a_limit_met_within_the_slack_gives_each_device_at_least_its_activations():
    # Parameters 5 and one activation of 1e-10 under a limit of 5: within the slack, and the
    # problem's limit of 5 - 5 = 0 was refused ("memory_limit.0: Input should be greater than 0").
    data = random_layers(random.Random(4), 1, ends=False)
    layer = data["layers"][0]
    layer.update(parameters=5.0, memory={"forward": 1e-10, "backward_input": -0.5e-10, "backward_weight": -0.5e-10})
    profile = layers_from_json(data)
    problem = split_problem(profile, Placement.named("linear", 1), (1,), 2, 5.0)
    assert problem.tables().limit[0] >= 1e-10


def test_a_size_over_the_limit_is_named_not_taken_for_a_memory_failure(tmp_path):
    # Every split's problem is over the op limit: the search dropped each split as input and
    # then said "no split tried has a schedule" (exit 3) where no memory limit was given.
    layers_file = tmp_path / "l.json"
    assert CliRunner().invoke(app, ["layers", "--blocks", "8", "-o", str(layers_file)]).exit_code == 0
    result = CliRunner().invoke(app, ["solve", str(layers_file), "-p", "8", "-m", "4000", "-q", "-o", str(tmp_path / "s.json")])
    assert result.exit_code == 2, result.output
    assert "more than the 50000" in result.output and "memory_limit" not in result.output


def test_a_layers_solve_prints_the_longest_span_with_json(tmp_path):
    layers_file, schedule_file = tmp_path / "l.json", tmp_path / "s.json"
    assert CliRunner().invoke(app, ["layers", "--blocks", "4", "-o", str(layers_file)]).exit_code == 0
    args = ["solve", str(layers_file), "-p", "2", "-m", "4", "--time-limit", "1", "-q", "--json", "-o", str(schedule_file)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)["metrics"]
    devices = load_schedule(schedule_file).devices
    assert metrics["longest_span"] == pytest.approx(max(ops[-1].end - ops[0].start for ops in devices))


def test_a_split_whose_family_the_solver_only_matches_keeps_the_solvers_bound_and_status():
    # Two devices, two microbatches: a family's schedule is optimal, the solver returns one
    # as long with its proof; the split kept the family's (no bound, no status).
    def layer(name: str, kind: str, time: float) -> dict:
        memory = {"forward": 1.0, "backward_input": -0.5, "backward_weight": -0.5}
        return {"name": name, "kind": kind, "forward": time, "backward_input": time, "backward_weight": time, "memory": memory}

    blocks = [layer(f"block{i}", "block", 1.0) for i in range(4)]
    profile = layers_from_json(
        {
            "format": FORMAT,
            "version": VERSION,
            "layers": [layer("embedding", "embedding", 0.5), *blocks, layer("head", "head", 2.0)],
            "comm_time": 0.2,
        }
    )
    result = choose_split(profile, Placement.named("linear", 2), 2, None, SolveOptions(time_limit=4), _auto)
    assert result.chosen.schedule is not None
    metrics = result.chosen.schedule.metrics
    assert metrics.lower_bound is not None and metrics.status in ("optimal", "feasible")
    assert metrics.lower_bound <= metrics.makespan * (1 + 1e-9)

"""Runtime pieces in one process: the split backward, the plan, the models, the profile order."""

from __future__ import annotations

import re
import sys
from typing import cast

import pytest
import torch
import torch.nn as nn

from optimizer.errors import DeadlockError, InputError
from optimizer.ops import Op, TimedOp
from optimizer.problem import Problem, uniform_problem
from optimizer.schedule import Schedule
from optimizer.schedules import generate
from runtime.backward import SplitBackward, backward_fused, backward_weight
from runtime.models import GPTConfig, GPTStage, build_example, even_split, load_model
from runtime.plan import ACTIVATION, GRADIENT, build_plans
from runtime.position import UPDATING, RankPosition
from runtime.profile import profile_result, profiling_schedule

pytestmark = pytest.mark.runtime

torch.set_num_threads(1)
TINY = GPTConfig(layers=4, hidden=32, heads=2, vocab=64, seq_len=16)


def _grads(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


def _split_matches_fused(module: nn.Module, make_input, loss=None, grad_shape=None):
    torch.manual_seed(1)
    x0 = make_input()
    grad = None if grad_shape is None else torch.randn(grad_shape)

    def forward(x):
        out = module(x)
        return loss(out) if loss else out

    x = x0.detach().requires_grad_(x0.is_floating_point())
    (fused_input,) = backward_fused(forward(x), grad, [x])
    fused = _grads(module)
    module.zero_grad(set_to_none=True)

    x = x0.detach().requires_grad_(x0.is_floating_point())
    split = SplitBackward(list(module.parameters()))
    (split_input,), work = split.backward_input(forward(x), grad, [x])
    assert all(p.grad is None for p in module.parameters()), "B must leave parameter gradients to W"
    backward_weight(work)
    assert _grads(module).keys() == fused.keys()
    for name, g in _grads(module).items():
        torch.testing.assert_close(g, fused[name], rtol=1e-6, atol=1e-7, msg=name)
    if fused_input is None:
        assert split_input is None
    else:
        torch.testing.assert_close(split_input, fused_input, rtol=1e-6, atol=1e-7)
    return work


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_split_backward_equals_fused_on_gpt_stages(stage):
    model = build_example(TINY, 3, [1, 2, 1])
    module = model.stages[stage]
    inputs, targets = model.make_batch(0, 1)
    if stage == 0:
        _split_matches_fused(module, lambda: inputs, grad_shape=(2, 16, 32))
    elif stage == 1:
        _split_matches_fused(module, lambda: torch.randn(2, 16, 32), grad_shape=(2, 16, 32))
    else:
        _split_matches_fused(module, lambda: torch.randn(2, 16, 32), loss=lambda out: model.loss_fn(out, targets))


class _SharedWeight(nn.Module):
    """One Linear applied twice: its weight's frontier nodes sit one above the other."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(8, 8)
        self.other = nn.Linear(8, 8)
        self.unused = nn.Linear(8, 8)

    def forward(self, x):
        return self.shared(torch.tanh(self.other(self.shared(x))))


def test_split_backward_with_a_weight_used_twice_and_an_unused_one():
    work = _split_matches_fused(_SharedWeight(), lambda: torch.randn(4, 8), grad_shape=(4, 8))
    assert work.groups == []  # W consumed it


def test_split_backward_skips_weight_gradients_in_b():
    """B's cost must not include the weight GEMMs: W has work left for every Linear."""
    module = build_example(TINY, 3, [1, 2, 1]).stages[1]
    x = torch.randn(2, 16, 32, requires_grad=True)
    split = SplitBackward(list(module.parameters()))
    _, work = split.backward_input(module(x), torch.randn(2, 16, 32), [x])
    covered = {id(p) for _, _, params, _ in work.groups for p in params}
    assert covered == {id(p) for p in module.parameters()}


def test_example_split_is_even_with_extra_layers_in_the_middle():
    assert even_split(6, 4) == [1, 2, 2, 1]
    assert even_split(8, 2) == [4, 4]
    assert sum(even_split(7, 3)) == 7


def test_example_model_options_and_errors():
    model = load_model("example:layers=6,hidden=32,heads=2,split=1/2/2/1", 4)
    assert [len(cast(GPTStage, stage).blocks) for stage in model.stages] == [1, 2, 2, 1]
    assert hasattr(model.stages[0], "tok_emb") and hasattr(model.stages[3], "head")
    with pytest.raises(InputError, match="split has 3 stages"):
        load_model("example:split=1/2/1", 4)
    with pytest.raises(InputError, match="unknown option 'depth'"):
        load_model("example:depth=3", 2)
    with pytest.raises(InputError, match="option layers is given twice"):  # the last one won
        load_model("example:layers=2,layers=3", 2)
    with pytest.raises(InputError, match="seed=-1 must be 0 or more"):
        load_model("example:seed=-1", 2)
    with pytest.raises(InputError, match="cannot import"):
        load_model("no_such_package.models:build", 2)
    # A split's sum sets the layers: it meets the same caps as layers= (a million layers
    # given as a split once built until memory ran out), and its counts are layer counts.
    with pytest.raises(InputError, match="split adds up to 1000001 layers"):
        load_model("example:split=1000000/1", 2)
    for split in ("-1/9", "-5/-5", "0/0"):
        with pytest.raises(InputError, match=f"split '{split}' needs layer counts of 0 or more"):
            load_model(f"example:split={split}", 2)


def test_a_user_model_in_the_current_folder_is_found_without_changing_the_path(tmp_path, monkeypatch):
    # The console command does not put the current folder on sys.path (`python -m` does):
    # `--model mymodel:build_stages` next to the user's file must still import.
    (tmp_path / "folder_model_for_test.py").write_text(
        "from runtime.models import GPTConfig, build_example\n"
        "def build_stages(num_stages):\n"
        "    model = build_example(GPTConfig(layers=2, hidden=16, heads=2, vocab=32, seq_len=8), num_stages)\n"
        "    return model.stages, model.loss_fn, model.make_batch\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [entry for entry in sys.path if entry not in ("", ".", str(tmp_path))])
    before = list(sys.path)
    model = load_model("folder_model_for_test:build_stages", 2)
    assert len(model.stages) == 2 and sys.path == before
    with pytest.raises(InputError, match=f"looked on sys.path and in {tmp_path}"):
        load_model("no_such_model_in_folder:build_stages", 2)
    assert sys.path == before
    sys.modules.pop("folder_model_for_test", None)


@pytest.mark.parametrize(
    "returns, expected",
    [
        ("(5, 6, 7)", "returned stages that are not a list of torch.nn.Module"),
        ("PipelineModel(5, None, None)", "returned stages that are not a list of torch.nn.Module"),
        ("([torch.nn.Linear(2, 2)] * 2, None, None)", "returned a loss_fn that is not callable"),
        ("([torch.nn.Linear(2, 2)] * 3, len, len)", "returned 3 stages, the schedule has 2"),
        ("42", "must return a PipelineModel or (stages, loss_fn, make_batch), not int"),
        ("sys.exit(3)", "raised it called sys.exit(3)"),
    ],
)
def test_a_user_model_that_returns_something_else_is_one_line(tmp_path, monkeypatch, returns, expected):
    # These reached the ranks (a traceback, exit 1), or ended the command silently with the
    # user's exit code (3 and 4 mean other things here).
    name = f"returns_model_{abs(hash(returns))}"
    (tmp_path / f"{name}.py").write_text(
        f"import sys\nimport torch\nfrom runtime.models import PipelineModel\ndef build_stages(num_stages):\n    return {returns}\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=re.escape(expected)):
        load_model(f"{name}:build_stages", 2)
    sys.modules.pop(name, None)


def test_a_user_module_that_exits_while_it_imports_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "exiting_model_for_test.py").write_text("import sys\nsys.exit(4)\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=r"cannot import 'exiting_model_for_test' \(it called sys.exit\(4\)\)"):
        load_model("exiting_model_for_test:build_stages", 2)
    sys.modules.pop("exiting_model_for_test", None)


def test_example_model_is_deterministic_per_stage():
    a = build_example(TINY, 2)
    b = build_example(TINY, 2)
    for sa, sb in zip(a.stages, b.stages):
        for pa, pb in zip(sa.parameters(), sb.parameters()):
            assert torch.equal(pa, pb)
    assert torch.equal(a.make_batch(3, 2)[0], b.make_batch(3, 2)[0])


def test_plan_issues_messages_per_peer_in_one_global_order():
    schedule = generate(uniform_problem(2, 4, placement="vshape"), "gpipe")
    plans = build_plans(schedule, 2)
    assert plans[0].peer_messages[1] == plans[1].peer_messages[0]  # both sides, same order
    messages = plans[0].peer_messages[1]
    # V placement: stages 1 and 2 share device 1, so their hand-off sends nothing.
    assert not any(m.kind == ACTIVATION and m.stage == 2 for m in messages)
    assert not any(m.kind == GRADIENT and m.stage == 1 for m in messages)
    assert len(messages) == 2 * 4 * 2  # two cross-device boundaries, both ways, 4 microbatches
    assert len({m.tag for m in messages}) == len(messages)


def test_plan_refuses_deadlock_and_wrong_world_size():
    problem = uniform_problem(2, 2)
    orders = [
        [Op("BW", 0, 0), Op("F", 0, 0), Op("F", 0, 1), Op("BW", 0, 1)],
        [Op("F", 1, 0), Op("BW", 1, 0), Op("F", 1, 1), Op("BW", 1, 1)],
    ]
    fake_times = [[TimedOp(op.kind, op.stage, op.microbatch, 0.0, 1.0) for op in ops] for ops in orders]
    schedule = Schedule(problem, "hand-made", fake_times)
    with pytest.raises(DeadlockError, match=r"device 0 waits at BW\(stage 0, mb 0\)"):
        build_plans(schedule, 2)
    with pytest.raises(InputError, match="for 2 devices, the world has 4 ranks"):
        build_plans(generate(problem, "1f1b"), 4)


def test_profiling_schedule_splits_backward_for_every_placement():
    for placement in ("linear", "interleaved:2", "vshape"):
        schedule = profiling_schedule(2, 3, placement)
        kinds = {op.kind for device in schedule.devices for op in device}
        assert kinds == {"F", "B", "W"}


def test_profile_writes_the_measured_fused_backward_into_the_problem():
    """Two ranks' measurements (ms per (kind, stage)): BW, cheaper than B + W here, becomes
    each stage's `backward`, and a fused 1F1B is timed with it."""
    ranks = [
        ({("F", 0): 1.0, ("B", 0): 2.0, ("W", 0): 1.5, ("BW", 0): 2.8}, {("F", 0): 2**20}, [0.002]),
        ({("F", 1): 1.1, ("B", 1): 2.2, ("W", 1): 1.6, ("BW", 1): 3.1}, {("F", 1): 2**20}, []),
    ]
    result = profile_result(2, 4, "linear", ranks)
    assert [stage["backward"] for stage in result["problem"]["stages"]] == [2.8, 3.1]
    problem = Problem.model_validate(result["problem"])
    schedule = generate(problem, "1f1b")
    assert {round(op.end - op.start, 9) for op in schedule.devices[1] if op.kind == "BW"} == {3.1}


def test_a_rank_whose_results_folder_is_gone_reports_quietly(tmp_path):
    # After Ctrl-C the launcher removes the results folder while ranks are still ending;
    # a rank's last report must not raise (its traceback would bury the launcher's line).
    import pickle

    from runtime.launch import _report

    _report(tmp_path / "removed" / "rank1.pickle", {"ok": False, "exit_code": 130})
    assert not (tmp_path / "removed").exists()
    _report(tmp_path / "rank0.pickle", {"ok": True, "result": 3})
    assert pickle.loads((tmp_path / "rank0.pickle").read_bytes()) == {"ok": True, "result": 3}


def test_a_rank_position_names_the_op_or_the_phase_it_was_left_in():
    # Read by the launcher after the rank has ended (runtime/position.py): each write
    # replaces the last, and a write cut short says so instead of mixing two ops' fields.
    position = RankPosition([0] * 6)
    assert position.describe() == "before its first step"
    position.enter(2, Op("W", 3, 7))
    assert position.describe() == "in W(stage 3, mb 7) of step 2"
    position.enter(2, Op("F", 1, 4, 2))
    assert position.describe() == "in F(stage 1, mb 4.2) of step 2"
    position.finishing(2)
    assert position.describe() == "after its last op of step 2, finishing the step's transfers"
    position.step_done(2)
    assert position.describe() == "after step 2"
    position.in_step(3)
    assert position.describe() == "in step 3"
    cut_short = [UPDATING, 3, 0, 1, 4, 0]
    assert RankPosition(cut_short).describe() == "between two ops of step 3"

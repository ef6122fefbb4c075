"""Hostile input through the real command line: every case gets one line and exit 2, nothing written.

A corpus of bad files and options (generated here into a temporary folder) goes through
each command that takes it, each case in its own `pipesched` process. Every case checks:
the exit code; stderr is exactly one line, without a traceback, naming the file, field
or option; no file in the corpus or the case's output folder created or changed (bytes
and mode); and a hang guard on the time taken. Then the size contract at its limit and
just over, and Ctrl-C during solve (CBC and auto), pareto and run.

Cases that read files or options run in batches, each batch one `pipesched` process that
calls the console entry's `run_app` once per case with its own stderr; the cases that load
a user model (torch) share a batch of their own, and those that need their own
environment get a process each. Batches and processes
run in parallel threads, to keep the file near a minute and a half on two cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from factories import with_slices

from optimizer.formats import schedule_json, torch_csv
from optimizer.formats.schedule_json import load_schedule, save_schedule
from optimizer.io import MAX_MESSAGE
from optimizer.layer_costs import DecoderSizes, decoder_layers
from optimizer.layers import layers_to_json
from optimizer.problem import MAX_DEVICES, MAX_MICROBATCHES, MAX_OPS, MAX_STAGES, uniform_problem
from optimizer.schedules import generate

pytestmark = pytest.mark.slow  # about two minutes: a hundred CLI processes

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "import sys; from runtime.cli import main; sys.exit(main())"]
# A hang guard, not a speed target: a case that blocks on a FIFO or runs a huge problem
# never ends. The slowest honest case, a user model's error in `run` (torch imported by
# the launcher and by the rank server at once), took up to 35 s on this shared, loaded
# 2-core machine; the file-reading cases take well under a second each.
HANG_GUARD_SECONDS = 60.0
# Python itself would cache the corpus's user models' bytecode next to them (__pycache__),
# which the corpus check would count as written; what pipesched writes is what is checked.
NO_BYTECODE = {"PYTHONDONTWRITEBYTECODE": "1"}


def run_cli(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> tuple[subprocess.CompletedProcess, float]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(cwd)]), **NO_BYTECODE, **(env or {})}
    began = time.monotonic()
    result = subprocess.run(CLI + args, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return result, time.monotonic() - began


def snapshot(folder: Path) -> dict[str, tuple[bytes, int] | str]:
    """Every entry under `folder`: a regular file's bytes and mode, or the kind of anything else."""
    found: dict[str, tuple[bytes, int] | str] = {}
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        if stat.S_ISREG(info.st_mode):
            found[str(path.relative_to(folder))] = (path.read_bytes(), stat.S_IMODE(info.st_mode))
        else:
            found[str(path.relative_to(folder))] = stat.filemode(info.st_mode)[0]
    return found


# ---------------------------------------------------------------------------------- corpus


def _problem_text(devices: int = 2, **changes) -> str:
    data = uniform_problem(devices, 4).model_dump(mode="json")
    data.update(changes)
    return json.dumps(data, indent=1)


def write_corpus(folder: Path) -> None:
    """The hostile files: problems, schedules and user models, each named for its flaw."""
    good = uniform_problem(2, 4)
    (folder / "p.json").write_text(json.dumps(good.model_dump(mode="json"), indent=1))
    save_schedule(generate(good, "1f1b"), folder / "s.json")
    save_schedule(generate(good, "zb-h1"), folder / "zbh1.json")  # the last op of rank 1 is a W, after its last send
    save_schedule(generate(with_slices(uniform_problem(2, 2), 2), "terapipe"), folder / "sliced.json")
    problem = (folder / "p.json").read_text()
    schedule = (folder / "s.json").read_text()
    (folder / "l.json").write_text(json.dumps(layers_to_json(decoder_layers(DecoderSizes(blocks=4))), indent=1))
    layers = json.loads((folder / "l.json").read_text())
    files = {
        "nan_forward.json": problem.replace('"forward": 1.0', '"forward": NaN', 1),
        "inf_comm.json": problem.replace('"comm_time": 0.0', '"comm_time": Infinity'),
        "neg_inf_memory.json": problem.replace('"backward_weight": -1.0', '"backward_weight": -Infinity', 1),
        "huge_forward.json": problem.replace('"forward": 1.0', '"forward": 1e308', 1),
        "overflow_forward.json": problem.replace('"forward": 1.0', '"forward": 1e400', 1),
        "string_devices.json": problem.replace('"num_devices": 2', '"num_devices": "2"'),
        "bool_devices.json": problem.replace('"num_devices": 2', '"num_devices": true'),
        "duplicate_key.json": problem.replace('"num_devices": 2', '"num_devices": 2, "num_devices": 3'),
        "million_microbatches.json": _problem_text(num_microbatches=1_000_000),
        "float_microbatches.json": problem.replace('"num_microbatches": 4', '"num_microbatches": 1e6'),
        "many_devices.json": _problem_text(num_devices=100_000),
        "over_ops.json": _problem_text(8, num_microbatches=MAX_OPS // 24 + 1),  # 8 stages: 3 * 8 * m ops
        "deep.json": "[" * 50_000 + "]" * 50_000,
        # Under 64 MiB but more items than any valid input: refused before parsing.
        "million_empty_ops.json": '{"format": "pipesched.schedule", "version": 1, "devices": [[' + "{}," * 999_999 + "{}]]}",
        "many_keys.json": problem.replace("{", "{" + "".join(f'"k{i}": 0, ' for i in range(1_100_000)), 1),
        "long_list.json": problem.replace('"memory_limit": null', '"memory_limit": [' + "1," * 2_099_999 + "1]", 1),
        "latin1.json": None,
        "empty.json": "",
        "nan_start.json": schedule.replace('"start": 0.0', '"start": NaN', 1),
        "inf_end.json": schedule.replace('"end": 1.0', '"end": Infinity', 1),
        "stage_out_of_range.json": _edited_schedule(schedule, stage=7),
        "microbatch_out_of_range.json": _edited_schedule(schedule, microbatch=99),
        "wrong_device.json": _edited_schedule(schedule, stage=1),
        "vocab_nan.json": _problem_text(vocab_parallel={"forward": 1.0, "backward": "NaN-here"}).replace('"NaN-here"', "NaN"),
        "vocab_barriers.json": _problem_text(vocab_parallel={"barriers": 3, "forward": 1.0, "backward": 1.0}),
        "vocab_slices.json": _problem_text(num_slices=2, vocab_parallel={"forward": 1.0, "backward": 1.0}),
        "vocab_over_ops.json": _problem_text(256, num_microbatches=60, vocab_parallel={"forward": 1.0, "backward": 1.0}),
        "vocab_pass_without_vocab.json": schedule.replace('"kind": "F"', '"kind": "S"', 1).replace('"version": 1', '"version": 3'),
        "layers_nan.json": (folder / "l.json").read_text().replace('"forward": ', '"forward": NaN, "x": ', 1),
        "layers_head_first.json": json.dumps({**layers, "layers": layers["layers"][::-1]}),
        # Two layers of one name: the exports list layers by name (torchtitan's module lists).
        "layers_duplicate_name.json": json.dumps(
            {
                **layers,
                "layers": [*layers["layers"][:2], {**layers["layers"][2], "name": layers["layers"][1]["name"]}, *layers["layers"][3:]],
            }
        ),
        "layers_too_many.json": json.dumps({**layers, "layers": [layers["layers"][1]] * 5000}),
        "layers_zero_time.json": json.dumps({**layers, "layers": [{**layers["layers"][1], "backward_input": 0.0}]}),
        "layers_version_true.json": json.dumps({**layers, "version": True}),
        "raising_model.py": "def build_stages(num_stages):\n    raise RuntimeError('no weights here')\n",
        "syntax_model.py": "def build_stages(num_stages) return\n",
        "import_model.py": "import module_that_is_not_there\n",
        # The example model whose last stage never ends its third forward: a stuck transfer
        # (the first ones are torch's shape inference and microbatch 0).
        "stuck_model.py": (
            "import time\n"
            "import torch\n"
            "from runtime.models import GPTConfig, build_example\n"
            "class Stuck(torch.nn.Module):\n"
            "    def __init__(self, inner):\n"
            "        super().__init__()\n"
            "        self.inner = inner\n"
            "        self.calls = 0\n"
            "    def forward(self, *args):\n"
            "        self.calls += 1\n"
            "        if self.calls >= 3:\n"
            "            time.sleep(60)\n"
            "        return self.inner(*args)\n"
            "def build_stages(num_stages):\n"
            "    model = build_example(GPTConfig(layers=2, hidden=16, heads=2, vocab=32, seq_len=8), num_stages)\n"
            "    return [*model.stages[:-1], Stuck(model.stages[-1])], model.loss_fn, model.make_batch\n"
        ),
        # The example model whose last stage's weight gradient never ends from the 4th on.
        "stuck_w_model.py": (
            "import time\n"
            "from runtime.models import GPTConfig, build_example\n"
            "def build_stages(num_stages):\n"
            "    model = build_example(GPTConfig(layers=2, hidden=16, heads=2, vocab=32, seq_len=8), num_stages)\n"
            "    calls = [0]\n"
            "    def hang_from_the_fourth(grad):\n"
            "        calls[0] += 1\n"
            "        if calls[0] >= 4:\n"
            "            time.sleep(60)\n"
            "        return grad\n"
            "    next(model.stages[-1].parameters()).register_hook(hang_from_the_fourth)\n"
            "    return model.stages, model.loss_fn, model.make_batch\n"
        ),
        # The example model whose last stage raises in its first real forward (every rank
        # runs each stage once to learn the shapes it receives).
        "raising_forward_model.py": (
            "from runtime.models import GPTConfig, build_example\n"
            "def build_stages(num_stages):\n"
            "    model = build_example(GPTConfig(layers=2, hidden=16, heads=2, vocab=32, seq_len=8), num_stages)\n"
            "    last, calls = model.stages[-1], [0]\n"
            "    real = last.forward\n"
            "    def boom(*args):\n"
            "        calls[0] += 1\n"
            "        if calls[0] >= 2:\n"
            "            raise RuntimeError('boom in forward')\n"
            "        return real(*args)\n"
            "    last.forward = boom\n"
            "    return model.stages, model.loss_fn, model.make_batch\n"
        ),
        # The example model whose loss is NaN: a diverged run.
        "nan_model.py": (
            "from runtime.models import GPTConfig, build_example\n"
            "def build_stages(num_stages):\n"
            "    model = build_example(GPTConfig(layers=2, hidden=16, heads=2, vocab=32, seq_len=8), num_stages)\n"
            "    return model.stages, lambda out, y: model.loss_fn(out, y) * float('nan'), model.make_batch\n"
        ),
        "surrogate_method.json": schedule.replace('"method": "1f1b"', '"method": "\\ud800x"', 1),
        "version_true.json": schedule.replace('"version": 1', '"version": true', 1),
        "bound_text.json": schedule.replace('"metrics": {', '"metrics": {"lower_bound": "5",', 1),
        # Metrics the ops contradict (they are computed again on loading, and were ignored).
        "wrong_makespan.json": _edited_metrics(schedule, makespan=1.0),
        "wrong_bubble.json": _edited_metrics(schedule, bubble_ratio=0.5),
        "wrong_peaks.json": _edited_metrics(schedule, peak_memory=[0.0, 0.0]),
        # No devices, with metrics: the device count is named, not a metric.
        "no_devices.json": json.dumps({**json.loads(schedule), "devices": []}),
        "vocab_float_barriers.json": _problem_text(vocab_parallel={"barriers": 1.0, "forward": 1.0, "backward": 1.0}),
        # torch's CSV of the 1F1B schedule without rank 0's forward of microbatch 3.
        "missing_forward.csv": "0F0,0F1,0F2,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n",
        "deadlock.csv": "0B0,0F0,0F1,0F2,0F3,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n",
        "odd_key.json": problem.replace('"comm_time"', '"comm_t\\u0000ime\\u2603": 1, "comm_time"', 1),
        "negative_in_limits.json": problem.replace('"memory_limit": null', '"memory_limit": [4, -1]', 1),
        "s.csv": "0F0,0F1\n1F0,1F1\n",
        "latin1.csv": None,
        "long_number.csv": "0F" + "9" * 5000 + "\n1F0\n",
        "long_cell.csv": '"' + "x" * 200_000 + '"\n1F0\n',
        "many_cells.csv": ",".join(["0F0"] * 200_000) + "\n1F0\n",
    }
    for name, text in files.items():
        if text is not None:
            (folder / name).write_text(text)
    (folder / "latin1.json").write_bytes(b'{"num_devices": "\xe9"}')
    (folder / "latin1.csv").write_bytes(b"0F0,\xe9\n1F0\n")
    os.mkfifo(folder / "fifo.csv")
    for name, text in files.items():
        if name.endswith(".json") and text and not name.startswith("layers_"):
            assert text != (schedule if "start" in text else problem), f"corpus file {name} did not change"
    os.mkfifo(folder / "fifo.json")
    (folder / "folder.json").mkdir()
    os.symlink("nowhere/zz.json", folder / "dangling.json")
    with open(folder / "huge.json", "wb") as handle:  # sparse: 100 MiB without writing them
        handle.truncate(100 * 2**20)
    (folder / "existing.json").write_text("{}\n")
    os.chmod(folder / "existing.json", 0o644)


def _edited_metrics(text: str, **metrics) -> str:
    data = json.loads(text)
    assert set(metrics) <= set(data["metrics"]), "the edit replaces metrics the file has"
    data["metrics"].update(metrics)
    return json.dumps(data, indent=1)


def _edited_schedule(text: str, **op_fields) -> str:
    data = json.loads(text)
    data["devices"][0][0].update(op_fields)
    return json.dumps(data, indent=1)


def _unused_port() -> int:
    """A port nobody listens on now (the system's choice of a free one)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Case:
    name: str
    args: list[str]  # {C}: the corpus folder, {O}: this case's output folder
    names: list[str]  # stderr must mention each
    code: int = 2
    env: dict[str, str] = field(default_factory=dict)
    stdout_names: list[str] = field(default_factory=list)  # and stdout each of these


PROBLEM_FILES = {
    "nan_forward.json": "stages.0.forward: NaN",
    "inf_comm.json": "comm_time: Infinity",
    "neg_inf_memory.json": "backward_weight: -Infinity",
    "huge_forward.json": "stages.0.forward",
    "overflow_forward.json": "stages.0.forward: 1e400",
    "string_devices.json": "num_devices",
    "bool_devices.json": "num_devices",
    "duplicate_key.json": "'num_devices' appears twice",
    "odd_key.json": "unknown field 'comm_t\\x00ime\\u2603'",
    "negative_in_limits.json": "memory_limit.1: Input should be greater than 0",
    "million_microbatches.json": "num_microbatches",
    "float_microbatches.json": "num_microbatches",
    "many_devices.json": "num_devices",
    "over_ops.json": f"the {MAX_OPS} pipesched takes",
    "deep.json": "nested too deeply",
    "many_keys.json": "JSON values is more than the 2000000 pipesched reads",
    "long_list.json": "JSON values is more than the 2000000 pipesched reads",
    "latin1.json": "not UTF-8",
    "empty.json": "not valid JSON",
    "fifo.json": "FIFO",
    "folder.json": "directory",
    "huge.json": "bytes",
    "missing.json": "no such file",
    "vocab_nan.json": "vocab_parallel.backward: NaN",
    "vocab_barriers.json": "vocab_parallel.barriers",
    "vocab_float_barriers.json": "vocab_parallel.barriers: Input should be a valid integer",
    "vocab_slices.json": "token slices",
    "vocab_over_ops.json": "2 x 256 devices x 60 microbatches",
}
SCHEDULE_FILES = {
    "vocab_pass_without_vocab.json": "the problem has no vocab_parallel",
    "nan_start.json": ".start: NaN",
    "inf_end.json": ".end: Infinity",
    "stage_out_of_range.json": "devices.0.0.stage: 7 is out of range",
    "microbatch_out_of_range.json": "devices.0.0.microbatch: 99 is out of range",
    "deep.json": "nested too deeply",
    "million_empty_ops.json": "1000003 JSON objects and lists is more than the 60000 pipesched reads",
    "fifo.json": "FIFO",
    "folder.json": "directory",
    "huge.json": "bytes",
    "p.json": "not a pipesched schedule",
    "surrogate_method.json": "unpaired UTF-16 surrogate",
    "version_true.json": "version True is not supported",
    "bound_text.json": "metrics.lower_bound",
    "wrong_makespan.json": "metrics.makespan: 1, but the schedule's ops give",
    "wrong_bubble.json": "metrics.bubble_ratio: 0.5, but the schedule's ops give",
    "wrong_peaks.json": "metrics.peak_memory: not what the schedule's ops give",
    "no_devices.json": "devices: the schedule has 0 devices, its problem 2",
}


def cases() -> list[Case]:
    found: list[Case] = []
    for name, says in PROBLEM_FILES.items():
        found.append(Case(f"solve-{name}", ["solve", f"{{C}}/{name}", "--method", "1f1b", "-o", "{O}/s.json"], [name, says]))
        found.append(Case(f"compare-{name}", ["compare", f"{{C}}/{name}"], [name, says]))
    for name in ("nan_forward.json", "duplicate_key.json", "over_ops.json", "fifo.json", "deep.json"):
        found.append(
            Case(f"pareto-{name}", ["pareto", f"{{C}}/{name}", "--limits", "2:4:1", "-o", "{O}/c.json"], [name, PROBLEM_FILES[name]])
        )
    for name, says in SCHEDULE_FILES.items():
        found.append(Case(f"validate-{name}", ["validate", f"{{C}}/{name}"], [name, says]))
        found.append(Case(f"show-{name}", ["show", f"{{C}}/{name}", "-o", "{O}/g.svg"], [name, says]))
    found += [
        # numbers given as options
        Case("problem-forward-nan", ["problem", "-p", "2", "-m", "4", "--forward", "nan", "-o", "{O}/p.json"], ["--forward", "finite"]),
        Case("problem-comm-inf", ["problem", "-p", "2", "-m", "4", "--comm", "inf", "-o", "{O}/p.json"], ["--comm", "finite"]),
        Case("problem-limit-nan", ["problem", "-p", "2", "-m", "4", "--memory-limit", "nan", "-o", "{O}/p.json"], ["--memory-limit"]),
        Case(
            "problem-huge-forward",
            ["problem", "-p", "2", "-m", "4", "--forward", "1e308", "-o", "{O}/p.json"],
            ["--forward", "at most 1e+12"],
        ),
        Case("problem-million-m", ["problem", "-p", "2", "-m", "1000000", "-o", "{O}/p.json"], ["num_microbatches", "1000000"]),
        Case("problem-many-p", ["problem", "-p", "100000", "-m", "4", "-o", "{O}/p.json"], ["num_devices", "100000"]),
        Case(
            "problem-huge-v", ["problem", "-p", "2", "-m", "4", "--placement", "interleaved:99999999999", "-o", "{O}/p.json"], ["placement"]
        ),
        Case("problem-m-text", ["problem", "-p", "2", "-m", "x", "-o", "{O}/p.json"], ["--microbatches"]),
        Case(
            "problem-huge-hidden",
            [
                "problem",
                "-p",
                "2",
                "-m",
                "4",
                "--slices",
                "4",
                "--slice-cost",
                "attention",
                "--hidden",
                "1" + "0" * 400,
                "-o",
                "{O}/p.json",
            ],
            ["--hidden"],
        ),
        Case("problem-unknown-option", ["problem", "-p", "2", "-m", "4", "--bogus", "-o", "{O}/p.json"], ["--bogus"]),
        Case("solve-time-limit-nan", ["solve", "{C}/p.json", "--time-limit", "nan", "-o", "{O}/s.json"], ["--time-limit", "finite"]),
        Case("solve-certify-nan", ["solve", "{C}/p.json", "--certify", "nan", "-o", "{O}/s.json"], ["--certify", "finite"]),
        Case("solve-time-limit-inf", ["solve", "{C}/p.json", "--time-limit", "inf", "-o", "{O}/s.json"], ["--time-limit"]),
        Case("solve-threads-huge", ["solve", "{C}/p.json", "--threads", "100000", "-o", "{O}/s.json"], ["--threads"]),
        Case("pareto-limits-nan", ["pareto", "{C}/p.json", "--limits", "nan:4:1", "-o", "{O}/c.json"], ["limits"]),
        Case("pareto-limits-inf", ["pareto", "{C}/p.json", "--limits", "1:inf:1", "-o", "{O}/c.json"], ["limits"]),
        Case("pareto-limits-tiny-step", ["pareto", "{C}/p.json", "--limits", "1:1e308:1e-308", "-o", "{O}/c.json"], ["limits"]),
        Case(
            "pareto-time-limit-nan",
            ["pareto", "{C}/p.json", "--limits", "2", "--time-limit", "nan", "-o", "{O}/c.json"],
            ["--time-limit", "finite"],
        ),
        # outputs
        Case("problem-output-folder", ["problem", "-p", "2", "-m", "4", "-o", "{C}/folder.json"], ["folder.json", "directory"]),
        Case(
            "problem-output-unwritable", ["problem", "-p", "2", "-m", "4", "-o", "/proc/pipesched-test.json"], ["/proc/pipesched-test.json"]
        ),
        Case("problem-output-full-device", ["problem", "-p", "2", "-m", "4", "-o", "/dev/full"], ["/dev/full", "No space left"]),
        Case("problem-output-no-folder", ["problem", "-p", "2", "-m", "4", "-o", "{O}/missing/p.json"], ["does not exist"]),
        Case(
            "problem-output-dangling-link",
            ["problem", "-p", "2", "-m", "4", "-o", "{C}/dangling.json"],
            ["dangling.json", "nowhere does not exist"],
        ),
        Case("solve-output-is-input", ["solve", "{C}/p.json", "--method", "1f1b", "-o", "{C}/p.json"], ["p.json", "is also the input"]),
        Case("solve-output-full-device", ["solve", "{C}/p.json", "--method", "1f1b", "-o", "/dev/full"], ["/dev/full"]),
        Case("solve-output-folder", ["solve", "{C}/p.json", "--method", "1f1b", "-o", "{C}/folder.json"], ["directory"]),
        Case("show-output-is-input", ["show", "{C}/s.json", "-o", "{C}/s.json"], ["s.json", "is also the input"]),
        Case("show-output-folder", ["show", "{C}/s.json", "-o", "{C}/folder.json"], ["directory"]),
        Case("solve-solver-without-milp", ["solve", "{C}/p.json", "--solver", "highs", "-o", "{O}/s.json"], ["--solver", "milp"]),
        # An unknown objective was accepted with a schedule family, and `span` ignored there.
        Case(
            "solve-objective-unknown-family",
            ["solve", "{C}/p.json", "--method", "1f1b", "--objective", "spam", "-o", "{O}/s.json"],
            ["--objective", "'spam'", "makespan, span"],
        ),
        Case(
            "solve-objective-span-family",
            ["solve", "{C}/p.json", "--method", "1f1b", "--objective", "span", "-o", "{O}/s.json"],
            ["--objective", "1f1b is a schedule family"],
        ),
        Case(
            "run-synthetic-seed-past-64-bits", ["run", "{C}/s.json", "--model", "synthetic:seed=9223372036854775807"], ["seed", "1000000"]
        ),
        Case("run-synthetic-huge-unit", ["run", "{C}/s.json", "--model", "synthetic:mib_per_unit=1e300"], ["mib_per_unit", "65536"]),
        Case("run-synthetic-huge-width", ["run", "{C}/s.json", "--model", "synthetic:width=100000000"], ["width", "1000000"]),
        Case(
            "profile-synthetic-huge-tensor",
            ["profile", "--model", "synthetic:width=10000,batch_size=10000,problem={C}/p.json", "-p", "2", "-m", "2", "-o", "{O}/pr.json"],
            ["batch_size x width"],
        ),
        Case("run-huge-example-model", ["run", "{C}/s.json", "--model", "example:layers=99999999999999999999999"], ["layers", "1000000"]),
        Case("solve-seed-over-32-bits", ["solve", "{C}/p.json", "--seed", "2147483648", "-o", "{O}/s.json"], ["--seed", "2147483647"]),
        Case(
            "pareto-seed-under-32-bits",
            ["pareto", "{C}/p.json", "--limits", "2:4:1", "--seed", "-2147483649", "-o", "{O}/c.json"],
            ["--seed"],
        ),
        Case(
            "import-output-is-problem",
            ["import", "{C}/s.csv", "--problem", "{C}/p.json", "-o", "{C}/p.json"],
            ["p.json", "is also the input"],
        ),
        Case(
            "import-many-cells",
            ["import", "{C}/many_cells.csv", "--problem", "{C}/p.json", "-o", "{O}/s.json"],
            ["many_cells.csv", "200002 cells is more than a schedule of this problem holds (24 ops"],
        ),
        Case("import-output-is-csv", ["import", "{C}/s.csv", "--problem", "{C}/p.json", "-o", "{C}/s.csv"], ["s.csv", "is also the input"]),
        Case(
            "import-missing-op",
            ["import", "{C}/missing_forward.csv", "--problem", "{C}/p.json", "-o", "{O}/s.json"],
            ["missing_forward.csv", "invalid schedule: missing: F(stage 0, mb 3)"],
            code=1,
        ),
        Case(
            "import-deadlock",
            ["import", "{C}/deadlock.csv", "--problem", "{C}/p.json", "-o", "{O}/s.json"],
            ["deadlock.csv: deadlock: device 0 waits at BW(stage 0, mb 0)"],
            code=1,
        ),
        Case("solve-into-trace-json", ["solve", "{C}/p.json", "--method", "1f1b", "-o", "{O}/s.trace.json"], ["a .trace.json name"]),
        Case("problem-into-modules-json", ["problem", "-p", "2", "-m", "2", "-o", "{O}/p.modules.json"], ["a .modules.json name"]),
        Case("import-into-svg", ["import", "{C}/s.csv", "--problem", "{C}/p.json", "-o", "{O}/s.svg"], ["s.svg", "a .svg name"]),
        Case("export-name-too-long", ["export", "{C}/s.json", "-o", "{O}/" + "a" * 300 + ".svg"], ["a" * 300, "File name too long"]),
        Case("import-fifo", ["import", "{C}/fifo.csv", "--problem", "{C}/p.json", "-o", "{O}/s.json"], ["fifo.csv", "FIFO"]),
        Case("import-folder", ["import", "{C}/folder.json", "--problem", "{C}/p.json", "-o", "{O}/s.json"], ["folder.json", "directory"]),
        Case("import-huge", ["import", "{C}/huge.json", "--problem", "{C}/p.json", "-o", "{O}/s.json"], ["huge.json", "bytes"]),
        Case("import-latin1", ["import", "{C}/latin1.csv", "--problem", "{C}/p.json", "-o", "{O}/s.json"], ["latin1.csv", "UTF-8"]),
        Case(
            "import-long-number",
            ["import", "{C}/long_number.csv", "--problem", "{C}/p.json", "-o", "{O}/s.json"],
            ["long_number.csv", "digits"],
        ),
        Case(
            "import-long-cell",
            ["import", "{C}/long_cell.csv", "--problem", "{C}/p.json", "-o", "{O}/s.json"],
            ["long_cell.csv", "not a CSV"],
        ),
        Case("show-output-unwritable", ["show", "{C}/s.json", "-o", "/proc/pipesched-test.svg"], ["/proc/pipesched-test.svg"]),
        # pareto: a bad plot path leaves the curve file (which exists) untouched
        Case(
            "pareto-plot-folder",
            ["pareto", "{C}/p.json", "--limits", "2", "--time-limit", "1", "-o", "{C}/existing.json", "--plot", "{C}/folder.json"],
            ["directory"],
        ),
        Case(
            "pareto-plot-unwritable",
            ["pareto", "{C}/p.json", "--limits", "2", "--time-limit", "1", "-o", "{C}/existing.json", "--plot", "/proc/x.svg"],
            ["/proc/x.svg"],
        ),
        # validate names the device of an op placed on the wrong one (a violation: exit 1)
        Case(
            "validate-wrong-device",
            ["validate", "{C}/wrong_device.json"],
            ["wrong_device.json", "invalid"],
            code=1,
            stdout_names=["runs on device 0, its stage is on device 1"],
        ),
        # runtime
        Case(
            "run-stage-out-of-range",
            ["run", "{C}/stage_out_of_range.json", "--model", "example"],
            ["stage_out_of_range.json", "out of range"],
        ),
        Case("run-wrong-device", ["run", "{C}/wrong_device.json", "--model", "example"], ["wrong_device.json", "device 0", "device 1"]),
        Case(
            "run-raising-model",
            ["run", "{C}/s.json", "--model", "raising_model:build_stages"],
            ["raising_model:build_stages", "RuntimeError: no weights here"],
        ),
        # Strict JSON on stdout (NaN was written as is) and a diverged loss is an error (exit 0 before).
        Case(
            "run-nan-loss-model",
            ["run", "{C}/s.json", "--model", "nan_model:build_stages", "--steps", "1", "--json"],
            ["loss is nan from step 0", "diverged"],
            code=1,
            stdout_names=['"losses": [null]'],
        ),
        # torch's runtime logged the failed action with its whole schedule (23 lines).
        Case(
            "run-torch-engine-stuck-model",
            ["run", "{C}/s.json", "--model", "stuck_model:build_stages", "--steps", "1", "--engine", "torch", "--timeout", "2"],
            ["rank 0 at torch's action", "Timed out", "rank 1 was stopped after another rank failed, in step 0"],
            code=1,
        ),
        # Rank 1 stuck in its last W, after its last send: rank 0 was reported as the model's
        # error ("Timed out waiting 5000ms for send operation"), with no word of a stuck rank.
        Case(
            "run-stuck-after-last-send-model",
            ["run", "{C}/zbh1.json", "--model", "stuck_w_model:build_stages", "--steps", "1", "--timeout", "2"],
            [
                "rank 0 gathering the results: not every rank arrived, one is stuck in an op or died",
                "rank 1 was stopped after another rank failed, in W(stage 1, mb 3) of step 0",
            ],
            code=1,
        ),
        # The raising rank's report comes first: it is the cause, rank 0's failed transfer its echo.
        Case(
            "run-raising-forward-model",
            ["run", "{C}/s.json", "--model", "raising_forward_model:build_stages", "--steps", "1", "--timeout", "5"],
            ["error: rank 1: model raising_forward_model:build_stages: RuntimeError: boom in forward"],
            code=1,
        ),
        Case("run-syntax-model", ["run", "{C}/s.json", "--model", "syntax_model:build_stages"], ["syntax_model", "SyntaxError"]),
        Case(
            "run-import-model", ["run", "{C}/s.json", "--model", "import_model:build_stages"], ["import_model", "module_that_is_not_there"]
        ),
        Case("run-threads", ["run", "{C}/s.json", "--model", "example", "--threads", "1000"], ["--threads", "1000"]),
        Case("run-engine", ["run", "{C}/s.json", "--model", "example", "--engine", "bogus"], ["--engine", "bogus", "pipesched, torch"]),
        Case("run-tiny-timeout", ["run", "{C}/s.json", "--model", "example", "--timeout", "0.001"], ["--timeout"]),
        Case("run-rank-out-of-range", ["run", "{C}/s.json", "--model", "example"], ["RANK", "5"], env={"RANK": "5", "WORLD_SIZE": "2"}),
        Case(
            "run-bad-world-size", ["run", "{C}/s.json", "--model", "example"], ["WORLD_SIZE", "two"], env={"RANK": "0", "WORLD_SIZE": "two"}
        ),
        Case(
            "run-master-port-text",
            ["run", "{C}/s.json", "--model", "example"],
            ["MASTER_PORT", "'abc' is not an integer"],
            env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "abc"},
        ),
        # torch's C++ code printed 30 lines of frames (two connection attempts) before the
        # one line that says the same.
        Case(
            "run-torchrun-cannot-join",
            ["run", "{C}/s.json", "--model", "example", "--timeout", "1"],
            ["rank 1: cannot join the torchrun job"],
            # an empty level counts as unset: the command must set it, whatever the test process has
            env={
                "RANK": "1",
                "WORLD_SIZE": "2",
                "LOCAL_RANK": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(_unused_port()),
                "TORCH_CPP_LOG_LEVEL": "",
            },
        ),
        # RANK alone was ignored: every rank was started here.
        Case(
            "run-rank-without-world-size", ["run", "{C}/s.json", "--model", "example"], ["RANK: set without WORLD_SIZE"], env={"RANK": "0"}
        ),
        Case(
            "run-local-world-size-zero",
            ["run", "{C}/s.json", "--model", "example"],
            ["LOCAL_WORLD_SIZE", "0 is out of range"],
            env={"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "0"},
        ),
        # Refused before measuring (they were only after it, seconds later).
        Case(
            "profile-memory-limit-zero",
            ["profile", "--model", "example", "-p", "2", "-m", "2", "--memory-limit", "0", "-o", "{O}/p.json"],
            ["--memory-limit", "must be positive"],
        ),
        Case(
            "profile-memory-limit-huge",
            ["profile", "--model", "example", "-p", "2", "-m", "2", "--memory-limit", "1e300", "-o", "{O}/p.json"],
            ["--memory-limit", "at most 1e+12"],
        ),
        Case(
            "profile-tiny-timeout",
            ["profile", "--model", "example", "-p", "2", "-m", "2", "--timeout", "0", "-o", "{O}/p.json"],
            ["--timeout"],
        ),
        # layers files and the split search's options
        Case(
            "run-torch-engine-sliced", ["run", "{C}/sliced.json", "--model", "synthetic", "--engine", "torch"], ["--engine torch", "slices"]
        ),
        Case("solve-output-trailing-slash", ["solve", "{C}/p.json", "--method", "1f1b", "-o", "{O}/s.json/"], ["s.json/", "folder"]),
        Case("export-output-equals-trailing-slash", ["export", "{C}/s.json", "--output={O}/s.csv/"], ["s.csv/", "folder"]),
        Case("solve-output-empty", ["solve", "{C}/p.json", "--method", "1f1b", "-o", ""], ["-o", "empty"]),
        Case("solve-input-empty", ["solve", "", "-o", "{O}/s.json"], ["solve", "empty"]),
        Case("solve-output-equals-empty", ["solve", "{C}/p.json", "--method", "1f1b", "--output="], ["--output", "empty"]),
        Case(
            "profile-synthetic-problem-empty",
            ["profile", "--model", "synthetic:problem=", "-p", "2", "-m", "2", "-o", "{O}/x.json"],
            ["problem=", "file"],
        ),
        Case(
            "solve-layers-placement-empty",
            ["solve", "{C}/l.json", "-p", "2", "-m", "4", "--placement", "", "-o", "{O}/s.json"],
            ["placement"],
        ),
        Case(
            "solve-layers-nan",
            ["solve", "{C}/layers_nan.json", "-p", "2", "-m", "4", "-o", "{O}/s.json"],
            ["layers_nan.json", ".forward: NaN"],
        ),
        Case(
            "solve-layers-duplicate-name",
            ["solve", "{C}/layers_duplicate_name.json", "-p", "2", "-m", "4", "-o", "{O}/s.json"],
            ["layers_duplicate_name.json", "layers.2.name", "is also layer 1's name"],
        ),
        Case(
            "solve-layers-head-first",
            ["solve", "{C}/layers_head_first.json", "-p", "2", "-m", "4", "-o", "{O}/s.json"],
            ["layers_head_first.json", "must come first"],
        ),
        Case(
            "solve-layers-too-many",
            ["solve", "{C}/layers_too_many.json", "-p", "2", "-m", "4", "-o", "{O}/s.json"],
            ["layers_too_many.json", "layers"],
        ),
        Case(
            "solve-layers-zero-time",
            ["solve", "{C}/layers_zero_time.json", "-p", "1", "-m", "4", "-o", "{O}/s.json"],
            ["layers.0.backward_input", "greater than 0"],
        ),
        Case(
            "solve-layers-version-true",
            ["solve", "{C}/layers_version_true.json", "-p", "2", "-m", "4", "-o", "{O}/s.json"],
            ["layers_version_true.json", "version"],
        ),
        Case(
            "solve-layers-memory-limit-negative-zero",
            ["solve", "{C}/l.json", "-p", "2", "-m", "4", "--memory-limit", "-0.0", "-o", "{O}/s.json"],
            ["--memory-limit", "must be positive"],
        ),
        Case("solve-time-limit-just-over", ["solve", "{C}/p.json", "-o", "{O}/s.json", "--time-limit", "1000000.5"], ["got 1000000.5"]),
        Case("solve-layers-no-devices", ["solve", "{C}/l.json", "-o", "{O}/s.json"], ["l.json", "--devices"]),
        Case(
            "solve-layers-many-devices", ["solve", "{C}/l.json", "-p", "100000", "-m", "4", "-o", "{O}/s.json"], ["num_devices", "100000"]
        ),
        Case("solve-layers-million-m", ["solve", "{C}/l.json", "-p", "2", "-m", "1000000", "-o", "{O}/s.json"], ["num_microbatches"]),
        Case("solve-layers-more-stages", ["solve", "{C}/l.json", "-p", "8", "-m", "4", "-o", "{O}/s.json"], ["6 layers", "8 stages"]),
        Case(
            "solve-layers-limit-nan",
            ["solve", "{C}/l.json", "-p", "2", "-m", "4", "--memory-limit", "nan", "-o", "{O}/s.json"],
            ["--memory-limit"],
        ),
        Case(
            "solve-layers-limit-huge",  # it named the split's field memory_limit.0, not the option
            ["solve", "{C}/l.json", "-p", "2", "-m", "4", "--memory-limit", "1e13", "-o", "{O}/s.json"],
            ["--memory-limit", "at most 1e+12"],
        ),
        Case(
            "solve-layers-placement",
            ["solve", "{C}/l.json", "-p", "2", "-m", "4", "--placement", "diagonal", "-o", "{O}/s.json"],
            ["placement"],
        ),
        Case(
            "solve-layers-method", ["solve", "{C}/l.json", "-p", "2", "-m", "4", "--method", "1f1b", "-o", "{O}/s.json"], ["method", "auto"]
        ),
        Case(
            "solve-layers-too-little-memory",
            ["solve", "{C}/l.json", "-p", "2", "-m", "4", "--memory-limit", "1", "-o", "{O}/s.json"],
            ["memory_limit", "the least any split tried needs"],
            code=3,
        ),
        Case("solve-problem-with-devices", ["solve", "{C}/p.json", "-p", "2", "-o", "{O}/s.json"], ["--devices", "only for a layers file"]),
        Case(
            "solve-problem-with-placement",
            ["solve", "{C}/p.json", "--placement", "vshape", "-o", "{O}/s.json"],
            ["--placement", "only for a layers file"],
        ),
        Case(
            "problem-sequence-of-a-trillion-tokens",
            [
                "problem",
                "-p",
                "2",
                "-m",
                "2",
                "--slices",
                "4",
                "--slice-lengths",
                "dp",
                "--sequence-length",
                "1000000000000",
                "-o",
                "{O}/p.json",
            ],
            ["--sequence-length", "16777216"],
        ),
        Case(
            "problem-slice-overhead-huge",
            ["problem", "-p", "2", "-m", "2", "--slices", "3", "--slice-overhead", "4e11", "-o", "{O}/p.json"],
            ["--slice-overhead", "past the problem's bounds"],
        ),
        Case("layers-tflops-nan", ["layers", "--tflops", "nan", "-o", "{O}/l.json"], ["--tflops"]),
        Case("layers-bandwidth-zero", ["layers", "--bandwidth", "0", "-o", "{O}/l.json"], ["--bandwidth: must be positive, got 0"]),
        Case("layers-bandwidth-negative", ["layers", "--bandwidth", "-1", "-o", "{O}/l.json"], ["--bandwidth: must be positive, got -1"]),
        Case("layers-tflops-zero", ["layers", "--tflops", "0", "-o", "{O}/l.json"], ["--tflops: must be positive, got 0"]),
        Case("layers-tflops-tiny", ["layers", "--tflops", "1e-300", "-o", "{O}/l.json"], ["--tflops", "layers.1.forward"]),
        Case("layers-blocks-zero", ["layers", "--blocks", "0", "-o", "{O}/l.json"], ["--blocks"]),
        Case("layers-heads-not-dividing", ["layers", "--heads", "7", "--hidden", "64", "-o", "{O}/l.json"], ["--heads", "--hidden 64"]),
        # The DP's 128 blocks are the limit, not the sequence's tokens.
        Case(
            "problem-dp-slices-over-its-blocks",
            ["problem", "-p", "2", "-m", "4", "--slices", "129", "--slice-lengths", "dp", "-o", "{O}/p.json"],
            ["--slices", "128 blocks"],
        ),
        # A schedule given with a layers file's option is named a schedule, not a problem.
        Case("solve-schedule-with-devices", ["solve", "{C}/s.json", "-p", "2", "-o", "{O}/o.json"], ["--devices", "s.json is a schedule"]),
        # A 100 kB option value was echoed whole: the line is cut after its start.
        Case("solve-method-100kB", ["solve", "{C}/p.json", "--method", "m" * 100_000, "-o", "{O}/s.json"], ["method:", "message cut"]),
        *(
            # one message for the three split formats, with the way to get a split
            Case(
                f"export-{name}-without-split",
                ["export", "{C}/s.json", "--format", name, "-o", "{O}/x.txt"],
                [f"format: {name} needs the layer split; stage 0 lists no layers (solve a layers file"],
            )
            for name in ("megatron-layout", "torchtitan-modules", "example-split")
        ),
        Case(
            "profile-per-layer-two-ranks",
            ["profile", "--model", "example", "-p", "2", "-m", "2", "--per-layer", "-o", "{O}/l.json"],
            ["--per-layer", "-p 1"],
        ),
        Case(
            "profile-output-is-its-models-problem",
            ["profile", "--model", "synthetic:problem={C}/p.json", "-p", "2", "-m", "2", "-o", "{C}/p.json"],
            ["p.json", "is also the input"],
        ),
        Case(
            "profile-steps-huge",
            ["profile", "--model", "synthetic:problem={C}/p.json", "-p", "2", "-m", "2", "--steps", "99999999999", "-o", "{O}/x.json"],
            ["--steps"],
        ),
        Case("profile-many-devices", ["profile", "--model", "example", "-p", "100000", "-m", "2", "-o", "{O}/p.json"], ["num_devices"]),
        Case("profile-output-folder", ["profile", "--model", "example", "-p", "2", "-m", "2", "-o", "{C}/folder.json"], ["directory"]),
        Case(
            "profile-raising-model",
            ["profile", "--model", "raising_model:build_stages", "-p", "2", "-m", "2", "-o", "{O}/p.json"],
            ["raising_model"],
        ),
    ]
    return found


CASES = cases()


# One process running many cases through the console entry, each with its own stderr.
BATCH_DRIVER = """
import contextlib, io, json, sys, time
from optimizer.cli import run_app
from runtime.cli import app

results = []
for args in json.load(sys.stdin):
    err, out = io.StringIO(), io.StringIO()
    began = time.monotonic()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = run_app(app, args)
    results.append([code, out.getvalue(), err.getvalue(), time.monotonic() - began])
print(json.dumps(results))
"""
BATCHES = 3


def _loads_a_user_model(case: Case) -> bool:
    # torch loads and a rank server starts: these share one process of their own, so that
    # they load torch once, not next to each other.
    return any(arg.endswith("_model:build_stages") for arg in case.args)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple]:
    """Run every case once; the corpus must be unchanged after all of them."""
    corpus = tmp_path_factory.mktemp("corpus")
    write_corpus(corpus)
    before = snapshot(corpus)
    folders = {case.name: tmp_path_factory.mktemp("out") for case in CASES}

    def argv(case: Case) -> list[str]:
        return [a.replace("{C}", str(corpus)).replace("{O}", str(folders[case.name])) for a in case.args]

    def alone(case: Case) -> dict[str, tuple]:
        result, seconds = run_cli(argv(case), corpus, case.env)
        return {case.name: (result.returncode, result.stdout, result.stderr, seconds)}

    def batch(cases: list[Case]) -> dict[str, tuple]:
        environment = {**os.environ, "PYTHONPATH": str(ROOT), **NO_BYTECODE}
        result = subprocess.run(
            [sys.executable, "-c", BATCH_DRIVER],
            input=json.dumps([argv(c) for c in cases]),
            cwd=corpus,
            env=environment,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_SECONDS * len(cases),
        )
        assert result.returncode == 0, result.stderr
        return {c.name: tuple(r) for c, r in zip(cases, json.loads(result.stdout.splitlines()[-1]))}

    shared = [c for c in CASES if not c.env and not _loads_a_user_model(c)]
    models = [c for c in CASES if not c.env and _loads_a_user_model(c)]
    jobs = [(batch, shared[k::BATCHES]) for k in range(BATCHES)] + [(batch, models)] + [(alone, c) for c in CASES if c.env]
    results: dict[str, tuple] = {}
    with ThreadPoolExecutor(max_workers=3) as pool:
        for found in pool.map(lambda job: job[0](job[1]), jobs):
            results.update(found)
    assert snapshot(corpus) == before, "a hostile case created or changed a file in the corpus"
    return {name: (*found, snapshot(folders[name])) for name, found in results.items()}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_case_gets_one_line_and_writes_nothing(case: Case, outcomes) -> None:
    code, stdout, stderr, seconds, written = outcomes[case.name]
    lines = stderr.strip().splitlines()
    assert code == case.code, stderr
    assert len(lines) == 1, stderr
    assert len(lines[0]) <= MAX_MESSAGE + 100, lines[0][:200]  # "error: " and the cut's note
    assert "Traceback" not in stderr
    for name in case.names:
        assert name in lines[0], lines[0]
    for name in case.stdout_names:
        assert name in stdout, stdout
    assert written == {}, f"{case.name} wrote {sorted(written)}"
    assert seconds < HANG_GUARD_SECONDS


# ---------------------------------------------------------------------------- output files


def test_names_on_success_lines_are_escaped_as_on_error_lines(tmp_path) -> None:
    # A file name holding a terminal escape was printed raw by "wrote ..." and "valid" lines.
    name = "red\x1b[31mname.json"
    wrote, _ = run_cli(["problem", "-p", "2", "-m", "4", "-o", name], tmp_path)
    assert wrote.returncode == 0, wrote.stderr
    solved, _ = run_cli(["solve", name, "--method", "1f1b", "-o", "s\x1b[2J.json"], tmp_path)
    valid, _ = run_cli(["validate", "s\x1b[2J.json"], tmp_path)
    assert solved.returncode == 0 and valid.returncode == 0, solved.stderr + valid.stderr
    for result in (wrote, solved, valid):
        assert "\x1b" not in result.stdout + result.stderr
    assert "red\\x1b[31mname.json" in wrote.stdout and "s\\x1b[2J.json: valid" in valid.stdout


def test_outputs_keep_mode_honour_umask_and_write_through_devices(tmp_path) -> None:
    existing = tmp_path / "kept.json"
    existing.write_text("{}")
    os.chmod(existing, 0o640)
    result, _ = run_cli(["problem", "-p", "2", "-m", "4", "-o", str(existing)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640
    previous = os.umask(0o027)
    try:
        result, _ = run_cli(["problem", "-p", "2", "-m", "4", "-o", str(tmp_path / "new.json")], tmp_path)
    finally:
        os.umask(previous)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640  # 0666 & ~027
    result, _ = run_cli(["solve", "new.json", "--method", "1f1b", "-o", "/dev/null"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json", "new.json"]  # no temporary file left


def test_a_name_up_to_the_longest_a_folder_takes_is_written_and_a_read_only_file_is_kept(tmp_path) -> None:
    # 251 characters and ".svg": the longest name a folder takes (255 bytes). The file is
    # written through a temporary file whose name is cut to fit beside it.
    longest = "a" * 251 + ".svg"
    result, _ = run_cli(["problem", "-p", "2", "-m", "4", "-o", "p.json"], tmp_path)
    assert result.returncode == 0, result.stderr
    result, _ = run_cli(["solve", "p.json", "--method", "1f1b", "-o", "s.json"], tmp_path)
    assert result.returncode == 0, result.stderr
    result, _ = run_cli(["export", "s.json", "-o", longest], tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / longest).read_text().startswith("<svg")
    # A file without its owner's write bit is refused, by root too (whom access() lets
    # write anything), and kept as it was.
    kept = tmp_path / "kept.svg"
    kept.write_text("mine")
    os.chmod(kept, 0o444)
    result, _ = run_cli(["export", "s.json", "-o", "kept.svg"], tmp_path)
    assert result.returncode == 2 and "kept.svg: is read-only" in result.stderr, result.stderr
    assert kept.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["p.json", "s.json", longest, "kept.svg"])  # no temporary file left


# --------------------------------------------------------------------------- size contract


def test_size_contract_at_the_limit_and_just_over(tmp_path) -> None:
    m = MAX_OPS // 24  # p = 8, linear: 3 * 8 * m ops
    assert 3 * 8 * m <= MAX_OPS < 3 * 8 * (m + 1) and m + 1 <= MAX_MICROBATCHES
    result, _ = run_cli(["problem", "-p", "8", "-m", str(m), "-o", "at.json"], tmp_path)
    assert result.returncode == 0, result.stderr
    result, _ = run_cli(["solve", "at.json", "--method", "1f1b", "-o", "s.json"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(load_schedule(tmp_path / "s.json").order()[0]) == 2 * m  # F and BW per microbatch; validated on load
    over = [
        (["-p", "8", "-m", str(m + 1)], f"= {24 * (m + 1)} ops is more than the {MAX_OPS}"),
        (["-p", str(MAX_DEVICES + 1), "-m", "1"], f"{MAX_DEVICES + 1} is more than the {MAX_DEVICES}"),
        (["-p", "1", "-m", str(MAX_MICROBATCHES + 1)], f"{MAX_MICROBATCHES + 1} is more than the {MAX_MICROBATCHES}"),
        (["-p", "1", "-m", "1", "--placement", f"interleaved:{MAX_STAGES + 1}"], f"more than the {MAX_STAGES} stages"),
    ]
    for options, says in over:
        result, _ = run_cli(["problem", *options, "-o", "over.json"], tmp_path)
        assert result.returncode == 2 and says in result.stderr, (options, result.stderr)
    assert not (tmp_path / "over.json").exists()


# ------------------------------------------------------------------------------ interrupts


def hard_problem(folder: Path, microbatches: int = 40) -> Path:
    """Heterogeneous times under a tight limit: the solvers do not close it within seconds
    (480 ops: `auto` leaves 8.5% open at 8 s; at m = 12, 144 ops, it proves the optimum in
    0.4 s, where the whole MILP leaves 7.7% at 8 s)."""
    path = folder / "hard.json"
    problem = uniform_problem(4, microbatches, 1.0, 1.3, 0.7, comm_time=0.05, memory_limit=3.0)
    path.write_text(json.dumps(problem.model_dump(mode="json")))
    return path


def session_processes(session: int, zombies: bool = False) -> list[str]:
    """Live processes of a session, as "pid command" (and ended ones not yet reaped, with `zombies`)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if int(fields[3]) == session and (zombies or fields[0] != "Z"):
            found.append(f"{entry.name} {command[:80]}")
    return found


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def _default_sigint() -> None:
    # A test run started in the background of a non-interactive shell ignores SIGINT (a
    # test worker process may ignore SIGHUP), and an ignored signal is inherited: the CLI
    # would never see the signal sent to it, where a terminal's job does.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def start(args: list[str], cwd: Path, tmp: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    # Its own session, like a terminal's job: Ctrl-C is sent to the whole process group.
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp), **(env or {})}
    return subprocess.Popen(
        CLI + args,
        cwd=cwd,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_default_sigint,
    )


@contextlib.contextmanager
def ended_session(process: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """The process, and at the end every process of its session killed: a test that fails
    must not leave a run training on for good (its ranks share the session)."""
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=HANG_GUARD_SECONDS)


def interrupt(process: subprocess.Popen) -> tuple[str, str]:
    os.killpg(process.pid, signal.SIGINT)
    return process.communicate(timeout=HANG_GUARD_SECONDS)


def test_ctrl_c_during_cbc_kills_it_and_removes_its_files(tmp_path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # The whole MILP takes up to 400 ops: 144 here.
    process = start(
        ["solve", str(hard_problem(tmp_path, microbatches=12)), "--method", "milp", "--time-limit", "60", "-q", "-o", "s.json"],
        tmp_path,
        tmp,
    )
    # Interrupt while CBC runs: wait until the solver process exists.
    assert wait_for(lambda: any("cbc" in line for line in session_processes(process.pid)), 30), "CBC never started"
    _, err = interrupt(process)
    assert process.returncode == 130, err
    assert "Traceback" not in err
    # The session's processes are gone (the CBC child included); only our tmp was used.
    assert wait_for(lambda: not session_processes(process.pid), 5), session_processes(process.pid)
    assert list(tmp.iterdir()) == []
    assert load_schedule(tmp_path / "s.json").makespan > 0  # the best so far, valid (checked on load)


@pytest.mark.parametrize("delay", [0.3, 1.0, 2.0])
def test_ctrl_c_early_in_solve_is_not_swallowed(tmp_path, delay: float) -> None:
    process = start(["solve", str(hard_problem(tmp_path)), "--time-limit", "60", "-q", "-o", "s.json"], tmp_path, tmp_path)
    time.sleep(delay)
    began = time.monotonic()
    _, err = interrupt(process)
    # Swallowed, the solve would run on for its 60 s; honoured, it stops at once (the
    # guard is generous for a loaded machine).
    assert time.monotonic() - began < 10, err
    assert process.returncode == 130, err
    assert "Traceback" not in err
    if (tmp_path / "s.json").exists():  # interrupted after the first schedule: it is valid
        load_schedule(tmp_path / "s.json")


@pytest.mark.slow
def test_ctrl_c_while_a_layers_solve_loads_the_solver_is_not_an_import_error(tmp_path) -> None:
    # A layers file loads the split search (OR-Tools, pandas) after the command starts:
    # interrupted there, an import failed with a traceback (exit 1; at 0.40-0.42 s on this
    # machine) or the interrupt was swallowed. The moment depends on the machine: a sweep.
    layers_file = tmp_path / "l.json"
    made, _ = run_cli(["layers", "--blocks", "32", "-o", str(layers_file)], tmp_path)
    assert made.returncode == 0, made.stderr
    args = ["solve", str(layers_file), "-p", "8", "-m", "32", "--placement", "vshape", "--memory-limit", "60"]
    for step in range(16):
        delay = 0.30 + 0.02 * step
        process = start([*args, "--time-limit", "30", "-q", "-o", "s.json"], tmp_path, tmp_path)
        time.sleep(delay)
        began = time.monotonic()
        _, err = interrupt(process)
        assert time.monotonic() - began < 10, (delay, err)
        assert process.returncode == 130, (delay, err)
        assert "Traceback" not in err and "ImportError" not in err, (delay, err)


def test_ctrl_c_during_pareto_writes_the_points_so_far(tmp_path) -> None:
    process = start(
        ["pareto", str(hard_problem(tmp_path)), "--limits", "3:8:1", "--time-limit", "3", "-o", "c.json", "--plot", "c.svg"],
        tmp_path,
        tmp_path,
    )
    assert process.stderr is not None
    first = process.stderr.readline()  # "limit 3: ..." once the first limit is solved
    assert first.startswith("limit 3"), first
    _, err = interrupt(process)
    assert process.returncode == 130, err
    assert "Traceback" not in err
    curve = json.loads((tmp_path / "c.json").read_text())
    assert curve["interrupted"] is True
    assert 1 <= len(curve["points"]) < 6
    assert curve["points"][0]["limit"] == 3 and curve["points"][0]["feasible"]
    assert (tmp_path / "c.svg").read_text().lstrip().startswith("<?xml")


def _rank_server_processes(session: int) -> int:
    """The rank server and the ranks it forked (they share its command line)."""
    return sum("multiprocessing.forkserver" in line for line in session_processes(session))


@pytest.mark.parametrize("moment", ["while the rank server starts", "while the ranks run"])
def test_ctrl_c_during_run_exits_130_without_traceback(tmp_path, moment) -> None:
    # While the server starts (importing torch), the launcher may be waiting for it to fork
    # a rank: that rank must not be left running. Later, the ranks are stopped mid-step.
    save_schedule(generate(uniform_problem(2, 4), "1f1b"), tmp_path / "s.json")
    with ended_session(start(["run", "s.json", "--model", "example", "--steps", "100000"], tmp_path, tmp_path)) as process:
        wanted = 1 if moment == "while the rank server starts" else 3  # the server, then it and 2 ranks
        assert wait_for(lambda: _rank_server_processes(process.pid) >= wanted, 30), session_processes(process.pid)
        _, err = interrupt(process)
        assert process.returncode == 130, err
        assert err.strip() == "interrupted"
        # The rank server may still be importing torch when Ctrl-C comes (deaf to its parent
        # then, for up to about two seconds): the command stops and reaps it, and the resource
        # tracker, before it exits. Nothing of it is left, not even for the host's init to reap.
        assert not session_processes(process.pid, zombies=True)


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_a_termination_signal_to_run_alone_stops_its_ranks(tmp_path, name) -> None:
    # `timeout`, a job manager or a closed terminal signal the command's own process, not
    # its process group: left at their default, SIGTERM and SIGHUP ended the launcher at
    # once and its ranks trained on, for good. They now end it as Ctrl-C does.
    save_schedule(generate(uniform_problem(2, 4), "1f1b"), tmp_path / "s.json")
    with ended_session(start(["run", "s.json", "--model", "example", "--steps", "100000"], tmp_path, tmp_path)) as process:
        assert wait_for(lambda: _rank_server_processes(process.pid) >= 3, 30), session_processes(process.pid)
        signum = getattr(signal, name)
        os.kill(process.pid, signum)
        _, err = process.communicate(timeout=HANG_GUARD_SECONDS)
        assert process.returncode == 128 + signum, err  # as a shell reports a process the signal ended
        assert err.strip() == "interrupted"
        assert not session_processes(process.pid, zombies=True)


def test_a_torchrun_rank_keeps_sigterms_default(tmp_path) -> None:
    # torchrun stops its workers with SIGTERM (SIGKILL 30 s later). Handled as Ctrl-C, it
    # would reach a rank blocked in a transfer or at the rendezvous only when the wait
    # ends: here rank 0 of 2 waits for a rank 1 that never comes (up to --timeout).
    save_schedule(generate(uniform_problem(2, 4), "1f1b"), tmp_path / "s.json")
    with socket.socket() as probe:  # a free port, nobody listening on it but rank 0
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    with ended_session(start(["run", "s.json", "--model", "example", "--timeout", "120"], tmp_path, tmp_path, torchrun)) as process:
        time.sleep(3)  # past the imports, waiting at the rendezvous
        assert process.poll() is None
        began = time.monotonic()
        os.kill(process.pid, signal.SIGTERM)
        process.communicate(timeout=HANG_GUARD_SECONDS)
        assert process.returncode == -signal.SIGTERM
        assert time.monotonic() - began < 10


def test_a_temporary_folder_too_long_for_the_rank_servers_socket_is_one_line(tmp_path) -> None:
    # multiprocessing's server socket lives under TMPDIR; past 107 bytes it failed with a
    # traceback from inside multiprocessing.
    save_schedule(generate(uniform_problem(2, 2), "1f1b"), tmp_path / "s.json")
    long = tmp_path / ("x" * 60) / ("y" * 60)
    long.mkdir(parents=True)
    result, _ = run_cli(["run", "s.json", "--model", "example", "--steps", "1"], tmp_path, {"TMPDIR": str(long)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: TMPDIR: ") and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "set TMPDIR to a shorter folder" in result.stderr


def test_ranks_end_with_a_launcher_killed_outright(tmp_path) -> None:
    # kill -9 (or the out-of-memory killer) leaves the launcher no chance to stop its ranks,
    # and the rank server lives on while they hold its pipe: each rank watches the launcher.
    save_schedule(generate(uniform_problem(2, 4), "1f1b"), tmp_path / "s.json")
    # A folder of its own for the launcher's temporary files, on a short path: the rank
    # server's socket lives there, and a socket's path has at most 107 bytes.
    with tempfile.TemporaryDirectory(prefix="ps-") as temporary:
        _run_and_kill_the_launcher(tmp_path, Path(temporary))


def _run_and_kill_the_launcher(tmp_path: Path, temporary: Path) -> None:
    with ended_session(start(["run", "s.json", "--model", "example", "--steps", "100000"], tmp_path, temporary)) as process:
        assert wait_for(lambda: _rank_server_processes(process.pid) >= 3, 30), session_processes(process.pid)
        assert [p.name for p in temporary.glob("pipesched-*")], "the launcher's results folder"
        os.kill(process.pid, signal.SIGKILL)
        process.communicate(timeout=HANG_GUARD_SECONDS)  # returns once the ranks (holding its pipes) are gone
        assert process.returncode == -signal.SIGKILL
        # The ranks end at once; the server and the resource tracker once they see them gone.
        assert wait_for(lambda: not session_processes(process.pid), 10), session_processes(process.pid)
        # and the ranks removed the results folder the launcher could not
        assert not list(temporary.glob("pipesched-*")), list(temporary.iterdir())


def test_the_fluid_bound_worker_ends_with_a_solve_killed_outright(tmp_path) -> None:
    # Over 600 ops `auto` proves its fluid bound in a worker process beside the search
    # (optimizer.exact.fluidbound): a solve killed outright cannot stop it, and it went on
    # for the rest of the time limit. It now ends with the solve and removes its folder.
    problem = uniform_problem(8, 32, 1.0, 1.0, 0.6, comm_time=0.03, placement="vshape", memory_limit=4.0)
    (tmp_path / "v.json").write_text(json.dumps(problem.model_dump(mode="json")))
    with ended_session(start(["solve", "v.json", "--time-limit", "120", "-q", "-o", "s.json"], tmp_path, tmp_path)) as process:
        workers: list[str] = []

        def worker_started() -> bool:
            workers[:] = [line for line in session_processes(process.pid) if "optimizer.exact.fluidbound" in line]
            return bool(workers)

        assert wait_for(worker_started, 60), session_processes(process.pid)
        arguments = Path(f"/proc/{workers[0].split()[0]}/cmdline").read_bytes().split(b"\0")
        folder = Path(arguments[3].decode()).parent  # python -m optimizer.exact.fluidbound PROBLEM.json ...
        assert folder.is_dir()
        os.kill(process.pid, signal.SIGKILL)
        process.communicate(timeout=HANG_GUARD_SECONDS)
        assert wait_for(lambda: not session_processes(process.pid), 10), session_processes(process.pid)
        assert not folder.exists()


def _processes_mentioning(text: str) -> list[tuple[int, list[str]]]:
    """(pid, arguments) of the live processes whose command line holds `text`."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            arguments = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(text in argument for argument in arguments):
            found.append((int(entry.name), arguments))
    return found


def test_the_highs_worker_ends_with_a_solve_killed_outright(tmp_path) -> None:
    # HiGHS runs in a worker of its own session (a terminal's Ctrl-C reaches the solve,
    # which stops it); a solve killed outright left it running to its time limit.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    problem = hard_problem(tmp_path, microbatches=12)
    arguments = ["solve", str(problem), "--method", "milp", "--solver", "highs", "--time-limit", "120", "-q", "-o", "s.json"]
    with ended_session(start(arguments, tmp_path, tmp)) as process:
        workers: list[tuple[int, list[str]]] = []

        def worker_started() -> bool:
            workers[:] = [w for w in _processes_mentioning(str(tmp)) if any(a.endswith("highs_worker.py") for a in w[1])]
            return bool(workers)

        assert wait_for(worker_started, 60), "the HiGHS worker never started"
        _, worker_arguments = workers[0]
        folder = Path(worker_arguments[2]).parent  # python highs_worker.py MODEL.mps START.json OUT.json
        os.kill(process.pid, signal.SIGKILL)
        process.communicate(timeout=HANG_GUARD_SECONDS)
        assert wait_for(lambda: not _processes_mentioning(str(tmp)), 10), _processes_mentioning(str(tmp))
        assert not folder.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CBC is watched through Linux's parent-death signal")
def test_cbc_ends_with_a_solve_killed_outright(tmp_path) -> None:
    # PuLP starts CBC as a program of its own; a solve killed outright left it running to
    # its time limit and its folder (the model) behind.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    problem = hard_problem(tmp_path, microbatches=12)
    arguments = ["solve", str(problem), "--method", "milp", "--time-limit", "120", "-q", "-o", "s.json"]
    with ended_session(start(arguments, tmp_path, tmp)) as process:
        solvers: list[tuple[int, list[str]]] = []

        def cbc_started() -> bool:
            solvers[:] = [w for w in _processes_mentioning(str(tmp)) if Path(w[1][0]).name == "cbc"]
            return bool(solvers)

        assert wait_for(cbc_started, 60), "CBC never started"
        folder = next(Path(a).parent for a in solvers[0][1] if a.endswith(".mps"))
        os.kill(process.pid, signal.SIGKILL)
        process.communicate(timeout=HANG_GUARD_SECONDS)
        assert wait_for(lambda: not _processes_mentioning(str(tmp)), 10), _processes_mentioning(str(tmp))
        assert not folder.exists()


# Sends the signal while the commands' modules load (at typer's import, after the entry's
# first lines), where Python's default action would end the process without a word.
SIGNAL_WHILE_LOADING = """
import importlib.abc, os, signal, sys
# At its default, as in a terminal: a test run under nohup (or by a harness that ignores
# it) would otherwise hand down an ignored signal, which the command rightly keeps ignored.
signal.signal(int(os.environ["SIGNAL_WHILE_LOADING"]), signal.SIG_DFL if int(os.environ["SIGNAL_WHILE_LOADING"]) != signal.SIGINT else signal.default_int_handler)
class Signal(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "typer":
            os.kill(os.getpid(), int(os.environ["SIGNAL_WHILE_LOADING"]))
        return None
sys.meta_path.insert(0, Signal())
from runtime.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("received", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_the_commands_load_ends_as_ctrl_c_does(tmp_path, received) -> None:
    (tmp_path / "p.json").write_text(json.dumps(uniform_problem(4, 8).model_dump(mode="json")))
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "SIGNAL_WHILE_LOADING": str(int(received))}
    environment.pop("RANK", None)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            SIGNAL_WHILE_LOADING,
            "solve",
            str(tmp_path / "p.json"),
            "--time-limit",
            "30",
            "-o",
            str(tmp_path / "s.json"),
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )
    assert result.returncode == 128 + int(received), result.stderr
    assert result.stderr.strip() == "interrupted"
    assert not (tmp_path / "s.json").exists()


def test_sigterm_during_solve_writes_the_best_schedule_so_far(tmp_path) -> None:
    with ended_session(start(["solve", str(hard_problem(tmp_path)), "--time-limit", "60", "-o", "s.json"], tmp_path, tmp_path)) as process:
        assert process.stderr is not None
        # Once the progress line (one line per report off a terminal) shows a first schedule.
        assert wait_for(lambda: re.search(r"incumbent [0-9]", process.stderr.readline()) is not None, 30)
        os.kill(process.pid, signal.SIGTERM)
        _, err = process.communicate(timeout=HANG_GUARD_SECONDS)
        assert process.returncode == 143, err
        assert "Traceback" not in err and "interrupted" in err
        schedule = load_schedule(tmp_path / "s.json")  # valid: loading validates it
        assert schedule.metrics.makespan > 0
        assert not session_processes(process.pid, zombies=True)


def test_a_full_standard_output_is_one_line_not_a_traceback(tmp_path) -> None:
    good = uniform_problem(2, 4)
    (tmp_path / "p.json").write_text(json.dumps(good.model_dump(mode="json")))
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            CLI + ["solve", str(tmp_path / "p.json"), "--method", "1f1b", "-o", str(tmp_path / "s.json")],
            env=environment,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=HANG_GUARD_SECONDS,
        )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == ["error: standard output: No space left on device"]


@pytest.mark.parametrize(
    "command, expected",
    [
        (["export", "{s}", "--format", "torch-csv", "-o", "/dev/stdout"], lambda s: torch_csv.export_csv(s)),
        (["export", "{s}", "--format", "schedule-json", "-o", "/dev/stdout"], lambda s: schedule_json.write(s)),
    ],
)
def test_an_output_to_standard_output_through_a_pipe_gets_the_file_alone(tmp_path, command, expected) -> None:
    # /dev/stdout on a pipe points at "pipe:[...]", which no path names: it was refused
    # ("cannot write in /dev"); and the report line would have been mixed into the file.
    problem = uniform_problem(2, 4)
    schedule = generate(problem, "1f1b")
    save_schedule(schedule, tmp_path / "s.json")
    args = [a.replace("{s}", str(tmp_path / "s.json")) for a in command]
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(CLI + args, env=environment, capture_output=True, text=True, timeout=HANG_GUARD_SECONDS)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected(load_schedule(tmp_path / "s.json"))
    assert "wrote /dev/stdout" in result.stderr


@pytest.mark.parametrize("name", ["/dev/stdout", "/dev/fd/1"])
def test_an_output_to_a_redirected_standard_output_goes_where_the_descriptor_is(tmp_path, name) -> None:
    # `{ echo header; pipesched export ... -o /dev/stdout; echo footer; } > out.txt`: the
    # name was resolved to out.txt and out.txt replaced, losing the header and the footer;
    # a second such command in the same redirect then replaced /dev/stdout itself (it
    # named a deleted file; not repeated here, where a regression would do it to this
    # machine). The file is written into the descriptor, at its offset.
    problem = uniform_problem(2, 4)
    save_schedule(generate(problem, "1f1b"), tmp_path / "s.json")
    out = tmp_path / "out.txt"
    out.write_text("header\n")
    args = ["export", str(tmp_path / "s.json"), "--format", "torch-csv", "-o", name]
    with open(out, "a") as handle:
        result = subprocess.run(
            CLI + args,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=handle,
            stderr=subprocess.PIPE,
            text=True,
            timeout=HANG_GUARD_SECONDS,
        )
        handle.write("footer\n")
    assert result.returncode == 0, result.stderr
    assert out.read_text() == "header\n" + torch_csv.export_csv(load_schedule(tmp_path / "s.json")) + "footer\n"


def test_a_closed_standard_output_is_one_line_and_nothing_is_written(tmp_path) -> None:
    # Started with `>&-`: Python would drop every print, and a file opened later could
    # take descriptor 1; so the command refuses before any work.
    (tmp_path / "p.json").write_text(json.dumps(uniform_problem(2, 4).model_dump(mode="json")))
    result = subprocess.run(
        CLI + ["solve", str(tmp_path / "p.json"), "--method", "1f1b", "-o", str(tmp_path / "s.json")],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
        timeout=HANG_GUARD_SECONDS,
        preexec_fn=lambda: os.close(1),
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == ["error: standard output: closed"]
    assert not (tmp_path / "s.json").exists()


def test_names_read_from_a_schedule_reach_the_terminal_escaped(tmp_path) -> None:
    # A method name holding an escape sequence and a newline: one line, nothing raw.
    schedule = generate(uniform_problem(2, 4), "1f1b")
    schedule.method = "evil\x1b[31mred\nsecond line"
    save_schedule(schedule, tmp_path / "s.json")
    result, _ = run_cli(["validate", str(tmp_path / "s.json")], tmp_path)
    assert result.returncode == 0
    assert "\x1b" not in result.stdout and len(result.stdout.strip().splitlines()) == 1
    assert "method evil\\x1b[31mred\\nsecond line" in result.stdout


def test_a_terminal_device_without_a_terminal_is_not_called_a_fifo(tmp_path) -> None:
    # Without a controlling terminal, /dev/tty fails to open with ENXIO, as a FIFO without a
    # reader does: the message said "a FIFO".
    (tmp_path / "p.json").write_text(json.dumps(uniform_problem(2, 4).model_dump(mode="json")))
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **NO_BYTECODE}
    result = subprocess.run(
        [*CLI, "solve", "p.json", "--method", "1f1b", "-o", "/dev/tty"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # no controlling terminal
    )
    assert result.returncode == 2, result.stderr
    assert "/dev/tty: no device behind it" in result.stderr and "FIFO" not in result.stderr


def _plain_environment(**extra: str) -> dict[str, str]:
    """This environment outside any torchrun job, pipesched importable, with `extra`."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
    for name in ("RANK", "WORLD_SIZE"):
        if name not in extra:
            environment.pop(name, None)
    return environment


TEARDOWN_SEEN = """
import atexit, sys
atexit.register(lambda: print("interpreter teardown ran"))
from runtime.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("torchrun", [False, True])
def test_a_torchrun_rank_ends_without_the_interpreters_teardown(tmp_path, torchrun) -> None:
    """torch's process-group teardown at interpreter exit aborts now and then (SIGABRT after
    a successful run, about 1 in 10 on gloo) and torchrun then reports the job failed: a
    torchrun rank ends at once, its output flushed and its exit status kept, as the ranks
    of pipesched's own launcher do. Outside torchrun the command ends as usual."""
    environment = _plain_environment(**({"RANK": "0", "WORLD_SIZE": "1"} if torchrun else {}))

    def problem(devices: str, output: Path) -> subprocess.CompletedProcess:
        command = [sys.executable, "-c", TEARDOWN_SEEN, "problem", "-p", devices, "-m", "2", "-o", str(output)]
        return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)

    wrote = problem("2", tmp_path / "p.json")
    assert wrote.returncode == 0 and "wrote" in wrote.stdout
    assert ("interpreter teardown ran" in wrote.stdout) is not torchrun
    refused = problem("0", tmp_path / "q.json")
    assert refused.returncode == 2 and refused.stderr.startswith("error:")  # the exit status and the message kept


THREAD_MASKS = """
import os, signal
import runtime.cli
bit = 1 << (signal.SIGINT - 1)
for task in sorted(os.listdir("/proc/self/task")):
    status = open(f"/proc/self/task/{task}/status").read()
    blocked = int(next(line for line in status.splitlines() if line.startswith("SigBlk")).split()[1], 16)
    print("main" if int(task) == os.getpid() else "other", bool(blocked & bit))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the threads' signal masks from Linux's /proc")
def test_threads_started_while_the_commands_load_keep_ctrl_c_blocked() -> None:
    """Ctrl-C must reach the main thread: where the rank server starts it is ignored for a
    few milliseconds and held pending there, and a thread of numpy's pool taking it instead
    dropped it. The commands block it while they load (those threads inherit that) and
    unblock it on the main thread."""
    # numpy's BLAS starts one pool thread per core beyond the first: two, whatever the machine.
    result = subprocess.run(
        [sys.executable, "-c", THREAD_MASKS], env=_plain_environment(OPENBLAS_NUM_THREADS="2"), capture_output=True, text=True, timeout=120
    )
    lines = result.stdout.split("\n")
    assert result.returncode == 0 and "main False" in lines, result.stderr
    others = [line for line in lines if line.startswith("other")]
    assert others and all(line == "other True" for line in others)


def test_a_signal_after_the_console_ends_keeps_its_status(tmp_path) -> None:
    # Python's shutdown puts SIGINT back to its default and unloads the modules (about
    # 0.1 s): a Ctrl-C then killed the process by SIGINT (-2 to a parent) after the command
    # had decided its status. Before that it waits for threads still running (a user
    # model's), where a signal must still end it: with the decided status.
    script = (
        "import threading, time, sys\n"
        f"sys.argv = ['pipesched', 'problem', '-p', '2', '-m', '2', '-o', {str(tmp_path / 'p.json')!r}]\n"
        "from runtime.cli import _console\n"
        "code = _console()\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()  # keeps the shutdown waiting\n"
        "print('ended', code, flush=True)\n"
        "sys.exit(code)\n"
    )
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **NO_BYTECODE}
    process = subprocess.Popen([sys.executable, "-c", script], env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("wrote ")  # the command's own line
        assert process.stdout.readline().strip() == "ended 0"
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=10)  # a lost or ignored signal waits 60 s
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err

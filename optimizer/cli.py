"""The `pipesched` command line (typer): problem, solve, pareto, compare, validate, show.

Every command turns a PipeschedError into one line on stderr and its exit code (2 for
bad input), checks its output paths before any work and writes its outputs atomically
(optimizer/io.py); `run_app` does the same for option errors and Ctrl-C (exit 130). The
runtime adds `run` and `profile` to this same app (runtime/cli.py), so the optimizer
never imports torch.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from optimizer.errors import InputError, PipeschedError
from optimizer.exact.options import MAX_THREADS, MAX_TIME_LIMIT, OBJECTIVES, SEED_RANGE
from optimizer.formats.choose import choose_format, refuse_other_format
from optimizer.formats.schedule_json import load_schedule, save_schedule
from optimizer.interrupts import interrupts_deferred, terminations_as_interrupts
from optimizer.io import (
    check_input_file,
    check_outputs,
    one_line,
    printable,
    read_input_text,
    write_json_atomic,
    write_outputs,
    writes_stdout,
)
from optimizer.problem import MAX_VALUE, Problem, load_problem, problem_from_json, tolerant, uniform_problem
from optimizer.schedule import Schedule, metrics_summary

if TYPE_CHECKING:
    from rich.console import JustifyMethod
    from rich.live import Live

    from optimizer.exact.options import Progress
    from optimizer.starts import Start

app = typer.Typer(
    name="pipesched",
    help="Pipeline-parallel schedule optimizer: build, solve, compare, check, draw and run schedules.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help (click's): it wraps every column to the terminal's width; the boxed one cut
    # long option names to fit its columns at 80 ("--mem-backward-weig…").
    rich_markup_mode=None,
)

Command = TypeVar("Command", bound=Callable)


def families_epilog() -> str:
    """The schedule families with one line each, for the help of `solve` and `compare`."""
    from optimizer.schedules import GENERATORS

    lines = [f"{name}: {generator.summary}." for name, generator in GENERATORS.items()]
    return "Schedule families:\n\n" + "\n\n".join(lines)


def user_errors(command: Command) -> Command:
    """Report PipeschedError as one line on stderr with its exit code, never a traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        # Written to standard output (-o /dev/stdout into a pipe), a file must not get the
        # command's report mixed in: the report goes to stderr then.
        files = [kwargs.get(name) for name in OUTPUT_OPTIONS]
        report = (
            contextlib.redirect_stdout(sys.stderr) if any(writes_stdout(f) for f in files if f is not None) else contextlib.nullcontext()
        )
        try:
            with report:
                return command(*args, **kwargs)
        except PipeschedError as error:
            print(f"error: {one_line(str(error))}", file=sys.stderr)
            raise typer.Exit(error.exit_code) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise typer.Exit(INTERRUPTED) from None

    return cast(Command, wrapper)


# The options of the commands that name files they write.
OUTPUT_OPTIONS = ("output", "plot")
# Exit status after Ctrl-C, as a shell reports a process ended by SIGINT.
INTERRUPTED = 130
# The shortest --time-limit taken (as before its check moved here from typer's range); the
# longest, the seeds and the threads are the solver's own (optimizer/exact/options.py).
MIN_TIME_LIMIT = 0.01
# Samples `compare --jitter` draws unless --samples says otherwise.
DEFAULT_SAMPLES = 100
# The slice rules keep one cost per token (16.8M tokens: 134 MB, about a second).
MAX_SEQUENCE_LENGTH = 2**24
# The formats `show` draws (optimizer/formats/); `export` writes every schedule format.
PICTURES = ("svg", "html", "chrome-trace")


def finite_option(option: str, value: float | None, *, low: float | None = None, high: float | None = None) -> None:
    """Refuse NaN, +-Infinity and values outside [low, high] for a number option, naming it."""
    if value is None:
        return
    if not math.isfinite(value):
        raise InputError(f"{option}: must be a finite number, got {value}")
    if low is not None and value < low:
        raise InputError(f"{option}: must be at least {_shown(low)}, got {_shown(value)}")
    if high is not None and value > high:
        raise InputError(f"{option}: must be at most {_shown(high)}, got {_shown(value)}")


def _shown(number: float) -> str:
    """A number as the user would write it (integers in full)."""
    return str(number) if isinstance(number, int) else f"{number:.12g}"


# The options naming a file a command writes, as typed.
OUTPUT_FLAGS = ("-o", "--output", "--plot")


def argument_fault(args: Sequence[str]) -> str | None:
    """What is wrong with the arguments as typed, which their parsing hides; None: nothing.

    No option or file of pipesched takes an empty value, and an empty path would read as
    "." (a folder) later; an output named with a trailing slash is a folder, which the
    path would lose (`-o out.json/` wrote the file out.json)."""
    for i, arg in enumerate(args):
        flag, equals, value = arg.partition("=") if arg.startswith("--") else ("", "", "")
        if equals and not value and len(flag) > 2:
            return f"{flag}: the value is empty"
        if arg == "":
            return f"an argument is empty (after {args[i - 1]})" if i > 0 else "an argument is empty"
        if equals and flag in OUTPUT_FLAGS:
            given = value
        elif i > 0 and args[i - 1] in OUTPUT_FLAGS:
            flag, given = args[i - 1], arg
        else:
            continue
        if given.endswith("/") and given.strip("/"):
            return f"{given}: {flag} names a folder (a trailing /); give a file name"
    return None


def run_app(command: typer.Typer, args: list[str] | None = None, terminations: bool = True) -> int:
    """Run the app; option errors and Ctrl-C become one line on stderr too (exit 2 and 130).
    With `terminations`, SIGTERM and SIGHUP end it as Ctrl-C does, "interrupted" included
    (optimizer.interrupts), with 128 + the signal's number (143, 129)."""
    handling: contextlib.AbstractContextManager[list[int]] = terminations_as_interrupts() if terminations else contextlib.nullcontext([])
    with handling as received:
        code = _run_app(command, args)
    return 128 + received[0] if received and code == INTERRUPTED else code


def _run_app(command: typer.Typer, args: list[str] | None) -> int:
    if sys.stdout is None:  # started with standard output closed (`>&-`): Python drops prints
        print("error: standard output: closed", file=sys.stderr)
        return 1
    fault = argument_fault(sys.argv[1:] if args is None else args)
    if fault is not None:
        print(f"error: {printable(fault)}", file=sys.stderr)
        return InputError.exit_code
    try:
        result = command(args=args, standalone_mode=False, prog_name="pipesched")
    except typer.TyperException as error:  # click's usage errors: a bad option or value
        if type(error).__name__ == "NoArgsIsHelpError":  # `pipesched` or a command alone: its help
            print(error.format_message(), file=sys.stderr)
            return error.exit_code
        print(f"error: {one_line(error.format_message())}", file=sys.stderr)
        return error.exit_code
    except (typer.Abort, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    except OSError as error:
        # Output files are written through optimizer.io, which names them; what reaches here
        # is the standard output (a full disk, a closed pipe).
        if error.errno not in (errno.ENOSPC, errno.EPIPE, errno.EIO):
            raise
        with contextlib.suppress(OSError):  # Python flushes it again at exit: let that pass
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"error: standard output: {error.strerror}", file=sys.stderr)
        return 1
    return result if isinstance(result, int) else 0


def stdout_console() -> Console:
    # No markup: file names and method names are printed as they are ("[/y].json" was a
    # MarkupError traceback, "[red]x.json" printed styled as "x.json").
    return Console(highlight=False, markup=False)


def format_memory(peaks: list[float]) -> str:
    return f"{max(peaks):.4g}" if peaks else "-"


def metrics_line(schedule: Schedule, peak_label: str = "peak memory") -> str:
    m = schedule.metrics
    parts = [
        f"method {printable(schedule.method)}",
        f"makespan {m.makespan:.6g}",
        f"bubble {m.bubble_ratio:.2%}",
        f"{peak_label} {format_memory(m.peak_memory)}",
    ]
    if m.lower_bound is not None:
        parts.append(f"lower bound {m.lower_bound:.6g}")
    if m.gap is not None:
        parts.append(f"gap {m.gap:.2%}")
    if m.status is not None:
        parts.append(f"status {printable(m.status)}")
    if m.method_won is not None:
        parts.append(f"won by {printable(m.method_won)}")
    if m.solve_seconds is not None:
        parts.append(f"{m.solve_seconds:.1f} s")
    return ", ".join(parts)


# The field of a uniform problem each `problem` option sets (in every stage, "stages.3.forward", or
# at the top).
_FIELD_OPTIONS = {
    "comm_time": "--comm",
    "memory_limit": "--memory-limit",
    "forward": "--forward",
    "backward_input": "--backward-input",
    "backward_weight": "--backward-weight",
    "backward": "--backward",
    "memory.forward": "--mem-forward",
    "memory.backward_input": "--mem-backward-input",
    "memory.backward_weight": "--mem-backward-weight",
    "memory": "--mem-forward, --mem-backward-input, --mem-backward-weight",  # their sum
}
_PROBLEM_FIELD = re.compile(r"^problem: (?:stages\.\d+\.)?(?P<field>[a-z_.]+): ")


def _named_by_option(message: str) -> str:
    """A problem's field error as the `problem` option that set the field ("problem:
    stages.0.forward: ..." reads "--forward: ..."); other messages as they are."""
    found = _PROBLEM_FIELD.match(message)
    if found is None:
        return message
    option = _FIELD_OPTIONS.get(found["field"])
    return message if option is None else f"{option}: {message[found.end() :]}"


@app.command()
@user_errors
def problem(
    devices: int = typer.Option(..., "--devices", "-p", min=1, help="Pipeline devices (ranks)."),
    microbatches: int = typer.Option(..., "--microbatches", "-m", min=1, help="Microbatches per iteration."),
    forward: float = typer.Option(1.0, help="Forward time of one stage (your unit, e.g. ms)."),
    backward_input: float = typer.Option(1.0, help="Input-gradient (B) time of one stage."),
    backward_weight: float = typer.Option(1.0, help="Weight-gradient (W) time of one stage."),
    comm: float = typer.Option(0.0, help="Point-to-point transfer time between devices."),
    placement: str = typer.Option("linear", help="linear | interleaved:V | vshape."),
    mem_forward: float = typer.Option(1.0, help="Memory allocated by one forward (GiB or activations)."),
    mem_backward_input: float = typer.Option(
        0.0, help="Memory change when B ends: usually <= 0 (B frees part); > 0 for a buffer B allocates and its W frees."
    ),
    mem_backward_weight: float | None = typer.Option(None, help="Memory change when W ends; default: whatever makes the three sum to 0."),
    memory_limit: float | None = typer.Option(None, help="Per-device memory limit; default unlimited."),
    backward: float | None = typer.Option(None, help="Fused backward (BW) time of one stage; default B + W."),
    slices: int = typer.Option(1, min=1, help="Token slices per microbatch (sequence), K."),
    slice_lengths: str = typer.Option("even", help="even | dp (TeraPipe's dynamic program for the slice lengths)."),
    slice_cost: str = typer.Option("linear", help="linear (cost follows tokens) | attention (24h^2 + 4h·position per token)."),
    sequence_length: int = typer.Option(
        4096,
        min=1,
        max=MAX_SEQUENCE_LENGTH,
        help="Tokens per sequence, for the slice rules (one cost per token is kept, so at most 2**24).",
    ),
    hidden: int = typer.Option(4096, min=1, max=1_000_000, help="Hidden size h, for --slice-cost attention."),
    slice_overhead: float = typer.Option(0.0, help="Fixed time per slice, as a fraction of a whole sequence's F or B (>= 0)."),
    output: Path = typer.Option(..., "--output", "-o", help="Problem JSON to write."),
) -> None:
    """Write a uniform problem JSON (every stage the same), to edit or to solve.

    With --slices K each microbatch is one sequence cut into K token slices; their lengths
    and costs follow --slice-lengths and --slice-cost (README, Token slices).
    """
    for option, value in (
        ("--forward", forward),
        ("--backward-input", backward_input),
        ("--backward-weight", backward_weight),
        ("--comm", comm),
        ("--mem-forward", mem_forward),
        ("--mem-backward-input", mem_backward_input),
        ("--mem-backward-weight", mem_backward_weight),
        ("--memory-limit", memory_limit),
        ("--backward", backward),
        ("--slice-overhead", slice_overhead),
    ):
        finite_option(option, value, low=-MAX_VALUE, high=MAX_VALUE)  # the problem's own bounds, named by option
    if slice_overhead < 0:
        raise InputError(f"--slice-overhead: must be >= 0, got {slice_overhead:g}")
    check_outputs([output])
    refuse_other_format(output, "a problem")
    from optimizer.slicing import slice_model, with_slices  # numpy: only when a problem is built

    model = slice_model(
        sequence_length, slices, lengths=slice_lengths, cost=slice_cost, hidden=hidden, stages=devices, overhead=slice_overhead
    )
    try:
        built = uniform_problem(
            devices,
            microbatches,
            forward,
            backward_input,
            backward_weight,
            comm_time=comm,
            placement=placement,
            mem_forward=mem_forward,
            mem_backward_input=mem_backward_input,
            mem_backward_weight=mem_backward_weight,
            memory_limit=memory_limit,
            backward=backward,
        )
    except InputError as error:
        raise InputError(_named_by_option(str(error))) from None
    if slices > 1:
        try:
            built = with_slices(built, model)
        except InputError as error:
            if slice_overhead == 0:
                raise
            # The overhead is added to every slice's time: name the option, not the field.
            raise InputError(f"--slice-overhead: {slice_overhead:g} takes a slice's time past the problem's bounds ({error})") from None
    write_json_atomic(output, built.to_json())
    print(one_line(f"wrote {output}: {built.num_devices} devices, {built.num_stages} stages, {built.num_microbatches} microbatches"))
    if slices > 1:  # the lengths are only in this line: the problem keeps shares and costs
        print(f"slices: {', '.join(map(str, model.lengths))} tokens; F/B cost shares {', '.join(f'{c:.3f}' for c in model.costs)}")


@app.command()
@user_errors
def layers(
    blocks: int = typer.Option(32, min=1, max=1022, help="Transformer blocks."),
    hidden: int = typer.Option(4096, min=1, max=1_000_000, help="Hidden size."),
    vocab: int = typer.Option(32_000, min=1, max=100_000_000, help="Vocabulary size."),
    sequence: int = typer.Option(4096, min=1, max=100_000_000, help="Sequence length (tokens)."),
    batch: int = typer.Option(1, min=1, max=1_000_000, help="Sequences per microbatch."),
    heads: int = typer.Option(32, min=1, max=100_000, help="Attention heads."),
    flash_attention: bool = typer.Option(True, help="Attention without the s x s score activations (flash attention)."),
    tflops: float = typer.Option(150.0, help="Sustained compute rate per device, TFLOP/s."),
    bandwidth: float = typer.Option(1000.0, help="Sustained memory bandwidth per device, GB/s (the embedding lookup)."),
    bytes_per_parameter: float = typer.Option(18.0, help="Fixed memory per parameter: weights, gradients, optimizer state."),
    comm: float = typer.Option(0.0, help="Transfer time of one activation between devices, ms."),
    output: Path = typer.Option(..., "--output", "-o", help="Layers JSON to write."),
) -> None:
    """Write the layers file of a decoder-only model from its sizes (times in ms from FLOPs, memory in GiB).

    Solve it with `pipesched solve layers.json --devices P --microbatches M` to choose the
    layer split with the schedule (add --vocab-parallel to shard the embedding and the
    head over all devices instead); formulas in the README (Balancing the pipeline).
    """
    from optimizer.layer_costs import DecoderSizes, decoder_layers
    from optimizer.layers import layers_to_json

    for option, value in (("--tflops", tflops), ("--bandwidth", bandwidth)):  # times divide by them
        finite_option(option, value, high=1e12)
        if value <= 0:
            raise InputError(f"{option}: must be positive, got {_shown(value)}")
    for option, value in (("--bytes-per-parameter", bytes_per_parameter), ("--comm", comm)):
        finite_option(option, value, low=0.0, high=1e12)
    check_outputs([output])
    refuse_other_format(output, "a layers file")
    sizes = DecoderSizes(blocks, hidden, vocab, sequence, batch, heads, flash_attention, tflops, bandwidth, bytes_per_parameter, comm)
    try:
        profile = decoder_layers(sizes)
    except InputError as error:
        # A layer's times and memory come from the options together: name them, not a layer's field.
        raise InputError(
            f"layers: the options give a layer past pipesched's bounds (times scale with 1/--tflops and 1/--bandwidth, "
            f"memory with --bytes-per-parameter and the sizes): {str(error).removeprefix('layers: ')}"
        ) from None
    write_json_atomic(output, layers_to_json(profile))
    print(one_line(f"wrote {output}: {profile.num_layers} layers (embedding, {blocks} blocks, head)"))


def _what_file(data: object, problem_has: str) -> str:
    """What a file that is not a layers file holds, for an option only a layers file takes."""
    found = data.get("format") if isinstance(data, dict) else None
    if found == "pipesched.schedule":
        return "a schedule, not a problem or a layers file"
    return f"a problem{problem_has}"


@app.command(epilog=families_epilog())
@user_errors
def solve(
    problem_file: Path = typer.Argument(
        ..., metavar="PROBLEM.json", help="Problem to solve, or a layers file (then the split is chosen too)."
    ),
    method: str = typer.Option("auto", help="auto | cpsat | milp, or a schedule family (see `compare`)."),
    output: Path = typer.Option(..., "--output", "-o", help="Schedule JSON to write."),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as JSON."),
    time_limit: float = typer.Option(60.0, "--time-limit", help="Seconds for the optimizer (auto, cpsat, milp); at least 0.01."),
    objective: str = typer.Option("makespan", help="makespan | span (longest single-device span)."),
    solver: str | None = typer.Option(None, help="MILP back end for --method milp: cbc (default), highs, or a PuLP solver name."),
    seed: int = typer.Option(0, help="Random seed of the optimizer."),
    threads: int = typer.Option(2, min=1, help="CP-SAT workers (fixed for repeatable runs)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live progress line on stderr."),
    certify: float = typer.Option(
        0.0,
        "--certify",
        help="Seconds after --time-limit spent on raising the lower bound to cut the gap: the fluid bound (every device at once), "
        "then, on problems small enough, the exact device relaxations.",
    ),
    devices: int | None = typer.Option(None, "--devices", "-p", min=1, help="Layers file only: pipeline devices."),
    microbatches: int | None = typer.Option(None, "--microbatches", "-m", min=1, help="Layers file only: microbatches per iteration."),
    placement: str | None = typer.Option(None, help="Layers file only: linear (default) | interleaved:V | vshape."),
    memory_limit: float | None = typer.Option(
        None, "--memory-limit", help="Layers file only: memory per device, the layers' parameters included; default unlimited."
    ),
    vocab_parallel: bool = typer.Option(
        False, "--vocab-parallel", help="Layers file only: shard the embedding and the head over all devices (vocabulary parallelism)."
    ),
    vocab_barriers: str = typer.Option(
        "best",
        "--vocab-barriers",
        help="With --vocab-parallel: collectives per microbatch, 1 or 2, or best (both tried, the shorter kept).",
    ),
    start: list[Path] = typer.Option(
        [],
        "--start",
        metavar="SCHEDULE",
        help="A schedule to start from (schedule JSON, or torch CSV ending in .csv), e.g. another scheduler's; "
        "its order is timed on the problem and the result is never worse. Repeatable.",
    ),
) -> None:
    """Build a schedule with the optimizer (auto, cpsat, milp) or a schedule family.

    The optimizer shows elapsed time, incumbent, bound and gap on stderr while it runs.

    Given a layers file (`pipesched layers`, `pipesched profile --per-layer`), it chooses how
    many consecutive layers each stage holds together with the schedule (--method auto),
    and prints the split chosen beside the even split and the hand rules. With
    --vocab-parallel the embedding and the head are sharded over all devices as
    vocabulary passes (S and T per device and microbatch), the blocks are split into
    stages, and the schedule records the passes for `run`.

    With --start (auto, cpsat, milp) the search also starts from your schedules, e.g. one
    from another scheduler, and says how much shorter its result is.

    Ctrl-C stops it and writes the best schedule so far.

    Exit 3: no schedule fits the memory limit (the message names the smallest limit that fits).
    """
    from optimizer.errors import InfeasibleError
    from optimizer.io import read_json
    from optimizer.layers import is_layers_data

    finite_option("--time-limit", time_limit, low=MIN_TIME_LIMIT, high=MAX_TIME_LIMIT)
    finite_option("--threads", threads, high=MAX_THREADS)
    finite_option("--seed", seed, low=SEED_RANGE[0], high=SEED_RANGE[1])
    finite_option("--certify", certify, low=0.0, high=MAX_TIME_LIMIT)
    if solver is not None and method != "milp":
        raise InputError(f"--solver: only for --method milp (it picks the MILP back end), not --method {method}")
    if objective not in OBJECTIVES:
        raise InputError(f"--objective: '{printable(objective)}' is not one of {', '.join(OBJECTIVES)}")
    solver = solver or "cbc"
    finite_option("--memory-limit", memory_limit, low=0.0, high=MAX_VALUE)
    if memory_limit is not None and memory_limit <= 0:  # as a problem file's memory_limit
        raise InputError(f"--memory-limit: must be positive, got {_shown(memory_limit)}")
    barrier_choices = _vocab_barrier_choices(vocab_parallel, vocab_barriers)
    check_outputs([output], [problem_file, *start])
    refuse_other_format(output, "a schedule")
    if start and method not in ("auto", "cpsat", "milp"):
        raise InputError(f"--start: only with --method auto, cpsat or milp; {method} is a schedule family")
    data = read_json(problem_file)
    if is_layers_data(data):
        with interrupts_deferred():  # it loads OR-Tools and pandas: an interrupted import fails as ImportError
            from optimizer.balance_report import solve_layers

        if certify > 0:
            raise InputError(f"--certify: only for a problem file; {problem_file} is a layers file")
        if start:
            raise InputError(f"--start: only for a problem file; {problem_file} is a layers file, whose stages the split chooses")

        with interrupts_deferred():
            from optimizer.exact import SolveOptions
        options = SolveOptions(time_limit=time_limit, objective=objective, seed=seed, threads=threads, solver=solver)
        schedule, interrupted = solve_layers(
            data,
            str(problem_file),
            devices,
            microbatches,
            "linear" if placement is None else placement,
            memory_limit,
            method,
            options,
            as_json,
            quiet,
            barrier_choices,
        )
        with interrupts_deferred():
            save_schedule(schedule, output)
        if interrupted:
            raise typer.Exit(INTERRUPTED)
        return
    for name, value in (
        ("--devices", devices),
        ("--microbatches", microbatches),
        ("--placement", placement),
        ("--memory-limit", memory_limit),
    ):
        if value is not None:
            raise InputError(f"{name}: only for a layers file; {problem_file} is {_what_file(data, ', which has its own')}")
    if vocab_parallel:
        raise InputError(
            f"--vocab-parallel: only for a layers file; {problem_file} is {_what_file(data, ' (give it a vocab_parallel field)')}"
        )
    loaded = problem_from_json(data, str(problem_file))
    interrupted = False
    starts: list[Start] = []
    if method in ("auto", "cpsat", "milp"):
        began = time.monotonic()
        starts = _load_starts(start, loaded, time_limit)
        # Reading the starts counts against the limit (a schedule at the size limit takes
        # about a second to read and time: eight of them kept a 1 s solve 9 s long).
        left = max(MIN_TIME_LIMIT, time_limit - (time.monotonic() - began))
        schedule, interrupted = _optimize(loaded, method, left, objective, solver, seed, threads, quiet, starts)
        if certify > 0 and not interrupted:
            interrupted = _certify(schedule, objective, certify, quiet, seed, threads)
    else:
        if certify > 0:
            raise InputError(f"--certify: only with --method auto, cpsat or milp; {method} is a schedule family")
        if objective != "makespan":
            # A family's order is the same for either objective; only the optimizer (or,
            # for a layers file, the choice of split) minimizes it.
            raise InputError(f"--objective: only with --method auto, cpsat or milp, or a layers file; {method} is a schedule family")
        from optimizer.schedules import generate
        from optimizer.schedules.listengine import check_memory_feasible

        schedule = generate(loaded, method)
        if not schedule.fits_memory():
            check_memory_feasible(loaded)  # where no schedule fits, say which limit would
            over = _memory_overflow(schedule)
            from optimizer.exact.least_memory import split_backwards_fit

            # greedy splits every backward: where only fused ones fit, auto alone helps.
            others = "auto" if method == "greedy" or not split_backwards_fit(loaded) else "greedy or auto"
            raise InfeasibleError(f"{method} exceeds the memory limit ({over}); try --method {others}")
    with interrupts_deferred():
        save_schedule(schedule, output)
    if starts:
        _print_against_starts(schedule, starts, objective, as_json)
    else:
        _print_metrics(schedule, as_json)
    if interrupted:
        raise typer.Exit(INTERRUPTED)


def _load_starts(paths: list[Path], problem: Problem, time_limit: float) -> list[Start]:
    """The --start schedules timed on `problem`; one over its memory limit is named on
    stderr and left out (it cannot be the result). Once reading them has taken
    `time_limit`, the rest are named on stderr and not read (each is checked to be a
    file first, so a missing one is refused whatever the time)."""
    from optimizer.starts import load_start

    for path in paths:
        try:
            check_input_file(path)
        except InputError as error:
            raise InputError(f"--start: {error}") from None
    starts = []
    began = time.monotonic()
    for n, path in enumerate(paths):
        if time.monotonic() - began >= time_limit:
            unread = ", ".join(str(p) for p in paths[n:])
            print(one_line(f"note: --start {unread}: not read, reading the others took the time limit ({time_limit:g} s)"), file=sys.stderr)
            break
        given = load_start(path, problem)
        if given.schedule.fits_memory():
            starts.append(given)
        else:
            print(
                one_line(f"note: --start {path} is over the memory limit ({_memory_overflow(given.schedule)}); not used"), file=sys.stderr
            )
    return starts


def _print_against_starts(schedule: Schedule, starts: list[Start], objective: str, as_json: bool) -> None:
    """The metrics, and how much shorter the result is than each --start (by `objective`)."""
    from optimizer.exact.incumbents import objective_value
    from optimizer.exact.spantiming import timed_for

    value = objective_value(schedule, objective)
    # Each start counted as the solver counts it: under the span objective its order timed
    # for the least longest span (the result may be that very order, so timed).
    timed = [timed_for(s.schedule.problem, s.schedule.order(), "span") if objective == "span" else s.schedule for s in starts]
    given = [objective_value(t, objective) for t in timed]
    if as_json:
        rows = [{"file": str(s.path), objective: v} for s, v in zip(starts, given)]
        print(json.dumps({**metrics_summary(schedule), "starts": rows}))
        return
    print(metrics_line(schedule))
    for s, v in zip(starts, given):
        shorter = (v - value) / v if v > 0 else 0.0
        verdict = f"{shorter:.2%} shorter" if shorter > 1e-9 else "no shorter (it is the result)"
        print(f"against --start {s.path}: {objective} {v:.6g} -> {value:.6g}, {verdict}")


def _vocab_barrier_choices(vocab_parallel: bool, barriers: str) -> tuple[int, ...]:
    """The barrier counts --vocab-parallel tries: none without it, both for `best`."""
    choices = {"best": (1, 2), "1": (1,), "2": (2,)}
    if barriers not in choices:
        raise InputError(f"--vocab-barriers: '{barriers}' is not 1, 2 or best")
    if not vocab_parallel:
        if barriers != "best":
            raise InputError("--vocab-barriers: only with --vocab-parallel")
        return ()
    return choices[barriers]


def _certify(schedule: Schedule, objective: str, seconds: float, quiet: bool, seed: int, threads: int) -> bool:
    """Raise the schedule's lower bound (optimizer.exact.certify); whether Ctrl-C stopped it."""
    from optimizer.exact.certify import certify
    from optimizer.exact.devicebound import relaxation_applies

    if not schedule.metrics.gap:
        return False
    if not quiet:
        also = " and the exact device relaxations" if relaxation_applies(schedule.problem, objective) else ""
        print(f"certifying: the fluid bound{also} for up to {seconds:g} s", file=sys.stderr)

    def warn(message: str) -> None:
        # The schedule and its bound stand; the user learns why the fluid bound added nothing.
        print(one_line(f"warning: --certify: {message}"), file=sys.stderr)

    try:
        certify(schedule, objective, seconds, seed=seed, threads=threads, on_warning=warn)
    except KeyboardInterrupt:
        print("interrupted: writing the schedule with the bound it had", file=sys.stderr)
        return True
    return False


def _optimize(
    problem: Problem,
    method: str,
    time_limit: float,
    objective: str,
    solver: str,
    seed: int,
    threads: int,
    quiet: bool,
    starts: Sequence[Start] = (),
) -> tuple[Schedule, bool]:
    """Run optimizer.exact.solve with a live progress line; Ctrl-C keeps the best so far (and says so)."""
    with interrupts_deferred():
        from optimizer.exact import SolveOptions
        from optimizer.exact import solve as exact_solve

    options = SolveOptions(time_limit=time_limit, objective=objective, seed=seed, threads=threads, solver=solver)
    with _ProgressLine(quiet) as progress:
        try:
            # The starts were timed and checked on this very problem as they were loaded.
            given = [(s.name, s.schedule) for s in starts]
            schedule = exact_solve(problem, method, options, on_progress=progress.update, starts=given, retime_starts=False)
        except KeyboardInterrupt:
            print("interrupted before any schedule was found", file=sys.stderr)
            raise typer.Exit(INTERRUPTED) from None
    if progress.interrupted:
        print("interrupted: writing the best schedule found so far", file=sys.stderr)
    return schedule, progress.interrupted


class _ProgressLine:
    """A live stderr line (rich) with elapsed time, incumbent, bound and gap; plain lines when not a terminal."""

    def __init__(self, quiet: bool):
        from rich.console import Console

        self.quiet = quiet
        self.console = Console(stderr=True, highlight=False, markup=False)
        self.last: Progress | None = None
        self.interrupted = False
        self.live: Live | None = None
        self.began = 0.0
        self.printed_at = -1.0
        self.warned: set[str] = set()

    def __enter__(self) -> _ProgressLine:

        from rich.live import Live

        self.began = time.monotonic()
        if not self.quiet and self.console.is_terminal:
            live = Live(get_renderable=self.render, console=self.console, refresh_per_second=4, transient=True)
            live.__enter__()
            self.live = live
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def update(self, progress) -> None:
        if progress.warning is not None:
            if progress.warning not in self.warned:  # once each, with --quiet too
                self.warned.add(progress.warning)
                self.console.print(f"warning: {progress.warning}")
            return
        self.last = progress
        if progress.phase == "interrupted":
            self.interrupted = True
        if not self.quiet and self.live is None and progress.elapsed - self.printed_at >= 1.0:
            self.printed_at = progress.elapsed
            print(self.text(), file=sys.stderr)

    def text(self) -> str:

        p = self.last
        elapsed = time.monotonic() - self.began if self.began is not None else 0.0
        if p is None:
            return f"{elapsed:6.1f}s  starting"
        incumbent = "-" if p.incumbent is None else f"{p.incumbent:.6g}"
        gap = "-" if p.gap is None else f"{p.gap:.2%}"
        return f"{elapsed:6.1f}s  incumbent {incumbent}  bound {p.bound:.6g}  gap {gap}  ({p.phase})"

    def render(self):
        return Text(self.text())


@app.command()
@user_errors
def pareto(
    problem_file: Path = typer.Argument(..., metavar="PROBLEM.json", help="Problem to sweep (its memory limit is replaced)."),
    limits: str = typer.Option(..., help="Memory limits LOW:HIGH:STEP, e.g. 2:8:0.5 (the problem's memory unit)."),
    time_limit: float = typer.Option(10.0, "--time-limit", help="Seconds per limit; at least 0.01."),
    output: Path = typer.Option(..., "--output", "-o", help="Curve JSON to write."),
    plot: Path | None = typer.Option(None, help="Also draw the curve as SVG here."),
    seed: int = typer.Option(0, help="Random seed of the optimizer."),
    threads: int = typer.Option(2, min=1, help="CP-SAT workers."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print no table."),
) -> None:
    """Memory against speed: solve under each memory limit, beside the known schedules' peak memory.

    Ctrl-C stops the sweep and writes the limits solved so far (exit 130).
    """
    with interrupts_deferred():
        from optimizer.exact import SolveOptions, parse_limits
        from optimizer.exact import pareto as sweep
        from optimizer.formats import get_format

    finite_option("--time-limit", time_limit, low=MIN_TIME_LIMIT, high=MAX_TIME_LIMIT)
    finite_option("--threads", threads, high=MAX_THREADS)
    finite_option("--seed", seed, low=SEED_RANGE[0], high=SEED_RANGE[1])
    values = parse_limits(limits)
    check_outputs([output, plot], [problem_file])
    refuse_other_format(output, "the curve")
    if plot is not None:
        if not Path(plot).name.lower().endswith(".svg"):
            raise InputError(f"{plot}: the plot is an SVG picture; name it .svg")
        from optimizer.formats.pareto_svg import require_matplotlib

        require_matplotlib("--plot")
    loaded = load_problem(problem_file)
    err = Console(stderr=True, highlight=False, markup=False)

    def on_point(point) -> None:
        if not quiet:
            shown = f"makespan {point.makespan:.6g}, gap {point.gap:.2%}" if point.feasible else "no schedule fits"
            err.print(f"limit {point.limit:g}: {shown}")

    curve = sweep(loaded, values, SolveOptions(time_limit=time_limit, seed=seed, threads=threads), on_point=on_point)
    # Both or neither: the plot is drawn before either file is touched; a Ctrl-C now waits for them.
    with interrupts_deferred():
        curve_format, plot_format = get_format("pareto-json"), get_format("pareto-svg")
        write_outputs([(output, curve_format.write(curve))] + ([(plot, plot_format.write(curve))] if plot is not None else []))
    if curve.interrupted:
        print(one_line(f"interrupted: wrote the {len(curve.points)} limit(s) solved so far to {output}"), file=sys.stderr)
        raise typer.Exit(INTERRUPTED)
    if not quiet:
        table = Table(title=f"memory against speed ({time_limit:g} s per limit)")
        for column in ("memory limit", "makespan", "bubble", "lower bound", "gap", "status"):
            table.add_column(column, justify="right")
        for p in curve.points:
            if p.feasible:
                table.add_row(f"{p.limit:g}", f"{p.makespan:.6g}", f"{p.bubble:.2%}", f"{p.bound:.6g}", f"{p.gap:.2%}", p.status)
            else:
                table.add_row(f"{p.limit:g}", "-", "-", "-", "-", p.status or "infeasible")
        stdout_console().print(table)
        known = ", ".join(f"{g.name} (peak {g.peak_memory:.4g}, bubble {g.bubble:.1%})" for g in curve.generators)
        print(f"known schedules: {known}")
    print(one_line(f"wrote {output}" + (f" and {plot}" if plot else "")))


def _memory_overflow(schedule: Schedule) -> str:
    limits = schedule.problem.tables().limit
    return "; ".join(
        f"device {d} needs {peak:.4g} > {limit:.4g}"
        for d, (peak, limit) in enumerate(zip(schedule.metrics.peak_memory, limits))
        if peak > tolerant(limit)
    )


def _print_metrics(schedule: Schedule, as_json: bool) -> None:
    if as_json:
        print(json.dumps(metrics_summary(schedule)))
    else:
        print(metrics_line(schedule))


def comparison_rows(problem: Problem, extra: dict[str, Schedule] | None = None) -> list[dict]:
    """One row per applicable schedule family (and per `extra` schedule), best fitting first.

    A family that could build nothing within the memory limit gets a row with its reason
    in `note` and no numbers.
    """
    return _rows(*_compared_schedules(problem, extra or {}, with_torch=False))


def _rows(schedules: dict[str, Schedule], refused: dict[str, str], jitter: dict[str, dict] | None = None) -> list[dict]:
    """The comparison's rows (see comparison_rows); `jitter`: per schedule, its summary
    under varied op times (optimizer.jitter)."""
    rows = [_row(name, schedule) for name, schedule in schedules.items()]
    if jitter is not None:
        for row in rows:
            row["jitter"] = jitter[row["method"]]
    rows.sort(key=lambda row: (not row["fits_memory"], row["makespan"]))
    for name, reason in refused.items():
        rows.append({"method": name, "makespan": None, "bubble_ratio": None, "peak_memory": None, "fits_memory": False, "note": reason})
    return rows


def _row(name: str, schedule: Schedule) -> dict:
    return {
        "method": name,
        "makespan": schedule.metrics.makespan,
        "bubble_ratio": schedule.metrics.bubble_ratio,
        "peak_memory": max(schedule.metrics.peak_memory),
        "fits_memory": schedule.fits_memory(),
    }


def _jitter_summaries(problem: Problem, schedules: dict[str, Schedule], cv: float, samples: int, seed: int) -> dict[str, dict]:
    """Each schedule's makespan under op times varied by `cv` (optimizer.jitter), as a dict."""
    from optimizer.jitter import check_jitter_request, jittered_makespans, summarize

    check_jitter_request(cv, samples, len(schedules), problem.num_ops)
    names = list(schedules)
    makespans = jittered_makespans(problem, [schedules[name] for name in names], cv, samples, seed)
    return {
        name: {"cv": cv, "samples": samples, "seed": seed, **summarize(schedules[name].metrics.makespan, values).as_dict()}
        for name, values in zip(names, makespans, strict=True)
    }


def print_comparison(rows: list[dict], title: str) -> None:
    # The title on its own line: as the table's title it was wrapped and centred to the
    # table's width, cutting "memory limit 4.0" in two at 80 columns.
    print(one_line(title))
    table = Table()
    for column, justify in (
        ("method", "left"),
        ("makespan", "right"),
        ("bubble", "right"),
        ("peak memory", "right"),
        ("fits limit", "center"),
    ):
        table.add_column(column, justify=cast("JustifyMethod", justify))
    for row in rows:
        if row["makespan"] is None:
            table.add_row(row["method"], "-", "-", "-", Text("no", style="red"))
            continue
        table.add_row(
            row["method"],
            f"{row['makespan']:.6g}",
            f"{row['bubble_ratio']:.2%}",
            f"{row['peak_memory']:.4g}",
            "yes" if row["fits_memory"] else Text("no", style="red"),
        )
    stdout_console().print(table)
    jittered = [row for row in rows if "jitter" in row]
    if jittered:
        # A table of its own: beside the five columns above the names were cut at 80 columns.
        spread = jittered[0]["jitter"]
        print(
            one_line(
                f"Under varied op times: every op's time x a random factor of mean 1 and coefficient of variation "
                f"{spread['cv']:g}, {spread['samples']} samples, seed {spread['seed']}"
            )
        )
        varied = Table()
        for column, justify in (
            ("method", "left"),
            ("makespan", "right"),
            ("mean", "right"),
            ("p95", "right"),
            ("p95 over makespan", "right"),
        ):
            varied.add_column(column, justify=cast("JustifyMethod", justify))
        for row in jittered:
            spread = row["jitter"]
            over = f"{spread['p95'] / row['makespan'] - 1:+.2%}" if row["makespan"] > 0 else "-"
            varied.add_row(row["method"], f"{row['makespan']:.6g}", f"{spread['mean']:.6g}", f"{spread['p95']:.6g}", over)
        stdout_console().print(varied)
    for row in rows:
        if row.get("note"):
            print(f"{row['method']}: {row['note']}")


@app.command(epilog=families_epilog())
@user_errors
def compare(
    problem_file: Path = typer.Argument(..., metavar="PROBLEM.json", help="Problem to compare schedules on."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
    with_torch: bool = typer.Option(False, "--torch", help="Add torch.distributed.pipelining's built-in schedules (needs torch)."),
    schedules: list[Path] = typer.Option(
        [],
        "--schedule",
        metavar="SCHEDULE",
        help="Add your schedule (schedule JSON, or torch CSV ending in .csv), its order timed on the problem. Repeatable.",
    ),
    jitter: float | None = typer.Option(
        None,
        "--jitter",
        metavar="CV",
        help="Also time each order with every op's duration varied at random (mean 1, this coefficient of variation, "
        "e.g. 0.1; at most 1): mean and 95th percentile makespan per schedule.",
    ),
    samples: int | None = typer.Option(None, "--samples", help="With --jitter: how many samples (default 100, at most 10000)."),
    seed: int | None = typer.Option(
        None, "--seed", help="With --jitter: the random seed (default 0; the same seed gives the same figures)."
    ),
) -> None:
    """Compare every applicable schedule family: makespan, bubble, peak memory, fits the limit.

    With --schedule, your schedules too (e.g. another scheduler's), as `solve --start` reads them.
    With --jitter, how each order holds up when op times vary (same random op times for every schedule).
    """
    from optimizer.starts import load_start

    finite_option("--jitter", jitter)
    finite_option("--seed", seed, low=SEED_RANGE[0], high=SEED_RANGE[1])
    if jitter is None and samples is not None:
        raise InputError("--samples: only with --jitter")
    if jitter is None and seed is not None:
        raise InputError("--seed: only with --jitter")
    loaded = load_problem(problem_file)
    if with_torch:
        from runtime.torch_orders import beyond_torch

        missing = beyond_torch(loaded, str(problem_file))
        if missing is not None:
            raise InputError(f"--torch: torch.distributed.pipelining's schedules have {missing}")
    given = {str(path): load_start(path, loaded, option="--schedule").schedule for path in schedules}
    built, refused = _compared_schedules(loaded, given, with_torch)
    spread = None
    if jitter is not None:
        spread = _jitter_summaries(loaded, built, jitter, DEFAULT_SAMPLES if samples is None else samples, 0 if seed is None else seed)
    rows = _rows(built, refused, spread)
    if as_json:
        print(json.dumps(rows))
    else:
        limit = loaded.memory_limit if loaded.memory_limit is not None else "none"
        sliced = f" x {loaded.num_slices} token slices" if loaded.num_slices > 1 else ""
        print_comparison(
            rows,
            f"{problem_file}: {loaded.num_devices} devices, {loaded.num_stages} stages, "
            f"{loaded.num_microbatches} microbatches{sliced}, memory limit {limit}",
        )


@app.command()
@user_errors
def validate(
    schedule_file: Path = typer.Argument(..., metavar="SCHEDULE.json", help="Schedule to check."),
) -> None:
    """Check a schedule against every rule of its problem; exit 1 listing each violation."""
    from optimizer.validate import validate as check

    schedule = load_schedule(schedule_file, check=False)
    violations = check(schedule.problem, schedule.devices)
    if violations:
        for line in violations:
            print(line)
        print(f"{one_line(str(schedule_file))}: invalid, {len(violations)} violation(s)", file=sys.stderr)
        raise typer.Exit(1)
    print(f"{one_line(str(schedule_file))}: valid; {metrics_line(schedule)}")


@app.command()
@user_errors
def show(
    schedule_file: Path = typer.Argument(..., metavar="SCHEDULE.json", help="Schedule to draw."),
    output: Path = typer.Option(
        ..., "--output", "-o", help=".svg or .html: Gantt chart with memory curves; .trace.json: Chrome/Perfetto trace."
    ),
    format_name: str | None = typer.Option(None, "--format", help="svg, html or chrome-trace (default: from the output's name)."),
) -> None:
    """Draw a schedule: Gantt chart and memory curves (SVG/HTML) or a Chrome/Perfetto trace."""
    from optimizer.io import write_text_atomic

    check_outputs([output], [schedule_file])
    chosen = choose_format(output, format_name, allowed=PICTURES)
    schedule = load_schedule(schedule_file)
    write_text_atomic(output, chosen.write(schedule))
    print(one_line(f"wrote {output}"))


def _compared_schedules(problem: Problem, given: dict[str, Schedule], with_torch: bool) -> tuple[dict[str, Schedule], dict[str, str]]:
    """Every applicable family's schedule, torch's built-in ones (`with_torch`, from torch's
    own order code) and the `given` ones, by name; and why any family or built-in has none."""
    from optimizer.schedules import generate_all

    schedules, refused = generate_all(problem)
    if with_torch:
        from runtime.torch_orders import builtin_schedules

        builtins, refused_builtins = builtin_schedules(problem)
        schedules, refused = {**schedules, **builtins}, {**refused, **refused_builtins}
    return {**schedules, **given}, refused


@app.command()
@user_errors
def export(
    schedule_file: Path = typer.Argument(..., metavar="SCHEDULE.json", help="Schedule to export."),
    format_name: str | None = typer.Option(
        None,
        "--format",
        help="torch-csv (torch.distributed.pipelining, torchtitan), schedule-json, chrome-trace, svg, html, "
        "or the layer split of a layers solve: megatron-layout, torchtitan-modules, example-split "
        "(default: from the output's name: .csv, .json, .trace.json, .svg, .html, .layout.txt, .modules.json, .split.txt).",
    ),
    output: Path = typer.Option(..., "--output", "-o", help="File to write."),
) -> None:
    """Write a schedule in a named format: torch-csv runs in torch's _PipelineScheduleRuntime and torchtitan."""
    from optimizer.formats import torch_csv
    from optimizer.io import write_text_atomic

    check_outputs([output], [schedule_file])
    chosen = choose_format(output, format_name)
    schedule = load_schedule(schedule_file)
    write_text_atomic(output, chosen.write(schedule))
    if chosen.name != torch_csv.NAME:
        print(one_line(f"wrote {output}: {chosen.summary}"))
        return
    problem = schedule.problem
    count = sum(len(device) for device in schedule.devices)
    print(
        one_line(
            f"wrote {output}: {problem.num_devices} ranks, {problem.num_stages} stages, {count} actions (the order only; times stay in {schedule_file})"
        )
    )
    if torch_csv.torchtitan_layout(problem) is None:
        print("note: torch's runtime takes this placement from the CSV; torchtitan builds stages only looped or V-shaped")


@app.command("import")
@user_errors
def import_(
    csv_file: Path = typer.Argument(..., metavar="SCHEDULE.csv", help="torch compute-only schedule CSV."),
    problem_file: Path = typer.Option(..., "--problem", help="Problem JSON with the times, transfer cost and memory."),
    output: Path = typer.Option(..., "--output", "-o", help="Schedule JSON to write."),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as JSON."),
) -> None:
    """Read torch's schedule CSV, time it on a problem and write a validated schedule.

    Communication actions are skipped (torch inserts them itself); the two halves of an
    OVERLAP_F_B pair run back to back. Exit 1 when the order deadlocks or breaks a rule.
    """
    from optimizer.formats import torch_csv

    check_outputs([output], [csv_file, problem_file])
    refuse_other_format(output, "a schedule")
    loaded = load_problem(problem_file)
    schedule, imported = torch_csv.import_schedule(read_input_text(csv_file), loaded, str(csv_file))
    save_schedule(schedule, output)
    if as_json:
        print(
            json.dumps(
                {**metrics_summary(schedule), "overlapped_pairs": imported.overlapped_pairs, "skipped_actions": imported.skipped_actions}
            )
        )
        return
    print(metrics_line(schedule))
    if imported.overlapped_pairs:
        print(f"{imported.overlapped_pairs} OVERLAP_F_B pairs run back to back (one op at a time per device)")
    if imported.skipped_actions:
        print(f"skipped {imported.skipped_actions} communication or sharding actions (torch's runtime inserts them)")
    print(one_line(f"wrote {output}"))


def main() -> int:
    return run_app(app)

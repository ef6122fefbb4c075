"""The `pipesched` console entry: the optimizer's commands plus `run` and `profile`.

torch is imported inside the runtime commands only, so the optimizer's commands and
`--help` stay fast.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

# Ctrl-C while the commands load (0.3 s to a second of imports) is held until they are
# loaded, then ends the program quietly with 130, like Ctrl-C later on (run_app); so are
# SIGTERM and SIGHUP (143, 129), which run_app handles as Ctrl-C, except in a torchrun
# rank, which keeps their default. Raised inside the imports, a KeyboardInterrupt could be
# turned into an ImportError of a C extension; left at their default, SIGTERM and SIGHUP
# ended the program without a word.
_interrupts_while_loading: list[int] = []
_handlers_while_loading: dict[signal.Signals, signal.Handlers | Callable | int | None] = {}
for _signum, _default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL), (signal.SIGHUP, signal.SIG_DFL)):
    if signal.getsignal(_signum) is _default and (_signum == signal.SIGINT or "RANK" not in os.environ):
        _handlers_while_loading[_signum] = signal.signal(_signum, lambda signum, frame: _interrupts_while_loading.append(signum))
# Ctrl-C is also blocked while they load, so that the threads they start (numpy's BLAS
# pool) keep it blocked and it always reaches this one: where the rank server starts, it
# is ignored for a few milliseconds and held pending on this thread
# (runtime/forkserver.rank_context), and another thread taking it would drop it.
_mask_while_loading = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT} & set(_handlers_while_loading))

import atexit  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import typer  # noqa: E402

from optimizer.cli import INTERRUPTED, app, finite_option, run_app, user_errors  # noqa: E402
from optimizer.errors import InputError, PipeschedError, ScheduleError  # noqa: E402
from optimizer.interrupts import interrupts_deferred  # noqa: E402
from optimizer.io import one_line, printable  # noqa: E402
from runtime.forkserver import stop_rank_server  # noqa: E402

_BACKEND_HELP = "gloo (CPU) or nccl (one GPU per rank)."
_TIMEOUT_HELP = "Seconds a rank may wait for one transfer before every rank fails, naming the op."
_MODEL_HELP = (
    "example[:layers=4,hidden=64,heads=4,vocab=256,seq_len=32,batch_size=2,seed=0,split=B/B/...] "
    "(defaults shown; split: blocks per stage, even by default), "
    "synthetic[:width=16,batch_size=2,mib_per_unit=1,seed=0,problem=PATH] (sleeps the problem's op times) "
    "or package.module:build_stages (found on sys.path or in the current folder)."
)
_DEBUG_HELP = "Print the traceback of a model's or a rank's exception."
# Seconds a transfer may wait: below a second the ranks cannot even meet; above about
# 11 days the number is a typo.
_MIN_TIMEOUT, _MAX_TIMEOUT = 1.0, 1e6


def _start_rank_server() -> None:
    # Before torch is imported here, so the rank server's import runs alongside ours.
    if "RANK" not in os.environ:
        from runtime.forkserver import rank_context

        rank_context()


def _require_torch(command: str) -> None:
    """One line naming the extra to install when torch is missing (pipesched alone is the optimizer)."""
    try:
        import torch  # noqa: F401
    except ImportError as error:
        raise InputError(
            f"{command}: needs torch ({error}); install it with pip install 'pipesched[runtime]' (GPU: your CUDA build of torch first, see README)"
        ) from None


def _check_options(timeout: float, backend: str, threads: int | None) -> None:
    finite_option("--timeout", timeout, low=_MIN_TIMEOUT, high=_MAX_TIMEOUT)
    if backend not in ("gloo", "nccl"):
        raise InputError(f"--backend: '{backend}' is not one of gloo, nccl")
    cores = os.cpu_count() or 1
    if threads is not None and threads > cores:
        raise InputError(f"--threads: {threads} is more than the {cores} cores here")


def with_debug(command):
    """With --debug, print the traceback behind a one-line error (a user model's exception),
    and keep torch's own C++ log lines."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        # torch's C++ code logs to stderr on its own (a rank that cannot join its torchrun
        # job prints pages of C++ frames before the one-line error that says the same). The
        # level is read when torch loads, so it is set before the command imports anything
        # of it (a model, the rank server and its ranks inherit it); --debug, or a level
        # the user set, keeps torch's own.
        if not kwargs.get("debug") and not os.environ.get("TORCH_CPP_LOG_LEVEL"):
            os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
        try:
            return command(*args, **kwargs)
        except PipeschedError as error:
            if kwargs.get("debug") and error.__cause__ is not None:
                traceback.print_exception(error.__cause__, file=sys.stderr)
            raise

    return wrapper


def _world_size(default: int) -> int:
    from runtime.environment import torchrun_world, under_torchrun

    return torchrun_world()[1] if under_torchrun() else default


@app.command()
@user_errors
@with_debug
def run(
    schedule_file: Path = typer.Argument(..., metavar="SCHEDULE.json", help="Schedule to run."),
    model: str = typer.Option(..., "--model", help=_MODEL_HELP),
    steps: int = typer.Option(3, "--steps", min=1, max=1_000_000, help="Training steps."),
    check: bool = typer.Option(False, "--check", help="Compare the first step's loss and gradients with one process."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    backend: str = typer.Option("gloo", "--backend", help=_BACKEND_HELP),
    timeout: float = typer.Option(60.0, "--timeout", help=_TIMEOUT_HELP),
    threads: int | None = typer.Option(None, "--threads", min=1, help="Torch threads per rank; default cores / ranks."),
    debug: bool = typer.Option(False, "--debug", help=_DEBUG_HELP),
    engine: str = typer.Option(
        "pipesched", "--engine", help="pipesched (our executor) or torch (torch.distributed.pipelining's runtime, fed the exported CSV)."
    ),
) -> None:
    """Train a schedule with torch.distributed: one process per device here, or one rank under torchrun."""
    # Options, environment and the schedule are checked before torch loads.
    from optimizer.formats import torch_csv
    from optimizer.formats.schedule_json import load_schedule
    from optimizer.validate import validate
    from runtime.plan import build_plans

    _check_options(timeout, backend, threads)
    if engine not in ENGINES:
        raise InputError(f"--engine: '{printable(engine)}' is not one of {', '.join(ENGINES)}")
    schedule = load_schedule(schedule_file, check=False)
    unrun = torch_csv.torch_cannot_run(schedule) if engine == "torch" else None
    if unrun is not None:
        raise InputError(f"--engine torch: {schedule_file} {unrun}; use --engine pipesched")
    world_size = _world_size(schedule.problem.num_devices)
    try:
        build_plans(schedule, world_size, str(schedule_file))  # refuse before starting any rank
    except InputError as error:
        if str(error).startswith(f"{schedule_file}:"):
            raise
        raise InputError(f"{schedule_file}: {error}") from None
    # Then every rule, as `validate`, `show` and `export` check them (a deadlock is named
    # first, above, because it says more than the broken dependencies it leaves).
    violations = validate(schedule.problem, schedule.devices)
    if violations:
        raise ScheduleError(str(schedule_file), violations)
    with interrupts_deferred():
        _start_rank_server()
        _require_torch("run")
        from runtime.launch import launch, run_here, under_torchrun
        from runtime.models import load_model
        from runtime.worker import CheckError

    built = load_model(model, schedule.problem.num_stages, schedule.problem)  # a bad model name fails here, once
    if schedule.problem.vocab_parallel is not None:
        from runtime.models import vocabulary_stages

        vocabulary_stages(built, model, str(schedule_file))
    job = run_job(engine, schedule.to_json(), str(schedule_file), model, steps=steps, check=check, timeout_s=timeout)
    summary = run_here(job, backend, threads) if under_torchrun() else launch(job, world_size, backend, threads, debug)
    if summary is None:  # a rank other than 0 under torchrun
        return
    summary["backend"] = backend
    summary["engine"] = engine
    if as_json:
        print(json.dumps(finite_or_null(summary), allow_nan=False))
    else:
        _print_run(summary)
    diverged = next((step for step, loss in enumerate(summary["losses"]) if not math.isfinite(loss)), None)
    if diverged is not None:
        raise CheckError(f"loss is {summary['losses'][diverged]} from step {diverged}: the model diverged (the schedule ran to the end)")
    if check and not summary["check"]["passed"]:
        raise CheckError(f"check failed: {summary['check']['first_mismatch']}")


def finite_or_null(value):
    """`value` with every NaN or infinite float as None: strict JSON has no NaN (a diverged loss)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(item) for item in value]
    return value


# The runtimes `run --engine` drives.
ENGINES = ("pipesched", "torch")


def run_job(engine: str, *args, **kwargs):
    """The per-rank job of `run` for the chosen engine."""
    from runtime.worker import RunJob

    if engine == "pipesched":
        return RunJob(*args, **kwargs)
    if engine == "torch":
        from runtime.torch_engine import TorchRunJob

        return TorchRunJob(*args, **kwargs)
    raise InputError(f"engine: '{printable(engine)}' is not one of {', '.join(ENGINES)}")


def _print_run(summary: dict) -> None:
    losses = summary["losses"]
    slices = f" x {summary['slices']} token slices" if summary.get("slices", 1) > 1 else ""
    print(
        f"ran {printable(summary['method'])} on {summary['devices']} ranks ({summary['backend']}{', torch runtime' if summary['engine'] == 'torch' else ''}), {summary['stages']} stages, "
        f"{summary['microbatches']} microbatches{slices}: {summary['steps']} steps, median step {summary['median_step_ms']:.2f} ms "
        f"(schedule's makespan {summary['predicted_makespan']:.4g} in its time unit)"
    )
    print(f"loss {losses[0]:.6g}" + (f" -> {losses[-1]:.6g}" if len(losses) > 1 else ""))
    check = summary.get("check")
    if check is None:
        return
    if check["passed"]:
        print(
            f"check passed: loss and {check['parameters']} parameter gradients match the single-process reference "
            f"(largest relative error {check['max_relative_error']:.1e})"
        )
    else:
        print(f"check FAILED: {check['first_mismatch']}")


@app.command()
@user_errors
@with_debug
def profile(
    model: str = typer.Option(..., "--model", help=_MODEL_HELP),
    devices: int = typer.Option(..., "--devices", "-p", min=1, help="Pipeline devices (ranks)."),
    microbatches: int = typer.Option(..., "--microbatches", "-m", min=1, help="Microbatches per step."),
    placement: str = typer.Option("linear", help="linear | interleaved:V | vshape."),
    steps: int = typer.Option(5, "--steps", min=1, max=1_000_000, help="Measured steps (after one warm-up step)."),
    output: Path = typer.Option(..., "--output", "-o", help="Problem JSON to write."),
    backend: str = typer.Option("gloo", "--backend", help=_BACKEND_HELP),
    timeout: float = typer.Option(60.0, "--timeout", help=_TIMEOUT_HELP),
    threads: int | None = typer.Option(None, "--threads", min=1, help="Torch threads per rank; default cores / ranks."),
    memory_limit: float | None = typer.Option(
        None, "--memory-limit", help="Activation memory per device in GiB (positive), written into the problem; default unlimited."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the problem as JSON too."),
    per_layer: bool = typer.Option(
        False, "--per-layer", help="Measure each layer on its own (one rank, -p 1) and write a layers file for `solve`."
    ),
    debug: bool = typer.Option(False, "--debug", help=_DEBUG_HELP),
) -> None:
    """Measure per-stage F, B, W times, memory changes and transfer time; write a problem for `solve`.

    Memory is the activations a device holds for backward, in GiB: leave out the weights
    and optimizer state when you pick --memory-limit.

    With --per-layer: every layer of the model (embedding, each block, head) is its own
    stage on one rank, and the output is a layers file (times, memory changes and the
    layers' parameter memory) from which `solve` chooses the split.
    """
    # Options, environment and the output path are checked before torch loads.
    from optimizer.formats.choose import refuse_other_format
    from optimizer.io import check_outputs, validate_model, write_json_atomic
    from optimizer.problem import MAX_VALUE, Problem, check_size, placement_devices

    _check_options(timeout, backend, threads)
    # All but the limit's comparison with the measured forwards is checked before measuring.
    finite_option("--memory-limit", memory_limit, high=MAX_VALUE)
    if memory_limit is not None and memory_limit <= 0:
        raise InputError(f"--memory-limit: must be positive, got {memory_limit:g}")
    try:
        check_size(devices, None, microbatches)
    except ValueError as error:
        raise InputError(str(error)) from None
    layer_list: list[tuple[str, str]] = []
    if per_layer:
        if devices != 1 or placement != "linear" or memory_limit is not None:
            raise InputError("--per-layer: layers are measured one by one on one rank; give -p 1 and no --placement or --memory-limit")
        from runtime.models import model_layers

        model, layer_list = model_layers(model)
        placement = f"interleaved:{len(layer_list)}"
    num_stages = len(placement_devices(placement, devices))
    check_outputs([output], _model_files(model))
    refuse_other_format(output, "a layers file" if per_layer else "a problem")
    if _world_size(devices) != devices:
        raise InputError(f"devices: {devices}, but torchrun started {os.environ['WORLD_SIZE']} ranks")
    with interrupts_deferred():
        _start_rank_server()
        _require_torch("profile")
        from runtime.launch import launch, run_here, under_torchrun
        from runtime.models import load_model
        from runtime.profile import ProfileJob

    built = load_model(model, num_stages)
    job = ProfileJob(model, devices, microbatches, placement, steps=steps, timeout_s=timeout)
    result = run_here(job, backend, threads) if under_torchrun() else launch(job, devices, backend, threads, debug)
    if result is None:
        return
    if per_layer:
        from optimizer.layers import layers_to_json
        from runtime.layer_profile import layers_profile, parameter_bytes

        layers_file = layers_profile(result["problem"], layer_list, parameter_bytes(built.stages), result.get("fused_backward_ms"))
        write_json_atomic(output, layers_to_json(layers_file))
        if as_json:
            print(json.dumps(layers_to_json(layers_file)))
        else:
            print(one_line(f"wrote {output}: {layers_file.num_layers} layers of {model.partition(':')[0]}, measured on one rank"))
        return
    if memory_limit is not None:
        # Checked before anything is written: a limit below one forward names the stage.
        result["problem"] = validate_model(Problem, {**result["problem"], "memory_limit": memory_limit}, "profile").to_json()
    write_json_atomic(output, result["problem"])
    if as_json:
        print(json.dumps(result["problem"]))
        return
    _print_profile(result["problem"], result["fused_backward_ms"], output)


def _print_profile(problem: dict, fused_backward_ms: list[float], output: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{output}: {problem['num_devices']} devices, {problem['num_microbatches']} microbatches, comm {problem['comm_time']:.3f} ms"
    )
    for column in ("stage", "device", "F ms", "B ms", "W ms", "BW ms", "F MiB", "B MiB", "W MiB"):
        table.add_column(column, justify="right")
    for s, stage in enumerate(problem["stages"]):
        mem = stage["memory"]
        table.add_row(
            str(s),
            str(stage["device"]),
            f"{stage['forward']:.3f}",
            f"{stage['backward_input']:.3f}",
            f"{stage['backward_weight']:.3f}",
            f"{fused_backward_ms[s]:.3f}",
            *(f"{mem[kind] * 1024:.3g}" for kind in ("forward", "backward_input", "backward_weight")),
        )
    Console(highlight=False, markup=False).print(table)
    print("BW: the fused backward, written as each stage's `backward` (a BW op's time). Memory: MiB here, GiB in the file.")
    print(one_line(f"wrote {output}"))


signal.pthread_sigmask(signal.SIG_SETMASK, _mask_while_loading)  # one held since is taken here, as loading
for _held, _handler in _handlers_while_loading.items():
    signal.signal(_held, _handler)
if _interrupts_while_loading:
    print("interrupted", file=sys.stderr)
    raise SystemExit(128 + _interrupts_while_loading[0])


def _model_files(model: str) -> list[str]:
    """The files a model spec reads (the synthetic model's `problem=PATH`), which an output
    may not replace; read from the spec's text, before torch loads (the model's options
    are checked with it)."""
    name, _, options = model.partition(":")
    if name != "synthetic":
        return []
    return [value for key, _, value in (item.partition("=") for item in options.split(",")) if key.strip() == "problem" and value]


def main() -> int:
    """The console command: the app, then the rank server stopped with the process (see
    runtime/forkserver.stop_rank_server; tests run the app in one process and keep the
    server for the next launch). A rank of a torchrun job then ends at once, as the ranks
    of our own launcher do: torch's teardown of a process group at interpreter exit aborts
    now and then (SIGABRT after a run that succeeded, about 1 in 10 on gloo; torch alone
    does it too), and torchrun reports the job failed."""
    code = _console()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):  # closed or absent
                stream.flush()
        os._exit(code)
    return code


def _console() -> int:
    status = INTERRUPTED
    try:
        try:
            # A rank of a torchrun job keeps SIGTERM's default: torchrun stops its workers
            # with it, and a rank waiting for a transfer would see it only when the wait
            # ends (up to --timeout), where torchrun gives it 30 s before SIGKILL.
            status = run_app(app, terminations="RANK" not in os.environ)
        finally:
            stop_rank_server()
    except KeyboardInterrupt:
        # A second Ctrl-C while the first was being handled (the best schedule being
        # written, "interrupted" printed): the same exit status, not death by SIGINT.
        status = INTERRUPTED
    finally:
        _end_with_status(status)
    return status


def _end_with_status(status: int) -> None:
    """The work is done and `status` decided: a signal from now on ends the process with it.

    Python's shutdown first waits for threads still running (a user model's), where a
    signal must still end it, then puts the Python handlers back to the default and
    unloads OR-Tools, pandas and numpy (about 0.1 s), where a Ctrl-C killed the process by
    SIGINT (-2 to a parent). So: handlers that exit with the status until the threads are
    joined, then ignored signals (which stay ignored) from an exit hook, which runs after
    them."""

    def end(signum: int, frame: object) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()
        os._exit(status)

    def ignore() -> None:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, end)
    atexit.register(ignore)

"""Starting the ranks: one process per device on this host, or this process under torchrun.

`launch` starts `world_size` processes forked from a server that imported torch once
(runtime/forkserver.py, so ranks start in well under a second), wires them with a
TCPStore on 127.0.0.1 at a port the operating system picks, and watches them. When a
rank fails or dies, the others get a few seconds to fail on their own (a peer's
transfer fails at once when its connection closes) and are then stopped; the error
lists what each rank reported, the dead rank first.

`run_here` is the same entry for one rank of a torchrun job (RANK and WORLD_SIZE set).

Ctrl-C stops every rank without a traceback; a rank's unexpected exception is one line
in the error (its traceback is printed only with `debug`).
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist

from optimizer.errors import InputError, PipeschedError
from optimizer.interrupts import interrupts_deferred
from optimizer.lifeline import end_with
from runtime.environment import local_world_size, torchrun_world, under_torchrun
from runtime.forkserver import rank_context
from runtime.position import RankPosition

__all__ = ["LaunchError", "launch", "run_here", "torchrun_world", "under_torchrun"]

# How long the other ranks may take to fail on their own after one rank failed (a rank
# waiting for a transfer fails within the job's transfer timeout, when that is shorter).
_GRACE_SECONDS = 5.0


class LaunchError(PipeschedError):
    """One or more ranks failed; the message has each rank's report."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class Job(Protocol):
    @property
    def timeout_s(self) -> float: ...  # read-only: jobs are frozen dataclasses

    def execute(self, rank: int, world_size: int, device: torch.device, position: RankPosition | None = None) -> dict | None: ...


def default_threads(world_size: int) -> int:
    return max(1, (os.cpu_count() or 1) // world_size)


def rank_device(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise InputError("backend: nccl needs CUDA GPUs; use --backend gloo on CPU")
        if local_rank >= torch.cuda.device_count():
            raise InputError(f"backend: rank {local_rank} has no GPU ({torch.cuda.device_count()} visible)")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if backend != "gloo":
        raise InputError(f"backend: '{backend}' is not one of gloo, nccl")
    return torch.device("cpu")


def launch(job: Job, world_size: int, backend: str = "gloo", threads: int | None = None, debug: bool = False) -> dict:
    """Run `job` on `world_size` local ranks; rank 0's result, or LaunchError."""
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise InputError(f"backend: nccl needs {world_size} GPUs, {torch.cuda.device_count()} visible")
    threads = threads or default_threads(world_size)
    try:
        store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=job.timeout_s), wait_for_workers=False)
    except (RuntimeError, OSError) as error:
        raise LaunchError(f"cannot open the ranks' meeting point on 127.0.0.1: {_first_line(error)}", 2) from error
    context = rank_context()
    with tempfile.TemporaryDirectory(prefix="pipesched-") as results:
        positions = [RankPosition.shared(context) for _ in range(world_size)]
        processes = [
            context.Process(
                target=_rank_entry,
                args=(rank, world_size, store.port, backend, job, threads, results, debug, positions[rank], os.getpid()),
                name=f"pipesched-rank-{rank}",
            )
            for rank in range(world_size)
        ]
        try:
            # Ctrl-C while the server forks a rank (it may still be importing torch) would
            # leave that rank running, its pid unknown here: held until every rank has
            # started, then raised here, and the ranks are stopped below.
            with interrupts_deferred():
                for process in processes:
                    process.start()
            stopped = _watch(processes, min(_GRACE_SECONDS, job.timeout_s))
        finally:
            for process in processes:
                if process.pid is None:  # never started: starting an earlier one failed
                    continue
                if process.is_alive():
                    process.kill()
                process.join()
        reports = [_read(Path(results) / f"rank{rank}.pickle") for rank in range(world_size)]
    if all(report and report["ok"] for report in reports) and not stopped:
        first = reports[0]
        assert first is not None
        return first["result"]
    raise _failure(processes, reports, stopped, [position.describe() for position in positions])


def run_here(job: Job, backend: str = "gloo", threads: int | None = None) -> dict | None:
    """Run `job` as one rank of a torchrun job; rank 0 gets the result."""
    rank, world_size, local_rank = torchrun_world()
    device = rank_device(backend, local_rank)
    torch.set_num_threads(threads or default_threads(local_world_size(world_size)))
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=job.timeout_s), device_id=_device_id(device))
    except (ValueError, RuntimeError) as error:  # e.g. MASTER_ADDR unset, or the rendezvous timed out
        raise LaunchError(f"rank {rank}: cannot join the torchrun job: {_first_line(error)}", 2) from error
    try:
        return job.execute(rank, world_size, device)
    finally:
        dist.destroy_process_group()


def _device_id(device: torch.device) -> torch.device | None:
    # Binding the process group to its GPU lets NCCL set up its communicator eagerly.
    return device if device.type == "cuda" else None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{error.__class__.__name__}: {text.splitlines()[0]}" if text else error.__class__.__name__


def _rank_entry(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    job: Job,
    threads: int,
    results: str,
    debug: bool,
    position: RankPosition,
    launcher: int,
) -> None:
    path = Path(results) / f"rank{rank}.pickle"  # a job's result is any picklable value
    # The launcher stops its ranks on any end but being killed outright; then they end with it
    # (the rank server outlives it while they run: each rank holds its pipe), and remove the
    # launcher's results folder, which it can no longer remove itself.
    end_with(launcher, cleanup=lambda: shutil.rmtree(results, ignore_errors=True))
    try:
        torch.set_num_threads(threads)
        device = rank_device(backend, rank)
        timeout = datetime.timedelta(seconds=job.timeout_s)
        store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout, device_id=_device_id(device))
        result = job.execute(rank, world_size, device, position)
        _report(path, {"ok": True, "result": result})
        dist.destroy_process_group()
    except PipeschedError as error:
        _report(path, {"ok": False, "error": str(error), "exit_code": error.exit_code, "at": time.monotonic()})
        _exit(error.exit_code)
    except KeyboardInterrupt:  # Ctrl-C reaches every rank of the terminal's process group
        _report(path, {"ok": False, "error": f"rank {rank}: interrupted", "exit_code": 130, "at": time.monotonic()})
        _exit(130)
    except BaseException as error:  # a bug or a user model's exception: one line, the traceback on request
        if debug:
            traceback.print_exc()
        model = getattr(job, "model", None)
        text = f"rank {rank}: " + (f"model {model}: " if model else "") + _first_line(error)
        _report(path, {"ok": False, "error": text, "exit_code": 1, "at": time.monotonic()})
        _exit(1)


def _report(path: Path, outcome: dict) -> None:
    """Leave the rank's outcome for the launcher. After a Ctrl-C the launcher may already
    have stopped and removed the results folder: nobody reads the outcome then, and a
    traceback about it would only bury the launcher's one line."""
    with contextlib.suppress(OSError):
        path.write_bytes(pickle.dumps(outcome))


def _exit(code: int) -> None:
    # Skip interpreter teardown: a process group with transfers in flight can block it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _watch(processes: list, grace: float) -> set[int]:
    """Wait for all ranks; after the first failure, give the rest a grace period, then
    stop them. Returns the ranks that had to be stopped."""
    failed_at = None
    while True:
        alive = [p for p in processes if p.exitcode is None]
        if not alive:
            return set()
        if failed_at is None and any(p.exitcode not in (None, 0) for p in processes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace:
            stopped = {processes.index(p) for p in alive}
            for p in alive:
                p.kill()
            return stopped
        time.sleep(0.02)


def _read(path: Path) -> dict | None:
    try:
        return pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError):
        return None


def _failure(processes: list, reports: list[dict | None], stopped: set[int], whereabouts: list[str]) -> LaunchError:
    """One message for the whole failure: ranks that died first, then what the ranks
    reported (each distinct text once), then the ranks we stopped; a rank that died or
    was stopped is named with where it was (`whereabouts`, runtime/position.py)."""
    died, reported, halted = [], [], []
    for rank, (process, report) in enumerate(zip(processes, reports)):
        if report is not None and not report["ok"]:
            reported.append(report)
        elif rank in stopped:
            halted.append(f"rank {rank} was stopped after another rank failed, {whereabouts[rank]}")
        elif process.exitcode and process.exitcode < 0:
            died.append(f"rank {rank} died ({signal.Signals(-process.exitcode).name}) {whereabouts[rank]}")
        elif process.exitcode:
            died.append(f"rank {rank} exited with status {process.exitcode} without a report, {whereabouts[rank]}")
    # The first failure in time is the cause, the others its echoes (a peer's transfer
    # fails once the raising rank has gone); the monotonic clock is the host's, one for all ranks.
    reported.sort(key=lambda r: r.get("at", math.inf))
    messages = died + list(dict.fromkeys(r["error"] for r in reported)) + halted
    exit_code = 1 if died or not reported else reported[0]["exit_code"]
    return LaunchError("; ".join(messages) or "the ranks failed without a report", exit_code)

"""Ctrl-C held during a block that must not be cut in the middle, then raised after it; and
SIGTERM and SIGHUP handled as Ctrl-C."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C during the block and raise KeyboardInterrupt after it.

    For imports of C extensions (OR-Tools, PuLP's HiGHS, torch): one interrupted while it
    loads can turn the KeyboardInterrupt into an ImportError, which optional imports then
    swallow; for writing outputs, so that what was computed is written whole; and for
    starting processes, so that none is left running unknown to its parent.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


@contextlib.contextmanager
def terminations_as_interrupts() -> Iterator[list[int]]:
    """During the block, SIGTERM and SIGHUP (a job manager's stop, `timeout`, a closed
    terminal) do what Ctrl-C does at that moment: held inside `interrupts_deferred`, and
    otherwise a KeyboardInterrupt, so that the best schedule so far is written and the
    ranks and solver processes are stopped. Left at their default, they would end the
    process at once and leave its ranks running.

    Yields the signals received, for the caller's exit status (128 + signal, as shells
    expect). Main thread only (elsewhere a no-op); a signal whose handler is not the
    default (ignored under nohup, or set by the caller) keeps it.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def as_ctrl_c(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        ctrl_c = signal.getsignal(signal.SIGINT)
        if callable(ctrl_c):  # Python's (raises) or interrupts_deferred's (holds)
            ctrl_c(signal.SIGINT, frame)
        else:  # Ctrl-C ignored (a background job) or at its default: end as Ctrl-C would
            raise KeyboardInterrupt

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is signal.SIG_DFL:
            previous[signum] = signal.signal(signum, as_ctrl_c)
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

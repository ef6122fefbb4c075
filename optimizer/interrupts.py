"""Ctrl-C held during a block that must not be cut in the middle, then raised after it."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


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

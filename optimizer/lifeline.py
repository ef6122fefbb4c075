"""Helper processes that end with the process that started them.

pipesched starts processes of its own: the ranks of `run` and `profile`, the fluid
bound's worker. Its own end, Ctrl-C and termination signals stop them; a pipesched
process killed outright (kill -9, the out-of-memory killer) cannot, so each helper
watches its starter and ends with it, first removing the files only it still uses.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable


def end_with(starter: int, cleanup: Callable[[], None] | None = None) -> None:
    """End this process (exit status 1) as soon as process `starter` has ended, after
    `cleanup`. A daemon thread waits on it: a pidfd on Linux, a check every second
    elsewhere. Where the starter is already gone this process ends at once."""

    def end() -> None:
        if cleanup is not None:
            with contextlib.suppress(Exception):
                cleanup()
        os._exit(1)

    try:
        handle: int | None = os.pidfd_open(starter)
    except (AttributeError, OSError):  # another system, an older kernel, or already gone
        handle = None
        if not _alive(starter):
            end()

    def wait() -> None:
        if handle is not None:
            select.select([handle], [], [])
        else:
            while _alive(starter):
                time.sleep(1.0)
        end()

    threading.Thread(target=wait, name="pipesched-lifeline", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now holds the number: ours is gone
        return False
    return True

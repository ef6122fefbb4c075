"""The process server that forks the ranks, started before anything imports torch.

Ranks are forked from a server process that has imported torch and the runtime once
(a fresh interpreter takes seconds to import torch; a fork takes milliseconds). The
server imports them while this process goes on with its own work, so the two imports
overlap. Only the standard library (and the project's error type) is imported here.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from multiprocessing.context import ForkServerContext

# The longest path a Unix socket takes (Linux: 108 bytes with the final NUL), and what the
# server's socket adds to its folder: "/listener-" and 8 random characters.
SOCKET_PATH_MAX = 107
_SOCKET_NAME = len("/listener-12345678")


def rank_context() -> ForkServerContext:
    """The forkserver context, its server started (and importing the runtime) at first use."""
    _check_socket_folder()
    context = multiprocessing.get_context("forkserver")
    # torch.optim's optimizers import torch._dynamo when the first one is built: seconds of
    # imports, once per rank. Imported here once, every rank forked gets it for free.
    context.set_forkserver_preload(["runtime.launch", "torch._dynamo"])
    from multiprocessing import forkserver, resource_tracker

    # The server and the ranks it forks ignore Ctrl-C: the launcher stops them, and a
    # terminal's Ctrl-C (sent to the whole process group) would otherwise print a
    # traceback from every one of them. It is blocked here as well: Linux keeps a blocked
    # signal pending even while it is ignored, so a Ctrl-C within these few milliseconds
    # reaches the launcher once its handler is back (ignored alone, it was lost 2 times in
    # 51, and the run went on to exit 0). The threads the commands started while loading
    # keep it blocked (runtime/cli.py), so none of them takes it instead. The server and
    # its ranks inherit the mask; ignoring it, they never take it.
    # multiprocessing starts its resource tracker first, blocking Ctrl-C for that and then
    # unblocking it (not restoring it): inside this window that undid the block, and a
    # Ctrl-C in the 7 ms after was lost again. Started before, it is left alone here.
    resource_tracker.ensure_running()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return context


def _check_socket_folder() -> None:
    """InputError naming TMPDIR when the server's socket would not fit there (its folder
    lies under the temporary folder): multiprocessing fails with a traceback otherwise."""
    from multiprocessing import util

    from optimizer.errors import InputError

    folder = os.fsencode(util.get_temp_dir())  # TMPDIR's own pymp-XXXXXXXX folder
    if len(folder) + _SOCKET_NAME > SOCKET_PATH_MAX:
        base = os.path.dirname(folder)
        most = SOCKET_PATH_MAX - _SOCKET_NAME - (len(folder) - len(base))
        raise InputError(
            f"TMPDIR: {os.fsdecode(base)} is too long a path for the rank server's socket "
            f"(at most {most} bytes); set TMPDIR to a shorter folder, e.g. /tmp"
        )


def stop_rank_server() -> None:
    """End the rank server and the resource tracker it started, and reap both.

    Called as the console command ends. Left to themselves, both end once they notice that
    this process is gone (the server only after its imports, up to about two seconds after
    an early Ctrl-C), and the host's init process reaps them whenever it gets to it: until
    then they are processes the command left behind. Every rank has ended by now (the
    launcher stops and joins them), so nothing of the server is still needed. It may be
    deaf to its pipe while it imports torch, hence the kill. multiprocessing's own stop
    methods close their pipes and wait for them (private ones: where a Python lacks them,
    nothing is done here and both end as before).
    """
    from multiprocessing import forkserver, resource_tracker

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the command is over: nothing to cut short
    try:
        server = getattr(forkserver, "_forkserver", None)
        pid = getattr(server, "_forkserver_pid", None)
        if server is not None and pid is not None and hasattr(server, "_stop"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                server._stop()
        tracker = getattr(resource_tracker, "_resource_tracker", None)
        if tracker is not None and hasattr(tracker, "_stop"):
            with contextlib.suppress(OSError):
                tracker._stop()
    finally:
        signal.signal(signal.SIGINT, previous)

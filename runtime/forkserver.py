"""The process server that forks the ranks, started before anything imports torch.

Ranks are forked from a server process that has imported torch and the runtime once
(a fresh interpreter takes seconds to import torch; a fork takes milliseconds). The
server imports them while this process goes on with its own work, so the two imports
overlap. Only the standard library is imported here.
"""

from __future__ import annotations

import multiprocessing
import signal
from multiprocessing.context import ForkServerContext


def rank_context() -> ForkServerContext:
    """The forkserver context, its server started (and importing the runtime) at first use."""
    context = multiprocessing.get_context("forkserver")
    # torch.optim's optimizers import torch._dynamo when the first one is built: seconds of
    # imports, once per rank. Imported here once, every rank forked gets it for free.
    context.set_forkserver_preload(["runtime.launch", "torch._dynamo"])
    from multiprocessing import forkserver

    # The server and the ranks it forks ignore Ctrl-C: the launcher stops them, and a
    # terminal's Ctrl-C (sent to the whole process group) would otherwise print a
    # traceback from every one of them.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)
    return context

"""Run CBC so that it ends with the solve that started it
(python cbc_watch.py STARTER FOLDER CBC [CBC's arguments...]).

PuLP starts CBC as a program of its own and waits for it. Ctrl-C and the solve's deadline
stop it (optimizer.exact.milp kills the processes using its folder); a solve killed
outright (kill -9, the out-of-memory killer) cannot, and CBC ran on to its own time limit
and left the folder with the model behind. PuLP runs this watcher in CBC's place: it
starts CBC, which the kernel kills when the watcher ends (Linux's parent-death signal, so
killing the watcher is killing CBC), and ends with the solve (optimizer.lifeline),
removing the folder. It exits with CBC's status. Of pipesched it imports only
optimizer.lifeline (the standard library alone): it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

# prctl(2) option: the signal a process gets when its parent ends.
PR_SET_PDEATHSIG = 1


def _dies_with(parent: int):
    """A preexec function: the child gets SIGKILL when `parent` ends (and ends at once if it has)."""
    libc = ctypes.CDLL(None, use_errno=True)

    def arm() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the watcher ended before the signal was armed
            os._exit(1)

    return arm


def main(starter: int, folder: str, program: list[str]) -> int:
    # A terminal's Ctrl-C reaches CBC and the solve too; the solve decides (it kills us).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from optimizer.lifeline import end_with

    cbc = subprocess.Popen(program, preexec_fn=_dies_with(os.getpid()))

    def terminated(signum: int, frame: object) -> None:
        # The solve stops us so (its deadline, Ctrl-C): CBC is killed and reaped here, so
        # that no ended CBC waits for another process to reap it.
        with contextlib.suppress(OSError):
            os.kill(cbc.pid, signal.SIGKILL)
            os.waitpid(cbc.pid, 0)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    stopping = threading.Event()

    def stop() -> None:
        stopping.set()
        cbc.kill()
        shutil.rmtree(folder, ignore_errors=True)

    end_with(starter, cleanup=stop)
    status = cbc.wait()
    if stopping.is_set():
        # CBC ended because the solve did: the lifeline ends this process once the folder
        # is gone (returning now would end it first).
        threading.Event().wait()
    return status


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], sys.argv[3:]))

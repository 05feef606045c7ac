"""What a pool worker does first: leave Ctrl-C to its parent, and exit when the parent is gone.

`init_worker` is the process pool's initializer (`kvsim.sweep.executors.LocalExecutor`). It lives
in this small module, outside `kvsim.sweep` (whose import loads the engine, numpy and pyarrow:
seconds on a busy machine), so a spawned worker runs it right after starting: a parent killed
while its workers are still importing does not leave them behind either.

A worker polls its parent's pid rather than asking the kernel for a signal at the parent's death
(Linux's PR_SET_PDEATHSIG fires when the *thread* that started the worker exits, which would end
the workers of a pool created from a short-lived thread); the poll is portable and costs nothing.
"""

from __future__ import annotations

import os
import signal
import threading
import time

#: How often a worker checks that the process that started it is still its parent (seconds).
PARENT_POLL_S = 0.5
#: The exit status of a worker that found itself orphaned.
ORPHANED = 1


def init_worker(parent: int) -> None:
    """Ignore Ctrl-C (the parent stops the pool: no traceback per worker) and start the watch
    on `parent`, the pid of the process that started this worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(
        target=watch_parent, args=(parent,), name="kvsim-watch-parent", daemon=True
    ).start()


def watch_parent(parent: int, poll_s: float = PARENT_POLL_S) -> None:
    """Exit this process (without cleanup: its results have nowhere to go) as soon as its parent
    is no longer `parent`: the parent died and the worker was handed to another process."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    os._exit(ORPHANED)

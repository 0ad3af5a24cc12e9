"""Worker process pools that die with the process that started them.

A build killed with ``kill -9`` cannot shut its pool down, and spawned workers would go on
burning CPU as orphans. Each worker therefore watches its parent: a daemon thread polls the
parent's pid and ends the worker as soon as it changes (the worker was re-parented). Polling
works whatever thread created the pool (a parent-death signal would fire when that thread ends).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

PARENT_POLL_SECONDS = 0.5


def worker_pool(workers: int, initializer: Callable[..., None] | None = None,
                initargs: tuple = ()) -> ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes (fresh interpreters: no inherited DuckDB state)
    that exit when the calling process dies."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(os.getpid(), initializer, initargs))


def exit_with_parent(parent: int) -> None:
    """In a worker process: end it as soon as ``parent`` (the pid that started it) is gone."""
    threading.Thread(target=_watch_parent, args=(parent,), name="exit-with-parent", daemon=True).start()


def _start_worker(parent: int, initializer: Callable[..., None] | None, initargs: tuple) -> None:
    exit_with_parent(parent)
    if initializer is not None:
        initializer(*initargs)


def _watch_parent(parent: int) -> None:
    event = threading.Event()
    while os.getppid() == parent:
        event.wait(PARENT_POLL_SECONDS)
    os._exit(1)

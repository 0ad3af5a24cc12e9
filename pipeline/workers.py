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
from pathlib import Path

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


def process_tree(root: int) -> list[int]:
    """``root`` and every live descendant, from the parent links in /proc (Linux): the processes a
    build runs in, whose memory the benchmark and the scale test add up."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after "pid (comm)": state, ppid
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def resident_bytes(pid: int) -> int:
    """The resident set size of ``pid`` now (0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0

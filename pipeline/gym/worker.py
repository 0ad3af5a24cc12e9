"""The python tool's worker: runs inside the bubblewrap sandbox, never imported by the gym itself.

Started as ``python -I worker.py CONFIG_JSON``. It first drops privileges and sets its resource
limits (before any agent code exists), checks it cannot see the benchmark folder, then serves
framed messages on the pipes it was started with: ``run`` executes code in one persistent
namespace; ``sql(query)`` inside that code asks the parent, which answers with Arrow IPC bytes
(data only) or an error. Frames: one kind byte (``J`` JSON, ``A`` Arrow) and a 4-byte length.
"""

import ast
import ctypes
import io
import json
import os
import resource
import struct
import sys
import traceback

PR_SET_NO_NEW_PRIVS = 38


def _limit(config):
    if config["uid"] is not None:
        os.setgroups([])
        os.setgid(config["uid"])
        os.setuid(config["uid"])
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    for name, value in config["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))


class Channel:
    def __init__(self, fd_in, fd_out):
        self.fd_in, self.fd_out = fd_in, fd_out

    def send(self, kind, payload):
        data = struct.pack(">cI", kind, len(payload)) + payload
        while data:
            data = data[os.write(self.fd_out, data):]

    def send_json(self, obj):
        self.send(b"J", json.dumps(obj).encode())

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = os.read(self.fd_in, n - len(buf))
            if not chunk:
                raise EOFError("parent closed the channel")
            buf += chunk
        return buf

    def receive(self):
        kind, size = struct.unpack(">cI", self._read(5))
        return kind, self._read(size)


class CappedText(io.TextIOBase):
    """Keeps the first ``cap`` characters written and counts the rest."""

    def __init__(self, cap):
        self.cap, self.parts, self.kept, self.dropped = cap, [], 0, 0

    def writable(self):
        return True

    def write(self, s):
        s = str(s)
        room = self.cap - self.kept
        if room > 0:
            self.parts.append(s[:room])
            self.kept += min(room, len(s))
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def text(self):
        out = "".join(self.parts)
        return out + (f"\n[... {self.dropped:,} more characters not shown]" if self.dropped else "")


class SqlError(Exception):
    """The gym refused or failed the query (same messages as the sql tool)."""


def main():
    config = json.loads(sys.argv[1])
    _limit(config)
    channel = Channel(os.dup(0), os.dup(1))
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    main_pid = os.getpid()

    def sql(query):
        """Run one guarded SELECT on the episode's database; returns a pandas DataFrame."""
        if os.getpid() != main_pid:
            raise SqlError("sql() works only in the worker's own process, not in a forked one")
        channel.send_json({"op": "sql", "query": query})
        kind, payload = channel.receive()
        if kind == b"J":
            raise SqlError(json.loads(payload)["error"])
        return pa.ipc.open_stream(payload).read_all().to_pandas()

    namespace = {"__name__": "__main__", "sql": sql, "pd": pd, "np": np, "SqlError": SqlError}
    channel.send_json({"op": "ready", "sees_benchmark": any(os.path.exists(p) for p in config["hidden"]),
                       "uid": os.getuid()})
    while True:
        _, payload = channel.receive()
        request = json.loads(payload)
        out, err = CappedText(config["output_chars"]), CappedText(config["output_chars"])
        sys.stdout, sys.stderr = out, err
        error = None
        try:
            _run(request["code"], namespace)
        except BaseException:  # noqa: BLE001  the agent's exception (SystemExit too) is its output, not ours
            error = _agent_traceback()
        finally:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        if os.getpid() != main_pid:  # a process the agent forked must not speak for the worker
            os._exit(0)
        channel.send_json({"op": "done", "stdout": out.text(), "stderr": err.text(),
                           "error": error[-config["output_chars"]:] if error else None})


def _agent_traceback():
    """The traceback of the agent's exception, with the worker's own frames left out."""
    summary = traceback.TracebackException(*sys.exc_info())
    summary.stack = traceback.StackSummary.from_list([f for f in summary.stack if f.filename == "<cell>"])
    return "".join(summary.format())


def _run(code, namespace):
    """Execute ``code``; like a notebook cell, a final expression's value is printed."""
    tree = ast.parse(code, "<cell>", "exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), namespace)  # noqa: S102  (running agent code is the point)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
        if value is not None:
            print(repr(value))


if __name__ == "__main__":
    main()

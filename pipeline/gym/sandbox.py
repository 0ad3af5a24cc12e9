"""The python tool's sandbox: one persistent worker process per episode, isolated by bubblewrap.

The worker runs in new mount, network, pid, ipc and uts namespaces (plus a user namespace when
the gym does not run as root; as root it instead drops to uid ``nobody`` so the process limit
binds). Its file system holds only /usr, the Python installation, the worker script and two
size-capped tmpfs folders (/scratch, /tmp): the benchmark folder does not exist there. The
environment is cleared, and the worker caps its own CPU time, address space, processes, open
files and file size before it reads any agent code. The parent never unpickles anything: it
reads JSON frames and sends query results as Arrow IPC. A call that outlives its wall time kills
the worker's whole process group; the next call starts a fresh worker. If isolation cannot be
set up, :class:`SandboxUnavailable` is raised and the tool refuses: code never runs unconfined.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, NoReturn

import pyarrow as pa

from pipeline.gym.models import Limits

WORKER = Path(__file__).with_name("worker.py")
NOBODY = 65534
STARTUP_SECONDS = 60.0
MAX_FRAME = 4 * 2**20
# Hardware facts numpy's OpenBLAS needs on some processors: passed through, nothing else is.
PASSED_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


class SandboxUnavailable(RuntimeError):
    """Isolation cannot be set up here, so python is refused."""


class WorkerGone(RuntimeError):
    """The worker died, broke the protocol or ran out of time; it has been killed."""


def _python_roots() -> list[Path]:
    """Folders the worker's interpreter and its packages live in."""
    roots = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).parent.parent}
    roots |= {Path(os.path.realpath(r)) for r in roots}
    return sorted(r for r in roots if not str(r).startswith("/usr"))


def bwrap_command(hidden: list[Path], limits: Limits) -> list[str]:
    """The bubblewrap command line running the worker; refuses when a hidden path would be visible."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("python is unavailable: bubblewrap (bwrap) is not installed "
                                 "(Debian package 'bubblewrap')")
    binds = [Path("/usr"), *_python_roots()]
    for secret in hidden:
        real = Path(os.path.realpath(secret))
        for root in binds:
            if real == root or root in real.parents:
                raise SandboxUnavailable(f"python is unavailable: the benchmark folder {real} lies inside "
                                         f"{root}, which the sandbox must mount")
    as_root = os.geteuid() == 0
    cmd = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
           "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL"]
    # as root: no user namespace, but the worker keeps only what it needs to drop to nobody at once
    cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if as_root else ["--unshare-user"]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/scratch", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MPLCONFIGDIR": "/scratch",
           **{k: os.environ[k] for k in PASSED_ENV if k in os.environ}}
    for k, v in env.items():
        cmd += ["--setenv", k, v]
    cmd += ["--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--symlink", "usr/bin", "/bin", "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
            "--ro-bind-try", "/etc/localtime", "/etc/localtime"]
    size = str(limits.python_file_mb * 2**20)
    cmd += ["--ro-bind", str(WORKER), "/gym/worker.py", "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", size, "--tmpfs", "/scratch",
            "--perms", "1777", "--size", size, "--tmpfs", "/tmp", "--chdir", "/scratch"]
    # The Python installation last, so a scratch tmpfs never hides it (a venv under /tmp); its
    # parent folders are made traversable for the unprivileged worker.
    made = {Path("/tmp"), Path("/scratch")}
    for path in binds[1:]:
        for parent in reversed(path.parents):
            if parent != Path("/") and parent not in made:
                cmd += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        cmd += ["--ro-bind", str(path), str(path)]
    uid = NOBODY if as_root else os.getuid()
    config = {
        "uid": NOBODY if as_root else None,
        "hidden": [str(p) for p in hidden],
        "output_chars": limits.output_bytes,
        "rlimits": {
            "RLIMIT_CPU": limits.python_cpu_seconds,
            "RLIMIT_AS": limits.python_memory_mb * 2**20,
            "RLIMIT_NPROC": _processes_of(uid) + limits.python_processes + 1,
            "RLIMIT_NOFILE": limits.python_open_files,
            "RLIMIT_FSIZE": limits.python_file_mb * 2**20,
            "RLIMIT_CORE": 0,
        },
    }
    return [*cmd, sys.executable, "-I", "/gym/worker.py", json.dumps(config)]


def _processes_of(uid: int) -> int:
    """Processes ``uid`` runs now: the process limit counts them, so the worker's budget comes on top."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:
                pass
    return count


class Worker:
    """One sandboxed Python process; :meth:`run` executes code and serves its ``sql()`` requests."""

    def __init__(self, hidden: list[Path], limits: Limits):
        self.limits = limits
        self.stderr_tail = ""
        self.proc = subprocess.Popen(bwrap_command(hidden, limits), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
        self._stdin, self._stdout, self._stderr = _pipes(self.proc)
        try:
            kind, payload = self._receive(time.monotonic() + STARTUP_SECONDS)
            ready = json.loads(payload) if kind == b"J" else {}
        except WorkerGone as exc:
            detail = self.stderr_tail
            raise SandboxUnavailable(f"python is unavailable: the sandbox did not start ({exc}"
                                     + (f"; bwrap said: {detail}" if detail else "") + ")") from None
        if ready.get("op") != "ready" or ready.get("sees_benchmark"):
            self.kill()
            raise SandboxUnavailable("python is unavailable: the sandbox check failed "
                                     "(the worker could see the benchmark folder)")

    def run(self, code: str, serve_sql: Callable[[str], pa.Table]) -> dict:
        """Execute ``code``; returns the worker's ``done`` message. Raises :class:`WorkerGone`."""
        deadline = time.monotonic() + self.limits.python_seconds
        self._send(b"J", json.dumps({"op": "run", "code": code}).encode())
        while True:
            kind, payload = self._receive(deadline)
            message = json.loads(payload) if kind == b"J" else None
            if not isinstance(message, dict):
                self.kill()
                raise WorkerGone("the worker sent a malformed message")
            if message.get("op") == "done":
                return message
            if message.get("op") != "sql" or not isinstance(message.get("query"), str):
                self.kill()
                raise WorkerGone("the worker sent an unknown request")
            try:
                table = serve_sql(message["query"])
            except Exception as exc:  # noqa: BLE001  refusals and query errors go back to the agent's code
                self._send(b"J", json.dumps({"error": str(exc)}).encode())
                continue
            self._send(b"A", _ipc(table))

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill the worker's whole process group (bwrap, its pid namespace and everything in it)."""
        if self._stdin.closed:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        fd = self._stderr.fileno()  # bwrap's own complaints, if it failed to set up the sandbox
        if select.select([fd], [], [], 0)[0]:
            self.stderr_tail = os.read(fd, 2000).decode(errors="replace").strip()
        for stream in (self._stdin, self._stdout, self._stderr):
            stream.close()

    def exit_description(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "stopped by the gym"
        # bwrap's pid 1 reports a child killed by signal N as exit code 128 + N, like a shell
        number = -code if code < 0 else code - 128 if code > 128 else 0
        if number in signal.Signals._value2member_map_:
            return f"killed by signal {signal.Signals(number).name}"
        return f"exited with code {code}"

    def _send(self, kind: bytes, payload: bytes) -> None:
        try:
            self._stdin.write(struct.pack(">cI", kind, len(payload)) + payload)
            self._stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            self._gone(f"the worker {self.exit_description()}")

    def _receive(self, deadline: float) -> tuple[bytes, bytes]:
        kind, size = struct.unpack(">cI", self._read(5, deadline))
        if kind not in (b"J", b"A") or size > MAX_FRAME:
            self._gone("the worker sent a malformed frame")
        return kind, self._read(size, deadline)

    def _read(self, n: int, deadline: float) -> bytes:
        fd = self._stdout.fileno()
        buf = b""
        while len(buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                self._gone("time limit")
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                try:
                    self.proc.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
                self._gone(f"the worker {self.exit_description()}")
            buf += chunk
        return buf

    def _gone(self, reason: str) -> NoReturn:
        self.kill()
        raise WorkerGone(reason)


def _pipes(proc: subprocess.Popen[bytes]) -> tuple[IO[bytes], IO[bytes], IO[bytes]]:
    """The worker's stdin, stdout and stderr: always there, as :class:`Worker` starts it with three pipes."""
    if proc.stdin is None or proc.stdout is None or proc.stderr is None:
        raise RuntimeError("the python worker was started without pipes for stdin, stdout and stderr")
    return proc.stdin, proc.stdout, proc.stderr


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()

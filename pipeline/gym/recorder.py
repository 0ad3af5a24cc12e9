"""Trajectories as JSONL: one finished episode a line, in the chat-with-tool-calls shape trainers read.

Each line holds ``messages`` (system, user, assistant ``tool_calls``, ``tool`` results), ``tools``
(the JSON schemas offered) and ``metadata`` (pair, side, trial, reward, termination, steps,
seconds, env version). ``datasets.load_dataset("json", data_files=path)`` loads the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Self

from pipeline.gym.env import Env


class Recorder:
    """Appends finished episodes to ``path`` (created with its folder); use as a context manager."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self.count = 0

    def record(self, env: Env, trial: int = 0) -> dict:
        """Write ``env``'s finished episode as one line; returns the record."""
        record = env.trajectory(trial)
        self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        self._file.flush()
        self.count += 1
        return record

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

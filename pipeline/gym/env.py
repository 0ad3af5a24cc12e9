"""Episodes: one pair's question on its clean or noisy database, tools, and the environment's verdict.

``Env`` reads only a built benchmark folder. Every Env of a process shares one loaded
:class:`pipeline.gym.database.Benchmark`; each has its own cursor (its episode's overlay) and,
once ``python`` is called, its own sandboxed worker. The gold answer and the expected behaviour
never leave the Env until the episode ends, and then only in ``info``.
"""

from __future__ import annotations

import functools
import json
import os
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Self

import pyarrow as pa

from pipeline.gym.database import Benchmark, Pair, QueryError
from pipeline.gym.models import (
    SIDES,
    ActionError,
    Column,
    EpisodeState,
    Limits,
    Observation,
    Start,
    TableInfo,
    _Action,
    arguments_of,
    is_side,
    parse_action,
    tool_schemas,
)
from pipeline.gym.sandbox import Worker
from pipeline.gym.scoring import judge
from pipeline.gym.tools import TOOLS

GYM_VERSION = "2"  # 2: the question follows the schema in the first user message

SYSTEM_PROMPT = """You answer clinical questions from a MIMIC-IV database (DuckDB). The records may \
contain errors, gaps or contradictions, and a question may not be answerable from them: check the \
data before you trust it.
Tools: sql (one read-only SELECT), python (pandas as pd, numpy as np, and sql(query) returning a \
DataFrame; variables persist). Finish with exactly one of:
- answer(value): numbers with at least 2 decimals, dates as YYYY-MM-DD, date-times as \
YYYY-MM-DD HH:MM:SS, yes/no, and a JSON array for a list or set;
- abstain(reason, category): the data cannot support any answer;
- flag(category, evidence, answer): a data problem affects the answer; give the answer the data \
still support, if there is one."""


class EpisodeError(RuntimeError):
    """The call does not fit the episode's state (no reset yet, or the episode is over)."""


@functools.cache  # read from the package metadata: ~7 ms a call, a sixth of a scripted episode
def env_version() -> str:
    try:
        return f"{version('ehr-robustgym')}+gym{GYM_VERSION}"
    except PackageNotFoundError:
        return f"unknown+gym{GYM_VERSION}"


class Env:
    """``reset(pair_id, side)`` then ``step(tool_call)`` until ``done``; see the README's gym section."""

    def __init__(self, benchmark_dir: str | os.PathLike, limits: Limits | None = None):
        self.limits = limits or Limits()
        self.benchmark = Benchmark.open(benchmark_dir, self.limits.sql_memory_mb)
        self.db = self.benchmark.connect()
        self.tools = tool_schemas(self.benchmark.categories)
        self.tables = [TableInfo(name=t, columns=[Column(name=n, type=ty) for n, ty in cols])
                       for t, cols in self.benchmark.tables.items()]
        self.schema_text = "\n".join(f"{t.name}({', '.join(f'{c.name} {c.type}' for c in t.columns)})"
                                     for t in self.tables)
        self._worker: Worker | None = None
        self._pair: Pair | None = None
        self._state: EpisodeState | None = None
        self._verdict: dict | None = None
        self._episodes = 0
        self._started = 0.0
        self._seconds = 0.0
        self.messages: list[dict] = []

    # ------------------------------------------------------------------ episodes
    def reset(self, pair_id: str, side: str = "noise") -> Start:
        """Start an episode on ``pair_id``: its clean question on the clean base, or its noisy one."""
        if not is_side(side):
            raise ValueError(f"side must be one of {', '.join(SIDES)}; got {side!r}")
        pair = self.benchmark.pair(pair_id)
        self._stop_worker()
        self.db.use(pair_id, side)
        self._episodes += 1
        self._pair, self._verdict = pair, None
        question = pair.question(side)
        self._state = EpisodeState(episode_id=self._episodes, pair_id=pair_id, side=side, question=question)
        # The question comes last: every episode's prompt then shares the long schema as a prefix,
        # which model servers cache (llama.cpp, vLLM, hosted APIs) instead of reading it again.
        prompt = (f"Tables (DuckDB types):\n{self.schema_text}\n\n"
                  f"Problem categories (for abstain and flag): {', '.join(self.benchmark.categories)}\n\n"
                  f"Question: {question}")
        self.messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
        self._started, self._seconds = time.perf_counter(), 0.0
        return Start(content=prompt, pair_id=pair_id, side=side, question=question, tables=self.tables,
                     tools=self.tools)

    def step(self, call) -> Observation:
        """Run one tool call (OpenAI shape or typed action); errors the agent caused come back as text."""
        state = self._require_open()
        state.step_count += 1
        call_id = f"call_{state.step_count}"
        action: _Action | None
        try:
            action = parse_action(call)
        except ActionError as exc:
            raw = call.get("function", call) if isinstance(call, dict) else {}
            raw = raw if isinstance(raw, dict) else {}
            name = raw.get("name")
            name = name if isinstance(name, str) else "invalid"
            arguments = raw.get("arguments", {})
            content, terminal, action = f"error: {exc}", False, None
            self._record_call(call_id, name, arguments if isinstance(arguments, str) else
                              json.dumps(arguments, default=str))
        else:
            self._record_call(call_id, action.tool, json.dumps(arguments_of(action), ensure_ascii=False))
            content, terminal = TOOLS[action.tool](self, action)
        reward, info = None, {}
        if terminal and action is not None:  # only a parsed action's tool ends an episode
            self._finish(state, judge(self._require_pair(), state.side, action), action.tool)
        elif state.step_count >= self.limits.max_steps:
            verdict = judge(self._require_pair(), state.side, _NoAction())
            verdict["reason"] = f"no answer, abstention or flag within {self.limits.max_steps} steps"
            self._finish(state, verdict, "step_limit")
            content += f"\n[step limit of {self.limits.max_steps} reached: the episode is over]"
        if state.done:
            reward, info = state.reward, {**self._require_verdict(), "termination": state.termination}
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        return Observation(content=content, done=state.done, reward=reward, info=info)

    @property
    def state(self) -> EpisodeState:
        return self._require_state().model_copy()

    @property
    def reward(self) -> float | None:
        return self._state.reward if self._state else None

    @property
    def verdict(self) -> dict | None:
        """The environment's verdict once the episode is over (expected vs given, and why)."""
        return dict(self._verdict) if self._verdict else None

    def trajectory(self, trial: int = 0) -> dict:
        """The finished episode as one training record: messages, tools and metadata."""
        state = self.state
        if not state.done:
            raise EpisodeError("the episode is not over yet: it has no reward to record")
        pair, verdict = self._require_pair(), self._require_verdict()
        return {
            "messages": self.messages,
            "tools": self.tools,
            "metadata": {
                "pair_id": pair.pair_id, "side": state.side, "intent": pair.intent, "level": pair.level,
                "noise_level": pair.noise_level, "operator": pair.operator, "seed": pair.seed, "trial": trial,
                "reward": state.reward, "termination": state.termination, "verdict": verdict["reason"],
                "steps": state.step_count, "seconds": round(self._seconds, 6), "env_version": env_version(),
            },
        }

    def close(self) -> None:
        self._stop_worker()
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ used by the tools
    def python_worker(self) -> Worker:
        """The episode's sandboxed worker, started (again) when there is none alive."""
        if self._worker is not None and not self._worker.alive:
            self._stop_worker()
        if self._worker is None:
            folder = self.benchmark.folder
            self._worker = Worker([folder, Path(os.path.realpath(folder / "staged")), self.benchmark.staged_file],
                                  self.limits)
        return self._worker

    def python_sql(self, query: str) -> pa.Table:
        """``sql()`` inside the worker: the same guarded path as the sql tool, with a larger row cap."""
        table = self.db.query(query, self.limits.sql_seconds)
        if table.num_rows > self.limits.python_sql_rows:
            raise QueryError(f"the result has {table.num_rows:,} rows; sql() returns at most "
                             f"{self.limits.python_sql_rows:,}: aggregate or filter in SQL")
        return table

    # ------------------------------------------------------------------ internals
    def _require_state(self) -> EpisodeState:
        if self._state is None:
            raise EpisodeError("no episode yet: call reset(pair_id, side) first")
        return self._state

    def _require_open(self) -> EpisodeState:
        state = self._require_state()
        if state.done:
            raise EpisodeError(f"the episode is over ({state.termination}); "
                               "no more tool calls: call reset() to start another")
        return state

    def _require_pair(self) -> Pair:
        if self._pair is None:
            raise EpisodeError("no episode yet: call reset(pair_id, side) first")
        return self._pair

    def _require_verdict(self) -> dict:
        if self._verdict is None:
            raise EpisodeError("the episode is not over yet: it has no verdict")
        return self._verdict

    def _record_call(self, call_id: str, name: str, arguments: str) -> None:
        self.messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]})

    def _finish(self, state: EpisodeState, verdict: dict, termination: str) -> None:
        self._verdict = verdict
        state.done, state.termination = True, termination
        state.reward = 1.0 if verdict["correct"] else 0.0
        self._seconds = time.perf_counter() - self._started
        self._stop_worker()

    def _stop_worker(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None


class _NoAction:
    """Stands for "no terminal action" when the step limit ends an episode."""

    tool = "none"

    def model_dump(self, exclude=None) -> dict:
        return {}

"""An environment class for TRL's ``GRPOTrainer(environment_factory=GymTRLEnvironment)``.

TRL builds instances with no arguments and pools them, calls ``reset(**row)`` with a dataset row
(``pair_id`` and ``side``) and appends the returned text to the prompt, offers every other public
method as a tool (schemas from the type hints and the ``Args:`` docstrings) and reads
``get_reward()``. TRL has no done signal, so after a terminal tool every further call raises.
"""

from __future__ import annotations

import os

from pipeline.gym.env import SYSTEM_PROMPT, Env

BENCHMARK_ENV_VAR = "EHR_ROBUSTGYM_BENCHMARK"


class GymTRLEnvironment:
    """One gym episode per ``reset``; the benchmark folder comes from :attr:`benchmark` or
    ``$EHR_ROBUSTGYM_BENCHMARK``."""

    benchmark: str | None = None

    def __init__(self):
        folder = self.benchmark or os.environ.get(BENCHMARK_ENV_VAR)
        if not folder:
            raise RuntimeError(f"set {BENCHMARK_ENV_VAR} (or the class attribute 'benchmark') "
                               "to a built benchmark folder")
        self._env = Env(folder)

    def reset(self, **row) -> str:
        """Start the row's episode (``pair_id``; ``side`` clean or noise, default noise); returns the prompt."""
        if "pair_id" not in row:
            raise KeyError("the dataset row needs a 'pair_id' column (and optionally 'side')")
        start = self._env.reset(row["pair_id"], row.get("side", "noise"))
        return f"{SYSTEM_PROMPT}\n\n{start.content}"

    def sql(self, query: str) -> str:
        """Run one read-only SQL query (DuckDB dialect) on the patient database.

        Args:
            query: One SELECT or WITH query over the MIMIC-IV tables listed in the prompt.
        """
        return self._call("sql", query=query)

    def python(self, code: str) -> str:
        """Run Python in a persistent sandbox with pandas as pd, numpy as np and sql(query) returning a DataFrame.

        Args:
            code: Python source; variables persist between calls; print() what you want to see.
        """
        return self._call("python", code=code)

    def answer(self, value: str) -> str:
        """Give the final answer; this ends the episode.

        Args:
            value: The answer: a number, text, yes/no, a date (YYYY-MM-DD), or a JSON array for a list or set.
        """
        return self._call("answer", value=value)

    def abstain(self, reason: str, category: str | None = None) -> str:
        """Decline to answer because the data cannot support an answer; this ends the episode.

        Args:
            reason: Why the question cannot be answered from this database.
            category: The kind of problem found, if known.
        """
        return self._call("abstain", reason=reason, category=category)

    def flag(self, category: str, evidence: str, answer: str | None = None) -> str:
        """Report a data problem that affects the answer, with the answer the data still support; this ends the episode.

        Args:
            category: The kind of problem found.
            evidence: What in the data shows the problem.
            answer: The answer once the problem is accounted for, if the data still support one.
        """
        return self._call("flag", category=category, evidence=evidence, answer=answer)

    def get_reward(self) -> float:
        """1.0 when the episode ended with the right answer or behaviour, else 0.0."""
        return self._env.reward or 0.0

    def _call(self, name: str, **arguments) -> str:
        arguments = {k: v for k, v in arguments.items() if v is not None}
        return self._env.step({"name": name, "arguments": arguments}).content

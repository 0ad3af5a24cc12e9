"""Scripted baseline agents: they read a pairs.parquet row (which a real agent never sees) and act
through the Env's tools like any agent, so the acceptance runs and the bench exercise the real path.

- ``gold``: runs the pair's gold SQL and answers what the ``sql`` tool shows (the clean side's oracle);
- ``expected``: does what the pair expects (answer/abstain/flag, with the expected answer);
- ``naive``: runs the pair's naive SQL and answers whatever it shows, trusting the data.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pipeline.gym.env import Env
from pipeline.gym.models import Observation


def result_values(content: str) -> list[str]:
    """First-column values of a ``sql`` tool result (header first, row-count footer last)."""
    lines = content.split("\n")
    if lines[0].startswith("error:"):
        return []
    return [line.split(" | ")[0] for line in lines[1:-1] if line.split(" | ")[0] != "NULL"]


def answer_from_rows(env: Env, query: str, answer_type: str) -> Observation:
    """Run ``query`` with the sql tool and answer its first column, as a literal agent would (unless
    the query was the episode's last allowed step)."""
    shown = env.step({"name": "sql", "arguments": {"query": query}})
    if shown.done:
        return shown
    values = result_values(shown.content)
    if answer_type in ("list", "set"):
        value = json.dumps([v for v in values if v != ""])
    else:
        value = values[0] if values else ""
    return env.step({"name": "answer", "arguments": {"value": value}})


def gold(env: Env, row: dict) -> Observation:
    return answer_from_rows(env, row["gold_sql"], row["answer_type"])


def naive(env: Env, row: dict) -> Observation:
    return answer_from_rows(env, row["naive_sql"], row["answer_type"])


def expected(env: Env, row: dict) -> Observation:
    behavior, answer = row["expected_behavior"], row["expected_answer"]
    value = json.loads(answer) if answer is not None else None
    if behavior == "answer":
        return env.step({"name": "answer", "arguments": {"value": value}})
    if behavior == "abstain":
        return env.step({"name": "abstain", "arguments": {"reason": "the data cannot support an answer",
                                                          "category": row["discrepancy"]}})
    arguments = {"category": row["discrepancy"], "evidence": "see the records"}
    if value is not None:
        arguments["answer"] = value
    return env.step({"name": "flag", "arguments": arguments})


AGENTS: dict[str, Callable[[Env, dict], Observation]] = {"gold": gold, "expected": expected, "naive": naive}

"""The gym's tools: one plain function per tool, registered in :data:`TOOLS`.

Each takes the Env and the typed action and returns ``(content, terminal)``. Errors an agent can
cause (a refused query, a Python exception) come back as text; only the gym's own faults raise.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline.gym.database import QueryError
from pipeline.gym.guard import GuardError
from pipeline.gym.models import Abstain, Answer, Flag, Python, Sql
from pipeline.gym.sandbox import SandboxUnavailable, WorkerGone

if TYPE_CHECKING:
    from pipeline.gym.env import Env


def render(table: pa.Table, max_rows: int, max_bytes: int) -> str:
    """Rows as ``a | b`` lines under a header, the total row count, and what was left out."""
    shown = table.slice(0, max_rows).to_pylist()
    lines = [" | ".join(table.column_names)] + [" | ".join(_cell(v) for v in row.values()) for row in shown]
    total = table.num_rows
    footer = f"({total:,} row{'s' if total != 1 else ''}"
    if total > len(shown):
        footer += f"; showing the first {len(shown):,}"
    text = "\n".join(lines)
    if len(text.encode()) > max_bytes:
        text = text.encode()[:max_bytes].decode(errors="ignore").rsplit("\n", 1)[0]
        footer += f"; output cut at {max_bytes:,} bytes"
    return f"{text}\n{footer})"


def _cell(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    return str(value).replace("\n", "\\n")


def sql_tool(env: Env, action: Sql) -> tuple[str, bool]:
    try:
        table = env.db.query(action.query, env.limits.sql_seconds)
    except (GuardError, QueryError) as exc:
        return f"error: {exc}", False
    return render(table, env.limits.sql_rows, env.limits.output_bytes), False


def python_tool(env: Env, action: Python) -> tuple[str, bool]:
    try:
        worker = env.python_worker()
    except SandboxUnavailable as exc:
        return f"error: {exc}", False
    try:
        done = worker.run(action.code, env.python_sql)
    except WorkerGone as exc:
        why = (f"it ran longer than the {env.limits.python_seconds:g} s limit" if str(exc) == "time limit"
               else str(exc))
        return (f"error: the python call was stopped: {why}. The worker was restarted for the next call; "
                "variables from earlier calls are gone."), False
    parts = [done["stdout"]]
    if done["stderr"]:
        parts.append(f"[stderr]\n{done['stderr']}")
    if done["error"]:
        parts.append(f"[error]\n{done['error']}")
    text = "\n".join(p.rstrip("\n") for p in parts if p) or "(no output; print() what you want to see)"
    data = text.encode()
    if len(data) > env.limits.output_bytes:
        text = data[:env.limits.output_bytes].decode(errors="ignore") + \
            f"\n[output cut at {env.limits.output_bytes:,} bytes]"
    return text, False


def answer_tool(env: Env, action: Answer) -> tuple[str, bool]:
    return "Answer recorded; the episode is over.", True


def abstain_tool(env: Env, action: Abstain) -> tuple[str, bool]:
    return "Abstention recorded; the episode is over.", True


def flag_tool(env: Env, action: Flag) -> tuple[str, bool]:
    return "Flag recorded; the episode is over.", True


# Each tool takes the action class of its name (models.ACTION_TYPES); a dict cannot tie a key to its
# value's argument type, so the registry types the action as Any.
TOOLS: dict[str, Callable[[Env, Any], tuple[str, bool]]] = {
    "sql": sql_tool, "python": python_tool, "answer": answer_tool, "abstain": abstain_tool, "flag": flag_tool,
}

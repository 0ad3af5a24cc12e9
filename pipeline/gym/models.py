"""Typed shapes of the gym: limits, actions (tool calls), observations and the episode state.

The state is what an agent or a trainer may read at any time, so it holds no gold answer, no
overlay and no expected behaviour; those stay inside :class:`pipeline.gym.env.Env`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

Side = Literal["clean", "noise"]
SIDES: tuple[Side, ...] = ("clean", "noise")


def is_side(value: object) -> TypeGuard[Side]:
    """Whether ``value`` is one of :data:`SIDES`."""
    return value in SIDES


class Limits(BaseModel):
    """Per-episode and per-call limits (defaults suit an LLM agent on the demo benchmark)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_steps: int = Field(default=30, ge=1, description="tool calls per episode, terminal call included")
    sql_seconds: float = Field(default=5.0, gt=0, description="wall time of one SQL query; the query is interrupted")
    sql_rows: int = Field(default=50, ge=1, description="rows shown by the sql tool")
    output_bytes: int = Field(default=8_000, ge=256, description="bytes of text one tool call returns")
    sql_memory_mb: int = Field(default=2_048, ge=64, description="DuckDB memory beyond the overlays, per process")
    python_seconds: float = Field(default=20.0, gt=0, description="wall time of one python call; its worker is killed")
    python_cpu_seconds: int = Field(default=120, ge=1, description="CPU time of one python worker over its life")
    python_memory_mb: int = Field(default=2_048, ge=256, description="address space of the python worker")
    python_processes: int = Field(default=16, ge=1, description="processes the python worker may add")
    python_open_files: int = Field(default=256, ge=32, description="open files of the python worker")
    python_file_mb: int = Field(default=64, ge=1, description="largest file, and size of the scratch folder")
    python_sql_rows: int = Field(default=200_000, ge=1, description="rows sql() may return inside python")


class _Action(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    if TYPE_CHECKING:
        # Every action names its tool: each subclass declares ``tool`` as a Literal pydantic field
        # (the discriminator of :data:`Action`). Declared here for the type checker only, so the
        # models and their schemas stay as they are.
        tool: str


class Sql(_Action):
    """Run one read-only SQL query (DuckDB dialect) on the episode's database."""

    tool: Literal["sql"] = "sql"
    query: str = Field(description="one SELECT or WITH query over the MIMIC-IV tables")


class Python(_Action):
    """Run Python code in the episode's persistent worker (pandas as pd, numpy as np, sql(query) -> DataFrame)."""

    tool: Literal["python"] = "python"
    code: str = Field(description="Python source; variables persist between calls; print() to see results")


class Answer(_Action):
    """Give the final answer (ends the episode)."""

    tool: Literal["answer"] = "answer"
    value: str | int | float | bool | list = Field(
        description="the answer: a number, text, yes/no, a date, or a JSON array for a list or set")


class Abstain(_Action):
    """Decline to answer because the data cannot support an answer (ends the episode)."""

    tool: Literal["abstain"] = "abstain"
    reason: str = Field(description="why the question cannot be answered from this database")
    category: str | None = Field(None, description="the kind of problem found, from the listed categories")


class Flag(_Action):
    """Report a data problem that affects the answer, with the answer the data still support (ends the episode)."""

    tool: Literal["flag"] = "flag"
    category: str = Field(description="the kind of problem found, from the listed categories")
    evidence: str = Field(description="what in the data shows the problem")
    answer: str | int | float | bool | list | None = Field(
        None, description="the answer once the problem is accounted for, if the data still support one; "
                          "for a name several entries match, [[entry, answer], ...]")


Action = Annotated[Sql | Python | Answer | Abstain | Flag, Field(discriminator="tool")]
ACTION_TYPES: dict[str, type[_Action]] = {m.model_fields["tool"].default: m
                                          for m in (Sql, Python, Answer, Abstain, Flag)}
TERMINAL = ("answer", "abstain", "flag")
_ACTION = TypeAdapter(Action)


class ActionError(ValueError):
    """A tool call that is not one of the gym's tools with valid arguments (shown to the agent)."""


def parse_action(call: Any) -> _Action:
    """A typed action from a typed action, ``{"name", "arguments"}`` (arguments a dict or JSON text),
    or an OpenAI ``tool_call`` (``{"function": {"name", "arguments"}}``)."""
    if isinstance(call, _Action):
        return call
    if not isinstance(call, dict):
        raise ActionError(f"a tool call must be a dict with 'name' and 'arguments'; got {type(call).__name__}")
    call = call.get("function", call)
    if not isinstance(call, dict):
        raise ActionError("'function' of a tool call must be an object with 'name' and 'arguments'")
    name, arguments = call.get("name"), call.get("arguments", {})
    if name not in ACTION_TYPES:
        raise ActionError(f"unknown tool {name!r}; the tools are {', '.join(ACTION_TYPES)}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ActionError(f"arguments of {name} are not valid JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise ActionError(f"arguments of {name} must be a JSON object")
    try:
        return _ACTION.validate_python({**arguments, "tool": name})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'][1:])) or name}: {e['msg']}" for e in exc.errors())
        raise ActionError(f"invalid arguments for {name}: {problems}") from None


def arguments_of(action: _Action) -> dict:
    return action.model_dump(exclude={"tool"}, exclude_none=True)


def tool_schemas(categories: list[str]) -> list[dict]:
    """The tools in OpenAI function-calling form; ``categories`` become the enum of category arguments."""
    tools = []
    for name, model in ACTION_TYPES.items():
        params = _strip_titles(model.model_json_schema())
        params["properties"].pop("tool")
        params.pop("description", None)
        for arg in ("category",):
            if arg in params["properties"]:
                params["properties"][arg] = {"type": "string", "enum": categories,
                                             "description": model.model_fields[arg].description}
        params["required"] = [k for k in params.get("required", []) if k != "tool"]
        params["additionalProperties"] = False
        if model.__doc__ is None:
            raise TypeError(f"{model.__name__} has no docstring: it is the {name} tool's description")
        tools.append({"type": "function", "function": {"name": name, "description": model.__doc__.strip(),
                                                       "parameters": params}})
    return tools


def _strip_titles(schema):
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title" and k != "default"}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


class Column(BaseModel):
    name: str
    type: str


class TableInfo(BaseModel):
    name: str
    columns: list[Column]


class Observation(BaseModel):
    """What one call returns: ``content`` is the text the agent reads; ``reward`` is set when ``done``."""

    content: str
    done: bool = False
    reward: float | None = None
    info: dict = Field(default_factory=dict)


class Start(Observation):
    """The first observation of an episode: the question, the tables and the tools."""

    pair_id: str
    side: Side
    question: str
    tables: list[TableInfo]
    tools: list[dict]


class EpisodeState(BaseModel):
    """Public bookkeeping of the current episode (never the gold answer or the overlay)."""

    episode_id: int
    pair_id: str
    side: Side
    question: str
    step_count: int = 0
    done: bool = False
    termination: str | None = None
    reward: float | None = None

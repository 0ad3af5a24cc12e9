"""The one interface every evaluated agent implements, and the registry the runner reads.

An agent plays one episode: it gets the gym's first observation and steps the :class:`Env` with
tool calls until the episode is done. Agents that read labels (``oracle``, ``naive``) receive the
pair's ``pairs.parquet`` row as ``task``; every other agent gets ``None`` and sees only what an
LLM would. Agents are built once per worker process from their options, so a factory must accept
the same keyword options everywhere.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pipeline.gym.env import Env
from pipeline.gym.models import Start


@dataclass(frozen=True)
class Usage:
    """What an episode cost the agent's model (zero for rule-based agents)."""

    tokens_in: int = 0
    tokens_out: int = 0


class Agent(Protocol):
    name: str  # the registry name, e.g. "checking"
    model: str | None  # the model an LLM agent calls; None for rule-based agents
    uses_labels: bool  # True only for agents that read the pair's row (oracle, naive)

    def play(self, env: Env, start: Start, task: dict | None, rng: random.Random) -> Usage:
        """Step ``env`` until the episode is done; ``rng`` is seeded per (pair, side, trial)."""
        ...


AgentFactory = Callable[..., Agent]
_factories: dict[str, AgentFactory] = {}


def register_agent(name: str) -> Callable[[AgentFactory], AgentFactory]:
    """Register a factory (a class or function taking keyword options) under ``name``."""
    def register(factory: AgentFactory) -> AgentFactory:
        if name in _factories:
            raise ValueError(f"agent {name!r} registered twice")
        _factories[name] = factory
        return factory
    return register


def make_agent(name: str, **options) -> Agent:
    """Build the agent ``name`` (its module is imported by :mod:`pipeline.eval.agents`)."""
    import pipeline.eval.agents  # noqa: F401  (fills the registry)

    if name not in _factories:
        raise ValueError(f"unknown agent {name!r}; choose one of {', '.join(sorted(_factories))}")
    return _factories[name](**options)


def agent_names() -> list[str]:
    import pipeline.eval.agents  # noqa: F401

    return sorted(_factories)

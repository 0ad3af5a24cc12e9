"""The two label-reading baselines, built on the gym's scripted agents (:mod:`pipeline.gym.agents`).

- ``oracle``: the pair's gold SQL on the clean side and its expected behaviour on the noise side;
  it must score 100% on both sides, so it proves the chain from benchmark to results.
- ``naive``: the obvious SQL for the question it is given (``gold_sql`` on the clean side,
  ``naive_sql`` on the noise side), answering whatever comes back: the careless agent.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from pipeline.eval.agent import Usage, register_agent
from pipeline.gym import agents as scripted
from pipeline.gym.env import Env
from pipeline.gym.models import Observation, Start

Script = Callable[[Env, dict], Observation]


class ScriptedAgent:
    """Plays one scripted agent per side; rule-based, so it uses no tokens and ignores ``rng``."""

    name: str
    model: str | None = None
    uses_labels: bool = True

    def __init__(self, name: str, clean: Script, noise: Script):
        self.name, self._scripts = name, {"clean": clean, "noise": noise}

    def play(self, env: Env, start: Start, task: dict | None, rng: random.Random) -> Usage:
        if task is None:
            raise ValueError(f"the {self.name} agent reads the pair's row; the runner passed none")
        self._scripts[start.side](env, task)
        return Usage()


@register_agent("oracle")
def oracle() -> ScriptedAgent:
    return ScriptedAgent("oracle", clean=scripted.gold, noise=scripted.expected)


@register_agent("naive")
def naive() -> ScriptedAgent:
    return ScriptedAgent("naive", clean=scripted.gold, noise=scripted.naive)

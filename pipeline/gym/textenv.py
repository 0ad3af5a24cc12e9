"""A Gymnasium-style face of the gym, without the gymnasium dependency: text in, text out.

``reset(seed, options)`` returns ``(prompt, info)``; ``step(action)`` takes one tool call as JSON
text (or a dict) and returns ``(observation, reward, terminated, truncated, info)``, where
``truncated`` means the step limit ended the episode.
"""

from __future__ import annotations

import json
import os
import random

from pipeline.gym.env import Env
from pipeline.gym.models import Limits


class TextEnv:
    """Episodes over ``pair_ids`` (default: every pair), drawn with the seed given to ``reset``."""

    def __init__(self, benchmark_dir: str | os.PathLike, limits: Limits | None = None,
                 pair_ids: list[str] | None = None):
        self.env = Env(benchmark_dir, limits)
        self.pair_ids = list(pair_ids) if pair_ids else sorted(self.env.benchmark.pairs)
        self._rng = random.Random(0)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """``options`` may name ``pair_id`` and ``side`` (default: a drawn pair, noise side)."""
        if seed is not None:
            self._rng.seed(seed)
        options = options or {}
        pair_id = options.get("pair_id") or self._rng.choice(self.pair_ids)
        start = self.env.reset(pair_id, options.get("side", "noise"))
        return start.content, {"pair_id": pair_id, "side": start.side, "tools": start.tools}

    def step(self, action: str | dict) -> tuple[str, float, bool, bool, dict]:
        if isinstance(action, str):
            try:
                action = json.loads(action)
            except json.JSONDecodeError:
                pass  # the Env answers that a tool call must be an object
        obs = self.env.step(action)
        truncated = obs.info.get("termination") == "step_limit"
        return obs.content, obs.reward or 0.0, obs.done and not truncated, truncated, obs.info

    def close(self) -> None:
        self.env.close()

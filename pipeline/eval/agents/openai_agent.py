"""The ``openai`` agent: a model behind any OpenAI-compatible chat-completions endpoint, with tools.

Each turn sends the gym's own message list (``env.messages``: system, user, then every tool call
and result the gym recorded, with the gym's call ids) and the gym's tool schemas, and hands each
tool call of the reply to ``env.step`` with its raw arguments text: malformed JSON or an unknown
tool comes back as the gym's error message, which the model reads on its next turn. The gym keeps
the message list itself, so the agent never appends to it.

A reply without a tool call is stepped as a call to no tool (the reply's text as its arguments):
the gym answers that it names no tool, which nudges the model, records the text in the
trajectory, and counts against the gym's step limit, so a model that only talks still ends its
episode (``step_limit``) after at most ``max_steps`` turns.

Retries: the client retries 408, 409, 429, 5xx, timeouts and refused connections ``max_retries``
times, waiting 0.5 s doubling to at most 8 s (minus up to 25% jitter), or the server's Retry-After
when it sends one (up to 2 minutes); then :class:`LLMError` ends the episode's run. The API key is
held by the client only: it is never part of the agent's state, of a trajectory, or of an error.
"""

from __future__ import annotations

import os
import random

import openai

from pipeline.eval.agent import Usage, register_agent
from pipeline.gym.env import Env
from pipeline.gym.models import Start

BASE_URL_ENV = "EHR_ROBUSTGYM_LLM_BASE_URL"
MODEL_ENV = "EHR_ROBUSTGYM_LLM_MODEL"
DEFAULT_MODEL = "gpt-4o-mini"


class LLMError(RuntimeError):
    """The endpoint failed after its retries (message without the key, no HTTP objects attached)."""


@register_agent("openai")
class OpenAIAgent:
    name = "openai"
    uses_labels = False

    def __init__(self, model: str | None = None, base_url: str | None = None, api_key: str | None = None,
                 temperature: float = 0.0, max_retries: int = 5, timeout: float = 300.0):
        self.model: str | None = model or os.environ.get(MODEL_ENV) or DEFAULT_MODEL
        self.base_url = base_url or os.environ.get(BASE_URL_ENV) or None  # None: the client's default
        self.temperature = temperature
        self._client = openai.OpenAI(base_url=self.base_url, max_retries=max_retries, timeout=timeout,
                                     api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none")

    def play(self, env: Env, start: Start, task: dict | None, rng: random.Random) -> Usage:
        tokens_in = tokens_out = 0
        done = False
        while not done:
            # content "" rather than null beside tool calls: llama.cpp's server refuses a null
            messages = [{**m, "content": m["content"] or ""} for m in env.messages]
            reply = self._complete(messages, start.tools, rng.randrange(2**31))
            if reply.usage is not None:
                tokens_in += reply.usage.prompt_tokens
                tokens_out += reply.usage.completion_tokens
            message = reply.choices[0].message if reply.choices else None
            calls = [{"name": c.function.name, "arguments": c.function.arguments}
                     for c in (message.tool_calls or []) if c.type == "function"] if message else []
            if not calls:
                calls = [{"name": None, "arguments": (message.content if message else None) or ""}]
            for call in calls:
                if (done := env.step(call).done):
                    break
        return Usage(tokens_in=tokens_in, tokens_out=tokens_out)

    def _complete(self, messages: list[dict], tools: list[dict], seed: int):
        try:
            # the gym's messages and tools are plain dicts, not the client's TypedDicts
            return self._client.chat.completions.create(  # type: ignore[call-overload]
                model=self.model, messages=messages, tools=tools, tool_choice="auto",
                temperature=self.temperature, seed=seed)
        except openai.APIError as exc:
            raise LLMError(f"{self.base_url or 'the OpenAI API'} (model {self.model}): "
                           f"{self._redact(str(exc))}") from None

    def _redact(self, text: str) -> str:
        key = self._client.api_key
        return text.replace(key, "***") if isinstance(key, str) and len(key) > 4 else text

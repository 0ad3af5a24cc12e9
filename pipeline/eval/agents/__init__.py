"""Every agent module, imported so that each registers itself (see :mod:`pipeline.eval.agent`)."""

from pipeline.eval.agents import baseline, checking, openai_agent  # noqa: F401

"""Every agent module, imported so that each registers itself (see :mod:`pipeline.eval.agent`)."""

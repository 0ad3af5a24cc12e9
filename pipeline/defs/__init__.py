"""Dagster definitions, one module per stage; :mod:`pipeline.definitions` merges them."""

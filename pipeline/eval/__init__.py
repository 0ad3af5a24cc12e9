"""Evaluation: agents play the gym's episodes; results, metrics (Clean vs Noise, pass^k) and reports.

Free of Dagster (``pipeline/defs`` wraps it), like the gym it drives.
"""

"""Values spliced into SQL text: the one place quoting happens.

DuckDB table functions (``read_parquet``, ``read_csv``) take their path as a string literal, not a
bound parameter, so every path goes through :func:`path_literal`: a folder such as
``~/O'Brien/mimic`` must not end the literal early.
"""

from __future__ import annotations

import os
from pathlib import Path


def quote_string(text: str) -> str:
    """``text`` as a SQL string literal (single quotes, embedded quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


def path_literal(path: str | os.PathLike) -> str:
    """A file path as a SQL string literal, with forward slashes on every platform."""
    return quote_string(Path(path).as_posix())


def parquet_scan(path: str | os.PathLike) -> str:
    """``read_parquet`` of one file, its columns exactly the file's: DuckDB would otherwise read a
    ``key=value`` folder in the path (``seed=0/``) as a hive partition and add a ``key`` column."""
    return f"read_parquet({path_literal(path)}, hive_partitioning = false)"


# year(t) = 2133 costs DuckDB 2.0's expression rewriter ~5 ms to plan, several times what the whole
# query otherwise costs on the demo (a quarter of the templates' SQL compares a year); the same
# function spelled date_part('year', t) is planned at the usual cost.
FAST_YEAR = "CREATE OR REPLACE MACRO main.year(x) AS date_part('year', x)"


def register_macros(con) -> None:
    """Functions the project's SQL reads the same, planned faster: on the connections that run the
    templates' SQL thousands of times (question generation, and overlays in the build and the gym)."""
    con.execute(FAST_YEAR).fetchall()

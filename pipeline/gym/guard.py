"""The one gate every agent query passes, from the ``sql`` tool and from ``sql()`` inside Python.

A query is parsed with sqlglot (DuckDB dialect) and accepted only when it is exactly one
SELECT/WITH query whose table references are unqualified MIMIC-IV table names (or CTEs of the
query) and whose functions are on an allow-list. The allow-list was derived from the function
node kinds the demo benchmark's gold and naive SQL use, plus common scalar, aggregate and window
functions; unknown functions (``exp.Anonymous``: ``getvariable``, ``query``, ``glob``, ``duckdb_*``)
and table functions (``read_csv``, ``range``) are refused. The hardened connection
(:mod:`pipeline.gym.database`) is the second line, never the first.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from pipeline.schema import ROW_ID, TABLES

MAX_QUERY_CHARS = 20_000

_FUNCTIONS = (
    # used by the demo benchmark's gold_sql / naive_sql (seed 0)
    "And", "ArgMax", "ArgMin", "ArrayAgg", "Avg", "Case", "Cast", "Coalesce", "Count", "DateDiff",
    "DenseRank", "Exists", "If", "Least", "LogicalOr", "Max", "Min", "Or", "Rank", "Round",
    "RowNumber", "Sum", "TimestampTrunc", "Year",
    # aggregates
    "AnyValue", "ApproxDistinct", "Corr", "CountIf", "CovarPop", "First", "GroupConcat", "Last",
    "LogicalAnd", "Median", "Mode", "PercentileCont", "PercentileDisc", "Stddev", "StddevPop",
    "StddevSamp", "Variance", "VariancePop",
    # window functions
    "CumeDist", "FirstValue", "Lag", "LastValue", "Lead", "NthValue", "Ntile", "PercentRank",
    # numbers
    "Abs", "Ceil", "Exp", "Floor", "Greatest", "IsInf", "IsNan", "Ln", "Log", "Nullif", "Pow",
    "Sign", "Sqrt", "TryCast",
    # text
    "Concat", "ConcatWs", "Contains", "EndsWith", "Left", "Length", "Lower", "Pad", "RegexpExtract",
    "RegexpLike", "RegexpReplace", "Repeat", "Replace", "Reverse", "Right", "Split", "SplitPart",
    "StartsWith", "StrPosition", "Substring", "Trim", "Upper",
    # dates and times
    "Date", "DateBin", "DateFromParts", "Day", "DayOfWeek", "DayOfYear", "Dayname", "Extract",
    "Hour", "LastDay", "Minute", "Month", "Monthname", "Quarter", "Second", "StrToTime",
    "TimeToStr", "TimeToUnix", "TimestampFromParts", "UnixToTime", "Week",
    # lists
    "Array", "ArrayContains", "ArrayDistinct", "ArrayFilter", "ArraySize", "ArraySort", "ArrayToString",
    # structs (the orphan_link recovery gathers a patient's stays as a list of them)
    "Struct",
)
ALLOWED_FUNCTIONS: frozenset[type] = frozenset(getattr(exp, name) for name in _FUNCTIONS)

_STATEMENTS: tuple[type, ...] = (
    exp.DDL, exp.DML, exp.Command, exp.Set, exp.Pragma, exp.Use, exp.Describe, exp.Show,
    exp.Transaction, exp.Commit, exp.Rollback, exp.Copy, exp.Attach, exp.Detach, exp.Into,
    exp.Install, exp.Export, exp.Summarize, exp.Create, exp.Drop, exp.Alter, exp.Insert,
    exp.Update, exp.Delete, exp.Merge, exp.Kill, exp.Analyze, exp.Grant, exp.Cache, exp.Uncache,
    exp.Refresh, exp.TruncateTable, exp.LoadData, exp.Execute, exp.Declare,
    exp.Placeholder, exp.Parameter, exp.SessionParameter,
)


class GuardError(ValueError):
    """The query was refused before it reached the database; the message is for the agent."""


def check(query: str) -> str:
    """The query, stripped, when it is safe to run on an episode's database; else :class:`GuardError`."""
    if not isinstance(query, str) or not query.strip():
        raise GuardError("query must be a non-empty string with one SELECT statement")
    if len(query) > MAX_QUERY_CHARS:
        raise GuardError(f"query is {len(query):,} characters long; the limit is {MAX_QUERY_CHARS:,}")
    query = query.strip()
    try:
        statements = [s for s in sqlglot.parse(query, read="duckdb") if s is not None]
    except (ParseError, TokenError) as exc:
        raise GuardError(f"could not parse the query: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise GuardError(f"exactly one statement is allowed; got {len(statements)}")
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        raise GuardError(f"only SELECT/WITH queries are allowed; got {type(tree).__name__.upper()}")
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for node in tree.walk():
        if isinstance(node, _STATEMENTS):
            raise GuardError(f"{type(node).__name__.upper()} is not allowed inside a query")
        if isinstance(node, exp.Func) and type(node) not in ALLOWED_FUNCTIONS:
            raise GuardError(f"function {_function_name(node)}() is not allowed")
        if isinstance(node, exp.Identifier) and node.name.lower() == ROW_ID:
            raise GuardError(f"{ROW_ID} is internal and cannot be queried")
        if isinstance(node, exp.Table):
            _check_table(node, query, ctes)
    return query


def _check_table(table: exp.Table, query: str, ctes: set[str]) -> None:
    ident = table.this
    if not isinstance(ident, exp.Identifier):
        raise GuardError(f"table functions are not allowed: {table.sql(dialect='duckdb')[:80]}")
    start = ident.meta.get("start")
    if start is None or query[start] == "'":
        raise GuardError(f"string literals cannot be used as tables: {ident.name[:80]!r}")
    if table.args.get("db") or table.args.get("catalog"):
        raise GuardError(f"use plain table names, without schema or catalog: {table.sql(dialect='duckdb')[:80]}")
    name = ident.name.lower()
    if name not in TABLES and name not in ctes:
        raise GuardError(f"unknown table {ident.name[:80]!r}; the MIMIC-IV tables are listed in the schema")


def _function_name(node: exp.Func) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.this)
    return node.sql_name().lower()

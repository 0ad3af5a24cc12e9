"""Gold answers: normalise a gold query's rows by answer type into canonical JSON text.

Policy (the gym scores against exactly this): ``number`` is a float rounded to 2 decimals;
``integer`` an int; ``boolean`` true/false; ``text`` a string; ``date`` ``YYYY-MM-DD``;
``datetime`` ``YYYY-MM-DDTHH:MM:SS``; ``list`` keeps the query's row order; ``set`` is sorted
and de-duplicated. List/set elements are normalised by their own Python type. Scalar types need
exactly one row of one column; more rows make the answer ambiguous.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json

DECIMALS = 2


class AnswerError(ValueError):
    """The gold rows give no usable answer; ``reason`` is the rejection counter's key."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _scalar(value):
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, (float, decimal.Decimal)):
        return round(float(value), DECIMALS)
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def _typed(value, answer_type: str):
    if answer_type == "number":
        return round(float(value), DECIMALS)
    if answer_type == "integer":
        return int(value)
    if answer_type == "boolean":
        return bool(value)
    if answer_type == "text":
        return str(value)
    if answer_type == "date":
        return (value.date() if isinstance(value, dt.datetime) else value).isoformat()
    if answer_type == "datetime":
        return value.isoformat(timespec="seconds")
    raise ValueError(f"unknown answer type {answer_type!r}")


def normalise(rows: list[tuple], answer_type: str) -> str:
    """Canonical JSON text of the answer; raises :class:`AnswerError` when it is empty or ambiguous."""
    if rows and len(rows[0]) != 1:
        raise AnswerError("gold_sql_not_one_column")
    values = [r[0] for r in rows]
    if answer_type in ("list", "set"):
        values = [_scalar(v) for v in values if v is not None and v != ""]
        if not values:
            raise AnswerError("empty_answer")
        if answer_type == "set":
            values = sorted(set(values), key=lambda v: (str(type(v)), v))
        return json.dumps(values, ensure_ascii=False, separators=(",", ":"))
    if len(values) > 1:
        raise AnswerError("ambiguous_answer")
    if not values or values[0] is None or values[0] == "":
        raise AnswerError("empty_answer")
    return json.dumps(_typed(values[0], answer_type), ensure_ascii=False, separators=(",", ":"))

"""Scoring, done by the environment alone: the given answer against the gold, per answer type.

Gold answers are JSON text normalised by :mod:`pipeline.questions.answers` (numbers rounded to
2 decimals, ``YYYY-MM-DD`` dates, ``YYYY-MM-DDTHH:MM:SS`` datetimes, sets sorted). One plain
function per answer type, registered in :data:`SCORERS`; each returns ``(correct, reason)``.
Nothing is matched by substring: a value is parsed whole or refused.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import unicodedata
from collections.abc import Callable
from typing import Any, Protocol

from pipeline.gym.models import Abstain, Answer, Flag

NUMBER_ABS_TOL = 0.005 + 1e-9  # half the gold's rounding unit (2 decimals)
NUMBER_REL_TOL = 1e-6

_NUMBER = re.compile(
    r"^\s*(?P<num>[+-]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
    r"\s*(?P<unit>%|[^\W\d_][^\s]*|[°µ][^\s]*)?\s*$")
_TRUE, _FALSE = {"true", "yes"}, {"false", "no"}
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class Unparseable(ValueError):
    pass


def parse_number(value) -> float:
    """A finite float from a number or a plain string ("1,234.5", "12 %", "7.0 mg/dL")."""
    if isinstance(value, bool) or value is None:
        raise Unparseable(f"{value!r} is not a number")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        m = _NUMBER.match(value)
        if not m:
            raise Unparseable(f"{value!r} is not a number (optionally followed by one unit)")
        number = float(m["num"].replace(",", ""))
    else:
        raise Unparseable(f"a {type(value).__name__} is not a number")
    if not math.isfinite(number):
        raise Unparseable(f"{value!r} is not a finite number")
    return number


def parse_integer(value) -> int:
    number = parse_number(value)
    if number != int(number):
        raise Unparseable(f"{value!r} is not a whole number")
    return int(number)


def parse_boolean(value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().casefold() in _TRUE | _FALSE:
        return value.strip().casefold() in _TRUE
    raise Unparseable(f"{value!r} is not yes/no/true/false")


def normalise_text(value) -> str:
    if isinstance(value, (bool, list, dict)) or value is None:
        raise Unparseable(f"{value!r} is not text")
    return " ".join(unicodedata.normalize("NFKC", str(value)).casefold().split())


def parse_datetime(value) -> dt.datetime:
    if not isinstance(value, str):
        raise Unparseable(f"{value!r} is not a date/time string")
    try:
        parsed = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise Unparseable(f"{value!r} is not an ISO date/time (YYYY-MM-DD HH:MM:SS)") from None
    if parsed.tzinfo is not None:
        raise Unparseable(f"{value!r} has a time zone; MIMIC-IV times have none")
    return parsed


def parse_date(value) -> dt.date:
    return parse_datetime(value).date()


def parse_items(value) -> list:
    """List items from a list, a JSON array, one item per line, or else comma-separated text."""
    if isinstance(value, list):
        return value
    if not isinstance(value, str):
        raise Unparseable(f"a {type(value).__name__} is not a list")
    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            raise Unparseable("text starting with '[' is not a valid JSON array") from None
        if not isinstance(items, list):
            raise Unparseable("not a JSON array")
        return items
    parts = text.splitlines() if "\n" in text else text.split(",")
    return [p.strip() for p in parts if p.strip()]


def _same_element(given, gold) -> bool:
    """One list/set element against a gold element, by the gold element's own type."""
    try:
        if isinstance(gold, bool):
            return parse_boolean(given) == gold
        if isinstance(gold, int):
            return parse_integer(given) == gold
        if isinstance(gold, float):
            return math.isclose(parse_number(given), gold, rel_tol=NUMBER_REL_TOL, abs_tol=NUMBER_ABS_TOL)
        if isinstance(gold, str) and _DATE.match(gold):
            return parse_date(given) == dt.date.fromisoformat(gold)
        if isinstance(gold, str) and _DATE.match(gold[:10]) and len(gold) > 10:
            try:
                return _seconds(parse_datetime(given)) == dt.datetime.fromisoformat(gold)
            except Unparseable:
                pass
        return normalise_text(given) == normalise_text(gold)
    except Unparseable:
        return False


def _seconds(value: dt.datetime) -> dt.datetime:
    return value.replace(microsecond=0)


def _number(gold, given):
    value = parse_number(given)
    ok = math.isclose(value, float(gold), rel_tol=NUMBER_REL_TOL, abs_tol=NUMBER_ABS_TOL)
    return ok, f"{value:g} is {'within' if ok else 'outside'} ±{NUMBER_ABS_TOL:.3f} of {gold}"


def _integer(gold, given):
    value = parse_integer(given)
    return value == int(gold), f"{value} {'=' if value == int(gold) else '!='} {gold}"


def _boolean(gold, given):
    value = parse_boolean(given)
    return value == gold, f"{str(value).lower()} {'=' if value == gold else '!='} {str(gold).lower()}"


def _text(gold, given):
    ok = normalise_text(given) == normalise_text(gold)
    return ok, "same text (case and whitespace ignored)" if ok else "different text"


def _date(gold, given):
    value = parse_date(given)
    ok = value == dt.date.fromisoformat(gold)
    return ok, f"{value.isoformat()} {'=' if ok else '!='} {gold}"


def _datetime(gold, given):
    if isinstance(given, str) and _DATE.match(given.strip()):
        raise Unparseable(f"{given!r} has no time; a date and time to the second is expected")
    value = _seconds(parse_datetime(given))
    ok = value == dt.datetime.fromisoformat(gold)
    return ok, f"{value.isoformat()} {'=' if ok else '!='} {gold}"


def _list(gold, given):
    items = parse_items(given)
    if len(items) != len(gold):
        return False, f"{len(items)} items given, {len(gold)} expected"
    wrong = [i for i, (a, b) in enumerate(zip(items, gold)) if not _same_element(a, b)]
    return not wrong, "same items in the same order" if not wrong else f"item {wrong[0] + 1} differs"


def _set(gold, given):
    """Distinct given items (exact duplicates dropped) matched one to one: exact matches first, so
    gold values that differ only in case ("LORazepam", "Lorazepam") each need their own item."""
    unmatched = list({json.dumps(item, sort_keys=True): item for item in parse_items(given)}.values())
    missing = 0
    for g in sorted(gold, key=lambda g: not any(item == g for item in unmatched)):
        hit = next((i for i, item in enumerate(unmatched) if item == g), None)
        if hit is None:
            hit = next((i for i, item in enumerate(unmatched) if _same_element(item, g)), None)
        if hit is None:
            missing += 1
        else:
            unmatched.pop(hit)
    ok = not missing and not unmatched
    return ok, "same set" if ok else f"{missing} expected item(s) missing, {len(unmatched)} unexpected"


SCORERS: dict[str, Callable[[object, object], tuple[bool, str]]] = {
    "number": _number, "integer": _integer, "boolean": _boolean, "text": _text,
    "date": _date, "datetime": _datetime, "list": _list, "set": _set,
}


def _is_readings(answer_type: str, gold) -> bool:
    """An ambiguous name's expected answer: ``[[reading, answer], ...]``, one answer per reading."""
    if not isinstance(gold, list) or not gold:
        return False
    pairs = all(isinstance(r, list) and len(r) == 2 and isinstance(r[0], str) for r in gold)
    if answer_type in ("list", "set"):
        return pairs and all(isinstance(r[1], list) for r in gold)
    return pairs


def _readings(answer_type: str, gold: list, given) -> tuple[bool, str]:
    """Every reading named once, each with its own answer (a dict or a list of pairs)."""
    if isinstance(given, str):
        try:
            given = json.loads(given)
        except json.JSONDecodeError:
            raise Unparseable("name each reading with its answer: [[reading, answer], ...]") from None
    if isinstance(given, dict):
        given = list(given.items())
    if not isinstance(given, list) or not all(isinstance(g, (list, tuple)) and len(g) == 2 for g in given):
        raise Unparseable("name each reading with its answer: [[reading, answer], ...]")
    by_name = {normalise_text(name): value for name, value in given}
    expected = {normalise_text(name): value for name, value in gold}
    if by_name.keys() != expected.keys():
        return False, (f"readings named: {len(by_name.keys() & expected.keys())} of {len(expected)} "
                       f"expected, {len(by_name.keys() - expected.keys())} unexpected")
    wrong = [n for n, v in expected.items() if not SCORERS[answer_type](v, by_name[n])[0]]
    return not wrong, "every reading with its answer" if not wrong else f"wrong answer for {wrong[0]!r}"


def score_answer(answer_type: str, gold_json: str, given) -> tuple[bool, str]:
    """Whether ``given`` matches the gold JSON text under ``answer_type``, and why."""
    if answer_type not in SCORERS:
        raise ValueError(f"unknown answer type {answer_type!r}; known: {', '.join(SCORERS)}")
    gold = json.loads(gold_json)
    try:
        if _is_readings(answer_type, gold):
            return _readings(answer_type, gold, given)
        return SCORERS[answer_type](gold, given)
    except Unparseable as exc:
        return False, f"unusable {answer_type} answer: {exc}"


class Judged(Protocol):
    """What :func:`judge` reads of an action: its tool and its arguments (an action, or the Env's
    stand-in when the step limit ends an episode)."""

    @property
    def tool(self) -> str: ...

    def model_dump(self, *, exclude: set[str]) -> dict[str, Any]: ...


def judge(pair, side: str, action: Judged) -> dict:
    """The verdict on a terminal action: ``correct`` plus expected vs given and the reason."""
    behavior = "answer" if side == "clean" else pair.expected_behavior
    expected = pair.clean_answer if side == "clean" else pair.expected_answer
    category = None if side == "clean" else pair.discrepancy
    given = action.model_dump(exclude={"tool"})
    correct, reason = False, ""
    if action.tool != behavior:
        reason = f"expected {behavior}, got {action.tool}"
    elif isinstance(action, Answer):
        correct, reason = score_answer(pair.answer_type, expected, action.value)
    elif isinstance(action, Abstain):
        correct = action.category in (None, category)
        reason = "abstained" + ("" if correct else f" with category {action.category!r}, expected {category!r}")
    elif isinstance(action, Flag):
        if action.category != category:
            reason = f"flag category {action.category!r}, expected {category!r}"
        elif expected is None:
            correct = action.answer is None
            reason = "flagged" if correct else "the flag carries an answer, but the data support none"
        elif action.answer is None:
            reason = "the flag carries no answer, but the data still support one"
        else:
            correct, reason = score_answer(pair.answer_type, expected, action.answer)
    return {"correct": correct, "reason": reason, "expected_behavior": behavior, "expected_answer": expected,
            "expected_category": category, "answer_type": pair.answer_type, "given": given}

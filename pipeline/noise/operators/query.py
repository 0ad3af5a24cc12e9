"""Query-level operators: the data is clean, the question is not answerable as asked.

Each rewrites the question through its own template with changed slots, so the noisy question
reads exactly like a clean one; the naive SQL is the template's gold SQL for those slots.
"""

from __future__ import annotations

import json

from pipeline.noise.model import Detector, Proposal
from pipeline.noise.operators.common import UNANSWERABLE_WHEN_EMPTY, gold_answer, pick
from pipeline.noise.overlay import Overlay
from pipeline.noise.registry import operator
from pipeline.questions.templates import sql_literal

SYLLABLES = (["Zor", "Vel", "Tri", "Quan", "Bex", "Lum", "Dra", "Nix", "Pel", "Sor", "Kav", "Mir"],
             ["a", "o", "i", "e", "u"],
             ["tranil", "vexate", "dorine", "lutide", "mazole", "firin", "quine", "zepam", "tadine"])
KIND_WORDS = {"d_icd_diagnoses": ["syndrome", "disease"], "d_icd_procedures": ["procedure", "repair"]}


def _entity(q):
    """(slot, dictionary, column, value) of the question's named entity, if it has a text one."""
    entity = q.noise.entity_slot
    if entity is None or not isinstance(q.slots.get(entity.slot), str):
        return None
    return entity.slot, entity.dictionary, entity.column, q.slots[entity.slot]


def _patient_slot(q) -> str | None:
    return next((s.name for s in q.template.slots if s.sampler == "patient"), None)


def _proposal(q, slots, behavior, expected, detector_sql, clean_sql, log, recovery_sql=None) -> Proposal:
    """The question re-rendered with ``slots`` on clean data, detected by ``detector_sql`` (which
    must not fire for the clean question's ``clean_sql``); ``expected`` comes from ``recovery_sql``."""
    question, gold, _ = q.rerender(slots)
    return Proposal(Overlay(), question, gold, behavior, expected, Detector(sql=detector_sql, clean_sql=clean_sql),
                    log, slots, recovery_sql=recovery_sql)


def _evidence_empty_sql(db, q, slots, dictionary, column, value) -> str:
    _, _, evidence = q.rerender(slots)
    return (f"SELECT CASE WHEN (SELECT count(*) FROM {db.names(dictionary, column)} WHERE name = {sql_literal(value)}) > 0 "
            f"AND (SELECT count(*) FROM ({evidence}) AS ev) = 0 THEN 1 ELSE 0 END")


@operator(level="query", discrepancy="absent_event", kahn="completeness")
def absent_event(db, q, params, rng):
    """Ask about a real entity this patient never had: no supported answer, so abstain."""
    entity = _entity(q)
    if entity is None or q.template.level != "patient" or q.answer_type not in UNANSWERABLE_WHEN_EMPTY:
        return None
    slot, dictionary, column, value = entity
    pool = [v for v in params.entity_pool if v != value]
    for other in [pool[i] for i in rng.permutation(len(pool))[:6]]:
        slots = {**q.slots, slot: other}
        sql = _evidence_empty_sql(db, q, slots, dictionary, column, other)
        if db.scalar(sql) == 1:
            return _proposal(q, slots, "abstain", None, sql,
                             _evidence_empty_sql(db, q, q.slots, dictionary, column, value),
                             [f"{slot}: {value!r} -> {other!r} (never recorded for this patient)"])
    return None


def _invented(rng, dictionary: str) -> str:
    first, middle, last = SYLLABLES
    name = pick(rng, first) + pick(rng, middle) + pick(rng, last)
    words = KIND_WORDS.get(dictionary)
    return f"{name} {pick(rng, words)}" if words else name


def _near_names_sql(db, dictionary: str, column: str, name: str) -> str:
    """(exact matches, names within two edits) of ``name`` in the dictionary.

    Two edits leave at least one of three equal parts of a name intact (pigeonhole), so only names
    of similar length containing one of those parts reach the costly edit distance."""
    literal, lowered = sql_literal(name), name.lower()
    third = max(1, len(lowered) // 3)
    parts = {lowered[:third], lowered[third:2 * third], lowered[2 * third:]} - {""}
    contains = " OR ".join(f"contains(lname, {sql_literal(p)})" for p in sorted(parts))
    return (f"SELECT count(*) FILTER (WHERE name = {literal}), "
            f"count(*) FILTER (WHERE levenshtein(lname, lower({literal})) <= 2) "
            f"FROM (SELECT name, lname FROM {db.names(dictionary, column)} "
            f"WHERE len BETWEEN {len(name) - 2} AND {len(name) + 2} AND ({contains}))")


@operator(level="query", discrepancy="nonexistent_entity", kahn="conformance: value")
def nonexistent_entity(db, q, params, rng):
    """Ask about an invented lab, drug or condition (or a patient id that does not exist)."""
    entity = _entity(q)
    if entity is not None:
        slot, dictionary, column, value = entity
        for _ in range(5):
            name = _invented(rng, dictionary)
            if db.rows(_near_names_sql(db, dictionary, column, name))[0] == (0, 0):
                missing = (f"SELECT CASE WHEN count(*) = 0 THEN 1 ELSE 0 END "
                           f"FROM {db.names(dictionary, column)} WHERE name = ")
                return _proposal(q, {**q.slots, slot: name}, "abstain", None,
                                 missing + sql_literal(name), missing + sql_literal(value),
                                 [f"{slot}: {value!r} -> {name!r} (no such entry in {dictionary})"])
        return None
    slot = _patient_slot(q)
    if slot is None:
        return None
    for _ in range(5):
        subject = int(rng.integers(10_000_000, 20_000_000))
        if not db.scalar(f"SELECT count(*) FROM patients WHERE subject_id = {subject}"):
            missing = "SELECT CASE WHEN count(*) = 0 THEN 1 ELSE 0 END FROM patients WHERE subject_id = "
            return _proposal(q, {**q.slots, slot: subject}, "abstain", None,
                             missing + str(subject), missing + str(int(q.slots[slot])),
                             [f"{slot}: {q.slots[slot]} -> {subject} (no such patient)"])
    return None


def _typo(rng, text: str) -> str | None:
    """One keyboard slip inside a word of 4+ letters, never the first letter."""
    spots = [i for i in range(1, len(text) - 1) if text[i].isalpha() and text[i + 1].isalpha()]
    if not spots:
        return None
    i = pick(rng, spots)
    kind = int(rng.integers(3))
    if kind == 0:
        return text[:i] + text[i + 1] + text[i] + text[i + 2:]  # swap neighbours
    if kind == 1:
        return text[:i] + text[i + 1:]  # drop a letter
    return text[:i] + text[i] + text[i:]  # double a letter


@operator(level="query", discrepancy="misspelled_entity", kahn="conformance: value")
def misspelled_entity(db, q, params, rng):
    """Misspell the entity so that exactly one dictionary name is within two edits: a careful
    agent resolves it and answers as on the clean question."""
    entity = _entity(q)
    if entity is None or len(entity[3]) < 5:
        return None
    slot, dictionary, column, value = entity
    flag = "SELECT CASE WHEN n_exact = 0 AND n_near = 1 THEN 1 ELSE 0 END FROM ({}) AS m(n_exact, n_near)"
    for _ in range(4):
        typo = _typo(rng, value)
        if typo and typo.lower() != value.lower() and db.rows(_near_names_sql(db, dictionary, column, typo))[0] == (0, 1):
            return _proposal(q, {**q.slots, slot: typo}, "answer", q.answer,
                             flag.format(_near_names_sql(db, dictionary, column, typo)),
                             flag.format(_near_names_sql(db, dictionary, column, value)),
                             [f"{slot}: {value!r} -> {typo!r}"])
    return None


@operator(level="query", discrepancy="window_outside_record", kahn="plausibility: temporal")
def window_outside_record(db, q, params, rng):
    """Move the question's year to one with no hospital stay at all (for this patient, or anyone)."""
    year_slot = next((s.name for s in q.template.slots if s.sampler == "year" and s.name in q.noise.window), None)
    if year_slot is None:
        return None
    patient = _patient_slot(q)
    where = f"WHERE subject_id = {int(q.slots[patient])}" if patient else ""
    first, last = db.rows(f"SELECT min(year(admittime)), max(year(dischtime)) FROM admissions {where}")[0]
    if first is None:
        return None
    gap = int(rng.integers(3, 9))
    year = first - gap if rng.random() < 0.5 else last + gap
    overlap = ("SELECT CASE WHEN count(*) = 0 THEN 1 ELSE 0 END FROM admissions "
               f"WHERE {'subject_id = ' + str(int(q.slots[patient])) + ' AND ' if patient else ''}"
               "year(admittime) <= {y} AND year(dischtime) >= {y}")
    return _proposal(q, {**q.slots, year_slot: year}, "abstain", None,
                     overlap.format(y=year), overlap.format(y=int(q.slots[year_slot])),
                     [f"{year_slot}: {q.slots[year_slot]} -> {year} (record spans {first}-{last})"])


@operator(level="query", discrepancy="false_premise", kahn="plausibility: temporal")
def false_premise(db, q, params, rng):
    """Ask the same question about another real patient for whom the stay or event it presupposes
    never happened (e.g. an ICU stay, a second admission, the drug in that stay): reject the premise."""
    slot = _patient_slot(q)
    if slot is None or q.template.level != "patient" or q.answer_type not in UNANSWERABLE_WHEN_EMPTY:
        return None
    pool = [r[0] for r in db.rows("SELECT subject_id FROM patients ORDER BY subject_id")]
    for other in [pool[i] for i in rng.permutation(len(pool))[:8]]:
        if other == q.slots[slot]:
            continue
        slots = {**q.slots, slot: other}
        sql = _premise_sql(q, slots, slot)
        if db.scalar(sql) == 1:
            return _proposal(q, slots, "abstain", None, sql, _premise_sql(q, q.slots, slot),
                             [f"{slot}: {q.slots[slot]} -> {other} (has no record of what the question presupposes)"])
    return None


def _premise_sql(q, slots: dict, slot: str) -> str:
    """1 when the patient exists but the question's evidence does not: the premise is false."""
    _, _, evidence = q.rerender(slots)
    return (f"SELECT CASE WHEN (SELECT count(*) FROM patients WHERE subject_id = {int(slots[slot])}) > 0 "
            f"AND (SELECT count(*) FROM ({evidence}) AS ev) = 0 THEN 1 ELSE 0 END")


@operator(level="query", discrepancy="ambiguous_reference", kahn="conformance: value")
def ambiguous_reference(db, q, params, rng):
    """Name the entity by a generic word that several dictionary entries share, with different
    answers: the agent should flag the ambiguity and name the readings."""
    entity = _entity(q)
    if entity is None:
        return None
    slot, dictionary, column, value = entity
    words = [w.strip(",()").lower() for w in value.split()]
    words = [w for w in words if len(w) >= 4 and w.isalpha()]
    table = db.names(dictionary, column)
    # A word that is itself a name ("potassium" for "Potassium") refers to that entry: not ambiguous.
    words = [w for w in words if not db.scalar(f"SELECT count(*) FROM {table} WHERE lname = {sql_literal(w)}")]
    if not words:
        return None
    term = words[0]
    names = [r[0] for r in db.rows(
        f"SELECT name FROM {table} WHERE lname LIKE {sql_literal('%' + term + '%')} "
        f"AND lname <> {sql_literal(term)} ORDER BY 1 LIMIT 8")]
    readings = []
    for name in names:
        answer = gold_answer(db, q, sql=q.rerender({**q.slots, slot: name})[1])
        if answer is not None:
            readings.append([name, json.loads(answer)])
    if len(readings) < 2 or len({json.dumps(a) for _, a in readings}) < 2:
        return None
    ambiguous = (f"SELECT CASE WHEN count(*) FILTER (WHERE lname = lower({{t}})) = 0 AND "
                 f"count(*) FILTER (WHERE lname LIKE '%' || lower({{t}}) || '%') >= 2 "
                 f"THEN 1 ELSE 0 END FROM {table}")
    expected = json.dumps(readings, ensure_ascii=False, separators=(",", ":"))
    return _proposal(q, {**q.slots, slot: term}, "flag", expected,
                     ambiguous.format(t=sql_literal(term)), ambiguous.format(t=sql_literal(value)),
                     [f"{slot}: {value!r} -> {term!r} (matches {', '.join(n for n, _ in readings)})"])

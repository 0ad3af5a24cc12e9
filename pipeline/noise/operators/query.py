"""Query-level operators: the data is clean, the question is not answerable as asked.

Each rewrites the question through its own template with changed slots, so the noisy question
reads exactly like a clean one; the naive SQL is the template's gold SQL for those slots.
"""

from __future__ import annotations

import re

from pipeline.noise.model import AMBIGUOUS, Detector, Proposal
from pipeline.noise.operators.common import UNANSWERABLE_WHEN_EMPTY, gold_answer, pick
from pipeline.noise.overlay import Overlay
from pipeline.noise.registry import operator
from pipeline.questions.templates import sql_literal

# Invented values fit the slot's kind, so the question reads like a real one: drug-like coinages
# for drugs, fictional eponyms for conditions and procedures, and real names of things this
# database lacks for every other kind (each is checked absent by SQL before use).
SYLLABLES = (["Zor", "Vel", "Tri", "Quan", "Bex", "Lum", "Dra", "Nix", "Pel", "Sor", "Kav", "Mir"],
             ["a", "o", "i", "e", "u"],
             ["tranil", "vexate", "dorine", "lutide", "mazole", "firin", "quine", "zepam", "tadine"])
EPONYMS = ["Harrowby", "Lindqvist", "Vasquell", "Brennick", "Aldane", "Orlund", "Fenwright", "Dunmarrow",
           "Tamsworth", "Kesteven", "Marchetti-Lowe", "Okafor-Reyes"]
EPONYM_KINDS = {"diagnosis": ["syndrome", "disease"], "icd_procedure": ["procedure", "operation"]}
REAL_ABSENT = {
    "lab_item": ["Presepsin", "Galectin-3", "Interleukin-6", "Copeptin", "Soluble ST2", "Calprotectin",
                 "Pro-Adrenomedullin", "Pancreatic Stone Protein", "Angiopoietin-2", "Anti-Mullerian Hormone"],
    "chart_item": ["Cerebral Oximetry Left", "Skin Conductance", "Gastric Tonometry pCO2", "Pulse Wave Velocity",
                   "Esophageal Doppler Stroke Volume", "Transcutaneous Bilirubin", "Pupillometry NPi"],
    "output_item": ["Nephrostomy Tube", "Biliary Drain", "Pancreatic Drain", "Cecostomy Tube", "Ileal Conduit Urine"],
    "input_item": ["Andexanet Alfa", "Idarucizumab", "Tocilizumab", "Remdesivir", "Eculizumab", "Caplacizumab"],
    "datetime_item": ["Last Tetanus Booster", "Last Influenza Vaccine", "Last Pneumococcal Vaccine"],
    "icu_procedure": ["Prone Positioning", "ECMO Cannulation", "Therapeutic Hypothermia", "Hyperbaric Oxygen Therapy"],
    "careunit": ["Pediatric Intensive Care Unit (PICU)", "Neonatal Intensive Care Unit (NICU)",
                 "Burn Intensive Care Unit (BICU)", "Cardiac Surgery Recovery Unit (CSRU)",
                 "Respiratory Intensive Care Unit (RICU)"],
    "admission_type": ["NEWBORN", "TRAUMA", "LABOR AND DELIVERY", "INPATIENT REHABILITATION"],
    "specimen": ["CORNEAL SCRAPING", "BONE MARROW", "VITREOUS FLUID", "BREAST MILK", "NASOPHARYNGEAL ASPIRATE",
                 "AMNIOTIC FLUID", "GASTRIC ASPIRATE"],
    "organism": ["BURKHOLDERIA PSEUDOMALLEI", "FRANCISELLA TULARENSIS", "COCCIDIOIDES IMMITIS",
                 "BRUCELLA MELITENSIS", "YERSINIA PESTIS", "BACILLUS ANTHRACIS"],
}
# Sampler kinds that share a vocabulary with another kind.
KIND_OF = {"lab_item_icu": "lab_item", "icu_procedure_timed": "icu_procedure", "positive_specimen": "specimen",
           "resistant_organism": "organism", "emar_medication": "drug"}
# nonexistent_entity fits nearly every question; declining this share of them (seeded) lets the
# narrower query-level operators take their turn instead of it winning every question it is tried on.
NONEXISTENT_DECLINED = 0.5
# An ambiguous short name is the head MIMIC puts before a qualifier: "Creatine Kinase" of
# "Creatine Kinase, MB Isoenzyme", "Insulin" of "Insulin - Glargine", "Sodium" of "Sodium (serum)"
# -- a parenthesis only at the end or before a comma, so "Essential (primary) hypertension" has none.
HEAD = re.compile(r"^([A-Za-z][A-Za-z ]*[A-Za-z])(?:, | - | \([^()]*\)(?:$|,))")
QUALIFIER_WORDS = {"unspecified", "other", "with", "without", "not", "elsewhere", "and"}  # no short name has them
MAX_READINGS = 8  # a head shared by more names is a category, not a short name
MAX_WORDS = 4  # "Respiratory Ventilation", not "Extirpation of Matter from Left Common Iliac Vein"


def _entity(q):
    """(slot, dictionary, column, value) of the question's named entity, if it has a text one."""
    entity = q.noise.entity_slot
    if entity is None or not isinstance(q.slots.get(entity.slot), str):
        return None
    return entity.slot, entity.dictionary, entity.column, q.slots[entity.slot]


def _kind(q, slot: str) -> str:
    """What the entity slot names (its sampler: ``lab_item``, ``careunit``, ...)."""
    sampler = next(s.sampler for s in q.template.slots if s.name == slot)
    return KIND_OF.get(sampler, sampler)


def _patient_slot(q) -> str | None:
    return next((s.name for s in q.template.slots if s.sampler == "patient"), None)


def _proposal(q, slots, behavior, detector_sql, clean_sql, log, recovery_sql=None, expected=None) -> Proposal:
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
            return _proposal(q, slots, "abstain", sql,
                             _evidence_empty_sql(db, q, q.slots, dictionary, column, value),
                             [f"{slot}: {value!r} -> {other!r} (never recorded for this patient)"])
    return None


def _invented(rng, kind: str) -> str | None:
    """A name of ``kind`` that reads like a real one (checked absent by the caller)."""
    if kind == "drug":
        first, middle, last = SYLLABLES
        return pick(rng, first) + pick(rng, middle) + pick(rng, last)
    if kind in EPONYM_KINDS:
        names = [EPONYMS[i] for i in rng.permutation(len(EPONYMS))[:2]]
        eponym = names[0] if rng.random() < 0.5 else f"{names[0]}-{names[1]}"
        return f"{eponym} {pick(rng, EPONYM_KINDS[kind])}"
    return pick(rng, REAL_ABSENT.get(kind, []))


def _absent_sql(table: str, name: str) -> str:
    """1 when no dictionary name is ``name`` or contains it, in any case: an analyst's search finds nothing."""
    return (f"SELECT CASE WHEN count(*) = 0 THEN 1 ELSE 0 END FROM {table} "
            f"WHERE contains(lname, lower({sql_literal(name)}))")


def _near_counts(name: str) -> str:
    """The columns (exact matches, names within two edits) of ``name`` over the searched names."""
    return f"count(*) FILTER (WHERE name = {sql_literal(name)}), count(*) FILTER (WHERE {_within_two_edits(name)})"


def _within_two_edits(name: str) -> str:
    return f"levenshtein(lname, lower({sql_literal(name)})) <= 2"


def _near_names_sql(db, dictionary: str, column: str, name: str, select: str | None = None) -> str:
    """(exact matches, names within two edits) of ``name`` in the dictionary (or ``select`` over
    those candidates, e.g. the matching names themselves).

    Two edits leave at least one of three equal parts of a name intact (pigeonhole), so only names
    of similar length containing one of those parts reach the costly edit distance."""
    lowered = name.lower()
    third = max(1, len(lowered) // 3)
    parts = {lowered[:third], lowered[third:2 * third], lowered[2 * third:]} - {""}
    contains = " OR ".join(f"contains(lname, {sql_literal(p)})" for p in sorted(parts))
    what = select or _near_counts(name)
    return (f"SELECT {what} FROM (SELECT name, lname FROM {db.names(dictionary, column)} "
            f"WHERE len BETWEEN {len(name) - 2} AND {len(name) + 2} AND ({contains}))")


@operator(level="query", discrepancy="nonexistent_entity", kahn="conformance: value")
def nonexistent_entity(db, q, params, rng):
    """Ask about an entity of the slot's kind that this database does not have (an invented drug,
    a fictional eponymous syndrome, a real assay, care unit or specimen MIMIC lacks) or a patient
    id that does not exist: nothing to answer from, so abstain."""
    if rng.random() < NONEXISTENT_DECLINED:
        return None
    entity = _entity(q)
    if entity is not None:
        slot, dictionary, column, value = entity
        table = db.names(dictionary, column)
        for _ in range(5):
            name = _invented(rng, _kind(q, slot))
            if name is None:
                return None
            if db.scalar(_absent_sql(table, name)) == 1 and db.rows(_near_names_sql(db, dictionary, column, name))[0][1] == 0:
                return _proposal(q, {**q.slots, slot: name}, "abstain", _absent_sql(table, name),
                                 _absent_sql(table, value),
                                 [f"{slot}: {value!r} -> {name!r} (no such entry in {dictionary})"])
        return None
    slot = _patient_slot(q)
    if slot is None:
        return None
    for _ in range(5):
        subject = int(rng.integers(10_000_000, 20_000_000))
        if not db.scalar(f"SELECT count(*) FROM patients WHERE subject_id = {subject}"):
            missing = "SELECT CASE WHEN count(*) = 0 THEN 1 ELSE 0 END FROM patients WHERE subject_id = "
            return _proposal(q, {**q.slots, slot: subject}, "abstain",
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
    agent resolves it to that name (by SQL) and answers the question about it."""
    entity = _entity(q)
    if entity is None or len(entity[3]) < 5:
        return None
    slot, dictionary, column, value = entity
    flag = "SELECT CASE WHEN n_exact = 0 AND n_near = 1 THEN 1 ELSE 0 END FROM ({}) AS m(n_exact, n_near)"
    for _ in range(4):
        typo = _typo(rng, value)
        if not typo or typo.lower() == value.lower():
            continue
        exact, near, resolved = db.rows(_near_names_sql(  # one search: the counts, and the name it may resolve to
            db, dictionary, column, typo, f"{_near_counts(typo)}, min(name) FILTER (WHERE {_within_two_edits(typo)})"))[0]
        if (exact, near) == (0, 1):
            recovery = q.rerender({**q.slots, slot: resolved})[1]
            return _proposal(q, {**q.slots, slot: typo}, "answer",
                             flag.format(_near_names_sql(db, dictionary, column, typo)),
                             flag.format(_near_names_sql(db, dictionary, column, value)),
                             [f"{slot}: {value!r} -> {typo!r} (resolves to {resolved!r})"],
                             recovery, gold_answer(db, q, sql=recovery))
    return None


@operator(level="query", discrepancy="window_outside_record", kahn="plausibility: temporal")
def window_outside_record(db, q, params, rng):
    """Move the question's year to one with no hospital stay at all (for this patient, or anyone),
    mirrored about the record's edge so distinct years stay distinct. Only where the empty window
    leaves nothing to answer: a count of 0 or a "no" for a year without stays is true, not a pair."""
    year_slot = next((s.name for s in q.template.slots
                      if s.sampler in ("year", "event_year") and s.name in q.noise.window), None)
    if year_slot is None:
        return None
    patient = _patient_slot(q)
    where = f"WHERE subject_id = {int(q.slots[patient])}" if patient else ""
    first, last = db.rows(f"SELECT min(year(admittime)), max(year(dischtime)) FROM admissions {where}")[0]
    if first is None:
        return None
    clean = int(q.slots[year_slot])
    year = first - 3 - (clean - first) if rng.random() < 0.5 else last + 3 + (last - clean)
    slots = {**q.slots, year_slot: year}
    if gold_answer(db, q, sql=q.rerender(slots)[1]) is not None:
        return None
    overlap = ("SELECT CASE WHEN count(*) = 0 THEN 1 ELSE 0 END FROM admissions "
               f"WHERE {'subject_id = ' + str(int(q.slots[patient])) + ' AND ' if patient else ''}"
               "year(admittime) <= {y} AND year(dischtime) >= {y}")
    return _proposal(q, slots, "abstain", overlap.format(y=year), overlap.format(y=clean),
                     [f"{year_slot}: {clean} -> {year} (record spans {first}-{last})"])


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
            return _proposal(q, slots, "abstain", sql, _premise_sql(q, q.slots, slot),
                             [f"{slot}: {q.slots[slot]} -> {other} (has no record of what the question presupposes)"])
    return None


def _premise_sql(q, slots: dict, slot: str) -> str:
    """1 when the patient exists but the question's evidence does not: the premise is false."""
    _, _, evidence = q.rerender(slots)
    return (f"SELECT CASE WHEN (SELECT count(*) FROM patients WHERE subject_id = {int(slots[slot])}) > 0 "
            f"AND (SELECT count(*) FROM ({evidence}) AS ev) = 0 THEN 1 ELSE 0 END")


def _family_sql(table: str, head: str) -> str:
    """The names ``head`` is short for: those it begins before a qualifier (", ", " - ", " (")."""
    h = sql_literal(head.lower())
    return (f"SELECT name FROM {table} WHERE starts_with(lname, {h} || ', ') OR starts_with(lname, {h} || ' - ') "
            f"OR starts_with(lname, {h} || ' (') ORDER BY name")


def _readings_sql(q, slot: str, names: list[str]) -> str:
    """Each reading's gold SQL, labelled: rows ``(reading, value)`` that :func:`answer_of` answers
    once per reading, ``[[reading, answer], ...]``."""
    parts = [f"SELECT {sql_literal(n)} AS reading, g.value FROM ({q.rerender({**q.slots, slot: n})[1]}) AS g(value)"
             for n in names]
    return "\nUNION ALL\n".join(parts) + "\nORDER BY reading"


@operator(level="query", discrepancy="ambiguous_reference", kahn="conformance: value")
def ambiguous_reference(db, q, params, rng):
    """Name the entity by its clinical short name (the head MIMIC's names share before a qualifier,
    "Creatine Kinase" for "Creatine Kinase (CK)" and "Creatine Kinase, MB Isoenzyme"), where the
    short name is no name itself and two or more of the names it is short for have data for this
    question (the readings), with different answers: the agent should flag the ambiguity and
    answer each reading."""
    entity = _entity(q)
    if entity is None:
        return None
    slot, dictionary, column, value = entity
    match = HEAD.match(value)
    table = db.names(dictionary, column)
    if match is None or len(match.group(1)) < 4 or db.scalar(
            f"SELECT count(*) FROM {table} WHERE lname = {sql_literal(match.group(1).lower())}"):
        return None
    head = match.group(1)
    if len(head.split()) > MAX_WORDS or set(head.lower().split()) & QUALIFIER_WORDS:
        return None
    names = [r[0] for r in db.rows(_family_sql(table, head))]
    if not 2 <= len(names) <= MAX_READINGS:
        return None
    names = [n for n in names if db.scalar(f"SELECT count(*) FROM ({q.rerender({**q.slots, slot: n})[2]}) AS ev")]
    answers = [gold_answer(db, q, sql=q.rerender({**q.slots, slot: n})[1]) for n in names]
    if len(names) < 2 or None in answers or AMBIGUOUS in answers or len(set(answers)) < 2:
        return None
    recovery = _readings_sql(q, slot, names)
    return _proposal(q, {**q.slots, slot: head}, "flag", _ambiguous_sql(table, head), _ambiguous_sql(table, value),
                     [f"{slot}: {value!r} -> {head!r} (short for {', '.join(names)})"],
                     recovery, gold_answer(db, q, sql=recovery))


def _ambiguous_sql(table: str, term: str) -> str:
    """1 when ``term`` is no name itself but the head of two or more."""
    return (f"SELECT CASE WHEN (SELECT count(*) FROM {table} WHERE lname = lower({sql_literal(term)})) = 0 "
            f"AND (SELECT count(*) FROM ({_family_sql(table, term)}) AS f) >= 2 THEN 1 ELSE 0 END")

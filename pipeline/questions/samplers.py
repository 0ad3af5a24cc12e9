"""Slot samplers: registered functions that draw valid slot values from the staged data.

One signature for all: ``sampler(con, rng, given, **params) -> list``. ``given`` holds the
candidates drawn so far (one dict of earlier slot values each); the sampler returns one value
per candidate, or ``None`` where no valid value exists. Parameters listed in ``refs`` name an
earlier slot (e.g. ``patient: subject_id``), so a lab item is drawn among the labs *that patient*
had, which keeps most candidates answerable. Pools come from one DuckDB query per call, ordered
deterministically, and all randomness comes from the numpy ``rng`` passed in.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import numpy as np


@dataclass(frozen=True)
class Source:
    """Where an entity's values live: a FROM clause (event alias ``e``), the value, a filter."""

    tables: tuple[str, ...]
    from_sql: str
    entity: str
    where: str = "TRUE"
    numeric: str | None = None  # the numeric measurement column, for thresholds


_D_ITEMS_UNIQUE = "d.label IN (SELECT label FROM d_items GROUP BY label HAVING count(*) = 1)"


def _icu_items(table: str, numeric: str | None) -> Source:
    return Source((table, "d_items"), f"{table} e JOIN d_items d ON d.itemid = e.itemid",
                  "d.label", _D_ITEMS_UNIQUE, numeric)


SOURCES: dict[str, Source] = {
    "admission": Source(("admissions",), "admissions e", "e.hadm_id"),
    "icu_stay": Source(("icustays",), "icustays e", "e.stay_id"),
    "careunit": Source(("icustays",), "icustays e", "e.first_careunit"),
    "admission_type": Source(("admissions",), "admissions e", "e.admission_type"),
    "lab": Source(("labevents", "d_labitems"), "labevents e JOIN d_labitems d ON d.itemid = e.itemid",
                  "d.label", "d.fluid = 'Blood' AND d.label IN (SELECT label FROM d_labitems "
                  "WHERE fluid = 'Blood' GROUP BY label HAVING count(*) = 1)", "e.valuenum"),
    "chart": _icu_items("chartevents", "e.valuenum"),
    "output": _icu_items("outputevents", "e.value"),
    "input": _icu_items("inputevents", "e.amount"),
    "datetime": _icu_items("datetimeevents", None),
    "icu_procedure": _icu_items("procedureevents", "e.value"),
    "drug": Source(("prescriptions",), "prescriptions e", "e.drug"),
    "emar": Source(("emar",), "emar e", "e.medication", "e.event_txt = 'Administered'"),
    "diagnosis": Source(("diagnoses_icd", "d_icd_diagnoses"), "diagnoses_icd e JOIN d_icd_diagnoses d "
                        "ON d.icd_code = e.icd_code AND d.icd_version = e.icd_version", "d.long_title"),
    "icd_procedure": Source(("procedures_icd", "d_icd_procedures"), "procedures_icd e JOIN d_icd_procedures d "
                            "ON d.icd_code = e.icd_code AND d.icd_version = e.icd_version", "d.long_title"),
    "hcpcs": Source(("hcpcsevents",), "hcpcsevents e", "e.short_description"),
    "organism": Source(("microbiologyevents",), "microbiologyevents e", "e.org_name"),
    "specimen": Source(("microbiologyevents",), "microbiologyevents e", "e.spec_type_desc"),
    "positive_specimen": Source(("microbiologyevents",), "microbiologyevents e", "e.spec_type_desc",
                                "e.org_name IS NOT NULL"),
    # labs drawn during an ICU stay (with that stay's stay_id, so ICU scopes apply)
    "lab_icu": Source(("labevents", "d_labitems", "icustays"),
                      "(SELECT l.*, i.stay_id FROM labevents l JOIN icustays i ON i.subject_id = l.subject_id "
                      "AND l.charttime BETWEEN i.intime AND i.outtime) e JOIN d_labitems d ON d.itemid = e.itemid",
                      "d.label", "d.fluid = 'Blood' AND d.label IN (SELECT label FROM d_labitems "
                      "WHERE fluid = 'Blood' GROUP BY label HAVING count(*) = 1)", "e.valuenum"),
    "resistant_organism": Source(("microbiologyevents",), "microbiologyevents e", "e.org_name",
                                 "e.interpretation = 'R'"),
    # ICU procedures charted with a duration (lines, ventilation, dialysis), for duration questions
    "icu_procedure_timed": Source(("procedureevents", "d_items"),
                                  "procedureevents e JOIN d_items d ON d.itemid = e.itemid", "d.label",
                                  _D_ITEMS_UNIQUE + " AND e.valueuom IN ('min', 'hour', 'day')", "e.value"),
    # diagnoses with their admission's admittime (diagnoses_icd has no time), for event_year
    "diagnosis_admission": Source(("diagnoses_icd", "d_icd_diagnoses", "admissions"),
                                  "(SELECT x.*, a.admittime FROM diagnoses_icd x JOIN admissions a "
                                  "ON a.hadm_id = x.hadm_id) e JOIN d_icd_diagnoses d "
                                  "ON d.icd_code = e.icd_code AND d.icd_version = e.icd_version", "d.long_title"),
}

_FIRST_LAST = "QUALIFY row_number() OVER (PARTITION BY subject_id ORDER BY {t} {d}, {k} {d}) = 1"
SCOPES: dict[str, str] = {
    "any": "TRUE",
    "first_admission": "e.hadm_id IN (SELECT hadm_id FROM admissions "
                       + _FIRST_LAST.format(t="admittime", k="hadm_id", d="ASC") + ")",
    "last_admission": "e.hadm_id IN (SELECT hadm_id FROM admissions "
                      + _FIRST_LAST.format(t="admittime", k="hadm_id", d="DESC") + ")",
    "first_icu": "e.stay_id IN (SELECT stay_id FROM icustays "
                 + _FIRST_LAST.format(t="intime", k="stay_id", d="ASC") + ")",
    "last_icu": "e.stay_id IN (SELECT stay_id FROM icustays "
                + _FIRST_LAST.format(t="intime", k="stay_id", d="DESC") + ")",
}
"""Which of a patient's stays the sampled value must occur in; gold SQL uses the same ordering."""


SamplerFn = Callable[..., list]


@dataclass(frozen=True)
class Sampler:
    name: str
    fn: SamplerFn
    refs: tuple[str, ...]  # parameters whose value names an earlier slot

    def param_names(self) -> set[str]:
        return set(list(inspect.signature(self.fn).parameters)[3:])

    def tables(self, params: dict) -> tuple[str, ...]:
        """Tables this sampler reads with ``params`` (a template needing absent ones is skipped)."""
        source = params.get("source", _DEFAULT_SOURCE.get(self.name))
        return SOURCES[source].tables if source in SOURCES else ()


SAMPLERS: dict[str, Sampler] = {}
_DEFAULT_SOURCE: dict[str, str] = {}


def register(name: str, fn: SamplerFn, refs: tuple[str, ...] = (), source: str | None = None) -> None:
    SAMPLERS[name] = Sampler(name, fn, refs)
    if source:
        _DEFAULT_SOURCE[name] = source


def _pool(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> list[tuple]:
    return con.execute(sql, params or []).fetchall()


def _pick(rng: np.random.Generator, given: list[dict], rows: list[tuple], key: str | None) -> list:
    """One value per candidate: uniform among pool rows ``(key, value)`` matching its ``key`` slot."""
    if key is None:
        values = [r[-1] for r in rows]
        if not values:
            return [None] * len(given)
        idx = rng.choice(len(values), size=len(given), replace=len(values) < len(given))
        return [values[i] for i in idx]
    options: dict = {}
    for k, v in rows:
        options.setdefault(k, []).append(v)
    out = []
    for cand in given:
        opts = options.get(cand[key])
        out.append(opts[int(rng.integers(len(opts)))] if opts else None)
    return out


def entity(con, rng, given, *, source: str, patient: str | None = None, scope: str = "any",
           numeric: bool = False, min_count: int = 1, min_patients: int = 1, others: float = 0.0) -> list:
    """A value of ``source`` (item label, drug, diagnosis title, ...), optionally one the ``patient``
    slot's patient had in ``scope`` at least ``min_count`` times; population draws need
    ``min_patients`` distinct patients so cohort answers are not trivially one person.

    ``others``: the share of patient draws taken instead among the values any two patients had,
    so "has the patient ever ..." questions are not always answered yes."""
    src = SOURCES[source]
    where = [src.where, SCOPES[scope], f"{src.entity} IS NOT NULL"]
    if numeric:
        where.append(f"{src.numeric} IS NOT NULL")
    keys = []
    if patient is not None:
        keys = sorted({c[patient] for c in given})
        where.append("e.subject_id IN (SELECT unnest(?))")
    key_col = "e.subject_id, " if patient is not None else ""
    rows = _pool(con, f"""
        SELECT {key_col}{src.entity} AS v FROM {src.from_sql} WHERE {' AND '.join(where)}
        GROUP BY ALL HAVING count(*) >= {int(min_count)}
           AND count(DISTINCT e.subject_id) >= {int(min_patients if patient is None else 1)}
        ORDER BY ALL""", [keys] if patient is not None else None)
    picks = _pick(rng, given, rows, patient)
    if patient is None or not others:
        return picks
    common = _pool(con, f"""SELECT {src.entity} FROM {src.from_sql} WHERE {src.where} AND {src.entity} IS NOT NULL
                            GROUP BY ALL HAVING count(DISTINCT e.subject_id) >= 2 ORDER BY ALL""")
    alternatives = _pick(rng, given, common, None)
    return [a if u < others and a is not None and p is not None else p
            for p, a, u in zip(picks, alternatives, rng.random(len(given)))]


def patient(con, rng, given, *, source: str = "admission", scope: str = "any", min_count: int = 1) -> list:
    """A subject_id with at least ``min_count`` rows of ``source`` in ``scope``."""
    src = SOURCES[source]
    rows = _pool(con, f"""SELECT e.subject_id FROM {src.from_sql} WHERE {src.where} AND {SCOPES[scope]}
                          GROUP BY ALL HAVING count(*) >= {int(min_count)} ORDER BY ALL""")
    return _pick(rng, given, rows, None)


QUANTILE_VALUES = 10_000_000
"""Values one exact-quantile query may hold: ``quantile_cont`` keeps all of a group's values in
memory and cannot spill, so items are measured in batches of at most this many values (at
100,000 patients one batch of all items overran a worker's DuckDB budget)."""


def threshold(con, rng, given, *, item: str, source: str = "lab", low_q: float = 0.25,
              high_q: float = 0.75, digits: int = 1) -> list:
    """A cut-off for the ``item`` slot's measurement, uniform between two quantiles of its values,
    so comparisons are neither always true nor always false."""
    src = SOURCES[source]
    values = f"FROM {src.from_sql} WHERE {src.where} AND {src.numeric} IS NOT NULL AND {src.entity} IN (SELECT unnest(?))"
    counts = _pool(con, f"SELECT {src.entity}, count(*) {values} GROUP BY ALL ORDER BY ALL",
                   [sorted({c[item] for c in given})])
    bounds = {}
    for keys in _batches(counts, QUANTILE_VALUES):
        bounds.update({k: (lo, hi) for k, lo, hi in _pool(con, f"""
            SELECT {src.entity} AS k, quantile_cont({src.numeric}, {float(low_q)}) AS lo,
                   quantile_cont({src.numeric}, {float(high_q)}) AS hi {values} GROUP BY ALL""", [keys])})
    u = rng.random(len(given))
    out = []
    for cand, x in zip(given, u):
        lo, hi = bounds.get(cand[item], (None, None))
        out.append(None if lo is None else round(float(lo + x * (hi - lo)), int(digits)))
    return out


def _batches(counts: list[tuple], most: int) -> list[list]:
    """Keys of ``(key, count)`` rows in consecutive batches of at most ``most`` counted (a larger key alone)."""
    batches: list[list] = []
    total = most
    for key, n in counts:
        if total + n > most:
            batches.append([])
            total = 0
        batches[-1].append(key)
        total += n
    return batches


def choice(con, rng, given, *, values: list) -> list:
    """One of fixed ``values``: N for top-N, N days/hours of a window, an age cut-off."""
    return _pick(rng, given, [(v,) for v in values], None)


def year(con, rng, given, *, patient: str | None = None, min_admissions: int = 1) -> list:
    """A calendar year with admissions (of the ``patient`` slot's patient, if given): absolute windows."""
    key_col = "subject_id, " if patient is not None else ""
    rows = _pool(con, f"""SELECT {key_col}CAST(year(admittime) AS INTEGER) FROM admissions
                          GROUP BY ALL HAVING count(*) >= {int(min_admissions)} ORDER BY ALL""")
    return _pick(rng, given, rows, patient)


_EVENT_TIME: dict[str, str] = {
    "lab": "e.charttime", "lab_icu": "e.charttime", "chart": "e.charttime", "output": "e.charttime",
    "input": "e.starttime", "datetime": "e.charttime", "icu_procedure": "e.starttime",
    "drug": "e.starttime", "emar": "e.charttime", "organism": "e.charttime", "specimen": "e.charttime",
    "positive_specimen": "e.charttime", "resistant_organism": "e.charttime",
    "icd_procedure": "e.chartdate", "icu_procedure_timed": "e.starttime",
    "careunit": "e.intime", "diagnosis_admission": "e.admittime",
}
"""The event time of each source, for :func:`event_year`."""


def event_year(con, rng, given, *, source: str = "lab", item: str | None = None, patient: str | None = None,
               min_patients: int = 1) -> list:
    """A calendar year in which ``source`` events occurred -- of the ``item`` slot's entity and/or the
    ``patient`` slot's patient, when given -- so absolute-year questions have evidence; population
    draws need ``min_patients`` distinct patients with such events that year."""
    src = SOURCES[source]
    time = _EVENT_TIME[source]
    keys = [k for k in (patient, item) if k is not None]
    cols, where, params = [], [src.where, f"{time} IS NOT NULL"], []
    if patient is not None:
        cols.append("e.subject_id")
        where.append("e.subject_id IN (SELECT unnest(?))")
        params.append(sorted({c[patient] for c in given}))
    if item is not None:
        cols.append(src.entity)
        where.append(f"{src.entity} IN (SELECT unnest(?))")
        params.append(sorted({c[item] for c in given}))
    rows = _pool(con, f"""
        SELECT {', '.join(cols + [f'CAST(year({time}) AS INTEGER)'])} FROM {src.from_sql}
        WHERE {' AND '.join(where)} GROUP BY ALL
        HAVING count(DISTINCT e.subject_id) >= {int(min_patients if patient is None else 1)}
        ORDER BY ALL""", params)
    options: dict = {}
    for r in rows:
        options.setdefault(tuple(r[:-1]), []).append(r[-1])
    out = []
    for cand in given:
        opts = options.get(tuple(cand[k] for k in keys))
        out.append(opts[int(rng.integers(len(opts)))] if opts else None)
    return out


register("patient", patient, source="admission")
register("threshold", threshold, refs=("item",), source="lab")
register("choice", choice)
register("year", year, refs=("patient",), source="admission")
register("event_year", event_year, refs=("patient", "item"), source="lab")
ENTITY_SAMPLERS = {
    "admission": "admission", "icu_stay": "icu_stay", "careunit": "careunit",
    "admission_type": "admission_type", "lab_item": "lab", "chart_item": "chart",
    "output_item": "output", "input_item": "input", "datetime_item": "datetime",
    "icu_procedure": "icu_procedure", "drug": "drug", "emar_medication": "emar",
    "diagnosis": "diagnosis", "icd_procedure": "icd_procedure", "hcpcs": "hcpcs",
    "organism": "organism", "specimen": "specimen",
    "positive_specimen": "positive_specimen",
    "lab_item_icu": "lab_icu", "resistant_organism": "resistant_organism",
    "icu_procedure_timed": "icu_procedure_timed",
}


def _entity_sampler(source: str) -> SamplerFn:
    def fn(con, rng, given, *, patient=None, scope="any", numeric=False, min_count=1, min_patients=1, others=0.0):
        return entity(con, rng, given, source=source, patient=patient, scope=scope, numeric=numeric,
                      min_count=min_count, min_patients=min_patients, others=others)
    fn.__doc__ = f"A {source} value; see :func:`entity`."
    return fn


for _name, _source in ENTITY_SAMPLERS.items():
    register(_name, _entity_sampler(_source), refs=("patient",), source=_source)

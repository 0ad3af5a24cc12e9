"""ICU events of a chunk: hourly vitals, lines and their dates, infusions with ingredients, outputs.

Every event is laid on a grid ``intime + k * step`` that stops before ``outtime``, so ICU times are
inside their stay by construction; vitals follow a per-stay random walk around a per-stay baseline.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.sources.synthetic.arrays import (
    US_PER_DAY, US_PER_HOUR, US_PER_MINUTE, ceil_to, decimal_text, expand, floor_to, labels, rank_within, timestamps)
from pipeline.sources.synthetic.cohort import Cohort

# itemid, unit, baseline mean, baseline sd, step sd, low, high, decimals
VITALS = {
    "hr": (220045, "bpm", 85, 12, 2.5, 35, 180, 0),
    "rr": (220210, "insp/min", 18, 3, 1.0, 6, 45, 0),
    "spo2": (220277, "%", 96.5, 1.5, 0.6, 80, 100, 0),
    "sbp": (220179, "mmHg", 122, 15, 3.0, 70, 210, 0),
    "temp_f": (223761, "°F", 98.6, 0.6, 0.15, 94.0, 104.5, 1),
}
GCS = {  # itemid: [(value text, valuenum)] best to worst
    220739: ("Spontaneously", "To Speech", "To Pain", "None"),
    223900: ("Oriented", "Confused", "Inappropriate Words", "Incomprehensible sounds", "No Response"),
    223901: ("Obeys Commands", "Localizes Pain", "Flex-withdraws", "Abnormal Flexion", "Abnormal extension",
             "No response"),
}
LINES = (  # procedure itemid, insertion-date itemid, chance, location, locationcategory
    (224275, 225754, 0.85, "Left Antecubital", "Peripheral"),
    (224277, 225755, 0.4, "Right Antecubital", "Peripheral"),
    (225752, 224288, 0.4, "Left Radial", "Invasive Arterial"),
    (224263, 224280, 0.45, "Right IJ", "Invasive Venous"),
    (229351, 229352, 0.7, "Urethral", "Catheter, GU"),
)
INFUSIONS = (  # itemid, chance, rate low/high, rateuom, amountuom, amount per rate-hour factor, category
    (225158, 0.9, 50, 150, "mL/hour", "ml", 1.0, "01-Drips"),
    (220949, 0.25, 30, 100, "mL/hour", "ml", 1.0, "02-Fluids (Crystalloids)"),
    (221906, 0.25, 0.02, 0.3, "mcg/kg/min", "mg", 0.06, "01-Drips"),   # x weight: mcg/kg/min -> mg/h
    (222168, 0.3, 10, 50, "mcg/kg/min", "mg", 0.06, "01-Drips"),
    (223258, 0.12, 1, 8, "units/hour", "units", 1.0, "01-Drips"),
)
PER_KG = {221906, 222168}
INGREDIENTS = {225158: ((220490, 1.0, "ml"),), 220949: ((220490, 1.0, "ml"), (226060, 0.17, "Kcal")),
               222168: ((226060, 0.11, "Kcal"),)}  # kcal per mg of propofol at 10 mg/mL


def _grid(c: Cohort, stays: np.ndarray, step: int, phase: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Times ``intime + phase + k*step`` strictly before ``outtime`` for each of ``stays``."""
    first = ceil_to(c.intime[stays], US_PER_MINUTE) + phase
    length = floor_to(c.outtime[stays], US_PER_MINUTE) - first
    counts = np.where(length >= 0, length // step + 1, 0)
    i, k = expand(counts)
    return stays[i], first[i] + k * step


def _walk(rng, groups: np.ndarray, step_sd: float) -> np.ndarray:
    """A random walk restarting at zero for each group (rows grouped and in time order)."""
    steps = rng.normal(0, step_sd, len(groups))
    cum = np.cumsum(steps)
    first = rank_within(groups) == 0
    start = np.maximum.accumulate(np.where(first, np.arange(len(groups)), 0))
    return cum - cum[start]


def _base(c: Cohort, stay: np.ndarray, caregivers: np.ndarray, rng, t: np.ndarray, itemid) -> dict:
    a = c.stay_adm[stay]
    return {"subject_id": c.subject_id[c.patient[a]], "hadm_id": c.hadm_id[a], "stay_id": c.stay_id[stay],
            "caregiver_id": caregivers[rng.integers(0, len(caregivers), len(stay))],
            "charttime": timestamps(t),
            "storetime": timestamps(floor_to(t + (rng.uniform(0, 30, len(t)) * US_PER_MINUTE).astype(np.int64),
                                             US_PER_MINUTE)),
            "itemid": np.broadcast_to(np.asarray(itemid), len(stay)).astype(np.int64)}


def chartevents(rng, c: Cohort, caregivers: np.ndarray) -> pa.Table:
    s_all = np.arange(len(c.stay_id))
    septic = c.has("septic_shock")[c.stay_adm] | c.has("sepsis")[c.stay_adm]
    parts = []

    def add(stay, t, itemid, value, decimals, unit):
        cols = _base(c, stay, caregivers, rng, t, itemid)
        cols.update(value=decimal_text(value, decimals), valuenum=value,
                    valueuom=labels([unit], np.zeros(len(stay), np.int64)), warning=np.zeros(len(stay), np.int16))
        parts.append(pa.table(cols))

    phase = (rng.uniform(0, 50, len(s_all)) * US_PER_MINUTE).astype(np.int64)
    stay, t = _grid(c, s_all, US_PER_HOUR, floor_to(phase, US_PER_MINUTE))
    values = {}
    for name, (itemid, unit, mean, sd, step, lo, hi, dec) in VITALS.items():
        shift = {"hr": 15, "rr": 4, "spo2": -1.5, "sbp": -18, "temp_f": 1.2}[name] * septic
        base = rng.normal(mean, sd, len(s_all)) + shift
        values[name] = np.round(np.clip(base[stay] + _walk(rng, stay, step), lo, hi), dec)
    for name in ("hr", "rr", "spo2"):
        itemid, unit, *_, dec = VITALS[name]
        add(stay, t, itemid, values[name], dec, unit)
    sbp = values["sbp"]
    dbp = np.round(np.clip(sbp * rng.uniform(0.5, 0.62, len(sbp)), 30, 130))
    mbp = np.round(dbp + (sbp - dbp) / 3)
    arterial = np.isin(stay, np.flatnonzero(rng.random(len(s_all)) < 0.4))
    every4 = (rank_within(stay) % 4) == 0
    for invasive, (s_id, d_id, m_id) in ((True, (220050, 220051, 220052)), (False, (220179, 220180, 220181))):
        rows = arterial if invasive else (~arterial | every4)
        for itemid, v in ((s_id, sbp), (d_id, dbp), (m_id, mbp)):
            add(stay[rows], t[rows], itemid, v[rows], 0, "mmHg")
    celsius = np.isin(stay, np.flatnonzero(rng.random(len(s_all)) < 0.2))
    temp = values["temp_f"]
    add(stay[every4 & ~celsius], t[every4 & ~celsius], 223761, temp[every4 & ~celsius], 1, "°F")
    add(stay[every4 & celsius], t[every4 & celsius], 223762, np.round((temp[every4 & celsius] - 32) * 5 / 9, 1), 1, "°C")
    impaired = np.clip(rng.poisson(0.6, len(s_all)), 0, 3)
    for itemid, texts in GCS.items():
        worst = np.clip(impaired[stay[every4]] + rng.integers(0, 2, every4.sum()), 0, len(texts) - 1)
        cols = _base(c, stay[every4], caregivers, rng, t[every4], itemid)
        cols.update(value=labels(texts, worst), valuenum=(len(texts) - worst).astype(float),
                    valueuom=pa.nulls(len(worst), pa.string()), warning=np.zeros(len(worst), np.int16))
        parts.append(pa.table(cols))
    daily, td = _grid(c, s_all, US_PER_DAY, floor_to(phase, US_PER_MINUTE))
    weight = np.round(c.weight_kg[c.patient[c.stay_adm]], 1)
    first = rank_within(daily) == 0
    add(daily[first], td[first], 226512, weight[daily[first]], 1, "kg")
    add(daily[first], td[first], 226730, c.height_cm[c.patient[c.stay_adm[daily[first]]]], 0, "cm")
    add(daily, td, 224639, np.round(weight[daily] + rng.normal(0, 0.8, len(daily)), 1), 1, "kg")
    return _sorted(pa.concat_tables(parts), "charttime")


def _sorted(table: pa.Table, time_col: str) -> pa.Table:
    return table.take(pc.sort_indices(table, [("stay_id", "ascending"), (time_col, "ascending")]))


def lines(rng, c: Cohort) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Lines placed per stay: stay, LINES index, insertion and removal time (inside the stay)."""
    chance = np.array([ln[2] for ln in LINES])
    stay, line = np.nonzero(rng.random((len(c.stay_id), len(LINES))) < chance)
    dur = c.outtime[stay] - c.intime[stay]
    start = ceil_to(c.intime[stay] + (dur * rng.uniform(0, 0.15, len(stay))).astype(np.int64), US_PER_MINUTE)
    end = np.maximum(floor_to(c.outtime[stay] - (dur * rng.uniform(0, 0.15, len(stay))).astype(np.int64),
                              US_PER_MINUTE), start)
    return stay, line, start, end


def procedureevents(rng, c: Cohort, caregivers, placed, first_order: int) -> tuple[pa.Table, int]:
    stay, line, start, end = placed
    n = len(stay)
    minutes = ((end - start) // US_PER_MINUTE).astype(float)
    cols = _base(c, stay, caregivers, rng, start, np.array([ln[0] for ln in LINES])[line])
    del cols["charttime"]
    weight = c.weight_kg[c.patient[c.stay_adm[stay]]]
    table = pa.table({
        "subject_id": cols["subject_id"], "hadm_id": cols["hadm_id"], "stay_id": cols["stay_id"],
        "caregiver_id": cols["caregiver_id"], "starttime": timestamps(start), "endtime": timestamps(end),
        "storetime": timestamps(end), "itemid": cols["itemid"], "value": minutes,
        "valueuom": labels(["min"], np.zeros(n, np.int64)),
        "location": labels([ln[3] for ln in LINES], line), "locationcategory": labels([ln[4] for ln in LINES], line),
        "orderid": first_order + np.arange(n), "linkorderid": first_order + np.arange(n),
        "ordercategoryname": labels(["Peripheral Lines", "Peripheral Lines", "Invasive Lines", "Invasive Lines", "Tubes"], line),
        "ordercategorydescription": labels(["ContinuousProcess"], np.zeros(n, np.int64)),
        "patientweight": weight, "isopenbag": np.zeros(n, np.int16), "continueinnextdept": np.zeros(n, np.int16),
        "statusdescription": labels(["FinishedRunning"], np.zeros(n, np.int64)),
        "ORIGINALAMOUNT": minutes, "ORIGINALRATE": np.zeros(n),
    })
    return table, n


def datetimeevents(rng, c: Cohort, caregivers, placed) -> pa.Table:
    """Each line's insertion date, recharted every 4 hours while it is in."""
    stay, line, start, end = placed
    counts = (end - start) // (4 * US_PER_HOUR) + 1
    i, k = expand(counts)
    t = start[i] + k * 4 * US_PER_HOUR
    cols = _base(c, stay[i], caregivers, rng, t, np.array([ln[1] for ln in LINES])[line[i]])
    cols.update(value=timestamps(floor_to(start[i], US_PER_DAY)),
                valueuom=labels(["Date"], np.zeros(len(i), np.int64)), warning=np.zeros(len(i), np.int16))
    return pa.table(cols)


def outputevents(rng, c: Cohort, caregivers, placed) -> pa.Table:
    """Hourly Foley output while a urinary catheter is in, voids every 4-6 hours otherwise."""
    stay, line, start, end = placed
    foley = line == 4
    hourly, th = _grid_between(stay[foley], start[foley], end[foley], US_PER_HOUR)
    no_cath = np.setdiff1d(np.arange(len(c.stay_id)), stay[foley])
    voids, tv = _grid(c, no_cath, 5 * US_PER_HOUR, np.full(len(no_cath), US_PER_HOUR))
    s = np.concatenate([hourly, voids])
    t = np.concatenate([th, tv])
    is_void = np.arange(len(s)) >= len(hourly)
    value = np.where(is_void, np.round(rng.uniform(150, 500, len(s)) / 5) * 5,
                     np.round(rng.gamma(3, 25, len(s)) / 5) * 5 + 5)
    cols = _base(c, s, caregivers, rng, t, np.where(is_void, 226560, 226559))
    cols.update(value=value, valueuom=labels(["ml"], np.zeros(len(s), np.int64)))
    return pa.table(cols)


def _grid_between(groups, start, end, step):
    counts = (end - start) // step + 1
    i, k = expand(counts)
    return groups[i], start[i] + k * step


def infusions(rng, c: Cohort, caregivers, first_order: int) -> tuple[pa.Table, pa.Table, int]:
    """Continuous infusions split into 30-90 minute rate segments, and the ingredients each segment carries."""
    chance = np.array([x[1] for x in INFUSIONS])
    septic = (c.has("sepsis") | c.has("septic_shock"))[c.stay_adm]
    p = np.tile(chance, (len(c.stay_id), 1))
    p[:, 2] = np.where(septic, 0.6, 0.1)
    stay, kind = np.nonzero(rng.random(p.shape) < p)
    dur = c.outtime[stay] - c.intime[stay]
    start = ceil_to(c.intime[stay] + (dur * rng.uniform(0, 0.2, len(stay))).astype(np.int64), US_PER_MINUTE)
    end = floor_to(c.outtime[stay] - (dur * rng.uniform(0, 0.2, len(stay))).astype(np.int64), US_PER_MINUTE)
    seg_len = (rng.uniform(0.5, 1.5, len(stay)) * US_PER_HOUR).astype(np.int64)
    counts = np.maximum((end - start) // seg_len, 1)
    i, k = expand(counts)
    seg_start = start[i] + k * seg_len[i]
    seg_end = np.minimum(seg_start + seg_len[i], end[i])
    seg_end = np.maximum(seg_end, seg_start + US_PER_MINUTE)
    seg_end = np.minimum(seg_end, c.outtime[stay[i]])
    lo, hi = (np.array([x[j] for x in INFUSIONS], dtype=float) for j in (2, 3))
    rate = np.round(rng.uniform(lo[kind[i]], hi[kind[i]]), 3)
    itemid = np.array([x[0] for x in INFUSIONS])[kind[i]]
    weight = c.weight_kg[c.patient[c.stay_adm[stay[i]]]]
    hours = (seg_end - seg_start) / US_PER_HOUR
    factor = np.array([x[6] for x in INFUSIONS])[kind[i]]
    amount = np.round(rate * hours * factor * np.where(np.isin(itemid, list(PER_KG)), weight, 1.0), 4)
    n = len(i)
    orderid = first_order + np.arange(n)
    last = np.append(i[1:] != i[:-1], True)
    cols = _base(c, stay[i], caregivers, rng, seg_start, itemid)
    del cols["charttime"]
    base = {"subject_id": cols["subject_id"], "hadm_id": cols["hadm_id"], "stay_id": cols["stay_id"],
            "caregiver_id": cols["caregiver_id"], "starttime": timestamps(seg_start),
            "endtime": timestamps(seg_end), "storetime": timestamps(seg_end)}
    inputs = pa.table({
        **base, "itemid": itemid, "amount": amount,
        "amountuom": labels([x[5] for x in INFUSIONS], kind[i]), "rate": rate,
        "rateuom": labels([x[4] for x in INFUSIONS], kind[i]),
        "orderid": orderid, "linkorderid": orderid[np.cumsum(counts)[i] - counts[i]],
        "ordercategoryname": labels([x[7] for x in INFUSIONS], kind[i]),
        "secondaryordercategoryname": labels(["02-Fluids (Crystalloids)"], np.zeros(n, np.int64)),
        "ordercomponenttypedescription": labels(["Main order parameter"], np.zeros(n, np.int64)),
        "ordercategorydescription": labels(["Continuous Med"], np.zeros(n, np.int64)),
        "patientweight": weight, "totalamount": amount,
        "totalamountuom": labels([x[5] for x in INFUSIONS], kind[i]),
        "isopenbag": np.zeros(n, np.int16), "continueinnextdept": np.zeros(n, np.int16),
        "statusdescription": labels(["ChangeDose/Rate", "FinishedRunning"], last.astype(int)),
        "originalamount": amount, "originalrate": rate,
    })
    ing_parts = []
    for source, ingredients in INGREDIENTS.items():
        rows = np.flatnonzero(itemid == source)
        for ing_item, per_unit, uom in ingredients:
            ing_amount = np.round(amount[rows] * per_unit, 4)
            ing_parts.append(pa.table({
                **{k2: v.take(pa.array(rows)) if isinstance(v, pa.Array) else v[rows] for k2, v in base.items()},
                "itemid": np.full(len(rows), ing_item), "amount": ing_amount,
                "amountuom": labels([uom], np.zeros(len(rows), np.int64)),
                "rate": np.round(rate[rows] * per_unit, 4), "rateuom": labels(["mL/hour"], np.zeros(len(rows), np.int64)),
                "orderid": orderid[rows], "linkorderid": orderid[np.cumsum(counts)[i] - counts[i]][rows],
                "statusdescription": labels(["FinishedRunning"], np.zeros(len(rows), np.int64)),
                "originalamount": ing_amount, "originalrate": np.round(rate[rows] * per_unit, 4),
            }))
    return inputs, pa.concat_tables(ing_parts), n

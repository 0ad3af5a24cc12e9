"""ICU events of a chunk: charted vitals and ventilator settings, infusions and boluses with their
ingredients, outputs (lines, ventilation and tasks are in :mod:`devices`).

Every event is laid on a grid ``intime + k * step`` that stops before ``outtime``, so ICU times are
inside their stay by construction; vitals follow a per-stay random walk around a per-stay baseline.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.sources.synthetic.arrays import (
    US_PER_DAY,
    US_PER_HOUR,
    US_PER_MINUTE,
    ceil_to,
    decimal_text,
    expand,
    floor_to,
    labels,
    rank_within,
    timestamps,
    uniform_between,
)
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
INFUSIONS = (  # itemid, chance, rate low/high, rateuom, amountuom, amount per rate-hour factor, category
    (225158, 0.9, 50, 150, "mL/hour", "ml", 1.0, "01-Drips"),
    (220949, 0.25, 30, 100, "mL/hour", "ml", 1.0, "02-Fluids (Crystalloids)"),
    (221906, 0.25, 0.02, 0.3, "mcg/kg/min", "mg", 0.06, "01-Drips"),   # x weight: mcg/kg/min -> mg/h
    (222168, 0.3, 10, 50, "mcg/kg/min", "mg", 0.06, "01-Drips"),
    (223258, 0.12, 1, 8, "units/hour", "units", 1.0, "01-Drips"),
)
PER_KG = {221906, 222168}
VENT_SETTINGS = {  # itemid: unit, low, high, grid step, starting range - charted every 4 hours on the ventilator
    223835: ("None", 21, 100, 5, (40, 60)),      # FiO2 (%)
    220339: ("cmH2O", 0, 24, 1, (5, 10)),        # PEEP set
    224684: ("mL", 250, 800, 10, (350, 550)),    # Tidal Volume (set)
    224688: ("insp/min", 8, 35, 1, (12, 22)),    # Respiratory Rate (Set)
}
PO_INTAKE, LR_BOLUS = 226452, 225828
BOLUSES = {  # itemid: amount choices, amountuom, minutes given over, ordercategoryname,
    #          secondaryordercategoryname, ordercategorydescription, mL of water carried per dose
    PO_INTAKE: ((60, 120, 180, 240, 360, 480), "ml", 1, "14-Oral/Gastric Intake", None, "Bolus", None),  # PO Intake
    LR_BOLUS: ((500, 1000), "ml", 30, "03-IV Fluid Bolus", "Additive (Crystalloid)", "Bolus", None),   # LR
    225798: ((1,), "dose", 90, "08-Antibiotics (IV)", "02-Fluids (Crystalloids)", "Drug Push", 250),  # Vancomycin
    225851: ((1,), "dose", 30, "08-Antibiotics (IV)", "02-Fluids (Crystalloids)", "Drug Push", 100),  # Cefepime
    225893: ((1,), "dose", 30, "08-Antibiotics (IV)", "02-Fluids (Crystalloids)", "Drug Push", 100),  # Zosyn
}
ANTIBIOTIC_HOURS = {225798: 12, 225851: 12, 225893: 8}
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


def base_columns(c: Cohort, stay: np.ndarray, caregivers: np.ndarray, rng, t: np.ndarray, itemid) -> dict:
    a = c.stay_adm[stay]
    return {"subject_id": c.subject_id[c.patient[a]], "hadm_id": c.hadm_id[a], "stay_id": c.stay_id[stay],
            "caregiver_id": caregivers[rng.integers(0, len(caregivers), len(stay))],
            "charttime": timestamps(t),
            "storetime": timestamps(floor_to(t + (rng.uniform(0, 30, len(t)) * US_PER_MINUTE).astype(np.int64),
                                             US_PER_MINUTE)),
            "itemid": np.broadcast_to(np.asarray(itemid), len(stay)).astype(np.int64)}


def chartevents(rng, c: Cohort, caregivers: np.ndarray, ventilated) -> pa.Table:
    """Vitals hourly, GCS and temperature every 4 hours, weights daily, ventilator settings while ``ventilated``.

    Rows are collected as NumPy columns and sorted once (per stay, in time order) before any text is built.
    """
    s_all = np.arange(len(c.stay_id))
    septic = c.has("septic_shock")[c.stay_adm] | c.has("sepsis")[c.stay_adm]
    parts = []
    units: dict[str | None, int] = {}
    gcs_texts = [text for texts in GCS.values() for text in texts]

    def add(stay, t, itemid, value, decimals, unit, text=None):
        n = len(stay)
        unit_id = units.setdefault(unit, len(units))
        parts.append((stay, t, np.full(n, itemid), value, np.full(n, decimals), np.full(n, unit_id),
                      np.full(n, -1) if text is None else text))

    phase = (rng.uniform(0, 50, len(s_all)) * US_PER_MINUTE).astype(np.int64)
    stay, t = _grid(c, s_all, US_PER_HOUR, floor_to(phase, US_PER_MINUTE))
    values = {}
    for name, (_, _, mean, sd, step, lo, hi, dec) in VITALS.items():
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
    offset = 0
    for itemid, texts in GCS.items():
        worst = np.clip(impaired[stay[every4]] + rng.integers(0, 2, every4.sum()), 0, len(texts) - 1)
        add(stay[every4], t[every4], itemid, (len(texts) - worst).astype(float), 0, None, offset + worst)
        offset += len(texts)
    daily, td = _grid(c, s_all, US_PER_DAY, floor_to(phase, US_PER_MINUTE))
    weight = np.round(c.weight_kg[c.patient[c.stay_adm]], 1)
    first = rank_within(daily) == 0
    add(daily[first], td[first], 226512, weight[daily[first]], 1, "kg")
    add(daily[first], td[first], 226730, c.height_cm[c.patient[c.stay_adm[daily[first]]]], 0, "cm")
    add(daily, td, 224639, np.round(weight[daily] + rng.normal(0, 0.8, len(daily)), 1), 1, "kg")
    v_stay, v_start, v_end = ventilated
    episode, tv = _grid_between(np.arange(len(v_stay)), v_start, v_end, 4 * US_PER_HOUR)
    for itemid, (unit, lo, hi, step, (first_lo, first_hi)) in VENT_SETTINGS.items():
        level = rng.uniform(first_lo, first_hi, len(v_stay))[episode] + step * _walk(rng, episode, 0.5)
        add(v_stay[episode], tv, itemid, np.clip(np.round(level / step) * step, lo, hi), 0, unit)

    stay, t, itemid, value, dec, unit, text = (np.concatenate(x) for x in zip(*parts))
    order = np.lexsort((t, stay))
    stay, t, itemid, value, dec, unit, text = (x[order] for x in (stay, t, itemid, value, dec, unit, text))
    numeric = decimal_text(value, dec)
    is_text = text >= 0
    indices = np.where(is_text, len(numeric.dictionary) + text, numeric.indices.to_numpy())
    cols = base_columns(c, stay, caregivers, rng, t, itemid)
    unit_names = list(units)
    cols.update(value=labels(numeric.dictionary.to_pylist() + gcs_texts, indices), valuenum=value,
                valueuom=labels(unit_names, unit, np.array([u is not None for u in unit_names])[unit]),
                warning=np.zeros(len(stay), np.int16))
    return pa.table(cols)


def outputevents(rng, c: Cohort, caregivers, foley) -> pa.Table:
    """Hourly output while a Foley catheter (stay, start, end) is in, voids every 5 hours otherwise."""
    stay, start, end = foley
    hourly, th = _grid_between(stay, start, end, US_PER_HOUR)
    no_cath = np.setdiff1d(np.arange(len(c.stay_id)), stay)
    voids, tv = _grid(c, no_cath, 5 * US_PER_HOUR, np.full(len(no_cath), US_PER_HOUR))
    s = np.concatenate([hourly, voids])
    t = np.concatenate([th, tv])
    is_void = np.arange(len(s)) >= len(hourly)
    value = np.where(is_void, np.round(rng.uniform(150, 500, len(s)) / 5) * 5,
                     np.round(rng.gamma(3, 25, len(s)) / 5) * 5 + 5)
    cols = base_columns(c, s, caregivers, rng, t, np.where(is_void, 226560, 226559))
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
    base = interval_columns(c, stay[i], caregivers, rng, seg_start, seg_end)
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


def boluses(rng, c: Cohort, caregivers, first_order: int,
            ventilated_stays: np.ndarray) -> tuple[pa.Table, pa.Table, int]:
    """One-off intakes: oral intake off the ventilator, LR boluses in shock, scheduled IV antibiotics for infections."""
    n_stays = len(c.stay_id)
    days = (c.outtime - c.intime) / US_PER_DAY
    awake = ~np.isin(np.arange(n_stays), ventilated_stays)
    infected = (c.has("sepsis") | c.has("pneumonia") | c.has("urinary_infection") | c.has("cellulitis"))[c.stay_adm]
    shock = (c.has("septic_shock") | c.has("hypotension"))[c.stay_adm]
    per_day = {PO_INTAKE: 5.0 * awake, LR_BOLUS: 0.5 + 1.2 * shock}
    stay_parts, item_parts, t_parts = [], [], []
    for itemid, rate in per_day.items():
        counts = rng.poisson(rate * days)
        stay, _ = expand(counts)
        stay_parts.append(stay)
        item_parts.append(np.full(len(stay), itemid))
        t_parts.append(uniform_between(rng, c.intime[stay], c.outtime[stay]))
    for itemid, hours in ANTIBIOTIC_HOURS.items():
        given = np.flatnonzero(rng.random(n_stays) < np.where(infected, 0.45, 0.04))
        stay, t = _grid(c, given, hours * US_PER_HOUR, (rng.uniform(0, 4, len(given)) * US_PER_HOUR).astype(np.int64))
        stay_parts.append(stay)
        item_parts.append(np.full(len(stay), itemid))
        t_parts.append(t)
    stay, itemid, start = (np.concatenate(x) for x in (stay_parts, item_parts, t_parts))
    start = floor_to(np.maximum(start, ceil_to(c.intime[stay], US_PER_MINUTE)), US_PER_MINUTE)
    order = np.lexsort((itemid, start, stay))
    stay, itemid, start = stay[order], itemid[order], start[order]
    ids = np.array(sorted(BOLUSES))
    spec = [BOLUSES[i] for i in ids]
    kind = np.searchsorted(ids, itemid)
    minutes = np.array([x[2] for x in spec])[kind]
    end = np.minimum(start + minutes * US_PER_MINUTE, floor_to(c.outtime[stay], US_PER_MINUTE))
    end = np.maximum(end, start)
    amount = _pick(rng, [np.array(x[0], dtype=float) for x in spec], kind)
    n = len(stay)
    orderid = first_order + np.arange(n)
    base = interval_columns(c, stay, caregivers, rng, start, end)
    def per_kind(j):
        return labels([x[j] for x in spec], kind, np.array([x[j] is not None for x in spec])[kind])

    rate = amount / np.maximum((end - start) / US_PER_HOUR, 1 / 60)
    has_rate = itemid == LR_BOLUS
    inputs = pa.table({
        **base, "itemid": itemid, "amount": amount, "amountuom": per_kind(1),
        "rate": pa.array(np.round(rate, 1), mask=~has_rate),
        "rateuom": labels(["mL/hour"], np.zeros(n, np.int64), has_rate),
        "orderid": orderid, "linkorderid": orderid,
        "ordercategoryname": per_kind(3), "secondaryordercategoryname": per_kind(4),
        "ordercomponenttypedescription": labels(["Main order parameter"], np.zeros(n, np.int64)),
        "ordercategorydescription": per_kind(5),
        "patientweight": c.weight_kg[c.patient[c.stay_adm[stay]]], "totalamount": amount,
        "totalamountuom": per_kind(1),
        "isopenbag": np.zeros(n, np.int16), "continueinnextdept": np.zeros(n, np.int16),
        "statusdescription": labels(["FinishedRunning"], np.zeros(n, np.int64)),
        "originalamount": amount, "originalrate": np.where(has_rate, np.round(rate, 1), 0.0),
    })
    water = np.where(np.array([x[6] is None for x in spec])[kind], amount,
                     np.array([x[6] or 0 for x in spec], dtype=float)[kind])
    ingredients = pa.table({
        **base, "itemid": np.full(n, 220490), "amount": water, "amountuom": labels(["ml"], np.zeros(n, np.int64)),
        "rate": pa.nulls(n, pa.float64()), "rateuom": pa.nulls(n, pa.string()),
        "orderid": orderid, "linkorderid": orderid,
        "statusdescription": labels(["FinishedRunning"], np.zeros(n, np.int64)),
        "originalamount": water, "originalrate": np.zeros(n),
    })
    return inputs, ingredients, n


def _pick(rng, choices: list[np.ndarray], kind: np.ndarray) -> np.ndarray:
    """One value per row from ``choices[kind]``."""
    sizes = np.array([len(ch) for ch in choices])
    offsets = np.cumsum(sizes) - sizes
    return np.concatenate(choices)[offsets[kind] + rng.integers(0, sizes[kind])]


def interval_columns(c: Cohort, stay: np.ndarray, caregivers, rng, start: np.ndarray, end: np.ndarray) -> dict:
    """The identifier and time columns shared by inputevents and ingredientevents rows."""
    a = c.stay_adm[stay]
    return {"subject_id": c.subject_id[c.patient[a]], "hadm_id": c.hadm_id[a], "stay_id": c.stay_id[stay],
            "caregiver_id": caregivers[rng.integers(0, len(caregivers), len(stay))],
            "starttime": timestamps(start), "endtime": timestamps(end), "storetime": timestamps(end)}

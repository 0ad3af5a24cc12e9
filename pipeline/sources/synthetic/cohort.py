"""Patients, admissions, ICU stays, transfers and services for one chunk of patients.

The :class:`Cohort` keeps the per-admission arrays (times, diagnoses, ICU window) that every event
module draws from, so events are placed inside their stays by construction rather than by filtering.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipeline.sources.synthetic import reference as ref
from pipeline.sources.synthetic.arrays import (
    US_PER_DAY,
    US_PER_HOUR,
    US_PER_MINUTE,
    choice,
    dates,
    expand,
    floor_to,
    labels,
    scrambled_ids,
    timestamps,
    year_start,
)

NO_DEATH = np.iinfo(np.int64).max
ADMISSIONS_PER_PATIENT = np.array([0, 40, 22, 14, 9, 6, 4, 3, 2], dtype=float)  # P(n admissions)


@dataclass
class Cohort:
    n_patients: int
    subject_id: np.ndarray
    age: np.ndarray
    female: np.ndarray
    weight_kg: np.ndarray
    height_cm: np.ndarray
    # per admission
    patient: np.ndarray
    hadm_id: np.ndarray
    admittime: np.ndarray
    dischtime: np.ndarray
    died: np.ndarray
    concepts: np.ndarray  # bool [admission, diagnosis concept]
    principal: np.ndarray
    icd10: np.ndarray
    icu: np.ndarray
    # per ICU stay (one per ICU admission)
    stay_adm: np.ndarray
    stay_id: np.ndarray
    intime: np.ndarray
    outtime: np.ndarray
    stay_unit: np.ndarray
    anchor_year: np.ndarray
    group: np.ndarray
    n_adm: np.ndarray
    dod: np.ndarray  # per patient: time of death (microseconds), NO_DEATH if alive a year after discharge

    def has(self, concept: str) -> np.ndarray:
        return self.concepts[:, ref.diagnoses().index(concept)]

    @property
    def los_days(self) -> np.ndarray:
        return (self.dischtime - self.admittime) / US_PER_DAY


def _comorbidities(rng, age: np.ndarray) -> np.ndarray:
    """Chronic conditions per patient, correlated the way population questions expect."""
    dx = ref.diagnoses()
    n = len(age)
    out = np.zeros((n, len(dx.names)), dtype=bool)
    older = np.clip((age - 30) / 50, 0, 1)
    for i, (role, w) in enumerate(zip(dx.role, dx.weight)):
        if role == "chronic" and w > 0:
            out[:, i] = rng.random(n) < w * (0.4 + 1.2 * older)
    has = lambda c: out[:, dx.index(c)]  # noqa: E731
    boost = lambda c, cond, p: out.__setitem__((slice(None), dx.index(c)), has(c) | (cond & (rng.random(n) < p)))  # noqa: E731
    boost("ckd", has("hypertension") | has("diabetes"), 0.25)
    boost("heart_failure", has("hypertension") | has("coronary_disease"), 0.15)
    boost("esrd", has("ckd"), 0.12)
    boost("hyperlipidemia", has("diabetes") | has("coronary_disease"), 0.5)
    boost("insulin_use", has("diabetes"), 0.4)
    boost("anticoagulant_use", has("atrial_fibrillation"), 0.6)
    boost("aspirin_use", has("coronary_disease"), 0.7)
    boost("coronary_stent_status", has("coronary_disease"), 0.4)
    boost("anemia", has("ckd"), 0.3)
    both = has("hypertension") & has("ckd")
    out[:, dx.index("hypertensive_ckd")] = both
    out[:, dx.index("hypertension")] &= ~both  # MIMIC codes hypertension with CKD as one code
    out[:, dx.index("diabetic_ckd")] = has("diabetes") & has("ckd")
    return out


def _acute(rng, c: np.ndarray, principal: np.ndarray, icu: np.ndarray, died: np.ndarray) -> None:
    """Principal diagnosis and the secondary diagnoses it drags along (sepsis + AKI, shock, DNR...)."""
    dx = ref.diagnoses()
    n = len(principal)
    c[np.arange(n), principal] = True
    has = lambda name: c[:, dx.index(name)]  # noqa: E731

    def add(name, cond, p):
        c[:, dx.index(name)] |= cond & (rng.random(n) < p)

    sepsis = has("sepsis")
    add("acute_kidney_injury", sepsis, 0.4)
    add("severe_sepsis", sepsis, 0.4)
    add("septic_shock", sepsis & icu, 0.35)
    add("hypotension", has("septic_shock") | has("gi_bleed"), 0.5)
    add("acidosis", sepsis | has("acute_kidney_injury"), 0.25)
    add("hyperkalemia", has("acute_kidney_injury") | has("ckd") | has("esrd"), 0.2)
    add("acute_kidney_injury", has("heart_failure_exacerbation"), 0.25)
    add("thrombocytopenia", sepsis, 0.2)
    add("respiratory_failure", has("pneumonia") & icu, 0.4)
    add("do_not_resuscitate", died, 0.7)
    add("heart_failure", has("heart_failure_exacerbation"), 1.0)


def generate(rng: np.random.Generator, first_patient: int, n: int, first_admission: int,
             first_stay: int) -> Cohort:
    dx = ref.diagnoses()
    subject_id = scrambled_ids(first_patient + np.arange(n), 10_000_000, 10_000_000)
    female = rng.random(n) < 0.52
    age = np.clip(np.round(rng.normal(62, 17, n)), 18, 91).astype(np.int64)
    weight = np.clip(rng.normal(np.where(female, 72, 85), 17), 40, 200).round(1)
    height = np.clip(rng.normal(np.where(female, 162, 176), 7), 140, 205).round(0)
    chronic = _comorbidities(rng, age)

    n_adm = choice(rng, ADMISSIONS_PER_PATIENT, n)
    patient, nth = expand(n_adm)
    m = len(patient)
    hadm_id = scrambled_ids(first_admission + np.arange(m), 20_000_000, 10_000_000)
    anchor_year = rng.integers(2110, 2200, n)
    group = rng.integers(0, len(ref.ANCHOR_YEAR_GROUPS), n)

    # admissions laid end to end per patient: gap (short for early readmissions) then stay
    principal_weights = np.where(dx.role == "principal", dx.weight, 0)
    principal = choice(rng, principal_weights, m)
    icu_chance = np.array([ref.DRG_BY_PRINCIPAL.get(name, ("",) * 4 + (0.0,))[4] for name in dx.names])
    icu = rng.random(m) < icu_chance[principal]
    los = np.clip(rng.lognormal(np.log(np.where(icu, 5.5, 3.2)), 0.6, m), 0.3, 45)
    readmit = rng.random(m) < 0.25
    gap_days = np.where(nth == 0, rng.uniform(0, 3 * 365, m),
                        np.where(readmit, rng.uniform(2, 30, m), 30 + rng.exponential(400, m)))
    span = ((gap_days + los) * US_PER_DAY).astype(np.int64)
    end = np.cumsum(span)
    end -= np.repeat(end[np.cumsum(n_adm) - n_adm] - span[np.cumsum(n_adm) - n_adm], n_adm)
    origin = year_start(anchor_year)[patient]
    dischtime = floor_to(origin + end, US_PER_MINUTE)
    admittime = floor_to(dischtime - (los * US_PER_DAY).astype(np.int64), US_PER_MINUTE)

    last = np.zeros(m, dtype=bool)
    last[np.cumsum(n_adm) - 1] = True
    death_risk = 0.03 + 0.1 * icu + 0.06 * (age[patient] > 75)
    died = last & (rng.random(m) < death_risk)

    concepts = chronic[patient].copy()
    _acute(rng, concepts, principal, icu, died)
    real_year = 2008 + 3 * group[patient] + rng.integers(0, 3, n)[patient] + (
        (admittime - origin) // (365 * US_PER_DAY))
    icd10 = real_year >= 2016

    # one ICU stay inside each ICU admission; a death in an ICU admission happens in the ICU
    stay_adm = np.flatnonzero(icu)
    span_us = dischtime[stay_adm] - admittime[stay_adm]
    intime = admittime[stay_adm] + (span_us * rng.uniform(0.02, 0.3, len(stay_adm))).astype(np.int64)
    intime = floor_to(intime, 1_000_000)
    stay_len = np.minimum(np.maximum((rng.lognormal(np.log(2.2), 0.7, len(stay_adm)) * US_PER_DAY).astype(np.int64), 4 * US_PER_HOUR),
                          (dischtime[stay_adm] - intime) * 9 // 10)
    outtime = np.where(died[stay_adm], dischtime[stay_adm], floor_to(intime + stay_len, 1_000_000))
    stay_id = scrambled_ids(first_stay + np.arange(len(stay_adm)), 30_000_000, 10_000_000)
    stay_unit = choice(rng, list(ref.ICU_UNITS.values()), len(stay_adm))

    # death: in hospital, or for some survivors within a year of their last discharge
    died_in_hospital = died[last]
    later = ~died_in_hospital & (rng.random(n) < 0.15)
    dod = np.where(died_in_hospital, dischtime[last],
                   np.where(later, dischtime[last] + (rng.uniform(1, 365, n) * US_PER_DAY).astype(np.int64), NO_DEATH))
    return Cohort(n, subject_id, age, female, weight, height, patient, hadm_id, admittime, dischtime,
                  died, concepts, principal, icd10, icu, stay_adm, stay_id, intime, outtime, stay_unit,
                  anchor_year, group, n_adm, dod)


def patients(c: Cohort) -> pa.Table:
    has_dod = c.dod != NO_DEATH
    return pa.table({
        "subject_id": c.subject_id,
        "gender": labels(["M", "F"], c.female.astype(int)),
        "anchor_age": c.age,
        "anchor_year": c.anchor_year,
        "anchor_year_group": labels(ref.ANCHOR_YEAR_GROUPS, c.group),
        "dod": pa.array(dates(np.where(has_dod, c.dod, 0)).to_numpy(zero_copy_only=False), type=pa.date32(),
                        mask=~has_dod),
    })


def admissions(rng, c: Cohort, providers: np.ndarray) -> pa.Table:
    m = len(c.patient)
    types = list(ref.ADMISSION_TYPES)
    adm_type = choice(rng, [w for w, _ in ref.ADMISSION_TYPES.values()], m)
    via_ed = np.array([ed for _, ed in ref.ADMISSION_TYPES.values()])[adm_type]
    locations = ["EMERGENCY ROOM"] + list(ref.NON_ED_LOCATIONS)
    location = np.where(via_ed, 0, 1 + choice(rng, list(ref.NON_ED_LOCATIONS.values()), m))
    discharge = ["DIED"] + list(ref.DISCHARGE_LOCATIONS)
    disch_loc = np.where(c.died, 0, 1 + choice(rng, list(ref.DISCHARGE_LOCATIONS.values()), m))
    age_at = c.age[c.patient]
    insurance = np.where(age_at >= 65, np.where(rng.random(m) < 0.85, 0, 2),
                         np.where(rng.random(m) < 0.2, 1, 2))
    per_patient = lambda weights: choice(rng, list(weights.values()), c.n_patients)[c.patient]  # noqa: E731
    edreg = floor_to(c.admittime - (rng.uniform(2, 10, m) * US_PER_HOUR).astype(np.int64), US_PER_MINUTE)
    edout = floor_to(c.admittime + (rng.uniform(0, 1, m) * US_PER_HOUR).astype(np.int64), US_PER_MINUTE)
    return pa.table({
        "subject_id": c.subject_id[c.patient],
        "hadm_id": c.hadm_id,
        "admittime": timestamps(c.admittime),
        "dischtime": timestamps(c.dischtime),
        "deathtime": timestamps(c.dischtime, c.died),
        "admission_type": labels(types, adm_type),
        "admit_provider_id": labels(providers, rng.integers(0, len(providers), m)),
        "admission_location": labels(locations, location),
        "discharge_location": labels(discharge, disch_loc),
        "insurance": labels(["Medicare", "Medicaid", "Other"], insurance),
        "language": labels(list(ref.LANGUAGES), per_patient(ref.LANGUAGES)),
        "marital_status": labels(list(ref.MARITAL), per_patient(ref.MARITAL)),
        "race": labels(list(ref.RACES), per_patient(ref.RACES)),
        "edregtime": timestamps(edreg, via_ed),
        "edouttime": timestamps(edout, via_ed),
        "hospital_expire_flag": c.died.astype(np.int16),
    })


def icustays(c: Cohort) -> pa.Table:
    unit = labels(list(ref.ICU_UNITS), c.stay_unit)
    return pa.table({
        "subject_id": c.subject_id[c.patient[c.stay_adm]],
        "hadm_id": c.hadm_id[c.stay_adm],
        "stay_id": c.stay_id,
        "first_careunit": unit,
        "last_careunit": unit,
        "intime": timestamps(c.intime),
        "outtime": timestamps(c.outtime),
        "los": (c.outtime - c.intime) / US_PER_DAY,
    })


def transfers(rng, c: Cohort, first_transfer: int) -> tuple[pa.Table, int]:
    """Ward -> (ICU ->) ward -> discharge per admission; ED time lives in admissions.edregtime."""
    m = len(c.patient)
    wards, icus = list(ref.WARDS), list(ref.ICU_UNITS)
    units = wards + icus
    time = np.zeros((m, 4), dtype=np.int64)
    unit = np.zeros((m, 4), dtype=np.int64)
    valid = np.zeros((m, 4), dtype=bool)
    kind = np.array([[0, 1, 1, 2]] * m)  # admit, transfer, transfer, discharge
    time[:, 0], unit[:, 0], valid[:, 0] = c.admittime, choice(rng, list(ref.WARDS.values()), m), True
    second_ward = choice(rng, list(ref.WARDS.values()), m)
    mid = c.admittime + ((c.dischtime - c.admittime) * rng.uniform(0.3, 0.7, m)).astype(np.int64)
    moves = ~c.icu & (rng.random(m) < 0.4)
    time[:, 1], unit[:, 1], valid[:, 1] = floor_to(mid, 1_000_000), second_ward, moves
    s = c.stay_adm
    time[s, 1], unit[s, 1], valid[s, 1] = c.intime, len(wards) + c.stay_unit, True
    time[s, 2], unit[s, 2], valid[s, 2] = c.outtime, second_ward[s], ~c.died[s]
    time[:, 3], valid[:, 3] = c.dischtime, True
    adm, slot = np.nonzero(valid)
    t = time[adm, slot]
    nxt = np.append(t[1:], 0)
    is_discharge = slot == 3
    n = len(adm)
    table = pa.table({
        "subject_id": c.subject_id[c.patient[adm]],
        "hadm_id": c.hadm_id[adm],
        "transfer_id": scrambled_ids(first_transfer + np.arange(n), 30_000_000, 10_000_000),
        "eventtype": labels(["admit", "transfer", "discharge"], kind[adm, slot]),
        "careunit": labels(units, unit[adm, slot], ~is_discharge),
        "intime": timestamps(t),
        "outtime": timestamps(nxt, ~is_discharge),
    })
    return table, n


def services(rng, c: Cohort) -> pa.Table:
    """The admitting service, plus a service change mid-stay for some admissions."""
    m = len(c.patient)
    names = list(ref.SERVICES)
    first = choice(rng, list(ref.SERVICES.values()), m)
    second = (first + 1 + rng.integers(0, len(names) - 1, m)) % len(names)
    changes = rng.random(m) < 0.2
    adm = np.concatenate([np.arange(m), np.flatnonzero(changes)])
    is_change = np.arange(len(adm)) >= m
    mid = c.admittime + ((c.dischtime - c.admittime) * rng.uniform(0.2, 0.8, m)).astype(np.int64)
    t = np.where(is_change, floor_to(mid[adm], 1_000_000), c.admittime[adm])
    order = np.lexsort((t, adm))
    adm, is_change, t = adm[order], is_change[order], t[order]
    return pa.table({
        "subject_id": c.subject_id[c.patient[adm]],
        "hadm_id": c.hadm_id[adm],
        "transfertime": timestamps(t),
        "prev_service": labels(names, first[adm], is_change),
        "curr_service": labels(names, np.where(is_change, second[adm], first[adm])),
    })


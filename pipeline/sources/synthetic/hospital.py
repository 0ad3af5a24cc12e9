"""Hospital-wide events of a chunk: coded diagnoses/procedures, DRGs, HCPCS, labs, microbiology, OMR.

Lab values come from a per-admission baseline shifted by the admission's diagnoses (CKD raises
creatinine, sepsis raises WBC and lactate...) plus a within-stay trend, so population questions
have signal; every value is rounded first and its text, flag and range follow from that number.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.sources.synthetic import reference as ref
from pipeline.sources.synthetic.arrays import (
    US_PER_DAY,
    US_PER_MINUTE,
    choice,
    dates,
    decimal_text,
    expand,
    floor_to,
    labels,
    rank_within,
    round_to,
    scrambled_ids,
    timestamps,
    uniform_between,
)
from pipeline.sources.synthetic.cohort import Cohort

PANELS = {  # panel: (chance per draw on the ward, in the ICU)
    "chem": (1.0, 1.0), "cbc": (0.85, 0.95), "chem_ext": (0.6, 0.8), "coag": (0.3, 0.5),
    "liver": (0.2, 0.3), "gas": (0.0, 0.5), "cardiac": (0.08, 0.15),
}
# (diagnosis concept, lab itemid, baseline shift, peak shift within the stay), in item SDs
LAB_EFFECTS = (
    ("ckd", 50912, 5.0, 0), ("ckd", 51006, 3.0, 0), ("ckd", 50970, 1.5, 0), ("ckd", 51222, -1.0, 0),
    ("esrd", 50912, 20.0, 0), ("esrd", 51006, 6.0, 0), ("esrd", 50971, 1.5, 0),
    ("acute_kidney_injury", 50912, 2.0, 7.0), ("acute_kidney_injury", 51006, 1.5, 3.0),
    ("acute_kidney_injury", 50971, 0.5, 1.5), ("hyperkalemia", 50971, 1.5, 1.5),
    ("diabetes", 50931, 2.5, 0), ("sepsis", 51301, 2.5, 2.5), ("sepsis", 50813, 1.5, 4.0),
    ("sepsis", 50882, -1.0, -2.0), ("septic_shock", 50813, 2.0, 6.0), ("thrombocytopenia", 51265, -2.5, -1.0),
    ("gi_bleed", 51222, -1.5, -1.5), ("gi_bleed", 51006, 1.5, 1.0), ("anemia", 51222, -1.2, 0),
    ("hyponatremia", 50983, -3.5, 1.5), ("heart_failure_exacerbation", 50983, -1.0, 0),
    ("heart_failure_exacerbation", 50912, 1.0, 1.0), ("myocardial_infarction", 51003, 30.0, 120.0),
    ("respiratory_failure", 50818, 2.0, 2.0), ("respiratory_failure", 50820, -1.5, -1.5),
    ("respiratory_failure", 50821, -2.0, 0), ("anticoagulant_use", 51274, 6.0, 0),
    ("anticoagulant_use", 51237, 7.0, 0), ("acidosis", 50882, -2.0, -1.0), ("acidosis", 50820, -1.5, -1.0),
)
HCPCS_OBSERVATION = ("G0378", "99219")
HCPCS_CARDIAC = ("93454", "C9600", "92928")


def diagnoses_icd(c: Cohort) -> pa.Table:
    """Principal diagnosis first, then the acute secondaries, then chronic conditions."""
    dx = ref.diagnoses()
    adm, concept = np.nonzero(c.concepts)
    version = c.icd10[adm].astype(np.int64)
    return pa.table({
        "subject_id": c.subject_id[c.patient[adm]],
        "hadm_id": c.hadm_id[adm],
        "seq_num": rank_within(adm) + 1,
        "icd_code": pa.array(dx.code[concept, version]),
        "icd_version": 9 + version,
    })


def procedures_icd(rng, c: Cohort) -> pa.Table:
    px = ref.procedures()
    m = len(c.patient)
    p = np.zeros((m, len(px.names)))
    icu, has = c.icu, c.has

    def chance(name, prob):
        p[:, px.index(name)] = np.maximum(p[:, px.index(name)], prob)

    chance("central_line", 0.55 * icu)
    chance("ventilation_short", 0.25 * icu + 0.5 * has("respiratory_failure"))
    chance("arterial_line", 0.35 * icu)
    chance("enteral_nutrition", 0.12 * icu)
    chance("hemodialysis", 0.8 * has("esrd") + 0.1 * has("acute_kidney_injury"))
    chance("transfusion", 0.6 * has("gi_bleed") + 0.1 * has("anemia") + 0.02)
    chance("cardiac_catheterization", 0.7 * has("myocardial_infarction") + 0.1 * has("chest_pain"))
    chance("coronary_arteriography", 0.6 * has("myocardial_infarction"))
    chance("coronary_stent", 0.45 * has("myocardial_infarction"))
    chance("upper_endoscopy", 0.7 * has("gi_bleed"))
    chance("colonoscopy", 0.3 * has("gi_bleed"))
    chance("paracentesis", np.full(m, 0.02))
    chance("thoracentesis", np.full(m, 0.02) + 0.05 * has("heart_failure_exacerbation"))
    chance("lumbar_puncture", 0.08 * has("stroke") + 0.01)
    chance("bronchoscopy", 0.1 * has("respiratory_failure"))
    done = rng.random(p.shape) < p
    ventilated = done[:, px.index("ventilation_short")]
    long_vent = ventilated & (rng.random(m) < 0.3)
    done[:, px.index("ventilation_long")] = long_vent
    done[:, px.index("ventilation_short")] &= ~long_vent
    done[:, px.index("intubation")] = ventilated
    adm, proc = np.nonzero(done)
    version = c.icd10[adm].astype(np.int64)
    when = uniform_between(rng, c.admittime[adm], c.dischtime[adm])
    return pa.table({
        "subject_id": c.subject_id[c.patient[adm]],
        "hadm_id": c.hadm_id[adm],
        "seq_num": rank_within(adm) + 1,
        "chartdate": dates(when),
        "icd_code": pa.array(px.code[proc, version]),
        "icd_version": 9 + version,
    })


def drgcodes(rng, c: Cohort) -> pa.Table:
    """One HCFA and one APR DRG per admission, from the principal diagnosis."""
    dx = ref.diagnoses()
    drg = [ref.DRG_BY_PRINCIPAL[name] for name in dx.names[dx.role == "principal"]]
    m = len(c.patient)
    adm = np.repeat(np.arange(m), 2)
    apr = np.tile([False, True], m)
    k = c.principal[adm]
    codes = np.array([[d[0], d[2]] for d in drg])[k, apr.astype(int)]
    descriptions = np.array([[d[1], d[3]] for d in drg])[k, apr.astype(int)]
    severity = rng.integers(1, 5, len(adm))
    return pa.table({
        "subject_id": c.subject_id[c.patient[adm]],
        "hadm_id": c.hadm_id[adm],
        "drg_type": labels(["HCFA", "APR"], apr.astype(int)),
        "drg_code": pa.array(codes),
        "description": pa.array(descriptions),
        "drg_severity": pa.array(severity, mask=~apr),
        "drg_mortality": pa.array(np.clip(severity + rng.integers(-1, 2, len(adm)), 1, 4), mask=~apr),
    })


def hcpcsevents(rng, c: Cohort) -> pa.Table:
    """Observation hours for short stays, catheterisation codes for myocardial infarctions."""
    short = (c.los_days < 2) & ~c.icu
    cardiac = c.has("myocardial_infarction") & (rng.random(len(c.patient)) < 0.6)
    adm = np.concatenate([np.flatnonzero(short), np.repeat(np.flatnonzero(cardiac), 2)])
    code = np.concatenate([rng.integers(0, 2, short.sum()), 2 + np.tile([0, 1], cardiac.sum())])
    order = np.argsort(adm, kind="stable")
    adm, code = adm[order], code[order]
    names = HCPCS_OBSERVATION + HCPCS_CARDIAC
    short_desc = {r["code"]: r["short_description"] for r in ref.rows("d_hcpcs")}
    return pa.table({
        "subject_id": c.subject_id[c.patient[adm]],
        "hadm_id": c.hadm_id[adm],
        "chartdate": dates(uniform_between(rng, c.admittime[adm], c.dischtime[adm])),
        "hcpcs_cd": labels(names, code),
        "seq_num": rank_within(adm) + 1,
        "short_description": labels([short_desc[n] for n in names], code),
    })


def _lab_params():
    labs = ref.rows("labs")
    f = lambda k: np.array([float(r[k]) for r in labs])  # noqa: E731
    return labs, np.array([int(r["itemid"]) for r in labs]), f


def _draws(rng, c: Cohort) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blood draws per admission (about 1.5 a day on the ward, 3 a day in the ICU): admission, time, in ICU."""
    ward_n = np.ceil(c.los_days * 1.5).astype(np.int64)
    adm, _ = expand(ward_n)
    t = uniform_between(rng, c.admittime[adm] + 10 * US_PER_MINUTE, c.dischtime[adm] - 10 * US_PER_MINUTE)
    icu_n = np.ceil((c.outtime - c.intime) / US_PER_DAY * 3).astype(np.int64)
    stay, _ = expand(icu_n)
    t_icu = uniform_between(rng, c.intime[stay], c.outtime[stay])
    adm = np.concatenate([adm, c.stay_adm[stay]])
    t = floor_to(np.concatenate([t, t_icu]), US_PER_MINUTE)
    in_icu = np.concatenate([np.zeros(len(t) - len(stay), bool), np.ones(len(stay), bool)])
    order = np.lexsort((t, adm))
    return adm[order], t[order], in_icu[order]


def labevents(rng, c: Cohort, providers: np.ndarray, first_lab: int, first_specimen: int) -> tuple[pa.Table, int, int]:
    labs, itemids, f = _lab_params()
    mean, sd, lo_b, hi_b = f("mean"), f("sd"), f("lower_bound"), f("upper_bound")
    ref_lo, ref_hi, decimals = f("ref_range_lower"), f("ref_range_upper"), f("decimals").astype(int)
    panel = np.array([r["panel"] for r in labs])
    dx = ref.diagnoses()
    base_shift = np.zeros((len(dx.names), len(labs)))
    peak_shift = np.zeros_like(base_shift)
    for concept, itemid, b, p in LAB_EFFECTS:
        k = int(np.flatnonzero(itemids == itemid)[0])
        base_shift[dx.index(concept), k] += b
        peak_shift[dx.index(concept), k] += p
    m = len(c.patient)
    concepts = c.concepts.astype(float)
    baseline = concepts @ base_shift + rng.normal(0, 0.6, (m, len(labs)))
    peak = concepts @ peak_shift

    adm, t, in_icu = _draws(rng, c)
    progress = (t - c.admittime[adm]) / np.maximum(c.dischtime[adm] - c.admittime[adm], 1)
    d_parts, k_parts, p_parts = [], [], []
    for i, (name, (ward_p, icu_p)) in enumerate(PANELS.items()):
        drawn = np.flatnonzero(rng.random(len(adm)) < np.where(in_icu, icu_p, ward_p))
        cols = np.flatnonzero(panel == name)
        d_parts.append(np.repeat(drawn, len(cols)))
        k_parts.append(np.tile(cols, len(drawn)))
        p_parts.append(np.full(len(drawn) * len(cols), i))
    d, k, p = (np.concatenate(x) for x in (d_parts, k_parts, p_parts))
    order = np.lexsort((k, p, d))  # draws are already in time order per admission
    d, k, p = d[order], k[order], p[order]
    a = adm[d]
    z = baseline[a, k] + peak[a, k] * np.sin(np.pi * progress[d]) + rng.normal(0, 0.35, len(d))
    value = np.clip(mean[k] + sd[k] * z, lo_b[k], hi_b[k])
    _derive(value, itemids[k], d)
    value = round_to(np.clip(value, lo_b[k], hi_b[k]), decimals[k])
    abnormal = (value < ref_lo[k]) | (value > ref_hi[k])
    new_specimen = np.ones(len(d), bool)
    new_specimen[1:] = (p[1:] != p[:-1]) | (d[1:] != d[:-1])
    specimen_rank = np.cumsum(new_specimen) - 1
    n, n_spec = len(d), int(specimen_rank[-1]) + 1 if len(d) else 0
    uom = [r["valueuom"] for r in labs]
    ordered = rng.random(n_spec) < 0.4
    stat = rng.random(n_spec) < 0.55
    table = pa.table({
        "labevent_id": first_lab + np.arange(n),
        "subject_id": c.subject_id[c.patient[a]],
        "hadm_id": c.hadm_id[a],
        "specimen_id": scrambled_ids(first_specimen + specimen_rank, 0, 100_000_000),
        "itemid": itemids[k],
        "order_provider_id": labels(providers, rng.integers(0, len(providers), n_spec)[specimen_rank],
                                    ordered[specimen_rank]),
        "charttime": timestamps(t[d]),
        "storetime": timestamps(t[d] + (rng.uniform(20, 180, n_spec) * US_PER_MINUTE).astype(np.int64)[specimen_rank]),
        "value": decimal_text(value, decimals[k]),
        "valuenum": value,
        "valueuom": labels(uom, k, np.array([bool(u) for u in uom])[k]),
        "ref_range_lower": ref_lo[k],
        "ref_range_upper": ref_hi[k],
        "flag": labels(["abnormal"], np.zeros(n, np.int64), abnormal),
        "priority": labels(["ROUTINE", "STAT"], stat[specimen_rank].astype(int)),
        "comments": pa.nulls(n, pa.string()),
    })
    return table, n, n_spec


def _derive(value: np.ndarray, itemid: np.ndarray, draw: np.ndarray) -> None:
    """Keep panel members arithmetically consistent: anion gap = Na - Cl - HCO3, Hct ~ 3 x Hgb, INR ~ PT."""
    size = int(draw.max()) + 1 if len(draw) else 0

    def per_draw(item):
        out = np.full(size, np.nan)
        sel = itemid == item
        out[draw[sel]] = value[sel]
        return out

    na, cl, hco3, hgb, pt = (per_draw(i) for i in (50983, 50902, 50882, 51222, 51274))
    for item, derived in ((50868, np.round(na) - np.round(cl) - np.round(hco3)),
                          (51221, hgb * 3.0 + 0.5), (51237, pt / 11.0)):
        sel = np.flatnonzero(itemid == item)
        sel = sel[~np.isnan(derived[draw[sel]])]
        value[sel] = derived[draw[sel]]


def microbiologyevents(rng, c: Cohort, providers: np.ndarray, first_event: int,
                       first_specimen: int) -> tuple[pa.Table, int, int]:
    """Cultures for infections (and some screening): negatives are one row, positives one row per antibiotic."""
    m = len(c.patient)
    infected = c.has("sepsis") | c.has("pneumonia") | c.has("urinary_infection") | c.has("cellulitis")
    p = np.zeros((m, len(ref.SPECIMENS)))
    p[:, 0] = np.where(infected, 0.95, 0.1 + 0.4 * c.icu)
    p[:, 1] = np.where(infected, 0.8, 0.1) + 0.15 * c.has("urinary_infection")
    p[:, 2] = 0.8 * c.has("pneumonia") + 0.2 * c.icu
    p[:, 3] = 0.8 * c.has("cellulitis")
    p[:, 4] = 0.6 * c.icu
    counts = rng.poisson(2 * p)  # repeat cultures: blood cultures come in sets, re-sent when febrile
    adm, spec = np.nonzero(counts)
    adm, spec = np.repeat(adm, counts[adm, spec]), np.repeat(spec, counts[adm, spec])
    n_spec = len(adm)
    t = floor_to(uniform_between(rng, c.admittime[adm], np.minimum(c.dischtime[adm], c.admittime[adm] + 2 * US_PER_DAY)),
                 US_PER_MINUTE)
    positive = rng.random(n_spec) < np.where(infected[adm] & (spec < 4), 0.35, 0.05)
    org = choice(rng, [o[3] for o in ref.ORGANISMS], n_spec)
    gram_pos = np.array([o[2] for o in ref.ORGANISMS])[org]
    panels = {g: ref.ANTIBIOTICS[g] for g in (False, True)}
    n_rows = np.where(positive, np.where(gram_pos, len(panels[True]), len(panels[False])), 1)
    s, ab_rank = expand(n_rows)
    n = len(s)
    has_org = positive[s]
    ab_table = panels[False] + panels[True]
    ab = np.where(gram_pos[s], len(panels[False]) + ab_rank, ab_rank)
    resistant = rng.random(n) < 0.18
    intermediate = ~resistant & (rng.random(n) < 0.06)
    mic_s, mic_r = (np.array([x[i] for x in ab_table], dtype=float)[ab] for i in (2, 3))
    dilution = np.where(resistant, mic_r, np.where(intermediate, mic_r / 2, mic_s))
    comparison = np.where(resistant, 1, np.where(intermediate, 2, 0))
    dilution_text = _concat(labels(["<=", "=>", ""], comparison), decimal_text(dilution, np.where(dilution < 1, 2, 0)))
    stored = t[s] + (rng.uniform(2, 4, n_spec) * US_PER_DAY).astype(np.int64)[s]
    stored = floor_to(stored, US_PER_MINUTE)
    spec_cols = list(zip(*ref.SPECIMENS))
    org_cols = list(zip(*ref.ORGANISMS))
    ab_cols = list(zip(*ab_table))
    ordered = rng.random(n_spec) < 0.3
    table = pa.table({
        "microevent_id": first_event + np.arange(n),
        "subject_id": c.subject_id[c.patient[adm[s]]],
        "hadm_id": c.hadm_id[adm[s]],
        "micro_specimen_id": scrambled_ids(first_specimen + s, 0, 10_000_000),
        "order_provider_id": labels(providers, rng.integers(0, len(providers), n_spec)[s], ordered[s]),
        "chartdate": timestamps(floor_to(t[s], US_PER_DAY)),
        "charttime": timestamps(t[s]),
        "spec_itemid": np.array(spec_cols[0])[spec[s]],
        "spec_type_desc": labels(spec_cols[1], spec[s]),
        "test_seq": np.ones(n, np.int64),
        "storedate": timestamps(floor_to(stored, US_PER_DAY)),
        "storetime": timestamps(stored),
        "test_itemid": np.array(spec_cols[2])[spec[s]],
        "test_name": labels(spec_cols[3], spec[s]),
        "org_itemid": pa.array(np.array(org_cols[0])[org[s]], mask=~has_org),
        "org_name": labels(org_cols[1], org[s], has_org),
        "isolate_num": pa.array(np.ones(n, np.int16), mask=~has_org),
        "quantity": pa.nulls(n, pa.string()),
        "ab_itemid": pa.array(np.array(ab_cols[0])[ab], mask=~has_org),
        "ab_name": labels(ab_cols[1], ab, has_org),
        "dilution_text": pa.array(dilution_text, mask=pa.array(~has_org)) if n else pa.nulls(0, pa.string()),
        "dilution_comparison": labels(["<=        ", "=>        ", "=         "], comparison, has_org),
        "dilution_value": pa.array(dilution, mask=~has_org),
        "interpretation": labels(["S", "R", "I"], comparison, has_org),
        "comments": labels(["No growth."], np.zeros(n, np.int64), ~has_org),
    })
    return table, n, n_spec


def _concat(left: pa.Array, right: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(_plain(left), _plain(right), "")


def _plain(text: pa.Array) -> pa.Array:
    """Dictionary-encoded text decoded, for compute functions that take plain strings only."""
    return text.dictionary_decode() if pa.types.is_dictionary(text.type) else text


def omr(rng, c: Cohort) -> pa.Table:
    """Outpatient visits (a week or more apart, none after death) with blood pressure, weight and BMI."""
    visits = 1 + rng.poisson(4, c.n_patients)
    pat, nth = expand(visits)
    first_adm = np.cumsum(c.n_adm) - c.n_adm
    gap = (rng.uniform(7, 200, len(pat)) * US_PER_DAY).astype(np.int64)
    start = c.admittime[first_adm][pat] - 365 * US_PER_DAY
    first = np.cumsum(visits) - visits  # each patient's first visit
    day = floor_to(start + np.cumsum(gap) - np.repeat(np.cumsum(gap)[first] - gap[first], visits), US_PER_DAY)
    alive = day <= floor_to(c.dod[pat], US_PER_DAY)
    pat, day = pat[alive], day[alive]
    results = ("Blood Pressure", "Weight (Lbs)", "BMI (kg/m2)")
    v, r = np.repeat(np.arange(len(pat)), 3), np.tile(np.arange(3), len(pat))
    p = pat[v]
    weight = c.weight_kg[p] * rng.normal(1, 0.02, len(v))
    sys_bp = np.round(rng.normal(128, 15, len(v))).clip(90, 190)
    dia_bp = np.round(sys_bp * rng.uniform(0.5, 0.7, len(v)))
    bp = _concat(_concat(decimal_text(sys_bp, 0), pa.array(["/"] * len(v))), decimal_text(dia_bp, 0))
    lbs = decimal_text(weight * 2.20462, 1)
    bmi = decimal_text(weight / (c.height_cm[p] / 100) ** 2, 1)
    text = pc.if_else(pa.array(r == 0), bp, pc.if_else(pa.array(r == 1), _plain(lbs), _plain(bmi)))
    return pa.table({
        "subject_id": c.subject_id[p],
        "chartdate": dates(day[v]),
        "seq_num": np.ones(len(v), np.int64),
        "result_name": labels(results, r),
        "result_value": text,
    })

"""The medication chain of a chunk: POE order -> pharmacy -> prescription -> eMAR administrations.

Each medication order gets one poe row, one pharmacy row and one prescription row sharing its
``poe_id``/``pharmacy_id``; eMAR rows are the scheduled doses inside the order's window. Lab draws and
admit/discharge orders add the non-medication POE rows. poe_seq/emar_seq count per patient in time order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.sources.synthetic import reference as ref
from pipeline.sources.synthetic.arrays import (
    US_PER_DAY,
    US_PER_HOUR,
    US_PER_MINUTE,
    expand,
    floor_to,
    joined_ids,
    labels,
    rank_within,
    scrambled_ids,
    timestamps,
    uniform_between,
)
from pipeline.sources.synthetic.cohort import Cohort

OTHER_ORDERS = (  # order_type, order_subtype, poe_detail (field_name, field_value) rows
    ("ADT orders", "Admit", (("Admit category", "Admit to inpatient"), ("Admit to", None))),
    ("ADT orders", "Discharge", (("Discharge When", "Discharge Now"), ("Discharge Planning", "Finalized"))),
    ("General Care", "Code status", (("Code status", "Resuscitate (Full code)"),)),
    ("ADT orders", "Transfer", (("Transfer to", "ICU"),)),
    ("ADT orders", "Transfer", (("Transfer to", "Medicine"),)),
    ("Lab", None, ()),
)
ADMIT_TO = ("Medicine", "Surgery", "ICU")
DNAR = "DNAR (DO NOT attempt resuscitation for cardiac arrest) "
ADMINISTRATION_TYPES = {"Sodium Chloride 0.9%  Flush": "IV Flush", "Insulin": "Insulin SC Sliding Scale"}


def _drug_column(field: str, dtype=object) -> np.ndarray:
    return ref.column("drugs", field, dtype)


@dataclass(frozen=True)
class MedicationOrders:
    """The drawn medication orders, one entry per order: every table of the chain is a view of them."""

    adm: np.ndarray  # admission index into the cohort
    drug: np.ndarray  # row of the drugs reference table
    subject_id: np.ndarray
    hadm_id: np.ndarray
    ordertime: np.ndarray  # us, up to an hour before start
    start: np.ndarray  # us, on the hour
    stop: np.ndarray  # us, no later than discharge
    stopped: np.ndarray  # discontinued by a D/C order
    provider: np.ndarray  # index into providers of the prescriber
    once: np.ndarray  # frequency ONCE: a one-hour window
    doses_per_day: np.ndarray

    @property
    def n(self) -> int:
        return len(self.adm)

    def drug_labels(self, field: str) -> pa.DictionaryArray:
        """A column of the drugs reference table, one value per order."""
        return labels(_drug_column(field), self.drug)


def emit(rng, c: Cohort, providers: np.ndarray, lab_times: tuple[np.ndarray, np.ndarray],
         first_pharmacy: int) -> tuple[dict[str, pa.Table], int]:
    """The six medication tables of a chunk and how many pharmacy ids they used.

    The steps run in this order because each draws from ``rng`` in turn: reordering them changes every
    later value of the chunk.
    """
    orders = _draw_orders(rng, c, len(providers))
    poe, poe_detail, med_poe_id, med_seq = _poe(rng, c, orders, providers, lab_times)
    pharmacy_id = scrambled_ids(first_pharmacy + np.arange(orders.n), 0, 100_000_000)
    pharmacy = _pharmacy(rng, c, orders, pharmacy_id, med_poe_id)
    prescriptions = _prescriptions(orders, providers, pharmacy_id, med_poe_id, med_seq)
    emar, emar_detail = _emar(rng, c, orders, providers, pharmacy_id, med_poe_id)
    tables = {"poe": poe, "poe_detail": poe_detail, "pharmacy": pharmacy, "prescriptions": prescriptions,
              "emar": emar, "emar_detail": emar_detail}
    return tables, orders.n


def _draw_orders(rng, c: Cohort, n_providers: int) -> MedicationOrders:
    """Which drugs each admission gets (its diagnoses raise a drug's odds), renewed about every other day
    of the stay, each in an order window on the hour inside the admission as in MIMIC."""
    dx = ref.diagnoses()
    base = _drug_column("base_probability", float)
    boost = np.zeros((len(dx.names), len(base)))
    for j, ind in enumerate(_drug_column("indications")):
        for concept in filter(None, ind.split(";")):
            boost[dx.index(concept), j] = 0.8
    p = np.clip(base + c.concepts.astype(float) @ boost, 0, 0.95)
    adm, drug = np.nonzero(rng.random(p.shape) < p)
    renewals = 1 + rng.poisson(c.los_days[adm] / 2)
    renewed, _ = expand(renewals)
    adm, drug = adm[renewed], drug[renewed]
    n = len(adm)

    once = _drug_column("frequency")[drug] == "ONCE"
    start = np.minimum(floor_to(uniform_between(rng, c.admittime[adm], c.dischtime[adm] - US_PER_HOUR), US_PER_HOUR)
                       + US_PER_HOUR, c.dischtime[adm])
    length = np.where(once, US_PER_HOUR, (rng.uniform(0.5, 4, n) * US_PER_DAY).astype(np.int64))
    stop = np.minimum(start + length, c.dischtime[adm])
    ordertime = np.maximum(start - (rng.uniform(1, 60, n) * US_PER_MINUTE).astype(np.int64), c.admittime[adm])
    stopped = rng.random(n) < 0.25
    provider = rng.integers(0, n_providers, n)
    return MedicationOrders(
        adm=adm, drug=drug, subject_id=c.subject_id[c.patient[adm]], hadm_id=c.hadm_id[adm],
        ordertime=ordertime, start=start, stop=stop, stopped=stopped, provider=provider, once=once,
        doses_per_day=_drug_column("doses_per_24_hrs", float)[drug])


def _poe(rng, c: Cohort, orders: MedicationOrders, providers: np.ndarray,
         lab_times: tuple[np.ndarray, np.ndarray]) -> tuple[pa.Table, pa.Table, pa.Array, np.ndarray]:
    """poe and poe_detail: the medication orders, their D/C orders and the other orders, numbered per
    patient in time order; also the poe_id and poe_seq of each medication order, which the pharmacy,
    prescription and eMAR rows refer to."""
    n = orders.n
    stopped_idx = np.flatnonzero(orders.stopped)
    other_adm, other_kind, other_t = _other_orders(c, lab_times)
    poe_adm = np.concatenate([orders.adm, orders.adm[stopped_idx], other_adm])
    poe_t = np.concatenate([orders.ordertime, orders.stop[stopped_idx], other_t])
    poe_t = floor_to(poe_t, 1_000_000)
    source = np.concatenate([np.zeros(n, int), np.ones(len(stopped_idx), int), 2 + other_kind])
    by_time = np.lexsort((source, poe_t, c.patient[poe_adm]))
    poe_seq = np.empty(len(by_time), np.int64)
    poe_seq[by_time] = rank_within(c.patient[poe_adm][by_time]) + 1
    subject = c.subject_id[c.patient[poe_adm]]
    poe_id = joined_ids(subject, poe_seq)
    med_seq, dc_seq = poe_seq[:n], poe_seq[n:n + len(stopped_idx)]
    med_poe_id = joined_ids(orders.subject_id, med_seq)

    dc_of = np.full(len(by_time), -1, np.int64)
    dc_of[n:n + len(stopped_idx)] = med_seq[stopped_idx]
    dc_by = np.full(len(by_time), -1, np.int64)
    dc_by[stopped_idx] = dc_seq
    order_types = ["Medications"] + [o[0] for o in OTHER_ORDERS]
    subtypes = [o[1] or "" for o in OTHER_ORDERS]
    has_subtype = [o[1] is not None for o in OTHER_ORDERS]
    type_idx = np.where(source < 2, 0, source - 1)
    poe = pa.table({
        "poe_id": poe_id.take(pa.array(by_time)),
        "poe_seq": poe_seq[by_time],
        "subject_id": subject[by_time],
        "hadm_id": c.hadm_id[poe_adm][by_time],
        "ordertime": timestamps(poe_t[by_time]),
        "order_type": labels(order_types, type_idx[by_time]),
        "order_subtype": labels([""] + subtypes, type_idx[by_time],
                                np.array([False] + has_subtype)[type_idx[by_time]]),
        "transaction_type": labels(["New", "D/C"], (source[by_time] == 1).astype(int)),
        "discontinue_of_poe_id": _ref_ids(subject[by_time], dc_of[by_time]),
        "discontinued_by_poe_id": _ref_ids(subject[by_time], dc_by[by_time]),
        "order_provider_id": labels(providers, rng.integers(0, len(providers), len(by_time))),
        "order_status": labels(["Inactive"], np.zeros(len(by_time), np.int64)),
    })
    poe_detail = _poe_detail(c, poe_id, poe_seq, subject, poe_adm, source - 2)
    return poe, poe_detail, med_poe_id, med_seq


def _other_orders(c: Cohort, lab_times: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Admission, OTHER_ORDERS index and time of the non-medication POE rows: admit, discharge, code status,
    transfers into and (unless the patient died) out of the ICU, lab orders."""
    lab_adm, lab_t = lab_times
    every = np.arange(len(c.patient))
    left = np.flatnonzero(~c.died[c.stay_adm])
    others = (
        (every, c.admittime + US_PER_MINUTE), (every, c.dischtime - 2 * US_PER_HOUR // 3),
        (every, c.admittime + 30 * US_PER_MINUTE),
        (c.stay_adm, np.maximum(c.intime - 30 * US_PER_MINUTE, c.admittime[c.stay_adm])),
        (c.stay_adm[left], np.maximum(c.outtime[left] - US_PER_HOUR, c.intime[left])),
        (lab_adm, np.maximum(lab_t - 20 * US_PER_MINUTE, c.admittime[lab_adm])),
    )
    adm = np.concatenate([a for a, _ in others])
    kind = np.concatenate([np.full(len(a), k) for k, (a, _) in enumerate(others)])
    time = np.concatenate([t for _, t in others])
    return adm, kind, time


def _pharmacy(rng, c: Cohort, orders: MedicationOrders, pharmacy_id: np.ndarray, med_poe_id: pa.Array) -> pa.Table:
    """One pharmacy row per order, entered at the order time and verified by a pharmacist minutes later."""
    n = orders.n
    drug = orders.drug_labels
    entertime = floor_to(orders.ordertime, 1_000_000)
    status = np.where(orders.stopped, 0, np.where(orders.stop == c.dischtime[orders.adm], 1, 2))
    return pa.table({
        "subject_id": orders.subject_id, "hadm_id": orders.hadm_id, "pharmacy_id": pharmacy_id,
        "poe_id": med_poe_id, "starttime": timestamps(orders.start), "stoptime": timestamps(orders.stop),
        "medication": drug("drug"), "proc_type": drug("proc_type"),
        "status": labels(["Discontinued", "Discontinued via patient discharge", "Expired"], status),
        "entertime": timestamps(entertime),
        "verifiedtime": timestamps(entertime + (rng.uniform(1, 30, n) * US_PER_MINUTE).astype(np.int64)),
        "route": drug("route"), "frequency": drug("frequency"), "disp_sched": pa.nulls(n, pa.string()),
        "infusion_type": pa.nulls(n, pa.string()), "sliding_scale": pa.nulls(n, pa.string()),
        "lockout_interval": pa.nulls(n, pa.string()), "basal_rate": pa.nulls(n, pa.float64()),
        "one_hr_max": pa.nulls(n, pa.string()), "doses_per_24_hrs": orders.doses_per_day,
        "duration": pa.nulls(n, pa.float64()),
        "duration_interval": labels(["Ongoing", "Doses"], orders.once.astype(int)),
        "expiration_value": np.full(n, 36), "expiration_unit": labels(["Hours"], np.zeros(n, np.int64)),
        "expirationdate": pa.nulls(n, pa.timestamp("us")),
        "dispensation": labels(["Omnicell"], np.zeros(n, np.int64)), "fill_quantity": pa.nulls(n, pa.string()),
    })


def _prescriptions(orders: MedicationOrders, providers: np.ndarray, pharmacy_id: np.ndarray,
                   med_poe_id: pa.Array, med_seq: np.ndarray) -> pa.Table:
    """One prescription row per order, carrying the prescriber and the dose the eMAR rows give."""
    n = orders.n
    drug = orders.drug_labels
    return pa.table({
        "subject_id": orders.subject_id, "hadm_id": orders.hadm_id, "pharmacy_id": pharmacy_id,
        "poe_id": med_poe_id, "poe_seq": med_seq,
        "order_provider_id": labels(providers, orders.provider),
        "starttime": timestamps(orders.start), "stoptime": timestamps(orders.stop),
        "drug_type": labels(["MAIN"], np.zeros(n, np.int64)), "drug": drug("drug"),
        "formulary_drug_cd": drug("formulary_drug_cd"), "gsn": drug("gsn"), "ndc": drug("ndc"),
        "prod_strength": drug("prod_strength"), "form_rx": pa.nulls(n, pa.string()),
        "dose_val_rx": drug("dose_val_rx"), "dose_unit_rx": drug("dose_unit_rx"),
        "form_val_disp": drug("form_val_disp"), "form_unit_disp": drug("form_unit_disp"),
        "doses_per_24_hrs": orders.doses_per_day, "route": drug("route"),
    })


def _emar(rng, c: Cohort, orders: MedicationOrders, providers: np.ndarray, pharmacy_id: np.ndarray,
          med_poe_id: pa.Array) -> tuple[pa.Table, pa.Table]:
    """emar and emar_detail: one administration per scheduled dose inside the order window (PRN orders give
    fewer), charted around its due time; emar_seq counts per patient in chart order."""
    adm, drug = orders.adm, orders.drug
    prn = np.char.find(_drug_column("frequency")[drug].astype(str), "PRN") >= 0
    interval = (US_PER_DAY / orders.doses_per_day).astype(np.int64)
    doses = np.maximum(1, (orders.stop - orders.start) // interval)
    doses = np.where(prn, rng.binomial(doses, 0.4), doses)
    of_order, nth = expand(doses)
    scheduled = orders.start[of_order] + nth * interval[of_order]
    chart = np.clip(scheduled + (rng.uniform(-15, 40, len(of_order)) * US_PER_MINUTE).astype(np.int64),
                    c.admittime[adm[of_order]], c.dischtime[adm[of_order]])
    chart = floor_to(chart, US_PER_MINUTE)
    by_time = np.lexsort((chart, c.patient[adm[of_order]]))
    of_order, scheduled, chart = of_order[by_time], scheduled[by_time], chart[by_time]
    emar_seq = rank_within(c.patient[adm[of_order]]) + 1
    emar_subject = orders.subject_id[of_order]
    emar_id = joined_ids(emar_subject, emar_seq)
    given = rng.random(len(of_order)) < 0.92
    n = len(of_order)
    emar = pa.table({
        "subject_id": emar_subject, "hadm_id": orders.hadm_id[of_order], "emar_id": emar_id, "emar_seq": emar_seq,
        "poe_id": med_poe_id.take(pa.array(of_order)), "pharmacy_id": pharmacy_id[of_order],
        "enter_provider_id": labels(providers, rng.integers(0, len(providers), n), rng.random(n) < 0.3),
        "charttime": timestamps(chart), "medication": labels(_drug_column("drug"), drug[of_order]),
        "event_txt": labels(["Not Given", "Administered"], given.astype(int)),
        "scheduletime": timestamps(floor_to(scheduled, US_PER_MINUTE)),
        "storetime": timestamps(chart + (rng.uniform(0, 5, n) * US_PER_MINUTE).astype(np.int64)),
    })
    emar_detail = _emar_detail(drug[of_order], emar_subject, emar_id, emar_seq, pharmacy_id[of_order], given)
    return emar, emar_detail


def _ref_ids(subject: np.ndarray, seq: np.ndarray) -> pa.Array:
    """``<subject>-<seq>`` where ``seq`` >= 0, else NULL."""
    return pc.if_else(pa.array(seq >= 0), joined_ids(subject, seq), pa.scalar(None, pa.string()))


def _poe_detail(c: Cohort, poe_id: pa.Array, poe_seq, subject, poe_adm, kind: np.ndarray) -> pa.Table:
    """The field rows of admit, discharge and code-status orders (``kind`` indexes OTHER_ORDERS)."""
    fields = [(k, name, value) for k, o in enumerate(OTHER_ORDERS) for name, value in o[2]]
    row, f = np.nonzero(kind[:, None] == np.array([x[0] for x in fields])[None, :])
    adm = poe_adm[row]
    name = np.array([x[1] for x in fields])[f]
    values = [x[2] or "" for x in fields] + list(ADMIT_TO) + [DNAR]
    value = np.where(name == "Admit to", len(fields) + np.where(c.icu[adm], 2, c.principal[adm] % 2), f)
    value = np.where((name == "Code status") & c.has("do_not_resuscitate")[adm], len(values) - 1, value)
    return pa.table({
        "poe_id": poe_id.take(pa.array(row)),
        "poe_seq": poe_seq[row],
        "subject_id": subject[row],
        "field_name": labels([x[1] for x in fields], f),
        "field_value": labels(values, value),
    })


def _emar_detail(drug: np.ndarray, subject, emar_id: pa.Array, emar_seq, pharmacy_id, given) -> pa.Table:
    """Per administration a parent row (parent_field_ordinal NULL: what was due) and a 1.1 product row."""
    ne = len(drug)
    row = np.repeat(np.arange(ne), 2)
    product = np.tile([False, True], ne)
    d = drug[row]

    def col(field: str, where: np.ndarray) -> pa.Array:
        return labels(_drug_column(field), d, where)

    names = _drug_column("drug")
    admin_types = ["Standard Maintenance Medication", *dict.fromkeys(ADMINISTRATION_TYPES.values())]
    admin = np.array([admin_types.index(ADMINISTRATION_TYPES.get(n, admin_types[0])) for n in names])[d]
    g = given[row]
    none = pa.nulls(len(row), pa.string())
    dose_given = np.where(g, _drug_column("dose_val_rx")[d], "0")
    amount_given = np.where(g, _drug_column("form_val_disp")[d], "0")
    descriptions = [f"{a} {b}" for a, b in zip(names, _drug_column("prod_strength"))]
    return pa.table({
        "subject_id": subject[row], "emar_id": emar_id.take(pa.array(row)), "emar_seq": emar_seq[row],
        "parent_field_ordinal": pa.array(np.full(len(row), 1.1), mask=~product),
        "administration_type": labels(admin_types, admin, ~product),
        "pharmacy_id": pa.array(pharmacy_id[row], mask=~product),
        "barcode_type": labels(["if"], np.zeros(len(row), np.int64), product), "reason_for_no_barcode": none,
        "complete_dose_not_given": labels(["No", "Yes"], (~g).astype(int), ~product),
        "dose_due": col("dose_val_rx", ~product), "dose_due_unit": col("dose_unit_rx", ~product),
        "dose_given": pa.array(dose_given, mask=~product), "dose_given_unit": col("dose_unit_rx", product),
        "will_remainder_of_dose_be_given": none,
        "product_amount_given": pa.array(amount_given, mask=~product),
        "product_unit": col("form_unit_disp", product), "product_code": col("formulary_drug_cd", product),
        "product_description": labels(descriptions, d, product), "product_description_other": none,
        "prior_infusion_rate": none, "infusion_rate": none, "infusion_rate_adjustment": none,
        "infusion_rate_adjustment_amount": none, "infusion_rate_unit": none, "route": col("route", ~product),
        "infusion_complete": none, "completion_interval": none, "new_iv_bag_hung": none,
        "continued_infusion_in_other_location": none, "restart_interval": none, "side": none, "site": none,
        "non_formulary_visual_verification": none,
    })

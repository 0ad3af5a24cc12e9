"""MIMIC-IV's own imperfections, laid over a clean synthetic chunk at the real demo's rates.

The clean generator places every event inside its stay, links every lab to its admission and
keeps every order's times in order; real MIMIC-IV does none of this fully. Without these quirks
any anomaly in a synthetic database is the injected noise, so detecting it is easier than on real
records. ``quirks="demo"`` (:data:`pipeline.sources.QUIRK_KINDS`) reproduces the demo v2.2's profile (rates below, measured on it with
``bench/quirk_profile.py``, which prints both sources side by side); ``"none"`` keeps the tables
clean. The quirks draw from their own generator, so the clean values do not change with them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.sources.synthetic import reference as ref
from pipeline.sources.synthetic.arrays import (
    US_PER_DAY,
    US_PER_HOUR,
    US_PER_MINUTE,
    decimal_text,
    floor_to,
    round_to,
    scrambled_ids,
    timestamps,
)
from pipeline.sources.synthetic.cohort import Cohort

# Fractions of rows in the MIMIC-IV demo v2.2.
LAB_OUTPATIENT = 0.186  # lab rows drawn outside any admission (outpatient), hadm_id NULL
LAB_UNLINKED_IN_STAY = 0.077  # lab rows inside an admission of the patient, yet hadm_id NULL
LAB_OUTSIDE = 0.0035  # linked lab rows charted outside their admission (after discharge)
LAB_TEXT_ONLY = 0.027  # results given as text only ("___", "HOLD..."): valuenum NULL
LAB_DUPLICATE = 0.003  # specimens charted twice: with the clean draws that already coincide (about 0.3% of
# rows), about 0.9% of rows share their (subject, item, charttime), as in the demo
DUPLICATE_CONFLICT = 0.6  # of those, the share whose second value differs
RX_INVERTED = 0.042  # prescriptions whose stoptime precedes starttime (mostly by one hour)
RX_OUTSIDE = 0.015  # prescriptions starting outside their admission
EMAR_OUTSIDE = 0.0037  # administrations charted outside their admission
EMAR_ABSENT_ORDER = 0.030  # administrations whose poe_id is absent from poe

ED_HOURS = 10 * US_PER_HOUR  # the synthetic ED registration precedes admission by at most this
TEXT_RESULTS = ("___", "HOLD.  DISCARD GREATER THAN 4 HOURS OLD.", "UNABLE TO REPORT", "ERROR", "NOT DONE")


def _plain(table: pa.Table) -> pa.Table:
    """Dictionary columns decoded, so rows can be edited and appended with plain compute functions."""
    return pa.table({n: c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c
                     for n, c in zip(table.column_names, table.columns)})


def _admission(c: Cohort, hadm_id: pa.ChunkedArray) -> np.ndarray:
    return pc.index_in(hadm_id, pa.array(c.hadm_id)).to_numpy(zero_copy_only=False)


def _us(column: pa.ChunkedArray) -> np.ndarray:
    return column.cast(pa.int64()).to_numpy(zero_copy_only=False)


def _set(table: pa.Table, name: str, values) -> pa.Table:
    values = pa.array(values) if isinstance(values, np.ndarray) else values
    return table.set_column(table.column_names.index(name), name, values)


def labevents(rng: np.random.Generator, labs: pa.Table, c: Cohort, next_lab: int,
              next_specimen: int) -> tuple[pa.Table, int]:
    """Labs with outpatient and unlinked draws, draws after discharge, text-only results and
    specimens charted twice (appended with ids from ``next_lab``/``next_specimen``); also returns
    how many specimens were added."""
    labs = _plain(labs)
    n = labs.num_rows
    specimen, row_specimen = np.unique(labs["specimen_id"].to_numpy(), return_inverse=True)
    u = rng.random(len(specimen))
    outpatient = u < LAB_OUTPATIENT
    unlinked = ~outpatient & (u < LAB_OUTPATIENT + LAB_UNLINKED_IN_STAY)
    late = (u >= LAB_OUTPATIENT + LAB_UNLINKED_IN_STAY) & (
        u < LAB_OUTPATIENT + LAB_UNLINKED_IN_STAY + LAB_OUTSIDE * (1 - LAB_OUTPATIENT - LAB_UNLINKED_IN_STAY))
    adm = _admission(c, labs["hadm_id"])
    t = _us(labs["charttime"])
    # an outpatient draw: the same panel 1 day to a year before this admission, at its time of day
    back = (t - floor_to(c.admittime[adm], US_PER_DAY)) // US_PER_DAY * US_PER_DAY + (
        rng.integers(1, 366, len(specimen)) * US_PER_DAY)[row_specimen]
    after = c.dischtime[adm] - t + (rng.uniform(5, 12 * 60, len(specimen)) * US_PER_MINUTE).astype(np.int64)[row_specimen]
    shift = np.where(outpatient[row_specimen], -back, np.where(late[row_specimen], after, 0))
    shift = floor_to(shift, US_PER_MINUTE)
    labs = _set(labs, "charttime", timestamps(t + shift))
    labs = _set(labs, "storetime", timestamps(_us(labs["storetime"]) + shift))
    labs = _set(labs, "hadm_id", pa.array(c.hadm_id[adm], mask=(outpatient | unlinked)[row_specimen]))

    text = rng.random(n) < LAB_TEXT_ONLY
    labs = _set(labs, "valuenum", pa.array(labs["valuenum"].to_numpy(zero_copy_only=False), mask=text))
    labs = _set(labs, "value", pc.if_else(pa.array(text), pa.array(np.array(TEXT_RESULTS)[rng.integers(0, len(TEXT_RESULTS), n)]),
                                          labs["value"]))
    labs = _set(labs, "flag", pc.if_else(pa.array(text), pa.scalar(None, pa.string()), labs["flag"]))

    twice = (rng.random(len(specimen)) < LAB_DUPLICATE)[row_specimen] & ~text
    rows = np.flatnonzero(twice)
    twin = labs.take(pa.array(rows))
    _, twin_specimen = np.unique(row_specimen[rows], return_inverse=True)
    n_new = int(twin_specimen.max()) + 1 if len(rows) else 0
    value = twin["valuenum"].to_numpy(zero_copy_only=False)
    decimals = dict(zip(ref.column("labs", "itemid", int), ref.column("labs", "decimals", int)))
    places = np.array([decimals.get(int(i), 1) for i in twin["itemid"].to_numpy()], dtype=np.int64)
    conflict = (rng.random(n_new) < DUPLICATE_CONFLICT)[twin_specimen]
    step = np.maximum(np.abs(value) * rng.uniform(0.02, 0.1, len(rows)), 10.0 ** -places)  # at least one last digit
    value = np.where(conflict, round_to(value + np.where(rng.random(len(rows)) < 0.5, -step, step), places), value)
    low, high = (twin[k].to_numpy(zero_copy_only=False) for k in ("ref_range_lower", "ref_range_upper"))
    twin = _set(twin, "labevent_id", pa.array(next_lab + np.arange(len(rows)), pa.int64()))
    twin = _set(twin, "specimen_id", scrambled_ids(next_specimen + twin_specimen, 0, 100_000_000))
    twin = _set(twin, "valuenum", value)
    twin = _set(twin, "value", decimal_text(value, places).cast(pa.string()))
    twin = _set(twin, "flag", pa.array(np.full(len(rows), "abnormal"), mask=~((value < low) | (value > high))))
    return pa.concat_tables([labs, twin.cast(labs.schema)]), n_new


def medications(rng: np.random.Generator, tables: dict[str, pa.Table], c: Cohort) -> dict[str, pa.Table]:
    """Prescriptions stopping before they start or starting outside their admission; eMAR rows
    charted outside their admission or pointing at an order absent from poe."""
    rx = _plain(tables["prescriptions"])
    adm = _admission(c, rx["hadm_id"])
    start, stop = _us(rx["starttime"]), _us(rx["stoptime"])
    u = rng.random(rx.num_rows)
    inverted = u < RX_INVERTED
    outside = ~inverted & (u < RX_INVERTED + RX_OUTSIDE)
    hours = np.where(rng.random(rx.num_rows) < 0.6, 1, rng.integers(2, 25, rx.num_rows)) * US_PER_HOUR
    before = rng.random(rx.num_rows) < 0.5
    moved = np.where(before, floor_to(c.admittime[adm], US_PER_HOUR) - ED_HOURS - hours,
                     floor_to(c.dischtime[adm], US_PER_HOUR) + hours)
    new_start = np.where(outside, moved, start)
    new_stop = np.where(inverted, start - hours, np.where(outside, moved + (stop - start), stop))
    rx = _set(_set(rx, "starttime", timestamps(new_start)), "stoptime", timestamps(new_stop))

    emar = _plain(tables["emar"])
    adm = _admission(c, emar["hadm_id"])
    late = rng.random(emar.num_rows) < EMAR_OUTSIDE
    shift = np.where(late, c.dischtime[adm] - _us(emar["charttime"])
                     + floor_to((rng.uniform(5, 180, emar.num_rows) * US_PER_MINUTE).astype(np.int64), US_PER_MINUTE), 0)
    emar = _set(emar, "charttime", timestamps(_us(emar["charttime"]) + shift))
    emar = _set(emar, "storetime", timestamps(_us(emar["storetime"]) + shift))
    # an order missing from poe: its administrations name a poe_seq beyond any in this chunk
    orders, order = np.unique(emar["pharmacy_id"].to_numpy(), return_inverse=True)
    absent = (rng.random(len(orders)) < EMAR_ABSENT_ORDER)[order]
    beyond = int(pc.max(tables["poe"]["poe_seq"]).as_py() or 0) + 1 + order
    missing_id = pc.binary_join_element_wise(emar["subject_id"].cast(pa.string()), pa.array(beyond).cast(pa.string()), "-")
    emar = _set(emar, "poe_id", pc.if_else(pa.array(absent), missing_id, emar["poe_id"]))
    return {**tables, "prescriptions": rx, "emar": emar}

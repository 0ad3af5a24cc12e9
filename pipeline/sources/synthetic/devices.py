"""Lines, catheters, ventilation and bedside tasks of a chunk: procedureevents and datetimeevents.

A device is placed once per stay (a window inside the stay); procedureevents holds the window and
datetimeevents recharts its insertion/dressing/tubing/cap dates every 4 hours while it is in, the
way MIMIC nurses do. Tasks (X-rays, EKGs, cultures...) are one-minute procedureevents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipeline.sources.synthetic.arrays import (
    US_PER_DAY,
    US_PER_HOUR,
    US_PER_MINUTE,
    ceil_to,
    expand,
    floor_to,
    labels,
    timestamps,
    uniform_between,
)
from pipeline.sources.synthetic.cohort import Cohort
from pipeline.sources.synthetic.icu import base_columns

FOLEY = 229351
VENTILATION = 225792
EXTUBATION = 227194
# procedure itemid: (chance per stay, location, locationcategory, ordercategoryname,
#                    datetime items as (itemid, hours between changes or 0 for the insertion date, with time))
LINES = {
    224275: (0.85, "Left Antecubital", "Peripheral", "Peripheral Lines", ((225754, 0, False),)),
    224277: (0.4, "Right Antecubital", "Peripheral", "Peripheral Lines", ((225755, 0, False),)),
    225752: (0.4, "Left Radial", "Invasive Arterial", "Invasive Lines",
             ((224288, 0, False), (224287, 48, True), (224290, 96, False))),
    224263: (0.45, "Right IJ", "Invasive Venous", "Invasive Lines",
             ((224280, 0, False), (224279, 48, True), (224282, 96, False), (224261, 72, False))),
    224264: (0.15, "Left Brachial.", "Invasive Venous", "Invasive Lines",
             ((224184, 0, False), (224186, 48, True), (224187, 96, False), (224183, 72, False))),
    FOLEY: (0.7, "Urethral", "Catheter, GU", "Tubes", ((229352, 0, False),)),
}
# task itemid: (ordercategoryname, per ICU day, extra per day when ventilated or septic)
TASKS = {
    225459: ("Imaging", 0.35, 0.8),      # Chest X-Ray
    225402: ("Procedures", 0.3, 0.1),    # EKG
    221214: ("Imaging", 0.1, 0.05),      # CT scan
    225401: ("Procedures", 0.05, 0.5),   # Blood Cultured
    225454: ("Procedures", 0.05, 0.3),   # Urine Culture
}


@dataclass
class Devices:
    """Device windows of a chunk, one row each: stay index, procedure itemid, start, end (inside the stay)."""

    stay: np.ndarray
    itemid: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def of(self, itemid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sel = self.itemid == itemid
        return self.stay[sel], self.start[sel], self.end[sel]


def place(rng, c: Cohort) -> Devices:
    """Lines and catheters by chance; invasive ventilation mostly for respiratory failure and shock."""
    n = len(c.stay_id)
    chance = np.tile([v[0] for v in LINES.values()], (n, 1))
    sick = (c.has("respiratory_failure") | c.has("septic_shock"))[c.stay_adm]
    chance = np.column_stack([chance, np.where(sick, 0.85, 0.25)])
    stay, kind = np.nonzero(rng.random(chance.shape) < chance)
    itemid = np.array(list(LINES) + [VENTILATION])[kind]
    dur = c.outtime[stay] - c.intime[stay]
    start = ceil_to(c.intime[stay] + (dur * rng.uniform(0, 0.15, len(stay))).astype(np.int64), US_PER_MINUTE)
    end = np.maximum(floor_to(c.outtime[stay] - (dur * rng.uniform(0, 0.15, len(stay))).astype(np.int64),
                              US_PER_MINUTE), start)
    return Devices(stay, itemid, start, end)


def _tasks(rng, c: Cohort, devices: Devices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bedside tasks (stay, itemid, time), Poisson per ICU day, plus an extubation ending each ventilation."""
    n = len(c.stay_id)
    days = (c.outtime - c.intime) / US_PER_DAY
    acute = np.isin(np.arange(n), devices.of(VENTILATION)[0]) | c.has("sepsis")[c.stay_adm]
    rate = np.array([[base + extra * a for base, extra in ((v[1], v[2]) for v in TASKS.values())] for a in (0, 1)])
    counts = rng.poisson(rate[acute.astype(int)] * days[:, None])
    stay, kind = np.nonzero(counts)
    stay, kind = np.repeat(stay, counts[stay, kind]), np.repeat(kind, counts[stay, kind])
    t = floor_to(uniform_between(rng, c.intime[stay], c.outtime[stay] - US_PER_MINUTE), US_PER_MINUTE)
    v_stay, _, v_end = devices.of(VENTILATION)
    extubated = v_end < floor_to(c.outtime[v_stay], US_PER_MINUTE)
    return (np.concatenate([stay, v_stay[extubated]]),
            np.concatenate([np.array(list(TASKS))[kind], np.full(extubated.sum(), EXTUBATION)]),
            np.concatenate([np.maximum(t, ceil_to(c.intime[stay], US_PER_MINUTE)), v_end[extubated]]))


def procedureevents(rng, c: Cohort, caregivers, devices: Devices, first_order: int) -> tuple[pa.Table, int]:
    """Device windows (ContinuousProcess, value in minutes) and one-minute tasks, per stay in time order."""
    t_stay, t_item, t_time = _tasks(rng, c, devices)
    stay = np.concatenate([devices.stay, t_stay])
    itemid = np.concatenate([devices.itemid, t_item])
    start = np.concatenate([devices.start, t_time])
    end = np.concatenate([devices.end, t_time + US_PER_MINUTE])
    order = np.lexsort((itemid, start, stay))
    stay, itemid, start, end = stay[order], itemid[order], start[order], end[order]
    n = len(stay)
    is_task = np.isin(itemid, list(TASKS) + [EXTUBATION])
    line_ids = np.array(sorted(LINES))
    line = np.searchsorted(line_ids, itemid).clip(0, len(line_ids) - 1)
    is_line = line_ids[line] == itemid
    category_of = {VENTILATION: "Ventilation", EXTUBATION: "Intubation/Extubation",
                   **{k: v[3] for k, v in LINES.items()}, **{k: v[0] for k, v in TASKS.items()}}
    categories = list(dict.fromkeys(category_of.values()))
    category = _lookup(itemid, {k: categories.index(v) for k, v in category_of.items()})
    value = np.where(is_task, 1.0, ((end - start) // US_PER_MINUTE).astype(float))
    orderid = first_order + np.arange(n)
    cols = base_columns(c, stay, caregivers, rng, start, itemid)
    sorted_lines = [LINES[i] for i in line_ids]
    table = pa.table({
        "subject_id": cols["subject_id"], "hadm_id": cols["hadm_id"], "stay_id": cols["stay_id"],
        "caregiver_id": cols["caregiver_id"], "starttime": timestamps(start), "endtime": timestamps(end),
        "storetime": timestamps(floor_to(end + (rng.uniform(0, 60, n) * US_PER_MINUTE).astype(np.int64),
                                         US_PER_MINUTE)),
        "itemid": itemid, "value": value,
        "valueuom": labels(["min", "None"], is_task.astype(int)),
        "location": labels([v[1] for v in sorted_lines], line, is_line),
        "locationcategory": labels([v[2] for v in sorted_lines], line, is_line),
        "orderid": orderid, "linkorderid": orderid,
        "ordercategoryname": labels(categories, category),
        "ordercategorydescription": labels(["ContinuousProcess", "Task"], is_task.astype(int)),
        "patientweight": c.weight_kg[c.patient[c.stay_adm[stay]]],
        "isopenbag": np.zeros(n, np.int16), "continueinnextdept": np.zeros(n, np.int16),
        "statusdescription": labels(["FinishedRunning"], np.zeros(n, np.int64)),
        "ORIGINALAMOUNT": value, "ORIGINALRATE": np.zeros(n),
    })
    return table, n


def _lookup(keys: np.ndarray, mapping: dict[int, int]) -> np.ndarray:
    """``mapping[k]`` for each of ``keys`` (all present), vectorised."""
    known = np.array(sorted(mapping))
    return np.array([mapping[k] for k in known])[np.searchsorted(known, keys)]


def datetimeevents(rng, c: Cohort, caregivers, devices: Devices) -> pa.Table:
    """Each line's insertion date and last dressing/tubing/cap change, recharted every 4 hours while it is in."""
    items = [(line, *item) for line, v in LINES.items() for item in v[4]]
    d, k = np.nonzero(devices.itemid[:, None] == np.array([x[0] for x in items])[None, :])
    start, end = devices.start[d], devices.end[d]
    i, rank = expand((end - start) // (4 * US_PER_HOUR) + 1)
    t = start[i] + rank * 4 * US_PER_HOUR
    every = np.array([x[2] for x in items])[k[i]] * US_PER_HOUR
    with_time = np.array([x[3] for x in items])[k[i]]
    last = start[i] + np.where(every > 0, (t - start[i]) // np.maximum(every, 1) * every, 0)
    value = np.where(with_time, floor_to(last, US_PER_MINUTE), floor_to(last, US_PER_DAY))
    cols = base_columns(c, devices.stay[d[i]], caregivers, rng, t, np.array([x[1] for x in items])[k[i]])
    cols.update(value=timestamps(value), valueuom=labels(["Date", "Date and Time"], with_time.astype(int)),
                warning=np.zeros(len(i), np.int16))
    return pa.table(cols)

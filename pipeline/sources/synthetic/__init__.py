"""The built-in synthetic MIMIC-IV source: all 31 v2.2 tables, referentially consistent, with the
real demo's background data-quality quirks (:mod:`quirks`) unless ``quirks="none"``.

Patients are generated in chunks (each with its own generator spawned from the seed), so memory is
bounded and the output depends only on ``seed``, ``patients``, ``chunk_size`` and ``quirks``.
Identifier counters run across chunks so keys stay unique; dictionaries, providers and caregivers
are written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.sources.synthetic import cohort, devices, hospital, icu, medications, quirks
from pipeline.sources.synthetic import reference as ref
from pipeline.staging import TableSink

PROVIDERS = 5_000
CAREGIVERS = 3_000
_ALPHANUMERIC = np.array(list("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"))


def provider_ids(rng: np.random.Generator) -> np.ndarray:
    """Distinct MIMIC-style provider ids: 'P' and five characters, e.g. 'P0ABCD'... sorted."""
    codes = np.unique(rng.integers(0, 36 ** 5, PROVIDERS * 2))[:PROVIDERS]
    rng.shuffle(codes)
    digits = np.stack([(codes // 36 ** p) % 36 for p in range(4, -1, -1)], axis=1)
    return np.array(["P" + "".join(row) for row in _ALPHANUMERIC[digits]])


@dataclass
class _Counters:
    """Running id offsets, so identifiers stay unique across chunks."""

    patient: int = 0
    admission: int = 0
    stay: int = 0
    transfer: int = 0
    lab: int = 1
    lab_specimen: int = 0
    micro: int = 1
    micro_specimen: int = 0
    pharmacy: int = 0
    icu_order: int = 0


@dataclass
class SyntheticSource:
    patients: int = 1000
    seed: int = 0
    chunk_size: int = 2000
    quirks: str = "demo"
    name: str = "synthetic"

    def emit(self, sink: TableSink) -> None:
        root = np.random.SeedSequence(self.seed)
        dictionary_seed, *chunk_seeds = root.spawn(1 + -(-self.patients // self.chunk_size))
        rng = np.random.default_rng(dictionary_seed)
        providers = provider_ids(rng)
        caregivers = np.sort(rng.choice(np.arange(1_000, 100_000), CAREGIVERS, replace=False))
        for name, table in _dictionaries(providers, caregivers).items():
            sink.write(name, table)
        counters = _Counters()
        for i, chunk_seed in enumerate(chunk_seeds):
            n = min(self.chunk_size, self.patients - i * self.chunk_size)
            # the quirks' own stream: the clean values are the same with or without them
            quirk_rng = np.random.default_rng(chunk_seed.spawn(1)[0]) if self.quirks == "demo" else None
            for name, table in _chunk(np.random.default_rng(chunk_seed), n, counters, providers, caregivers,
                                      quirk_rng):
                sink.write(name, table)


def _dictionaries(providers: np.ndarray, caregivers: np.ndarray) -> dict[str, pa.Table]:
    return {
        "d_labitems": ref.csv_table("labs", ["itemid", "label", "fluid", "category"]),
        "d_items": ref.csv_table("d_items", ["itemid", "label", "abbreviation", "linksto", "category",
                                            "unitname", "param_type", "lownormalvalue", "highnormalvalue"]),
        "d_icd_diagnoses": ref.icd_dictionary("icd_diagnoses"),
        "d_icd_procedures": ref.icd_dictionary("icd_procedures"),
        "d_hcpcs": ref.csv_table("d_hcpcs", ["code", "category", "long_description", "short_description"]),
        "provider": pa.table({"provider_id": pa.array(providers)}),
        "caregiver": pa.table({"caregiver_id": caregivers}),
    }


def _chunk(rng, n: int, k: _Counters, providers, caregivers, quirk_rng: np.random.Generator | None):
    """Yield (table name, Arrow table) for one chunk of ``n`` patients, with quirks when ``quirk_rng``."""
    c = cohort.generate(rng, k.patient, n, k.admission, k.stay)
    k.patient += n
    k.admission += len(c.patient)
    k.stay += len(c.stay_id)
    yield "patients", cohort.patients(c)
    yield "admissions", cohort.admissions(rng, c, providers)
    transfers, n_transfers = cohort.transfers(rng, c, k.transfer)
    k.transfer += n_transfers
    yield "transfers", transfers
    yield "services", cohort.services(rng, c)
    yield "icustays", cohort.icustays(c)
    yield "diagnoses_icd", hospital.diagnoses_icd(c)
    yield "procedures_icd", hospital.procedures_icd(rng, c)
    yield "drgcodes", hospital.drgcodes(rng, c)
    yield "hcpcsevents", hospital.hcpcsevents(rng, c)
    yield "omr", hospital.omr(rng, c)
    labs, n_labs, n_specimens = hospital.labevents(rng, c, providers, k.lab, k.lab_specimen)
    lab_draws = _draw_times(labs, c)
    if quirk_rng is not None:
        labs, n_twins = quirks.labevents(quirk_rng, labs, c, k.lab + n_labs, k.lab_specimen + n_specimens)
        n_specimens += n_twins
    k.lab += labs.num_rows
    k.lab_specimen += n_specimens
    yield "labevents", labs
    del labs
    micro, n_micro, n_micro_specimens = hospital.microbiologyevents(rng, c, providers, k.micro, k.micro_specimen)
    k.micro += n_micro
    k.micro_specimen += n_micro_specimens
    yield "microbiologyevents", micro
    meds, n_orders = medications.emit(rng, c, providers, lab_draws, k.pharmacy)
    k.pharmacy += n_orders
    if quirk_rng is not None:
        meds = quirks.medications(quirk_rng, meds, c)
    yield from meds.items()
    placed = devices.place(rng, c)
    ventilated = placed.of(devices.VENTILATION)
    yield "chartevents", icu.chartevents(rng, c, caregivers, ventilated)
    procedures, n_proc = devices.procedureevents(rng, c, caregivers, placed, k.icu_order)
    k.icu_order += n_proc
    yield "procedureevents", procedures
    yield "datetimeevents", devices.datetimeevents(rng, c, caregivers, placed)
    yield "outputevents", icu.outputevents(rng, c, caregivers, placed.of(devices.FOLEY))
    for make in (icu.infusions, partial(icu.boluses, ventilated_stays=ventilated[0])):
        inputs, ingredients, n_inputs = make(rng, c, caregivers, first_order=k.icu_order)
        k.icu_order += n_inputs
        yield "inputevents", inputs
        yield "ingredientevents", ingredients


def _draw_times(labs: pa.Table, c: cohort.Cohort) -> tuple[np.ndarray, np.ndarray]:
    """One lab order per specimen: its admission index and draw time."""
    spec = labs.group_by(["hadm_id", "specimen_id"], use_threads=False).aggregate([("charttime", "min")])
    index = pc.index_in(spec["hadm_id"], pa.array(c.hadm_id)).to_numpy()
    return index.astype(np.int64), spec["charttime_min"].cast(pa.int64()).to_numpy()

"""Curated MIMIC-IV reference data shipped with the package (real codes, titles, itemids, units).

The CSVs under ``data/`` were taken once from the MIMIC-IV demo's dictionaries; they are read from
the package at run time so the generator never needs the demo. Small categorical distributions
(admission types, careunits, DRGs, microbiology) follow the demo's frequencies.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pyarrow as pa

DATA = Path(__file__).with_name("data")


@cache
def rows(name: str) -> tuple[dict[str, str], ...]:
    with open(DATA / f"{name}.csv", newline="", encoding="utf-8") as f:
        return tuple(csv.DictReader(f))


def column(name: str, field: str, dtype=object) -> np.ndarray:
    return np.array([r[field] for r in rows(name)], dtype=dtype)


def csv_table(name: str, fields: list[str]) -> pa.Table:
    """A dictionary table straight from a shipped CSV (empty cells are NULL; the sink casts types)."""
    return pa.table({f: [r[f] or None for r in rows(name)] for f in fields})


@dataclass(frozen=True)
class Concepts:
    """Diagnosis concepts, each with an ICD-9 and an ICD-10 code (row order: principal, secondary, chronic)."""

    names: np.ndarray
    role: np.ndarray
    weight: np.ndarray
    code: np.ndarray  # [concept, 0 = ICD-9 / 1 = ICD-10]

    def index(self, name: str) -> int:
        return int(np.flatnonzero(self.names == name)[0])


def _coded(name: str, role_field: str, role_order: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    by_concept: dict[str, dict] = {}
    for r in rows(name):
        c = by_concept.setdefault(r["concept"], {"role": r[role_field], "weight": float(r.get("weight") or 0)})
        c[int(r["icd_version"])] = r["icd_code"]
    names = sorted(by_concept, key=lambda n: role_order.index(by_concept[n]["role"]) if role_order else 0)
    return (np.array(names), np.array([by_concept[n]["role"] for n in names]),
            np.array([by_concept[n]["weight"] for n in names]),
            np.array([[by_concept[n][9], by_concept[n][10]] for n in names]))


@cache
def diagnoses() -> Concepts:
    return Concepts(*_coded("icd_diagnoses", "role", ("principal", "secondary", "chronic")))


@cache
def procedures() -> Concepts:
    return Concepts(*_coded("icd_procedures", "context", ()))


def icd_dictionary(name: str) -> pa.Table:
    return csv_table(name, ["icd_code", "icd_version", "long_title"])


# -------------------------------------------------------------- admissions (demo frequencies)
ADMISSION_TYPES = {  # type: (weight, arrives through the ED)
    "EW EMER.": (104, True), "OBSERVATION ADMIT": (45, False), "URGENT": (38, True),
    "EU OBSERVATION": (30, True), "SURGICAL SAME DAY ADMISSION": (18, False),
    "DIRECT EMER.": (15, False), "ELECTIVE": (13, False), "DIRECT OBSERVATION": (7, False),
    "AMBULATORY OBSERVATION": (5, False),
}
NON_ED_LOCATIONS = {"PHYSICIAN REFERRAL": 63, "TRANSFER FROM HOSPITAL": 43, "CLINIC REFERRAL": 10,
                    "PROCEDURE SITE": 7, "WALK-IN/SELF REFERRAL": 7, "PACU": 4,
                    "TRANSFER FROM SKILLED NURSING FACILITY": 4}
DISCHARGE_LOCATIONS = {"HOME HEALTH CARE": 76, "HOME": 72, "SKILLED NURSING FACILITY": 36, "REHAB": 13,
                       "CHRONIC/LONG TERM ACUTE CARE": 9, "HOSPICE": 5, "AGAINST ADVICE": 4,
                       "PSYCH FACILITY": 2, "ACUTE HOSPITAL": 1}
LANGUAGES = {"ENGLISH": 92, "?": 8}
MARITAL = {"SINGLE": 110, "MARRIED": 72, "WIDOWED": 54, "DIVORCED": 27}
RACES = {"WHITE": 170, "BLACK/AFRICAN AMERICAN": 48, "UNKNOWN": 17, "HISPANIC/LATINO - CUBAN": 9,
         "PORTUGUESE": 7, "OTHER": 4, "UNABLE TO OBTAIN": 4, "BLACK/CAPE VERDEAN": 3,
         "HISPANIC/LATINO - SALVADORAN": 3, "WHITE - BRAZILIAN": 3, "ASIAN": 6,
         "WHITE - OTHER EUROPEAN": 2, "HISPANIC OR LATINO": 2}
ANCHOR_YEAR_GROUPS = ("2008 - 2010", "2011 - 2013", "2014 - 2016", "2017 - 2019")
WARDS = {"Medicine": 77, "Med/Surg": 48, "Neurology": 46, "Medicine/Cardiology": 43, "Transplant": 39,
         "Cardiac Surgery": 39, "Hematology/Oncology": 31, "Med/Surg/Trauma": 25, "Vascular": 20,
         "Hematology/Oncology Intermediate": 23, "Med/Surg/GYN": 13, "Discharge Lounge": 10}
ICU_UNITS = {"Medical Intensive Care Unit (MICU)": 29, "Surgical Intensive Care Unit (SICU)": 29,
             "Cardiac Vascular Intensive Care Unit (CVICU)": 25,
             "Medical/Surgical Intensive Care Unit (MICU/SICU)": 23, "Trauma SICU (TSICU)": 16,
             "Coronary Care Unit (CCU)": 13, "Neuro Surgical Intensive Care Unit (Neuro SICU)": 3}
SERVICES = {"MED": 129, "CMED": 45, "SURG": 38, "OMED": 29, "CSURG": 21, "NSURG": 17, "VSURG": 10,
            "NMED": 9, "TRAUM": 8, "ORTHO": 5}

# principal diagnosis concept -> (HCFA code, description, APR code, description, chance of ICU)
DRG_BY_PRINCIPAL = {
    "sepsis": ("871", "SEPTICEMIA OR SEVERE SEPSIS W/O MV >96 HOURS W MCC", "720",
               "SEPTICEMIA & DISSEMINATED INFECTIONS", 0.7),
    "pneumonia": ("193", "SIMPLE PNEUMONIA & PLEURISY W MCC", "139", "OTHER PNEUMONIA", 0.35),
    "urinary_infection": ("690", "KIDNEY & URINARY TRACT INFECTIONS W/O MCC", "463",
                          "KIDNEY & URINARY TRACT INFECTIONS", 0.15),
    "acute_kidney_injury": ("682", "RENAL FAILURE W MCC", "469", "ACUTE KIDNEY INJURY", 0.3),
    "heart_failure_exacerbation": ("291", "HEART FAILURE & SHOCK W MCC", "194", "HEART FAILURE", 0.35),
    "myocardial_infarction": ("280", "ACUTE MYOCARDIAL INFARCTION, DISCHARGED ALIVE W MCC", "190",
                              "ACUTE MYOCARDIAL INFARCTION", 0.6),
    "respiratory_failure": ("189", "PULMONARY EDEMA & RESPIRATORY FAILURE", "133", "RESPIRATORY FAILURE", 0.9),
    "gi_bleed": ("377", "G.I. HEMORRHAGE W MCC", "253", "OTHER & UNSPECIFIED GASTROINTESTINAL HEMORRHAGE", 0.4),
    "stroke": ("065", "INTRACRANIAL HEMORRHAGE OR CEREBRAL INFARCTION W CC OR TPA IN 24 HRS", "045",
               "CVA & PRECEREBRAL OCCLUSION W INFARCT", 0.5),
    "copd_exacerbation": ("190", "CHRONIC OBSTRUCTIVE PULMONARY DISEASE W MCC", "140",
                          "CHRONIC OBSTRUCTIVE PULMONARY DISEASE", 0.3),
    "chest_pain": ("313", "CHEST PAIN", "203", "CHEST PAIN", 0.1),
    "syncope": ("312", "SYNCOPE & COLLAPSE", "204", "SYNCOPE & COLLAPSE", 0.1),
    "hyponatremia": ("641", "MISC DISORDERS OF NUTRITION,METABOLISM,FLUIDS/ELECTROLYTES W/O MCC", "425",
                     "OTHER NON-HYPOVOLEMIC ELECTROLYTE DISORDERS", 0.2),
    "cellulitis": ("603", "CELLULITIS W/O MCC", "383", "CELLULITIS & OTHER SKIN INFECTIONS", 0.1),
}

# -------------------------------------------------------------- microbiology (demo itemids)
SPECIMENS = (  # spec_itemid, spec_type_desc, test_itemid, test_name
    (70012, "BLOOD CULTURE", 90201, "Blood Culture, Routine"),
    (70079, "URINE", 90039, "URINE CULTURE"),
    (70062, "SPUTUM", 90055, "RESPIRATORY CULTURE"),
    (70070, "SWAB", 90046, "WOUND CULTURE"),
    (70091, "MRSA SCREEN", 90189, "MRSA SCREEN"),
)
ORGANISMS = (  # org_itemid, org_name, gram-positive, weight
    (80002, "ESCHERICHIA COLI", False, 296), (80023, "STAPH AUREUS COAG +", True, 185),
    (80004, "KLEBSIELLA PNEUMONIAE", False, 142), (80026, "PSEUDOMONAS AERUGINOSA", False, 102),
    (80053, "ENTEROCOCCUS SP.", True, 56), (80017, "PROTEUS MIRABILIS", False, 35),
    (80155, "STAPHYLOCOCCUS, COAGULASE NEGATIVE", True, 21),
)
ANTIBIOTICS = {  # gram-positive? -> (ab_itemid, ab_name, MIC when susceptible, MIC when resistant)
    False: ((90012, "GENTAMICIN", 0.5, 16), (90008, "TRIMETHOPRIM/SULFA", 0.5, 16),
            (90019, "CIPROFLOXACIN", 0.25, 4), (90029, "MEROPENEM", 0.25, 16),
            (90017, "CEFTAZIDIME", 1, 64), (90028, "CEFEPIME", 1, 64),
            (90026, "PIPERACILLIN/TAZO", 4, 128), (90018, "CEFTRIAXONE", 1, 64)),
    True: ((90016, "OXACILLIN", 0.25, 4), (90015, "VANCOMYCIN", 1, 32), (90007, "CLINDAMYCIN", 0.25, 8),
           (90006, "ERYTHROMYCIN", 0.25, 8), (90011, "TETRACYCLINE", 1, 16),
           (90008, "TRIMETHOPRIM/SULFA", 0.5, 16), (90025, "LEVOFLOXACIN", 0.12, 8)),
}

"""The MIMIC-IV v2.2 schema registry: 31 tables, exact column names, order and DuckDB types.

Every stage reads and writes tables through this registry, so the real demo, a full
credentialed MIMIC-IV and the synthetic generator are staged with one identical layout.
Column names and order follow the demo's CSV headers (including ``procedureevents``'
upper-case ``ORIGINALAMOUNT``/``ORIGINALRATE``); ``chartevents`` follows the v2.2 release.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import pyarrow as pa

ROW_ID = "_rid"
"""Stable per-table row identity added at staging; later stages use it, agents never see it."""

HOSP, ICU = "hosp", "icu"

# Table definitions: "column TYPE, ..." in file order. Types are DuckDB SQL types.
_SPECS: dict[str, tuple[str, str]] = {
    # ---------------------------------------------------------------- hosp
    "admissions": (HOSP, """subject_id INTEGER, hadm_id INTEGER, admittime TIMESTAMP,
        dischtime TIMESTAMP, deathtime TIMESTAMP, admission_type VARCHAR,
        admit_provider_id VARCHAR, admission_location VARCHAR, discharge_location VARCHAR,
        insurance VARCHAR, language VARCHAR, marital_status VARCHAR, race VARCHAR,
        edregtime TIMESTAMP, edouttime TIMESTAMP, hospital_expire_flag SMALLINT"""),
    "d_hcpcs": (HOSP, """code VARCHAR, category SMALLINT, long_description VARCHAR,
        short_description VARCHAR"""),
    "d_icd_diagnoses": (HOSP, "icd_code VARCHAR, icd_version SMALLINT, long_title VARCHAR"),
    "d_icd_procedures": (HOSP, "icd_code VARCHAR, icd_version SMALLINT, long_title VARCHAR"),
    "d_labitems": (HOSP, "itemid INTEGER, label VARCHAR, fluid VARCHAR, category VARCHAR"),
    "diagnoses_icd": (HOSP, """subject_id INTEGER, hadm_id INTEGER, seq_num INTEGER,
        icd_code VARCHAR, icd_version SMALLINT"""),
    "drgcodes": (HOSP, """subject_id INTEGER, hadm_id INTEGER, drg_type VARCHAR,
        drg_code VARCHAR, description VARCHAR, drg_severity SMALLINT, drg_mortality SMALLINT"""),
    "emar": (HOSP, """subject_id INTEGER, hadm_id INTEGER, emar_id VARCHAR, emar_seq INTEGER,
        poe_id VARCHAR, pharmacy_id INTEGER, enter_provider_id VARCHAR, charttime TIMESTAMP,
        medication VARCHAR, event_txt VARCHAR, scheduletime TIMESTAMP, storetime TIMESTAMP"""),
    "emar_detail": (HOSP, """subject_id INTEGER, emar_id VARCHAR, emar_seq INTEGER,
        parent_field_ordinal DOUBLE, administration_type VARCHAR, pharmacy_id INTEGER,
        barcode_type VARCHAR, reason_for_no_barcode VARCHAR, complete_dose_not_given VARCHAR,
        dose_due VARCHAR, dose_due_unit VARCHAR, dose_given VARCHAR, dose_given_unit VARCHAR,
        will_remainder_of_dose_be_given VARCHAR, product_amount_given VARCHAR,
        product_unit VARCHAR, product_code VARCHAR, product_description VARCHAR,
        product_description_other VARCHAR, prior_infusion_rate VARCHAR, infusion_rate VARCHAR,
        infusion_rate_adjustment VARCHAR, infusion_rate_adjustment_amount VARCHAR,
        infusion_rate_unit VARCHAR, route VARCHAR, infusion_complete VARCHAR,
        completion_interval VARCHAR, new_iv_bag_hung VARCHAR,
        continued_infusion_in_other_location VARCHAR, restart_interval VARCHAR, side VARCHAR,
        site VARCHAR, non_formulary_visual_verification VARCHAR"""),
    "hcpcsevents": (HOSP, """subject_id INTEGER, hadm_id INTEGER, chartdate DATE,
        hcpcs_cd VARCHAR, seq_num INTEGER, short_description VARCHAR"""),
    "labevents": (HOSP, """labevent_id INTEGER, subject_id INTEGER, hadm_id INTEGER,
        specimen_id INTEGER, itemid INTEGER, order_provider_id VARCHAR, charttime TIMESTAMP,
        storetime TIMESTAMP, value VARCHAR, valuenum DOUBLE, valueuom VARCHAR,
        ref_range_lower DOUBLE, ref_range_upper DOUBLE, flag VARCHAR, priority VARCHAR,
        comments VARCHAR"""),
    "microbiologyevents": (HOSP, """microevent_id INTEGER, subject_id INTEGER, hadm_id INTEGER,
        micro_specimen_id INTEGER, order_provider_id VARCHAR, chartdate TIMESTAMP,
        charttime TIMESTAMP, spec_itemid INTEGER, spec_type_desc VARCHAR, test_seq INTEGER,
        storedate TIMESTAMP, storetime TIMESTAMP, test_itemid INTEGER, test_name VARCHAR,
        org_itemid INTEGER, org_name VARCHAR, isolate_num SMALLINT, quantity VARCHAR,
        ab_itemid INTEGER, ab_name VARCHAR, dilution_text VARCHAR, dilution_comparison VARCHAR,
        dilution_value DOUBLE, interpretation VARCHAR, comments VARCHAR"""),
    "omr": (HOSP, """subject_id INTEGER, chartdate DATE, seq_num INTEGER, result_name VARCHAR,
        result_value VARCHAR"""),
    "patients": (HOSP, """subject_id INTEGER, gender VARCHAR, anchor_age SMALLINT,
        anchor_year SMALLINT, anchor_year_group VARCHAR, dod DATE"""),
    "pharmacy": (HOSP, """subject_id INTEGER, hadm_id INTEGER, pharmacy_id INTEGER,
        poe_id VARCHAR, starttime TIMESTAMP, stoptime TIMESTAMP, medication VARCHAR,
        proc_type VARCHAR, status VARCHAR, entertime TIMESTAMP, verifiedtime TIMESTAMP,
        route VARCHAR, frequency VARCHAR, disp_sched VARCHAR, infusion_type VARCHAR,
        sliding_scale VARCHAR, lockout_interval VARCHAR, basal_rate DOUBLE,
        one_hr_max VARCHAR, doses_per_24_hrs DOUBLE, duration DOUBLE,
        duration_interval VARCHAR, expiration_value INTEGER, expiration_unit VARCHAR,
        expirationdate TIMESTAMP, dispensation VARCHAR, fill_quantity VARCHAR"""),
    "poe": (HOSP, """poe_id VARCHAR, poe_seq INTEGER, subject_id INTEGER, hadm_id INTEGER,
        ordertime TIMESTAMP, order_type VARCHAR, order_subtype VARCHAR,
        transaction_type VARCHAR, discontinue_of_poe_id VARCHAR,
        discontinued_by_poe_id VARCHAR, order_provider_id VARCHAR, order_status VARCHAR"""),
    "poe_detail": (HOSP, """poe_id VARCHAR, poe_seq INTEGER, subject_id INTEGER,
        field_name VARCHAR, field_value VARCHAR"""),
    "prescriptions": (HOSP, """subject_id INTEGER, hadm_id INTEGER, pharmacy_id INTEGER,
        poe_id VARCHAR, poe_seq INTEGER, order_provider_id VARCHAR, starttime TIMESTAMP,
        stoptime TIMESTAMP, drug_type VARCHAR, drug VARCHAR, formulary_drug_cd VARCHAR,
        gsn VARCHAR, ndc VARCHAR, prod_strength VARCHAR, form_rx VARCHAR, dose_val_rx VARCHAR,
        dose_unit_rx VARCHAR, form_val_disp VARCHAR, form_unit_disp VARCHAR,
        doses_per_24_hrs DOUBLE, route VARCHAR"""),
    "procedures_icd": (HOSP, """subject_id INTEGER, hadm_id INTEGER, seq_num INTEGER,
        chartdate DATE, icd_code VARCHAR, icd_version SMALLINT"""),
    "provider": (HOSP, "provider_id VARCHAR"),
    "services": (HOSP, """subject_id INTEGER, hadm_id INTEGER, transfertime TIMESTAMP,
        prev_service VARCHAR, curr_service VARCHAR"""),
    "transfers": (HOSP, """subject_id INTEGER, hadm_id INTEGER, transfer_id INTEGER,
        eventtype VARCHAR, careunit VARCHAR, intime TIMESTAMP, outtime TIMESTAMP"""),
    # ----------------------------------------------------------------- icu
    "caregiver": (ICU, "caregiver_id INTEGER"),
    "chartevents": (ICU, """subject_id INTEGER, hadm_id INTEGER, stay_id INTEGER,
        caregiver_id INTEGER, charttime TIMESTAMP, storetime TIMESTAMP, itemid INTEGER,
        value VARCHAR, valuenum DOUBLE, valueuom VARCHAR, warning SMALLINT"""),
    "d_items": (ICU, """itemid INTEGER, label VARCHAR, abbreviation VARCHAR, linksto VARCHAR,
        category VARCHAR, unitname VARCHAR, param_type VARCHAR, lownormalvalue DOUBLE,
        highnormalvalue DOUBLE"""),
    "datetimeevents": (ICU, """subject_id INTEGER, hadm_id INTEGER, stay_id INTEGER,
        caregiver_id INTEGER, charttime TIMESTAMP, storetime TIMESTAMP, itemid INTEGER,
        value TIMESTAMP, valueuom VARCHAR, warning SMALLINT"""),
    "icustays": (ICU, """subject_id INTEGER, hadm_id INTEGER, stay_id INTEGER,
        first_careunit VARCHAR, last_careunit VARCHAR, intime TIMESTAMP, outtime TIMESTAMP,
        los DOUBLE"""),
    "ingredientevents": (ICU, """subject_id INTEGER, hadm_id INTEGER, stay_id INTEGER,
        caregiver_id INTEGER, starttime TIMESTAMP, endtime TIMESTAMP, storetime TIMESTAMP,
        itemid INTEGER, amount DOUBLE, amountuom VARCHAR, rate DOUBLE, rateuom VARCHAR,
        orderid INTEGER, linkorderid INTEGER, statusdescription VARCHAR,
        originalamount DOUBLE, originalrate DOUBLE"""),
    "inputevents": (ICU, """subject_id INTEGER, hadm_id INTEGER, stay_id INTEGER,
        caregiver_id INTEGER, starttime TIMESTAMP, endtime TIMESTAMP, storetime TIMESTAMP,
        itemid INTEGER, amount DOUBLE, amountuom VARCHAR, rate DOUBLE, rateuom VARCHAR,
        orderid INTEGER, linkorderid INTEGER, ordercategoryname VARCHAR,
        secondaryordercategoryname VARCHAR, ordercomponenttypedescription VARCHAR,
        ordercategorydescription VARCHAR, patientweight DOUBLE, totalamount DOUBLE,
        totalamountuom VARCHAR, isopenbag SMALLINT, continueinnextdept SMALLINT,
        statusdescription VARCHAR, originalamount DOUBLE, originalrate DOUBLE"""),
    "outputevents": (ICU, """subject_id INTEGER, hadm_id INTEGER, stay_id INTEGER,
        caregiver_id INTEGER, charttime TIMESTAMP, storetime TIMESTAMP, itemid INTEGER,
        value DOUBLE, valueuom VARCHAR"""),
    "procedureevents": (ICU, """subject_id INTEGER, hadm_id INTEGER, stay_id INTEGER,
        caregiver_id INTEGER, starttime TIMESTAMP, endtime TIMESTAMP, storetime TIMESTAMP,
        itemid INTEGER, value DOUBLE, valueuom VARCHAR, location VARCHAR,
        locationcategory VARCHAR, orderid INTEGER, linkorderid INTEGER,
        ordercategoryname VARCHAR, ordercategorydescription VARCHAR, patientweight DOUBLE,
        isopenbag SMALLINT, continueinnextdept SMALLINT, statusdescription VARCHAR,
        ORIGINALAMOUNT DOUBLE, ORIGINALRATE DOUBLE"""),
}

# Unique keys (one per table where MIMIC-IV documents one).
_KEYS: dict[str, tuple[str, ...]] = {
    "patients": ("subject_id",),
    "admissions": ("hadm_id",),
    "icustays": ("stay_id",),
    "transfers": ("transfer_id",),
    "d_labitems": ("itemid",),
    "d_items": ("itemid",),
    "d_icd_diagnoses": ("icd_code", "icd_version"),
    "d_icd_procedures": ("icd_code", "icd_version"),
    "d_hcpcs": ("code",),
    "provider": ("provider_id",),
    "caregiver": ("caregiver_id",),
    "labevents": ("labevent_id",),
    "microbiologyevents": ("microevent_id",),
    "emar": ("emar_id",),
    "pharmacy": ("pharmacy_id",),
    "poe": ("poe_id",),
    "diagnoses_icd": ("hadm_id", "seq_num", "icd_code", "icd_version"),
    "procedures_icd": ("hadm_id", "seq_num", "icd_code", "icd_version"),
}

_TYPE_TO_ARROW = {
    "INTEGER": pa.int32(),
    "SMALLINT": pa.int16(),
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
    "VARCHAR": pa.string(),
    "TIMESTAMP": pa.timestamp("us"),
    "DATE": pa.date32(),
}


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # DuckDB SQL type

    @property
    def arrow_type(self) -> pa.DataType:
        return _TYPE_TO_ARROW[self.type]


@dataclass(frozen=True)
class ForeignKey:
    table: str
    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.table}.{'+'.join(self.columns)}->{self.ref_table}"


@dataclass(frozen=True)
class Table:
    name: str
    module: str  # "hosp" or "icu"
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()

    @cached_property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"table {self.name!r} has no column {name!r}")

    def has(self, name: str) -> bool:
        return name in self.column_names

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        """Schema of the staged Parquet file: the registry's columns, then ``_rid``."""
        fields = [pa.field(c.name, c.arrow_type) for c in self.columns]
        return pa.schema(fields + [pa.field(ROW_ID, pa.int64(), nullable=False)])

    @property
    def relative_path(self) -> str:
        """Path inside a PhysioNet-layout release, without the ``.csv.gz`` suffix."""
        return f"{self.module}/{self.name}"


def _parse(name: str, module: str, spec: str) -> Table:
    columns = []
    for part in spec.split(","):
        col_name, col_type = part.split()
        if col_type not in _TYPE_TO_ARROW:
            raise ValueError(f"schema registry: {name}.{col_name} has unknown type {col_type}")
        columns.append(Column(col_name, col_type))
    return Table(name, module, tuple(columns), _KEYS.get(name, ()))


TABLES: dict[str, Table] = {n: _parse(n, m, s) for n, (m, s) in sorted(_SPECS.items())}
HOSP_TABLES = tuple(n for n, t in TABLES.items() if t.module == HOSP)
ICU_TABLES = tuple(n for n, t in TABLES.items() if t.module == ICU)


def table(name: str) -> Table:
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"unknown MIMIC-IV table {name!r}; known: {', '.join(TABLES)}") from None


def _foreign_keys() -> tuple[ForeignKey, ...]:
    """Foreign keys implied by MIMIC-IV's shared identifiers, plus the explicit links."""
    fks: list[ForeignKey] = []
    by_column = {
        "subject_id": "patients",
        "hadm_id": "admissions",
        "stay_id": "icustays",
        "caregiver_id": "caregiver",
        "admit_provider_id": "provider",
        "order_provider_id": "provider",
        "enter_provider_id": "provider",
    }
    for t in TABLES.values():
        for col, ref in by_column.items():
            if t.has(col) and t.name != ref:
                ref_col = "provider_id" if ref == "provider" else col
                fks.append(ForeignKey(t.name, (col,), ref, (ref_col,)))
        if t.has("itemid") and t.name not in ("d_labitems", "d_items"):
            ref = "d_labitems" if t.name == "labevents" else "d_items"
            fks.append(ForeignKey(t.name, ("itemid",), ref, ("itemid",)))
    fks += [
        ForeignKey("diagnoses_icd", ("icd_code", "icd_version"), "d_icd_diagnoses",
                   ("icd_code", "icd_version")),
        ForeignKey("procedures_icd", ("icd_code", "icd_version"), "d_icd_procedures",
                   ("icd_code", "icd_version")),
        ForeignKey("hcpcsevents", ("hcpcs_cd",), "d_hcpcs", ("code",)),
        ForeignKey("emar_detail", ("emar_id",), "emar", ("emar_id",)),
        ForeignKey("emar", ("poe_id",), "poe", ("poe_id",)),
        ForeignKey("emar", ("pharmacy_id",), "pharmacy", ("pharmacy_id",)),
        ForeignKey("pharmacy", ("poe_id",), "poe", ("poe_id",)),
        ForeignKey("prescriptions", ("pharmacy_id",), "pharmacy", ("pharmacy_id",)),
        ForeignKey("prescriptions", ("poe_id",), "poe", ("poe_id",)),
        ForeignKey("poe_detail", ("poe_id",), "poe", ("poe_id",)),
    ]
    return tuple(fks)


FOREIGN_KEYS: tuple[ForeignKey, ...] = _foreign_keys()

# Event tables whose time must lie inside their parent stay: (table, time column, parent).
EVENT_TIMES: tuple[tuple[str, str, str], ...] = (
    ("chartevents", "charttime", "icustays"),
    ("datetimeevents", "charttime", "icustays"),
    ("outputevents", "charttime", "icustays"),
    ("inputevents", "starttime", "icustays"),
    ("ingredientevents", "starttime", "icustays"),
    ("procedureevents", "starttime", "icustays"),
    ("icustays", "intime", "admissions"),
    ("transfers", "intime", "admissions"),
    ("labevents", "charttime", "admissions"),
    ("prescriptions", "starttime", "admissions"),
    ("emar", "charttime", "admissions"),
)

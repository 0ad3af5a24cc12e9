"""The synthetic source stages all 31 MIMIC-IV tables clean (``quirks="none"``; the real demo's quirks are
tested in test_synthetic_quirks.py): schema, keys, FKs, times, values, determinism."""

from __future__ import annotations

import hashlib

import duckdb
import pyarrow as pa
import pytest

from pipeline.schema import EVENT_TIMES, FOREIGN_KEYS, TABLES, table
from pipeline.sources import make_source
from pipeline.sources.synthetic import SyntheticSource
from pipeline.staging import StagingError, attach_staged, stage, staged_path

PATIENTS = 1000
WINDOWS = {"icustays": ("stay_id", "intime", "outtime"), "admissions": ("hadm_id", "admittime", "dischtime")}


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic")
    report = stage(make_source("synthetic", patients=PATIENTS, seed=7, quirks="none"), out)
    return out, report


@pytest.fixture(scope="module")
def con(staged):
    out, _ = staged
    c = duckdb.connect()
    attach_staged(c, out)
    yield c
    c.close()


def count(con, sql: str) -> int:
    return con.execute(f"SELECT count(*) FROM ({sql})").fetchone()[0]


def test_all_tables_non_empty_with_registry_schema(staged):
    out, report = staged
    import pyarrow.parquet as pq
    assert set(report.rows) == set(TABLES)
    for name in TABLES:
        assert report.rows[name] > 0, name
        assert pq.read_schema(staged_path(out, name)).remove_metadata().equals(table(name).arrow_schema), name


@pytest.mark.parametrize("fk", FOREIGN_KEYS, ids=lambda fk: fk.name)
def test_foreign_keys_hold(con, fk):
    on = " AND ".join(f"c.{a} = p.{b}" for a, b in zip(fk.columns, fk.ref_columns))
    not_null = " AND ".join(f"c.{a} IS NOT NULL" for a in fk.columns)
    assert count(con, f"SELECT 1 FROM {fk.table} c ANTI JOIN {fk.ref_table} p ON {on} WHERE {not_null}") == 0


@pytest.mark.parametrize("name", [n for n, t in TABLES.items() if t.key])
def test_unique_keys(con, name):
    key = ", ".join(TABLES[name].key)
    assert count(con, f"SELECT {key} FROM {name} GROUP BY ALL HAVING count(*) > 1") == 0


@pytest.mark.parametrize("child,time_col,parent", EVENT_TIMES)
def test_events_inside_their_stay(con, child, time_col, parent):
    key, start, end = WINDOWS[parent]
    assert count(con, f"SELECT c.{time_col} FROM {child} c WHERE c.{time_col} IS NULL") == 0
    assert count(con, f"SELECT 1 FROM {child} c JOIN {parent} p USING ({key}) "
                      f"WHERE c.{time_col} < p.{start} OR c.{time_col} > p.{end}") == 0


def test_admission_and_death_ordering(con):
    assert count(con, "SELECT 1 FROM admissions WHERE dischtime <= admittime") == 0
    assert count(con, "SELECT 1 FROM admissions WHERE (deathtime IS NOT NULL) <> (hospital_expire_flag = 1)") == 0
    assert count(con, "SELECT 1 FROM admissions WHERE deathtime IS NOT NULL AND deathtime <> dischtime") == 0
    assert count(con, "SELECT 1 FROM admissions a JOIN patients p USING (subject_id) "
                      "WHERE a.deathtime IS NOT NULL AND (p.dod IS NULL OR p.dod < CAST(a.deathtime AS DATE))") == 0
    assert count(con, "SELECT 1 FROM admissions a JOIN patients p USING (subject_id) "
                      "WHERE p.dod < CAST(a.dischtime AS DATE)") == 0
    assert count(con, "SELECT 1 FROM icustays i JOIN admissions a USING (hadm_id) "
                      "WHERE i.intime < a.admittime OR i.outtime > a.dischtime OR i.outtime <= i.intime") == 0
    assert count(con, "SELECT 1 FROM transfers WHERE outtime < intime") == 0


def test_icu_los_is_fractional_days(con):
    assert count(con, "SELECT 1 FROM icustays WHERE abs(los - epoch(outtime - intime) / 86400.0) > 1e-9") == 0
    assert count(con, "SELECT 1 FROM icustays WHERE los <> round(los)") > 0


def test_lab_flags_match_reference_ranges(con):
    assert count(con, "SELECT 1 FROM labevents WHERE valuenum IS NULL OR ref_range_lower IS NULL") == 0
    assert count(con, "SELECT 1 FROM labevents WHERE coalesce(flag = 'abnormal', false) <> "
                      "(valuenum < ref_range_lower OR valuenum > ref_range_upper)") == 0
    assert count(con, "SELECT 1 FROM labevents WHERE flag IS NOT NULL AND flag <> 'abnormal'") == 0
    abnormal = con.execute("SELECT avg((flag IS NOT NULL)::INT) FROM labevents").fetchone()[0]
    assert 0.1 < abnormal < 0.6
    # a panel drawn together shares specimen_id and charttime
    assert count(con, "SELECT specimen_id FROM labevents GROUP BY 1 HAVING count(DISTINCT charttime) > 1 "
                      "OR count(DISTINCT hadm_id) > 1") == 0


@pytest.mark.parametrize("name", ["labevents", "chartevents"])
def test_value_text_matches_valuenum(con, name):
    numeric = "" if name == "labevents" else "AND itemid NOT IN (220739, 223900, 223901)"
    assert count(con, f"SELECT 1 FROM {name} WHERE valuenum IS NULL OR value IS NULL OR "
                      f"(TRY_CAST(value AS DOUBLE) IS DISTINCT FROM valuenum {numeric})") == 0


def test_chart_units_are_the_d_items_units(con):
    assert count(con, "SELECT 1 FROM chartevents c JOIN d_items d USING (itemid) "
                      "WHERE c.valueuom IS DISTINCT FROM d.unitname") == 0


def test_dictionaries_cover_every_used_code(con):
    for child, ref_table in (("labevents", "d_labitems"), ("chartevents", "d_items"), ("inputevents", "d_items"),
                             ("outputevents", "d_items"), ("datetimeevents", "d_items"), ("procedureevents", "d_items"),
                             ("ingredientevents", "d_items")):
        assert count(con, f"SELECT itemid FROM {child} EXCEPT SELECT itemid FROM {ref_table}") == 0


def test_population_has_material(con):
    per_patient = con.execute("SELECT avg((n >= 2)::INT) FROM (SELECT count(*) n FROM admissions GROUP BY subject_id)").fetchone()[0]
    assert per_patient > 0.4
    readmit = count(con, "SELECT 1 FROM (SELECT admittime - lag(dischtime) OVER (PARTITION BY subject_id "
                         "ORDER BY admittime) gap FROM admissions) WHERE gap <= INTERVAL 30 DAY")
    assert readmit > 50
    icu_share = con.execute("SELECT avg((hadm_id IN (SELECT hadm_id FROM icustays))::INT) FROM admissions").fetchone()[0]
    assert 0.25 < icu_share < 0.55
    # comorbidity patterns: hypertensive CKD and sepsis with AKI both occur
    assert count(con, "SELECT 1 FROM diagnoses_icd WHERE icd_code IN ('40390', 'I129')") > 20
    assert count(con, "SELECT hadm_id FROM diagnoses_icd GROUP BY 1 HAVING bool_or(icd_code IN ('0389','A419')) "
                      "AND bool_or(icd_code IN ('5849','N179'))") > 10
    assert count(con, "SELECT 1 FROM patients WHERE subject_id < 10000000") == 0
    assert count(con, "SELECT 1 FROM admissions WHERE year(admittime) NOT BETWEEN 2110 AND 2210") == 0
    assert count(con, "SELECT 1 FROM emar WHERE emar_id <> subject_id || '-' || emar_seq") == 0
    assert count(con, "SELECT 1 FROM provider WHERE NOT regexp_full_match(provider_id, 'P[0-9A-Z]{5}')") == 0


def test_emar_detail_has_a_parent_and_product_rows_per_administration(con):
    assert count(con, "SELECT emar_id FROM emar_detail GROUP BY 1 HAVING count(*) FILTER (parent_field_ordinal IS NULL) <> 1 "
                      "OR count(*) FILTER (parent_field_ordinal IS NOT NULL) < 1") == 0
    assert count(con, "SELECT emar_id FROM emar EXCEPT SELECT emar_id FROM emar_detail") == 0
    assert count(con, "SELECT 1 FROM emar_detail d JOIN emar e USING (emar_id) WHERE d.parent_field_ordinal IS NOT NULL "
                      "AND d.pharmacy_id IS DISTINCT FROM e.pharmacy_id") == 0
    assert count(con, "SELECT 1 FROM emar_detail WHERE parent_field_ordinal IS NULL AND (dose_due IS NULL "
                      "OR administration_type IS NULL OR product_code IS NOT NULL)") == 0


@pytest.mark.parametrize("name", ["procedureevents", "inputevents", "ingredientevents"])
def test_intervals_end_inside_their_stay(con, name):
    assert count(con, f"SELECT 1 FROM {name} x JOIN icustays i USING (stay_id) "
                      "WHERE x.endtime < x.starttime OR x.endtime > i.outtime OR x.storetime < x.endtime") == 0


def test_icu_orders_are_unique_and_ingredients_belong_to_inputs(con):
    assert count(con, "SELECT orderid FROM (SELECT orderid FROM inputevents UNION ALL SELECT orderid FROM procedureevents) "
                      "GROUP BY 1 HAVING count(*) > 1") == 0
    assert count(con, "SELECT orderid FROM ingredientevents EXCEPT SELECT orderid FROM inputevents") == 0
    assert count(con, "SELECT 1 FROM inputevents WHERE amount <= 0 OR amount IS NULL") == 0
    assert count(con, "SELECT 1 FROM inputevents WHERE (rate IS NULL) <> (rateuom IS NULL)") == 0


def test_icu_material_beyond_vitals(con):
    used = {r[0] for r in con.execute("SELECT DISTINCT itemid FROM inputevents UNION SELECT DISTINCT itemid "
                                      "FROM procedureevents UNION SELECT DISTINCT itemid FROM chartevents").fetchall()}
    expected = {225798, 225851, 225893, 226452, 225828,  # antibiotics, PO intake, LR bolus
                225792, 227194, 225459, 225402, 224264,  # ventilation, extubation, chest X-ray, EKG, PICC
                223835, 220339, 224684, 224688}          # FiO2 and ventilator settings
    assert expected <= used, expected - used
    assert count(con, "SELECT 1 FROM procedureevents WHERE ordercategorydescription = 'Task' "
                      "AND (value <> 1 OR endtime <> starttime + INTERVAL 1 MINUTE)") == 0
    assert count(con, "SELECT 1 FROM procedureevents WHERE ordercategorydescription = 'ContinuousProcess' "
                      "AND value <> epoch(endtime - starttime) / 60") == 0
    assert count(con, "SELECT 1 FROM procedureevents WHERE (location IS NULL) <> "
                      "(ordercategorydescription = 'Task' OR itemid = 225792)") == 0


def test_ventilator_settings_only_on_the_ventilator(con):
    bounds = {223835: (21, 100), 220339: (0, 24), 224684: (250, 800), 224688: (8, 35)}
    for itemid, (lo, hi) in bounds.items():
        assert count(con, f"SELECT 1 FROM chartevents WHERE itemid = {itemid} AND valuenum NOT BETWEEN {lo} AND {hi}") == 0
    assert count(con, "SELECT 1 FROM chartevents c WHERE itemid IN (223835, 220339, 224684, 224688) AND NOT EXISTS "
                      "(SELECT 1 FROM procedureevents p WHERE p.itemid = 225792 AND p.stay_id = c.stay_id "
                      "AND c.charttime BETWEEN p.starttime AND p.endtime)") == 0


def test_datetime_values_are_not_after_their_charting(con):
    assert count(con, "SELECT 1 FROM datetimeevents WHERE value > charttime") == 0
    assert count(con, "SELECT 1 FROM datetimeevents d JOIN icustays i USING (stay_id) "
                      "WHERE d.value < date_trunc('day', i.intime)") == 0


def test_no_outpatient_visits_after_death(con):
    assert count(con, "SELECT 1 FROM omr o JOIN patients p USING (subject_id) WHERE o.chartdate > p.dod") == 0


def test_poe_detail_fields_follow_their_orders(con):
    assert count(con, "SELECT 1 FROM poe_detail d JOIN poe p USING (poe_id) WHERE "
                      "(d.field_name = 'Transfer to') <> (p.order_subtype = 'Transfer') OR "
                      "(d.field_name IN ('Admit to', 'Admit category')) <> (p.order_subtype = 'Admit')") == 0
    assert count(con, "SELECT poe_id FROM poe_detail GROUP BY poe_id, field_name HAVING count(*) > 1") == 0


def _digests(directory) -> dict[str, str]:
    return {n: hashlib.sha256(staged_path(directory, n).read_bytes()).hexdigest() for n in TABLES}


def test_same_seed_same_bytes_other_seed_other_data(staged, tmp_path):
    out, _ = staged
    stage(make_source("synthetic", patients=PATIENTS, seed=7, quirks="none"), tmp_path / "again")
    assert _digests(tmp_path / "again") == _digests(out)
    stage(make_source("synthetic", patients=200, seed=8), tmp_path / "other")
    stage(make_source("synthetic", patients=200, seed=9), tmp_path / "other2")
    other, other2 = _digests(tmp_path / "other"), _digests(tmp_path / "other2")
    assert all(other[n] != other2[n] for n in ("patients", "admissions", "labevents", "chartevents"))


def test_small_chunks_give_valid_output(tmp_path):
    report = stage(SyntheticSource(patients=250, seed=3, chunk_size=60, quirks="none"), tmp_path)
    assert report.rows["patients"] == 250
    c = duckdb.connect()
    attach_staged(c, tmp_path)
    for name in (n for n, t in TABLES.items() if t.key):
        key = ", ".join(TABLES[name].key)
        assert count(c, f"SELECT {key} FROM {name} GROUP BY ALL HAVING count(*) > 1") == 0, name
    for fk in FOREIGN_KEYS:
        on = " AND ".join(f"x.{a} = p.{b}" for a, b in zip(fk.columns, fk.ref_columns))
        assert count(c, f"SELECT 1 FROM {fk.table} x ANTI JOIN {fk.ref_table} p ON {on} "
                        f"WHERE x.{fk.columns[0]} IS NOT NULL") == 0, fk.name


class _BadRowAtTheEnd(SyntheticSource):
    """Stages real chunks (queued on the writer threads), then a row that cannot be cast."""

    def emit(self, sink):
        super().emit(sink)
        sink.write("patients", pa.table({c: ["not a number"] for c in table("patients").column_names}))


def test_a_failed_run_leaves_no_files_behind(tmp_path):
    with pytest.raises(StagingError, match="patients: cannot cast"):
        stage(_BadRowAtTheEnd(patients=300, seed=1, chunk_size=100), tmp_path)
    assert list(tmp_path.iterdir()) == []

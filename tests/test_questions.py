"""Question engine on the real staged demo: templates execute, answers re-derive, determinism."""

import json

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.questions import (
    TemplateError,
    generate,
    generate_questions,
    load_templates,
    open_staged,
    render,
)
from pipeline.questions.answers import AnswerError, normalise
from pipeline.questions.generate import columnar, draw_candidates, template_rows
from pipeline.questions.templates import EntitySlot, NoiseSpec, literal_slots, render_columnar
from pipeline.schema import table as schema_table

TEMPLATES = load_templates()
PER_TEMPLATE = 5
CHART_SLOTS = {"subject_id": 10000032, "chart_item": "Heart Rate", "threshold": 100.0}


@pytest.fixture(scope="module")
def con(demo_staged):
    con, present = open_staged(demo_staged)
    if "chartevents" not in present:  # the demo has none: an empty table lets its SQL run
        empty = schema_table("chartevents").arrow_schema.empty_table()
        con.register("chartevents", empty)
    yield con
    con.close()


@pytest.fixture(scope="module")
def generated(demo_staged):
    return generate_questions(demo_staged, seed=0, per_template=PER_TEMPLATE)


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: t.id)
def test_template_renders_and_executes(con, template):
    cands, _ = draw_candidates(con, template, np.random.default_rng(0), 3)
    slots = cands[0] if cands else {k: CHART_SLOTS[k] for k in template.slot_names}
    for variant in range(len(template.questions)):
        question, gold, evidence = render(template, slots, variant)
        assert "{" not in question and "_rid" not in gold
    con.execute(gold).fetchall()
    rows = con.execute(evidence).fetchall()
    assert all(isinstance(t, str) and isinstance(r, int) for t, r in rows)


def test_cells_and_yield(generated):
    tbl, report = generated
    assert tbl.column_names == ["question_id", "template_id", "intent", "level", "question", "gold_sql",
                                "answer_type", "answer", "evidence", "slots", "variant"]
    assert tbl.column("question_id").to_pylist() == sorted(tbl.column("question_id").to_pylist())
    cells = {(i, lv) for i in ("encounters", "diagnoses", "procedures", "medications", "laboratory",
                               "icu_monitoring") for lv in ("patient", "population")}
    assert {k for k, n in report.cells.items() if n} == cells
    for t in TEMPLATES:
        if "chartevents" in t.tables_needed():
            assert "chartevents" in report.skipped[t.id]
        else:
            assert report.questions.get(t.id, 0) >= 1, (t.id, report.rejected_by_template.get(t.id))


# One hand-written query per intent x level cell; `s` is the slots dict, answers compare after
# the same rounding as the engine (2 decimals).
INDEPENDENT = {
    "enc_admission_count": "SELECT count(DISTINCT hadm_id) FROM admissions WHERE subject_id = $subject_id",
    "enc_deaths_by_admission_type": """SELECT count(*) FROM (SELECT DISTINCT subject_id FROM admissions
        WHERE deathtime IS NOT NULL AND hospital_expire_flag = 1 AND admission_type = $admission_type)""",
    "dx_ever_diagnosed": """SELECT EXISTS (SELECT 1 FROM diagnoses_icd x, d_icd_diagnoses d WHERE x.icd_code = d.icd_code
        AND x.icd_version = d.icd_version AND x.subject_id = $subject_id AND d.long_title = $diagnosis)""",
    "dx_patients_with_diagnosis": """SELECT count(*) FROM (SELECT x.subject_id FROM diagnoses_icd x
        JOIN d_icd_diagnoses d USING (icd_code, icd_version) WHERE d.long_title = $diagnosis GROUP BY 1)""",
    "proc_first_date": """SELECT x.chartdate FROM procedures_icd x JOIN d_icd_procedures d USING (icd_code, icd_version)
        WHERE x.subject_id = $subject_id AND d.long_title = $procedure ORDER BY x.chartdate LIMIT 1""",
    "proc_patients_underwent": """SELECT count(*) FROM (SELECT DISTINCT x.subject_id FROM procedures_icd x
        JOIN d_icd_procedures d USING (icd_code, icd_version) WHERE d.long_title = $procedure)""",
    "med_ever_prescribed": "SELECT count(*) >= 1 FROM prescriptions WHERE subject_id = $subject_id AND drug = $drug",
    "med_patients_prescribed": "SELECT count(*) FROM (SELECT DISTINCT subject_id FROM prescriptions WHERE drug = $drug)",
    "lab_max_value_last_admission": """WITH last AS (SELECT hadm_id FROM admissions WHERE subject_id = $subject_id
        ORDER BY admittime DESC LIMIT 1)
        SELECT l.valuenum FROM labevents l JOIN d_labitems d USING (itemid) JOIN last USING (hadm_id)
        WHERE d.label = $lab_label AND d.fluid = 'Blood' AND l.valuenum IS NOT NULL
        ORDER BY l.valuenum DESC LIMIT 1""",
    "lab_avg_first_value": """SELECT avg(v) FROM (SELECT arg_min(l.valuenum, l.charttime) AS v
        FROM labevents l JOIN d_labitems d USING (itemid) WHERE d.label = $lab_label AND d.fluid = 'Blood'
        AND l.valuenum IS NOT NULL AND l.hadm_id IS NOT NULL GROUP BY l.subject_id)""",
    "icu_total_output_first_stay": """WITH s AS (SELECT arg_min(stay_id, intime) AS stay_id FROM icustays
        WHERE subject_id = $subject_id)
        SELECT sum(o.value) FROM outputevents o JOIN s USING (stay_id) JOIN d_items d USING (itemid)
        WHERE d.label = $output_item""",
    "icu_patients_with_output": """SELECT count(DISTINCT o.subject_id) FROM outputevents o
        WHERE o.itemid IN (SELECT itemid FROM d_items WHERE label = $output_item)""",
}


def _norm(value):
    if isinstance(value, float):
        return round(value, 2)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


@pytest.mark.parametrize("template_id", sorted(INDEPENDENT))
def test_answers_rederived_independently(con, generated, template_id):
    rows = [r for r in generated[0].to_pylist() if r["template_id"] == template_id]
    assert rows, f"{template_id} produced no questions"
    for r in rows:
        slots = json.loads(r["slots"])
        sql = INDEPENDENT[template_id]
        params = {k: v for k, v in slots.items() if f"${k}" in sql}
        (got,) = con.execute(sql, params).fetchall()[0]
        assert json.loads(r["answer"]) == _norm(got), (r["question"], r["answer"], got)


def test_determinism(demo_staged, tmp_path):
    subset = [t for t in TEMPLATES if t.id in INDEPENDENT]
    paths = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        paths.append(tmp_path / f"{name}.parquet")
        generate_questions(demo_staged, seed, subset, per_template=PER_TEMPLATE, out=paths[-1])
    assert paths[0].read_bytes() == paths[1].read_bytes()
    ids = [set(pq.read_table(p, columns=["question_id"]).column(0).to_pylist()) for p in paths]
    assert ids[0] != ids[2]
    assert not list(tmp_path.glob(".*tmp*"))


GOOD = """
- id: {tid}
  intent: laboratory
  level: patient
  questions: ["Last {{{{ lab_label }}}} of {{{{ subject_id }}}}?", "{{{{ subject_id }}}}: last {{{{ lab_label }}}}?"]
  slots:
    subject_id: {{sampler: {sampler}, source: lab}}
    lab_label: {{sampler: lab_item, patient: subject_id}}
  gold_sql: "SELECT {gold} FROM labevents WHERE subject_id = {{{{ subject_id|sql }}}}"
  evidence_sql: "SELECT 'labevents' AS table_name, _rid FROM labevents WHERE subject_id = {{{{ subject_id|sql }}}}"
  answer_type: {answer_type}
  requires: [labevents]
  noise: {{evidence_table: labevents, operators: [drop_evidence]}}
"""


@pytest.mark.parametrize("change, message", [
    ({"gold": "max(valuenum) {% if %}"}, "Jinja syntax error"),
    ({"gold": "{{ missing_slot|sql }}"}, "unknown slot"),
    ({"sampler": "no_such_sampler"}, "unknown sampler 'no_such_sampler'"),
    ({"answer_type": "float"}, "answer_type 'float'"),
])
def test_bad_template_is_named(tmp_path, change, message):
    fields = {"tid": "broken_template", "sampler": "patient", "gold": "max(valuenum)", "answer_type": "number"}
    fields.update(change)
    (tmp_path / "laboratory.yaml").write_text(GOOD.format(**fields))
    with pytest.raises(TemplateError, match=message) as err:
        load_templates(tmp_path)
    assert "broken_template" in str(err.value) and "laboratory.yaml" in str(err.value)


GOOD_NOISE = "noise: {evidence_table: labevents, operators: [drop_evidence]}"


@pytest.mark.parametrize("noise, message", [
    ("{evidence_table: labevents, operators: [drop_evidence, shuffle_rows]}",
     r"unknown operator\(s\) \['shuffle_rows'\]; known: .*drop_evidence"),
    ("{evidence_table: labevents, operators: []}", "non-empty list of operator names"),
    ("{evidence_table: labevents, value_column: dose, operators: [drop_evidence]}",
     "noise.value_column 'dose' is not a column of labevents"),
    ("{evidence_table: labevents, operators: [drop_evidence], entity_slot: {slot: drug, dictionary: d_labitems}}",
     "noise.entity_slot must be"),
    ("{evidence_table: labevents, operators: [drop_evidence], window: [year]}", r"unknown slot\(s\) \['year'\]"),
    ("{evidence_table: labevents, operators: [drop_evidence], severity: 3}", r"unknown \['severity'\]"),
])
def test_bad_noise_block_is_named(tmp_path, noise, message):
    text = GOOD.format(tid="noisy_template", sampler="patient", gold="max(valuenum)", answer_type="number")
    (tmp_path / "laboratory.yaml").write_text(text.replace(GOOD_NOISE, f"noise: {noise}"))
    with pytest.raises(TemplateError, match=message) as err:
        load_templates(tmp_path)
    assert "noisy_template" in str(err.value) and "laboratory.yaml" in str(err.value)


def test_noise_block_is_parsed_once_into_a_typed_spec(tmp_path):
    noise = ("{evidence_table: labevents, time_column: charttime, operators: [drop_evidence, absent_event], "
             "entity_slot: {slot: lab_label, dictionary: d_labitems}}")
    text = GOOD.format(tid="typed", sampler="patient", gold="max(valuenum)", answer_type="number")
    (tmp_path / "laboratory.yaml").write_text(text.replace(GOOD_NOISE, f"noise: {noise}"))
    (template,) = load_templates(tmp_path)
    assert template.noise == NoiseSpec("labevents", ("drop_evidence", "absent_event"), time_column="charttime",
                                       entity_slot=EntitySlot("lab_label", "d_labitems", "lab_label"))


def test_sql_values_must_be_quoted(tmp_path):
    text = GOOD.format(tid="unquoted", sampler="patient", gold="{{ lab_label }}", answer_type="number")
    (tmp_path / "laboratory.yaml").write_text(text)
    (template,) = load_templates(tmp_path)
    with pytest.raises(TemplateError, match="unquoted.*without the \\|sql filter"):
        render(template, {"subject_id": 1, "lab_label": "x' OR '1'='1"}, 0)
    _, gold, _ = render(template, {"subject_id": 1, "lab_label": 5}, 0)
    assert gold.startswith("SELECT 5 FROM")


@pytest.mark.slow
def test_every_template_yields_on_synthetic(tmp_path):
    """The acceptance bar: on 1,000 clean synthetic patients every template, chartevents ones
    included, yields clean questions. (With the demo's quirks the clean-evidence filter rightly
    rejects some population lab questions whose scope holds faulty rows: issue 10.)"""
    from pipeline.sources import make_source
    from pipeline.staging import stage

    stage(make_source("synthetic", patients=1000, seed=0, quirks="none"), tmp_path)
    _, report = generate_questions(tmp_path, seed=0, per_template=2)
    assert not report.skipped
    empty = [t.id for t in TEMPLATES if report.questions.get(t.id, 0) < 1]
    assert not empty, empty


def test_running_out_of_memory_fails_the_template_instead_of_skipping_it(demo_staged):
    """A skipped template would make what a build ships depend on the machine's memory and the
    worker count: running out of DuckDB's budget is an error naming the setting to raise."""
    from pipeline.questions.generate import _template_result
    from pipeline.staging import MemoryBudgetError, staged_database

    template = next(t for t in TEMPLATES if t.id == "lab_avg_first_value_age_group")
    with staged_database(demo_staged) as path:
        con, present = open_staged(demo_staged, staged_file=path)
        try:
            con.execute("SET memory_limit = '1MB'").fetchall()
            with pytest.raises(MemoryBudgetError, match="lab_avg_first_value_age_group.*EHR_ROBUSTGYM_DUCKDB_MEMORY"):
                _template_result(con, present, template, 0, PER_TEMPLATE)
            con.execute("SET memory_limit = '1GB'").fetchall()
            assert _template_result(con, present, template, 0, PER_TEMPLATE).skipped is None
        finally:
            con.close()


def test_threshold_quantiles_in_batches_of_items_are_those_of_one_query(con, monkeypatch):
    """quantile_cont cannot spill, so items are measured in batches bounded by their value count;
    the cut-offs drawn must not depend on the batching."""
    from pipeline.questions import samplers

    lab = samplers.SOURCES["lab"]
    labels = [label for label, in con.execute(
        f"SELECT {lab.entity} FROM {lab.from_sql} WHERE {lab.where} AND {lab.numeric} IS NOT NULL "
        f"GROUP BY ALL ORDER BY count(*) DESC, 1 LIMIT 12").fetchall()]
    given = [{"lab_label": label} for label in labels * 3]

    def cut_offs():
        return samplers.threshold(con, np.random.default_rng(7), given, item="lab_label")
    whole = cut_offs()
    seen = []
    original = samplers._batches
    monkeypatch.setattr(samplers, "_batches", lambda counts, most: seen.append((counts, original(counts, most))) or seen[-1][1])
    most = max(n for _, n in con.execute(
        f"SELECT {lab.entity}, count(*) FROM {lab.from_sql} WHERE {lab.where} AND {lab.numeric} IS NOT NULL "
        f"AND {lab.entity} IN (SELECT unnest(?)) GROUP BY ALL", [labels]).fetchall())
    monkeypatch.setattr(samplers, "QUANTILE_VALUES", most)
    assert cut_offs() == whole and None not in whole
    counts, batches = seen[-1]
    assert [k for b in batches for k in b] == sorted(labels)
    assert 1 < len(batches) < len(labels)  # several batches, some of several items
    assert all(sum(dict(counts)[k] for k in b) <= most for b in batches)


COLUMNAR_CANDIDATES = 12


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: t.id)
def test_columnar_rows_are_those_of_each_rendered_query(con, template):
    """One LATERAL statement over the slot table stands for each candidate's rendered SQL: same
    evidence rows, same normalised gold answer (sums may differ in the last bit: their order).
    Where it does not run (list answers, whose row order a join does not keep), one UNION ALL of
    the rendered queries gives each one's rows in its own order."""
    cands, _ = draw_candidates(con, template, np.random.default_rng(3), COLUMNAR_CANDIDATES)
    if len(cands) < 2:
        pytest.skip("the demo has no slot values for this template (no chartevents)")
    slots = dict(enumerate(cands))
    rendered = {i: render(template, s)[1:] for i, s in slots.items()}
    evidence = columnar(con, template, slots, 1, "q.table_name, q._rid")
    assert evidence is not None, "the template's evidence SQL does not run columnar"
    got = sorted(zip(*(c.to_pylist() for c in evidence.columns)))
    want = sorted((i, t, r) for i, (_, ev) in rendered.items() for t, r in con.execute(ev).fetchall())
    assert got == want
    if template.answer_type != "list":
        assert columnar(con, template, slots, 0) is not None, "the template's gold SQL does not run columnar"
    rows = template_rows(con, template, slots, {i: gold for i, (gold, _) in rendered.items()})
    for i, (gold, _) in rendered.items():
        assert _answer(rows[i], template) == _answer(con.execute(gold).fetchall(), template), slots[i]


def test_population_templates_over_large_tables_run_as_rendered(con, monkeypatch):
    """A population query reads a whole table per candidate: over a table larger than the limit,
    the joined plan would grow with table times candidates, so each candidate runs as rendered."""
    by_id = {t.id: t for t in TEMPLATES}
    population, patient = by_id["lab_patients_tested_with_diagnosis"], by_id["lab_count_first_days"]
    for template in (population, patient):
        counts = [con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in template.tables_needed()]
        assert generate.largest_read(con, template) == max(counts)
    monkeypatch.setattr(generate, "COLUMNAR_POPULATION_ROWS", generate.largest_read(con, population) - 1)
    slots = {i: s for i, s in enumerate(draw_candidates(con, population, np.random.default_rng(3), 4)[0])}
    assert len(slots) > 1 and columnar(con, population, slots, 1, "q._rid") is None
    slots = {i: s for i, s in enumerate(draw_candidates(con, patient, np.random.default_rng(3), 4)[0])}
    assert len(slots) > 1 and columnar(con, patient, slots, 1, "q._rid") is not None


def test_unions_run_in_chunks_and_a_failing_chunk_only_its_own_queries_alone(con, monkeypatch):
    """Many queries run :data:`~pipeline.questions.generate.UNION_QUERIES` to a statement (past
    about 30 that share subplans, DuckDB 2.0 slowed 60x); each query gets its own rows, in order.
    A statement DuckDB refuses leaves out its own chunk, whose queries gold_rows then asks alone."""
    template = next(t for t in TEMPLATES if t.id == "med_top_drugs_with_diagnosis")
    cands, _ = draw_candidates(con, template, np.random.default_rng(3), 6)
    n = generate.UNION_QUERIES
    gold = {i: render(template, {**cands[i % len(cands)], "top_n": 3 + i % 3})[1] for i in range(2 * n + n // 2)}
    statements, batched = [], generate.batched_rows
    monkeypatch.setattr(generate, "batched_rows", lambda con, q: statements.append(list(q)) or batched(con, q))
    alone = {i: con.execute(sql).fetchall() for i, sql in gold.items()}
    assert any(len(rows) > 1 for rows in alone.values())  # a list answer: the order matters
    assert generate.gold_rows(con, template, gold) == alone
    assert [len(s) for s in statements] == [n, n, n // 2] and sum(statements, []) == list(gold)
    broken = {**gold, n + 1: "SELECT no_such_column FROM prescriptions"}
    assert set(generate.union_rows(con, broken)) == set(gold) - set(range(n, 2 * n))
    with pytest.raises(duckdb.Error, match="no_such_column"):
        generate.gold_rows(con, template, broken)


def _answer(rows, template):
    try:
        return normalise(rows, template.answer_type)
    except AnswerError as exc:
        return exc.reason


def test_slots_jinja_reads_or_a_limit_takes_are_rendered_as_values(tmp_path):
    (tmp_path / "t.yaml").write_text(GOOD.format(tid="lab_top", sampler="patient", gold="label", answer_type="list")
                                     .replace("WHERE subject_id", "WHERE {% if lab_label == 'x' %}TRUE AND {% endif %}"
                                              "subject_id")
                                     .replace('}}"\n  evidence', '}} LIMIT {{ subject_id }}"\n  evidence'))
    (template,) = load_templates(tmp_path)
    assert literal_slots(template) == {"lab_label", "subject_id"}
    gold, evidence = render_columnar(template, {"lab_label": "x", "subject_id": 7})
    assert gold.endswith("WHERE TRUE AND subject_id = 7 LIMIT 7") and "_slots" not in gold
    _, evidence = render_columnar(template, {"lab_label": "y"} | {"subject_id": 7})
    assert evidence.endswith("WHERE subject_id = 7")
    (plain,) = load_templates(_write(tmp_path / "plain", GOOD.format(tid="lab_last", sampler="patient",
                                                                      gold="max(valuenum)", answer_type="number")))
    assert literal_slots(plain) == set()
    assert render_columnar(plain, {})[0].endswith('WHERE subject_id = _slots."slot_subject_id"')


def _write(directory, text):
    directory.mkdir()
    (directory / "t.yaml").write_text(text)
    return directory


def test_a_sum_at_a_rounding_edge_is_asked_as_rendered(con, monkeypatch):
    """The last bit of a float sum depends on the order it was added in: where that could move
    its 2-decimal rounding, the rendered query answers, not the columnar plan."""
    import pipeline.questions.generate as generate

    template = next(t for t in TEMPLATES if t.answer_type == "number" and t.level == "patient")
    cands, _ = draw_candidates(con, template, np.random.default_rng(0), 12)
    slots = dict(enumerate(cands[:3]))
    gold = {i: render(template, s)[1] for i, s in slots.items()}
    edge = [(0, 1.0049999999999999), (1, 1.0051), (2, None)]
    monkeypatch.setattr(generate, "columnar_rows", lambda *a, **k: edge)
    asked = []
    original = generate.gold_rows
    monkeypatch.setattr(generate, "gold_rows", lambda c, t, g: asked.append(sorted(g)) or original(c, t, g))
    rows = generate.template_rows(con, template, slots, gold)
    assert asked == [[0]]
    assert rows[0] == con.execute(gold[0]).fetchall() and rows[1] == [(1.0051,)] and rows[2] == [(None,)]

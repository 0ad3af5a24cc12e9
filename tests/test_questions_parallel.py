"""Question generation does not depend on the number of worker processes; worker errors name the template."""

import pytest

from pipeline.questions import generate_questions, load_templates

SUBSET = [t for t in load_templates() if t.id in ("enc_admission_count", "lab_max_value_last_admission",
                                                   "med_ever_prescribed", "dx_patients_with_diagnosis")]


def test_same_bytes_with_one_or_two_workers(demo_staged, tmp_path):
    paths = [tmp_path / f"w{w}.parquet" for w in (1, 2)]
    for w, path in zip((1, 2), paths):
        generate_questions(demo_staged, 0, SUBSET, per_template=5, out=path, workers=w)
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_worker_error_names_template(demo_staged):
    broken = SUBSET[0]
    broken = type(broken)(**{**broken.__dict__, "answer_type": "no_such_type", "_compiled": {}})
    with pytest.raises(ValueError) as err:
        generate_questions(demo_staged, 0, [broken, *SUBSET[1:]], per_template=2, workers=2)
    assert broken.id in "".join(getattr(err.value, "__notes__", []))


def test_slot_pools_feed_generation_unchanged(demo_staged):
    """Generating from the audited slot pools gives exactly what drawing in place gives."""
    from pipeline.questions.generate import generate_questions, slot_pools

    templates = load_templates()[:12]
    pools, skipped = slot_pools(demo_staged, 5, templates, per_template=4)
    assert pools.num_rows and set(pools.column("template_id").to_pylist()) | set(skipped) == {t.id for t in templates}
    direct, _ = generate_questions(demo_staged, 5, templates, per_template=4, workers=1)
    pooled, _ = generate_questions(demo_staged, 5, templates, per_template=4, workers=2, pools=pools)
    assert direct.equals(pooled) and direct.num_rows > 0

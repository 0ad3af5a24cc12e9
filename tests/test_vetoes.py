"""Reviewer vetoes: the file format, and selection dropping exactly what they name."""

from __future__ import annotations

import pytest

from pipeline.noise.select import select_pairs
from pipeline.noise.vetoes import VETOES_FILE, Veto, VetoError, Vetoes, load_vetoes
from pipeline.questions.templates import INTENTS

LEVELS = ("record", "value", "query")


def _pairs() -> list[dict]:
    """Verified candidates over every intent and noise level, two templates per intent."""
    return [{"pair_id": f"{intent}-{t}-{q}-{level}", "question_id": f"{intent}-{t}-{q}",
             "template_id": f"{intent}-{t}", "intent": intent, "level": "population" if t else "patient",
             "noise_level": level, "operator": f"op_{level}", "verified": True,
             "noisy_question": f"q {intent} {t} {q} {level}", "naive_sql": "SELECT 1",
             "answer_type": "number", "clean_answer": "1"}
            for intent in INTENTS for t in range(2) for q in range(6) for level in LEVELS]


def test_the_projects_vetoes_file_is_an_empty_list():
    assert load_vetoes(VETOES_FILE) == Vetoes()
    assert load_vetoes(None) == Vetoes() and load_vetoes("no/such/file.yaml") == Vetoes()


def test_entries_load_and_bad_ones_name_the_problem(tmp_path):
    path = tmp_path / "vetoes.yaml"
    path.write_text("- pair_id: 00ff\n  reason: wrong row\n"
                    "- template_id: lab_last_value\n  operator: unit_scale\n  reason: plausible\n")
    assert load_vetoes(path).entries == (Veto("wrong row", pair_id="00ff"),
                                         Veto("plausible", template_id="lab_last_value", operator="unit_scale"))
    for text, message in [("- pair_id: x\n", "needs a reason"),
                          ("- reason: r\n", "either pair_id"),
                          ("- pair_id: x\n  operator: unit_scale\n  reason: r\n", "either pair_id"),
                          ("- template_id: t\n  reason: r\n", "both template_id and operator"),
                          ("- template_id: t\n  operator: nope\n  reason: r\n", "unknown operator"),
                          ("- pair_id: x\n  reason: r\n  why: y\n", "unknown keys"),
                          ("pair_id: x\n", "a list")]:
        path.write_text(text)
        with pytest.raises(VetoError, match=message):
            load_vetoes(path)


def test_no_vetoes_change_nothing():
    pairs = _pairs()
    assert select_pairs(pairs, 3, 80, vetoes=Vetoes()) == select_pairs(pairs, 3, 80)


def test_a_vetoed_pair_is_replaced_and_nothing_else_moves():
    pairs = _pairs()
    before = select_pairs(pairs, 3, 80)
    vetoed = before[len(before) // 2]
    vetoes = Vetoes((Veto("test", pair_id=vetoed["pair_id"]),))
    after = select_pairs(pairs, 3, 80, vetoes=vetoes)
    ids_before, ids_after = {p["pair_id"] for p in before}, {p["pair_id"] for p in after}
    assert vetoed["pair_id"] not in ids_after
    assert ids_before - {vetoed["pair_id"]} <= ids_after
    assert all(p["question_id"] == vetoed["question_id"] for p in after if p["pair_id"] not in ids_before)
    assert vetoes.report(pairs) == [{"pair_id": vetoed["pair_id"], "reason": "test", "acts_at": "selection", "removed": 1}]


def test_a_vetoed_family_is_never_selected():
    pairs = _pairs()
    family = Veto("test", template_id="laboratory-0", operator="op_value")
    after = select_pairs(pairs, 3, 80, vetoes=Vetoes((family,)))
    assert not [p for p in after if family.matches(p)]
    assert [p for p in after if p["template_id"] == "laboratory-0"]  # the template's other operators stay

"""Every paraphrase of every template reads grammatically for the values its slots can take:
counts agree with their nouns ("1 day", "2 days"), "a"/"an" follow the sound of the next word,
and no word is doubled ("Output output").

Each text slot is rendered with real MIMIC-IV names chosen to trip the rules (vowels, acronyms,
names ending in the word the template adds); each choice slot with every value it declares
(which include 1 and 2 wherever a count can be 1 or 2), other numbers with 1, 2 and a decimal.
"""

from __future__ import annotations

import re

import pytest

from pipeline.questions.templates import article, load_templates, plural, render, with_word

# Representative values per sampler, each with the article a careful writer puts before it.
NAMES: dict[str, list[tuple[str, str]]] = {
    "lab_item": [("Albumin", "an"), ("Urea Nitrogen", "a"), ("Hemoglobin", "a"), ("Eosinophils", "an"),
                 ("pH", "a")],
    "chart_item": [("O2 saturation pulseoxymetry", "an"), ("Heart Rate", "a"),
                   ("Arterial Blood Pressure mean", "an"), ("Non Invasive Blood Pressure systolic", "a")],
    "output_item": [("Foley", "a"), ("TF Residual Output", "a"), ("Ostomy (output)", "an"), ("OR Urine", "an")],
    "input_item": [("Insulin - Regular", "an"), ("Heparin Sodium", "a"), ("Albumin 25%", "an")],
    "datetime_item": [("Arterial Line Insertion Date", "an"), ("Last Dialysis", "a")],
    "icu_procedure": [("Invasive Ventilation", "an"), ("Dialysis - CRRT", "a"), ("EKG", "an")],
    "drug": [("Acetaminophen", "an"), ("Furosemide", "a")],
    "emar_medication": [("Heparin", "a"), ("Ondansetron", "an")],
    "diagnosis": [("Acute kidney failure, unspecified", "an"), ("Unspecified essential hypertension", "an"),
                  ("Hyperlipidemia, unspecified", "a")],
    "icd_procedure": [("Insertion of endotracheal airway into trachea, via natural or artificial opening", "an"),
                      ("Venous catheterization, not elsewhere classified", "a")],
    "hcpcs": [("Critical care, first hour", "a")],
    "organism": [("ESCHERICHIA COLI", "an"), ("STAPH AUREUS COAG +", "a"), ("YEAST", "a")],
    "specimen": [("URINE", "a"), ("MRSA SCREEN", "an"), ("SWAB", "a"), ("ABSCESS", "an"), ("BLOOD CULTURE", "a")],
    "careunit": [("Medical Intensive Care Unit (MICU)", "a"), ("Neuro Stepdown", "a")],
    "admission_type": [("EW EMER.", "an"), ("ELECTIVE", "an"), ("URGENT", "an"), ("SURGICAL SAME DAY ADMISSION", "a")],
}
NAMES |= {"lab_item_icu": NAMES["lab_item"], "icu_procedure_timed": NAMES["icu_procedure"],
          "positive_specimen": NAMES["specimen"], "resistant_organism": NAMES["organism"]}
NUMBERS = {"patient": [10000032], "admission": [20000019], "icu_stay": [30000484], "year": [2150],
           "event_year": [2150], "threshold": [1, 2, 7.5]}
ARTICLE_OF = {name: a for values in NAMES.values() for name, a in values}

COUNTED = ("day", "hour", "month", "time", "year", "week", "minute", "dose", "order", "diagnosis")
PLURALS = {"diagnosis": "diagnoses"}


def _values(sampler: str, params: dict) -> list:
    if sampler == "choice":
        return list(params["values"])
    if sampler in NUMBERS:
        return NUMBERS[sampler]
    return [name for name, _ in NAMES[sampler]]


def _renderings():
    """(template id, variant, text) for every paraphrase, each slot taking each of its values."""
    for t in load_templates():
        pools = {s.name: _values(s.sampler, s.params) for s in t.slots}
        for k in range(max(len(v) for v in pools.values())):
            slots = {name: values[k % len(values)] for name, values in pools.items()}
            for variant in range(len(t.questions)):
                yield t.id, variant, render(t, slots, variant)[0]


RENDERED = list(_renderings())


def _problems(text: str) -> list[str]:
    found = []
    for noun in COUNTED:
        many = PLURALS.get(noun, noun + "s")
        found += [f"1 {many}" for _ in re.finditer(rf"(?<![\d.,])\b1 {many}\b", text)]
        found += [m.group(0) for m in re.finditer(rf"(?<![\d.,])\b(?:[2-9]|[1-9]\d+) {noun}(?![\w-])", text)]
    found += [m.group(0) for m in re.finditer(r"\b([A-Za-z]+)\W+\1\b", text, re.IGNORECASE)]
    for m in re.finditer(r"\b(a|an|A|An) (\S.*)", text):
        art, rest = m.group(1).lower(), m.group(2)
        name = next((n for n in ARTICLE_OF if rest.startswith(n)), None)
        if name is not None:
            if art != ARTICLE_OF[name]:
                found.append(f"{art} {name}")
        elif (art == "a") == (rest[:1].lower() in "aeio"):  # plain words: by their first letter
            found.append(f"{art} {rest.split()[0]}")
    return found


def test_every_template_is_rendered():
    assert {tid for tid, _, _ in RENDERED} == {t.id for t in load_templates()}
    assert len(RENDERED) > 500


def test_no_grammar_problem_in_any_template_text():
    bad = [(tid, variant, problems, text) for tid, variant, text in RENDERED if (problems := _problems(text))]
    assert bad == [], bad[:5]


@pytest.mark.parametrize(("text", "problems"), [
    ("within 1 days of admission", ["1 days"]),
    ("in the first 2 hour of the stay", ["2 hour"]),
    ("the total TF Residual Output output", ["Output output"]),
    ("a Albumin result", ["a Albumin"]),
    ("an Heparin Sodium administration", ["an Heparin Sodium"]),
    ("an MRSA SCREEN specimen within 1 day, 2 days, 65 year-old", []),
    ("a order of an unit", ["a order"]),
])
def test_the_checks_catch_what_they_name(text, problems):
    """The rules above are not vacuous: each catches its mistake and passes correct English."""
    assert _problems(text) == problems


def test_filters():
    assert [plural(1, "day"), plural(2, "day"), plural(1, "diagnosis", "diagnoses"), plural(3, "diagnosis", "diagnoses")] \
        == ["1 day", "2 days", "1 diagnosis", "3 diagnoses"]
    assert [article(n) for n in ("Albumin", "Urea Nitrogen", "MRSA SCREEN", "URINE", "SWAB", "RBC", "O2 Flow")] \
        == ["an Albumin", "a Urea Nitrogen", "an MRSA SCREEN", "a URINE", "a SWAB", "an RBC", "an O2 Flow"]
    assert [with_word(n, "output") for n in ("Foley", "TF Residual Output", "Ostomy (output)")] \
        == ["Foley output", "TF Residual Output", "Ostomy (output)"]

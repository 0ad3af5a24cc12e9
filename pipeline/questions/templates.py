"""Question templates as data: load ``templates/*.yaml``, validate, and render.

Every problem is reported as a :class:`TemplateError` naming the file and template id, so a
contributor adding a template learns exactly what to fix. Question text renders slot values as
they are; SQL renders them only through the ``sql`` filter (a quoted literal) -- a bare
``{{ slot }}`` holding a string in SQL is refused at render time, so no value is ever spliced
into SQL unquoted. The ``noise:`` block becomes a :class:`NoiseSpec`; the operators it admits
must be registered (:mod:`pipeline.noise.registry`).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import jinja2
import jinja2.meta
import yaml

from pipeline.package_data import templates_dir
from pipeline.questions.samplers import SAMPLERS
from pipeline.schema import TABLES

INTENTS = ("encounters", "diagnoses", "procedures", "medications", "laboratory", "icu_monitoring")
QUESTION_LEVELS = ("patient", "population")  # what a question is about (noise levels: pipeline.noise.registry)
ANSWER_TYPES = ("number", "integer", "boolean", "text", "list", "set", "date", "datetime")
TEMPLATES_DIR = templates_dir()  # the repository's templates/, shipped as pipeline.templates

_REQUIRED = ("id", "intent", "level", "questions", "gold_sql", "evidence_sql", "slots",
             "answer_type", "requires", "noise")
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available: 10x faster
_ID = re.compile(r"^[a-z][a-z0-9_]*$")


class TemplateError(ValueError):
    """A template file or template is invalid; the message names the file and template id."""


class SqlLiteral(str):
    """Text already quoted for SQL by the ``sql`` filter."""


class SlotColumn:
    """A slot rendered as a column of the slot table (:data:`SLOT_TABLE`), not as its value: the
    SQL then answers every candidate of a template in one statement (:func:`render_columnar`).
    Arithmetic with numbers stays SQL; anything that needs the value itself in Jinja (a test, a
    comparison, text) raises :class:`NeedsValue` naming the slot, which is then rendered literally."""

    def __init__(self, slot: str, sql: str | None = None):
        self.slot, self.sql = slot, sql or f'{SLOT_TABLE}."{SLOT_PREFIX}{slot}"'

    def _operand(self, other) -> str:
        if isinstance(other, SlotColumn):
            return other.sql
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return repr(other)
        raise NeedsValue(self.slot)

    def __add__(self, other):
        return SlotColumn(self.slot, f"({self.sql} + {self._operand(other)})")

    def __radd__(self, other):
        return SlotColumn(self.slot, f"({self._operand(other)} + {self.sql})")

    def __sub__(self, other):
        return SlotColumn(self.slot, f"({self.sql} - {self._operand(other)})")

    def __rsub__(self, other):
        return SlotColumn(self.slot, f"({self._operand(other)} - {self.sql})")

    def _value(self, *_):
        raise NeedsValue(self.slot)

    __bool__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __str__ = __len__ = __iter__ = _value
    __hash__ = None  # type: ignore[assignment]


class NeedsValue(Exception):
    """Jinja used a :class:`SlotColumn`'s value, which only a literal rendering has."""

    def __init__(self, slot: str):
        super().__init__(slot)
        self.slot = slot


SLOT_TABLE = "_slots"  # the relation of slot sets a columnar rendering reads (one row per candidate)
SLOT_PREFIX = "slot_"  # its columns: never a MIMIC-IV column name an unqualified reference could mean
_LIMIT_SLOT = re.compile(r"\bLIMIT\s*\{\{\s*(\w+)\s*\}\}", re.IGNORECASE)  # DuckDB: no column in LIMIT


def sql_literal(value) -> SqlLiteral:
    """Quote a slot value as a DuckDB literal: strings with doubled quotes, numbers as is."""
    if isinstance(value, SlotColumn):
        return SqlLiteral(value.sql)
    if value is None:
        return SqlLiteral("NULL")
    if isinstance(value, bool):
        return SqlLiteral("TRUE" if value else "FALSE")
    if isinstance(value, (int, float)):
        return SqlLiteral(repr(value))
    if isinstance(value, dt.datetime):
        return SqlLiteral(f"TIMESTAMP '{value.isoformat(sep=' ')}'")
    if isinstance(value, dt.date):
        return SqlLiteral(f"DATE '{value.isoformat()}'")
    return SqlLiteral("'" + str(value).replace("'", "''") + "'")


def _finalize_sql(value):
    if isinstance(value, SlotColumn):
        return value.sql
    if isinstance(value, SqlLiteral) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    raise TemplateError(f"value {value!r} rendered into SQL without the |sql filter")


# Words starting with a vowel letter but a consonant sound, and letters whose name starts with a
# vowel sound (an acronym is read letter by letter: "an MRSA screen", "an NG tube").
_CONSONANT_SOUND = re.compile(r"^(uni|use|usu|ure|uri|uro|eu|one|once)", re.IGNORECASE)
_VOWEL_LETTER_NAMES = "AEFHILMNORSX"


def article(phrase) -> str:
    """``phrase`` with "a" or "an" by its first sound: "an Albumin", "a Urea Nitrogen", "an MRSA screen"."""
    text = str(phrase)
    letters = re.sub(r"[^A-Za-z]", "", text.split(" ", 1)[0])
    if len(letters) > 1 and letters.isupper() and _spelled_out(letters):
        vowel = letters[0] in _VOWEL_LETTER_NAMES
    else:
        vowel = (text[:1].lower() in "aeiou" and not _CONSONANT_SOUND.match(text)) or text.lower().startswith("hour")
    return f"{'an' if vowel else 'a'} {text}"


_ONSETS = {"bl", "br", "ch", "cl", "cr", "dr", "fl", "fr", "gl", "gr", "kl", "kn", "ph", "pl", "pr", "sc", "sh",
           "sk", "sl", "sm", "sn", "sp", "st", "sw", "th", "tr", "tw", "wh", "wr"}


def _spelled_out(capitals: str) -> bool:
    """An all-capitals word read letter by letter (MRSA, RBC, NG) rather than as a word (URINE, SWAB):
    no vowel, or two leading consonants no English word starts with."""
    if not re.search("[AEIOU]", capitals):
        return True
    return capitals[0] not in "AEIOU" and capitals[1] not in "AEIOU" and capitals[:2].lower() not in _ONSETS


def plural(count, singular: str, plural_form: str | None = None) -> str:
    """``count`` with its noun in agreement: "1 day", "2 days", "1 diagnosis", "3 diagnoses"."""
    return f"{count} {singular if count == 1 else plural_form or singular + 's'}"


def with_word(phrase, word: str) -> str:
    """``phrase`` followed by ``word`` unless it already ends in it: "Foley output" but
    "TF Residual Output", "Ostomy (output)" -- never "Output output"."""
    last = re.findall(r"[A-Za-z]+", str(phrase))[-1:]
    return str(phrase) if last and last[0].lower() == word.lower() else f"{phrase} {word}"


_TEXT_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False)
_TEXT_ENV.filters.update(article=article, plural=plural, with_word=with_word)
_SQL_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, finalize=_finalize_sql)
_SQL_ENV.filters["sql"] = sql_literal


@dataclass(frozen=True)
class Slot:
    name: str
    sampler: str
    params: dict


@dataclass(frozen=True)
class EntitySlot:
    """The slot naming a dictionary entry (a lab, drug, diagnosis) and where such names live."""

    slot: str
    dictionary: str  # the table holding the names
    column: str  # its column of names


@dataclass(frozen=True)
class NoiseSpec:
    """A template's ``noise:`` block: where its answer's evidence lives and which operators it admits."""

    evidence_table: str
    operators: tuple[str, ...]
    value_column: str | None = None  # default: the evidence table's value column (pipeline.plausibility)
    time_column: str | None = None  # default: the evidence table's time column
    entity_slot: EntitySlot | None = None
    window: tuple[str, ...] = ()  # slots bounding the question in time (e.g. a year)


@dataclass
class Template:
    id: str
    intent: str
    level: str
    questions: list[str]
    gold_sql: str
    evidence_sql: str
    slots: list[Slot]
    answer_type: str
    requires: list[str]
    noise: NoiseSpec
    source_file: str = ""
    _compiled: dict = field(default_factory=dict, repr=False)

    @property
    def slot_names(self) -> list[str]:
        return [s.name for s in self.slots]

    def tables_needed(self) -> set[str]:
        """Declared ``requires`` plus what the slot samplers read."""
        needed = set(self.requires)
        for s in self.slots:
            needed.update(SAMPLERS[s.sampler].tables(s.params))
        return needed


def render(template: Template, slots: dict, variant: int = 0) -> tuple[str, str, str]:
    """(question, gold_sql, evidence_sql) of ``template`` with ``slots`` and paraphrase ``variant``.
    The noise stage re-renders with changed slots through this same function."""
    c = _compiled(template)
    try:
        return (" ".join(c["questions"][variant].render(slots).split()), *_render_sql(template, slots))
    except (jinja2.UndefinedError, TemplateError) as exc:
        raise TemplateError(f"{template.source_file}: template {template.id!r}: {exc}") from exc


def _compiled(template: Template) -> dict:
    c = template._compiled
    if not c:
        c["questions"] = [_TEXT_ENV.from_string(q) for q in template.questions]
        c["gold"] = _SQL_ENV.from_string(template.gold_sql)
        c["evidence"] = _SQL_ENV.from_string(template.evidence_sql)
    return c


def literal_slots(template: Template) -> frozenset[str]:
    """The slots a columnar rendering must render as values: those in a ``LIMIT`` (DuckDB takes no
    column there) and those Jinja itself reads (a test, a comparison); found once per template."""
    c = _compiled(template)
    if "literal" not in c:
        literal = {m for sql in (template.gold_sql, template.evidence_sql) for m in _LIMIT_SLOT.findall(sql)}
        while True:
            try:
                render_columnar(template, dict.fromkeys(literal, 1))  # any value: only columns are probed
                break
            except NeedsValue as exc:
                literal.add(exc.slot)
            except (jinja2.UndefinedError, TypeError, TemplateError):  # needs every slot's value
                literal = set(template.slot_names)
                break
        c["literal"] = frozenset(literal)
    return c["literal"]


def _render_sql(template: Template, slots: dict) -> tuple[str, str]:
    c = _compiled(template)
    return c["gold"].render(slots).strip(), c["evidence"].render(slots).strip()


def render_columnar(template: Template, literal: dict) -> tuple[str, str]:
    """(gold_sql, evidence_sql) reading every slot but the :func:`literal_slots` (given in
    ``literal``) as a column of :data:`SLOT_TABLE`: run as ``FROM _slots, LATERAL (sql)``, one
    statement answers all candidates sharing those literal values (DuckDB decorrelates it into
    joins: one scan of the data instead of one per candidate)."""
    columns = {s: SlotColumn(s) for s in template.slot_names if s not in literal}
    return _render_sql(template, {**columns, **literal})


def load_templates(directory: str | Path | None = None) -> list[Template]:
    """All templates of ``directory`` (default: the repository's ``templates/``), sorted by id."""
    directory = Path(directory) if directory is not None else TEMPLATES_DIR
    files = sorted(directory.glob("*.yaml"))
    if not files:
        raise TemplateError(f"no template files (*.yaml) in {directory}")
    out: dict[str, Template] = {}
    for path in files:
        try:
            data = yaml.load(path.read_text(encoding="utf-8"), Loader=_YAML_LOADER)
        except yaml.YAMLError as exc:
            raise TemplateError(f"{path.name}: not valid YAML: {exc}") from exc
        if not isinstance(data, list):
            raise TemplateError(f"{path.name}: must be a YAML list of templates")
        for i, raw in enumerate(data):
            t = _parse(raw, path.name, i)
            if t.id in out:
                raise TemplateError(f"{path.name}: template {t.id!r}: duplicate id "
                                    f"(also in {out[t.id].source_file})")
            out[t.id] = t
    return [out[k] for k in sorted(out)]


def _parse(raw, file: str, index: int) -> Template:
    tid = raw.get("id") if isinstance(raw, dict) else None
    where = f"{file}: template {tid!r}" if tid else f"{file}: template #{index}"

    def fail(msg: str):
        raise TemplateError(f"{where}: {msg}")

    if not isinstance(raw, dict):
        fail("must be a mapping")
    missing = [k for k in _REQUIRED if k not in raw]
    unknown = sorted(set(raw) - set(_REQUIRED))
    if missing or unknown:
        fail("; ".join(([f"missing keys {missing}"] if missing else [])
                       + ([f"unknown keys {unknown}"] if unknown else [])))
    if not isinstance(tid, str) or not _ID.match(tid):
        fail("id must be snake_case")
    if raw["intent"] not in INTENTS:
        fail(f"intent {raw['intent']!r} is not one of {', '.join(INTENTS)}")
    if raw["level"] not in QUESTION_LEVELS:
        fail(f"level {raw['level']!r} is not one of {', '.join(QUESTION_LEVELS)}")
    if raw["answer_type"] not in ANSWER_TYPES:
        fail(f"answer_type {raw['answer_type']!r} is not one of {', '.join(ANSWER_TYPES)}")
    questions = raw["questions"]
    if not isinstance(questions, list) or len(questions) < 2 or not all(isinstance(q, str) for q in questions):
        fail("questions must be a list of at least 2 paraphrases")
    requires = raw["requires"]
    if not isinstance(requires, list) or any(r not in TABLES for r in requires):
        fail(f"requires must list MIMIC-IV tables; unknown: {[r for r in requires if r not in TABLES]}")

    slots = _parse_slots(raw["slots"], fail)
    names = {s.name for s in slots}
    for label, env, texts in (("questions", _TEXT_ENV, questions),
                              ("gold_sql", _SQL_ENV, [raw["gold_sql"]]),
                              ("evidence_sql", _SQL_ENV, [raw["evidence_sql"]])):
        for text in texts:
            if not isinstance(text, str):
                fail(f"{label} must be text")
            try:
                used = jinja2.meta.find_undeclared_variables(env.parse(text))
            except jinja2.TemplateSyntaxError as exc:
                fail(f"{label}: Jinja syntax error line {exc.lineno}: {exc.message}")
            if used - names:
                fail(f"{label} uses unknown slot(s) {sorted(used - names)}; slots are {sorted(names)}")
    if "_rid" in raw["gold_sql"]:
        fail("gold_sql must not use _rid (agents never see it)")
    noise = _parse_noise(raw["noise"], names, fail)
    return Template(tid, raw["intent"], raw["level"], questions, raw["gold_sql"], raw["evidence_sql"],
                    slots, raw["answer_type"], requires, noise, file)


def _parse_slots(raw, fail) -> list[Slot]:
    if not isinstance(raw, dict):
        fail("slots must be a mapping of slot name to {sampler: ..., params...}")
    slots: list[Slot] = []
    for name, spec in raw.items():
        if not isinstance(spec, dict) or "sampler" not in spec:
            fail(f"slot {name!r} must name a sampler")
        params = {k: v for k, v in spec.items() if k != "sampler"}
        sampler = SAMPLERS.get(spec["sampler"])
        if sampler is None:
            fail(f"slot {name!r}: unknown sampler {spec['sampler']!r}; known: {', '.join(sorted(SAMPLERS))}")
        bad = sorted(set(params) - sampler.param_names())
        if bad:
            fail(f"slot {name!r}: sampler {sampler.name!r} takes no parameter(s) {bad}; "
                 f"it takes {sorted(sampler.param_names())}")
        for ref in sampler.refs:
            if ref in params and params[ref] not in [s.name for s in slots]:
                fail(f"slot {name!r}: {ref}: {params[ref]!r} is not an earlier slot")
        slots.append(Slot(name, spec["sampler"], params))
    return slots


def _parse_noise(noise, names: set[str], fail) -> NoiseSpec:
    keys = [f.name for f in fields(NoiseSpec)]
    if not isinstance(noise, dict):
        fail("noise must be a mapping")
    unknown = sorted(set(noise) - set(keys))
    if unknown or "evidence_table" not in noise or "operators" not in noise:
        fail(f"noise needs evidence_table and operators; allowed keys {keys}; unknown {unknown}")
    table = noise["evidence_table"]
    if table not in TABLES:
        fail(f"noise.evidence_table {table!r} is not a MIMIC-IV table")
    for key in ("value_column", "time_column"):
        if noise.get(key) is not None and not TABLES[table].has(noise[key]):
            fail(f"noise.{key} {noise[key]!r} is not a column of {table}")
    # The registry is filled by the operator modules, which render templates: import it on use.
    from pipeline.noise.operators import OPERATORS

    operators = noise["operators"]
    if not isinstance(operators, list) or not operators:
        fail("noise.operators must be a non-empty list of operator names")
    unregistered = [o for o in operators if o not in OPERATORS]
    if unregistered:
        fail(f"noise.operators names unknown operator(s) {unregistered}; known: {', '.join(sorted(OPERATORS))}")
    entity = noise.get("entity_slot")
    if entity is not None:
        if (not isinstance(entity, dict) or set(entity) - {"slot", "dictionary", "column"}
                or entity.get("slot") not in names or entity.get("dictionary") not in TABLES):
            fail("noise.entity_slot must be {slot: <a slot>, dictionary: <table>, column: <column>}")
        entity = EntitySlot(entity["slot"], entity["dictionary"], entity.get("column", entity["slot"]))
    window = noise.get("window") or []
    if not isinstance(window, list):
        fail("noise.window must be a list of slots")
    if set(window) - names:
        fail(f"noise.window names unknown slot(s) {sorted(set(window) - names)}")
    return NoiseSpec(table, tuple(operators), noise.get("value_column"), noise.get("time_column"), entity,
                     tuple(window))

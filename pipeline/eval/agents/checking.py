"""The ``checking`` agent: a careful analyst with no labels, acting only through the gym's tools.

It reads the question, recognises which public question template it came from (the template
texts are project code, like a prompt library; the pair's labels are never read), recovers the
slot values and renders the template's gold SQL, the "obvious SQL" for the question. Before it
trusts that answer it probes the data with plain ``sql`` tool calls:

1. the patient exists; the named entity is in its dictionary (else a unique name within two
   edits is the one meant, or several names containing the word make it ambiguous); the year lies
   inside the record;
2. the rows the answer rests on (the template's evidence query, its rows numbered in SQL since
   ``_rid`` is hidden) exist, and pass the clean-evidence filter's own checks
   (:mod:`pipeline.questions.evidence`), with plausibility bounds re-derived from the visible data;
3. rows the query silently skips would enter its evidence once repaired: an unlinked row inside a
   stay (re-linked), a row without its time (its time taken from another time of the row).

A failed probe ends the episode with ``abstain`` when no answer is supported, or with ``flag``,
the discrepancy category and the answer the data still support: the gold SQL re-run on the
evidence table repaired in the same statement (duplicates dropped, bad rows set aside, a unit
converted back, a link restored).
"""

from __future__ import annotations

import itertools
import math
import random
import re
from dataclasses import dataclass
from functools import cache

import sqlglot
import yaml
from sqlglot import exp

from pipeline.eval.agent import Usage, register_agent
from pipeline.gym.env import Env
from pipeline.gym.models import Start
from pipeline.noise.operators.common import icd_reversioned, relinked, stay_fits, stay_known, stay_link
from pipeline.noise.operators.value import BY_UNIT, UNIT_CONVERSIONS
from pipeline.plausibility import BOUNDS_FILE, PARENT_TIME, RULES
from pipeline.questions.evidence import row_checks  # the filter's checks, one rule for both
from pipeline.questions.samplers import ENTITY_SAMPLERS, SOURCES
from pipeline.questions.templates import Template, load_templates, render, sql_literal
from pipeline.schema import ROW_ID, TABLES

# What each evidence-filter reason means for the agent: (flag category, behaviour, how to repair the
# answer). Abstentions carry no category: the gym accepts one without, and the cause of a gap (a
# deleted row, a blanked time, a question about something that never happened) is rarely certain.
VERDICTS: dict[str, tuple[str | None, str, str | None]] = {
    "missing_value": (None, "abstain", None),
    "missing_timestamp": (None, "abstain", None),
    "temporal_inversion": (None, "abstain", None),
    "duplicate_conflict": ("conflicting_duplicate", "flag", None),
    "duplicate_exact": ("duplicate_record", "flag", "dedupe"),
    "unit_mismatch": ("unit_mismatch", "flag", "convert"),
    "implausible_value": ("implausible_value", "flag", "implausible"),
    "value_text_conflict": ("value_text_conflict", "flag", "from_text"),
    "invalid_code": ("invalid_code", "flag", "reversion"),
    "orphan_link": ("broken_link", "flag", "relink"),
    "time_outside_stay": ("time_outside_stay", "flag", "set_aside"),
}
# Probes beyond the evidence rows, checked after the filter's reasons (same meaning as theirs).
SCOPE_REASONS = {"dangling_in_scope": "orphan_link", "unlinked_in_scope": "orphan_link",
                 "untimed_in_scope": "missing_timestamp",
                 "inverted_in_scope": "temporal_inversion", "invalid_code_in_scope": "invalid_code"}
RARE = 0.01  # a share of NULL links below which a NULL link is a broken one
ORDER = [*VERDICTS, *SCOPE_REASONS]
RID = "rid_"  # the row number the probes give each row (the gym hides _rid)
INT_SAMPLERS = {"patient", "year", "event_year", "admission", "icu_stay"}
UNIT_SLIPS = (10, 100, 1000)


# ---------------------------------------------------------------------------------- the question
@dataclass(frozen=True)
class Reading:
    """A question matched to the template and slot values it was rendered from."""

    template: Template
    variant: int
    slots: dict

    def sql(self, slots: dict | None = None) -> tuple[str, str]:
        """(gold SQL, evidence SQL) for these (or the given) slot values."""
        _, gold, evidence = render(self.template, slots or self.slots, self.variant)
        return gold, evidence


@cache
def _patterns() -> list[tuple[Template, int, re.Pattern, tuple[str, ...]]]:
    """Per template paraphrase: an anchored regex whose named groups are the plainly rendered slots
    (repeats back-referenced; any other expression matches anything), and the slots it uses only
    inside expressions (``{{ age + 9 }}``, ``{{ 'women' if gender == 'F' else 'men' }}``)."""
    out = []
    for template in load_templates():
        for variant, text in enumerate(template.questions):
            text, seen, parts, pos = " ".join(text.split()), set(), [], 0
            for m in re.finditer(r"\{\{\s*(.+?)\s*\}\}", text):
                parts.append(re.escape(text[pos:m.start()]))
                slot, shape = _slot_shape(m.group(1))
                if slot not in template.slot_names:
                    parts.append(".*?")
                else:
                    parts.append(shape.format(f"(?P={slot})" if slot in seen else f"(?P<{slot}>.+?)"))
                    seen.add(slot)
                pos = m.end()
            parts.append(re.escape(text[pos:]))
            hidden = tuple(s for s in template.slot_names if s not in seen and re.search(rf"\b{s}\b", text))
            out.append((template, variant, re.compile("".join(parts), re.S), hidden))
    return out


def _slot_shape(expression: str) -> tuple[str, str]:
    """The slot an expression renders and the regex around its value (``{}``): a bare slot, or one
    through the question grammar's filters ("an Albumin", "3 days", "Foley output")."""
    m = re.fullmatch(r"(\w+)\s*\|\s*(\w+)\s*(?:\(\s*'([^']*)'\s*\))?", expression)
    if m is None:
        return expression, "{}"
    slot, name, word = m.groups()
    shapes = {"article": "an? {}", "plural": "{} \\S+", "with_word": "{}" + f"(?: {re.escape(word or '')})?"}
    return (slot, shapes[name]) if name in shapes else (expression, "{}")


def _typed(template: Template, slot: str, text: str):
    """The slot value ``text`` stands for, typed as its sampler draws it; None when it cannot be."""
    spec = next(s for s in template.slots if s.name == slot)
    if spec.sampler == "choice":
        return next((v for v in spec.params.get("values", []) if str(v) == text), None)
    try:
        if spec.sampler in INT_SAMPLERS:
            return int(text)
        if spec.sampler == "threshold":
            return float(text)
    except ValueError:
        return None
    return text


def read_question(question: str) -> list[Reading]:
    """Every template reading of ``question`` whose re-rendering gives the question back exactly,
    the most specific (most slots read from the text) first."""
    found = []
    for template, variant, pattern, hidden in _patterns():
        m = pattern.fullmatch(question)
        if not m:
            continue
        seen = {k: _typed(template, k, v) for k, v in m.groupdict().items()}
        if None in seen.values():
            continue
        choices = [next(s for s in template.slots if s.name == h) for h in hidden]
        if any(c.sampler != "choice" for c in choices):
            continue
        for values in itertools.product(*(c.params.get("values", []) for c in choices)):
            slots = {**seen, **dict(zip(hidden, values))}
            try:
                if render(template, slots, variant)[0] == question:
                    found.append((len(seen), Reading(template, variant, slots)))
                    break
            except (ValueError, TypeError):
                continue
    return [r for _, r in sorted(found, key=lambda f: -f[0])]


# ---------------------------------------------------------------------------------- SQL rewriting
def _parse(sql: str) -> exp.Expr:
    return sqlglot.parse_one(sql, read="duckdb")


def _ctes(tree: exp.Expr) -> set[str]:
    return {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}


def _swap_tables(tree: exp.Expr, names: dict[str, str]) -> exp.Expr:
    """``tree`` reading table ``t`` from ``names[t]`` (keeping its alias) and ``_rid`` as ``rid_``."""
    own = _ctes(tree)

    def swap(node):
        if (isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier)
                and node.name.lower() in names and node.name.lower() not in own):
            alias = node.alias or node.name  # a parenthesised join keeps its joins (the node's other args)
            node.set("this", exp.to_identifier(names[node.name.lower()]))
            node.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
            return node
        if isinstance(node, exp.Identifier) and node.name == ROW_ID:
            return exp.to_identifier(RID)
        return node
    return tree.transform(swap)


def _with(ctes: list[str], body: str) -> str:
    """``body`` (a query, maybe with its own WITH) run after ``ctes`` (``name AS (...)`` texts)."""
    return f"WITH {', '.join(ctes)}, _q AS ({body}) SELECT * FROM _q"


def _evidence_tables(tree: exp.Expr) -> list[str]:
    """Tables the evidence query names in the first column of its SELECTs (``'labevents' AS table_name``)."""
    names = set()
    for select in tree.find_all(exp.Select):
        first = select.expressions[0] if select.expressions else None
        first = first.this if isinstance(first, exp.Alias) else first
        if isinstance(first, exp.Literal) and first.is_string and first.name in TABLES:
            names.add(first.name)
    return sorted(names)


def _inside_stay(time: str, alias: str, parent: str) -> str:
    if parent == "admissions":
        return f"{alias}.{time} BETWEEN least(p.admittime, coalesce(p.edregtime, p.admittime)) AND p.dischtime"
    return f"{alias}.{time} BETWEEN p.intime AND p.outtime"


@cache
def _curated_bounds(table: str) -> str:
    """The curated bounds of ``table``'s items as VALUES rows (a never-matching row when it has none)."""
    rows = [r for r in yaml.safe_load(BOUNDS_FILE.read_text(encoding="utf-8")) if r["table"] == table]
    return ", ".join(f"({sql_literal(r['table'])}, {sql_literal(r['label'])}, {float(r['low'])}, {float(r['high'])})"
                     for r in rows) or f"('{table}', NULL, NULL, NULL)"


def _bounds_ctes(table: str) -> str:
    """``_bounds_<table>``: the curated plausibility table, else ten times the largest *other* value
    of the item (leave-one-out, so a slipped value cannot widen its own bound), as the filter derives
    them; over the items of the evidence rows ``e_<table>``."""
    rule = RULES[table]
    v = rule.value
    return f"""_curated_{table}("table", label, low, high) AS (VALUES {_curated_bounds(table)}),
    _vals_{table} AS (SELECT d.label, t.{v} AS v FROM {table} t JOIN {rule.items} d ON d.itemid = t.itemid
              WHERE t.{v} IS NOT NULL AND d.label IN (SELECT d2.label FROM e_{table} e JOIN {rule.items} d2
                                                      ON d2.itemid = e.itemid)),
    _lim_{table} AS (SELECT label, max(v) AS mx, min(v) AS mn FROM _vals_{table} GROUP BY label),
    _derived_{table} AS (SELECT '{table}' AS "table", l.label,
        CASE WHEN (CASE WHEN count(*) FILTER (WHERE x.v = l.mn) > 1 THEN l.mn
                        ELSE min(x.v) FILTER (WHERE x.v > l.mn) END) >= 0 THEN 0.0 END AS low,
        10 * (CASE WHEN count(*) FILTER (WHERE x.v = l.mx) > 1 THEN l.mx
                   ELSE max(x.v) FILTER (WHERE x.v < l.mx) END) AS high
      FROM _vals_{table} x JOIN _lim_{table} l ON l.label = x.label GROUP BY l.label, l.mn, l.mx),
    _bounds_{table} AS (SELECT * FROM _curated_{table} UNION ALL SELECT * FROM _derived_{table}
                        WHERE label NOT IN (SELECT label FROM _curated_{table} WHERE "table" = '{table}'))"""


def _levenshtein(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


# ---------------------------------------------------------------------------------- the episode
class _Done(Exception):
    """The episode ended (a terminal tool call was made)."""


class Episode:
    """One episode of the checking agent: probes through ``env.step`` until it answers, abstains or flags."""

    def __init__(self, env: Env, start: Start):
        self.env, self.start = env, start
        self.present = {t.name for t in start.tables}
        self.patient: int | None = None  # the question's patient, once read
        self.slip: str | None = None  # "unit_error" once every implausible value proved a decimal slip

    # ------------------------------------------------------------------ tools
    def rows(self, query: str) -> list[list[str]] | None:
        """The rows the sql tool shows (cells as text), or None when the query failed."""
        obs = self.env.step({"name": "sql", "arguments": {"query": query}})
        if obs.done:
            raise _Done
        lines = obs.content.split("\n")
        if lines[0].startswith("error:"):
            return None
        return [line.split(" | ") for line in lines[1:-1]]

    def finish(self, tool: str, probe: str | None = None, why: str = "", **arguments) -> None:
        """End the episode; an abstention or flag names the probe that failed and why."""
        if probe is not None:
            arguments["reason" if tool == "abstain" else "evidence"] = f"probe {probe}: {why}"
        self.env.step({"name": tool, "arguments": {k: v for k, v in arguments.items() if v is not None}})
        raise _Done

    def answer_of(self, query: str, answer_type: str):
        """The answer a query's rows give (first column), as :mod:`pipeline.gym.agents` reads them."""
        rows = self.rows(query)
        values = [r[0] for r in rows or [] if r[0] != "NULL"]
        if answer_type in ("list", "set"):
            return [v for v in values if v != ""]
        return values[0] if values else None

    # ------------------------------------------------------------------ the plan
    def run(self) -> None:
        readings = read_question(self.start.question)
        if not readings:
            self.finish("abstain", "unknown_question", "the question matches no question this agent knows how to check")
        reading = self.check_names(self.prefer(readings))
        gold, evidence = reading.sql()
        patient = next((s.name for s in reading.template.slots if s.sampler == "patient" and s.name in reading.slots),
                       None)
        self.patient = int(reading.slots[patient]) if patient else None
        found, tables = self.probe_evidence(evidence)
        if found is not None:  # (a probe the database refused leaves only the answer)
            for reason in ORDER:
                if reason in found and ("evidence" in found or reason in SCOPE_REASONS):
                    self.conclude(reading, reason, gold, evidence, tables)
            if "evidence" not in found:
                self.finish("abstain", "no_evidence", "no record supports an answer to this question")
        value = self.answer_of(gold, reading.template.answer_type)
        if value is None or value == []:
            self.finish("abstain", "empty_answer", "the query returns nothing")
        self.finish("answer", value=value)

    def prefer(self, readings: list[Reading]) -> Reading:
        """Of equally specific readings, the first whose named entity occurs where its template draws it."""
        tied = [r for r in readings if len(r.slots) == len(readings[0].slots)]
        for r in tied if len(tied) > 1 else []:
            entity = r.template.noise.entity_slot
            for spec in r.template.slots:
                source = SOURCES.get(ENTITY_SAMPLERS.get(spec.sampler, ""))
                if (entity and spec.name == entity.slot and source is not None
                        and self.count(f"SELECT count(*) FROM {source.from_sql} "
                                       f"WHERE {source.entity} = {sql_literal(r.slots[spec.name])}")):
                    return r
        return readings[0]

    def check_names(self, reading: Reading) -> Reading:
        """Patient, entity and year of the question exist in this database (abstain or resolve if not)."""
        t, slots = reading.template, reading.slots
        for s in t.slots:
            if s.sampler == "patient" and s.name in slots and not self.count(
                    f"SELECT count(*) FROM patients WHERE subject_id = {int(slots[s.name])}"):
                self.finish("abstain", "patient_exists", f"patient {slots[s.name]} is not in the database")
        entity = t.noise.entity_slot
        if entity is not None and isinstance(slots.get(entity.slot), str):
            resolved = self.resolve(reading, entity.slot, entity.dictionary, entity.column)
            reading = Reading(t, reading.variant, {**slots, entity.slot: resolved})
        for s in t.slots:
            if s.name in t.noise.window and s.sampler in ("year", "event_year"):
                patient = next((p.name for p in t.slots if p.sampler == "patient" and p.name in slots), None)
                who = f"subject_id = {int(slots[patient])} AND " if patient else ""
                if not self.count(f"SELECT count(*) FROM admissions WHERE {who}year(admittime) <= {int(slots[s.name])} "
                                  f"AND year(dischtime) >= {int(slots[s.name])}"):
                    self.finish("abstain", "year_in_record", f"no hospital stay covers {slots[s.name]}")
        return reading

    def count(self, query: str) -> int:
        rows = self.rows(query)
        return int(rows[0][0]) if rows else 0

    def resolve(self, reading: Reading, slot: str, dictionary: str, column: str) -> str:
        """The dictionary name the question means: itself, the unique name within two edits, or none."""
        name = reading.slots[slot]
        lit = sql_literal(name)
        rows = self.rows(f"SELECT count(*) FILTER (WHERE name = {lit}), "
                         f"count(*) FILTER (WHERE contains(lower(name), lower({lit}))) "
                         f"FROM (SELECT DISTINCT {column} AS name FROM {dictionary} WHERE {column} IS NOT NULL)")
        exact, containing = (int(x) for x in rows[0]) if rows else (1, 0)
        if exact:
            return name
        spaced = self.rows(f"SELECT DISTINCT {column} FROM {dictionary} "  # the question collapses whitespace
                           f"WHERE regexp_replace(trim({column}), '\\s+', ' ', 'g') = {lit} LIMIT 2")
        if spaced is not None and len(spaced) == 1:
            return spaced[0][0]
        if containing >= 2 and " " not in name:  # a single word several names share
            self.flag_readings(reading, slot, dictionary, column)
        lowered = name.lower()
        third = max(1, len(lowered) // 3)
        parts = sorted({lowered[:third], lowered[third:2 * third], lowered[2 * third:]} - {""})
        hits = " + ".join(f"contains(lower({column}), {sql_literal(p)})::INT" for p in parts)
        near = self.rows(f"SELECT {column} FROM (SELECT DISTINCT {column} FROM {dictionary} WHERE length({column}) "
                         f"BETWEEN {len(name) - 2} AND {len(name) + 2}) WHERE {hits} > 0 "
                         f"ORDER BY {hits} DESC, abs(length({column}) - {len(name)}), 1 LIMIT 20")
        close = [r[0] for r in near or [] if _levenshtein(r[0].lower(), lowered) <= 2]
        if len(close) == 1:
            return close[0]
        self.finish("abstain", "entity_exists", f"no {dictionary} entry is named {name!r}")
        raise AssertionError("unreachable")

    def flag_readings(self, reading: Reading, slot: str, dictionary: str, column: str) -> None:
        """Several names contain the word: answer for each reading that has data, and flag the ambiguity."""
        term = reading.slots[slot]
        names = [r[0] for r in self.rows(
            f"SELECT DISTINCT {column} FROM {dictionary} WHERE contains(lower({column}), lower({sql_literal(term)})) "
            f"AND lower({column}) <> lower({sql_literal(term)}) ORDER BY 1 LIMIT 8") or []]
        readings = []
        for name in names:
            gold, _ = reading.sql({**reading.slots, slot: name})
            value = self.answer_of(gold, reading.template.answer_type)
            if value is not None and value != []:
                readings.append([name, value])
        if len(readings) >= 2:
            self.finish("flag", "entity_ambiguous", f"{term!r} is part of {len(names)} {dictionary} names",
                        category="ambiguous_reference", answer=readings)

    # ------------------------------------------------------------------ the evidence
    def numbered(self, tables: list[str]) -> list[str]:
        """``<t>__r``: the table's rows numbered (as ``rid_``); only the patient's rows when the
        question is about one patient (its evidence is that patient's)."""
        return [f"{t}__r AS MATERIALIZED (SELECT *, row_number() OVER () AS {RID} FROM {t}"
                + (f" WHERE subject_id = {self.patient})" if self.patient is not None and TABLES[t].has("subject_id")
                   else ")")
                for t in tables]

    def probe_ctes(self, evidence: str) -> tuple[list[str], list[str], str] | None:
        """(CTEs, evidence tables, check union) of the probe: the numbered tables, ``ev`` (the evidence
        rows' numbers), per table its rows ``e_<t>`` and the filter's checks, plus the scope probes."""
        try:
            tree = _parse(evidence)
        except sqlglot.errors.ParseError:
            return None
        tables = [t for t in _evidence_tables(tree) if t in self.present]
        if not tables:
            return None
        ctes = self.numbered(tables)
        ctes.append(f"ev AS ({_swap_tables(tree, {t: f'{t}__r' for t in tables}).sql(dialect='duckdb')})")
        checks = [f"SELECT {RID} AS cand, 'evidence' AS reason FROM ev"]
        for t in tables:
            rule = RULES.get(t)
            ctes.append(f"e_{t} AS (SELECT {RID} AS cand, * EXCLUDE ({RID}) FROM {t}__r "
                        f"WHERE {RID} IN (SELECT {RID} FROM ev WHERE table_name = '{t}'))")
            if rule is None:
                continue
            if rule.items in self.present and rule.value:
                ctes.append(_bounds_ctes(t))
            for sql in row_checks(t, rule, self.present):
                check = _parse(sql).transform(lambda n, t=t: exp.Table(
                    this=exp.to_identifier(f"e_{t}"), alias=exp.TableAlias(this=exp.to_identifier("e")))
                    if isinstance(n, exp.Table) and n.name == "e" else
                    exp.Table(this=exp.to_identifier(f"_bounds_{t}"), alias=n.args.get("alias"))
                    if isinstance(n, exp.Table) and n.name == "_bounds" else n)
                checks.append(check.sql(dialect="duckdb"))
            checks.extend(self.scope_checks(tree, tables, t, rule, ctes))
        return ctes, tables, "\nUNION ALL\n".join(checks)

    def scope_checks(self, tree: exp.Expr, tables: list[str], table: str, rule, ctes: list[str]) -> list[str]:
        """Rows the evidence query skips that would enter it once repaired (re-linked, or timed from
        another time of the row), and rows of the numbered table whose code its dictionary lacks."""
        out = []
        if rule.codes in self.present:
            out.append(f"SELECT {RID}, 'invalid_code_in_scope' FROM {table}__r t ANTI JOIN {rule.codes} d "
                       "ON d.icd_code = t.icd_code AND d.icd_version = t.icd_version")
        elif rule.items in self.present and TABLES[table].has("itemid"):
            out.append(f"SELECT {RID}, 'invalid_code_in_scope' FROM {table}__r t ANTI JOIN {rule.items} d "
                       "ON d.itemid = t.itemid")
        dangling = self.dangling(table)
        if dangling is not None:
            out.append(f"SELECT {RID}, 'dangling_in_scope' FROM ({dangling})")
        for reason, repaired in (("unlinked_in_scope", self.null_relinked(table, rule)),
                                 ("untimed_in_scope", self.timed(table, rule)),
                                 ("inverted_in_scope", self.uninverted(table, rule))):
            if repaired is None:
                continue
            name = f"{table}__{reason}"
            ctes.append(f"{name} AS ({repaired})")
            swap = {**{t: f"{t}__r" for t in tables}, table: name}
            ctes.append(f"ev_{name} AS ({_swap_tables(tree, swap).sql(dialect='duckdb')})")
            out.append(f"SELECT {RID}, '{reason}' FROM (SELECT {RID} FROM ev_{name} WHERE table_name = '{table}' "
                       f"EXCEPT SELECT {RID} FROM ev WHERE table_name = '{table}')")
        return out

    def dangling(self, table: str) -> str | None:
        """The numbered table's rows whose stay link names no stay of their patient."""
        linked = stay_link(table)
        if linked is None or linked[1] not in self.present:
            return None
        link, parent = linked
        return f"SELECT * FROM {table}__r t WHERE t.{link} IS NOT NULL AND NOT {stay_known(link, parent)}"

    def null_relinked(self, table: str, rule) -> str | None:
        """The numbered table with a missing hadm_id/stay_id replaced by the stay its time lies in (a
        NULL hadm_id only where that is rare: MIMIC leaves outpatient labs unlinked)."""
        cols = TABLES[table]
        if not rule.time or "admissions" not in self.present or table in ("admissions", "icustays", "patients"):
            return None
        if cols.has("stay_id") and "icustays" in self.present and PARENT_TIME.get((table, rule.time)) == "icustays":
            return (f"SELECT t.* REPLACE (coalesce(t.stay_id, p.stay_id) AS stay_id) FROM {table}__r t "
                    f"LEFT JOIN icustays p ON t.stay_id IS NULL AND p.subject_id = t.subject_id "
                    f"AND {_inside_stay(rule.time, 't', 'icustays')}")
        if cols.has("hadm_id"):
            return (f"SELECT t.* REPLACE (coalesce(t.hadm_id, p.hadm_id) AS hadm_id) FROM {table}__r t "
                    f"LEFT JOIN admissions p ON t.hadm_id IS NULL AND p.subject_id = t.subject_id "
                    f"AND {_inside_stay(rule.time, 't', 'admissions')} "
                    f"AND (SELECT avg((hadm_id IS NULL)::INT) FROM {table}) < {RARE}")
        return None

    def relink(self, ctes: list[str], table: str, rule, scope_bad: str) -> str | None:
        """The numbered table re-linked: a link to no stay of the patient goes to the one stay that fits
        the row (the agent abstains when none or several do); else NULL links inside a stay are filled."""
        linked, dangling = stay_link(table), self.dangling(table)
        if linked and dangling and self.count(_with(ctes, f"SELECT count(*) FROM ({dangling})")):
            if self.count(_with(ctes, f"SELECT count(*) FROM ({dangling}) t WHERE (SELECT count(*) FROM "
                                      f"{linked[1]} p WHERE {stay_fits(table, rule.time)}) <> 1")):
                self.finish("abstain", "orphan_link", "a row links to no stay of its patient, and no single "
                            "stay of the patient fits it")
            return relinked(table, rule.time, source=f"{table}__r")
        nulls = self.null_relinked(table, rule)
        if nulls is None:
            return None
        return (f"SELECT * FROM ({nulls}) AS r WHERE {RID} IN {scope_bad} UNION ALL "
                f"SELECT * FROM {table}__r WHERE {RID} NOT IN {scope_bad}")

    def timed(self, table: str, rule) -> str | None:
        """The numbered table with a missing event time taken from the row's other times (or else
        its admission's start)."""
        if not rule.time:
            return None
        others = [f"t.{c.name}" for c in TABLES[table].columns
                  if c.name != rule.time and c.type in ("TIMESTAMP", "DATE")]
        stay = TABLES[table].has("hadm_id") and table != "admissions" and "admissions" in self.present
        if stay:
            others.append("a.admittime")
        if not others:
            return None
        kind = next(c.type for c in TABLES[table].columns if c.name == rule.time)
        return (f"SELECT t.* REPLACE (CAST(coalesce(t.{rule.time}, {', '.join(others)}) AS {kind}) AS {rule.time}) "
                f"FROM {table}__r t" + (" LEFT JOIN admissions a ON a.hadm_id = t.hadm_id" if stay else ""))

    def uninverted(self, table: str, rule) -> str | None:
        """The numbered table with a start after its end swapped back."""
        if not rule.time or not rule.end:
            return None
        swap = f"{rule.end} < {rule.time}"
        return (f"SELECT * REPLACE (CASE WHEN {swap} THEN {rule.end} ELSE {rule.time} END AS {rule.time}, "
                f"CASE WHEN {swap} THEN {rule.time} ELSE {rule.end} END AS {rule.end}) FROM {table}__r")

    def probe_evidence(self, evidence: str) -> tuple[set[str] | None, list[str]]:
        """(the reasons that fire, ``evidence`` when there is any evidence row; the evidence tables)."""
        built = self.probe_ctes(evidence)
        if built is None:
            return None, []
        ctes, tables, union = built
        query = _with(ctes, f"SELECT reason, count(*) AS n FROM ({union}) AS c GROUP BY reason ORDER BY reason")
        rows = self.rows(query)
        if rows is None:
            return None, tables
        return {r[0] for r in rows}, tables

    # ------------------------------------------------------------------ verdicts
    def conclude(self, reading: Reading, probe: str, gold: str, evidence: str, tables: list[str]) -> None:
        reason = SCOPE_REASONS.get(probe, probe)
        category, behavior, repair = VERDICTS[reason]
        if behavior == "abstain":
            self.finish("abstain", probe, f"the rows the answer rests on fail the {reason} check")
        answer = None
        if repair is not None:
            answer = self.repaired_answer(reading, reason, repair, gold, evidence, tables)
        category = self.slip or category
        self.finish("flag", probe, f"the rows the answer rests on fail the {reason} check", category=category,
                    answer=answer)

    def repaired_answer(self, reading: Reading, reason: str, repair: str, gold: str, evidence: str,
                        tables: list[str]):
        """The gold SQL re-run, in the probe's own statement, on the evidence table repaired."""
        built = self.probe_ctes(evidence)
        if built is None:
            return None
        ctes, _, union = built
        ctes.append(f"bad AS (SELECT reason, cand FROM ({union}) AS c)")
        t = reading.template.noise.evidence_table
        if t not in tables:
            return None
        rule = RULES[t]
        bad = f"(SELECT cand FROM bad WHERE reason = '{reason}')"
        scoped = ", ".join(f"'{r}'" for r in [reason, *(k for k, v in SCOPE_REASONS.items() if v == reason)])
        scope_bad = f"(SELECT cand FROM bad WHERE reason IN ({scoped}))"
        fixed: str | None
        if repair == "dedupe":
            key = ", ".join([*rule.key, *([rule.value] if rule.value else [])])
            fixed = f"SELECT * FROM {t}__r QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY {RID}) = 1"
        elif repair == "set_aside":
            fixed = f"SELECT * FROM {t}__r WHERE {RID} NOT IN {bad}"
        elif repair == "relink":
            fixed = self.relink(ctes, t, rule, scope_bad)
        elif repair == "reversion":
            fixed = self.reversioned(ctes, t, rule, scope_bad)
        elif repair == "from_text":  # MIMIC derives valuenum from the charted text: the text holds
            fixed = (f"SELECT * REPLACE (CASE WHEN {RID} IN {bad} THEN TRY_CAST({rule.text} AS DOUBLE) "
                     f"ELSE {rule.value} END AS {rule.value}) FROM {t}__r")
        elif repair == "convert":
            fixed = self.converted(ctes, t, rule)
        else:  # implausible: a decimal slip is scaled back, anything else set aside
            fixed = self.unslipped(ctes, t, rule)
        if fixed is None:
            return None
        ctes.append(f"{t}__fixed AS (SELECT * EXCLUDE ({RID}) FROM ({fixed}) AS f)")
        query = _with(ctes, _swap_tables(_parse(gold), {t: f"{t}__fixed"}).sql(dialect="duckdb"))
        value = self.answer_of(query, reading.template.answer_type)
        return None if value == [] else value

    def reversioned(self, ctes: list[str], table: str, rule, scope_bad: str) -> str | None:
        """Codes the dictionary lacks under their ICD version read under the only version that has
        them; None (no answer) when a code of the rows at fault stays unknown."""
        if not rule.codes or rule.codes not in self.present:
            return None
        fixed = icd_reversioned(f"{table}__r", rule.codes)
        if self.count(_with(ctes, f"SELECT count(*) FROM ({fixed}) t WHERE {RID} IN {scope_bad} AND NOT EXISTS "
                                  f"(SELECT 1 FROM {rule.codes} d WHERE d.icd_code = t.icd_code "
                                  "AND d.icd_version = t.icd_version)")):
            return None
        return fixed

    def converted(self, ctes: list[str], table: str, rule) -> str | None:
        """Rows in an unusual unit converted back to the item's usual unit, by a known conversion."""
        if not rule.unit or not rule.items or rule.items not in self.present:
            return None
        rows = self.rows(_with(ctes, (
            f"""SELECT DISTINCT e.itemid, d.label, e.{rule.unit}, (SELECT u.{rule.unit} FROM {table} u
                       WHERE u.itemid = e.itemid GROUP BY u.{rule.unit} ORDER BY count(*) DESC, u.{rule.unit} LIMIT 1)
                FROM e_{table} e JOIN {rule.items} d ON d.itemid = e.itemid
                WHERE e.cand IN (SELECT cand FROM bad WHERE reason = 'unit_mismatch')""")))
        cases = []
        for itemid, label, unit, usual in rows or []:
            conversion = UNIT_CONVERSIONS.get(label) or BY_UNIT.get(usual)
            if conversion is None or conversion[0] != unit:
                return None  # no known conversion: the value cannot be recovered
            a, b = conversion[1], conversion[2]
            cases.append((f"{RID} IN (SELECT cand FROM bad WHERE reason = 'unit_mismatch') AND itemid = {int(itemid)} "
                          f"AND {rule.unit} = {sql_literal(unit)}", f"({rule.value} - ({b!r})) / ({a!r})", usual))
        if not cases:
            return None
        value = " ".join(f"WHEN {w} THEN {v}" for w, v, _ in cases)
        unit = " ".join(f"WHEN {w} THEN {sql_literal(u)}" for w, _, u in cases)
        return (f"SELECT * REPLACE (CASE {value} ELSE {rule.value} END AS {rule.value}, "
                f"CASE {unit} ELSE {rule.unit} END AS {rule.unit}) FROM {table}__r")

    def unslipped(self, ctes: list[str], table: str, rule) -> str | None:
        """Implausible rows: a decimal slip (x10/x100/x1000) is scaled back when an inverse lies within
        the item's plausible values, at their precision (the inverse nearest the typical value of the
        numbered rows, i.e. of this patient when the question is about one, else of the item);
        others are set aside."""
        bad = "(SELECT cand FROM bad WHERE reason = 'implausible_value')"
        v = rule.value
        if not v or not rule.items or rule.items not in self.present:
            return f"SELECT * FROM {table}__r WHERE {RID} NOT IN {bad}"
        rows = self.rows(_with(ctes, (
            f"""SELECT s.v, s.lo, s.hi, s.places,
                       coalesce((SELECT median(o.{v}) FROM {table}__r o WHERE o.itemid = s.itemid AND o.{RID} NOT IN {bad}
                                   AND o.{v} BETWEEN coalesce(s.low, o.{v}) AND s.high), s.med)
                FROM (SELECT e.{v} AS v, e.itemid, b.low, b.high, min(x.v) AS lo, max(x.v) AS hi, median(x.v) AS med,
                             max(length(split_part(CAST(x.v AS VARCHAR), '.', 2))) AS places
                      FROM e_{table} e JOIN {rule.items} d ON d.itemid = e.itemid
                      JOIN _bounds_{table} b ON b."table" = '{table}' AND b.label = d.label
                      JOIN _vals_{table} x ON x.label = d.label AND x.v BETWEEN coalesce(b.low, x.v) AND b.high
                      WHERE e.cand IN {bad} GROUP BY e.cand, e.{v}, e.itemid, b.low, b.high) AS s""")))
        scaled = []
        for value, low, high, places, typical in rows or []:
            try:
                value_f, low_f, high_f, typical_f, places_n = float(value), float(low), float(high), float(typical), int(places)
            except ValueError:
                continue
            options = [value_f / f for f in UNIT_SLIPS if value_f > 0 and low_f <= value_f / f <= high_f
                       and round(value_f / f, places_n) == round(value_f / f, 9)]
            if options and typical_f > 0:
                scaled.append((value, min(options, key=lambda o: abs(math.log(o / typical_f)))))
        if scaled and len(scaled) == len(rows or []):
            self.slip = "unit_error"
        case = " ".join(f"WHEN {RID} IN {bad} AND {v} = {value} THEN {best!r}" for value, best in scaled)
        kept = ", ".join(str(value) for value, _ in scaled)
        return (f"SELECT * REPLACE ({f'CASE {case} ELSE {v} END' if case else v} AS {v}) FROM {table}__r "
                f"WHERE {RID} NOT IN {bad}" + (f" OR {v} IN ({kept})" if kept else ""))


@register_agent("checking")
@dataclass
class CheckingAgent:
    """Probes the data like a careful analyst before it answers; never reads the pair's labels."""

    name: str = "checking"
    model: str | None = None
    uses_labels: bool = False

    def play(self, env: Env, start: Start, task: dict | None, rng: random.Random) -> Usage:
        try:
            Episode(env, start).run()
        except _Done:
            pass
        return Usage()


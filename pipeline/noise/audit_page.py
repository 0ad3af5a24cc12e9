"""The perturbation audit a reviewer works through: per-operator figures, seeded samples, and a
self-contained ``audit.html`` of every shipped pair.

The page is one file with its data inline and vanilla JavaScript (no server, no CDN): it opens
from the file system. Filters live in the URL fragment (``audit.html#operator=unit_scale&pair=…``),
so a filtered view can be bookmarked, shared, or loaded by a headless browser.
"""

from __future__ import annotations

import html
import json
import os
from collections import Counter, defaultdict
from pathlib import Path

import duckdb

from pipeline.export_pair import export_command
from pipeline.files import stable_int, temp_path
from pipeline.noise.operators import OPERATORS
from pipeline.noise.verify import CHECKS
from pipeline.noise.vetoes import Vetoes
from pipeline.schema import ROW_ID
from pipeline.sql import parquet_scan
from pipeline.staging import staged_path

SAMPLES_PER_OPERATOR = 5
ROW_TEXT = 400  # characters of a whole deleted or inserted row shown on the page

# Per operator: warn below/above these shares of the shipped pairs, or above this rejected share.
MIN_SHARE, MAX_SHARE, MAX_REJECTED = 0.01, 0.15, 0.70

OPERATOR_COLUMNS = (
    [("operator", "string"), ("level", "string"), ("discrepancy", "string"), ("candidates", "int"),
     ("verified", "int"), ("shipped", "int"), ("share", "float")]
    + [(f"rejected_{c}", "int") for c in CHECKS] + [("vetoed", "int")]
)


def operator_audit(records: list[dict], pairs: list[dict], vetoes: Vetoes) -> list[dict]:
    """One row per registered operator: candidates, verified, shipped, share of the benchmark,
    candidates rejected by each check (the first that failed), verified candidates vetoed."""
    proposed = Counter(r["operator"] for r in records)
    verified = Counter(r["operator"] for r in records if r["verified"])
    rejected = Counter((r["operator"], r["failed_check"]) for r in records if not r["verified"])
    vetoed = Counter(r["operator"] for r in records if r["verified"] and vetoes.veto_of(r))
    shipped = Counter(p["operator"] for p in pairs)
    rows = []
    for op in sorted(OPERATORS):
        spec = OPERATORS[op]
        rows.append({"operator": op, "level": spec.level, "discrepancy": spec.discrepancy,
                     "candidates": proposed[op], "verified": verified[op], "shipped": shipped[op],
                     "share": round(shipped[op] / len(pairs), 4) if pairs else 0.0,
                     **{f"rejected_{c}": rejected[(op, c)] for c in CHECKS}, "vetoed": vetoed[op]})
    return rows


def operator_warnings(row: dict) -> list[str]:
    """Why an operator's figures need a reviewer's look (empty when they do not)."""
    out = []
    if row["share"] < MIN_SHARE:
        out.append(f"ships {row['share']:.1%} of the pairs (< {MIN_SHARE:.0%})")
    if row["share"] > MAX_SHARE:
        out.append(f"ships {row['share']:.1%} of the pairs (> {MAX_SHARE:.0%})")
    rejected = row["candidates"] - row["verified"]
    if row["candidates"] and rejected / row["candidates"] > MAX_REJECTED:
        out.append(f"rejects {rejected / row['candidates']:.0%} of its candidates (> {MAX_REJECTED:.0%})")
    return out


def sample_pairs(pairs: list[dict], seed: int, per_operator: int = SAMPLES_PER_OPERATOR) -> dict[str, list[dict]]:
    """Per operator, ``per_operator`` shipped pairs in a seeded order (the same run, the same sample)."""
    by_op: dict[str, list[dict]] = defaultdict(list)
    for p in sorted(pairs, key=lambda p: stable_int(seed, "audit", p["pair_id"])):
        if len(by_op[p["operator"]]) < per_operator:
            by_op[p["operator"]].append(p)
    return dict(sorted(by_op.items()))


SAMPLE_COLUMNS = ["operator", "pair_id", "intent", "level", "clean_question", "clean_answer", "noisy_question",
                  "naive_answer", "expected", "change_log", "changed_rows"]


def sample_rows(samples: dict[str, list[dict]], rows: dict[str, list[dict]]) -> list[dict]:
    """The sampled pairs as flat text rows (one table readable inline in the UI), changed rows as
    ``table _rid column: before → after``."""
    out = []
    for op, pairs in samples.items():
        for p in pairs:
            expected = p["expected_behavior"] + (f" {p['expected_answer']}" if p["expected_answer"] is not None else "")
            out.append({
                "operator": op, "pair_id": p["pair_id"], "intent": p["intent"], "level": p["level"],
                "clean_question": p["clean_question"], "clean_answer": p["clean_answer"],
                "noisy_question": p["noisy_question"],
                "naive_answer": _text(json.loads(p["verification"]).get("naive_answer")),
                "expected": f"{expected} ({p['discrepancy']})", "change_log": "; ".join(json.loads(p["change_log"])),
                "changed_rows": "; ".join(f"{r['table']} _rid {r['rid']} {r['change']} {r['column']}: "
                                          f"{r['before']} → {r['after']}".replace(" :", ":")
                                          for r in rows.get(p["pair_id"], [])) or "none (question rewritten)",
            })
    return out


def _text(value) -> str:
    return "∅" if value is None else str(value)


def _row_text(row: dict) -> str:
    text = ", ".join(f"{k}={_text(v)}" for k, v in row.items() if k != ROW_ID)
    return text if len(text) <= ROW_TEXT else text[:ROW_TEXT] + "…"


def changed_rows(staged_dir: str | os.PathLike, pairs: list[dict]) -> dict[str, list[dict]]:
    """Per pair, its overlay as ``{table, rid, change, column, before, after}`` with the staged
    values before the change; one query per touched table, whatever the number of pairs."""
    changes = {p["pair_id"]: json.loads(p["changes"]) for p in pairs}
    wanted: dict[str, set[int]] = defaultdict(set)
    for rows in changes.values():
        for table, op, rid, _, _ in rows:
            if op != "insert":
                wanted[table].add(int(rid))
    base: dict[tuple[str, int], dict] = {}
    con = duckdb.connect()
    try:
        for table, rids in sorted(wanted.items()):
            cursor = con.execute(f"SELECT * FROM {parquet_scan(staged_path(staged_dir, table))} "
                                 f"WHERE {ROW_ID} IN (SELECT unnest(?::BIGINT[]))", [sorted(rids)])
            names = [d[0] for d in cursor.description]
            for values in cursor.fetchall():
                row = dict(zip(names, values))
                base[(table, row[ROW_ID])] = row
    finally:
        con.close()
    out = {}
    for pair_id, rows in changes.items():
        out[pair_id] = []
        for table, op, rid, column, new in rows:
            before = base.get((table, int(rid)), {})
            if op == "update":
                entry = {"before": _text(before.get(column)), "after": _text(json.loads(new))}
            elif op == "delete":
                entry = {"before": _row_text(before), "after": "(deleted)"}
            else:
                entry = {"before": "(absent)", "after": _row_text(json.loads(new))}
            out[pair_id].append({"table": table, "rid": int(rid), "change": op, "column": column or "", **entry})
    return out


def page_records(pairs: list[dict], rows: dict[str, list[dict]], benchmark_dir: str | os.PathLike) -> list[dict]:
    """What the page shows of each pair, export commands included."""
    out = []
    for p in sorted(pairs, key=lambda p: p["pair_id"]):
        verification = json.loads(p["verification"])
        out.append({
            "pair_id": p["pair_id"], "template_id": p["template_id"], "intent": p["intent"], "level": p["level"],
            "noise_level": p["noise_level"], "operator": p["operator"], "discrepancy": p["discrepancy"],
            "split": p["split"], "clean_question": p["clean_question"], "noisy_question": p["noisy_question"],
            "clean_answer": p["clean_answer"], "expected_behavior": p["expected_behavior"],
            "expected_answer": p["expected_answer"], "naive_answer": verification.get("naive_answer"),
            "gold_sql": p["gold_sql"], "naive_sql": p["naive_sql"],
            "change_log": json.loads(p["change_log"]), "rows": rows.get(p["pair_id"], []),
            "export": {side: export_command(benchmark_dir, p["pair_id"], side, f"{p['pair_id']}-{side}.duckdb")
                       for side in ("clean", "noise")},
        })
    return out


def audit_html(title: str, records: list[dict], operators: list[dict], vetoes: list[dict]) -> str:
    """The whole page: data inline as JSON, rendered by the script below with textContent only."""
    data = json.dumps({"pairs": records, "operators": operators, "vetoes": vetoes,
                       "columns": [c for c, _ in OPERATOR_COLUMNS]}, ensure_ascii=False, sort_keys=True)
    data = data.replace("<", "\\u003c")  # no "</script>" can close the data block early
    return (_PAGE.replace("__TITLE__", html.escape(title)).replace("__DATA__", data))


def write_audit_page(out: Path, title: str, records: list[dict], operators: list[dict], vetoes: list[dict]) -> Path:
    """Write ``audit.html`` atomically."""
    tmp = temp_path(out)
    try:
        tmp.write_text(audit_html(title, records, operators, vetoes), encoding="utf-8")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 1.5rem 3rem; color: #1d232b; }
h1 { font-size: 1.3rem; margin: 1rem 0 .3rem; } h2 { font-size: 1.05rem; margin: 1.4rem 0 .4rem; }
#filters { position: sticky; top: 0; background: #fff; padding: .6rem 0; border-bottom: 1px solid #d5dae1;
           display: flex; flex-wrap: wrap; gap: .6rem; align-items: end; z-index: 1; }
#filters label { display: flex; flex-direction: column; font-size: .8rem; color: #56606c; }
select, input { font: inherit; padding: .15rem .3rem; }
table { border-collapse: collapse; margin: .3rem 0; } td, th { border: 1px solid #d5dae1; padding: .15rem .45rem;
  text-align: left; vertical-align: top; } th { background: #f2f4f7; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.pair { border: 1px solid #d5dae1; border-radius: 6px; margin: .8rem 0; padding: .5rem .8rem; }
.pair header { display: flex; flex-wrap: wrap; gap: .4rem; align-items: baseline; }
.tag { background: #eef1f5; border-radius: 3px; padding: 0 .35rem; font-size: .8rem; }
.sides { display: grid; grid-template-columns: 1fr 1fr; gap: .8rem; }
.side { background: #f8f9fb; border-radius: 4px; padding: .4rem .6rem; }
.side h3 { font-size: .8rem; text-transform: uppercase; color: #56606c; margin: 0 0 .2rem; }
code, pre { font: 12px/1.4 ui-monospace, monospace; } pre { white-space: pre-wrap; margin: .2rem 0; }
.expected { margin: .4rem 0; } .muted { color: #56606c; } button { font: inherit; margin: .6rem 0; }
details summary { cursor: pointer; color: #2a5bd7; }
</style></head>
<body>
<h1>__TITLE__</h1>
<p class="muted">Every shipped pair, with its clean and noisy question, the behaviour a careful agent should show,
and the rows its overlay changes. Filters are kept in the address (#intent=…&amp;operator=…), so a view can be
bookmarked. Export a pair's database with the command shown on it.</p>
<details><summary>Operators</summary><div id="operators"></div></details>
<details><summary>Vetoes</summary><div id="vetoes"></div></details>
<div id="filters"></div>
<p id="count"></p>
<div id="pairs"></div>
<button id="more" hidden>Show more</button>
<script id="audit-data" type="application/json">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("audit-data").textContent);
const FILTERS = ["intent", "level", "noise_level", "operator"];
const PAGE = 100;
let shown = PAGE;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function table(columns, rows, numeric) {
  const t = el("table"), head = el("tr");
  columns.forEach(c => head.appendChild(el("th", c)));
  t.appendChild(head);
  rows.forEach(r => {
    const tr = el("tr");
    columns.forEach(c => tr.appendChild(el("td", r[c], numeric && typeof r[c] === "number" ? "num" : "")));
    t.appendChild(tr);
  });
  return t;
}
function state() {
  const params = new URLSearchParams(location.hash.slice(1));
  const s = {};
  FILTERS.concat(["pair", "q"]).forEach(k => { s[k] = params.get(k) || ""; });
  return s;
}
function setState(s) {
  const params = new URLSearchParams();
  Object.entries(s).forEach(([k, v]) => { if (v) params.set(k, v); });
  history.replaceState(null, "", "#" + params.toString());
  shown = PAGE;
  render();
}
function buildFilters() {
  const box = document.getElementById("filters"), s = state();
  FILTERS.forEach(k => {
    const label = el("label", k.replace("_", " ")), select = el("select");
    select.id = "filter-" + k;
    select.appendChild(el("option", "all")).value = "";
    [...new Set(DATA.pairs.map(p => p[k]))].sort().forEach(v => {
      const o = el("option", v); o.value = v; select.appendChild(o);
    });
    select.value = s[k];
    select.addEventListener("change", () => setState({...state(), [k]: select.value, pair: ""}));
    label.appendChild(select); box.appendChild(label);
  });
  const label = el("label", "search"), input = el("input");
  input.id = "filter-q"; input.type = "search"; input.placeholder = "question, pair id, template"; input.value = s.q;
  input.addEventListener("input", () => setState({...state(), q: input.value, pair: ""}));
  label.appendChild(input); box.appendChild(label);
}
function matches(p, s) {
  if (s.pair) return p.pair_id === s.pair;
  if (FILTERS.some(k => s[k] && p[k] !== s[k])) return false;
  if (!s.q) return true;
  const q = s.q.toLowerCase();
  return [p.pair_id, p.template_id, p.clean_question, p.noisy_question].some(t => t.toLowerCase().includes(q));
}
function side(title, question, lines) {
  const d = el("div", undefined, "side");
  d.appendChild(el("h3", title)); d.appendChild(el("p", question));
  lines.forEach(([label, value]) => {
    const p = el("div"); p.appendChild(el("span", label + ": ", "muted")); p.appendChild(el("code", value));
    d.appendChild(p);
  });
  return d;
}
function pairCard(p) {
  const card = el("section", undefined, "pair");
  card.id = "pair-" + p.pair_id;
  card.dataset.pairId = p.pair_id;
  const head = el("header");
  const link = el("a", p.pair_id); link.href = "#pair=" + p.pair_id; head.appendChild(link);
  [p.operator, p.noise_level, p.intent, p.level, p.template_id, p.split].forEach(t => head.appendChild(el("span", t, "tag")));
  card.appendChild(head);
  const sides = el("div", undefined, "sides");
  sides.appendChild(side("clean", p.clean_question, [["answer", p.clean_answer]]));
  sides.appendChild(side("noisy", p.noisy_question, [["naive answer", p.naive_answer]]));
  card.appendChild(sides);
  const exp = el("p", undefined, "expected");
  exp.appendChild(el("strong", "Expected: " + p.expected_behavior));
  if (p.expected_answer !== null) exp.appendChild(el("code", " " + p.expected_answer));
  exp.appendChild(el("span", " (discrepancy: " + p.discrepancy + ")", "muted"));
  card.appendChild(exp);
  const log = el("ul");
  p.change_log.forEach(line => log.appendChild(el("li", line)));
  card.appendChild(log);
  if (p.rows.length) {
    const t = table(["table", "rid", "change", "column", "before", "after"], p.rows);
    t.className = "changed-rows";
    card.appendChild(t);
  } else {
    card.appendChild(el("p", "No rows changed: the question itself was rewritten.", "muted"));
  }
  const sql = el("details"); sql.appendChild(el("summary", "SQL and export"));
  sql.appendChild(el("div", "gold SQL", "muted")); sql.appendChild(el("pre", p.gold_sql));
  sql.appendChild(el("div", "naive SQL", "muted")); sql.appendChild(el("pre", p.naive_sql));
  sql.appendChild(el("div", "open either database in duckdb:", "muted"));
  sql.appendChild(el("pre", p.export.clean + "\\n" + p.export.noise, "export"));
  card.appendChild(sql);
  return card;
}
function render() {
  const s = state();
  FILTERS.concat(["q"]).forEach(k => { const f = document.getElementById("filter-" + k); if (f) f.value = s[k]; });
  const hits = DATA.pairs.filter(p => matches(p, s));
  document.getElementById("count").textContent = hits.length + " of " + DATA.pairs.length + " pairs";
  const box = document.getElementById("pairs");
  box.replaceChildren(...hits.slice(0, shown).map(pairCard));
  const more = document.getElementById("more");
  more.hidden = hits.length <= shown;
}
document.getElementById("operators").appendChild(table(DATA.columns, DATA.operators, true));
document.getElementById("vetoes").appendChild(DATA.vetoes.length
  ? table(["pair_id", "template_id", "operator", "reason", "removed"], DATA.vetoes)
  : el("p", "No vetoes.", "muted"));
document.getElementById("more").addEventListener("click", () => { shown += PAGE; render(); });
window.addEventListener("hashchange", render);
buildFilters();
render();
</script>
</body></html>
"""

"""Data-quality profile of MIMIC-IV sources: per background quirk, its rate in each source and the
ratio to the first (issue 10: the synthetic source should stay within 2x of the real demo).

A source is a PhysioNet release folder (hosp/, icu/ with .csv.gz, read by DuckDB directly), a
staged folder (<table>.parquet), or ``synthetic:<patients>`` (staged into a temporary folder with
``--quirks``). Default: the demo against 1,000 synthetic patients.

    python bench/quirk_profile.py [/work/shared/data/mimic-iv-demo-2.2 synthetic:1000] [--quirks demo|none]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.sources import QUIRK_KINDS, make_source  # noqa: E402
from pipeline.staging import attach_staged, stage  # noqa: E402

DEMO = Path("/work/shared/data/mimic-iv-demo-2.2")
INSIDE = "BETWEEN least(a.admittime, coalesce(a.edregtime, a.admittime)) AND a.dischtime"


def _outside(table: str, time: str) -> str:
    return (f"SELECT count(*) FILTER (WHERE NOT (e.{time} {INSIDE})), count(*) "
            f"FROM {table} e JOIN admissions a USING (hadm_id)")


# quirk -> SQL giving (rows with it, rows it is counted over)
PROFILE = {
    "lab rows without hadm_id": "SELECT count(*) FILTER (WHERE hadm_id IS NULL), count(*) FROM labevents",
    "  of which inside an admission": f"""
        SELECT count(*) FILTER (WHERE EXISTS (SELECT 1 FROM admissions a WHERE a.subject_id = l.subject_id
                                              AND l.charttime {INSIDE})), count(*)
        FROM labevents l WHERE hadm_id IS NULL""",
    "lab NULL valuenum with a text value":
        "SELECT count(*) FILTER (WHERE valuenum IS NULL AND value IS NOT NULL), count(*) FROM labevents",
    "lab rows sharing (subject, item, charttime)": """
        SELECT coalesce(sum(n) FILTER (WHERE n > 1), 0), sum(n)
        FROM (SELECT count(*) AS n FROM labevents GROUP BY subject_id, itemid, charttime)""",
    "prescriptions stoptime before starttime":
        "SELECT count(*) FILTER (WHERE stoptime < starttime), count(*) FROM prescriptions",
    "linked labs outside their admission": _outside("labevents", "charttime"),
    "prescriptions starting outside their admission": _outside("prescriptions", "starttime"),
    "eMAR rows outside their admission": _outside("emar", "charttime"),
    "eMAR rows whose poe_id is absent from poe": """
        SELECT count(*) FILTER (WHERE poe_id IS NOT NULL AND poe_id NOT IN (SELECT poe_id FROM poe)), count(*)
        FROM emar""",
}
TABLES = ("labevents", "admissions", "prescriptions", "emar", "poe")


def connect(source: str, quirks: str, tmp: Path) -> duckdb.DuckDBPyConnection:
    """A connection with the profiled tables as views over ``source``."""
    con = duckdb.connect()
    if source.startswith("synthetic:"):
        out = tmp / source.replace(":", "-")
        stage(make_source("synthetic", patients=int(source.split(":", 1)[1]), quirks=quirks), out, list(TABLES))
        attach_staged(con, out, tables=list(TABLES))
        return con
    folder = Path(source)
    if (folder / "hosp").is_dir():
        for table in TABLES:
            path = folder / "hosp" / f"{table}.csv.gz"
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_csv('{path}', header = true, sample_size = -1)")
        return con
    if (folder / "labevents.parquet").is_file():
        attach_staged(con, folder, tables=list(TABLES))
        return con
    raise SystemExit(f"{source}: neither a PhysioNet folder (hosp/), a staged folder nor synthetic:<patients>")


def profile(con: duckdb.DuckDBPyConnection) -> dict[str, float]:
    out = {}
    for name, sql in PROFILE.items():
        hits, total = con.execute(sql).fetchone()
        out[name] = hits / total if total else float("nan")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="*", default=[str(DEMO), "synthetic:1000"],
                        help="PhysioNet folder, staged folder or synthetic:<patients>; the first is the reference")
    parser.add_argument("--quirks", choices=QUIRK_KINDS, default="demo", help="quirks of synthetic sources")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rates = [profile(connect(s, args.quirks, Path(tmp))) for s in args.sources]
    names = [Path(s).name if not s.startswith("synthetic:") else s for s in args.sources]
    print(f"{'quirk':<48}" + "".join(f"{n[:22]:>24}" for n in names)
          + "".join(f"{'ratio ' + n[:14]:>22}" for n in names[1:]))
    for quirk in PROFILE:
        ref = rates[0][quirk]
        print(f"{quirk:<48}" + "".join(f"{r[quirk]:>24.4%}" for r in rates)
              + "".join(f"{(r[quirk] / ref if ref else float('nan')):>22.2f}" for r in rates[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

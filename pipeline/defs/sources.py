"""Source stage: one asset per MIMIC-IV table (groups mimic_hosp / mimic_icu) and their checks."""


import dagster as dg

from pipeline.defs.resources import BenchmarkRun
from pipeline.quality import CheckOutcome, expectation_check, integrity_check
from pipeline.schema import TABLES
from pipeline.staging import stage, staged_path

TABLE_SPECS = [
    dg.AssetSpec(
        key=name,
        group_name=f"mimic_{t.module}",
        description=f"MIMIC-IV v2.2 {t.module}/{name}, staged as typed Parquet with a _rid row id.",
        kinds={"parquet", "duckdb"},
    )
    for name, t in TABLES.items()
]


def _column_schema(name: str) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(c.name, c.type) for c in TABLES[name].columns])


@dg.multi_asset(specs=TABLE_SPECS, can_subset=True, name="stage_mimic_tables")
def stage_mimic_tables(context: dg.AssetExecutionContext, benchmark_run: BenchmarkRun):
    """Stage the selected tables from the configured source. A table the source lacks is reported
    as materialized-but-absent (0 rows, with the reason), so the stages downstream still run and
    skip only what needs it."""
    tables = [key.path[-1] for key in context.selected_asset_keys]
    report = stage(benchmark_run.make_source(), benchmark_run.staged, tables)
    for name, reason in report.skipped.items():
        context.log.warning(f"table {name} absent: {reason}")
        yield dg.MaterializeResult(asset_key=name, metadata={
            "dagster/row_count": 0, "absent": reason, "source": benchmark_run.source})
    for name, rows in report.rows.items():
        yield dg.MaterializeResult(
            asset_key=name,
            metadata={
                "dagster/row_count": rows,
                "dagster/column_schema": _column_schema(name),
                "path": dg.MetadataValue.path(str(staged_path(benchmark_run.staged, name))),
                "source": benchmark_run.source,
                "source_seed": benchmark_run.source_seed,
            },
        )


def _result(outcome: CheckOutcome) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=outcome.passed,
        severity=dg.AssetCheckSeverity.ERROR if outcome.errors else dg.AssetCheckSeverity.WARN,
        metadata={**outcome.counts, "failures": dg.MetadataValue.md(outcome.markdown())},
    )


CHECKS = {
    "expectations": (expectation_check, "Great Expectations suite expectations/source/{table}.json: "
                     "columns, required values, clinical ranges, value sets."),
    "integrity": (integrity_check, "DuckDB full-table invariants of {table}: unique key, foreign "
                  "keys, event times inside their stay, ordering and length of stay."),
}


def table_check(table: str, check: str) -> dg.AssetChecksDefinition:
    """One check per table, so a table the source lacks skips only its own checks."""
    check_fn, description = CHECKS[check]

    @dg.asset_check(asset=table, name=check, description=description.format(table=table))
    def _check(benchmark_run: BenchmarkRun) -> dg.AssetCheckResult:
        if not staged_path(benchmark_run.staged, table).exists():
            return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN,
                                       metadata={"absent": f"{table} is absent from this source; not checked"})
        return _result(check_fn(benchmark_run.staged, table))

    return _check


TABLE_CHECKS = [table_check(table, check) for table in TABLES for check in CHECKS]

defs = dg.Definitions(assets=[stage_mimic_tables], asset_checks=TABLE_CHECKS)

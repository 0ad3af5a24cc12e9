"""Great Expectations suites (JSON in ``expectations/``) run over Parquet in Arrow→pandas batches.

GX 1.24 cannot validate DuckDB tables in-database, so a staged table is streamed in bounded
batches and the per-expectation results are summed; full-table invariants live in
:mod:`pipeline.integrity`. A suite's ``meta.one_hot`` names enum columns whose values get 0/1 indicator columns, so
balance rules are plain ``expect_column_mean_to_be_between``. Each expectation carries GX's own ``severity``: ``critical``
failures fail a check, ``warning`` ones are reported with counts and examples.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from pipeline.package_data import expectations_dir  # noqa: E402

EXPECTATIONS_DIR = expectations_dir()  # the repository's expectations/, shipped as pipeline.expectations_data
BATCH_ROWS = 500_000
EXAMPLES = 5


@dataclass
class ExpectationOutcome:
    type: str
    kwargs: dict
    severity: str  # critical | warning | info
    success: bool = True
    element_count: int = 0
    unexpected_count: int = 0
    examples: list = field(default_factory=list)
    observed: object = None

    def describe(self) -> str:
        target = self.kwargs.get("column") or self.kwargs.get("column_list") and "columns" or ""
        cond = f" where {self.kwargs['row_condition']}" if self.kwargs.get("row_condition") else ""
        return f"{self.type}({target}{cond})"


@dataclass
class SuiteOutcome:
    suite: str
    rows: int
    outcomes: list[ExpectationOutcome]

    @property
    def errors(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.success and o.severity == "critical"]

    @property
    def warnings(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.success and o.severity != "critical"]

    @property
    def success(self) -> bool:
        return not self.errors


def suite_path(name: str) -> Path:
    return EXPECTATIONS_DIR / f"{name}.json"


def load_suite_json(name: str) -> dict:
    path = suite_path(name)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"expectation suite {name!r} not found at {path}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"expectation suite {path} is not valid JSON: {exc}") from exc


@lru_cache(maxsize=1)
def _batch_definition():
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas("staged")
    return source.add_dataframe_asset("batch").add_batch_definition_whole_dataframe("whole")


def warm_up() -> threading.Thread:
    """Import GX and build its context in a background thread, to start while worker processes
    run: the import alone costs about 3 s of one core that validating would otherwise wait for.
    Join the thread before validating."""
    thread = threading.Thread(target=_warm, name="gx-warm-up", daemon=True)
    thread.start()
    return thread


def _warm() -> None:
    try:
        _batch_definition()
    except Exception:  # noqa: BLE001 -- validating raises it again, where its caller reports it
        pass


def validate_parquet(path: str | os.PathLike, suite_name: str, batch_rows: int = BATCH_ROWS,
                     values: dict[str, list] | None = None) -> SuiteOutcome:
    """Validate a Parquet file against the suite ``suite_name``, batch by batch. A kwarg written
    ``"$name"`` in the suite takes ``values[name]``: value sets the code defines stay in the code."""
    import great_expectations as gx

    spec = _fill(load_suite_json(suite_name), values or {})
    # GX does not keep the suite's order in its results: tag each expectation with its index.
    tagged = [{**e, "meta": {**e.get("meta", {}), "index": i}} for i, e in enumerate(spec["expectations"])]
    suite = gx.ExpectationSuite(name=spec["name"], expectations=tagged)
    outcomes = [ExpectationOutcome(e["type"], e.get("kwargs", {}), e.get("severity", "critical"))
                for e in spec["expectations"]]
    batch_definition = _batch_definition()
    one_hot = spec.get("meta", {}).get("one_hot", {})
    rows = 0
    for record_batch in _batches(Path(path), batch_rows):
        rows += record_batch.num_rows
        frame = record_batch.to_pandas()
        # Shares of enum values (balance rules) are means of 0/1 indicator columns "<column>=<value>".
        for column, values in one_hot.items():
            for value in values:
                frame[f"{column}={value}"] = (frame[column] == value).astype(float)
        result = batch_definition.get_batch(batch_parameters={"dataframe": frame}).validate(
            suite, result_format="SUMMARY")
        for r in result.results:
            _accumulate(outcomes[r.expectation_config.meta["index"]], r)
    return SuiteOutcome(spec["name"], rows, outcomes)


def _fill(spec: dict, values: dict[str, list]) -> dict:
    def resolve(value):
        if isinstance(value, str) and value.startswith("$"):
            if value[1:] not in values:
                raise ValueError(f"expectation suite {spec['name']!r} needs a value for {value}")
            return values[value[1:]]
        return value

    return {**spec, "expectations": [{**e, "kwargs": {k: resolve(v) for k, v in e.get("kwargs", {}).items()}}
                                     for e in spec["expectations"]]}


def _batches(path: Path, batch_rows: int):
    parquet = pq.ParquetFile(path)
    if parquet.metadata.num_rows == 0:  # an empty table still gets its schema expectations checked
        yield pa.RecordBatch.from_pylist([], schema=parquet.schema_arrow)
        return
    yield from parquet.iter_batches(batch_size=batch_rows)


def _accumulate(outcome: ExpectationOutcome, result) -> None:
    info = result.result or {}
    outcome.success = outcome.success and bool(result.success)
    outcome.element_count += int(info.get("element_count") or 0)
    outcome.unexpected_count += int(info.get("unexpected_count") or 0)
    if "observed_value" in info:
        outcome.observed = _plain(info["observed_value"])
    room = EXAMPLES - len(outcome.examples)
    if room > 0:
        outcome.examples += [_plain(v) for v in (info.get("partial_unexpected_list") or [])[:room]]


def _plain(value):
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)

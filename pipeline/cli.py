"""The ``ehr-robustgym`` command line: the same functions the Dagster assets and tests call."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pipeline.questions.cli import questions_command
from pipeline.sources import DEFAULT_SYNTHETIC_PATIENTS, QUIRK_KINDS, SOURCE_KINDS, make_source
from pipeline.staging import SettingError, StagingError, stage


def expected_errors() -> tuple[type[Exception], ...]:
    """Errors that mean bad input or a failed check, not a bug: the CLI reports them in one line.
    The project's own errors first; then the file system's and those DuckDB and Arrow raise on
    unreadable input (imported here, when one occurred, so that ``--help`` stays fast)."""
    import duckdb
    import pyarrow

    from pipeline.build import BuildError
    from pipeline.download import ChecksumError
    from pipeline.questions.answers import AnswerError
    from pipeline.questions.templates import TemplateError

    return (TemplateError, AnswerError, StagingError, SettingError, BuildError, ChecksumError,
            OSError, duckdb.Error, pyarrow.ArrowException)


def one_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


class Cli(click.Group):
    """Every command: an expected error ends the run with ``Error: <one line>`` and exit code 1;
    any other exception is a bug and keeps its traceback. ``--debug`` (or EHR_ROBUSTGYM_DEBUG=1)
    shows the traceback of expected errors too, also of those a command reports itself."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            if ctx.params.get("debug") and isinstance(exc.__cause__, Exception):
                raise exc.__cause__ from None
            raise
        except Exception as exc:
            if ctx.params.get("debug") or not isinstance(exc, expected_errors()):
                raise
            project_error = type(exc).__module__.startswith("pipeline.")
            raise click.ClickException(one_line(exc) if project_error else
                                       f"{one_line(exc)} (ehr-robustgym --debug ... shows the traceback)") from exc


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="EHR_ROBUSTGYM_DEBUG",
              help="Show the traceback of an error instead of one line.")
def main(debug: bool) -> None:
    """EHR-RobustGym: verified Clean–Noise benchmarks over MIMIC-IV, and a gym to run agents on them."""


def source_options(f):
    f = click.option("--seed", type=int, default=0, show_default=True,
                     help="Seed of the synthetic generator (and of everything seeded downstream).")(f)
    f = click.option("--patients", type=click.IntRange(min=1), default=DEFAULT_SYNTHETIC_PATIENTS,
                     show_default=True, help="Number of synthetic patients.")(f)
    f = click.option("--path", type=click.Path(path_type=Path), default=None,
                     help="MIMIC-IV folder in PhysioNet layout (hosp/, icu/) for --source demo|mimic.")(f)
    f = click.option("--source", type=click.Choice(SOURCE_KINDS), default="synthetic", show_default=True,
                     help="Where the MIMIC-IV tables come from.")(f)
    f = click.option("--quirks", type=click.Choice(QUIRK_KINDS), default="demo", show_default=True,
                     help="Synthetic source: lay the real demo's background data-quality quirks over the "
                          "clean tables (demo) or not (none).")(f)
    return f


@main.command("stage")
@source_options
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Output folder: one <table>.parquet per staged table.")
@click.option("--table", "tables", multiple=True, help="Stage only these tables (repeatable).")
def stage_command(source, quirks, path, patients, seed, out, tables):
    """Stage MIMIC-IV tables as typed, zstd-compressed Parquet with a stable _rid row id."""
    try:
        report = stage(make_source(source, path, patients=patients, seed=seed, quirks=quirks), out, tables or None)
    except (StagingError, KeyError) as exc:
        raise click.ClickException(str(exc).strip('"')) from exc
    click.echo(report.summary())


@main.command("download-demo")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Folder to download the demo into (PhysioNet layout).")
@click.option("--url", default=None, help="Base URL of the release (default: PhysioNet's demo v2.2).")
def download_demo_command(out, url):
    """Download the open-access MIMIC-IV demo v2.2 and verify every file's SHA-256."""
    from pipeline.download import DEMO_URL, ChecksumError, download_demo

    try:
        report = download_demo(out, url or DEMO_URL, log=click.echo)
    except (ChecksumError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{len(report.ok)} files verified in {out}"
               + (f"; missing: {', '.join(report.missing)}" if report.missing else ""))
    if not report.valid:
        raise click.ClickException(f"checksum mismatch: {', '.join(report.mismatched)}")


@main.command("verify-demo")
@click.option("--path", type=click.Path(path_type=Path), required=True, help="A PhysioNet release folder.")
def verify_demo_command(path):
    """Verify a downloaded release against its SHA256SUMS.txt (absent files are listed)."""
    from pipeline.download import ChecksumError, verify_checksums

    try:
        report = verify_checksums(path)
    except ChecksumError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{len(report.ok)} files ok")
    for rel in report.missing:
        click.echo(f"missing: {rel}")
    for rel in report.mismatched:
        click.echo(f"MISMATCH: {rel}")
    if not report.valid:
        sys.exit(1)


main.add_command(questions_command, "questions")


@main.command("build")
@source_options
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Benchmark folder (default: data/benchmark/<source>/seed=<seed>).")
@click.option("--per-template", type=click.IntRange(min=1), default=None,
              help="Most pairs shipped per template (default: 80).")
@click.option("--questions-per-template", type=click.IntRange(min=1), default=None,
              help="Clean questions drawn per template (default: 40).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes for questions, perturbation and verification (default: CPU count).")
@click.option("--vetoes", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Reviewer vetoes to honour (default: audit/vetoes.yaml when present).")
@click.option("--profile", is_flag=True,
              help="Also print where the time went: by stage, and in the noise stage by operator and by check.")
@click.option("--quiet", is_flag=True, help="No progress lines, even on a terminal (the summary still prints).")
def build_command(source, quirks, path, patients, seed, out, per_template, questions_per_template, workers, vetoes,
                  profile, quiet):
    """Build a verified Clean–Noise benchmark: stage, ask, perturb, verify, select, export."""
    from pipeline.build import PAIRS_PER_TEMPLATE, BuildError, build
    from pipeline.layout import RunLayout
    from pipeline.noise.vetoes import VETOES_FILE, VetoError, load_vetoes
    from pipeline.questions.generate import DEFAULT_PER_TEMPLATE

    out = out or RunLayout.for_run(source, seed).root
    if vetoes is not None and not vetoes.is_file():
        raise click.ClickException(f"vetoes file {vetoes} not found")
    try:
        report = build(source, out, seed, path=path, patients=patients, quirks=quirks,
                       per_template=per_template or PAIRS_PER_TEMPLATE, workers=workers,
                       questions_per_template=questions_per_template or DEFAULT_PER_TEMPLATE,
                       vetoes=load_vetoes(vetoes or VETOES_FILE),
                       log=click.echo if sys.stdout.isatty() and not quiet else None)  # quiet when piped
    except (StagingError, BuildError, VetoError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(report.summary())
    if profile:
        click.echo(report.profile())


@main.command("check")
@click.option("--staged", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True,
              help="A folder of staged <table>.parquet files.")
def check_command(staged):
    """Run the source expectation suites and the full-table invariants on staged tables."""
    from pipeline.quality import check_staged

    errors = 0
    for line, is_error in check_staged(staged):
        click.echo(line)
        errors += is_error
    if errors:
        raise click.ClickException(f"{errors} check(s) failed with errors")


@main.command("export-pair")
@click.option("--benchmark", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True,
              help="A benchmark folder (pairs.parquet, overlays.parquet, staged/).")
@click.option("--pair", "pair_id", required=True, help="The pair_id to export.")
@click.option("--side", type=click.Choice(["clean", "noise"]), required=True,
              help="The clean database, or the noisy one with the pair's overlay applied.")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="DuckDB file to write (replaced atomically).")
def export_pair_command(benchmark, pair_id, side, out):
    """Write one pair's clean or noisy database as a standalone DuckDB file: the MIMIC-IV tables as
    the agent sees them (no _rid, no other pair), for the duckdb CLI or any SQL tool."""
    from pipeline.export_pair import ExportError, export_pair

    try:
        report = export_pair(benchmark, pair_id, side, out)
    except ExportError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(report.summary())


@main.command("play")
@click.option("--benchmark", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True,
              help="A built benchmark folder (pairs.parquet, overlays.parquet, staged/).")
@click.option("--pair", "pair_id", required=True, help="The pair_id to play.")
@click.option("--side", type=click.Choice(["clean", "noise"]), default="noise", show_default=True,
              help="The pair's clean question on the clean base, or its noisy one.")
def play_command(benchmark, pair_id, side):
    """Play one gym episode at an interactive prompt (sql/python/answer/abstain/flag) and see the verdict."""
    from pipeline.gym.env import Env
    from pipeline.gym.play import play

    def read(prompt: str) -> str | None:
        try:
            return input(prompt)
        except EOFError:
            return None

    try:
        with Env(benchmark) as env:
            play(env, pair_id, side, read, click.echo)
    except (FileNotFoundError, KeyError) as exc:
        raise click.ClickException(str(exc).strip('"')) from exc


class AgentChoice(click.Choice):
    """The registered agents (:func:`pipeline.eval.agent.agent_names`), looked up only when the
    option is parsed or shown: importing every agent would slow down every other command."""

    def __init__(self):
        super().__init__([])

    @property
    def choices(self):
        from pipeline.eval.agent import agent_names

        return agent_names()

    @choices.setter
    def choices(self, value) -> None:
        pass


@main.command("eval")
@click.option("--benchmark", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True,
              help="A built benchmark folder (pairs.parquet, overlays.parquet, staged/).")
@click.option("--agent", type=AgentChoice(), required=True, help="The agent to evaluate.")
@click.option("--trials", type=click.IntRange(min=1), default=1, show_default=True,
              help="Episodes per (pair, side): pass^k needs k of them.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes; each opens the benchmark once.")
@click.option("--split", type=click.Choice(["train", "dev", "test"]), default=None,
              help="Only the pairs of this split (default: all).")
@click.option("--side", type=click.Choice(["both", "clean", "noise"]), default="both", show_default=True)
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Only this many pairs, the first of an order shuffled by --seed.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --limit and of each episode's rng.")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Results folder; a rerun into it skips the episodes already finished.")
@click.option("--model", default=None, help="Model name, for agents that call one.")
@click.option("--base-url", default=None, help="Endpoint URL, for agents that call a server.")
@click.option("--temperature", type=float, default=None, help="Sampling temperature, for agents that sample.")
def eval_command(benchmark, agent, trials, workers, split, side, limit, seed, out, model, base_url, temperature):
    """Run an agent over the benchmark's episodes: results.parquet and trajectories.jsonl in --out."""
    from pipeline.eval.metrics import success
    from pipeline.eval.runner import EvalConfig, EvalError, run_eval

    options = {k: v for k, v in {"model": model, "base_url": base_url, "temperature": temperature}.items()
               if v is not None}
    config = EvalConfig(benchmark=benchmark, agent=agent, options=options, trials=trials, workers=workers,
                        split=split, sides=("clean", "noise") if side == "both" else (side,), limit=limit, seed=seed)
    try:
        run = run_eval(config, out, log=click.echo if sys.stdout.isatty() else None)
    except EvalError as exc:
        raise click.ClickException(str(exc)) from exc
    import pandas as pd

    results = pd.read_parquet(run.results)
    rates = ", ".join(f"{s} {rate:.1%}" for s in ("clean", "noise") if (rate := success(results, s)) is not None)
    click.echo(f"{run.played:,} episodes played, {run.skipped:,} already done, in {run.seconds:.1f} s; "
               f"{len(results):,} in {run.results} ({rates})")


@main.command("report")
@click.argument("results_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--compare", multiple=True, type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="Another results folder to compare with (repeatable).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bootstrap intervals.")
def report_command(results_dir, compare, seed):
    """Write report.md, metrics.json and PNG plots into RESULTS_DIR."""
    from pipeline.eval.report import ReportError, write_report

    try:
        files = write_report(results_dir, list(compare), seed=seed)
    except ReportError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"wrote {', '.join(p.name for p in files.values())} in {results_dir}")

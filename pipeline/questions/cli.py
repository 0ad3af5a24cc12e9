"""``ehr-robustgym questions``: instantiate the templates into clean questions (Parquet)."""

from __future__ import annotations

import click

from pipeline.questions.generate import DEFAULT_PER_TEMPLATE, generate_questions
from pipeline.questions.templates import TemplateError, load_templates


@click.command("questions")
@click.option("--staged", "staged", required=True, type=click.Path(exists=True, file_okay=False),
              help="Folder of staged tables (<table>.parquet).")
@click.option("--seed", type=int, required=True, help="Sampling seed; same seed, same bytes.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Output Parquet file.")
@click.option("--per-template", type=click.IntRange(min=1), default=DEFAULT_PER_TEMPLATE,
              show_default=True, help="Clean questions kept per template at most.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes (default: one per CPU); the output does not depend on it.")
@click.option("--templates-dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Template folder (default: the repository's templates/).")
def questions_command(staged: str, seed: int, out: str, per_template: int, workers: int | None,
                      templates_dir: str | None) -> None:
    """Generate clean questions with gold SQL, gold answers and evidence row ids."""
    try:
        templates = load_templates(templates_dir)
    except TemplateError as exc:
        raise click.ClickException(str(exc)) from exc
    _, report = generate_questions(staged, seed, templates, per_template, out=out, workers=workers)
    click.echo(report.summary())
    click.echo(f"wrote {out}")

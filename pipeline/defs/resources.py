"""The one resource every stage shares: which MIMIC-IV source, which seed, where outputs go."""


import dagster as dg
from pydantic import Field

from pipeline.build import PAIRS_PER_TEMPLATE
from pipeline.layout import DATA_DIR, RunLayout
from pipeline.questions.generate import DEFAULT_PER_TEMPLATE
from pipeline.sources import DEFAULT_SYNTHETIC_PATIENTS, make_source
from pipeline.staging import Source


class BenchmarkRun(dg.ConfigurableResource):
    """Choose the source and seed in the launchpad; outputs land in their own seed folder."""

    source: str = Field(default="synthetic", description="synthetic | demo | mimic")
    path: str | None = Field(default=None, description="MIMIC-IV folder (hosp/, icu/) for demo or mimic")
    patients: int = Field(default=DEFAULT_SYNTHETIC_PATIENTS, description="synthetic patients")
    seed: int = Field(default=0, description="seed of generation, sampling and noise")
    questions_per_template: int = Field(default=DEFAULT_PER_TEMPLATE, description="clean questions drawn per template")
    per_template: int = Field(default=PAIRS_PER_TEMPLATE, description="most pairs shipped per template")
    workers: int | None = Field(default=None, description="worker processes for questions and noise (default: CPUs)")
    data_dir: str = Field(default=str(DATA_DIR), description="root of generated output")

    @property
    def layout(self) -> RunLayout:
        return RunLayout.for_run(self.source, self.seed, self.data_dir)

    def make_source(self) -> Source:
        return make_source(self.source, self.path, patients=self.patients, seed=self.seed)

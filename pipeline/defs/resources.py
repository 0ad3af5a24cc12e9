"""The one resource every stage shares: which MIMIC-IV source, which seed, where outputs go."""

from pathlib import Path

import dagster as dg
from pydantic import Field

from pipeline.build import PAIRS_PER_TEMPLATE
from pipeline.layout import DATA_DIR, RunLayout
from pipeline.noise.vetoes import VETOES_FILE
from pipeline.questions.generate import DEFAULT_PER_TEMPLATE
from pipeline.sources import DEFAULT_SYNTHETIC_PATIENTS, make_source
from pipeline.staging import Source


class BenchmarkRun(dg.ConfigurableResource):
    """Choose the source in the launchpad; each seed partition writes its own folder."""

    source: str = Field(default="synthetic", description="synthetic | demo | mimic")
    path: str | None = Field(default=None, description="MIMIC-IV folder (hosp/, icu/) for demo or mimic")
    patients: int = Field(default=DEFAULT_SYNTHETIC_PATIENTS, description="synthetic patients")
    quirks: str = Field(default="demo", description="synthetic: the real demo's background data-quality quirks "
                        "(demo) or none")
    source_seed: int = Field(default=0, description="seed of the synthetic generator: the staged tables "
                             "every seed partition shares (a benchmark's own seed is its partition)")
    questions_per_template: int = Field(default=DEFAULT_PER_TEMPLATE, description="clean questions drawn per template")
    per_template: int = Field(default=PAIRS_PER_TEMPLATE, description="most pairs shipped per template")
    workers: int | None = Field(default=None, description="worker processes for questions and noise (default: CPUs)")
    data_dir: str = Field(default=str(DATA_DIR), description="root of generated output")
    vetoes: str = Field(default=str(VETOES_FILE), description="reviewer vetoes honoured by selection (absent: none)")

    @property
    def staged(self) -> Path:
        """The source's staged tables, shared by every seed partition."""
        return self.layout(self.source_seed).staged

    def layout(self, seed: int) -> RunLayout:
        """Where the seed partition ``seed`` writes its files."""
        return RunLayout.for_partition(self.source, seed, self.data_dir)

    def make_source(self) -> Source:
        return make_source(self.source, self.path, patients=self.patients, seed=self.source_seed, quirks=self.quirks)

"""Where a run's files live: defined once for the CLI, :mod:`pipeline.build` and the Dagster assets.

A run folder (``data/benchmark/<source>/seed=<S>/`` by default) holds the staged tables, the
intermediate stage outputs and the published benchmark; ``data/README.md`` describes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path("data")
SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class RunLayout:
    root: Path
    shared_staged: Path | None = None  # staged tables every seed of a source reads (Dagster partitions)

    # Published files, relative to the root (the export writes them by name, atomically together).
    PAIRS = "pairs.parquet"
    OVERLAYS = "overlays.parquet"
    CLEAN_QUESTIONS = "clean_questions.parquet"
    MANIFEST = "manifest.json"
    CARD = "README.md"

    @classmethod
    def for_run(cls, source: str, seed: int, data_dir: str | os.PathLike = DATA_DIR) -> RunLayout:
        return cls(Path(data_dir) / "benchmark" / source / f"seed={seed}")

    @classmethod
    def for_partition(cls, source: str, seed: int, data_dir: str | os.PathLike = DATA_DIR) -> RunLayout:
        """A Dagster seed partition: its own folder, reading the staged tables once staged for the
        source (``data/benchmark/<source>/staged``); the benchmark asset links them into ``root/staged``."""
        return cls(cls.for_run(source, seed, data_dir).root, Path(data_dir) / "benchmark" / source / "staged")

    @staticmethod
    def split_file(kind: str, split: str) -> str:
        """One split of ``pairs`` or ``overlays``, the files the dataset card's configs name."""
        return f"splits/{kind}-{split}.parquet"

    @property
    def staged(self) -> Path:
        """Where the stages read the staged tables."""
        return self.shared_staged or self.published_staged

    @property
    def published_staged(self) -> Path:
        """The staged tables inside the benchmark folder, which overlays apply to."""
        return self.root / "staged"

    @property
    def slot_pools(self) -> Path:
        return self.root / "slot_pools.parquet"

    @property
    def clean_questions(self) -> Path:
        return self.root / self.CLEAN_QUESTIONS

    @property
    def question_rejections(self) -> Path:
        return self.root / "clean_questions_rejected.json"

    def candidates(self, noise_level: str) -> Path:
        return self.root / "noise" / f"candidates_{noise_level}.parquet"

    @property
    def verified_pairs(self) -> Path:
        return self.root / "noise" / "verified_pairs.parquet"

    @property
    def not_applicable(self) -> Path:
        return self.root / "noise" / "not_applicable.json"

    @property
    def vetoes_applied(self) -> Path:
        """The vetoes selection honoured, with what each removed (Dagster runs)."""
        return self.root / "noise" / "vetoes.json"

    @property
    def pairs(self) -> Path:
        return self.root / self.PAIRS

    @property
    def overlays(self) -> Path:
        return self.root / self.OVERLAYS

    @property
    def audit_page(self) -> Path:
        return self.root / "audit.html"

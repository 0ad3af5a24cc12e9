"""MIMIC-IV sources, selected by name: ``synthetic`` (built in), ``demo`` and ``mimic`` (folders)."""

from __future__ import annotations

import os

from pipeline.staging import Source, StagingError

SOURCE_KINDS = ("synthetic", "demo", "mimic")
DEFAULT_SYNTHETIC_PATIENTS = 1000
QUIRK_KINDS = ("demo", "none")  # synthetic: the real demo's background imperfections, or none


def make_source(kind: str, path: str | os.PathLike | None = None, *,
                patients: int = DEFAULT_SYNTHETIC_PATIENTS, seed: int = 0, quirks: str = "demo") -> Source:
    """Build the source ``kind``; ``path`` is required for ``demo``/``mimic`` and unused otherwise, and
    ``quirks`` (``demo``: the real demo's background imperfections, or ``none``) applies to ``synthetic``."""
    if kind == "synthetic":
        from pipeline.sources.synthetic import SyntheticSource

        if quirks not in QUIRK_KINDS:
            raise StagingError(f"unknown quirks {quirks!r}; choose one of {', '.join(QUIRK_KINDS)}")
        return SyntheticSource(patients=patients, seed=seed, quirks=quirks)
    if kind in ("demo", "mimic"):
        if path is None:
            raise StagingError(f"source {kind!r} needs --path: the MIMIC-IV folder (hosp/ and icu/)")
        from pipeline.sources.physionet import PhysioNetSource

        return PhysioNetSource(path, kind)
    raise StagingError(f"unknown source {kind!r}; choose one of {', '.join(SOURCE_KINDS)}")

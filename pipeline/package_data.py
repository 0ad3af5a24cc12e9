"""Where the package's data folders are, in an editable install and in a regular one alike.

The repository keeps ``templates/`` and ``expectations/`` at its top level; pyproject.toml ships
them inside the package as ``pipeline.templates`` and ``pipeline.expectations_data``. They are
found through the import system (``importlib.resources``), so an editable install resolves them
to the checkout's folders and a wheel to its own copies, whatever the current directory.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

TEMPLATES_PACKAGE = "pipeline.templates"
EXPECTATIONS_PACKAGE = "pipeline.expectations_data"


def package_folder(package: str) -> Path:
    """The folder of data package ``package``; a clear error when the install predates it."""
    try:
        folder = files(package)
    except ModuleNotFoundError as exc:
        raise FileNotFoundError(f"data package {package} is not installed: reinstall EHR-RobustGym "
                                "(pip install -e . from the checkout, or pip install the wheel)") from exc
    if not isinstance(folder, Path):  # pip installs unpack to the file system; a zip import would not
        raise FileNotFoundError(f"data package {package} is not a folder on disk: {folder}")
    return folder


def templates_dir() -> Path:
    """The question templates (``templates/*.yaml`` of the repository)."""
    return package_folder(TEMPLATES_PACKAGE)


def expectations_dir() -> Path:
    """The Great Expectations suites (``expectations/<kind>/<name>.json`` of the repository)."""
    return package_folder(EXPECTATIONS_PACKAGE)

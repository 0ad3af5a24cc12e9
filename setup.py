"""The package list and the data folders mapped into it; everything else is in pyproject.toml.

``templates/`` and ``expectations/`` stay at the top of the repository and ship inside the
package as ``pipeline.templates`` and ``pipeline.expectations_data`` (found at run time by
``pipeline/package_data.py``). This file exists because pyproject.toml cannot combine
``packages.find`` with packages mapped from other folders, and a hand-kept package list would
miss the next ``pipeline/`` subpackage.
"""

from setuptools import find_namespace_packages, setup

DATA_FOLDERS = {"pipeline.templates": "templates", "pipeline.expectations_data": "expectations"}

packages = find_namespace_packages(include=["pipeline*"])
for package, folder in DATA_FOLDERS.items():
    packages += [package] + [f"{package}.{sub}" for sub in find_namespace_packages(where=folder)]

setup(packages=packages, package_dir=DATA_FOLDERS)

"""The perturbation operators, one module per kind of noise. Importing this package imports
every module in it, so its :data:`OPERATORS` is the whole registry (:mod:`pipeline.noise.registry`):
a new operator needs nothing beyond its module."""

import importlib
import pkgutil

from pipeline.noise.registry import OPERATORS

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["OPERATORS"]

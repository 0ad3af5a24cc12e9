"""Question templates as data (see README.md); shipped inside the package as ``pipeline.templates``."""

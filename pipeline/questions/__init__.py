"""Clean questions: templates as data (``templates/*.yaml``), slot samplers, gold answers, evidence.

Public API: :func:`load_templates`, :func:`render`, :func:`generate_questions`.
"""

from pipeline.questions.generate import QuestionReport, generate_questions, open_staged
from pipeline.questions.templates import Template, TemplateError, load_templates, render

__all__ = ["QuestionReport", "Template", "TemplateError", "generate_questions", "load_templates",
           "open_staged", "render"]

"""train-forensics: post-mortem analysis of deep-learning training runs.

Kept light on purpose: ``import parsers`` and ``import reports`` import only the leaf
modules :mod:`forensics.errors`, :mod:`forensics.schema` and :mod:`forensics.model`.
The composed entry point is :func:`forensics.api.analyze`.
"""

__version__ = "0.1.0"
SCHEMA_VERSION = 1

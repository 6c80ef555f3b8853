"""train-forensics: post-mortem analysis of deep-learning training runs.

Kept light on purpose: ``import parsers`` and ``import reports`` import only the leaf
modules :mod:`forensics.errors`, :mod:`forensics.schema` and :mod:`forensics.model`.
The composed entry point is :func:`forensics.api.analyze`.
"""

import os as _os

# Arrow buffers from the system allocator (issue 16, the 10M-line text log): Arrow's default mimalloc pool keeps
# its freed arenas, so each transient copy of the long table stayed in the RSS (measured at 10M lines: 1,152 ->
# 935 MiB after `load`, its peak 1,315 -> 1,087 MiB, CPU no higher). Set before pyarrow allocates (it reads the
# variable once); a value the user set wins. (polars' jemalloc with no decay freed little more and cost ~10% CPU.)
_os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

__version__ = "0.1.0"
SCHEMA_VERSION = 1

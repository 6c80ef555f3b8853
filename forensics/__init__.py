"""train-forensics: post-mortem analysis of deep-learning training runs.

Kept light on purpose: ``import parsers`` and ``import reports`` import only the leaf
modules :mod:`forensics.errors`, :mod:`forensics.schema` and :mod:`forensics.model`.
The composed entry point is :func:`forensics.api.analyze`.
"""

import os as _os

# Freed memory goes back to the system at once (issue 16, the 10M-line text log): polars' jemalloc keeps
# freed pages for 10 s by default and Arrow's mimalloc pool keeps its arenas, so every transient copy of the
# long table stayed in the RSS (measured: 1,152 -> 775 MiB after `load`, peak 1,315 -> 1,079 MiB, same CPU).
# Set before polars/pyarrow are imported (they read these once); a value the user set wins.
_os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")
_os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

__version__ = "0.1.0"
SCHEMA_VERSION = 1

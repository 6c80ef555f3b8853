"""YAML from run folders (``config.yaml``, ``hparams.yaml``, W&B ``config.yaml``, MLflow ``meta.yaml``), bounded.

``yaml.safe_load`` builds aliases as shared references (cheap), but every later copy (a JSON
report, a flattened config) expands them: 7 levels of 9 aliases in 386 bytes are 9**7 = 4.8M
leaves. :func:`load` measures the expanded size of what was loaded (memoised by object identity,
so the measure itself is linear in the distinct objects) and refuses a document past
:data:`MAX_NODES` expanded nodes, or nested deeper than :data:`MAX_DEPTH`.
"""

from __future__ import annotations

from typing import Any

import yaml

from parsers._limits import TooLarge, expanded_size

__all__ = ["MAX_NODES", "TooLarge", "expanded_size", "load"]

MAX_NODES = 200_000
"""Expanded nodes (scalars, mappings, sequences, keys counted) a config may have; real configs have
a few thousand (a Hydra dump of a large Megatron run: ~2,000)."""


def load(text: str, limit: int = MAX_NODES) -> Any:
    """``yaml.safe_load`` (libyaml when present) with the expansion bound.

    Raises:
        yaml.YAMLError: Not YAML.
        TooLarge: The document expands past ``limit`` nodes (an alias bomb) or nests too deep.
    """
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        obj = yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    except RecursionError:
        raise TooLarge("nested too deeply to load") from None
    expanded_size(obj, limit)
    return obj

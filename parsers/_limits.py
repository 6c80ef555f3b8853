"""Bounds shared by the readers of untrusted structures (pickles, YAML): expanded size and depth.

A structure with shared references (a pickle memo, YAML aliases) can be tiny on disk and
astronomically large once walked path by path or copied out: ``L_i = [L_(i-1), L_(i-1)]`` 40 times is
752 bytes and 2**40 paths. :func:`expanded_size` counts the expanded nodes memoised by object
identity, so the count itself costs one visit per distinct container.
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 64
"""Deepest nesting accepted (a state dict is 3-6 levels; a config 10)."""


class TooLarge(ValueError):
    """A structure expands past its node limit, nests deeper than :data:`MAX_DEPTH`, or holds a cycle."""


def expanded_size(obj: Any, limit: int, max_depth: int = MAX_DEPTH) -> int:
    """Nodes of ``obj`` once shared references are copied out (dicts, lists, tuples, sets walked).

    Linear in the distinct containers (memoised by ``id``); stops counting past ``limit``.

    Raises:
        TooLarge: More than ``limit`` nodes, deeper than ``max_depth``, or a reference cycle.
    """
    memo: dict[int, int] = {}
    active: set[int] = set()

    def size(o: Any, depth: int) -> int:
        if not isinstance(o, (dict, list, tuple, set, frozenset)):
            return 1
        k = id(o)
        if k in memo:
            return memo[k]
        if depth > max_depth:
            raise TooLarge(f"nested deeper than {max_depth} levels")
        if k in active:
            raise TooLarge("a reference cycle (a recursive alias)")
        active.add(k)
        n = 1
        items = (x for kv in o.items() for x in kv) if isinstance(o, dict) else o
        for v in items:
            n += size(v, depth + 1)
            if n > limit:
                raise TooLarge(f"expands to more than {limit} nodes (shared references copied out)")
        active.discard(k)
        memo[k] = n
        return n

    return size(obj, 0)



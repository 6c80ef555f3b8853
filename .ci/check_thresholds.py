#!/usr/bin/env python3
"""Check that every threshold of the deciding code is a named field or constant with a source (issue 14).

Rules, over :data:`SCOPE` (the modules that decide: detectors, engine, planners, config diff, compare, sweep,
calibration and the statistics they share):

1. **no inline number in a function body**: a numeric literal inside a function or method is a violation unless
   it is in :data:`ALLOWED` (0, 1, -1, 2 and 0.5: identities, halves, squares and "the other side"), the
   ``ndigits`` of ``round()`` (display precision, not a threshold), or a parameter default (the parameter's
   name names it);
2. **every module-level numeric constant has a source**: an ``UPPER_CASE`` name bound to a number (or a tuple
   of numbers) must be followed by a docstring or carry a comment on its line or the line above (where the
   value comes from: a paper, a report, docs/detectors.md, or "our choice" and why).

Dataclass fields of a detector are named by their field name and sourced by the detector module's ``Source:``
section (the registry checks that section exists, ``forensics/detectors/__init__.py``).

Stdlib only (:mod:`ast`). Prints the modules with the most violations, then each violation, and exits 1 when
there is one. ``--paths`` limits the check to the given files or folders.

Usage::

    python .ci/check_thresholds.py
    python .ci/check_thresholds.py --paths forensics/detectors/loss_spike.py
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCOPE = ("forensics/detectors", "forensics/engine", "forensics/recovery", "forensics/config_diff",
         "forensics/compare", "forensics/sweep", "forensics/calibration.py", "forensics/signals.py",
         "forensics/stats.py", "forensics/facts.py", "forensics/spike_shape.py", "forensics/resume_rows.py",
         "forensics/lr_shapes.py", "forensics/objective.py", "forensics/notes.py", "forensics/lr_rows.py",
         "forensics/coverage.py", "forensics/model_parts.py")
ALLOWED = frozenset({0, 1, -1, 2, 0.5})
CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]*$")


def _is_number(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    if isinstance(node, ast.Tuple):
        return bool(node.elts) and all(_is_number(e) for e in node.elts)
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _exempt_ids(fn: ast.AST) -> set[int]:
    """Literals that are not thresholds: parameter defaults and round()'s ndigits."""
    out: set[int] = set()
    args = getattr(fn, "args", None)
    if args is not None:
        for d in [*args.defaults, *args.kw_defaults]:
            if d is not None:
                out |= {id(n) for n in ast.walk(d)}
    for n in ast.walk(fn):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "round" and len(n.args) == 2:
            out |= {id(x) for x in ast.walk(n.args[1])}
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "round" and n.args:
            out |= {id(x) for x in ast.walk(n.args[0])}
    return out


def _inline_numbers(tree: ast.Module) -> list[tuple[int, object]]:
    found: set[tuple[int, int, object]] = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        exempt = _exempt_ids(fn)
        for n in ast.walk(fn):
            if isinstance(n, ast.Constant) and type(n.value) in (int, float) and id(n) not in exempt:
                value = n.value
                if value not in ALLOWED:
                    found.add((n.lineno, n.col_offset, value))
    return [(line, v) for line, _c, v in sorted(found)]


def _unsourced_constants(tree: ast.Module, lines: list[str]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    body = tree.body
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if not names or not all(CONSTANT.match(n) for n in names) or not _is_number(value):
            continue
        nxt = body[i + 1] if i + 1 < len(body) else None
        documented = isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant) \
            and isinstance(nxt.value.value, str)
        here = lines[stmt.lineno - 1] if stmt.lineno - 1 < len(lines) else ""
        above = lines[stmt.lineno - 2].strip() if stmt.lineno >= 2 else ""
        end = lines[(stmt.end_lineno or stmt.lineno) - 1]
        commented = "#" in here or "#" in end or above.startswith("#")
        if not (documented or commented):
            out.append((stmt.lineno, names[0]))
    return out


def _files(paths: list[Path] | None) -> list[Path]:
    roots = [REPO / s for s in SCOPE] if not paths else [p if p.is_absolute() else REPO / p for p in paths]
    files: list[Path] = []
    for r in roots:
        files += sorted(r.rglob("*.py")) if r.is_dir() else [r] if r.suffix == ".py" and r.is_file() else []
    in_scope = [REPO / s for s in SCOPE]
    return [f for f in files if any(f == s or s in f.parents for s in in_scope)]


def check(paths: list[Path] | None, top: int = 10) -> int:
    """Print the violations of both rules; return the number of violations."""
    violations: list[str] = []
    per_module: Counter[str] = Counter()
    for f in _files(paths):
        rel = f.relative_to(REPO).as_posix()
        text = f.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=rel)
        for line, value in _inline_numbers(tree):
            violations.append(f"{rel}:{line}: inline number {value!r} in a function body (name it, with a source)")
            per_module[rel] += 1
        for line, name in _unsourced_constants(tree, text.splitlines()):
            violations.append(f"{rel}:{line}: constant {name} has no source (a docstring below it or a comment)")
            per_module[rel] += 1
    if per_module:
        print("modules with the most violations:")
        for rel, n in per_module.most_common(top):
            print(f"  {n:5d}  {rel}")
    for v in violations:
        print(v)
    print(f"checked: {', '.join(SCOPE) if not paths else ', '.join(map(str, paths))}")
    print(f"{len(violations)} violation(s)" if violations else "no violations")
    return len(violations)


def main(argv: list[str] | None = None) -> int:
    """Command line entry: exit 1 when a threshold is inline or unsourced."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", nargs="*", type=Path, default=None)
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args(argv)
    return 1 if check(args.paths, args.top) else 0


if __name__ == "__main__":
    sys.exit(main())

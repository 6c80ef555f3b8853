#!/usr/bin/env python3
"""Check the code's shape: module and function sizes, import cycles, what ``reports/`` may import.

Rules (issue 14, "Done when"):

1. no module over :data:`MAX_MODULE_LINES` lines;
2. no function (or method) over :data:`MAX_FUNCTION_LINES` lines, counted from its ``def`` line (decorators
   excluded) to its last line, nested functions counted inside their parent too;
3. no import cycle among the project's modules (``forensics/``, ``parsers/``, ``reports/``); an edge is any
   ``import``/``from ... import`` of a project module, at module level or deferred inside a function (a
   deferred import is still a dependency), except those under ``if TYPE_CHECKING:``; importing a package's
   submodule does not count as an edge to the package's ``__init__``;
4. ``reports/`` imports from the rest of the project only :data:`REPORTS_MAY_IMPORT` (the leaf modules
   ``forensics.model``, ``forensics.errors``, ``forensics.schema`` and the light package root ``forensics``
   for ``__version__``/``SCHEMA_VERSION``), anything under ``reports/``, the standard library and
   third-party packages; ``TYPE_CHECKING`` imports count here too (only the leaf modules are allowed).

Rules 1 and 2 apply to every ``*.py`` file under :data:`ROOTS` except those under :data:`EXCLUDED`
(``tests/``: tests are excluded by the issue; ``benchmarks/``, ``sample_logs/`` and ``.ci/``: scripts
that are not part of the installed package). Rules 3 and 4 look at the installed packages only.

Stdlib only (:mod:`ast`). Prints the longest modules and functions, then every violation, and exits 1
when there is one (0 otherwise). ``--paths`` limits the size rules and the reports rule to the given
files or folders (the import graph is always built over the whole project, and a cycle is reported when
one of its modules is under the given paths).

Usage::

    python .ci/check_shape.py                    # the whole project
    python .ci/check_shape.py --paths reports forensics/compare
    python .ci/check_shape.py --top 20           # show the 20 longest of each
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
PACKAGES = ("forensics", "parsers", "reports")
ROOTS = (*PACKAGES, "benchmarks", "sample_logs", "tests", ".ci")
EXCLUDED = ("tests", "benchmarks", "sample_logs", ".ci")
REPORTS_MAY_IMPORT = frozenset({"forensics", "forensics.model", "forensics.errors", "forensics.schema"})
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Sized:
    """A module or function and its length in lines."""

    where: str
    lines: int


def _python_files(repo: Path) -> list[Path]:
    files: list[Path] = []
    for root in ROOTS:
        base = repo / root
        if base.is_dir():
            files.extend(p for p in base.rglob("*.py") if "__pycache__" not in p.parts)
    return sorted(files)


def _excluded(rel: Path) -> bool:
    return rel.parts[0] in EXCLUDED


def module_name(rel: Path) -> str:
    """Dotted module name of a project file (``reports/charts.py`` -> ``reports.charts``)."""
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _functions(tree: ast.AST, rel: Path) -> list[Sized]:
    out: list[Sized] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                out.append(Sized(f"{rel}:{child.lineno} {name}", length))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, tuple[str, ...], int, bool]]:
    """(module, imported names, line, under TYPE_CHECKING) for every import in the tree.

    ``import a.b`` gives ``("a.b", (), ...)``; ``from a import b, c`` gives ``("a", ("b", "c"), ...)``:
    :func:`_resolve` decides which of ``a.b``/``a.c`` are modules.
    """
    found: list[tuple[str, tuple[str, ...], int, bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for sub in child.body:
                    visit_one(sub, True)
                for sub in child.orelse:
                    visit_one(sub, typing_only)
                continue
            visit_one(child, typing_only)

    def visit_one(child: ast.AST, typing_only: bool) -> None:
        if isinstance(child, ast.Import):
            found.extend((alias.name, (), child.lineno, typing_only) for alias in child.names)
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:
                parts = module.split(".")
                keep = len(parts) - child.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([base] if base else []))
            found.append((base, tuple(alias.name for alias in child.names), child.lineno, typing_only))
        visit(child, typing_only)

    visit(tree, False)
    return found


def _resolve(base: str, names: tuple[str, ...], modules: set[str] | dict[str, object]) -> set[str]:
    """The modules one import statement loads: ``from reports import escape`` -> ``reports.escape``."""
    if not names:
        return {base}
    subs = {f"{base}.{name}" for name in names if f"{base}.{name}" in modules}
    return subs if len(subs) == len(names) else subs | {base}


def _in_paths(rel: Path, paths: list[Path] | None) -> bool:
    if paths is None:
        return True
    return any(rel == p or p in rel.parents for p in paths)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (or a self-import), Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def connect(start: str) -> None:
        nonlocal counter
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1 or node in graph[node]:
                    components.append(sorted(comp))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return components


def check(repo: Path, paths: list[Path] | None, top: int) -> int:
    """Run every rule, print the report and return the number of violations."""
    modules: list[Sized] = []
    functions: list[Sized] = []
    violations: list[str] = []
    graph: dict[str, set[str]] = {}
    imports: dict[str, list[tuple[str, tuple[str, ...], int, bool]]] = {}
    rel_of: dict[str, Path] = {}
    for path in _python_files(repo):
        rel = path.relative_to(repo)
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(rel))
        if not _excluded(rel) and _in_paths(rel, paths):
            modules.append(Sized(str(rel), len(source.splitlines())))
            functions.extend(_functions(tree, rel))
        if rel.parts[0] in PACKAGES:
            name = module_name(rel)
            rel_of[name] = rel
            imports[name] = _imports(tree, name, rel.name == "__init__.py")
    for name, found in imports.items():
        graph[name] = {
            target
            for base, names, _, typing_only in found
            if not typing_only
            for target in _resolve(base, names, imports)
            if target in imports
        }
        graph[name].discard(name)
        # importing a.b.c makes Python run a/__init__ and a/b/__init__: not an edge of this graph (it would
        # make every package a cycle with its submodules); an explicit `import a` / `from a import x` is.
    for module in modules:
        if module.lines > MAX_MODULE_LINES:
            violations.append(f"module {module.where}: {module.lines} lines (max {MAX_MODULE_LINES})")
    for func in functions:
        if func.lines > MAX_FUNCTION_LINES:
            violations.append(f"function {func.where}: {func.lines} lines (max {MAX_FUNCTION_LINES})")
    for comp in _cycles(graph):
        if paths is None or any(_in_paths(rel_of[m], paths) for m in comp):
            violations.append("import cycle: " + " <-> ".join(comp))
    for name, found in sorted(imports.items()):
        if not name.startswith("reports") or not _in_paths(rel_of[name], paths):
            continue
        for base, names, line, _ in found:
            for target in sorted(_resolve(base, names, imports)):
                root = target.split(".")[0]
                if root in PACKAGES and root != "reports" and target not in REPORTS_MAY_IMPORT:
                    violations.append(f"reports import {rel_of[name]}:{line} imports {target}")
    print(f"longest modules (max {MAX_MODULE_LINES} lines):")
    for module in sorted(modules, key=lambda s: -s.lines)[:top]:
        print(f"  {module.lines:5d}  {module.where}")
    print(f"longest functions (max {MAX_FUNCTION_LINES} lines):")
    for func in sorted(functions, key=lambda s: -s.lines)[:top]:
        print(f"  {func.lines:5d}  {func.where}")
    scope = "the whole project" if paths is None else ", ".join(str(p) for p in paths)
    print(f"excluded from the size rules: {', '.join(d + '/' for d in EXCLUDED)}; checked: {scope}")
    if violations:
        print(f"{len(violations)} violation(s):")
        for line in violations:
            print(f"  {line}")
    else:
        print("no violations")
    return len(violations)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: exit 1 on a violation, 0 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", nargs="+", type=Path, help="check only these files or folders")
    parser.add_argument("--top", type=int, default=10, help="how many of the longest to print")
    parser.add_argument("--root", type=Path, default=REPO, help="repository root (default: this checkout)")
    args = parser.parse_args(argv)
    repo = args.root.resolve()
    paths = None
    if args.paths:
        paths = [(p.resolve().relative_to(repo) if p.is_absolute() else p) for p in args.paths]
        paths = [Path(*p.parts) for p in paths]
    return 1 if check(repo, paths, args.top) else 0


if __name__ == "__main__":
    sys.exit(main())

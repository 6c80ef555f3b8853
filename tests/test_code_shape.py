"""The code's shape (issue 14): module and function sizes, no import cycle, what ``reports/`` imports.

Runs ``.ci/check_shape.py`` on the whole project (every rule must hold);
:func:`test_surface_files_pass` checks the ``--paths`` mode, and the unit tests check that the script
can fail.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / ".ci" / "check_shape.py"


def _run(*args: str, root: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), *args], capture_output=True, text=True, timeout=120
    )


def test_whole_project_has_the_shape() -> None:
    """Every rule holds over the whole project."""
    result = _run("--top", "20")
    assert result.returncode == 0, result.stdout


SURFACE = (
    "reports",
    "forensics/compare",
    "forensics/sweep",
    "forensics/service",
    "forensics/cli.py",
    "forensics/cli_common.py",
    "forensics/audit.py",
    "forensics/audit_cohort.py",
    "forensics/audit_execute.py",
    "forensics/audit_runs.py",
    "forensics/audit_store.py",
    "forensics/audit_worker.py",
    "forensics/run_limits.py",
    "forensics/atomic.py",
)


def test_surface_files_pass() -> None:
    """The reports, compare/sweep, service, CLI and audit files already keep every rule."""
    result = _run("--paths", *SURFACE)
    assert result.returncode == 0, result.stdout
    assert "longest modules" in result.stdout and "longest functions" in result.stdout


def _project(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    for pkg in ("forensics", "parsers", "reports"):
        (tmp_path / pkg).mkdir(exist_ok=True)
        (tmp_path / pkg / "__init__.py").touch()
    return tmp_path


def test_clean_project_passes(tmp_path: Path) -> None:
    """A small project that keeps the rules exits 0."""
    root = _project(tmp_path, {"forensics/model.py": "X = 1\n", "reports/a.py": "from forensics.model import X\n"})
    result = _run(root=root)
    assert result.returncode == 0, result.stdout
    assert "no violations" in result.stdout


def test_each_rule_fails(tmp_path: Path) -> None:
    """Each rule, broken once, is a violation and exit 1; tests are outside the size rules."""
    long_body = "".join(f"    x{i} = {i}\n" for i in range(61))
    root = _project(
        tmp_path,
        {
            "forensics/big.py": "".join(f"A{i} = {i}\n" for i in range(401)),
            "forensics/func.py": "def long():\n" + long_body,
            "parsers/a.py": "from parsers import b\n",
            "parsers/b.py": "def f():\n    from parsers.a import g\n",
            "reports/r.py": "from forensics import api\n",
            "forensics/api.py": "def load():\n    pass\n",
            "tests/test_x.py": "def test_long():\n" + long_body,
        },
    )
    result = _run(root=root)
    assert result.returncode == 1
    out = result.stdout
    assert "module forensics/big.py: 401 lines" in out
    assert "forensics/func.py:1 long: 62 lines" in out
    assert "import cycle: parsers.a <-> parsers.b" in out
    assert "reports import reports/r.py:1 imports forensics.api" in out
    assert "test_long" not in out.split("violation(s):")[1]  # tests are excluded from the size rules
    scoped = _run("--paths", "forensics/func.py", root=root)
    assert scoped.returncode == 1 and "big.py: 401" not in scoped.stdout.split("violation(s):")[1]


def test_type_checking_imports_are_not_cycles(tmp_path: Path) -> None:
    """An import under ``if TYPE_CHECKING:`` is not an edge of the import graph."""
    root = _project(
        tmp_path,
        {
            "parsers/a.py": "from parsers import b\n",
            "parsers/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from parsers import a\n",
        },
    )
    assert _run(root=root).returncode == 0

"""Issue 14: every threshold of the deciding code is a named field or a sourced constant (.ci/check_thresholds.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _checker():
    spec = importlib.util.spec_from_file_location("check_thresholds", ROOT / ".ci" / "check_thresholds.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_thresholds"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_no_inline_threshold_in_the_deciding_code(capsys) -> None:
    """The whole scope passes; the checker prints the modules with the most violations when one does not."""
    n = _checker().check(None)
    assert n == 0, capsys.readouterr().out


def test_each_rule_fails(tmp_path: Path) -> None:
    """An inline number and an unsourced constant are each reported; allowed values, round() and defaults are not."""
    chk = _checker()
    bad = tmp_path / "forensics" / "detectors" / "x.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("LIMIT = 3.0\n\n\ndef f(x, k=4.0):\n    return round(x * 2 + 1, 3) > 6.5 and k\n")
    tree = chk.ast.parse(bad.read_text())
    assert [v for _line, v in chk._inline_numbers(tree)] == [6.5]
    assert [name for _line, name in chk._unsourced_constants(tree, bad.read_text().splitlines())] == ["LIMIT"]
    sourced = 'LIMIT = 3.0\n"""Where 3 comes from."""\nOTHER = 2.5  # our choice\n'
    assert chk._unsourced_constants(chk.ast.parse(sourced), sourced.splitlines()) == []

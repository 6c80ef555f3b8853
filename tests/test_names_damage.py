"""Damaged and foreign-encoded text logs (parsers._text_damage): a crashed node's NUL blocks, UTF-16 with a BOM.

Each was rejected whole ("no parser recognised the format"): now the complete lines are read and the damage listed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from forensics.api import load


def _lines(n0: int, n1: int) -> bytes:
    return "".join(f"step {s} loss {2.0 / (1 + s / 50) + 0.3:.4f} lr 0.001\n" for s in range(n0, n1)).encode()


@pytest.mark.parametrize(("name", "data", "where"), [
    ("nul_tail", _lines(0, 600) + b"\0" * 4096, "NUL-filled tail"),
    ("nul_block", _lines(0, 300) + b"\0" * 5000 + _lines(300, 600), "NUL-filled block"),
    ("nul_cut", _lines(0, 300) + b"step 300 lo" + b"\0" * 4096 + _lines(301, 600), "the cut line before it"),
])
def test_nul_regions_are_listed_and_the_lines_around_read(tmp_path: Path, name: str, data: bytes,
                                                          where: str) -> None:
    """A crashed node's NUL tail or block: the complete lines are read, the region listed under skipped."""
    (tmp_path / "train.log").write_bytes(data)
    run = load(tmp_path)
    loss = run.metrics.filter(run.metrics["metric"] == "loss")
    assert loss.height == (599 if name == "nul_cut" else 600)
    assert any(where in s.reason for s in run.skipped), run.skipped


def test_a_binary_file_with_nuls_is_not_a_log(tmp_path: Path) -> None:
    """Short NUL runs among non-text bytes stay binary: not claimed as a text log."""
    from parsers import textlog

    q = tmp_path / "blob"
    q.write_bytes(b"\x00\x01step 1 loss 2\x00\x02" * 500)
    assert not textlog.sniff(q)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_utf16_logs_with_a_bom_are_decoded(tmp_path: Path, encoding: str) -> None:
    """PowerShell 5's ``python train.py > train.log`` writes UTF-16 with a BOM: read as text."""
    text = _lines(0, 600).decode()
    data = text.encode(encoding) if encoding == "utf-16" else b"\xfe\xff" + text.encode(encoding)
    (tmp_path / "train.txt").write_bytes(data)
    run = load(tmp_path)
    assert run.metrics.filter(run.metrics["metric"] == "loss").height == 600


def test_a_utf16_csv_is_decoded(tmp_path: Path) -> None:
    """Excel's "Unicode text" export: UTF-16 with a BOM, tab-separated."""
    rows = "step\tloss\n" + "".join(f"{s}\t{1.0 / (1 + s):.4f}\n" for s in range(50))
    (tmp_path / "history.csv").write_bytes(rows.encode("utf-16"))
    run = load(tmp_path)
    assert run.metrics.filter(run.metrics["metric"] == "loss").height == 50

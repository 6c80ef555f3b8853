"""Outputs the way a user shares them: whole, and readable by others."""

from __future__ import annotations


def test_reports_get_the_mode_open_would_give(tmp_path) -> None:
    """An atomically written report is readable by others under the usual umask (mkstemp alone makes 0600)."""
    import os
    import stat

    from forensics import atomic

    out = tmp_path / "report.html"
    atomic.write_text(out, "<!DOCTYPE html><html></html>")
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~atomic._UMASK
    assert os.access(out, os.R_OK)

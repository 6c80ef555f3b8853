"""Paste-ready trial settings: an lr read back from a float32 log carries no float32 noise."""

from __future__ import annotations

import numpy as np

from forensics.recovery._context import lr_digits


def test_float32_lr_is_shown_as_logged() -> None:
    """1.5e-4 stored as float32 reads 0.0001500000071...; x0.5 and x0.25 of it are shown as 7.5e-05 and 3.75e-05."""
    logged = float(np.float32(1.5e-4))
    assert logged != 1.5e-4
    assert (lr_digits(logged), lr_digits(logged * 0.5), lr_digits(logged * 0.25)) == (1.5e-4, 7.5e-05, 3.75e-05)
    assert lr_digits(6.0e-4 / 3) == 2.0e-4 and lr_digits(1.234567891e-3) == 1.234568e-3


def test_html_shows_backticked_commands_as_code_and_escapes_the_rest() -> None:
    """`forensics analyze` becomes <code>; a tag inside or outside a span stays escaped text."""
    from reports.escape import html_code_spans

    out = str(html_code_spans("`forensics analyze` on the trial; `<script>x</script>` and <b>bold</b>"))
    assert out.startswith("<code>forensics analyze</code> on the trial")
    assert "<script>" not in out and "<b>" not in out and "&lt;script&gt;" in out and "&lt;b&gt;" in out
    assert html_code_spans("no span <i>") == "no span <i>"  # left to autoescape unchanged

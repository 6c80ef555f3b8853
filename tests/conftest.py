"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def cases_dir() -> Path:
    """The acceptance cases folder (``../shared/cases``); skips the test when it is absent."""
    d = Path(os.environ.get("FORENSICS_CASES") or Path(__file__).resolve().parents[2] / "shared" / "cases")
    if not d.is_dir():
        pytest.skip(f"acceptance cases not found at {d}")
    return d


# CI runs every hypothesis test on a fixed sample (no flaky red runs); locally each run explores new examples.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

"""The detector registry's rules: one module per detector, named for its dotted name, nothing else beside them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import forensics.detectors as registry
from forensics.detectors import DETECTORS


def test_every_module_in_the_package_is_a_registered_detector() -> None:
    """Only detectors (and the contract, base.py) live in forensics/detectors/: helpers are in forensics/."""
    here = Path(registry.__file__).parent
    modules = {p.stem for p in here.glob("*.py")} - {"__init__", "base"}
    assert modules == {d.name.replace(".", "_") for d in DETECTORS}


def test_a_detector_in_a_module_not_named_for_it_is_refused() -> None:
    """_validate raises when the module name is not the dotted name (so the rule can fail)."""
    d = DETECTORS[2]
    renamed = type("Renamed", (type(d),), {"name": "loss.elsewhere", "__module__": type(d).__module__})
    with pytest.raises(RuntimeError, match="must be named for its dotted name"):
        registry._validate((dataclasses.replace(renamed()),))

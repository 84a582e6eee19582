"""Shared test fixtures: the reference data committed under tests/data (sources and licences in its SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


@pytest.fixture
def reference_data() -> Path:
    return DATA

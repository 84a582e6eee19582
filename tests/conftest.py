"""Shared test fixtures: paths to the reference data in ../shared (skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


@pytest.fixture
def shared_reference() -> Path:
    path = SHARED / "reference"
    if not path.is_dir():
        pytest.skip(f"reference data not found at {path} (../shared is absent in a plain clone)")
    return path

"""The flow-control benchmark's seed sweep on a tiny run: every seed's figures and their spread."""

from __future__ import annotations

import json

import pytest

from benchmarks.flow_control import RECOMMENDED, SEED_FIGURES, main, parse_seeds


def test_seed_lists_read_as_ranges_and_lists() -> None:
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("0-2,7") == [0, 1, 2, 7]
    assert parse_seeds("3") == [3]


def test_the_seed_sweep_reports_each_seed_and_the_spread(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seeds", "0-1", "--requests", "120"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"] == str(RECOMMENDED) and out["seeds"] == [0, 1]
    assert set(out["per_seed"]) == {"0", "1"}
    for name in SEED_FIGURES:
        values = [out["per_seed"][s][name] for s in ("0", "1")]
        spread = out["spread"][name]
        assert spread["min"] == min(values) and spread["max"] == max(values)
        assert spread["mean"] == pytest.approx(sum(values) / 2)

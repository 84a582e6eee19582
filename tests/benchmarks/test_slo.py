"""The SLO attainment benchmark runs end to end on a small trace: every policy gets a row with an attainment."""

from __future__ import annotations

import argparse

from benchmarks.slo import run


def test_every_policy_gets_an_attainment_row() -> None:
    args = argparse.Namespace(
        workload="azure-conv", requests=200, load="0.8", endpoints=4, profiles="h100,l4",
        scrape_interval=0.05, warmup=0.1, seed=0,
    )  # fmt: skip
    rows = [line for line in run(args) if line.startswith("| 0.80 |")]
    assert [row.split(" | ")[1] for row in rows] == ["default", "slo", "oracle", "slo-oracle"]
    for row in rows:
        assert 0.0 <= float(row.split(" | ")[2]) <= 1.0

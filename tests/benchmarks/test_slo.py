"""The SLO attainment benchmark runs end to end on a small trace: every policy gets a row with an attainment, for
both ways of drawing objectives; the class objectives are at least twice a request's own unloaded TTFT."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from benchmarks.slo import objectives, run
from benchmarks.workloads import load
from epp.sim.profiles import profile_named


def _args(spec: str, sheddable: float = 0.0, load: str = "0.8") -> argparse.Namespace:
    return argparse.Namespace(
        workload="azure-conv", requests=200, load=load, endpoints=4, profiles="h100,l4",
        scrape_interval=0.05, warmup=0.1, seed=0, objectives=spec, latency_weight=2.0, strategy="least",
        tiers_strategy="most", sheddable=sheddable,
    )  # fmt: skip


@pytest.mark.parametrize("spec", ["0.5:0.15,0.5:10", "relative"])
def test_every_policy_gets_an_attainment_row(spec: str) -> None:
    rows = [line for line in run(_args(spec)) if line.startswith("| 0.80 |")]
    names = ["default", "slo", "slo-tiers", "slo-tiers-queued", "oracle", "slo-oracle"]
    assert [row.split(" | ")[1] for row in rows] == names
    for row in rows:
        assert 0.0 <= float(row.split(" | ")[2]) <= 1.0
        assert all(0.0 <= float(v) <= 1.0 for v in row.split(" | ")[3].split(" / "))
        assert row.split(" | ")[4] == "0"  # nothing sheddable: nothing shed (the queue's TTL is not reached)


def test_with_sheddable_requests_the_admitter_gets_a_row_and_the_shed_are_counted_as_missed() -> None:
    rows = [line for line in run(_args("0.5:0.15,0.5:10", sheddable=1.0, load="1.5")) if line.startswith("| 1.50 |")]
    names = [row.split(" | ")[1] for row in rows]
    assert names == ["default", "slo", "slo-tiers", "slo-tiers-admit", "slo-tiers-queued", "oracle", "slo-oracle"]
    served = 200 - 20  # after the warm-up's 10 %
    for row in rows:
        shed = int(row.split(" | ")[4])
        assert 0 <= shed <= served
        assert float(row.split(" | ")[2]) <= 1.0 - shed / served + 1e-9  # a shed request never meets its SLO


def test_class_objectives_are_drawn_by_share_and_never_below_twice_the_unloaded_ttft() -> None:
    items = load("azure-conv", 400, None, 0)
    h100 = profile_named("h100")
    slos, classes = objectives(items, h100, 0, "0.5:0.15,0.5:10")
    own = np.array([it.prompt_tokens * h100.prefill_s_per_token + h100.step_base_s for it in items])
    assert (slos >= 2.0 * own - 1e-12).all()
    assert set(np.unique(classes).tolist()) == {0, 1} and 0.4 < float(np.mean(classes == 0)) < 0.6
    assert (slos[classes == 1] >= 10.0).all()


def test_the_queued_profile_reports_its_wait_in_the_pickers_queue_and_the_others_none() -> None:
    rows = {line.split(" | ")[1]: line for line in run(_args("0.5:0.15,0.5:10")) if line.startswith("| 0.80 |")}
    waits = rows["slo-tiers-queued"].rstrip(" |").split(" | ")[-1]
    p50, p90 = (float(v) for v in waits.split(" (")[0].split(" / "))
    assert 0.0 <= p50 <= p90
    assert all(rows[name].rstrip(" |").split(" | ")[-1] == "—" for name in ("default", "slo", "slo-tiers"))

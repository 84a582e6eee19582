"""Every panel of the Grafana dashboard has data: the demo's stack (`epp sim` servers, `epp serve` with its default
serving workers, Envoy from the production bootstrap) under the demo's traffic, scraped by a real Prometheus every
second, then every query of manifests/dashboards/epp-grafana.json asked of that Prometheus. An error panel may
read 0 (nothing failed), never nothing. The shipped alert rules are loaded into the same Prometheus: all healthy,
none pending or firing over a healthy run, and the picker raises none of its degradation alarms.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.dashboard import Run, Traffic, observed_run
from tests.support import dashboard
from tests.support.procs import ROOT
from tests.support.prometheus import require_binaries

pytestmark = pytest.mark.timeout(240)

RULES = ROOT / "manifests" / "monitoring" / "epp-alerts.rules.yaml"
# Short and light (two heterogeneous servers, short shared contexts), and enough repeats for the prefix index to
# hit and for the sampled plugin timings (one pick in 64) to have samples.
TRAFFIC = Traffic(
    seconds=15, rate=12, profiles=("h100", "l4"), groups=4, context_tokens=512, output_tokens=16, drain_s=20
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    require_binaries()
    workdir = tmp_path_factory.mktemp("dashboard")
    with observed_run(workdir, TRAFFIC, 1.0, [RULES], io.StringIO()) as observed:
        yield observed


def _window(run: Run) -> str:
    """A rate window over the whole run: an instant query at its end sees every request."""
    return f"{math.ceil(run.end - run.start) + 5}s"


def test_the_demo_traffic_was_answered(run: Run) -> None:
    assert run.sent == round(TRAFFIC.seconds * TRAFFIC.rate)
    assert run.ok == run.sent


def test_every_dashboard_query_returns_a_series(run: Run) -> None:
    window = _window(run)
    empty = [
        (title, expr)
        for title, expr in dashboard.queries(dashboard.load())
        if not run.server.query(dashboard.concrete(expr, window))
    ]
    assert not empty, f"queries with no series after {run.sent} requests: {empty}"


def test_every_panel_that_is_not_an_error_count_has_a_number(run: Run) -> None:
    """NaN (a quantile over no observations) would be an empty graph in Grafana too."""
    window = _window(run)
    blank = []
    for panel in dashboard.panels(dashboard.load()):
        values = [
            float(sample["value"][1])
            for target in panel.targets
            for sample in run.server.query(dashboard.concrete(target.expr, window))
        ]
        if not any(v == v for v in values):
            blank.append(panel.title)
    assert not blank, f"panels whose every series is NaN: {blank}"


def test_the_alert_rules_load_and_stay_silent_over_a_healthy_run(run: Run, tmp_path: Path) -> None:
    groups = run.server.rules()
    rules = [rule for group in groups for rule in group["rules"]]
    assert {g["name"] for g in groups} == {"epp-degradation", "epp-pool", "epp-metrics"}
    assert len(rules) == 8
    assert [r["name"] for r in rules if r["health"] != "ok"] == []
    assert [(r["name"], r["state"]) for r in rules if r["state"] != "inactive"] == []


def test_no_degradation_alarm_is_raised_over_the_healthy_run(run: Run) -> None:
    """The picker's own alarms (llm_d_epp_degraded, every watched pair exported at 0) stay 0 all along."""
    assert run.server.query("llm_d_epp_degraded"), "no alarm series: the watched pairs are exported from the start"
    raised = run.server.query(f"max_over_time(llm_d_epp_degraded[{_window(run)}]) > 0")
    assert [sample["metric"] for sample in raised] == []

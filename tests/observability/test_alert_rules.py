"""The shipped alert rules (manifests/monitoring): valid for Prometheus, each alert firing on the input series of
its promtool test and silent where it should be, and the operator's PrometheusRule the same rules.

The alerts themselves loaded into a real Prometheus over the demo's traffic (and silent there):
tests/e2e/test_dashboard_data.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.support.procs import ROOT
from tests.support.prometheus import require_binaries

pytestmark = pytest.mark.process

MONITORING = ROOT / "manifests" / "monitoring"
RULES = MONITORING / "epp-alerts.rules.yaml"
RULE_TESTS = MONITORING / "epp-alerts.test.yaml"
# The alarms the picker's families stand for (docs/observability.md, "Alert rules").
EXPECTED = {
    "EppRoutingDegraded",
    "EppNoReadyEndpoints",
    "EppHighErrorRatio",
    "EppFlowControlQueueSaturated",
    "EppEndpointMetricsStale",
    "EppScrapeProcessDown",
    "EppEndpointScrapeFailing",
    "EppMetricsScrapeFailing",
}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_binaries().promtool
    return subprocess.run([str(promtool), *args], cwd=MONITORING, capture_output=True, text=True, timeout=60)


def test_promtool_accepts_the_rules_file() -> None:
    result = _promtool("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(EXPECTED)} rules found" in result.stdout


def test_every_alert_fires_on_its_promtool_test_series_and_only_there() -> None:
    result = _promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_promtool_test_that_sees_it_fire() -> None:
    rules = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert rules == EXPECTED
    firing = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert firing == EXPECTED


def test_every_alert_says_how_bad_and_what_it_means() -> None:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
            assert "job" in rule["expr"], f"{rule['alert']}: not grouped by job (one alert per picker)"


def test_the_prometheusrule_is_rendered_from_the_rules_file() -> None:
    check = subprocess.run(
        [sys.executable, "tools/prometheus_rule.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stderr
    resource = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert resource["kind"] == "PrometheusRule"
    assert resource["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    assert "prometheusrule.yaml" in yaml.safe_load((MONITORING / "kustomization.yaml").read_text())["resources"]

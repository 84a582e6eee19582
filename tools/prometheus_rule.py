"""Render manifests/monitoring/prometheusrule.yaml (the Prometheus Operator's PrometheusRule) from the plain rules
file manifests/monitoring/epp-alerts.rules.yaml, so the two never disagree: the plain file is the one source.

    .venv/bin/python tools/prometheus_rule.py          # rewrite prometheusrule.yaml
    .venv/bin/python tools/prometheus_rule.py --check  # exit 1 if it is not what the rules file renders

tests/observability/test_alert_rules.py runs the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

MONITORING = Path(__file__).resolve().parents[1] / "manifests" / "monitoring"
RULES = MONITORING / "epp-alerts.rules.yaml"
OUTPUT = MONITORING / "prometheusrule.yaml"
HEADER = (
    "# Generated from epp-alerts.rules.yaml by `python tools/prometheus_rule.py`: edit that file, not this one.\n"
    "# Needs the PrometheusRule CRD (monitoring.coreos.com/v1, Prometheus Operator); the `release` label is what a\n"
    "# kube-prometheus-stack Prometheus selects rules by by default: change it to your ruleSelector.\n"
)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the longer expressions) as literal blocks, as they are written in the rules file."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(rules_text: str) -> str:
    groups = yaml.safe_load(rules_text)["groups"]
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "epp-alerts", "labels": {"app.kubernetes.io/part-of": "epp", "release": "prometheus"}},
        "spec": {"groups": groups},
    }
    return HEADER + yaml.dump(resource, Dumper=_Dumper, sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    rendered = render(RULES.read_text())
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != rendered:
            print(f"{OUTPUT} is not what {RULES.name} renders: run python tools/prometheus_rule.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())

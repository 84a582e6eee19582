"""The Grafana dashboard's panels and queries, read from its JSON the way Grafana reads them.

One reader for the tests of the dashboard (every query names exported series, every query returns a series from a
real Prometheus) and for benchmarks/dashboard.py, which renders the same queries to docs/dashboard.png.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "manifests" / "dashboards" / "epp-grafana.json"
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")
_LABEL_VALUES = re.compile(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")
_LABEL_VALUES_CALL = re.compile(r"^label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)$")


@dataclass(frozen=True, slots=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True, slots=True)
class Panel:
    id: int
    title: str
    unit: str
    targets: tuple[Target, ...]


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def panels(dashboard: dict[str, Any]) -> list[Panel]:
    """Every panel with queries, in the dashboard's order (rows' nested panels included; rows themselves not)."""
    out: list[Panel] = []

    def walk(items: list[dict[str, Any]]) -> None:
        for item in items:
            if item.get("targets"):
                out.append(
                    Panel(
                        id=int(item["id"]),
                        title=str(item["title"]),
                        unit=str(item.get("fieldConfig", {}).get("defaults", {}).get("unit", "")),
                        targets=tuple(Target(str(t["expr"]), str(t.get("legendFormat", ""))) for t in item["targets"]),
                    )
                )
            walk(item.get("panels", []))

    walk(dashboard["panels"])
    return out


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, query) for every target of every panel, and the variables' queries."""
    out = [(panel.title, target.expr) for panel in panels(dashboard) for target in panel.targets]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            out.append((f"variable {variable['name']}", variable["definition"]))
    return out


def metrics_named(query: str) -> set[str]:
    return set(_SELECTOR.findall(query)) | set(_LABEL_VALUES.findall(query))


def concrete(expr: str, rate_interval: str, job: str = ".*") -> str:
    """The query as Grafana sends it: the `job` variable and `$__rate_interval` filled in; a variable's
    `label_values(series, label)` (Grafana's, not PromQL) as the PromQL query whose series carry those values."""
    call = _LABEL_VALUES_CALL.match(expr.strip())
    if call:
        expr = f"group by ({call.group(2)}) ({call.group(1)})"
    return expr.replace("$__rate_interval", rate_interval).replace("$job", job)


def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's legendFormat: `{{label}}` replaced by the series' label value."""
    if not template:
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)

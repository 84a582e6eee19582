"""The Grafana dashboard in manifests/dashboards/ asks only for series `epp serve` really exports.

A dashboard whose panel names a metric the picker does not export shows "No data" exactly when someone needs it;
this test reads every query of every panel and checks each metric it names against a running picker's /metrics
(families are exported with their HELP/TYPE lines even before the first sample, so no traffic is needed).
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest

from tests.support.dashboard import load, metrics_named, panels, queries
from tests.support.procs import free_port, http_ok, running, serve_argv, wait_until

pytestmark = pytest.mark.process

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
}


def exported_series(text: str) -> set[str]:
    """Every series name a scrape of this page can return, from its TYPE lines and its samples. A histogram's or a
    summary's own name is no series (only its `_bucket`, `_sum`, `_count` are): a query of it never has data."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            base = name.removesuffix("_total") if kind == "counter" else name
            names |= {base + s for s in _SUFFIXES.get(kind, ())} if kind in ("histogram", "summary") else {name}
            if kind == "counter":
                names |= {base + s for s in _SUFFIXES["counter"]}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_the_dashboard_is_well_formed() -> None:
    dashboard = load()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    found = queries(dashboard)
    assert len(found) >= 15
    for title, query in found:
        assert metrics_named(query), f"{title}: no metric selector in {query!r}"


def test_every_panel_has_a_query_a_title_and_a_unit() -> None:
    dashboard = load()
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    graphs = panels(dashboard)
    assert len(graphs) + len(rows) == len(dashboard["panels"]), "a panel without a query"
    for panel in graphs:
        assert panel.title and panel.unit, panel
        for target in panel.targets:
            assert 'job=~"$job"' in target.expr, f"{panel.title}: {target.expr} ignores the job variable"


def test_every_panel_query_names_only_exported_series(tmp_path: Path) -> None:
    metrics_port = free_port()
    argv = serve_argv(free_port(), free_port(), metrics_port, "--static-endpoints", "127.10.0.1:8000")
    with running(argv, tmp_path / "serve.log") as proc:
        # Ready: with serving workers (the default on a machine with cores for them) the request series are theirs,
        # in /metrics from the moment one serves.
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "serve", proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
            exported = exported_series(response.read().decode())
    missing = {
        (title, name) for title, query in queries(load()) for name in metrics_named(query) if name not in exported
    }
    assert not missing, f"panels query series /metrics does not export: {sorted(missing)}"

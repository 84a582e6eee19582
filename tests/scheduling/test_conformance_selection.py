"""Conformance's `header-based-testing-filter`: keeps exactly the endpoints `test-epp-endpoint-selection` names."""

from __future__ import annotations

import numpy as np
import pytest

from epp.config.decode import parse_config
from epp.datastore import EndpointTable
from epp.datastore.table import EndpointInfo, MetricsSample
from epp.requests import parse_request
from epp.scheduling import build_scheduler
from epp.scheduling.conformance_selection import selected

ADDRESSES = ("127.10.0.1:8000", "127.10.0.2:8000", "127.10.0.2:8001", "[::1]:8000")


def _table() -> EndpointTable:
    table = EndpointTable()
    for address in ADDRESSES:
        slot = table.upsert(EndpointInfo(address=address))
        table.record_scrape(slot, MetricsSample(waiting=0.0, kv_usage=0.1), now=1.0)
    return table


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("127.10.0.1", ["127.10.0.1:8000"]),
        ("127.10.0.2:8001", ["127.10.0.2:8001"]),  # with a port: that exact endpoint
        ("127.10.0.2:8001, 127.10.0.1", ["127.10.0.2:8001", "127.10.0.1:8000"]),  # the header's order
        ("[::1]:8000", ["[::1]:8000"]),
        ("127.10.0.9, 127.10.0.1:9999", []),
        ("127.10.0.1,127.10.0.1:8000", ["127.10.0.1:8000"]),  # each once
    ],
)
def test_selection_names_ips_or_exact_endpoints(header: str, expected: list[str]) -> None:
    snapshot = _table().view()
    chosen = selected(snapshot, np.flatnonzero(snapshot.present).astype(np.int64), header)
    assert [snapshot.addresses[s] for s in chosen.tolist()] == expected


def test_the_filter_plugin_routes_to_the_named_endpoint_and_nowhere_without_the_header() -> None:
    config = parse_config(
        {
            "apiVersion": "llm-d.ai/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": [{"type": "header-based-testing-filter"}, {"type": "random-picker"}],
            "schedulingProfiles": [
                {"name": "p", "plugins": [{"pluginRef": "header-based-testing-filter"}, {"pluginRef": "random-picker"}]}
            ],
        },
        "conformance.yaml",
    )
    scheduler = build_scheduler(config, seed=0)
    snapshot = _table().view()
    candidates = np.flatnonzero(snapshot.present).astype(np.int64)
    body = b'{"model": "m", "prompt": "p"}'
    named = parse_request("r", "/v1/completions", {"test-epp-endpoint-selection": "127.10.0.2:8000"}, body)
    for _ in range(10):
        (slot,) = scheduler.handler.pick(snapshot, candidates, named, 1.0)[:1]
        assert snapshot.addresses[slot] == "127.10.0.2:8000"
    assert not len(scheduler.handler.pick(snapshot, candidates, parse_request("r", "/v1/completions", {}, body), 1.0))

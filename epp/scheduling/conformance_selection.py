"""Conformance's endpoint selection: the `test-epp-endpoint-selection` header names the endpoints a test wants.

Upstream's conformance suite drives the picker with this header (IPs, or ip:port for an exact endpoint, comma
separated). It is honoured only where an operator asked for it: the `header-based-testing-filter` plugin in the
config, or `epp serve --enable-test-endpoint-selection` (the director then narrows candidates before scheduling).
Both use `selected`, one definition. Never enable it in production: it lets a client choose its endpoint.
"""

from __future__ import annotations

import numpy as np

from epp import wire
from epp.datastore import Snapshot
from epp.datastore.table import IntArray
from epp.scheduling.framework import CycleState

HEADER = wire.TEST_ENDPOINT_SELECTION_HEADER


def _host(item: str) -> tuple[str, str]:
    """(host, port) of `ip`, `ip:port`, `[v6]`, `[v6]:port` or a bare v6 address; port "" when absent."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else ""
    if item.count(":") == 1:
        host, port = item.split(":")
        return host, port
    return item, ""


def selected(snapshot: Snapshot, candidates: IntArray, header: str) -> IntArray:
    """The candidates the header names, in the header's order, each once; none when it names none of them."""
    wanted = [_host(part.strip()) for part in header.split(",") if part.strip()]
    by_address: dict[str, int] = {}
    by_ip: dict[str, int] = {}
    for slot in candidates.tolist():
        address = snapshot.addresses[slot]
        host, port = _host(address)
        by_address[f"{host}:{port}"] = slot
        by_ip.setdefault(host, slot)
    chosen: list[int] = []
    for host, port in wanted:
        slot = by_address.get(f"{host}:{port}") if port else by_ip.get(host)
        if slot is not None and slot not in chosen:
            chosen.append(slot)
    return np.array(chosen, dtype=np.int64)


class HeaderBasedTestingFilter:
    """Upstream's `header-based-testing-filter`: keeps the endpoints the header names; no header keeps none."""

    type_name = "header-based-testing-filter"

    def __init__(self, name: str) -> None:
        self.name = name

    def filter(self, state: CycleState, candidates: IntArray) -> IntArray:
        header = state.request.headers.get(HEADER, "").strip()
        if not header:
            return candidates[:0]
        return selected(state.snapshot, candidates, header)

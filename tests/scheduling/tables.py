"""Builders for scheduling tests: an endpoint table with given metrics, and requests."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from epp.datastore import EndpointTable, Snapshot
from epp.datastore.table import EndpointInfo, MetricsSample
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling.framework import CycleState

NOW = 1000.0
NAN = math.nan


def address(i: int) -> str:
    return f"127.10.{i // 250}.{i % 250 + 1}:8000"


def table_with(
    rows: Sequence[Mapping[str, object]],
    scraped_at: float = NOW,
    labels: Sequence[Mapping[str, str]] | None = None,
) -> EndpointTable:
    """One endpoint per row; a row holds MetricsSample fields; `scraped=False` leaves it never scraped."""
    table = EndpointTable(initial_capacity=max(1, len(rows)))
    for i, row in enumerate(rows):
        fields = dict(row)
        scraped = fields.pop("scraped", True)
        info = EndpointInfo(address=address(i), labels=dict(labels[i]) if labels else {}, pod_name=f"pod-{i}")
        slot = table.upsert(info)
        if scraped:
            table.record_scrape(slot, MetricsSample(**fields), now=scraped_at)  # type: ignore[arg-type]
    return table


def request(prompt: str = "", model: str = "m", session: str | None = None, **kw: object) -> InferenceRequest:
    return InferenceRequest(
        request_id="r", api=ApiKind.COMPLETIONS, model=model, prompt=prompt, session_token=session, **kw
    )  # type: ignore[arg-type]


def state(snapshot: Snapshot, req: InferenceRequest | None = None, now: float = NOW) -> CycleState:
    return CycleState(snapshot, snapshot.slots, req or request(), now)

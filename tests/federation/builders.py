"""Small builders shared by the federation tests: a local table with metrics, sites, a router, a director."""

from __future__ import annotations

from typing import Any

from epp.config.federation import parse_federation
from epp.datastore import EndpointInfo, EndpointTable, MetricsSample
from epp.datastore.pool import FailureMode
from epp.datastore.sites import Site, SiteRegistry
from epp.director import Director
from epp.federation.policy import FederationRouter
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import Scheduler
from tests.support.schedulers import RandomScheduler

NOW = 1_000.0


def local_table(n: int, waiting: float = 0.0, now: float = NOW) -> EndpointTable:
    """n local endpoints at 127.10.0.x, scraped at `now` with `waiting` queued requests each."""
    table = EndpointTable()
    for i in range(n):
        slot = table.upsert(EndpointInfo(address=f"127.10.0.{i + 1}:8000"))
        table.record_scrape(slot, MetricsSample(waiting=waiting, running=1.0, kv_usage=0.1), now)
    table.synced = True
    return table


def site(name: str, tier: str, n: int, *, age: float | None = 0.0, **fields: Any) -> Site:
    """A healthy site at 127.20.0.n:8080 whose last heartbeat is `age` seconds before NOW (None: never)."""
    values: dict[str, Any] = {
        "address": f"127.20.0.{n}:8080",
        "heartbeat_interval_s": 30.0,
        "last_heartbeat": None if age is None else NOW - age,
        "gpus_total": 8,
        "gpus_allocatable": 4,
        "services_total": 2,
        "services_ready": 2,
        "services_failed": 0,
    }
    values.update(fields)
    return Site(name=name, tier=tier, **values)


def registry(*sites: Site) -> SiteRegistry:
    reg = SiteRegistry()
    reg.replace_all(sites)
    return reg


def router(sites: SiteRegistry, local_tier: str = "edge", federation: Any = None) -> FederationRouter:
    return FederationRouter(parse_federation(federation, "test.yaml"), sites, local_tier)


def director(
    table: EndpointTable,
    fed: FederationRouter | None,
    mode: FailureMode = FailureMode.FAIL_CLOSE,
    scheduler: Any = None,
) -> Director:
    return Director(
        table,
        Scheduler(scheduler or RandomScheduler(seed=1)),
        clock=lambda: NOW,
        failure_mode=lambda: mode,
        federation=fed,
    )


def request(model: str = "llama", objective: str | None = None, **headers: str) -> InferenceRequest:
    return InferenceRequest(
        request_id="r",
        api=ApiKind.COMPLETIONS,
        model=model,
        prompt="hi",
        objective=objective,
        headers={k.replace("_", "-"): v for k, v in headers.items()},
    )

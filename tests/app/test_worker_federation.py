"""Federation in serving workers: the watch runs once, in the control process, which sends every worker the sites
when they change; a worker's router reads its own copy, which is empty until the first message, so a worker that
has not heard the sites routes nothing remote (residency fails closed)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from epp.app.config_file import load_config
from epp.app.federation import worker_federation
from epp.app.settings import FederationFlags, ServeSettings
from epp.app.worker import Sites
from epp.app.workers import WorkerPool
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.pool import FailureMode
from epp.datastore.sites import SiteRegistry
from epp.datastore.table import EndpointTable
from epp.errors import EppError, ErrorCode
from tests.federation.builders import director, local_table, request, site

CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins: [{type: queue-scorer}]
schedulingProfiles: [{name: default, plugins: [{pluginRef: queue-scorer}]}]
federation:
  residency:
    rules:
      - {name: eu-data, modelPrefixes: ["eu/"], tiers: [eu]}
"""


def _always_saturated(*_: Any) -> bool:
    return True


def test_a_worker_that_has_not_heard_the_sites_routes_nothing_remote(tmp_path: Path) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(CONFIG)
    parts = worker_federation(FederationFlags(tier="us", watch=True), load_config(path), _always_saturated)
    assert parts is not None
    router, sites = parts
    assert len(sites) == 0 and not sites.synced
    d = director(local_table(2), router)
    # saturated, but no site heard of: the unrestricted request stays local
    assert d.decide(request("llama"), None).site is None
    # restricted to eu, local tier us, no site heard of: refused, never sent anywhere
    with pytest.raises(EppError) as exc:
        d.decide(request("eu/llama"), None)
    assert exc.value.code is ErrorCode.SERVICE_UNAVAILABLE
    # the control process's sites arrive: the same requests overflow where their rules allow
    sites.replace_all([site("eu-2", "eu", 2)])
    sites.synced = True
    decision = d.decide(request("eu/llama"), None)
    assert decision.site == "eu-2" and decision.addresses == ("127.20.0.2:8080",)


def test_federation_is_off_in_a_worker_unless_asked_for() -> None:
    assert worker_federation(FederationFlags(), None, None) is None


def test_the_control_process_sends_the_sites_to_every_worker_when_they_change() -> None:
    registry = SiteRegistry()
    pool = WorkerPool(
        2, ServeSettings(), EndpointTable(), ObjectiveStore(), lambda: FailureMode.FAIL_CLOSE, lambda: "", lambda: None,
        sites=registry, max_endpoints=8,
    )  # fmt: skip
    sent: list[list[Any]] = [[], []]
    for worker, inbox in zip(pool._workers, sent, strict=True):
        worker.child.send = inbox.append  # type: ignore[method-assign,assignment]
    try:
        pool._publish()
        assert [type(m) for m in sent[0] if isinstance(m, Sites)] == [Sites]  # the first view, empty, unsynced
        pool._publish()
        assert sum(isinstance(m, Sites) for m in sent[1]) == 1  # nothing changed: nothing sent again
        registry.replace_all([site("eu-2", "eu", 2)])
        registry.synced = True
        pool._publish()
        for inbox in sent:
            last = [m for m in inbox if isinstance(m, Sites)][-1]
            assert last.synced and [s.name for s in last.sites] == ["eu-2"]
        pool._started(pool._workers[0])  # a worker (re)started gets the current view with its membership
        assert isinstance(sent[0][-1], Sites) and sent[0][-1].sites[0].name == "eu-2"
    finally:
        asyncio.run(pool.stop(0.0))

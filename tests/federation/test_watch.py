"""The FederatedCluster watch of `epp serve` against the fake API server, through the real kubernetes client:
list, events, a dropped stream, compacted history (410 → re-list), a missing CRD, and a bad kubeconfig."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from epp.app.federation import FederationParts, build_federation
from epp.app.settings import FederationFlags
from epp.datastore.pool import FailureMode
from epp.errors import ConfigError
from tests.fakes.apiserver import DEFAULT_RESOURCES, FakeApiServer, Resource

FC = Resource("federation.llmkube.dev", "v1alpha1", "federatedclusters", "FederatedCluster", namespaced=False)


def fc(name: str, tier: str = "dc", heartbeat: str = "2026-11-29T19:00:00Z") -> dict[str, Any]:
    return {
        "apiVersion": "federation.llmkube.dev/v1alpha1",
        "kind": "FederatedCluster",
        "metadata": {"name": name, "annotations": {"federation.epp.dev/gateway-address": "127.30.0.1:8080"}},
        "spec": {"dataResidencyTier": tier, "heartbeatIntervalSeconds": 30},
        "status": {"lastHeartbeatTime": heartbeat},
    }


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(resources=(*DEFAULT_RESOURCES, FC)) as server:
        yield server


def _parts(kubeconfig: Path) -> FederationParts:
    args = FederationFlags(tier="eu", watch=True)
    parts = build_federation(args, FailureMode.FAIL_CLOSE)
    assert parts is not None
    parts.connect(str(kubeconfig))
    return parts


async def _until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def watching(parts: FederationParts):  # type: ignore[no-untyped-def]
    task = parts.start()
    assert task is not None
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_sites_follow_the_objects_through_drops_and_compaction(api: FakeApiServer, tmp_path: Path) -> None:
    api.apply(fc("a"))
    api.apply(fc("b", tier="eu"))
    parts = _parts(api.write_kubeconfig(tmp_path / "kubeconfig"))
    sites = parts.sites
    async with watching(parts):
        await _until(lambda: sites.synced and len(sites) == 2, "listed")
        assert sites.get("b").tier == "eu"  # type: ignore[union-attr]
        first = sites.get("a").last_heartbeat  # type: ignore[union-attr]

        api.apply(fc("a", heartbeat="2026-11-29T19:00:30Z"))  # a heartbeat arrives as MODIFIED
        await _until(lambda: sites.get("a").last_heartbeat != first, "heartbeat")  # type: ignore[union-attr]
        assert sites.get("a").last_heartbeat == pytest.approx(first + 30.0, abs=0.5)  # type: ignore[union-attr]

        api.drop_watches()  # a broken stream: resumed from the last resourceVersion
        api.delete("federation.llmkube.dev/v1alpha1", "FederatedCluster", None, "b")
        await _until(lambda: "b" not in sites, "deleted after a dropped stream")

        api.compact()  # history gone: resuming gets 410, the watch lists again
        api.drop_watches()
        api.apply(fc("c"))
        await _until(lambda: "c" in sites, "re-listed after 410")
        assert sorted(s.name for s in sites.sites()) == ["a", "c"]
    assert api.calls and {c.verb for c in api.calls if "federatedclusters" in c.path} <= {"list", "watch"}


async def test_a_missing_crd_is_an_empty_synced_view(tmp_path: Path) -> None:
    with FakeApiServer() as bare:
        parts = _parts(bare.write_kubeconfig(tmp_path / "kubeconfig"))
        async with watching(parts):
            await _until(lambda: parts.sites.synced, "empty list")
            assert len(parts.sites) == 0


def test_a_bad_kubeconfig_ends_start_up_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--federation-watch: --kubeconfig .*missing"):
        _parts(tmp_path / "missing")

"""FederatedCluster objects → sites: tier, address (config wins over annotation), heartbeat on the picker's clock."""

from typing import Any

import pytest

from epp.datastore.sites import SiteRegistry
from epp.federation.watch import GATEWAY_ADDRESS_ANNOTATION, SiteFeed, parse_timestamp, site_from_object

WALL = 1_800_000_000.0  # 2027-01-15T08:00:00Z
MONO = 500.0


def fc(name: str = "dc-1", *, address: str | None = "127.30.0.1:8080", **status: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "federation.llmkube.dev/v1alpha1",
        "kind": "FederatedCluster",
        "metadata": {"name": name},
        "spec": {"displayName": "DC", "dataResidencyTier": "eu", "heartbeatIntervalSeconds": 30},
        "status": {
            "lastHeartbeatTime": "2027-01-15T07:59:50Z",
            "phase": "Unreachable",
            "capacity": {"nodes": 2, "gpusTotal": 8, "gpusAllocatable": 3},
            "inference": {"models": 1, "servicesTotal": 2, "servicesReady": 2, "servicesFailed": 0},
            **status,
        },
    }
    if address is not None:
        obj["metadata"]["annotations"] = {GATEWAY_ADDRESS_ANNOTATION: address}
    return obj


def test_a_full_object_becomes_a_site_with_its_heartbeat_on_the_monotonic_clock() -> None:
    site = site_from_object(fc(), {}, WALL, MONO)
    assert site is not None
    assert (site.name, site.tier, site.address, site.display_name) == ("dc-1", "eu", "127.30.0.1:8080", "DC")
    assert site.last_heartbeat == pytest.approx(MONO - 10.0)
    assert site.heartbeat_interval_s == 30.0
    assert (site.gpus_allocatable, site.services_ready, site.services_failed) == (3, 2, 0)
    assert site.reported_phase == "Unreachable"  # kept to show, never trusted


@pytest.mark.parametrize(
    ("annotation", "config", "address", "problem"),
    [
        ("127.30.0.1:8080", {}, "127.30.0.1:8080", ""),
        ("127.30.0.1:8080", {"dc-1": "127.30.0.9:9000"}, "127.30.0.9:9000", ""),
        (None, {"dc-1": "127.30.0.9:9000"}, "127.30.0.9:9000", ""),
        (None, {}, None, "no federation.epp.dev/gateway-address annotation"),
        ("gw.example.com:443", {}, None, "host must be an IP address"),
        ("127.30.0.1", {}, None, "must be ip:port"),
    ],
    ids=["annotation", "config-wins", "config-only", "none", "hostname", "no-port"],
)
def test_gateway_address(annotation: str | None, config: dict[str, str], address: str | None, problem: str) -> None:
    site = site_from_object(fc(address=annotation), config, WALL, MONO)
    assert site is not None
    assert site.address == address
    assert problem in site.address_problem and bool(problem) == bool(site.address_problem)


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        ("2027-01-15T08:00:00Z", WALL),
        ("2027-01-15T08:00:00.250Z", WALL + 0.25),
        ("2027-01-15T09:00:00+01:00", WALL),
        ("2027-01-15T08:00:00", WALL),
        ("yesterday", None),
        (None, None),
        (12345, None),
    ],
    ids=["utc", "fraction", "offset", "naive-is-utc", "garbage", "missing", "number"],
)
def test_parse_timestamp(text: object, epoch: float | None) -> None:
    assert parse_timestamp(text) == epoch


def test_a_sparse_or_broken_object_never_raises() -> None:
    site = site_from_object({"metadata": {"name": "bare"}, "spec": "x", "status": {"capacity": []}}, {}, WALL, MONO)
    assert site is not None
    assert site.last_heartbeat is None and site.tier == "" and site.services_ready is None
    assert site_from_object({"metadata": {}}, {}, WALL, MONO) is None
    assert site_from_object(fc(inference={"servicesReady": "2"}), {}, WALL, MONO).services_ready is None  # type: ignore[union-attr]


def test_feed_reconciles_lists_and_applies_events() -> None:
    registry = SiteRegistry()
    feed = SiteFeed(registry, {}, wall_clock=lambda: WALL, mono_clock=lambda: MONO)
    feed.listed([fc("a"), fc("b")])
    assert registry.synced and [s.name for s in registry.sites()] == ["a", "b"]
    feed.changed("MODIFIED", fc("a", lastHeartbeatTime="2027-01-15T08:00:00Z"))
    assert registry.get("a").last_heartbeat == MONO  # type: ignore[union-attr]
    feed.changed("ADDED", fc("c", address=None))
    assert registry.get("c").address is None  # type: ignore[union-attr]
    feed.changed("DELETED", fc("b"))
    feed.listed([fc("c"), {"metadata": {}}])  # a re-list after 410: a and b are gone, the nameless one ignored
    assert [s.name for s in registry.sites()] == ["c"]

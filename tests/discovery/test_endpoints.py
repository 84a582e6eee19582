"""Upstream's endpoint rules: which pods count, at which addresses, with which engine."""

from __future__ import annotations

import pytest

from epp.datastore.pool import PoolSpec
from epp.discovery.kubernetes.endpoints import endpoints_of, join_host_port, pod_view, pool_endpoints
from tests.discovery.k8s_objects import pod

POOL = PoolSpec(name="pool", selector={"app": "vllm"}, target_ports=(8000, 8001))

CASES = [
    (
        "ready matching pod: one endpoint per target port",
        pod("p", ip="127.10.0.1"),
        ["127.10.0.1:8000", "127.10.0.1:8001"],
    ),
    ("not ready", pod("p", ip="127.10.0.1", ready=False), []),
    ("being deleted", pod("p", ip="127.10.0.1", deleting=True), []),
    ("no pod IP yet", pod("p", ip=None), []),
    ("labels do not match", pod("p", ip="127.10.0.1", labels={"app": "other"}), []),
    (
        "extra labels are fine",
        pod("p", ip="127.10.0.1", labels={"app": "vllm", "x": "y"}),
        ["127.10.0.1:8000", "127.10.0.1:8001"],
    ),
    ("active-ports narrows", pod("p", ip="127.10.0.1", active_ports="8001"), ["127.10.0.1:8001"]),
    (
        "active-ports outside targetPorts ignored",
        pod("p", ip="127.10.0.1", active_ports="9999,8000"),
        ["127.10.0.1:8000"],
    ),
    ("empty active-ports: none active", pod("p", ip="127.10.0.1", active_ports=""), []),
    ("junk in active-ports skipped", pod("p", ip="127.10.0.1", active_ports=" 8000 ,x,"), ["127.10.0.1:8000"]),
]


@pytest.mark.parametrize(("pod_obj", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pod_counts_as_upstream_says(pod_obj, expected) -> None:
    assert [e.address for e in endpoints_of(pod_view(pod_obj), POOL)] == expected


def test_engine_comes_from_the_label_and_defaults_to_vllm() -> None:
    [sg] = endpoints_of(pod_view(pod("a", ip="127.10.0.1", engine="sglang")), POOL)[:1]
    [vl] = endpoints_of(pod_view(pod("b", ip="127.10.0.2")), POOL)[:1]
    assert (sg.engine, sg.pod_name, vl.engine) == ("sglang", "a", "vllm")


def test_no_pool_means_no_endpoints() -> None:
    assert endpoints_of(pod_view(pod("a", ip="127.10.0.1")), None) == ()


def test_odd_pod_objects_do_not_crash() -> None:
    for odd in ({}, {"metadata": None, "status": None}, {"metadata": {"name": "x", "labels": "junk"}}):
        assert endpoints_of(pod_view(odd), POOL) == ()


def test_ipv6_addresses_are_bracketed() -> None:
    assert join_host_port("::1", 8000) == "[::1]:8000"
    assert join_host_port("127.10.0.1", 8000) == "127.10.0.1:8000"


def test_pool_endpoints_are_ordered_by_pod_then_port() -> None:
    views = [pod_view(pod("b", ip="127.10.0.2")), pod_view(pod("a", ip="127.10.0.1"))]
    assert [e.address for e in pool_endpoints(views, POOL)] == [
        "127.10.0.1:8000",
        "127.10.0.1:8001",
        "127.10.0.2:8000",
        "127.10.0.2:8001",
    ]

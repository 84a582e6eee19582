"""Scenarios against the fake API server, asserted through a real `epp serve` process's `/debug/pool`.

After each disturbance the picker's endpoint set must equal the truth (computed independently, tests/discovery/
truth.py) within 2 seconds. One picker process serves the whole module; each test starts from a clean pool.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.discovery.k8s_objects import objective, pod, pool, rewrite
from tests.discovery.pickers import ServedPicker, eventually, served_picker
from tests.discovery.truth import expected_endpoints
from tests.fakes.apiserver import FakeApiServer

pytestmark = pytest.mark.process
WITHIN_S = 2.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeApiServer, ServedPicker]]:
    tmp = tmp_path_factory.mktemp("k8s")
    with FakeApiServer() as api:
        api.apply(pool())
        kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
        with served_picker(kubeconfig, tmp / "epp.log", "--pool-name", "pool", "--pool-namespace", "default") as p:
            yield api, p


@pytest.fixture
def api(cluster: tuple[FakeApiServer, ServedPicker]) -> FakeApiServer:
    api, _ = cluster
    api.release_watches()
    api.apply(pool())
    for obj in api.list("v1", "Pod"):
        api.delete("v1", "Pod", obj["metadata"]["namespace"], obj["metadata"]["name"])
    return api


@pytest.fixture
def picker(cluster: tuple[FakeApiServer, ServedPicker], api: FakeApiServer) -> ServedPicker:
    _, picker = cluster
    converged(api, picker)
    return picker


def converged(api: FakeApiServer, picker: ServedPicker) -> None:
    truth = expected_endpoints(api)
    eventually(
        lambda: picker.endpoints() == truth,
        WITHIN_S,
        lambda: f"picker has {sorted(picker.endpoints())}, truth is {sorted(truth)}",
    )


def test_pods_appear_flip_readiness_change_ip_and_are_deleted(api: FakeApiServer, picker: ServedPicker) -> None:
    steps = [
        lambda: api.apply(pod("vllm-0", ip="127.10.0.1")),
        lambda: api.apply(pod("vllm-1", ip="127.10.0.2", engine="sglang")),
        lambda: api.apply(pod("vllm-0", ip="127.10.0.1", ready=False)),
        lambda: api.apply(pod("vllm-0", ip="127.10.0.1", ready=True)),
        lambda: api.apply(pod("vllm-1", ip="127.10.0.3", engine="sglang")),
        lambda: api.apply(pod("vllm-0", ip="127.10.0.1", deleting=True)),
        lambda: api.apply(pod("other", ip="127.10.0.9", labels={"app": "other"})),
        lambda: api.delete("v1", "Pod", "default", "vllm-1"),
    ]
    for step in steps:
        step()
        converged(api, picker)
    report = picker.report()
    assert report["synced"] and report["ready"]


def test_engine_label_pod_name_and_labels_reach_the_table(api: FakeApiServer, picker: ServedPicker) -> None:
    api.apply(pod("sg-0", ip="127.10.0.4", engine="sglang"))
    converged(api, picker)
    [endpoint] = picker.report()["endpoints"]
    assert (endpoint["engine"], endpoint["pod"]) == ("sglang", "sg-0")
    assert endpoint["labels"]["app"] == "vllm"


def test_pool_selector_target_ports_and_failure_mode_change_live(api: FakeApiServer, picker: ServedPicker) -> None:
    api.apply(pod("a", ip="127.10.0.1", labels={"app": "vllm", "tier": "gold"}))
    api.apply(pod("b", ip="127.10.0.2", labels={"app": "vllm"}, active_ports="8001"))
    converged(api, picker)
    api.apply(pool(ports=(8000, 8001)))
    converged(api, picker)
    assert picker.endpoints() == {"127.10.0.1:8000", "127.10.0.1:8001", "127.10.0.2:8001"}
    api.apply(pool(selector={"tier": "gold"}, ports=(8000, 8001), failure_mode="FailOpen"))
    converged(api, picker)
    eventually(
        lambda: picker.report()["pool"]["failureMode"] == "FailOpen", WITHIN_S, lambda: str(picker.report()["pool"])
    )


def test_deleted_pool_empties_the_table_and_readiness_goes_not_serving(
    api: FakeApiServer, picker: ServedPicker
) -> None:
    api.apply(pod("a", ip="127.10.0.1"))
    converged(api, picker)
    assert picker.readiness()
    api.delete("inference.networking.k8s.io/v1", "InferencePool", "default", "pool")
    converged(api, picker)
    eventually(lambda: not picker.readiness(), WITHIN_S, lambda: "readiness still SERVING")
    api.apply(pool())
    converged(api, picker)
    eventually(picker.readiness, WITHIN_S, lambda: "readiness not back to SERVING")


def test_watch_dropped_mid_stream_loses_nothing(api: FakeApiServer, picker: ServedPicker) -> None:
    api.apply(pod("a", ip="127.10.0.1"))
    converged(api, picker)
    api.drop_watches()
    api.apply(pod("b", ip="127.10.0.2"))
    api.delete("v1", "Pod", "default", "a")
    converged(api, picker)


def test_gone_forces_relist_while_a_pod_was_deleted_in_the_gap(api: FakeApiServer, picker: ServedPicker) -> None:
    api.apply(pod("a", ip="127.10.0.1"))
    api.apply(pod("b", ip="127.10.0.2"))
    converged(api, picker)
    lists_before = sum(c.verb == "list" and c.path.endswith("/pods") for c in api.calls)
    api.hold_watches()
    api.drop_watches()
    api.delete("v1", "Pod", "default", "a")
    api.compact()
    api.release_watches()
    converged(api, picker)
    assert picker.endpoints() == {"127.10.0.2:8000"}
    assert sum(c.verb == "list" and c.path.endswith("/pods") for c in api.calls) > lists_before


def test_objectives_and_rewrites_for_the_pool_are_loaded(api: FakeApiServer, picker: ServedPicker) -> None:
    """Through the process only readiness is visible; the store contents are checked in test_source.py."""
    api.apply(objective("critical", 10))
    api.apply(objective("other-pool", 5, pool_name="someone-else"))
    api.apply(rewrite("canary", "llama", {"llama-v2": 1}, group="llm-d.ai"))
    converged(api, picker)
    assert picker.readiness()

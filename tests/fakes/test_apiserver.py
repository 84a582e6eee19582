"""The fake API server speaks the protocol the real client expects: the parts other engineers will lean on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from epp.discovery.kubernetes.rest import ApiError, KubeRest, ResourceRef, load_api_client
from tests.fakes.apiserver import Call, FakeApiServer, Resource

LEASES = ResourceRef("coordination.k8s.io", "v1", "leases", namespace="default")
SITES = ResourceRef("federation.llmkube.dev", "v1alpha1", "federatedclusters")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApiServer, KubeRest]]:
    with FakeApiServer() as server:
        server.register(Resource("federation.llmkube.dev", "v1alpha1", "federatedclusters", "FederatedCluster", False))
        client = load_api_client(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        yield server, KubeRest(client)
        client.close()


def lease(holder: str, rv: str | None = None) -> dict:
    meta = {"name": "l"} | ({"resourceVersion": rv} if rv else {})
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {"holderIdentity": holder},
    }


def test_create_get_update_and_conflicts(api) -> None:
    server, rest = api
    created = rest.call("POST", LEASES.collection_path(), body=lease("a"))
    with pytest.raises(ApiError) as exists:
        rest.call("POST", LEASES.collection_path(), body=lease("b"))
    assert exists.value.status == 409 and "AlreadyExists" in exists.value.body
    rv = created["metadata"]["resourceVersion"]
    updated = rest.call("PUT", LEASES.item_path("l"), body=lease("b", rv))
    with pytest.raises(ApiError) as stale:
        rest.call("PUT", LEASES.item_path("l"), body=lease("c", rv))  # the old resourceVersion
    assert stale.value.status == 409 and "Conflict" in stale.value.body
    assert rest.call("GET", LEASES.item_path("l"))["spec"]["holderIdentity"] == "b"
    assert int(updated["metadata"]["resourceVersion"]) > int(rv)
    assert [c.verb for c in server.calls] == ["create", "create", "update", "update", "get"]
    assert server.calls[-1] == Call("get", "/apis/coordination.k8s.io/v1/namespaces/default/leases/l")


def test_status_subresource_updates_status_only(api) -> None:
    server, rest = api
    site = {"apiVersion": "federation.llmkube.dev/v1alpha1", "kind": "FederatedCluster", "metadata": {"name": "eu"}}
    rest.call("POST", SITES.collection_path(), body={**site, "spec": {"region": "eu"}, "status": {"phase": "x"}})
    assert "status" not in server.get("federation.llmkube.dev/v1alpha1", "FederatedCluster", None, "eu")
    rest.call(
        "PUT", SITES.item_path("eu", "status"), body={**site, "spec": {"region": "us"}, "status": {"phase": "Ready"}}
    )
    stored = server.get("federation.llmkube.dev/v1alpha1", "FederatedCluster", None, "eu")
    assert (stored["spec"], stored["status"]) == ({"region": "eu"}, {"phase": "Ready"})
    patched = rest.call(
        "PATCH",
        SITES.item_path("eu"),
        body={"metadata": {"labels": {"tier": "gold"}}},
        content_type="application/merge-patch+json",
    )
    assert patched["metadata"]["labels"] == {"tier": "gold"}


def test_list_filters_and_unknown_paths(api) -> None:
    server, rest = api
    for name, labels in (("a", {"app": "x"}), ("b", {"app": "y"})):
        server.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}})
    pods = ResourceRef("", "v1", "pods", namespace="default")
    assert [
        p["metadata"]["name"] for p in rest.call("GET", pods.collection_path(), {"labelSelector": "app=y"})["items"]
    ] == ["b"]
    assert [
        p["metadata"]["name"]
        for p in rest.call("GET", pods.collection_path(), {"fieldSelector": "metadata.name=a"})["items"]
    ] == ["a"]
    with pytest.raises(ApiError) as missing:
        rest.call("GET", "/apis/example.invalid/v1/widgets")
    assert missing.value.status == 404


def test_wrong_token_gets_401(api, tmp_path: Path) -> None:
    server, _ = api
    client = load_api_client(str(server.write_kubeconfig(tmp_path / "bad", token="wrong")))
    with pytest.raises(ApiError) as denied:
        KubeRest(client).call("GET", LEASES.collection_path())
    client.close()
    assert denied.value.status == 401 and server.rejected == 1

"""The gateway samples in manifests/gateways stay consistent with what was measured (docs/failure-modes.md):
FailOpen never with a full-duplex body, the failure mode mirrors the pool's, and our routing headers are
stripped early wherever a gateway would read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2
from envoy.extensions.http.early_header_mutation.header_mutation.v3 import header_mutation_pb2
from google.protobuf import any_pb2, json_format

from epp import wire
from epp.datastore.pool import FailureMode, parse_pool

SAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "gateways"
GATEWAYS = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir())


def documents(gateway: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((SAMPLES / gateway).glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_every_gateway_has_a_sample() -> None:
    assert GATEWAYS == ["envoy-gateway", "istio", "kgateway"]


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_each_sample_has_one_valid_pool_and_a_route_to_it(gateway: str) -> None:
    docs = documents(gateway)
    (pool,) = of_kind(docs, "InferencePool")
    parse_pool(pool, source=gateway)
    (route,) = of_kind(docs, "HTTPRoute")
    (gw,) = of_kind(docs, "Gateway")
    assert route["spec"]["parentRefs"][0]["name"] == gw["metadata"]["name"]


def test_envoy_gateway_fail_open_mirrors_the_pool_and_never_uses_full_duplex() -> None:
    docs = documents("envoy-gateway")
    pool = parse_pool(of_kind(docs, "InferencePool")[0])
    (policy,) = of_kind(docs, "EnvoyExtensionPolicy")
    (ext_proc,) = policy["spec"]["extProc"]
    assert ext_proc["failOpen"] is (pool.failure_mode is FailureMode.FAIL_OPEN)
    modes = ext_proc["processingMode"]
    bodies = {modes.get(side, {}).get("body") for side in ("request", "response")}
    if ext_proc["failOpen"]:
        assert "FullDuplexStreamed" not in bodies
    assert wire.LB_NAMESPACE in ext_proc["metadata"]["writableNamespaces"]


def test_envoy_gateway_strips_the_header_its_load_balancer_reads() -> None:
    docs = documents("envoy-gateway")
    (traffic,) = of_kind(docs, "BackendTrafficPolicy")
    sources = traffic["spec"]["loadBalancer"]["endpointOverride"]["extractFrom"]
    assert sources == [{"header": wire.DESTINATION_HEADER}]
    (client,) = of_kind(docs, "ClientTrafficPolicy")
    assert client["spec"]["headers"]["earlyRequestHeaders"]["remove"] == list(wire.ROUTING_HEADERS)


def test_istio_strips_our_headers_with_a_real_early_header_mutation() -> None:
    (envoy_filter,) = of_kind(documents("istio"), "EnvoyFilter")
    value = envoy_filter["spec"]["configPatches"][0]["patch"]["value"]["typed_config"]
    # The patch is a real HttpConnectionManager fragment: it parses with Envoy's own API stubs.
    assert header_mutation_pb2.HeaderMutation.DESCRIPTOR  # imported so the Any inside can be resolved
    packed = json_format.ParseDict(value, any_pb2.Any())
    manager = http_connection_manager_pb2.HttpConnectionManager()
    assert packed.Unpack(manager)
    (early,) = value["early_header_mutation_extensions"]
    assert [m["remove"] for m in early["typed_config"]["mutations"]] == list(wire.ROUTING_HEADERS)


def test_every_sample_dials_the_picker_over_tls_as_it_serves_by_default() -> None:
    (rule,) = of_kind(documents("istio"), "DestinationRule")
    assert rule["spec"]["host"].startswith("vllm-pool-epp.")
    assert rule["spec"]["trafficPolicy"]["tls"] == {"mode": "SIMPLE", "insecureSkipVerify": True}
    eg = documents("envoy-gateway")
    (backend,) = of_kind(eg, "Backend")
    assert backend["spec"]["tls"] == {"insecureSkipVerify": True}
    assert backend["spec"]["endpoints"][0]["fqdn"]["port"] == 9002
    (policy,) = of_kind(eg, "EnvoyExtensionPolicy")
    assert policy["spec"]["extProc"][0]["backendRefs"] == [
        {"group": "gateway.envoyproxy.io", "kind": "Backend", "name": backend["metadata"]["name"]}
    ]
    assert "TLS" in (SAMPLES / "kgateway" / "inference.yaml").read_text().split("apiVersion")[0]

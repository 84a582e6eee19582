"""Operator input for the gateway renderer: addresses parse one way everywhere, and bad input names the flag."""

from __future__ import annotations

import re

import pytest

from epp.datastore.pool import FailureMode, PoolSpec
from epp.errors import ConfigError
from epp.gateway import BodyMode, GatewayOptions, HostPort, parse_endpoint_list, parse_host_port

POOL = PoolSpec("pool", selector={"app": "vllm"}, target_ports=(8000,))
OPEN_POOL = PoolSpec("pool", selector={"app": "vllm"}, target_ports=(8000,), failure_mode=FailureMode.FAIL_OPEN)
EPP = HostPort("127.0.0.1", 9002)


@pytest.mark.parametrize(
    ("text", "default", "expected"),
    [
        ("127.0.0.1:9002", None, HostPort("127.0.0.1", 9002)),
        (" epp.default.svc:9002 ", None, HostPort("epp.default.svc", 9002)),
        ("[::1]:8080", None, HostPort("::1", 8080)),
        ("epp", 9002, HostPort("epp", 9002)),
        ("[::1]", 80, HostPort("::1", 80)),
    ],
    ids=["ipv4", "dns-name", "ipv6", "default-port", "ipv6-default-port"],
)
def test_addresses_parse(text: str, default: int | None, expected: HostPort) -> None:
    assert parse_host_port(text, "--epp", default) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty address"),
        ("127.0.0.1", "missing ':port'"),
        ("127.0.0.1:http", "not a number"),
        ("127.0.0.1:70000", "out of range"),
        ("::1:80", "[addr]:port"),
        ("[::1:80", "unbalanced"),
        (":80", "missing host"),
    ],
    ids=["empty", "no-port", "port-text", "port-range", "bare-ipv6", "unbalanced", "no-host"],
)
def test_bad_addresses_name_the_flag_and_the_reason(text: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(reason)) as caught:
        parse_host_port(text, "--epp")
    assert str(caught.value).startswith("--epp: ")


def test_ipv6_renders_back_with_brackets() -> None:
    assert str(HostPort("::1", 80)) == "[::1]:80"
    assert HostPort("::1", 80).is_ip
    assert not HostPort("epp.svc", 80).is_ip


def test_endpoint_lists_take_ips_only_and_no_duplicates() -> None:
    assert parse_endpoint_list("127.10.0.1:8000, 127.10.0.2:8000,") == (
        HostPort("127.10.0.1", 8000),
        HostPort("127.10.0.2", 8000),
    )
    with pytest.raises(ConfigError, match="use --endpoints-dns"):
        parse_endpoint_list("vllm.svc:8000")
    with pytest.raises(ConfigError, match="listed twice"):
        parse_endpoint_list("127.10.0.1:8000,127.10.0.1:8000")
    with pytest.raises(ConfigError, match="no endpoint"):
        parse_endpoint_list(" , ")


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"pool": OPEN_POOL}, "FailOpen needs the pool's endpoints"),
        (
            {"pool": OPEN_POOL, "endpoints_dns": "vllm", "body_mode": BodyMode.FULL_DUPLEX_STREAMED},
            "FailOpen does not work with --body-mode FULL_DUPLEX_STREAMED",
        ),
        ({"endpoints": (HostPort("127.10.0.1", 8000),), "endpoints_dns": "vllm"}, "exclude each other"),
        ({"message_timeout_s": 0}, "--message-timeout"),
        ({"max_message_timeout_s": 5}, "--max-message-timeout must be at least --message-timeout and the picker"),
        ({"message_timeout_s": 40}, "--max-message-timeout must be at least --message-timeout"),
        ({"retries": -1}, "--retries"),
        ({"max_body_bytes": 0}, "--max-body-bytes"),
    ],
    ids=[
        "fail-open-without-members",
        "fail-open-full-duplex",
        "two-member-sources",
        "timeout",
        "max-timeout-under-the-queue-hold",
        "max-timeout-under-the-timeout",
        "retries",
        "body",
    ],
)
def test_inconsistent_options_are_refused_before_rendering(kwargs: dict[str, object], reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        GatewayOptions(**{"pool": POOL, "epp": EPP, **kwargs})  # type: ignore[arg-type]


def test_fail_open_full_duplex_renders_only_when_asked_for() -> None:
    options = GatewayOptions(
        pool=OPEN_POOL,
        epp=EPP,
        endpoints_dns="vllm",
        body_mode=BodyMode.FULL_DUPLEX_STREAMED,
        allow_full_duplex_fail_open=True,
    )
    assert options.fail_open

"""TLS on the picker's ext_proc port through a real Envoy: on by default, plaintext refused, a certificate swapped on
disk served to new connections without a restart and without a failed request, and `--secure-serving=false`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.app.tls import self_signed_pair
from epp.gateway.testbed import gateway_bootstrap
from tests.e2e.conftest import Backends, Picker, start_picker
from tests.support.envoy import envoy, run_envoy
from tests.support.procs import free_port, http_ok, running, serve_argv, wait_until
from tests.support.tls import presented_certificate

CHAT = "/v1/chat/completions"
RECONNECT_EVERY = 4  # Envoy opens a new TLS connection to the picker every few streams: handshakes during the swap


def _body(i: int) -> bytes:
    return json.dumps({"model": "m1", "messages": [{"role": "user", "content": f"tls {i}"}]}).encode()


def _write_pair(directory: Path) -> bytes:
    """A fresh key and certificate written in place, key first: for a moment the files do not match."""
    key_pem, cert_pem = self_signed_pair()
    (directory / "tls.key").write_bytes(key_pem)
    (directory / "tls.crt").write_bytes(cert_pem)
    return cert_pem


def _same_certificate(a: bytes, b: bytes) -> bool:
    return b"".join(a.split()) == b"".join(b.split())


def _stat(admin: int, name: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/stats?filter=^{name}$") as response:
        line = response.read().decode().strip()
    return int(line.rsplit(":", 1)[1]) if line else 0


def test_the_ext_proc_port_refuses_a_plaintext_client_and_the_health_port_stays_plaintext(
    e2e_tmp: Path, backends: Backends
) -> None:
    health = free_port()
    picker = Picker(grpc_port=free_port(), metrics_port=free_port())
    argv = serve_argv(picker.grpc_port, health, picker.metrics_port, "--static-endpoints", backends.pool[0])
    with running(argv, e2e_tmp / "picker-plaintext-refused.log") as proc:
        wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve", proc)
        with (
            grpc.insecure_channel(f"127.0.0.1:{picker.grpc_port}") as channel,
            pytest.raises(grpc.RpcError) as refused,
        ):
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert b"BEGIN CERTIFICATE" in presented_certificate(picker.grpc_port)
        with grpc.insecure_channel(f"127.0.0.1:{health}") as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="inference-extension"), timeout=3
            )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture
def reloading_picker(e2e_tmp: Path, backends: Backends) -> Iterator[tuple[Picker, Path]]:
    certs = e2e_tmp / "certs"
    certs.mkdir(exist_ok=True)
    _write_pair(certs)
    argv, picker = start_picker(
        e2e_tmp, ",".join(backends.pool), "--cert-path", str(certs), "--enable-cert-reload", "--grace-period", "5"
    )
    with running(argv, e2e_tmp / "picker-reload.log") as proc:
        wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve", proc)
        yield picker, certs


def _reconnecting_gateway(listen: int, admin: int, epp_port: int) -> dict[str, Any]:
    config = gateway_bootstrap(listen, admin, epp_port, "FULL_DUPLEX_STREAMED")
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] == "epp":
            options = cluster["typed_extension_protocol_options"]
            http = options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
            http["common_http_protocol_options"] = {"max_requests_per_connection": RECONNECT_EVERY}
    return config


async def test_a_certificate_swapped_on_disk_is_served_to_new_connections_and_no_request_fails(
    e2e_tmp: Path, backends: Backends, reloading_picker: tuple[Picker, Path]
) -> None:
    picker, certs = reloading_picker
    before = presented_certificate(picker.grpc_port)
    listen, admin = free_port(), free_port()
    statuses: Counter[int] = Counter()
    stop = asyncio.Event()

    async def load(session: aiohttp.ClientSession) -> None:
        # Bounded: at most 400 requests or 30 s, whichever comes first; stops early once the swap is seen.
        deadline = time.monotonic() + 30
        for i in range(400):
            if stop.is_set() or time.monotonic() > deadline:
                return
            async with session.post(
                f"http://127.0.0.1:{listen}{CHAT}", data=_body(i), headers={"content-type": "application/json"}
            ) as response:
                await response.read()
                statuses[response.status] += 1

    with run_envoy(e2e_tmp, _reconnecting_gateway(listen, admin, picker.grpc_port), "reload"):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            workers = [asyncio.create_task(load(session)) for _ in range(4)]
            await asyncio.sleep(1.0)  # load running, connections cycling
            swapped_at = time.monotonic()
            new_cert = await asyncio.to_thread(_write_pair, certs)
            seen_after = None
            while time.monotonic() - swapped_at < 10:
                presented = await asyncio.to_thread(presented_certificate, picker.grpc_port)
                if _same_certificate(presented, new_cert):
                    seen_after = time.monotonic() - swapped_at
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # more requests over connections made with the new certificate
            stop.set()
            await asyncio.gather(*workers)
        handshakes = _stat(admin, "cluster.epp.upstream_cx_total")
    print(f"new certificate served after {seen_after}s; statuses {dict(statuses)}; Envoy connections {handshakes}")
    assert not _same_certificate(before, new_cert)
    assert seen_after is not None, "the new certificate was not served to a new connection within 10 s"
    assert set(statuses) == {200}, statuses
    assert sum(statuses.values()) >= 40
    assert handshakes >= sum(statuses.values()) // RECONNECT_EVERY  # Envoy reconnected (and handshook) throughout


async def test_secure_serving_false_keeps_plaintext(e2e_tmp: Path, backends: Backends, envoy_available: None) -> None:
    argv, picker = start_picker(e2e_tmp, ",".join(backends.pool), "--secure-serving=false")
    with running(argv, e2e_tmp / "picker-plaintext.log") as proc:
        wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve", proc)
        with envoy(e2e_tmp, picker.grpc_port, "FULL_DUPLEX_STREAMED", tls=False) as port:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"http://127.0.0.1:{port}{CHAT}", data=_body(0), headers={"content-type": "application/json"}
                ) as response,
            ):
                assert response.status == 200
                assert response.headers["x-served-by"] in backends.pool
    assert "ext_proc (plaintext)" in (e2e_tmp / "picker-plaintext.log").read_text()


def _every_line_json(log: Path) -> list[dict[str, Any]]:
    records = []
    for line in log.read_bytes().splitlines():
        record = json.loads(line)  # raises on the first line that is not JSON
        assert isinstance(record, dict), line
        records.append(record)
    return records


@pytest.mark.parametrize("transport", ["grpc", "native"])
async def test_with_the_json_encoder_every_line_the_picker_writes_is_json(
    e2e_tmp: Path, backends: Backends, envoy_available: None, transport: str
) -> None:
    """`--zap-encoder json`, serving workers and TLS: a client whose SNI the certificate does not name, a plaintext
    client, then requests through Envoy; every line of the picker's stdout and stderr, its workers' and gRPC core's
    included, parses as a JSON object. With `--extproc-transport=grpc` gRPC core logs the SNI mismatch itself, in
    C++, and its errors are kept as records; the native front (Python's ssl) does not check the SNI and logs
    nothing of these clients."""
    log = e2e_tmp / f"picker-json-logs-{transport}.log"
    argv, picker = start_picker(
        e2e_tmp, ",".join(backends.pool), "--zap-encoder", "json", "--workers", "2", f"--extproc-transport={transport}"
    )
    with running(argv, log) as proc:
        wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve", proc)
        for _ in range(3):
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            with (
                socket.create_connection(("127.0.0.1", picker.grpc_port), timeout=5) as raw,
                context.wrap_socket(raw, server_hostname="epp") as tls,
            ):
                tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            with socket.create_connection(("127.0.0.1", picker.grpc_port), timeout=5) as plain:
                plain.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                with contextlib.suppress(OSError):
                    plain.recv(100)
        with envoy(e2e_tmp, picker.grpc_port, "FULL_DUPLEX_STREAMED") as port:
            async with aiohttp.ClientSession() as session:
                for i in range(5):
                    async with session.post(
                        f"http://127.0.0.1:{port}{CHAT}", data=_body(i), headers={"content-type": "application/json"}
                    ) as response:
                        assert response.status == 200
        time.sleep(0.5)
    records = _every_line_json(log)
    if transport == "grpc":
        assert any(r.get("logger") == "grpc" and "server name" in str(r.get("msg")) for r in records), records[-5:]
    assert any("serving" in str(r.get("msg")) for r in records)


def _reconnecting_gateway_to(listen: int, admin: int, epp_port: int, every: int) -> dict[str, Any]:
    config = gateway_bootstrap(listen, admin, epp_port, "BUFFERED")
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] == "epp":
            http = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
            http["common_http_protocol_options"] = {"max_requests_per_connection": every}
    return config


async def test_with_two_workers_a_reconnect_resumes_its_tls_session_whichever_worker_takes_it(
    e2e_tmp: Path, backends: Backends, envoy_available: None
) -> None:
    """Envoy renews its connection every 4 streams and offers its session ticket; the kernel hands each new
    connection to either worker. Every worker seals and opens tickets with the control process's keys, so all but
    the first handshake resume (with each worker's own keys about half would be full handshakes)."""
    argv, picker = start_picker(e2e_tmp, ",".join(backends.pool), "--workers", "2")
    listen, admin = free_port(), free_port()
    with running(argv, e2e_tmp / "picker-tickets.log") as proc:
        wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve", proc)
        wait_until(lambda: all(w["serving"] for w in _debug_workers(picker)), 60, "every worker", proc)
        with run_envoy(e2e_tmp, _reconnecting_gateway_to(listen, admin, picker.grpc_port, RECONNECT_EVERY), "tickets"):
            async with aiohttp.ClientSession() as session:
                for i in range(80):  # one at a time: each new connection starts after the last one's ticket came
                    async with session.post(
                        f"http://127.0.0.1:{listen}{CHAT}", data=_body(i), headers={"content-type": "application/json"}
                    ) as response:
                        assert response.status == 200
            handshakes = _stat(admin, "cluster.epp.ssl.handshake")
            resumed = _stat(admin, "cluster.epp.ssl.session_reused")
        wait_until(lambda: sum(w["streams"] for w in _debug_workers(picker)) >= 80, 30, "the workers' counts", proc)
        served = [w["streams"] for w in _debug_workers(picker)]
    print(f"handshakes {handshakes}, resumed {resumed}, streams by worker {served}")
    assert handshakes >= 80 // RECONNECT_EVERY
    assert all(s > 0 for s in served), served  # both workers took connections: resumption crossed workers
    assert handshakes - resumed <= 2, (handshakes, resumed)


def _debug_workers(picker: Picker) -> list[dict[str, Any]]:
    with urllib.request.urlopen(picker.url("/debug/pool"), timeout=5) as r:
        workers: list[dict[str, Any]] = json.loads(r.read())["workers"]
    return workers

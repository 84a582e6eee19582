"""The rendered gateway's routing mechanics, driven by a scripted picker so each case is exact: the picker's
fallback list is walked on retry, a picker cannot send traffic outside the pool, and a request the picker did
not decide is refused (FailClose) or balanced over the pool (FailOpen).

The scripted picker is a few lines of ext_proc (BUFFERED: pass the headers, decide on the body) answering with
whatever the test sets; the real picker is exercised in test_failure_modes.py.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp import wire
from epp.app.tls import self_signed_pair
from epp.gateway.binary import find_envoy
from tests.e2e.conftest import Backends
from tests.support.procs import ROOT, epp_argv, free_port, http_ok, running, wait_until


@dataclass
class ScriptedPicker(pb_grpc.ExternalProcessorServicer):
    """Answers every request with `decision` ("" = decide nothing: no header, no metadata)."""

    decision: str = ""
    streams: int = field(default=0)

    async def Process(
        self, requests: AsyncIterator[pb.ProcessingRequest], context: object
    ) -> AsyncIterator[pb.ProcessingResponse]:  # type: ignore[override]
        self.streams += 1
        async for request in requests:
            kind = request.WhichOneof("request")
            if kind == "request_headers":
                yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
            elif kind == "request_body":
                answer = pb.ProcessingResponse(request_body=pb.BodyResponse())
                if self.decision:
                    header = base_pb2.HeaderValue(key=wire.DESTINATION_HEADER, raw_value=self.decision.encode())
                    common = answer.request_body.response
                    common.header_mutation.set_headers.append(base_pb2.HeaderValueOption(header=header))
                    common.clear_route_cache = True
                    lb = answer.dynamic_metadata.fields[wire.LB_NAMESPACE].struct_value
                    lb.fields[wire.DESTINATION_HEADER].string_value = self.decision
                yield answer
            elif kind == "response_headers":
                yield pb.ProcessingResponse(response_headers=pb.HeadersResponse())


@dataclass(frozen=True)
class Gateway:
    url: str
    picker: ScriptedPicker
    dead_member: str


def render(tmp: Path, mode: str, epp_port: int, listen: int, admin: int, members: list[str]) -> Path:
    pool = tmp / f"scripted-pool-{mode}.yaml"
    pool.write_text(
        "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\n"
        f"metadata: {{name: scripted-{mode.lower()}}}\n"
        f"spec: {{selector: {{matchLabels: {{app: x}}}}, targetPorts: [{{number: 8000}}],"
        f" endpointPickerRef: {{name: epp, failureMode: {mode}}}}}\n"
    )
    config = tmp / f"scripted-envoy-{mode}.yaml"
    argv = epp_argv(
        "envoy-config", "--pool-file", str(pool), "--epp", f"127.0.0.1:{epp_port}",
        "--listen", f"127.0.0.1:{listen}", "--admin", f"127.0.0.1:{admin}",
        "--endpoints", ",".join(members), "-o", str(config),
    )  # fmt: skip
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return config


@pytest.fixture(scope="module", params=["FailOpen", "FailClose"])
def gateway_process(
    request: pytest.FixtureRequest, envoy_available: None, e2e_tmp: Path, backends: Backends
) -> Iterator[tuple[str, int, str, str]]:
    mode = request.param
    epp_port, listen, admin = free_port(), free_port(), free_port()
    dead_member = f"127.0.0.1:{free_port()}"  # a pool member with nothing listening
    config = render(e2e_tmp, mode, epp_port, listen, admin, [*backends.pool, dead_member])
    argv = [str(find_envoy()), "-c", str(config), "--disable-hot-restart", "-l", "warn", "--concurrency", "1"]
    with running(argv, e2e_tmp / f"scripted-envoy-{mode}.log") as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{admin}/ready"), 60, "envoy", proc)
        yield mode, epp_port, f"http://127.0.0.1:{listen}", dead_member


@pytest.fixture
async def gateway(gateway_process: tuple[str, int, str, str]) -> AsyncIterator[Gateway]:
    _, epp_port, url, dead_member = gateway_process
    picker = ScriptedPicker()
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(picker, server)
    server.add_secure_port(f"127.0.0.1:{epp_port}", grpc.ssl_server_credentials([self_signed_pair()]))  # as epp
    await server.start()
    try:
        yield Gateway(url, picker, dead_member)
    finally:
        await server.stop(grace=None)


async def post(gateway: Gateway, headers: dict[str, str] | None = None) -> tuple[int, str | None, str]:
    body = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "hi"}]})
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(
            gateway.url + "/v1/chat/completions",
            data=body,
            headers={"content-type": "application/json", **(headers or {})},
        ) as response,
    ):
        return response.status, response.headers.get("x-served-by"), await response.text()


async def test_retries_walk_the_pickers_fallback_list(gateway: Gateway, backends: Backends) -> None:
    gateway.picker.decision = f"{gateway.dead_member},{backends.pool[1]}"
    for _ in range(5):
        status, served_by, _ = await post(gateway)
        assert (status, served_by) == (200, backends.pool[1])


async def test_the_picker_cannot_send_traffic_outside_the_pool(gateway: Gateway, backends: Backends) -> None:
    gateway.picker.decision = backends.decoy
    for _ in range(5):
        status, served_by, _ = await post(gateway)
        assert status == 200
        assert served_by in backends.pool


async def test_a_forged_header_is_gone_before_the_picker_decides(gateway: Gateway, backends: Backends) -> None:
    gateway.picker.decision = backends.pool[0]
    for _ in range(5):
        status, served_by, _ = await post(gateway, {wire.DESTINATION_HEADER: backends.decoy})
        assert (status, served_by) == (200, backends.pool[0])


async def test_an_undecided_request_is_refused_or_balanced_by_failure_mode(
    gateway: Gateway, backends: Backends, gateway_process: tuple[str, int, str, str]
) -> None:
    gateway.picker.decision = ""
    outcomes = [await post(gateway, {wire.DESTINATION_HEADER: backends.decoy}) for _ in range(6)]
    assert gateway.picker.streams == 6
    if gateway_process[0] == "FailClose":
        assert {(s, by) for s, by, _ in outcomes} == {(503, None)}
        assert {text for _, _, text in outcomes} == {
            "inference error: ServiceUnavailable - the endpoint picker made no decision"
        }
    else:
        assert {s for s, _, _ in outcomes} == {200}
        assert {by for _, by, _ in outcomes} == set(backends.pool)  # round robin over the live members

"""Requests through a real Envoy land where the picker said, in both body modes, and errors come back clear."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import Backends, Picker, metrics_when

CHAT = "/v1/chat/completions"


def chat(prompt: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "m1", "messages": [{"role": "user", "content": prompt}], **extra}


async def post(
    session: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(url, data=data, headers={"content-type": "application/json", **(headers or {})}) as r:
        return r.status, dict(r.headers), await r.read()


async def test_hundred_requests_at_concurrency_ten_land_where_the_picker_said(gateway: str, backends: Backends) -> None:
    served: Counter[str] = Counter()
    semaphore = asyncio.Semaphore(10)
    timeout = aiohttp.ClientTimeout(total=30)

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        async with semaphore:
            status, headers, body = await post(session, gateway + CHAT, chat(f"request {i}"))
        assert status == 200, body
        answer = json.loads(body)
        # The backend saw the picker's header, and it is the backend that served.
        assert answer["destination_header"] == answer["served_by"] == headers["x-served-by"]
        served[answer["served_by"]] += 1

    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(one(session, i) for i in range(100)))
    assert sum(served.values()) == 100
    assert set(served) <= set(backends.pool)


async def test_a_client_forged_destination_header_changes_nothing(gateway: str, backends: Backends) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(10):
            status, headers, body = await post(
                session, gateway + CHAT, chat(), {"x-gateway-destination-endpoint": backends.decoy}
            )
            assert status == 200, body
            assert headers["x-served-by"] in backends.pool


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b"{not json", 400, "not valid JSON"),
        ({"messages": [{"role": "user", "content": "x"}]}, 400, "'model' is missing"),
        ({"model": "m1", "messages": []}, 400, "messages"),
        ({"model": "m1", "messages": [{"role": "user", "content": "x" * 1_100_000}]}, 413, "exceeds the limit"),
    ],
    ids=["bad-json", "missing-model", "empty-messages", "oversize"],
)
async def test_bad_requests_get_clear_http_answers(gateway: str, body: Any, status: int, reason: str) -> None:
    async with aiohttp.ClientSession() as session:
        got, _, text = await post(session, gateway + CHAT, body)
    assert got == status
    assert text.decode().startswith("inference error: ")
    assert reason in text.decode()


async def test_streamed_chat_response_arrives_intact(gateway: str, backends: Backends) -> None:
    async with aiohttp.ClientSession() as session:
        status, headers, body = await post(session, gateway + CHAT, chat(stream=True))
    assert status == 200
    events = [line for line in body.decode().split("\n\n") if line]
    assert len(events) == 22
    assert events[-1] == "data: [DONE]"
    assert [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[:20]] == [f"tok{i} " for i in range(20)]
    assert headers["x-served-by"] in backends.pool


async def test_a_get_without_body_is_routed(gateway: str, backends: Backends) -> None:
    async with aiohttp.ClientSession() as session, session.get(gateway + "/v1/models") as response:
        answer = await response.json()
    assert response.status == 200
    assert answer["served_by"] in backends.pool
    assert answer["method"] == "GET"


async def test_metrics_count_routed_and_refused_requests(gateway: str, picker: Picker) -> None:
    async with aiohttp.ClientSession() as session:
        await post(session, gateway + CHAT, chat())
        await post(session, gateway + CHAT, b"nope")
        text = await metrics_when(session, picker, lambda t: 'outcome="refused"' in t and 'outcome="routed"' in t)
    assert 'epp_requests_total{code="OK",outcome="routed"}' in text
    assert 'epp_requests_total{code="BadRequest",outcome="refused"}' in text


async def test_no_endpoints_gives_503_with_reason(envoy_available: None, e2e_tmp: Any) -> None:
    from tests.e2e.conftest import start_picker
    from tests.support.envoy import envoy
    from tests.support.procs import http_ok, running, wait_until

    argv, empty = start_picker(e2e_tmp, "")
    with running(argv, e2e_tmp / "picker-empty.log") as proc:
        wait_until(lambda: http_ok(empty.url("/readyz")), 60, "epp serve", proc)
        with envoy(e2e_tmp, empty.grpc_port, "FULL_DUPLEX_STREAMED") as port:
            async with aiohttp.ClientSession() as session:
                status, _, text = await post(session, f"http://127.0.0.1:{port}{CHAT}", chat())
    assert status == 503
    assert text.decode() == "inference error: ServiceUnavailable - no ready endpoint in the pool"

"""The simulator over real HTTP on loopback: OpenAI request shapes, streaming and not, /metrics, errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.sim import SERVER_HEADER, SimulatedPool
from epp.sim.config import DEFAULT_MODEL

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def pool() -> AsyncIterator[SimulatedPool]:
    async with SimulatedPool(servers=2, base_port=0, lora_adapters=("sql-lora",), speed=20.0) as p:
        yield p


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


# Bodies as the OpenAI Python SDK sends them (client.completions.create / chat.completions.create / embeddings).
SHAPES = [
    pytest.param(
        "/v1/completions",
        {"model": DEFAULT_MODEL, "prompt": "Say this is a test", "max_tokens": 7, "temperature": 0},
        "text_completion",
        id="completions",
    ),
    pytest.param(
        "/v1/completions",
        {"model": DEFAULT_MODEL, "prompt": [1, 2, 3, 4], "max_tokens": 3},
        "text_completion",
        id="completions-token-ids",
    ),
    pytest.param(
        "/v1/chat/completions",
        {
            "model": DEFAULT_MODEL,
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
            ],
            "max_completion_tokens": 5,
        },
        "chat.completion",
        id="chat",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"model": "sql-lora", "messages": [{"role": "user", "content": "SELECT"}], "max_tokens": 4},
        "chat.completion",
        id="chat-lora-adapter",
    ),
]


@pytest.mark.parametrize(("path", "body", "obj"), SHAPES)
async def test_non_streaming_requests_get_openai_responses(
    pool: SimulatedPool, http: aiohttp.ClientSession, path: str, body: dict, obj: str
) -> None:
    async with http.post(f"http://{pool.addresses[0]}{path}", json=body) as resp:
        assert resp.status == 200
        assert resp.headers[SERVER_HEADER] == "sim-0"
        data = await resp.json()
    assert data["object"] == obj
    wanted = body.get("max_tokens", body.get("max_completion_tokens"))
    assert data["usage"]["completion_tokens"] == wanted
    assert data["usage"]["prompt_tokens"] >= 1
    choice = data["choices"][0]
    text = choice["message"]["content"] if obj == "chat.completion" else choice["text"]
    assert len(text.split()) == wanted


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"], ids=["completions", "chat"])
async def test_streaming_requests_get_sse_chunks_then_done(
    pool: SimulatedPool, http: aiohttp.ClientSession, path: str
) -> None:
    body = {"model": DEFAULT_MODEL, "max_tokens": 40, "stream": True, "stream_options": {"include_usage": True}}
    body |= {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    events = []
    async with http.post(f"http://{pool.addresses[1]}{path}", json=body) as resp:
        assert resp.status == 200
        assert resp.headers[SERVER_HEADER] == "sim-1"
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 40
    content = [c["choices"][0] for c in chunks if c["choices"]]
    texts = [c["delta"].get("content", "") if "delta" in c else c["text"] for c in content]
    assert len("".join(texts).split()) == 40
    assert content[-1]["finish_reason"] == "length"


async def test_embeddings_and_models(pool: SimulatedPool, http: aiohttp.ClientSession) -> None:
    body = {"model": DEFAULT_MODEL, "input": ["a", "b"], "encoding_format": "float"}
    async with http.post(f"http://{pool.addresses[0]}/v1/embeddings", json=body) as resp:
        data = await resp.json()
    assert [d["index"] for d in data["data"]] == [0, 1]
    assert data["usage"]["prompt_tokens"] >= 1
    async with http.get(f"http://{pool.addresses[0]}/v1/models") as resp:
        models = await resp.json()
    assert [m["id"] for m in models["data"]] == [DEFAULT_MODEL, "sql-lora"]
    async with http.get(f"http://{pool.addresses[0]}/health") as resp:
        assert resp.status == 200


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"model": "other", "prompt": "x"}', 404, "does not exist"),
        (b'{"model": "%s"}' % DEFAULT_MODEL.encode(), 400, "'prompt' is required"),
        (b'{"model": "%s", "prompt": "x", "max_tokens": -1}' % DEFAULT_MODEL.encode(), 400, "max_tokens"),
        (b'{"model": "%s", "prompt": "x", "max_tokens": 1000000}' % DEFAULT_MODEL.encode(), 400, "KV cache"),
    ],
    ids=["bad-json", "unknown-model", "no-prompt", "negative-max-tokens", "longer-than-kv-cache"],
)
async def test_bad_requests_get_openai_errors(
    pool: SimulatedPool, http: aiohttp.ClientSession, body: bytes, status: int, message: str
) -> None:
    async with http.post(f"http://{pool.addresses[0]}/v1/completions", data=body) as resp:
        assert resp.status == status
        error = (await resp.json())["error"]
    assert message in error["message"]


async def test_metrics_parse_with_prometheus_client_and_count_requests(
    pool: SimulatedPool, http: aiohttp.ClientSession
) -> None:
    prompt = "shared system prompt " * 200
    for _ in range(2):
        body = {"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 2}
        async with http.post(f"http://{pool.addresses[0]}/v1/completions", json=body) as resp:
            assert resp.status == 200
    async with http.get(f"http://{pool.addresses[0]}/metrics") as resp:
        page = await resp.text()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }
    model = (("model_name", DEFAULT_MODEL),)
    assert samples[("vllm:num_requests_waiting", model)] == 0
    assert samples[("vllm:request_success_total", (("finished_reason", "stop"), *model))] == 2
    assert samples[("vllm:prefix_cache_hits_total", model)] > 0  # the second prompt reused the first's blocks
    assert samples[("vllm:time_to_first_token_seconds_count", model)] == 2
    lora = [k for k in samples if k[0] == "vllm:lora_requests_info"]
    assert dict(lora[0][1])["max_lora"] == "4"
    config = [k for k in samples if k[0] == "vllm:cache_config_info"]
    assert dict(config[0][1])["num_gpu_blocks"] == str(pool.servers[0].config.profile.num_blocks)


async def test_a_client_leaving_mid_stream_does_not_disturb_the_server(
    pool: SimulatedPool, http: aiohttp.ClientSession
) -> None:
    body = {"model": DEFAULT_MODEL, "prompt": "long answer", "max_tokens": 400, "stream": True}
    async with http.post(f"http://{pool.addresses[0]}/v1/completions", json=body) as resp:
        await resp.content.readline()  # the first chunk arrived; now hang up
    body = {"model": DEFAULT_MODEL, "prompt": "next", "max_tokens": 2}
    async with http.post(f"http://{pool.addresses[0]}/v1/completions", json=body) as resp:
        assert resp.status == 200
        assert (await resp.json())["usage"]["completion_tokens"] == 2
    engine = pool.servers[0].engine
    for _ in range(500):  # the hang-up shows at the stream's next write; bounded wait, no timing asserted
        if engine.requests_aborted:
            break
        await asyncio.sleep(0.01)
    assert engine.requests_aborted == 1  # dropped, as vLLM aborts a request whose client left


async def test_an_http2_attempt_is_refused_at_once_and_http11_still_works(
    pool: SimulatedPool, http: aiohttp.ClientSession
) -> None:
    """Routers such as the SGLang gateway try HTTP/2 first, then fall back: the refusal must be quick, not a hang."""
    host, port = pool.addresses[0].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    await writer.drain()
    reply = await asyncio.wait_for(reader.read(), timeout=10)  # EOF: the server closed the connection
    assert not reply.startswith(b"HTTP/1.1 200")
    writer.close()
    async with http.get(f"http://{pool.addresses[0]}/health", headers={"Upgrade": "h2c", "Connection": "Upgrade"}) as r:
        assert r.status == 200 and r.version == aiohttp.HttpVersion11


@pytest.mark.parametrize("path", ["/get_model_info", "/model_info", "/get_server_info", "/server_info"])
async def test_sglang_gateway_discovery_endpoints_answer(
    pool: SimulatedPool, http: aiohttp.ClientSession, path: str
) -> None:
    async with http.get(f"http://{pool.addresses[0]}{path}") as resp:
        assert resp.status == 200
        assert (await resp.json())["model_path"] == DEFAULT_MODEL

"""One simulated model server over HTTP: the OpenAI API of vLLM, answered at the engine model's pace.

The engine model decides when each request gets its first token and when it finishes; this module only turns that
into HTTP: a stepping task sleeps for each planned step and resolves the waiting handlers. Prompts become engine
requests by a cheap approximation of a tokenizer (4 characters per token) and chain hashes of block-sized slices of
the text, so two prompts that share leading text share cached blocks, as they would in vLLM.

Every response names the server that served it in `x-sim-server`, so a load test can count requests per endpoint
without trusting the router under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from typing import Any

from aiohttp import web

from epp.sim.config import ServerConfig
from epp.sim.engine import Engine, Finished, SimRequest
from epp.sim.kvevents import KvEventPublisher
from epp.sim.metrics import LatencyStats, render
from epp.sim.openai import BadRequest, error_response, prompt_text, prompt_units
from epp.sim.pd import PREFILLER_HEADER, PdSidecar
from epp.sim.tokens import CHARS_PER_TOKEN as CHARS_PER_TOKEN  # re-exported: the demo sizes prompts by it
from epp.sim.tokens import token_ids

log = logging.getLogger(__name__)

SERVER_HEADER = "x-sim-server"
DEFAULT_MAX_TOKENS = 128
STREAM_INTERVAL_S = 0.02  # how often a streaming response flushes the tokens generated meanwhile
EMBEDDING_DIM = 16


class SimServer:
    """A simulated server: `await start()`, `await stop()`; `address` is "host:port" once started."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.engine = Engine(config.profile)
        self.stats = LatencyStats()
        self._ids = itertools.count(1)
        self._first: dict[int, asyncio.Future[float]] = {}
        self._done: dict[int, asyncio.Future[Finished]] = {}
        self._prompt_tokens: dict[int, int] = {}
        self._wake = asyncio.Event()
        self._stepper: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.port = config.port
        self.served = 0
        self.render_calls = 0  # requests to the render endpoints (tests count the picker's cache hits by it)
        self.kv_events: KvEventPublisher | None = None
        self._replays: asyncio.Task[None] | None = None
        self.pd = PdSidecar(config, lambda: self.port)

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        # vLLM's render endpoints (what a vllm token-producer calls): the prompt's token ids, nothing generated.
        app.router.add_post("/v1/completions/render", self._render_completion)
        app.router.add_post("/v1/chat/completions/render", self._render_chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_get("/sim/pd", self._pd_counters)
        app.router.add_get("/health_generate", self._health)
        app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        # What the SGLang Model Gateway asks a worker when it registers it (model and server discovery).
        for path in ("/get_model_info", "/model_info"):
            app.router.add_get(path, self._model_info)
        for path in ("/get_server_info", "/server_info"):
            app.router.add_get(path, self._server_info)
        return app

    @property
    def kv_events_port(self) -> int | None:
        return None if self.kv_events is None else self.kv_events.port

    async def start(self) -> None:
        c = self.config
        if c.kv_events_port is not None:
            self.kv_events = KvEventPublisher(
                c.host,
                c.kv_events_port,
                f"kv@{c.name}@{c.model}",
                c.profile.block_size,
                replay_port=c.kv_events_replay_port,
                hash_format=c.kv_events_hash,
            )
            self.engine.kv_events = []
            if self.kv_events.replay_port is not None:
                self._replays = asyncio.create_task(self._serve_replays(), name=f"sim-{c.name}-replays")
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port, reuse_address=True)
        await site.start()
        if self.port == 0:
            sockets: list[Any] = list(getattr(site._server, "sockets", None) or ())  # the bound socket is only here
            self.port = int(sockets[0].getsockname()[1])
        self._stepper = asyncio.create_task(self._step_loop(), name=f"sim-{self.config.name}")

    async def stop(self) -> None:
        if self._replays is not None:
            self._replays.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replays
            self._replays = None
        if self._stepper is not None:
            self._stepper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stepper
            self._stepper = None
        # Requests still waiting on the engine can never finish now: end them first, or the runner's cleanup
        # waits its whole shutdown timeout for their handlers.
        pending: list[asyncio.Future[Any]] = [*self._first.values(), *self._done.values()]
        for fut in pending:
            if not fut.done():
                fut.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.kv_events is not None:
            self.kv_events.close()
            self.kv_events = None
            self.engine.kv_events = None
        await self.pd.close()

    # -- the engine, in real time ---------------------------------------------------------------------------

    def _now(self) -> float:
        return asyncio.get_running_loop().time() * self.config.speed

    async def _step_loop(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if not self.engine.busy:
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
            duration = self.engine.begin_step(deadline * self.config.speed)
            self._publish_kv_events()
            deadline = max(deadline + duration / self.config.speed, loop.time() - 0.05)
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            outcome = self.engine.end_step(deadline * self.config.speed)
            self._publish_kv_events()
            for rid in outcome.first_tokens:
                first = self._first.pop(rid, None)
                if first is not None and not first.done():
                    first.set_result(deadline)
            for fin in outcome.finished:
                done = self._done.pop(fin.request_id, None)
                if done is not None and not done.done():
                    done.set_result(fin)

    def _publish_kv_events(self) -> None:
        records = self.engine.kv_events
        if records and self.kv_events is not None:
            self.kv_events.publish(records, time.time())
            records.clear()

    async def _serve_replays(self) -> None:
        while self.kv_events is not None:
            self.kv_events.serve_replays()
            await asyncio.sleep(0.02)

    def _submit(
        self, prompt: str, output_tokens: int, lora: str | None, remote_prefill: bool = False
    ) -> tuple[int, asyncio.Future[float], asyncio.Future[Finished]]:
        block = self.config.profile.block_size
        tokens, hashes = prompt_units(prompt, block)
        rid = next(self._ids)
        self._prompt_tokens[rid] = tokens
        ids = tuple(token_ids(prompt)) if self.kv_events is not None else ()
        req = SimRequest(
            rid,
            tokens,
            output_tokens,
            prefix=hashes,
            unit_tokens=block,
            lora=lora,
            token_ids=ids,
            remote_prefill=remote_prefill,
        )
        try:
            self.engine.submit(req, self._now())
        except ValueError as exc:
            del self._prompt_tokens[rid]
            raise BadRequest(str(exc)) from None
        loop = asyncio.get_running_loop()
        first: asyncio.Future[float] = loop.create_future()
        done: asyncio.Future[Finished] = loop.create_future()
        self._first[rid] = first
        self._done[rid] = done
        self._wake.set()
        return rid, first, done

    # -- handlers -------------------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {SERVER_HEADER: self.config.name}

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="", headers=self._headers())

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's endpoint: the whole prefix cache is dropped (an `AllBlocksCleared` event when events are on)."""
        self.engine.reset_prefix_cache()
        self._publish_kv_events()
        return web.Response(status=200, headers=self._headers())

    async def _model_info(self, request: web.Request) -> web.Response:
        model = self.config.model
        body = {"model_path": model, "tokenizer_path": model, "is_generation": True, "served_model_name": model}
        return web.json_response(body, headers=self._headers())

    async def _server_info(self, request: web.Request) -> web.Response:
        p = self.config.profile
        body = {
            "model_path": self.config.model,
            "served_model_name": self.config.model,
            "engine": self.config.engine,
            "profile": p.name,
            "max_running_requests": p.max_num_seqs,
            "max_total_num_tokens": p.kv_tokens,
            "page_size": p.block_size,
            "dp_size": 1,
            "version": "epp-sim",
        }
        return web.json_response(body, headers=self._headers())

    async def _models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        names = (self.config.model, *self.config.lora_adapters)
        data = [{"id": n, "object": "model", "created": created, "owned_by": "epp-sim"} for n in names]
        return web.json_response({"object": "list", "data": data}, headers=self._headers())

    async def _metrics(self, request: web.Request) -> web.Response:
        page = render(
            self.config.engine,
            self.config.model,
            self.engine,
            self.stats,
            time.time(),
            self.config.lora_adapters,
        )
        return web.Response(text=page, content_type="text/plain", charset="utf-8", headers=self._headers())

    async def _render_completion(self, request: web.Request) -> web.Response:
        return await self._render(request, "completion")

    async def _render_chat(self, request: web.Request) -> web.Response:
        return await self._render(request, "chat")

    async def _render(self, request: web.Request, kind: str) -> web.Response:
        """`{token_ids, features}` as vLLM's render answers: the simulator's deterministic tokenizer (the same ids
        for the same text, in every process), so a picker's vllm token-producer is tested over real HTTP."""
        try:
            _, prompt, _ = await self._read(request, kind)
        except BadRequest as exc:
            return error_response(str(exc), exc.status)
        self.render_calls += 1
        return web.json_response({"token_ids": token_ids(prompt), "features": None})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _read(self, request: web.Request, kind: str) -> tuple[dict[str, Any], str, str | None]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadRequest("body is not valid JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("'model' is required")
        if model != self.config.model and model not in self.config.lora_adapters:
            raise BadRequest(f"The model `{model}` does not exist.", status=404)
        lora = model if model in self.config.lora_adapters else None
        return body, prompt_text(kind, body), lora

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        started = asyncio.get_running_loop().time()
        try:
            body, prompt, lora = await self._read(request, kind)
            max_tokens = body.get("max_completion_tokens", body.get("max_tokens", DEFAULT_MAX_TOKENS))
            if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
                raise BadRequest("'max_tokens' must be a positive integer")
            kv = body.get("kv_transfer_params")
            kv = kv if isinstance(kv, dict) else {}
            prefill_leg = kv.get("do_remote_decode") is True
            remote = kv.get("do_remote_prefill") is True
            prefiller = request.headers.get(PREFILLER_HEADER, "").strip()
            if prefiller and not prefill_leg and self.config.role != "prefill":
                remote = await self.pd.remote_prefill(request.path, body, prefiller)
            if remote:
                await asyncio.sleep(self.pd.transfer_s(prompt))  # pulling the prompt's KV from the prefiller
            elif prefill_leg:
                self.pd.counters.prefills_served += 1
            rid, first, done = self._submit(prompt, max_tokens, lora, remote_prefill=remote)
        except BadRequest as exc:
            return error_response(str(exc), exc.status)
        model = body["model"]
        if body.get("stream") is True:
            include_usage = isinstance(body.get("stream_options"), dict) and body["stream_options"].get("include_usage")
            return await self._stream(request, kind, model, rid, first, done, started, bool(include_usage))
        fin = await done
        self._observe(started, await first, fin)
        text = "tok " * fin.output_tokens
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
        if kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        usage = self._usage(rid, fin)
        return web.json_response(
            {
                "id": f"cmpl-{self.config.name}-{rid}",
                "object": "chat.completion" if kind == "chat" else "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [choice],
                "usage": usage,
                **({"kv_transfer_params": self.pd.kv_params(usage["prompt_tokens"])} if prefill_leg else {}),
            },
            headers=self._headers(),
        )

    # -- P/D: the routing sidecar's steps (llm-d pkg/sidecar/proxy, NIXL v2 connector) ----------------------

    async def _pd_counters(self, request: web.Request) -> web.Response:
        body = {"name": self.config.name, "role": self.config.role, **asdict(self.pd.counters)}
        return web.json_response(body, headers=self._headers())

    def _usage(self, rid: int, fin: Finished) -> dict[str, int]:
        prompt = self._prompt_tokens.pop(rid, 0)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": fin.output_tokens,
            "total_tokens": prompt + fin.output_tokens,
        }

    def _observe(self, started: float, first_at: float, fin: Finished) -> None:
        loop_now = asyncio.get_running_loop().time()
        self.stats.ttft.observe(max(0.0, first_at - started))
        self.stats.e2e.observe(max(0.0, loop_now - started))
        self.served += 1

    async def _stream(
        self,
        request: web.Request,
        kind: str,
        model: str,
        rid: int,
        first: asyncio.Future[float],
        done: asyncio.Future[Finished],
        started: float,
        include_usage: bool,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={**self._headers(), "Content-Type": "text/event-stream"})
        await response.prepare(request)
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        created = int(time.time())

        def chunk(n: int, finish: str | None) -> bytes:
            text = "tok " * n
            if kind == "chat":
                choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "finish_reason": finish}
            payload = {"id": f"cmpl-{self.config.name}-{rid}", "object": obj, "created": created, "model": model}
            payload["choices"] = [choice]
            return b"data: " + json.dumps(payload).encode() + b"\n\n"

        try:
            first_at = await first
            await self._stream_body(response, kind, chunk, rid, done, obj, created, model, include_usage)
        except ConnectionResetError:  # the client went away: drop the request, as vLLM aborts it
            self.engine.abort(rid)
            self._prompt_tokens.pop(rid, None)
            self._first.pop(rid, None)
            self._done.pop(rid, None)
            return response
        self._observe(started, first_at, done.result())
        return response

    async def _stream_body(
        self,
        response: web.StreamResponse,
        kind: str,
        chunk: Callable[[int, str | None], bytes],
        rid: int,
        done: asyncio.Future[Finished],
        obj: str,
        created: int,
        model: str,
        include_usage: bool,
    ) -> None:
        if kind == "chat":
            role = {"id": f"cmpl-{self.config.name}-{rid}", "object": obj, "created": created, "model": model}
            role["choices"] = [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
            await response.write(b"data: " + json.dumps(role).encode() + b"\n\n")
        sent = 0
        async for total in self._progress(rid, done):
            if total > sent:
                await response.write(chunk(total - sent, None))
                sent = total
        fin = done.result()
        await response.write(chunk(fin.output_tokens - sent, "length"))
        if include_usage:
            usage = {"id": f"cmpl-{self.config.name}-{rid}", "object": obj, "created": created, "model": model}
            usage["choices"] = []
            usage["usage"] = self._usage(rid, fin)
            await response.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()

    async def _progress(self, rid: int, done: asyncio.Future[Finished]) -> AsyncIterator[int]:
        """Tokens generated so far, every STREAM_INTERVAL_S until the request finishes."""
        while not done.done():
            yield self.engine.tokens_generated(rid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(done), STREAM_INTERVAL_S / self.config.speed)

    async def _embeddings(self, request: web.Request) -> web.Response:
        started = asyncio.get_running_loop().time()
        try:
            body, prompt, lora = await self._read(request, "embedding")
            rid, first, done = self._submit(prompt, 1, lora)
        except BadRequest as exc:
            return error_response(str(exc), exc.status)
        first_at = await first
        fin = await done
        self._observe(started, first_at, fin)
        n_inputs = (
            len(body["input"])
            if isinstance(body["input"], list) and body["input"] and isinstance(body["input"][0], str)
            else 1
        )
        vector = [((rid * 31 + i) % 97) / 97.0 for i in range(EMBEDDING_DIM)]
        data = [{"object": "embedding", "index": i, "embedding": vector} for i in range(n_inputs)]
        usage = self._usage(rid, fin)
        usage.pop("completion_tokens")
        usage["total_tokens"] = usage["prompt_tokens"]
        return web.json_response(
            {"object": "list", "data": data, "model": body["model"], "usage": usage}, headers=self._headers()
        )

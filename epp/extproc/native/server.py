"""The native ext_proc front: HTTP/2 and gRPC framing in C (`_h2`), the stream's work in Python as before.

grpcio's server costs more CPU per ext_proc stream than the picker's own decision (its completion queue, the
per-batch machinery of grpc.aio, a thread hop per message). Envoy is the only client of this port and speaks one
method, so the front owns the connections itself: the asyncio loop reads each socket (through its TLS layer when
`--secure-serving`), `_h2.Connection.receive` turns the bytes into whole gRPC messages per stream, and the answers go
back through `send`/`finish`, framed in C. What a stream means stays in one place: each stream runs the same
`ExternalProcessor.Process` as the grpc.aio adapter, over an inbox of parsed `ProcessingRequest`s, so the bounds,
the pipeline, eviction and the idle timer are shared code, not a second copy.

Endings: Envoy's RST_STREAM cancels the stream's task (as grpc.aio does); a connection that breaks the protocol gets
GOAWAY from the C side and is closed; `stop` sends GOAWAY to every connection, waits up to the grace for their
streams, then cancels what is left. No task outlives its connection, and nothing here can leak a native batch: the
close grace of the grpc.aio adapter (`bounds.ServerLimits.close_grace_s`) is not needed and the processor this
front serves is built without it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import ssl

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.errors import ConfigError
from epp.extproc.native import _h2
from epp.extproc.server import ExternalProcessor
from epp.observability.ratelimit import RateLimitedLog

log = logging.getLogger(__name__)

PROCESS_PATH = b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"
_MESSAGE, _OPEN, _END, _RESET, _GOAWAY, _CLOSE = range(6)
_UNIMPLEMENTED, _INTERNAL = 12, 13
_parse = pb.ProcessingRequest.FromString
_CANCEL_WAIT_S = 1.0  # how long `stop` waits for the cancelled streams' tasks to end
_DRAIN_ACK_WAIT_S = 5.0  # a drain's final GOAWAY goes this long after its first if the peer never answers the PING


class _Inbox:
    """One stream's messages as the async iterator `Process` reads: filled by the connection, drained by the
    stream's task. A message already here is returned without suspending the task."""

    __slots__ = ("_ended", "_items", "_loop", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._items: collections.deque[bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        # The connection's loop, not `asyncio.get_running_loop()` per wait: on CPython 3.11 that call is a getpid
        # system call each time (its fork check), and a request waits for its messages about twice.
        self._loop = loop

    def __aiter__(self) -> _Inbox:
        return self

    async def __anext__(self) -> pb.ProcessingRequest:
        items = self._items
        while not items:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return _parse(items.popleft())

    def put(self, raw: bytes) -> None:
        self._items.append(raw)
        self._wake()

    def end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Context:
    """What `Process` reads of grpc's servicer context: the stream's metadata (its request headers, e.g. the pool a
    gateway route names), decoded only when asked. It also holds the stream's task, set as the task is made (before
    it first runs), which `_serve` hands to `Process` and compares at its end: asking asyncio for the current task
    costs CPython 3.11 a getpid system call each time (its fork check)."""

    __slots__ = ("_raw", "task")

    def __init__(self, raw: bytes) -> None:
        self._raw = raw
        self.task: asyncio.Task[None] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        parts = self._raw.split(b"\0")
        return tuple(
            (parts[i].decode("latin-1"), parts[i + 1].decode("utf-8", "replace")) for i in range(0, len(parts) - 1, 2)
        )


class _Connection(asyncio.Protocol):
    """One Envoy connection: its h2 state (in C), its streams' tasks, the coalesced writes."""

    def __init__(self, front: NativeServer) -> None:
        self._front = front
        self._h2 = _h2.Connection(max_message=front.max_message)
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._streams: dict[int, tuple[_Inbox, asyncio.Task[None]]] = {}
        self._flush_handle: asyncio.Handle | None = None
        self._age_handle: asyncio.TimerHandle | None = None
        self._draining = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._front.connections.add(self)
        self._flush()  # our SETTINGS and the connection window
        if self._front.max_age_s:
            self._age_handle = self._loop.call_later(self._front.max_age_s, self.drain)

    def data_received(self, data: bytes) -> None:
        try:
            events = self._h2.receive(data)
        except MemoryError:
            self._abort("out of memory")
            return
        streams = self._streams
        for kind, sid, value in events:
            if kind == _MESSAGE:
                entry = streams.get(sid)
                if entry is not None:
                    entry[0].put(value)
            elif kind == _OPEN:
                self._open(sid, *value)
            elif kind == _END:
                entry = streams.get(sid)
                if entry is not None:
                    entry[0].end()
            elif kind == _RESET:
                entry = streams.pop(sid, None)
                if entry is not None:
                    entry[1].cancel()
            elif kind == _GOAWAY:  # the peer's, or our drain's final one (stream 0): no more streams here
                self._draining = True
                if sid == 0 and self._age_handle is not None:
                    self._age_handle.cancel()  # the final GOAWAY went on the PING's ACK
                    self._age_handle = None
            else:  # _CLOSE: a connection error, GOAWAY queued by the C side
                self._front.warn.log(
                    "h2", logging.WARNING, "closing an ext_proc connection: HTTP/2 protocol error %d", value
                )
                self._flush()
                self._abort(None)
                return
        self._flush()
        if self._draining and not streams:
            self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._front.connections.discard(self)
        for handle in (self._flush_handle, self._age_handle):
            if handle is not None:
                handle.cancel()
        streams, self._streams = self._streams, {}
        for _, task in streams.values():
            task.cancel()
        self._front.connection_gone()

    # streams

    def _open(self, sid: int, path: bytes, metadata: bytes) -> None:
        if path != PROCESS_PATH:
            self._h2.finish(sid, _UNIMPLEMENTED, "unknown method")
            return
        inbox = _Inbox(self._loop)
        context = _Context(metadata)
        context.task = task = self._loop.create_task(self._serve(sid, inbox, context))
        self._streams[sid] = (inbox, task)

    async def _serve(self, sid: int, inbox: _Inbox, context: _Context) -> None:
        """The stream's task: `Process` over its inbox, each answer framed as it comes, the status at the end."""
        h2 = self._h2
        status, detail = 0, ""
        try:
            async for response in self._front.processor.Process(inbox, context, context.task):  # type: ignore[arg-type]
                h2.send(sid, response.SerializeToString())
                self._want_flush()
        except asyncio.CancelledError:
            return  # reset by Envoy, the connection gone, or the server stopping: nothing more to send
        except Exception as exc:  # a message that does not parse, or a bug: the stream's status says so
            self._front.warn.log("stream", logging.WARNING, "ext_proc stream failed: %r", exc)
            status, detail = _INTERNAL, "the endpoint picker could not process the stream"
        finally:
            if self._streams.get(sid, (None, None))[1] is context.task:
                del self._streams[sid]
        h2.finish(sid, status, detail)
        self._want_flush()
        if self._draining and not self._streams:
            self._close()

    # writing and ending

    def _want_flush(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        out = self._h2.output()
        if out and self._transport is not None:
            self._transport.write(out)

    def drain(self) -> None:
        """The graceful drain (RFC 9113 section 6.8): a GOAWAY that refuses nothing and a PING; the final GOAWAY,
        naming the last stream seen, when the peer acknowledges the PING (or after `_DRAIN_ACK_WAIT_S`). A
        single GOAWAY would refuse each stream the peer opened while it was on the way, and Envoy fails such a
        stream's request with a 500. The streams open then finish; closed once none is left."""
        self._h2.drain()
        self._flush()
        if self._age_handle is not None:
            self._age_handle.cancel()
        self._age_handle = self._loop.call_later(_DRAIN_ACK_WAIT_S, self._final_goaway)

    def _final_goaway(self) -> None:
        self._age_handle = None
        self._draining = True
        self._h2.goaway()
        self._flush()
        if not self._streams:
            self._close()

    def _close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()

    def _abort(self, why: str | None) -> None:
        if why:
            self._front.warn.log("conn", logging.WARNING, "closing an ext_proc connection: %s", why)
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> list[asyncio.Task[None]]:
        """The connection dropped at once; its streams' tasks cancelled (returned, for the caller to await)."""
        tasks = [task for _, task in self._streams.values()]
        self._streams = {}
        for task in tasks:
            task.cancel()
        if self._transport is not None:
            self._transport.abort()
        return tasks


class NativeServer:
    """The ext_proc port served by the native front; the same `start`/`stop(grace)` as grpc.aio's server."""

    def __init__(
        self,
        processor: ExternalProcessor,
        host: str,
        port: int,
        *,
        flag: str = "--grpc-port",
        ssl_context: ssl.SSLContext | None = None,
        reuse_port: bool = False,
        max_message: int = 4 * 1024 * 1024,
        max_age_s: float = 0.0,
    ) -> None:
        self.processor = processor
        self.max_message = max_message
        self.max_age_s = max_age_s  # with workers: a gateway's connection moves on now and then (GOAWAY)
        self.connections: set[_Connection] = set()
        self.warn = RateLimitedLog(log, every_s=10.0)
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self._idle: asyncio.Future[None] | None = None
        self._sock = _listening_socket(host, port, flag, reuse_port)

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), sock=self._sock, ssl=self._ssl, backlog=1024)

    async def stop(self, grace: float | None) -> None:
        """No new connections; GOAWAY on every open one; their streams get `grace` seconds, then are cancelled."""
        if self._server is not None:
            self._server.close()
        else:
            self._sock.close()
        for conn in list(self.connections):
            conn.drain()
        if self.connections and grace:
            loop = asyncio.get_running_loop()
            self._idle = idle = loop.create_future()
            timer = loop.call_later(grace, _settle, idle)
            try:
                await idle
            finally:
                timer.cancel()
                self._idle = None
        tasks = [task for conn in list(self.connections) for task in conn.abort()]
        if tasks:  # their `finally` (the bookings released) before stop returns; bounded, whatever a stage does
            await asyncio.wait(tasks, timeout=_CANCEL_WAIT_S)

    def connection_gone(self) -> None:
        if self._idle is not None and not self.connections:
            _settle(self._idle)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _listening_socket(host: str, port: int, flag: str, reuse_port: bool) -> socket.socket:
    """Bound now (so a port in use refuses the start, naming the flag), listened on by `start`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host or "0.0.0.0", port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"{flag} {port}: cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    sock.setblocking(False)
    return sock


__all__ = ["PROCESS_PATH", "NativeServer"]

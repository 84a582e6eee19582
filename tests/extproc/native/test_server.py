"""The native front's asyncio server in process, with grpcio's own client as the peer: a stream is answered and
ends with OK, the same `Process` runs (bookings released), an unknown method gets UNIMPLEMENTED, a client that
goes away cancels its stream, TLS with ALPN h2 works, a bad peer only loses its own connection, `stop` drains,
and a drain ends even when its PING is never answered."""

from __future__ import annotations

import asyncio
import socket
import ssl

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client import CollectorRegistry

from epp.app.tls import TlsSettings, server_context
from epp.errors import ConfigError
from epp.extproc.bounds import ServerLimits
from epp.extproc.server import ExternalProcessor
from epp.extproc.stream import StreamSettings
from epp.observability.metrics import PickerMetrics
from tests.extproc.envoy import BODY, body_msg, headers_msg, inflight, make_director
from tests.extproc.native import frames as f

native = pytest.importorskip("epp.extproc.native.server")


def _server(
    ssl_context: ssl.SSLContext | None = None, idle_timeout_s: float | None = None
) -> tuple[native.NativeServer, ExternalProcessor]:
    director = make_director()
    limits = ServerLimits(close_grace_s=0.0)
    if idle_timeout_s is not None:
        limits = ServerLimits(close_grace_s=0.0, idle_timeout_s=idle_timeout_s)
    processor = ExternalProcessor(director, PickerMetrics(CollectorRegistry()), StreamSettings(), limits=limits)
    processor.director = director  # type: ignore[attr-defined]
    return native.NativeServer(processor, "127.0.0.1", 0, ssl_context=ssl_context), processor


async def test_a_stream_is_decided_answered_and_ends_ok() -> None:
    server, processor = _server()
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process(iter((headers_msg(), body_msg(BODY, True))))
            answers = [answer async for answer in call]
            assert await call.code() == grpc.StatusCode.OK
    finally:
        await server.stop(1.0)
    assert [a.WhichOneof("response") for a in answers] == ["request_headers", "request_body"]
    destination = {h.header.key for h in answers[0].request_headers.response.header_mutation.set_headers}
    assert "x-gateway-destination-endpoint" in destination
    assert processor.open_streams == 0
    assert inflight(processor.director) == 0  # type: ignore[attr-defined]


async def test_many_streams_share_one_connection() -> None:
    server, processor = _server()
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)

            async def one() -> int:
                call = stub.Process(iter((headers_msg(), body_msg(BODY, True))))
                return len([a async for a in call])

            assert await asyncio.gather(*(one() for _ in range(50))) == [2] * 50
    finally:
        await server.stop(1.0)
    assert processor.open_streams == 0


async def test_an_unknown_method_is_unimplemented() -> None:
    server, _ = _server()
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = channel.unary_unary("/grpc.health.v1.Health/Check")(b"")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(1.0)


async def test_a_client_that_cancels_ends_its_stream_and_releases_the_booking() -> None:
    server, processor = _server()
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            sent = asyncio.Event()

            async def messages():  # type: ignore[no-untyped-def]
                yield headers_msg()
                yield body_msg(BODY, True)
                sent.set()
                await asyncio.Event().wait()  # never half-closes

            call = pb_grpc.ExternalProcessorStub(channel).Process(messages())
            assert (await call.read()).HasField("request_headers")
            assert processor.open_streams == 1
            call.cancel()
            for _ in range(200):
                if processor.open_streams == 0:
                    break
                await asyncio.sleep(0.01)
    finally:
        await server.stop(1.0)
    assert processor.open_streams == 0
    assert inflight(processor.director) == 0  # type: ignore[attr-defined]


async def test_an_idle_stream_is_ended_by_its_own_task_and_the_others_are_not() -> None:
    """The idle timer cancels the task the front made for that stream (handed to `Process` for its watch, not
    asyncio's current task): the idle stream gets its 503, a stream that completes meanwhile is untouched, and
    nothing stays booked."""
    server, processor = _server(idle_timeout_s=0.2)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)

            async def stalled():  # type: ignore[no-untyped-def]
                yield headers_msg()
                yield body_msg(BODY[:10], False)
                await asyncio.Event().wait()  # the rest of the body never comes

            idle = stub.Process(stalled())
            done = [a async for a in stub.Process(iter((headers_msg(), body_msg(BODY, True))))]
            assert [a.WhichOneof("response") for a in done] == ["request_headers", "request_body"]
            answer = await asyncio.wait_for(idle.read(), 10)
            assert answer.immediate_response.status.code == 503
            assert "no ext_proc message for 0.2s" in answer.immediate_response.body.decode()
            for _ in range(200):
                if processor.open_streams == 0:
                    break
                await asyncio.sleep(0.01)
            idle.cancel()
    finally:
        await server.stop(1.0)
    assert processor.open_streams == 0
    assert inflight(processor.director) == 0  # type: ignore[attr-defined]


async def test_tls_with_alpn_h2() -> None:
    server, _ = _server(server_context(TlsSettings()))
    await server.start()
    try:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=ctx)
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        settings = await asyncio.wait_for(reader.readexactly(9), 10)
        assert settings[3] == 4  # the server's SETTINGS first
        writer.close()
    finally:
        await server.stop(1.0)


async def test_a_peer_breaking_the_protocol_gets_goaway_and_the_server_serves_on() -> None:
    server, _ = _server()
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 20)
        data = await asyncio.wait_for(reader.read(), 10)  # read until the server closes
        frames_types = []
        pos = 0
        while pos + 9 <= len(data):
            frames_types.append(data[pos + 3])
            pos += 9 + int.from_bytes(data[pos : pos + 3], "big")
        assert frames_types[-1] == 7  # GOAWAY, then the connection closed
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process(iter((headers_msg(), body_msg(BODY, True))))
            assert len([a async for a in call]) == 2
    finally:
        await server.stop(1.0)


async def test_stop_gives_open_streams_the_grace_then_cancels_them() -> None:
    server, processor = _server()
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:

        async def messages():  # type: ignore[no-untyped-def]
            yield headers_msg()
            await asyncio.Event().wait()

        call = pb_grpc.ExternalProcessorStub(channel).Process(messages())
        for _ in range(200):
            if processor.open_streams:
                break
            await asyncio.sleep(0.01)
        assert processor.open_streams == 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        await server.stop(0.3)
        assert 0.25 <= loop.time() - started < 5
        assert processor.open_streams == 0
        call.cancel()


async def test_a_drain_whose_ping_is_never_answered_still_ends_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "_DRAIN_ACK_WAIT_S", 0.1)
    server, _ = _server()
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(f.handshake())
        for _ in range(200):
            if server.connections:
                break
            await asyncio.sleep(0.01)
        (conn,) = server.connections
        conn.drain()
        data = await asyncio.wait_for(reader.read(), 10)  # read until the server closes; the PING left unanswered
        kinds = [(frame.type, frame.payload[:4]) for frame in f.parse(data) if frame.type in (f.GOAWAY, f.PING)]
        assert kinds == [(f.GOAWAY, b"\x7f\xff\xff\xff"), (f.PING, b"epp-"), (f.GOAWAY, b"\x00\x00\x00\x00")]
        writer.close()
    finally:
        await server.stop(1.0)


def test_a_port_in_use_is_refused_naming_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigError, match="--grpc-port"):
            native.NativeServer(
                ExternalProcessor(make_director(), PickerMetrics(CollectorRegistry()), StreamSettings()),
                "127.0.0.1",
                taken.getsockname()[1],
            )


async def test_the_streams_metadata_reaches_the_pool_router() -> None:
    director = make_director()
    seen: list[object] = []

    class Pools:
        def route(self, metadata: object) -> tuple[object, object]:
            seen.append(metadata)
            return director.pipeline, None

    processor = ExternalProcessor(director, PickerMetrics(CollectorRegistry()), StreamSettings(),
                                  limits=ServerLimits(close_grace_s=0.0), pools=Pools())  # fmt: skip
    server = native.NativeServer(processor, "127.0.0.1", 0)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process(
                iter((headers_msg(), body_msg(BODY, True))), metadata=(("x-llm-d-inference-pool", "ns/pool-a"),)
            )
            assert len([a async for a in call]) == 2
    finally:
        await server.stop(1.0)
    assert ("x-llm-d-inference-pool", "ns/pool-a") in seen[0]  # type: ignore[operator]

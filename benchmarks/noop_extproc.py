"""A no-op ext_proc server: the same messages as the picker sends, with no parsing and no decision.

It is the baseline of benchmarks/extproc_overhead.py: whatever it costs is the price of Python + grpc.aio + the
protocol itself; what the picker costs beyond it is ours. In FULL_DUPLEX_STREAMED mode it holds the headers answer
until the body ends and sends the body back, exactly as the picker must.
Run: `python -m benchmarks.noop_extproc PORT [--raw]`.

`--raw`: the same answers through a grpcio generic handler on raw bytes (no deserializer, no serializer): the kind
of each message read from its first tag byte, a message parsed only when its body must be read, the headers answers
serialized once. What that saves against (b) is what lazy parsing could save any grpc.aio server.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.app.tls import self_signed_pair

FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


def _streamed(body: bytes, eos: bool, request: bool) -> pb.ProcessingResponse:
    common = pb.CommonResponse(
        body_mutation=pb.BodyMutation(streamed_response=pb.StreamedBodyResponse(body=body, end_of_stream=eos))
    )
    if request:
        return pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
    return pb.ProcessingResponse(response_body=pb.BodyResponse(response=common))


class Noop(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    async def Process(
        self, it: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        duplex_request = duplex_response = False
        body = bytearray()
        async for msg in it:
            if msg.HasField("protocol_config"):
                duplex_request = msg.protocol_config.request_body_mode == FULL_DUPLEX
                duplex_response = msg.protocol_config.response_body_mode == FULL_DUPLEX
            kind = msg.WhichOneof("request")
            if kind == "request_headers":
                if msg.request_headers.end_of_stream or not duplex_request:
                    yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
            elif kind == "request_body":
                if duplex_request:
                    body += msg.request_body.body
                    if msg.request_body.end_of_stream:
                        yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
                        yield _streamed(bytes(body), True, request=True)
                else:
                    yield pb.ProcessingResponse(request_body=pb.BodyResponse())
            elif kind == "request_trailers":
                yield pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
            elif kind == "response_headers":
                yield pb.ProcessingResponse(response_headers=pb.HeadersResponse())
            elif kind == "response_body":
                if duplex_response:
                    yield _streamed(msg.response_body.body, msg.response_body.end_of_stream, request=False)
                else:
                    yield pb.ProcessingResponse(response_body=pb.BodyResponse())
            elif kind == "response_trailers":
                yield pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


# ProcessingRequest's oneof fields 2..7 serialize first (fields in number order): the first byte says the kind.
_REQUEST_HEADERS, _RESPONSE_HEADERS, _REQUEST_BODY, _RESPONSE_BODY, _REQUEST_TRAILERS, _RESPONSE_TRAILERS = (
    0x12,
    0x1A,
    0x22,
    0x2A,
    0x32,
    0x3A,
)
_HEADERS_ANSWER = pb.ProcessingResponse(request_headers=pb.HeadersResponse()).SerializeToString()
_RESPONSE_HEADERS_ANSWER = pb.ProcessingResponse(response_headers=pb.HeadersResponse()).SerializeToString()
_TRAILERS_ANSWERS = {
    _REQUEST_TRAILERS: pb.ProcessingResponse(request_trailers=pb.TrailersResponse()).SerializeToString(),
    _RESPONSE_TRAILERS: pb.ProcessingResponse(response_trailers=pb.TrailersResponse()).SerializeToString(),
}


async def raw_process(it: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    """Noop.Process on raw bytes: FULL_DUPLEX request and response bodies assumed, as extproc_overhead sets."""
    body = bytearray()
    async for raw in it:
        kind = raw[0]
        if kind == _REQUEST_BODY:
            msg = pb.ProcessingRequest.FromString(raw)
            body += msg.request_body.body
            if msg.request_body.end_of_stream:
                yield _HEADERS_ANSWER
                yield _streamed(bytes(body), True, request=True).SerializeToString()
        elif kind == _RESPONSE_HEADERS:
            yield _RESPONSE_HEADERS_ANSWER
        elif kind == _RESPONSE_BODY:
            msg = pb.ProcessingRequest.FromString(raw)
            yield _streamed(msg.response_body.body, msg.response_body.end_of_stream, request=False).SerializeToString()
        elif kind in _TRAILERS_ANSWERS:
            yield _TRAILERS_ANSWERS[kind]
        elif kind == _REQUEST_HEADERS and pb.ProcessingRequest.FromString(raw).request_headers.end_of_stream:
            yield _HEADERS_ANSWER


async def main(port: int, raw: bool = False) -> None:
    server = grpc.aio.server()
    if raw:
        handler = grpc.stream_stream_rpc_method_handler(raw_process)
        generic = grpc.method_handlers_generic_handler(
            "envoy.service.ext_proc.v3.ExternalProcessor", {"Process": handler}
        )
        server.add_generic_rpc_handlers((generic,))
    else:
        pb_grpc.add_ExternalProcessorServicer_to_server(Noop(), server)
    # TLS like `epp serve` by default, so (b) and (c) of extproc_overhead pay the same transport.
    server.add_secure_port(f"127.0.0.1:{port}", grpc.ssl_server_credentials([self_signed_pair()]))
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), "--raw" in sys.argv[2:]))

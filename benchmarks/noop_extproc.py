"""A no-op ext_proc server: the same messages as the picker sends, with no parsing and no decision.

It is the baseline of benchmarks/extproc_overhead.py: whatever it costs is the price of Python + grpc.aio + the
protocol itself; what the picker costs beyond it is ours. In FULL_DUPLEX_STREAMED mode it holds the headers answer
until the body ends and sends the body back, exactly as the picker must.
Run: `python -m benchmarks.noop_extproc PORT`.
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


async def main(port: int) -> None:
    server = grpc.aio.server()
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
    asyncio.run(main(int(sys.argv[1])))

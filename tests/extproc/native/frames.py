"""HTTP/2 frames built and read by hand for the native front's tests (RFC 9113 section 4; HPACK literals of RFC
7541 6.2.2): the client side of a connection, small enough to read at a glance."""

from __future__ import annotations

import struct
from typing import NamedTuple

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, _PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


class Frame(NamedTuple):
    type: int
    flags: int
    stream: int
    payload: bytes


def frame(type_: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([type_, flags]) + struct.pack(">I", stream) + payload


def settings(**values: int) -> bytes:
    ids = {"header_table_size": 1, "enable_push": 2, "initial_window_size": 4, "max_frame_size": 5}
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", ids[k], v) for k, v in values.items()))


def literal(name: str, value: str) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman (6.2.2)."""
    out = b"\x00"
    for text in (name.encode(), value.encode()):
        assert len(text) < 127
        out += bytes([len(text)]) + text
    return out


def request_block(path: str = PROCESS) -> bytes:
    # :method POST (static 3), :scheme http (static 6), :path literal, content-type literal
    return (
        b"\x83\x86" + literal(":path", path) + literal("content-type", "application/grpc") + literal("te", "trailers")
    )


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def handshake() -> bytes:
    return PREFACE + settings()


def parse(data: bytes) -> list[Frame]:
    frames, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        type_, flags = data[pos + 3], data[pos + 4]
        stream = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        frames.append(Frame(type_, flags, stream, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    assert pos == len(data), "a frame cut short in the server's output"
    return frames


def error_code(f: Frame) -> int:
    """The error code of a GOAWAY or RST_STREAM."""
    return int.from_bytes(f.payload[4:8] if f.type == GOAWAY else f.payload[:4], "big")

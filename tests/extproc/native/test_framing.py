"""The native front's HTTP/2 connection (epp/extproc/native/h2.c, h2_recv.c) without sockets: bytes a real Envoy
sent replay into the same events however they are cut; the control frames get their answers; answers go out as
gRPC expects (headers, length-prefixed DATA within the peer's windows, trailers with grpc-status); protocol
violations end the connection with GOAWAY or the stream with RST_STREAM."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from tests.extproc.native import frames as f

_h2 = pytest.importorskip("epp.extproc.native._h2")

RECORDED = Path(__file__).parents[2] / "data" / "envoy-h2" / "full-duplex-3-requests.bin"
MESSAGE, OPEN, END, RESET, GOAWAY, CLOSE = range(6)
META = b"content-type\0application/grpc\0te\0trailers\0"  # request_block's other fields, as OPEN carries them


def connected(**limits: int) -> object:
    conn = _h2.Connection(**limits)
    conn.receive(f.handshake())
    conn.output()
    return conn


def test_recorded_envoy_connection_gives_three_streams_of_parsable_messages() -> None:
    conn = _h2.Connection()
    events = conn.receive(RECORDED.read_bytes())
    opened = [(sid, path) for kind, sid, path in events if kind == OPEN]
    assert [(sid, path) for sid, (path, _) in opened] == [
        (1, f.PROCESS.encode()),
        (3, f.PROCESS.encode()),
        (5, f.PROCESS.encode()),
    ]
    assert b"content-type\0application/grpc\0" in opened[0][1][1]
    kinds = []
    for kind, sid, value in events:
        if kind == MESSAGE:
            kinds.append((sid, pb.ProcessingRequest.FromString(value).WhichOneof("request")))
    # FULL_DUPLEX_STREAMED both ways: each body ends with an empty end_of_stream chunk
    expected = ["request_headers", *["request_body"] * 2, "response_headers", *["response_body"] * 2]
    for sid in (1, 3, 5):
        assert [k for s, k in kinds if s == sid] == expected
    headers = pb.ProcessingRequest.FromString(next(v for k, s, v in events if k == MESSAGE and s == 3))
    names = {h.key for h in headers.request_headers.headers.headers}
    assert {":path", ":method", "content-type"} <= names
    assert [(k, s) for k, s, _ in events if k == RESET] == [(RESET, 1), (RESET, 3), (RESET, 5)]
    assert not conn.closed
    assert conn.open_streams == 0


def test_recorded_bytes_give_the_same_events_however_they_are_cut() -> None:
    data = RECORDED.read_bytes()
    whole = _h2.Connection().receive(data)
    for step in (1, 7, 9, 100, 1000):
        conn = _h2.Connection()
        events = []
        for i in range(0, len(data), step):
            events += conn.receive(data[i : i + step])
        assert events == whole, step


def test_control_frames_are_answered() -> None:
    conn = _h2.Connection()
    out = f.parse(conn.output())
    assert [fr.type for fr in out] == [f.SETTINGS, f.WINDOW_UPDATE]  # ours, sent before the peer speaks
    conn.receive(f.handshake() + f.frame(f.PING, 0, 0, b"12345678"))
    out = f.parse(conn.output())
    assert (out[0].type, out[0].flags) == (f.SETTINGS, f.ACK)
    assert out[1] == f.Frame(f.PING, f.ACK, 0, b"12345678")


def test_a_stream_is_answered_with_headers_data_and_trailers() -> None:
    conn = connected()
    body = pb.ProcessingRequest(request_headers=pb.HttpHeaders(end_of_stream=True)).SerializeToString()
    message = f.grpc_message(body)
    events = conn.receive(
        f.frame(f.HEADERS, f.END_HEADERS, 1, f.request_block())
        + f.frame(f.DATA, 0, 1, message[:3])
        + f.frame(f.DATA, f.END_STREAM, 1, message[3:])
    )
    assert events == [(OPEN, 1, (f.PROCESS.encode(), META)), (MESSAGE, 1, body), (END, 1, None)]
    assert conn.send(1, b"answer")
    assert conn.finish(1, 0)
    out = f.parse(conn.output())
    assert [fr.type for fr in out] == [f.HEADERS, f.DATA, f.HEADERS]
    assert _h2.decode_blocks([out[0].payload]) == [[(b":status", b"200"), (b"content-type", b"application/grpc")]]
    assert out[1].payload == f.grpc_message(b"answer")
    assert out[2].flags & f.END_STREAM
    assert _h2.decode_blocks([out[2].payload]) == [[(b"grpc-status", b"0")]]
    assert conn.open_streams == 0
    assert not conn.send(1, b"late")  # the stream is gone


def test_finish_before_any_answer_is_trailers_only_with_an_encoded_message() -> None:
    conn = connected()
    conn.receive(f.frame(f.HEADERS, f.END_HEADERS, 1, f.request_block()))
    conn.finish(1, 12, "no such method: ü%")
    out = f.parse(conn.output())
    assert [fr.type for fr in out] == [f.HEADERS, f.RST_STREAM]  # the client had not half-closed: reset, NO_ERROR
    fields = _h2.decode_blocks([out[0].payload])[0]
    assert (b"grpc-status", b"12") in fields
    assert (b"grpc-message", b"no such method: %C3%BC%25") in fields
    assert f.error_code(out[1]) == 0


def test_answers_wait_for_the_peers_window_and_go_out_when_it_opens() -> None:
    conn = _h2.Connection()
    conn.receive(f.PREFACE + f.settings(initial_window_size=10))
    conn.receive(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, f.request_block()))
    conn.output()
    conn.send(1, b"x" * 20)  # 25 bytes framed, 10 allowed
    conn.finish(1, 0)
    out = f.parse(conn.output())
    assert [(fr.type, len(fr.payload)) for fr in out] == [(f.HEADERS, 20), (f.DATA, 10)]
    conn.receive(f.window_update(1, 100))
    out = f.parse(conn.output())
    assert [fr.type for fr in out] == [f.DATA, f.HEADERS]
    assert len(out[0].payload) == 15 and out[1].flags & f.END_STREAM


def test_large_answers_are_cut_to_the_peers_frame_size() -> None:
    conn = connected()
    conn.receive(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, f.request_block()))
    conn.receive(f.window_update(0, 1 << 20))
    conn.output()
    conn.send(1, b"y" * 40000)
    sizes = [len(fr.payload) for fr in f.parse(conn.output()) if fr.type == f.DATA]
    assert sizes == [16384, 16384, 40005 - 32768]


def test_the_receive_windows_are_replenished() -> None:
    conn = connected()
    conn.receive(f.frame(f.HEADERS, f.END_HEADERS, 1, f.request_block()))
    chunk = f.frame(f.DATA, 0, 1, b"\x00" * 16000)
    updates = []
    for _ in range(40):  # 640 KB: past half the 1 MiB stream window
        conn.receive(chunk)
        updates += [fr for fr in f.parse(conn.output()) if fr.type == f.WINDOW_UPDATE]
    assert any(u.stream == 1 for u in updates)


def test_a_message_above_the_limit_fails_its_stream_only() -> None:
    conn = connected(max_message=100)
    events = conn.receive(
        f.frame(f.HEADERS, f.END_HEADERS, 1, f.request_block())
        + f.frame(f.DATA, 0, 1, b"\x00" + struct.pack(">I", 101))
    )
    assert events[-1] == (RESET, 1, 0)
    out = f.parse(conn.output())
    assert (b"grpc-status", b"8") in _h2.decode_blocks([out[0].payload])[0]
    assert not conn.closed


def test_compressed_messages_are_refused_as_unimplemented() -> None:
    conn = connected()
    conn.receive(f.frame(f.HEADERS, f.END_HEADERS, 1, f.request_block()) + f.frame(f.DATA, 0, 1, b"\x01\0\0\0\1x"))
    out = f.parse(conn.output())
    assert (b"grpc-status", b"12") in _h2.decode_blocks([out[0].payload])[0]


def test_the_peers_reset_and_goaway_are_reported() -> None:
    conn = connected()
    events = conn.receive(
        f.frame(f.HEADERS, f.END_HEADERS, 1, f.request_block())
        + f.frame(f.RST_STREAM, 0, 1, struct.pack(">I", 8))
        + f.frame(f.GOAWAY, 0, 0, struct.pack(">II", 1, 0))
    )
    assert events[1:] == [(RESET, 1, 8), (GOAWAY, 1, 0)]
    assert conn.open_streams == 0


def test_headers_split_over_continuation_frames() -> None:
    conn = connected()
    block = f.request_block()
    events = conn.receive(
        f.frame(f.HEADERS, 0, 1, block[:5]) + f.frame(f.CONTINUATION, 0, 1, block[5:9])
        + f.frame(f.CONTINUATION, f.END_HEADERS, 1, block[9:])
    )  # fmt: skip
    assert events == [(OPEN, 1, (f.PROCESS.encode(), META))]


def test_a_goaway_sent_refuses_new_streams() -> None:
    conn = connected()
    conn.goaway()
    conn.output()
    assert conn.receive(f.frame(f.HEADERS, f.END_HEADERS, 1, f.request_block())) == []
    rst = f.parse(conn.output())[0]
    assert (rst.type, f.error_code(rst)) == (f.RST_STREAM, 7)  # REFUSED_STREAM


def test_a_drain_refuses_no_stream_until_the_peer_acknowledges_its_ping() -> None:
    """RFC 9113 section 6.8: a GOAWAY naming the largest stream id and a PING first; a stream opened meanwhile
    (the peer had not read the GOAWAY yet) is served; the final GOAWAY, naming it, goes on the PING's ACK."""
    conn = connected()
    conn.drain()
    first, ping = f.parse(conn.output())
    assert (first.type, first.payload) == (f.GOAWAY, struct.pack(">II", 0x7FFFFFFF, 0))
    assert (ping.type, ping.flags) == (f.PING, 0)
    events = conn.receive(f.frame(f.HEADERS, f.END_HEADERS, 1, f.request_block()))
    assert [kind for kind, _, _ in events] == [OPEN]
    assert conn.output() == b""  # not refused
    assert conn.receive(f.frame(f.PING, f.ACK, 0, b"12345678")) == []  # not our PING's ACK: nothing yet
    assert conn.output() == b""
    assert conn.receive(f.frame(f.PING, f.ACK, 0, ping.payload)) == [(GOAWAY, 0, 0)]
    (final,) = f.parse(conn.output())
    assert (final.type, final.payload) == (f.GOAWAY, struct.pack(">II", 1, 0))
    conn.receive(f.frame(f.HEADERS, f.END_HEADERS, 3, f.request_block()))
    rst = f.parse(conn.output())[0]
    assert (rst.type, rst.stream, f.error_code(rst)) == (f.RST_STREAM, 3, 7)  # after the final one: REFUSED_STREAM
    conn.drain()
    assert conn.output() == b""  # drained once


def test_a_goaway_during_a_drain_is_the_final_one_and_the_late_ack_changes_nothing() -> None:
    conn = connected()
    conn.drain()
    ping = f.parse(conn.output())[1]
    conn.goaway()
    (final,) = f.parse(conn.output())
    assert (final.type, final.payload) == (f.GOAWAY, struct.pack(">II", 0, 0))
    assert conn.receive(f.frame(f.PING, f.ACK, 0, ping.payload)) == []
    assert conn.output() == b""


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"GET / HTTP/1.1\r\n\r\n" + b"x" * 10, 1),  # not the preface
        (f.PREFACE + f.frame(f.PING, 0, 0, b"12345678"), 1),  # the first frame is not SETTINGS
        (f.handshake() + f.frame(f.DATA, 0, 0, b"x"), 1),  # DATA on stream 0
        (f.handshake() + f.frame(f.HEADERS, f.END_HEADERS, 2, f.request_block()), 1),  # an even stream id
        (f.handshake() + f.frame(f.DATA, 0, 9, b"x"), 1),  # DATA on an idle stream
        (f.handshake() + f.frame(f.PING, 0, 0, b"1234"), 6),  # a short PING
        (f.handshake() + f.frame(f.SETTINGS, 0, 0, b"12345"), 6),  # SETTINGS not a multiple of 6
        (f.handshake() + f.settings(max_frame_size=100), 1),  # a frame size below the minimum
        (f.handshake() + f.settings(initial_window_size=1 << 31), 3),  # a window above 2^31-1
        (f.handshake() + f.window_update(0, 0), 3),  # a zero increment
        (f.handshake() + b"\x00\x40\x01" + bytes([f.DATA, 0]) + b"\0\0\0\1", 6),  # above our 16 KiB frames
        (f.handshake() + f.frame(f.HEADERS, f.END_HEADERS, 1, b"\xbe"), 9),  # an index not in the table
        (f.handshake() + f.frame(f.HEADERS, 0, 1, b"\x83") + f.frame(f.PING, 0, 0, b"12345678"), 1),  # no CONTINUATION
        (f.handshake() + f.frame(f.CONTINUATION, f.END_HEADERS, 1, b"\x83"), 1),  # CONTINUATION alone
        (f.handshake() + f.frame(f.PUSH_PROMISE, 0, 1, b"\0\0\0\2"), 1),  # a client never pushes
    ],
)
def test_protocol_violations_end_the_connection_with_goaway(data: bytes, code: int) -> None:
    conn = _h2.Connection()
    conn.output()
    events = conn.receive(data)
    assert events[-1] == (CLOSE, 0, code)
    last = f.parse(conn.output())[-1]
    assert (last.type, f.error_code(last)) == (f.GOAWAY, code)
    assert conn.closed
    assert conn.receive(f.frame(f.PING, 0, 0, b"12345678")) == []  # nothing more is read

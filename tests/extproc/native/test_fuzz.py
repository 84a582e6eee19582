"""Random frames at the native front's connection (hypothesis): whatever arrives, the C side answers in whole
frames and ends a broken connection with GOAWAY; it never crashes, hangs or reads past what it was given. The same
streams are answered meanwhile, and the connection drained gracefully (the ACKs of its PING among the frames), so
sending into a stream the peer reset or a connection already closed is covered."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.extproc.native import frames as f

_h2 = pytest.importorskip("epp.extproc.native._h2")
CLOSE = 5

stream_ids = st.sampled_from([0, 1, 2, 3, 5, 7, 0x7FFFFFFF])
payloads = st.one_of(
    st.binary(max_size=40),
    st.builds(f.grpc_message, st.binary(max_size=30)),
    st.just(f.request_block()),
    st.builds(lambda n: struct.pack(">I", n), st.integers(0, 2**32 - 1)),
)
random_frames = st.builds(
    lambda t, flags, sid, payload: f.frame(t, flags, sid, payload),
    st.integers(0, 12),
    st.integers(0, 255),
    stream_ids,
    payloads,
)
answers = st.tuples(st.sampled_from(["send", "finish", "reset", "goaway", "drain"]), stream_ids, st.binary(max_size=20))
# the ACK a peer sends for a graceful drain's PING (its opaque data is the front's, h2.c's h2_drain_ping)
drain_acks = st.just(f.frame(f.PING, f.ACK, 0, b"epp-gone"))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(random_frames, answers, drain_acks), max_size=25), st.integers(1, 64))
def test_random_frames_never_break_the_connection_object(steps: list[object], cut: int) -> None:
    conn = _h2.Connection(max_message=64)
    conn.receive(f.handshake())
    closed_by_error = False
    for step in steps:
        if isinstance(step, bytes):
            for i in range(0, len(step), cut):  # cut into pieces: partial frames wait for the rest
                events = conn.receive(step[i : i + cut])
                closed_by_error |= any(kind == CLOSE for kind, _, _ in events)
        else:
            action, sid, data = step  # type: ignore[misc]
            if action == "send":
                conn.send(sid, data)
            elif action == "finish":
                conn.finish(sid, 13, data.decode("latin-1"))
            elif action == "reset":
                conn.reset(sid)
            elif action == "drain":
                conn.drain()
            else:
                conn.goaway()
        out = f.parse(conn.output())  # always whole frames
        if closed_by_error and out:
            assert out[-1].type == f.GOAWAY or all(fr.type != f.GOAWAY for fr in out[:-1])
    assert conn.closed == closed_by_error


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_after_the_preface_are_survived(data: bytes) -> None:
    conn = _h2.Connection()
    conn.receive(f.handshake())
    conn.receive(data)
    f.parse(conn.output())

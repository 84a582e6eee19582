"""The feeder over real ZMQ on loopback, against a hand-driven PUB socket: sequences, topics, frames, membership."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import msgspec
import pytest
import zmq

from epp.kvevents.decode import BlockStored
from epp.kvevents.feeder import Feeder, FeederSettings, KvSource, parse_source
from epp.kvevents.index import KvBlockIndex

pytestmark = pytest.mark.timeout(60)

EP = "127.0.0.1:8000"
TOKENS = list(range(5000, 5000 + 16 * 8))


class _Pub:
    """An engine's publisher, by hand: bound on a free loopback port."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], topic: bytes = b"kv@pod@model") -> None:
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.topic = topic

    def send(self, seq: int, block: int, parent: int | None = None, frames: list[bytes] | None = None) -> None:
        ev = BlockStored([block], parent, TOKENS[block * 16 : (block + 1) * 16], 16, None, "GPU")
        payload = msgspec.msgpack.encode([time.time(), [ev], 0])
        self.sock.send_multipart(frames or [self.topic, seq.to_bytes(8, "big"), payload])


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    c: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield c
    # destroy, not term: a test that failed before closing its sockets would otherwise block term() for ever (a
    # hang in place of the failure's message)
    c.destroy(linger=0)


def _until(feeder: Feeder, cond: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition never held"
        feeder.poll(20)


def _joined(feeder: Feeder, pub: _Pub) -> None:
    """Send root blocks until one arrives: the SUB's subscription has reached the PUB (ZMQ's slow joiner)."""
    seq = 0
    deadline = time.monotonic() + 10
    while feeder.index.blocks(EP) == 0:
        assert time.monotonic() < deadline
        pub.send(seq, 0)
        seq += 1
        feeder.poll(50)
    feeder.index.clear(EP)
    stream = feeder._streams[EP]
    stream.last_seq = None  # start the test's own numbering


def _feeder(ctx: zmq.Context[zmq.Socket[bytes]], pub: _Pub, **settings: object) -> Feeder:
    feeder = Feeder(KvBlockIndex(), FeederSettings(**settings), context=ctx)  # type: ignore[arg-type]
    feeder.update([KvSource(EP, "127.0.0.1", port=pub.port)])
    _joined(feeder, pub)
    return feeder


def _matched(feeder: Feeder) -> int:
    return feeder.index.match(feeder.index.request_keys(TOKENS)).get(EP, 0)


def test_in_order_batches_build_the_chain(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    pub = _Pub(ctx)
    feeder = _feeder(ctx, pub)
    for seq in range(4):
        pub.send(seq, seq, seq - 1 if seq else None)
    _until(feeder, lambda: _matched(feeder) == 4)
    assert feeder.stats()[EP].gaps == 0
    feeder.close()


def test_a_sequence_that_starts_again_is_a_restarted_engine(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    pub = _Pub(ctx)
    feeder = _feeder(ctx, pub)
    for seq in range(3):
        pub.send(seq, seq, seq - 1 if seq else None)
    _until(feeder, lambda: _matched(feeder) == 3)
    pub.send(0, 5)  # a new publisher: sequence 0 again, a fresh cache
    _until(feeder, lambda: feeder.stats()[EP].restarts == 1)
    assert _matched(feeder) == 0 and feeder.index.blocks(EP) == 1
    feeder.close()


def test_a_gap_without_replay_drops_and_resumes(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    pub = _Pub(ctx)
    feeder = _feeder(ctx, pub)
    pub.send(0, 0)
    pub.send(1, 1, 0)
    pub.send(3, 2)  # seq 2 never came
    _until(feeder, lambda: feeder.stats()[EP].gaps == 1)
    assert feeder.stats()[EP].drops == 1 and feeder.index.blocks(EP) == 1
    feeder.close()


def test_malformed_frames_and_payloads_are_counted_and_skipped(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    pub = _Pub(ctx)
    feeder = _feeder(ctx, pub)
    pub.send(0, 0, frames=[pub.topic, b"\x00\x01", b"x"])  # a 2-byte sequence
    pub.send(0, 0, frames=[pub.topic, (0).to_bytes(8, "big"), b"\xc1not msgpack"])
    pub.send(0, 0, frames=[pub.topic])
    pub.send(1, 0)
    _until(feeder, lambda: feeder.index.blocks(EP) == 1)
    assert feeder.stats()[EP].malformed == 3
    feeder.close()


def test_only_the_topic_filter_is_subscribed_and_empty_takes_everything(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    other = _Pub(ctx, topic=b"metrics")
    feeder = Feeder(KvBlockIndex(), FeederSettings(), context=ctx)
    feeder.update([KvSource(EP, "127.0.0.1", port=other.port)])
    for seq in range(20):
        other.send(seq, 0)
        feeder.poll(20)
    assert feeder.index.blocks(EP) == 0 and feeder.stats()[EP].batches == 0
    feeder.close()
    anything = Feeder(KvBlockIndex(), FeederSettings(topic=""), context=ctx)
    anything.update([KvSource(EP, "127.0.0.1", port=other.port)])
    _joined(anything, other)
    anything.close()


def test_endpoints_leaving_take_their_entries_and_new_ones_are_followed(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    pub = _Pub(ctx)
    feeder = _feeder(ctx, pub)
    pub.send(0, 0)
    _until(feeder, lambda: feeder.index.blocks(EP) == 1)
    feeder.update([])
    feeder.poll(0)
    assert feeder.index.endpoints() == [] and feeder.stats() == {}
    feeder.update([KvSource(EP, "127.0.0.1", port=pub.port)])
    _joined(feeder, pub)
    assert feeder.index.endpoints() == [EP]
    feeder.close()


def test_data_parallel_rank_offsets_the_port(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    pub = _Pub(ctx)
    feeder = Feeder(KvBlockIndex(), FeederSettings(port=pub.port - 2), context=ctx)
    feeder.update([KvSource(EP, "127.0.0.1", dp_rank=2)])
    _joined(feeder, pub)
    feeder.close()


def test_source_syntax() -> None:
    assert parse_source("127.10.0.1:8000") == KvSource("127.10.0.1:8000", "127.10.0.1")
    assert parse_source("127.0.0.1:8001=127.0.0.2#3") == KvSource("127.0.0.1:8001", "127.0.0.2", 3)
    with pytest.raises(ValueError):
        parse_source("127.0.0.1:8000#-1")


def test_a_publisher_that_comes_back_on_its_port_is_reconnected(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    pub = _Pub(ctx)
    feeder = _feeder(ctx, pub, reconnect_ivl_ms=20, reconnect_ivl_max_ms=200)
    for seq in range(3):
        pub.send(seq, seq, seq - 1 if seq else None)
    _until(feeder, lambda: _matched(feeder) == 3)
    port = pub.port
    pub.sock.close(linger=0)  # the engine goes away...
    for _ in range(5):
        feeder.poll(20)
    again = ctx.socket(zmq.PUB)  # ...and a new one binds the same port: libzmq reconnects with its backoff
    again.setsockopt(zmq.LINGER, 0)
    again.bind(f"tcp://127.0.0.1:{port}")
    pub.sock = again
    seq = 0
    deadline = time.monotonic() + 10
    while feeder.stats()[EP].restarts == 0:
        assert time.monotonic() < deadline, "never reconnected"
        pub.send(seq, 7)  # the new engine's sequence starts at 0
        seq = 1 if seq == 0 else seq + 1
        feeder.poll(50)
    assert _matched(feeder) == 0  # the old engine's blocks went with it
    feeder.close()

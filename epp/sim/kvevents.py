"""The simulator's KV-cache events: the engine model's stores, evictions and resets, published as vLLM does.

Wire (vLLM `ZmqEventPublisher`): a PUB socket sends multipart `(topic, 8-byte big-endian sequence, payload)`, the
payload a msgpack `KVEventBatch[ts, events, data_parallel_rank]` of `BlockStored` / `BlockRemoved` /
`AllBlocksCleared` (the structs of `epp.kvevents.decode`, encoded array-like with the tag first). An optional
ROUTER replay socket answers a start sequence with every buffered batch from there on, then the sequence −1 and an
empty payload. The topic is llm-d's `kv@<server>@<model>`.

Blocks: the HTTP simulator's unit is one KV block, so each unit is one engine block: its hash is the engine
model's chain hash of the unit (an int64, as with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`; or 32 bytes, like vLLM's
sha256 digests, with `hash_format="bytes"`), its tokens the request's token ids for that block.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence

import msgspec
import zmq

from epp.kvevents.decode import AllBlocksCleared, BlockRemoved, BlockStored, Event, Hash
from epp.sim.engine import KvCleared, KvRecord, KvStored

log = logging.getLogger(__name__)

_END = (-1).to_bytes(8, "big", signed=True)


def _bound_port(sock: zmq.Socket[bytes]) -> int:
    endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    return int(endpoint.rsplit(":", 1)[1])


class _WireBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None


class KvEventPublisher:
    """Binds a PUB socket (and optionally a ROUTER replay socket) and publishes the engine's records as batches."""

    def __init__(
        self,
        host: str,
        port: int,
        topic: str,
        block_size: int,
        *,
        replay_port: int | None = None,
        hash_format: str = "int",
        buffer_steps: int = 10_000,
        data_parallel_rank: int = 0,
    ) -> None:
        if hash_format not in ("int", "bytes"):
            raise ValueError("hash_format is 'int' or 'bytes'")
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._pub: zmq.Socket[bytes] = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._pub.bind(f"tcp://{host}:{port}")
        self.port = _bound_port(self._pub)
        self._replay: zmq.Socket[bytes] | None = None
        self.replay_port: int | None = None
        if replay_port is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(f"tcp://{host}:{replay_port}")
            self.replay_port = _bound_port(self._replay)
        self._topic = topic.encode()
        self._block_size = block_size
        self._bytes = hash_format == "bytes"
        self._rank = data_parallel_rank
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._encoder = msgspec.msgpack.Encoder()
        self.published_batches = 0
        self.lose_next = 0  # tests: batches to buffer (for replay) but not send, as a message lost in transit

    def _hash(self, h: int) -> Hash:
        return h.to_bytes(32, "big", signed=True) if self._bytes else h

    def events(self, records: Sequence[KvRecord]) -> list[Event]:
        return records_to_events(records, self._block_size, self._hash)

    def publish(self, records: Sequence[KvRecord], ts: float) -> None:
        events = self.events(records)
        if not events:
            return
        payload = self._encoder.encode(_WireBatch(ts, events, self._rank))
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        self.published_batches += 1
        if self.lose_next > 0:
            self.lose_next -= 1
            return
        try:
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), zmq.NOBLOCK)
        except zmq.Again:  # past the high-water mark: dropped, as a PUB does; a subscriber sees the gap
            pass

    def serve_replays(self) -> int:
        """Answer the replay requests waiting on the ROUTER socket (non-blocking); returns how many."""
        sock = self._replay
        if sock is None:
            return 0
        served = 0
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return served
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("kv events: bad replay request (%d frames)", len(frames))
                continue
            client, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            for seq, payload in self._buffer:
                if seq >= start:
                    sock.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
            sock.send_multipart((client, b"", _END, b""))
            served += 1

    def close(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()


def _int_hash(h: int) -> Hash:
    return h


def records_to_events(
    records: Sequence[KvRecord], block_size: int, hash_of: Callable[[int], Hash] = _int_hash
) -> list[Event]:
    """The engine model's cache records as vLLM events (stores of requests without token ids are left out: the
    engine can still cache them, but an event must carry the tokens)."""
    out: list[Event] = []
    bs = block_size
    for rec in records:
        if isinstance(rec, KvCleared):
            out.append(AllBlocksCleared())
        elif isinstance(rec, KvStored):
            req, first, n = rec
            tokens = list(req.token_ids[first * bs : (first + n) * bs])
            if len(tokens) != n * bs:
                continue
            parent = hash_of(req.prefix[first - 1]) if first > 0 else None
            hashes = [hash_of(h) for h in req.prefix[first : first + n]]
            out.append(BlockStored(hashes, parent, tokens, bs, None, "GPU", req.lora))
        else:
            out.append(BlockRemoved([hash_of(h) for h in rec.hashes], "GPU"))
    return out

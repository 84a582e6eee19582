"""The KV-events feeder: one ZMQ SUB per endpoint, sequence-checked, replayed where it can be, into the index.

What each engine publishes (vLLM `ZmqEventPublisher`): multipart `(topic, 8-byte big-endian sequence, payload)` on
a PUB socket at `tcp://<podIP>:5557 + data-parallel rank`, and optionally a ROUTER replay socket that, sent a start
sequence, answers every buffered batch from there on and then the sequence −1 with an empty payload.

Per endpoint:
- one SUB socket, subscribed to the topic filter (upstream's default `kv@`: llm-d names topics
  `kv@<pod>@<model>`; an empty filter takes every topic, as a stock vLLM publishes on ""). libzmq reconnects by
  itself with exponential backoff (`reconnect_ivl_ms` doubling up to `reconnect_ivl_max_ms`).
- sequence numbers checked: the next one is applied; an older one means the engine restarted (its sequence starts
  again at 0 and its cache is empty), so the endpoint's entries are dropped first; a newer one is a gap. On a gap,
  where the engine offers a replay socket, the missing range is requested and live batches wait (bounded) until
  the replay ends: entries are kept only if the replay delivered every missing batch; otherwise, and always without
  a replay socket, the endpoint's entries are dropped and indexing resumes from the live stream.
- a frame that is not `(topic, 8-byte seq, payload)` or a payload that is not a batch is counted and skipped.

It owns its sockets and its clock, and runs on one thread (`run`, or `poll` in a loop) off the serving loop: in a
process of its own (`python -m epp.kvevents.feeder`) or a child like the scrape process. `update(sources)` may be
called from any thread; the change is applied at the next poll.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import zmq

from epp.kvevents.decode import MalformedBatch, decode_batch
from epp.kvevents.index import KvBlockIndex

log = logging.getLogger(__name__)

DEFAULT_PORT = 5557
DEFAULT_TOPIC = "kv@"
END_OF_REPLAY = -1


@dataclass(frozen=True, slots=True)
class KvSource:
    """One endpoint's event stream: `endpoint` is the serving address the index names ("ip:port"), `host` where
    its engine publishes, `dp_rank` the data-parallel rank that offsets the ports."""

    endpoint: str
    host: str
    dp_rank: int = 0
    port: int | None = None  # this engine's PUB port before the rank offset; None: the feeder's setting
    replay_port: int | None = None  # likewise for the replay socket


@dataclass(frozen=True, slots=True)
class FeederSettings:
    port: int = DEFAULT_PORT
    replay_port: int | None = None  # the engine's ROUTER replay socket (vLLM `replay_endpoint`); None: no replay
    topic: str = DEFAULT_TOPIC
    reconnect_ivl_ms: int = 100
    reconnect_ivl_max_ms: int = 5_000
    replay_timeout_s: float = 2.0
    max_held_during_replay: int = 10_000  # live batches held while a replay runs; past it the replay is abandoned
    max_messages_per_poll: int = 512  # per socket, so one busy engine cannot starve the others


@dataclass(slots=True)
class SourceStats:
    batches: int = 0
    malformed: int = 0
    skipped_events: int = 0
    gaps: int = 0
    restarts: int = 0
    replays: int = 0
    replays_complete: int = 0
    drops: int = 0  # times the endpoint's entries were dropped (gap not filled, restart)


@dataclass(slots=True)
class _Stream:
    source: KvSource
    sub: zmq.Socket[bytes]
    stats: SourceStats = field(default_factory=SourceStats)
    last_seq: int | None = None
    replay: zmq.Socket[bytes] | None = None
    replay_next: int = 0  # the next sequence the replay should deliver
    replay_deadline: float = 0.0
    replay_hole: bool = False
    held: list[tuple[int, bytes]] = field(default_factory=list)


class Feeder:
    def __init__(
        self,
        index: KvBlockIndex,
        settings: FeederSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self.index = index
        self.settings = settings or FeederSettings()
        self._clock = clock
        self._ctx = context or zmq.Context()
        self._own_ctx = context is None
        self._streams: dict[str, _Stream] = {}
        self._by_socket: dict[zmq.Socket[bytes], _Stream] = {}
        self._poller = zmq.Poller()
        self._pending: list[KvSource] | None = None
        self._lock = threading.Lock()
        self.malformed_frames = 0

    # -- membership ---------------------------------------------------------------------------------------------

    def update(self, sources: Iterable[KvSource]) -> None:
        """The endpoints to follow from now on (the whole set); thread-safe, applied at the next poll."""
        with self._lock:
            self._pending = list(sources)

    def _apply_membership(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        wanted = {s.endpoint: s for s in pending}
        for name in list(self._streams):
            if wanted.get(name) != self._streams[name].source:
                self._close_stream(self._streams.pop(name))
                self.index.remove_endpoint(name)
        for name, source in wanted.items():
            if name not in self._streams:
                self._streams[name] = self._open_stream(source)
                self.index.add_endpoint(name)

    def _address(self, host: str, port: int, rank: int) -> str:
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # IPv6
        return f"tcp://{host}:{port + rank}"

    def _open_stream(self, source: KvSource) -> _Stream:
        s = self.settings
        sub: zmq.Socket[bytes] = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RECONNECT_IVL, s.reconnect_ivl_ms)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, s.reconnect_ivl_max_ms)
        if ":" in source.host:
            sub.setsockopt(zmq.IPV6, 1)
        sub.setsockopt(zmq.SUBSCRIBE, s.topic.encode())
        sub.connect(self._address(source.host, source.port or s.port, source.dp_rank))
        stream = _Stream(source, sub)
        self._by_socket[sub] = stream
        self._poller.register(sub, zmq.POLLIN)
        return stream

    def _close_stream(self, stream: _Stream) -> None:
        self._end_replay_socket(stream)
        self._poller.unregister(stream.sub)
        del self._by_socket[stream.sub]
        stream.sub.close(linger=0)

    def close(self) -> None:
        for stream in self._streams.values():
            self._close_stream(stream)
        self._streams.clear()
        if self._own_ctx:
            self._ctx.term()

    def stats(self) -> dict[str, SourceStats]:
        return {name: st.stats for name, st in self._streams.items()}

    # -- the loop -----------------------------------------------------------------------------------------------

    def run(self, stop: threading.Event, poll_ms: int = 100) -> None:
        while not stop.is_set():
            self.poll(poll_ms)

    def poll(self, timeout_ms: int) -> int:
        """Wait up to `timeout_ms` for messages and handle those that arrived; returns how many were handled."""
        self._apply_membership()
        self._check_replay_timeouts()
        handled = 0
        budget = self.settings.max_messages_per_poll
        for sock, _ in self._poller.poll(timeout_ms):
            stream = self._by_socket.get(sock)
            if stream is None:
                continue
            replay = sock is stream.replay
            for _ in range(budget):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                handled += 1
                if replay:
                    self._on_replay(stream, frames)
                    if stream.replay is None:
                        break  # the replay ended and its socket is closed
                else:
                    self._on_live(stream, frames)
        return handled

    # -- one stream ---------------------------------------------------------------------------------------------

    def _apply(self, stream: _Stream, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except MalformedBatch as exc:
            stream.stats.malformed += 1
            log.debug("kv events from %s: malformed batch: %s", stream.source.endpoint, exc)
            return
        stream.stats.batches += 1
        stream.stats.skipped_events += batch.skipped
        self.index.apply(stream.source.endpoint, batch, self._clock())

    def _drop(self, stream: _Stream) -> None:
        stream.stats.drops += 1
        self.index.clear(stream.source.endpoint)

    def _on_live(self, stream: _Stream, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self.malformed_frames += 1
            stream.stats.malformed += 1
            return
        seq = int.from_bytes(frames[1], "big")
        payload = frames[2]
        if stream.replay is not None:
            if len(stream.held) >= self.settings.max_held_during_replay:
                self._finish_replay(stream, complete=False)
                self._on_live(stream, frames)
                return
            stream.held.append((seq, payload))
            return
        last = stream.last_seq
        if last is None or seq == last + 1:
            if last is None and seq > 0 and self._replayable(stream):
                # joined a running engine: ask for what it still buffers, so the index starts warm
                self._start_replay(stream, 0)
                stream.held.append((seq, payload))
                return
            self._apply(stream, payload)
            stream.last_seq = seq
            return
        if seq <= last:
            stream.stats.restarts += 1  # a new publisher: its cache is empty, whatever we had is gone
            self._drop(stream)
            self._apply(stream, payload)
            stream.last_seq = seq
            return
        stream.stats.gaps += 1
        if not self._replayable(stream):
            self._drop(stream)
            self._apply(stream, payload)
            stream.last_seq = seq
            return
        self._start_replay(stream, last + 1)
        stream.held.append((seq, payload))

    def _replayable(self, stream: _Stream) -> bool:
        return (stream.source.replay_port or self.settings.replay_port) is not None

    def _start_replay(self, stream: _Stream, start: int) -> None:
        port = stream.source.replay_port or self.settings.replay_port
        assert port is not None
        sock: zmq.Socket[bytes] = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if ":" in stream.source.host:
            sock.setsockopt(zmq.IPV6, 1)
        sock.connect(self._address(stream.source.host, port, stream.source.dp_rank))
        sock.send_multipart([b"", start.to_bytes(8, "big")], zmq.NOBLOCK)
        stream.replay = sock
        stream.replay_next = start
        stream.replay_hole = False
        stream.replay_deadline = self._clock() + self.settings.replay_timeout_s
        stream.stats.replays += 1
        self._by_socket[sock] = stream
        self._poller.register(sock, zmq.POLLIN)

    def _on_replay(self, stream: _Stream, frames: list[bytes]) -> None:
        if frames and frames[0] == b"":
            frames = frames[1:]  # the DEALER side sees the ROUTER's empty delimiter
        if len(frames) != 2 or len(frames[0]) != 8:
            self.malformed_frames += 1
            return
        seq = int.from_bytes(frames[0], "big", signed=True)
        if seq == END_OF_REPLAY:
            self._finish_replay(stream, complete=True)
            return
        if seq < stream.replay_next:
            return
        if seq > stream.replay_next:
            stream.replay_hole = True  # the engine's buffer no longer holds what we missed
        self._apply(stream, frames[1])
        stream.replay_next = seq + 1

    def _finish_replay(self, stream: _Stream, complete: bool) -> None:
        """Merge the replay with the live batches held meanwhile; drop the entries unless nothing is missing."""
        held, stream.held = stream.held, []
        expected = stream.replay_next
        ok = complete and not stream.replay_hole
        self._end_replay_socket(stream)
        rest: list[tuple[int, bytes]] = []
        for i, (seq, payload) in enumerate(held):
            if seq < expected:
                continue
            if seq != expected:
                ok = False
                rest = held[i:]
                break
            self._apply(stream, payload)
            expected += 1
        if ok:
            stream.stats.replays_complete += 1
            stream.last_seq = expected - 1 if expected > 0 else None
            return
        self._drop(stream)
        for seq, payload in rest:
            self._apply(stream, payload)
            expected = seq + 1
        stream.last_seq = expected - 1 if expected > 0 else None

    def _end_replay_socket(self, stream: _Stream) -> None:
        sock, stream.replay = stream.replay, None
        if sock is not None:
            self._poller.unregister(sock)
            self._by_socket.pop(sock, None)
            sock.close(linger=0)

    def _check_replay_timeouts(self) -> None:
        now = self._clock()
        for stream in self._streams.values():
            if stream.replay is not None and now >= stream.replay_deadline:
                log.info("kv events from %s: replay timed out", stream.source.endpoint)
                self._finish_replay(stream, complete=False)


# -- a process of its own -----------------------------------------------------------------------------------------


def parse_source(text: str) -> KvSource:
    """`ENDPOINT[=HOST][#RANK]`: the serving address, where its engine publishes (default: ENDPOINT's host)."""
    rank = 0
    if "#" in text:
        text, r = text.rsplit("#", 1)
        rank = int(r)
    endpoint, _, host = text.partition("=")
    if not host:
        host = endpoint.rsplit(":", 1)[0].strip("[]")
    if rank < 0:
        raise ValueError("data-parallel rank must not be negative")
    return KvSource(endpoint, host, rank)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m epp.kvevents.feeder", description=__doc__.splitlines()[0])
    p.add_argument("--source", action="append", default=[], help="ENDPOINT[=HOST][#RANK], repeatable")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="engines' PUB port before the rank offset")
    p.add_argument("--replay-port", type=int, default=None, help="engines' ROUTER replay port, if any")
    p.add_argument("--topic", default=DEFAULT_TOPIC, help="topic filter ('' for all; default kv@)")
    p.add_argument("--block-size", type=int, default=16, help="block size of the index's keys (tokens)")
    p.add_argument("--stats-interval", type=float, default=5.0, help="seconds between stats lines on stdout")
    p.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: until killed)")
    args = p.parse_args(argv)
    try:
        sources = [parse_source(s) for s in args.source]
    except ValueError as exc:
        print(f"epp kv-events feeder: error: {exc}", file=sys.stderr)
        return 2
    index = KvBlockIndex(block_size=args.block_size)
    feeder = Feeder(index, FeederSettings(port=args.port, replay_port=args.replay_port, topic=args.topic))
    feeder.update(sources)
    started = next_stats = time.monotonic()
    try:
        while args.duration <= 0 or time.monotonic() - started < args.duration:
            feeder.poll(100)
            if time.monotonic() >= next_stats:
                next_stats += args.stats_interval
                line = {"blocks": index.total_blocks(), "counters": index.counters.skipped}
                line["streams"] = {n: vars_of(s) for n, s in feeder.stats().items()}
                print(json.dumps(line), flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        feeder.close()
    return 0


def vars_of(stats: SourceStats) -> dict[str, int]:
    return {name: getattr(stats, name) for name in SourceStats.__slots__}


if __name__ == "__main__":
    sys.exit(main())

"""The KV-events feeder in a supervised child process, publishing its index through shared memory.

Why a process: the feeder decodes every block event of every engine (hundreds of thousands a second on a busy
pool); on the serving loop that would take the GIL from the picks. The child (`child_main`, started through the
child-process kit, epp.supervision.child) runs
`epp.kvevents.feeder.Feeder` over a `KvBlockIndex` whose `TableWriter` keeps the shared-memory block table
(`epp.kvevents.shared`, memfd tables by `epp.kvevents.publish`) equal to it. The serving process reads that table in
place (`TableReader`: no copy) when the `precise-prefix-cache-producer` matches a request.

Messages (typed, on the kit's pipe):
- parent → child: `FeederStart` (the kit's `Start` payload: the producer's parameters; the table's directory is
  a memfd the child inherits), then `Sources` whenever the endpoints to follow change (endpoint, host, rank); the
  rank of an endpoint is its position among the endpoints of the same pod IP by port (data parallelism as several
  target ports), and offsets the producer's socket port, as upstream does.
- child → parent: `TableSegment` for each new table generation, its memfd attached (epp.kvevents.publish);
- child → parent, every `STATUS_S`: `FeederStatus`: the table's generation, the endpoint of each table slot (bit),
  each endpoint's last event time (CLOCK_MONOTONIC, shared by both processes) and the feeder's counters.

Supervision is the kit's, the same as every child's (start timeout, heartbeat, backoff, no restart once the
picker stops, no child outliving the picker): a child that exits or hangs is logged with its exit code or signal
and started again after the backoff, on a fresh directory and tables (memfd: nothing to unlink). While
there is no child, every endpoint reads as absent and the producer falls back to the approximate match for all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from epp.datastore.table import EndpointTable
from epp.kvevents import kernels
from epp.kvevents.blockkeys import U64Array
from epp.kvevents.feeder import Feeder, FeederSettings, KvSource, vars_of
from epp.kvevents.index import KvBlockIndex
from epp.kvevents.publish import SegmentAllocator, TableReader, new_directory
from epp.kvevents.shared import TableWriter
from epp.scheduling.precise import NEVER, PrecisePrefixCacheProducer
from epp.supervision.child import Child
from epp.supervision.child_end import ChildEnd
from epp.supervision.messages import Stop
from epp.supervision.pipe import recv_fd

log = logging.getLogger(__name__)

STATUS_S = 0.2  # child → parent status period
MEMBERSHIP_S = 0.2  # how often the parent compares the table's membership with what it sent


@dataclass(frozen=True, slots=True)
class FeederStart:
    port: int
    replay_port: int | None
    topic: str
    block_size: int
    hash_seed: str
    max_blocks: int


@dataclass(frozen=True, slots=True)
class Sources:
    sources: list[tuple[str, str, int]]  # (endpoint, host, data-parallel rank)


@dataclass(frozen=True, slots=True)
class TableSegment:
    """Child → parent: a new table generation; its memfd follows on the pipe (epp.supervision.pipe.send_fd)."""

    generation: int


@dataclass(frozen=True, slots=True)
class FeederStatus:
    generation: int
    slots: list[str | None]  # the endpoint of each table slot (mask bit)
    last: dict[str, float]  # endpoint → its last event (CLOCK_MONOTONIC)
    streams: dict[str, dict[str, int]]
    index: dict[str, Any]  # the index counters


def sources_of(addresses: list[str]) -> list[tuple[str, str, int]]:
    """(endpoint, host, data-parallel rank): rank = position among the same host's endpoints, by port."""
    by_host: dict[str, list[tuple[int, str]]] = {}
    for address in addresses:
        host, _, port = address.rpartition(":")
        with contextlib.suppress(ValueError):
            by_host.setdefault(host.strip("[]"), []).append((int(port), address))
    out = []
    for host, ports in by_host.items():
        for rank, (_, address) in enumerate(sorted(ports)):
            out.append((address, host, rank))
    return sorted(out)


@dataclass(frozen=True, slots=True)
class KvDirectory:
    """Control → serving worker: a feeder child's table directory (a new child, or a worker that just started);
    its memfd follows on the pipe. The worker forgets the tables it had."""


@dataclass(frozen=True, slots=True)
class KvGone:
    """Control → serving worker: the feeder child ended; until the next one every endpoint reads as absent."""


Relay = Callable[[Any, int | None], None]  # a message for the serving workers, with the memfd that follows it


class SharedKvIndex:
    """A `KvIndexView` over a feeder child's shared table, as any process reads it in place: the control process
    (the feeder's parent) and, with `--workers N`, each serving worker (told the same by the control process:
    `KvDirectory`, `TableSegment`, `FeederStatus`, `KvGone`)."""

    def __init__(self) -> None:
        self._reader: TableReader | None = None
        self._slots: list[str | None] = []
        self._last: dict[str, float] = {}
        self._version = 0  # `KvIndexView.version`: bumped when the slots or the endpoints heard from change

    @property
    def version(self) -> int:
        return self._version

    def slot_names(self) -> Sequence[str | None]:
        return self._slots

    def prefix_blocks(self, keys: U64Array) -> npt.NDArray[np.unsignedinteger[Any]]:
        reader, slots = self._reader, self._slots
        if reader is None or not slots:
            return np.zeros(len(slots), dtype=np.uint64)
        counts = reader.prefix_blocks(keys)
        if counts is None:  # no table announced yet
            return np.zeros(len(slots), dtype=np.uint64)
        if counts.size < len(slots):  # slots the table has no mask bits for yet: they hold nothing
            counts = np.concatenate((counts, np.zeros(len(slots) - counts.size, dtype=counts.dtype)))
        return counts

    def last_event_at(self, endpoint: str) -> float:
        return self._last.get(endpoint, NEVER)

    def use_directory(self, fd: int) -> None:
        """A feeder child's directory (mapped: `fd` stays the caller's); what an earlier child left is dropped."""
        self.drop()
        self._reader = TableReader(fd)

    def add_table(self, generation: int, fd: int) -> None:
        """A table generation the child announced (mapped: `fd` stays the caller's)."""
        if self._reader is not None:
            self._reader.add(generation, fd)

    def take_status(self, status: FeederStatus) -> None:
        if status.slots != self._slots or status.last.keys() != self._last.keys():
            self._version += 1
        self._slots, self._last = list(status.slots), dict(status.last)

    def drop(self) -> None:
        """Forget the child's table (its memory goes with the last mapping: nothing to unlink)."""
        if self._reader is not None:
            with contextlib.suppress(Exception):
                self._reader.close()
        self._reader = None
        self._slots, self._last = [], {}
        self._version += 1


class KvFeederProcess(SharedKvIndex):
    """The parent's side: starts, feeds and supervises the child; a `KvIndexView` for the producer. With serving
    workers, `relay` passes every workers' message on (and `replay` the current state to a worker that starts)."""

    def __init__(self, table: EndpointTable, producer: PrecisePrefixCacheProducer) -> None:
        super().__init__()
        self.table = table
        self.producer = producer
        self.child = Child(
            "epp.app.kv_feeder",
            "kv-events feeder (pid {pid})",
            payload=self._start_payload,
            fds=self._new_directory,
            on_start=self._started,
            on_message=self._on_message,
            on_exit=lambda code: self._drop_child(),
            relay_as="epp-kv-feeder",
            consequence="; the precise producer falls back to the approximate match until then",
        )
        self._directory_fd = -1
        self._generation = 0
        self._tables: dict[int, int] = {}  # generation → its memfd, kept while workers may still need it
        self._status: FeederStatus | None = None
        self.relay: Relay | None = None
        self.stats: dict[str, dict[str, int]] = {}
        self.counters: dict[str, Any] = {}
        self._sent: list[tuple[str, str, int]] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def restarts(self) -> int:
        return self.child.restarts

    # -- lifecycle ----------------------------------------------------------------------------------------------

    @property
    def up(self) -> bool:
        return self.child.proc is not None

    async def start(self) -> None:
        self.producer.attach(self)
        log.info("KV events: block keys and table lookups by the %s kernels", kernels.name())
        self.child.start()
        self._task = asyncio.ensure_future(self._follow_membership())

    def _start_payload(self) -> FeederStart:
        p = self.producer
        return FeederStart(
            p.socket_port, p.replay_port, p.topic_filter, p.block_size, p.hash_seed,
            p.max_blocks_per_endpoint,
        )  # fmt: skip

    def _new_directory(self) -> tuple[int]:
        """A fresh table directory for the child about to start: its reader here, its writer there (and, with
        workers, theirs: the descriptor is kept to pass on)."""
        self._drop_child()  # what a spawn that failed left
        self._directory_fd = new_directory()
        self.use_directory(self._directory_fd)
        self._pass_on(KvDirectory(), self._directory_fd)
        return (self._directory_fd,)

    def _started(self) -> None:
        self._sent = None
        log.info("kv-events feeder started (pid %s)", self.child.pid)

    def _pass_on(self, msg: Any, fd: int | None = None) -> None:
        if self.relay is not None:
            self.relay(msg, fd)

    def replay(self, send: Relay) -> None:
        """What a serving worker that starts needs: the directory, the tables it may read, the last status."""
        if self._directory_fd < 0:
            return
        send(KvDirectory(), self._directory_fd)
        for generation, fd in sorted(self._tables.items()):
            send(TableSegment(generation), fd)
        if self._status is not None:
            send(self._status, None)

    async def _follow_membership(self) -> None:
        while True:
            sources = sources_of(self.table.addresses())
            if sources != self._sent and self.child.send(Sources(sources)):
                self._sent = sources
            await asyncio.sleep(MEMBERSHIP_S)

    def _on_message(self, status: Any) -> None:
        if isinstance(status, TableSegment):
            fd = recv_fd(self.child.conn)  # type: ignore[arg-type]  # the message came on it: it is there
            self.add_table(status.generation, fd)
            self._pass_on(status, fd)
            self._tables[status.generation] = fd
            return
        if not isinstance(status, FeederStatus):
            return
        self._generation = status.generation
        self.take_status(status)
        self._status = status
        self._pass_on(status)
        for generation in [g for g in self._tables if g < status.generation]:  # superseded: no reader needs it
            os.close(self._tables.pop(generation))
        self.stats = status.streams
        self.counters = status.index

    def _drop_child(self) -> None:
        """Forget the dead child's table, here and in the workers."""
        self.drop()
        for fd in self._tables.values():
            os.close(fd)
        self._tables.clear()
        if self._directory_fd >= 0:
            os.close(self._directory_fd)
            self._directory_fd = -1
            self._pass_on(KvGone())
        self._status = None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.child.stop()  # Stop: the child closes its sockets and exits
        self._drop_child()

    def begin_shutdown(self) -> None:
        """The picker is stopping: a feeder that ends from now on is not restarted."""
        self.child.begin_shutdown()

    def supervision(self, now: float) -> dict[str, Any]:
        """For /debug/pool: the child's state and each endpoint's freshness as the producer judges it."""
        endpoints = {}
        for address in self.table.addresses():
            entry = self.producer.freshness(address, now)
            entry["stream"] = self.stats.get(address, {})
            endpoints[address] = entry
        return {
            **self.child.report(now),
            "tableGeneration": self._generation,
            "kernels": kernels.name(),  # compiled or numpy block keys and table lookups (epp.kvevents.kernels)
            "index": self.counters,
            "fallbacks": dict(self.producer.fallbacks),
            "endpoints": endpoints,
        }


# -- the child ------------------------------------------------------------------------------------------------


def child_main(end: ChildEnd) -> int:
    """The kit's entry (epp.supervision.launch): feed the index from the engines' events until told to stop."""
    args: FeederStart = end.payload
    index = KvBlockIndex(block_size=args.block_size, hash_seed=args.hash_seed, max_blocks_per_endpoint=args.max_blocks)
    segments = SegmentAllocator(end.fds[0], lambda generation, fd: end.send_with_fd(TableSegment(generation), fd))
    os.close(end.fds[0])  # the directory stays mapped
    writer = TableWriter(index, segments, published=segments.published)
    feeder = Feeder(index, FeederSettings(port=args.port, replay_port=args.replay_port, topic=args.topic))
    stop = threading.Event()
    updates: list[Sources] = []  # from the pipe's thread to the feeder's (ZMQ sockets stay on one thread)

    def read_messages() -> None:
        try:
            while True:
                msg = end.conn.recv()
                if isinstance(msg, Sources):
                    updates.append(msg)
                elif isinstance(msg, Stop):
                    break
        except (EOFError, OSError):
            pass  # the parent is gone
        stop.set()

    threading.Thread(target=read_messages, daemon=True).start()
    end.on_parent_gone(stop.set)
    end.ready()
    next_status = time.monotonic()
    try:
        while not stop.is_set():
            while updates:
                msg = updates.pop(0)
                feeder.update(KvSource(e, h, r) for e, h, r in msg.sources)
            feeder.poll(50)
            now = time.monotonic()
            if now >= next_status:
                next_status = now + STATUS_S
                status = FeederStatus(
                    writer.table.generation,
                    list(index.slot_names()),
                    {n: index.last_event_at(n) for n in index.endpoints() if index.last_event_at(n) != NEVER},
                    {n: vars_of(s) for n, s in feeder.stats().items()},
                    {
                        "blocks": index.total_blocks(),
                        "stored": index.counters.stored_blocks,
                        "removed": index.counters.removed_blocks,
                        "cleared": index.counters.cleared,
                        "evicted": index.counters.evicted_blocks,
                        "skipped": index.counters.skipped,
                    },
                )
                try:
                    end.send(status)
                except OSError:
                    break
    except KeyboardInterrupt:
        pass
    finally:
        feeder.close()
        index.mirror = None  # the last reference to the writer, whose table views the segments: free it before
        del writer  # the segments close (a view still alive makes the close fail, and again at exit)
        segments.close()
    return 0

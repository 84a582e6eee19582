"""The KV-events feeder in a supervised child process, publishing its index through shared memory.

Why a process: the feeder decodes every block event of every engine (hundreds of thousands a second on a busy
pool); on the serving loop that would take the GIL from the picks. The child (`python -m epp.app.kv_feeder`) runs
`epp.kvevents.feeder.Feeder` over a `KvBlockIndex` whose `TableWriter` keeps the shared-memory block table
(`epp.kvevents.shared`, segments by `epp.kvevents.publish`) equal to it. The serving process reads that table in
place (`TableReader`: no copy) when the `precise-prefix-cache-producer` matches a request.

Channels (JSON lines on the child's stdin and stdout):
- parent → child: the endpoints to follow, from discovery (`{"sources": [[endpoint, host, rank], ...]}`); the
  rank of an endpoint is its position among the endpoints of the same pod IP by port (data parallelism as several
  target ports), and offsets the producer's socket port, as upstream does. EOF on stdin: the child exits.
- child → parent, every `STATUS_S`: the table's segment prefix, the endpoint of each table slot (bit), each
  endpoint's last event time (CLOCK_MONOTONIC, shared by both processes) and the feeder's counters.

Supervision is the scrape child's (`epp.supervision`): a child that exits is logged with its exit code or signal
and started again after the backoff, on a fresh segment prefix (the old names are unlinked by the parent). While
there is no child, every endpoint reads as absent and the producer falls back to the approximate match for all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from epp.datastore.table import EndpointTable
from epp.kvevents import kernels
from epp.kvevents.blockkeys import U64Array
from epp.kvevents.feeder import Feeder, FeederSettings, KvSource, vars_of
from epp.kvevents.index import KvBlockIndex
from epp.kvevents.publish import SegmentAllocator, TableReader, new_prefix
from epp.kvevents.shared import TableWriter
from epp.scheduling.precise import NEVER, PrecisePrefixCacheProducer
from epp.supervision import RestartBackoff, describe_exit

log = logging.getLogger(__name__)

STATUS_S = 0.2  # child → parent status period
MEMBERSHIP_S = 0.2  # how often the parent compares the table's membership with what it sent


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


class KvFeederProcess:
    """The parent's side: starts, feeds and supervises the child; a `KvIndexView` for the producer."""

    def __init__(self, table: EndpointTable, producer: PrecisePrefixCacheProducer) -> None:
        self.table = table
        self.producer = producer
        self.restarts = 0
        self.backoff = RestartBackoff()
        self._proc: asyncio.subprocess.Process | None = None
        self._started_at = 0.0
        self._reader: TableReader | None = None
        self._prefix = ""
        self._generation = 0
        self._slots: list[str | None] = []
        self._last: dict[str, float] = {}
        self._version = 0  # `KvIndexView.version`: bumped when the slots or the endpoints heard from change
        self.stats: dict[str, dict[str, int]] = {}
        self.counters: dict[str, Any] = {}
        self._sent: list[tuple[str, str, int]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.last_exit = ""

    # -- KvIndexView --------------------------------------------------------------------------------------------

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
        if counts.size < len(slots):  # slots the table has no mask bits for yet: they hold nothing
            counts = np.concatenate((counts, np.zeros(len(slots) - counts.size, dtype=counts.dtype)))
        return counts

    def last_event_at(self, endpoint: str) -> float:
        return self._last.get(endpoint, NEVER)

    # -- lifecycle ----------------------------------------------------------------------------------------------

    @property
    def up(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> None:
        self.producer.attach(self)
        log.info("KV events: block keys and table lookups by the %s kernels", kernels.name())
        await self._spawn()
        self._task = asyncio.ensure_future(self._supervise())

    async def _spawn(self) -> None:
        p = self.producer
        self._prefix = new_prefix()
        argv = [
            sys.executable,
            "-m",
            "epp.app.kv_feeder",
            f"--prefix={self._prefix}",
            f"--port={p.socket_port}",
            f"--topic={p.topic_filter}",
            f"--block-size={p.block_size}",
            f"--hash-seed={p.hash_seed}",
            f"--max-blocks={p.max_blocks_per_endpoint}",
        ]
        if p.replay_port is not None:
            argv.append(f"--replay-port={p.replay_port}")
        self._proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        self._started_at = time.monotonic()
        self._sent = None
        log.info("kv-events feeder started (pid %d, segments %s)", self._proc.pid, self._prefix)

    async def _supervise(self) -> None:
        while not self._stopping:
            proc = self._proc
            assert proc is not None and proc.stdout is not None
            reading = asyncio.ensure_future(self._read(proc))
            while not self._stopping and proc.returncode is None:
                self._send_membership(proc)
                await asyncio.sleep(MEMBERSHIP_S)
                if reading.done():
                    break
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5.0)
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reading
            self._drop_child()
            if self._is_stopping():  # stop() ran while we waited
                return
            code = proc.returncode if proc.returncode is not None else -9
            self.last_exit = describe_exit(code)
            self.backoff.died_after(time.monotonic() - self._started_at)
            delay = self.backoff.next_delay()
            log.error("kv-events feeder (pid %d) %s; restarting in %.1fs", proc.pid, self.last_exit, delay)
            await asyncio.sleep(delay)
            self.restarts += 1
            await self._spawn()

    def _is_stopping(self) -> bool:
        return self._stopping

    def _send_membership(self, proc: asyncio.subprocess.Process) -> None:
        sources = sources_of(self.table.addresses())
        if sources == self._sent or proc.stdin is None:
            return
        self._sent = sources
        with contextlib.suppress(Exception):
            proc.stdin.write((json.dumps({"sources": sources}) + "\n").encode())

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while True:
            line = await proc.stdout.readline()
            if not line:
                return
            try:
                status = json.loads(line)
            except ValueError:
                continue
            self._apply_status(status)

    def _apply_status(self, status: dict[str, Any]) -> None:
        if self._reader is None:
            with contextlib.suppress(FileNotFoundError):
                self._reader = TableReader(self._prefix)
        self._generation = int(status.get("generation", 0))
        slots = list(status.get("slots", []))
        last = {k: float(v) for k, v in status.get("last", {}).items()}
        if slots != self._slots or last.keys() != self._last.keys():
            self._version += 1
        self._slots, self._last = slots, last
        self.stats = status.get("streams", {})
        self.counters = status.get("index", {})

    def _drop_child(self) -> None:
        """Forget the dead child's table and unlink what it left in /dev/shm."""
        if self._reader is not None:
            with contextlib.suppress(Exception):
                self._reader.close()
        self._reader = None
        self._slots, self._last = [], {}
        self._version += 1
        names = [self._prefix] + [
            f"{self._prefix}-{g}" for g in range(max(0, self._generation - 2), self._generation + 2)
        ]
        for name in names:  # POSIX shared memory lives under /dev/shm on Linux
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")

    async def stop(self) -> None:
        self._stopping = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                with contextlib.suppress(Exception):
                    proc.stdin.close()  # EOF: the child closes its sockets, unlinks its segments and exits
            try:
                await asyncio.wait_for(proc.wait(), 5.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._drop_child()

    def supervision(self, now: float) -> dict[str, Any]:
        """For /debug/pool: the child's state and each endpoint's freshness as the producer judges it."""
        endpoints = {}
        for address in self.table.addresses():
            entry = self.producer.freshness(address, now)
            entry["stream"] = self.stats.get(address, {})
            endpoints[address] = entry
        return {
            "up": self.up,
            "pid": self._proc.pid if self._proc is not None else None,
            "restarts": self.restarts,
            "lastExit": self.last_exit or None,
            "tableGeneration": self._generation,
            "kernels": kernels.name(),  # compiled or numpy block keys and table lookups (epp.kvevents.kernels)
            "index": self.counters,
            "fallbacks": dict(self.producer.fallbacks),
            "endpoints": endpoints,
        }


# -- the child ------------------------------------------------------------------------------------------------


def _child_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m epp.app.kv_feeder")
    p.add_argument("--prefix", required=True)
    p.add_argument("--port", type=int, default=5557)
    p.add_argument("--replay-port", type=int, default=None)
    p.add_argument("--topic", default="kv@")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--hash-seed", default="")
    p.add_argument("--max-blocks", type=int, default=65_536)
    args = p.parse_args(argv)
    index = KvBlockIndex(block_size=args.block_size, hash_seed=args.hash_seed, max_blocks_per_endpoint=args.max_blocks)
    segments = SegmentAllocator(args.prefix)
    writer = TableWriter(index, segments, published=segments.published)
    feeder = Feeder(index, FeederSettings(port=args.port, replay_port=args.replay_port, topic=args.topic))
    stop = threading.Event()

    def read_membership() -> None:
        for line in sys.stdin:
            with contextlib.suppress(ValueError, TypeError, KeyError):
                msg = json.loads(line)
                feeder.update(KvSource(str(e), str(h), int(r)) for e, h, r in msg["sources"])
        stop.set()  # the parent closed our stdin (or died)

    threading.Thread(target=read_membership, daemon=True).start()
    next_status = time.monotonic()
    try:
        while not stop.is_set():
            feeder.poll(50)
            now = time.monotonic()
            if now >= next_status:
                next_status = now + STATUS_S
                status = {
                    "generation": writer.table.generation,
                    "slots": index.slot_names(),
                    "last": {n: index.last_event_at(n) for n in index.endpoints() if index.last_event_at(n) != NEVER},
                    "streams": {n: vars_of(s) for n, s in feeder.stats().items()},
                    "index": {
                        "blocks": index.total_blocks(),
                        "stored": index.counters.stored_blocks,
                        "removed": index.counters.removed_blocks,
                        "cleared": index.counters.cleared,
                        "evicted": index.counters.evicted_blocks,
                        "skipped": index.counters.skipped,
                    },
                }
                try:
                    print(json.dumps(status), flush=True)
                except (BrokenPipeError, OSError):
                    break
    except KeyboardInterrupt:
        pass
    finally:
        feeder.close()
        index.mirror = None  # the last reference to the writer, whose table views the segments: free it before
        del writer  # the segments close (a view still alive makes the close fail, and again at exit)
        segments.close()
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())

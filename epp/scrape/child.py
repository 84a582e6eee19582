"""The scrape child (`child_main`, spawned by `epp.scrape.process.ScrapeProcess` through the
child-process kit): the ordinary `ScrapeService` on a private table that mirrors the parent's membership, publishing
changed rows into the parent's block (the shared-row layout, epp.datastore.rows), and the messages
between the two. A row whose new page repeats the values it already carries (an idle server's page) is not
written again and wakes nobody: the child stamps it with the scrape's time in the parent's stamps (one float per
parent slot, epp.datastore.rows), which the parent's table and the workers' read as they read the table; only a
row that changed is written and announced (`Landed`).

Parent → child: `ScrapeStart` (the kit's `Start` payload), `Members` whenever the membership changes (each slot
with a token: a slot reused by another endpoint gets a new one), the kit's `Stop`.
Child → parent: `Status` every `STATUS_S` (per-endpoint statuses and the counters), `Adapters` when an endpoint's
LoRA adapters change, and the kit's Ready, Heartbeat and Log. The child exits when told, when the pipe closes, or
when its parent dies (epp.supervision.child_end).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass

import numpy as np

from epp.datastore.rows import NCOL, SCRAPE_ROW, SCRAPED_AT_VALUE, scrape_values, write_rows, write_stamps
from epp.datastore.table import EndpointInfo, EndpointTable
from epp.scrape.engines import EngineRegistry
from epp.scrape.scraper import EndpointStatus, ScrapeService, ScrapeSettings
from epp.supervision.child_end import ChildEnd
from epp.supervision.loop import run_loop, wait_set
from epp.supervision.memory import map_array
from epp.supervision.messages import Stop
from epp.supervision.pipe import watch_pipe

PUBLISH_S = 0.005  # after a scrape lands, the rest of its round (still under way) gets this long to land too
STATUS_S = 1.0
_BUT_AT = np.arange(len(SCRAPE_ROW)) != SCRAPED_AT_VALUE  # the values a repeated page repeats (not its time)


@dataclass(frozen=True, slots=True)
class ScrapeStart:
    settings: ScrapeSettings
    engines: EngineRegistry
    rows: int  # the block's rows: the parent's slots it scrapes


@dataclass(frozen=True, slots=True)
class Members:
    members: list[tuple[int, float, EndpointInfo]]  # (parent slot, token, endpoint)


@dataclass(frozen=True, slots=True)
class Adapters:
    changes: list[tuple[int, float, list[str], list[str]]]  # (parent slot, token, running, waiting)


@dataclass(frozen=True, slots=True)
class Landed:
    """Rows were written to the block: the parent copies them in now, instead of looking on a clock."""


@dataclass(frozen=True, slots=True)
class Status:
    statuses: dict[str, EndpointStatus]
    rejected: dict[tuple[str, str], int]  # the child's `ScrapeService.rejected_values`
    errors: dict[str, int]  # its `poll_errors`


async def run(end: ChildEnd, block: np.ndarray, stamps: np.ndarray | None = None) -> None:
    start: ScrapeStart = end.payload
    loop = asyncio.get_running_loop()
    table = EndpointTable()
    svc = ScrapeService(table, start.settings, start.engines)
    stop = asyncio.Event()
    landed = asyncio.Event()  # a scrape (or failure) was recorded, the membership changed, or we are to stop
    table.add_scrape_listener(landed.set)

    def finish() -> None:
        stop.set()
        landed.set()

    by_address: dict[str, tuple[int, float]] = {}  # address → (parent slot, token)

    def on_message() -> None:
        nonlocal by_address
        try:
            while end.conn.poll():
                msg = end.conn.recv()
                if isinstance(msg, Members):
                    by_address = {info.address: (slot, token) for slot, token, info in msg.members}
                    table.replace_all(info for _, _, info in msg.members)
                    table.version += 1  # a token may change with the same membership: remap
                    landed.set()
                elif isinstance(msg, Stop):
                    finish()
        except (EOFError, OSError):
            finish()

    watch_pipe(loop, end.conn, on_message)
    end.on_parent_gone(finish, loop)
    await svc.start()
    end.ready()
    beating = asyncio.ensure_future(end.keep_alive())
    next_status = loop.time() + STATUS_S
    mapped = -1
    parent = np.zeros(0, dtype=np.int64)
    tokens = np.zeros(0)
    last_at = np.zeros(0)
    last_values = np.zeros((0, len(SCRAPE_ROW)))
    last_failures = np.zeros(0, dtype=np.int64)
    last_ok = np.zeros(0, dtype=np.bool_)
    adapters: list[tuple[frozenset[str], frozenset[str]] | None] = []
    try:
        published = -1
        while not stop.is_set():
            # Woken by what changed, not by a clock: an idle pool costs a wake-up per scrape round.
            await wait_set(landed, next_status - loop.time())
            landed.clear()
            if svc.in_flight and not stop.is_set():  # the rest of the round gets PUBLISH_S to land: one pass
                svc.round_done.clear()
                await wait_set(svc.round_done, PUBLISH_S)
            if stop.is_set():
                break
            if loop.time() >= next_status:
                next_status = loop.time() + STATUS_S
                end.send(Status(svc.status(), dict(svc.rejected_values), dict(svc.poll_errors)))
            if table.scrape_version == published and table.version == mapped:
                continue  # no scrape landed since the last pass: nothing to copy or compare
            published = table.scrape_version
            snap = table.snapshot()
            n = len(snap.present)
            if snap.version != mapped:  # membership changed: map local slots to parent rows, republish all
                mapped = snap.version
                parent = np.full(n, -1, dtype=np.int64)
                tokens = np.full(n, -1.0)
                for local, address in enumerate(snap.addresses):
                    where = by_address.get(address)
                    if where is not None and snap.present[local]:
                        parent[local], tokens[local] = where
                last_at = np.full(n, -np.inf)
                last_values = np.full((n, len(SCRAPE_ROW)), np.nan)
                last_failures = np.full(n, -1, dtype=np.int64)  # never a row's: every row is republished
                last_ok = np.zeros(n, dtype=np.bool_)
                adapters = [None] * n
            at = np.where(np.isnan(snap.scraped_at), -1.0, snap.scraped_at)  # never scraped: -1, equal to itself
            failures, ok = snap.scrape_failures, snap.scrape_ok
            moved = np.flatnonzero((parent >= 0) & ((at != last_at) | (failures != last_failures)))
            if not moved.size:
                continue
            last_at[moved] = at[moved]
            values = scrape_values(snap, moved)
            before = last_values[moved]
            same = ((values == before) | (np.isnan(values) & np.isnan(before)))[:, _BUT_AT].all(axis=1)
            same &= (failures[moved] == last_failures[moved]) & (ok[moved] == last_ok[moved])
            if stamps is not None and same.any():  # the page repeated what the row says: a stamp, no message
                write_stamps(stamps, parent[moved[same]], snap.scraped_at[moved[same]])
            else:
                same[:] = False
            changed = moved[~same]
            if changed.size:
                write_rows(block, parent[changed], tokens[changed], values[~same], ok[changed], failures[changed])
                last_values[changed] = values[~same]
                last_failures[changed] = failures[changed]
                last_ok[changed] = ok[changed]
                end.send(Landed())
            news = []
            for local in moved.tolist():
                pair = (snap.running_adapters[local], snap.waiting_adapters[local])
                if snap.scrape_ok[local] and adapters[local] != pair:
                    adapters[local] = pair
                    news.append((int(parent[local]), float(tokens[local]), sorted(pair[0]), sorted(pair[1])))
            if news:
                end.send(Adapters(news))
    except (EOFError, OSError):
        pass
    finally:
        beating.cancel()
        loop.remove_reader(end.conn.fileno())
        await svc.stop()


def child_main(end: ChildEnd) -> int:
    """The kit's entry (epp.supervision.launch)."""
    start: ScrapeStart = end.payload
    block = map_array(end.fds[0], (start.rows, NCOL), np.float64)
    stamps = map_array(end.fds[1], (start.rows + 1,), np.float64) if len(end.fds) > 1 else None
    for fd in end.fds:
        os.close(fd)  # the mappings stay
    with contextlib.suppress(KeyboardInterrupt):
        run_loop(run(end, block, stamps))
    return 0

"""`epp serve --workers N`: the control process's side of N serving workers (epp.app.worker).

One GIL serves one core: past it, a picker scales by processes. The control process keeps everything that must
have one owner (discovery, leader election, config, the scrape child, health, /metrics) and starts N workers
that share the ext_proc port through SO_REUSEPORT (the kernel spreads connections over them). It publishes to
them, each piece with a single writer:

- the endpoint rows, into one seqlocked block by the control slot (the shared-row layout, epp.datastore.rows),
  as soon as a scrape lands in the control process's table, only rows whose scrape moved;
- membership (with a token per slot, so a reused slot's late rows are ignored), the pool's failure mode and the
  objectives, as a message to every worker when any of them changes;
- the in-flight matrix (worker × endpoint) is written by the workers, each its own row; the control process only
  clears the row of a worker that died, so its picks stop counting as load;
- the shared log of picks (epp.app.pick_log): a ring per worker, written by that worker, read by the others;
- with federation, the sites the FederatedCluster watch (run here, once) keeps, as a `Sites` message to every
  worker when they change: a worker that has not heard them yet knows no site, so it routes nothing remote
  (residency holds: fail-closed);
- with the precise producer, the KV-events feeder's table (one feeder, a child of this process): its directory and
  table generations (memfds, passed on the pipe) and its status, relayed to every worker, each of whose producers
  reads the table in place; the control process reads the pick log's owed-store records, so /debug/pool judges
  an endpoint's freshness as the workers' producers do.

Each worker is a `Child` of the child-process kit (epp.supervision.child), supervised as every child is: one that
exits or hangs is logged with its exit code or signal and started again after the backoff, none once the picker
stops; a worker outlives no control process. Readiness is on while any worker is serving; on SIGTERM every worker
gets `Stop` and drains its open streams for `--grace-period`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from epp.app.kv_feeder import KvFeederProcess
from epp.app.mirror_table import MATRIX_COLUMNS
from epp.app.pick_log import PickLog, ring_words
from epp.app.pools import PoolSet
from epp.app.receipt_metrics import MAX_FAMILIES
from epp.app.settings import ServeSettings
from epp.app.worker import (
    STATS_COLUMNS,
    Members,
    Metrics,
    Render,
    Sites,
    WorkerStart,
    owed_since,
    precise_positions,
)
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.pool import FailureMode
from epp.datastore.rows import NCOL, TOKEN, scrape_values, write_rows
from epp.datastore.sites import SiteRegistry
from epp.datastore.table import EndpointTable
from epp.observability.request_series import MetricsState
from epp.observability.worker_series import SeriesFold
from epp.supervision.child import Child
from epp.supervision.loop import wait_set
from epp.supervision.memory import map_array, new_memfd

log = logging.getLogger(__name__)

CHECK_S = 0.25  # failure mode, objectives and the workers' bookings are compared this often (membership: on change)
MAX_ENDPOINTS = 16384
RENDER_TIMEOUT_S = 1.0  # how long /metrics waits for the workers' expositions


class _Worker:
    """One serving worker: its supervised child, and the exposition of its other families it sent last."""

    def __init__(self, pool: WorkerPool, index: int) -> None:
        self.index = index
        self.exposition = b""
        self.rendered = 0  # expositions received
        self.learned: tuple[Any, ...] = ()  # its latency models' sums (`Metrics.learned`), as it sent them last
        self.child = Child(
            "epp.app.worker",
            f"worker {index} (pid {{pid}})",
            payload=lambda: WorkerStart(pool._settings, index, pool.rows, pool.count, pool._stamp_length()),
            fds=lambda: tuple(pool._fds) + pool._stamp_fds(),
            on_start=lambda: pool._started(self),
            on_ready=lambda: pool._ready(self),
            on_message=lambda msg: pool._on_message(self, msg),
            on_exit=lambda code: pool._ended(self),
            relay_as=f"epp-worker-{index}",
        )

    @property
    def ready(self) -> bool:
        return self.child.ready


class WorkerPool:
    """Starts, feeds, supervises and stops the serving workers."""

    def __init__(
        self,
        count: int,
        settings: ServeSettings,
        table: EndpointTable,
        objectives: ObjectiveStore,
        failure_mode: Callable[[], FailureMode],
        namespace: Callable[[], str],
        on_change: Callable[[], None],
        *,
        sites: SiteRegistry | None = None,
        kv: KvFeederProcess | None = None,
        shared_learners: int = 0,
        max_endpoints: int = MAX_ENDPOINTS,
        pools: PoolSet | None = None,
    ) -> None:
        """`pools`: several pools, each sent with the membership (`Members.pools`: spec, objectives, rewrites)."""
        self._pools = pools
        self.count = count
        self._settings = settings
        self._table = table
        self._objectives = objectives
        self._failure_mode = failure_mode
        self._namespace = namespace
        self._on_change = on_change
        self._sites = sites
        self._sites_sent: tuple[int, bool] | None = None  # (registry version, synced) last sent
        self.rows = max_endpoints
        shapes = ((self.rows, NCOL), (count, self.rows, MATRIX_COLUMNS), (count, STATS_COLUMNS), (ring_words(count),))
        names = ("rows", "inflight", "stats", "picks")
        self._fds = [new_memfd(name, int(np.prod(shape)) * 8) for name, shape in zip(names, shapes, strict=True)]
        self._rows = map_array(self._fds[0], shapes[0], np.float64)
        self._rows[:, TOKEN] = -1.0
        self.inflight = map_array(self._fds[1], shapes[1], np.int64)
        self._slots = np.arange(self.rows)
        self.stats = map_array(self._fds[2], shapes[2], np.int64)
        self._kv = kv
        self._owed: tuple[PickLog, int] | None = None  # the pick log read for the precise producer's owed stores
        if kv is not None:
            kv.relay = self._relay_kv
            picks = map_array(self._fds[3], shapes[3], np.int64)
            self._owed = (PickLog(picks, count, -1), precise_positions(shared_learners)[1])
        self._workers = [_Worker(self, i) for i in range(count)]
        self.series = SeriesFold(objectives)  # the workers' request series, under the picker's label caps
        self._task: asyncio.Task[None] | None = None
        self._scraped = asyncio.Event()  # a scrape landed in the table: rows to publish
        self._rendered = asyncio.Event()  # a worker's exposition came in
        # publication state
        self._members_key: tuple[Any, ...] | None = None
        self._tokens = np.full(self.rows, -1.0)
        self._infos: dict[int, Any] = {}
        self._next_token = 0
        self._last_at = np.full(self.rows, np.nan)
        self._last_failures = np.full(self.rows, -1, dtype=np.int64)
        self._members_msg = Members([], FailureMode.FAIL_CLOSE.value, {}, {}, "")
        self._warned_full = False
        # flow control (epp.app.flow_host): the workers' messages, a worker's end, a release in flight
        self._flow_message: Callable[[int, Any], None] | None = None
        self._flow_gone: Callable[[int], None] = lambda index: None
        self._released: Callable[[], None] = lambda: None
        self._learned: Callable[[list[tuple[Any, ...]]], None] | None = None
        self._in_flight = 0
        self._stamps: Callable[[], tuple[int, int] | None] = lambda: None

    def share_stamps(self, stamps: Callable[[], tuple[int, int] | None]) -> None:
        """The scrape child's stamps (epp.datastore.rows), which every worker reads to date its rows by: a page that
        repeats a row's values is stamped, not published (`stamps()`: (descriptor, length) as a worker starts)."""
        self._stamps = stamps

    def _stamp_length(self) -> int:
        stamps = self._stamps()
        return stamps[1] if stamps is not None else 0

    def _stamp_fds(self) -> tuple[int, ...]:
        stamps = self._stamps()
        return (stamps[0],) if stamps is not None else ()

    def attach_flow(
        self, message: Callable[[int, Any], None], gone: Callable[[int], None], released: Callable[[], None]
    ) -> None:
        """Flow control across the workers: `message(worker, msg)` gets their flow-control messages, `gone(worker)`
        a worker's end, `released()` each publication that saw the picks in flight fall."""
        self._flow_message, self._flow_gone, self._released = message, gone, released

    def attach_learning(self, learned: Callable[[list[tuple[Any, ...]]], None]) -> None:
        """`learned(per_worker)` after each worker's metrics: every running worker's latency models' sums."""
        self._learned = learned

    def send(self, index: int, msg: Any) -> bool:
        """A message to worker `index`: False when it is not running."""
        return self._workers[index].child.send(msg)

    def sync_bookings(self) -> None:
        """The workers' bookings, summed into the control process's table now: /metrics
        (llm_d_epp_inflight_requests), /debug/pool and flow control's saturation show what is in flight, as one
        process's would."""
        n = min(len(self._table.view().present), self.rows)
        if n == 0:
            return
        summed = self.inflight[:, :n, :].sum(axis=0)
        self._table.set_bookings(self._slots[:n], summed)
        in_flight = int(summed[:, 0].sum())
        if in_flight < self._in_flight:
            self._released()
        self._in_flight = in_flight

    # -- lifecycle ------------------------------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """Any worker is up with its port bound: the pool is served."""
        return any(w.ready for w in self._workers)

    async def start(self) -> None:
        self._publish()
        for worker in self._workers:
            worker.child.start()
        self._table.add_scrape_listener(self._scraped.set)
        self._table.add_membership_listener(self._scraped.set)
        self._task = asyncio.create_task(self._run(), name="serving-workers")

    def begin_shutdown(self) -> None:
        """The picker is stopping: a worker that ends from now on is not restarted."""
        for worker in self._workers:
            worker.child.begin_shutdown()

    async def stop(self, grace_s: float) -> None:
        """Every worker drains its open streams (up to `grace_s`) and exits; one that does not is killed."""
        self.begin_shutdown()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await asyncio.gather(*(worker.child.stop(grace_s + 5.0) for worker in self._workers))
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def _started(self, worker: _Worker) -> None:
        self.inflight[worker.index] = 0
        worker.child.send(self._members_msg)
        if self._sites is not None:
            worker.child.send(self._sites_msg())
        if self._kv is not None:
            self._kv.replay(lambda msg, fd: self._send_kv(worker, msg, fd))

    def _ready(self, worker: _Worker) -> None:
        log.info("worker %d serving (pid %s)", worker.index, worker.child.pid)
        self._on_change()

    def _ended(self, worker: _Worker) -> None:
        worker.exposition = b""
        worker.learned = ()
        self.series.forget(worker.index)
        self.inflight[worker.index] = 0  # its picks are no longer anyone's load
        self._flow_gone(worker.index)
        self._on_change()  # readiness: it may have been the last one serving

    def _on_message(self, worker: _Worker, msg: Any) -> None:
        if isinstance(msg, Metrics):
            if msg.series is not None:
                self.series.receive(worker.index, msg.series)
            if msg.exposition is not None:
                worker.exposition = msg.exposition
                worker.rendered += 1
                self._rendered.set()
            worker.learned = msg.learned
            if self._learned is not None:
                self._learned([w.learned for w in self._workers if w.learned])
        elif self._flow_message is not None:
            self._flow_message(worker.index, msg)

    async def _run(self) -> None:
        """Publish when a scrape lands (the rows) or the membership changes, and every `CHECK_S` whatever happens
        (the failure mode, objectives and bookings, which change rarely; flow control reads the bookings itself
        when it needs them): an idle picker's control process wakes for what changed, not 200 times a second."""
        scraped = self._scraped
        while True:
            await wait_set(scraped, CHECK_S)  # not wait_for: stop() must end this task whenever it lands
            scraped.clear()
            try:
                self._publish()
            except Exception:  # the publisher must outlive any surprise, or the workers decide on frozen rows
                log.exception("worker publication pass failed")

    # -- publication ----------------------------------------------------------------------------------------

    def _publish(self) -> None:
        table = self._table
        view = table.view()
        key = (table.version, view.running_adapters, view.waiting_adapters, self._objectives.version,
               self._failure_mode(), self._namespace(), self._pools_key())  # fmt: skip
        if key != self._members_key:
            self._members_key = key
            self._remap(table)
        sites = self._sites
        if sites is not None and (sites.version, sites.synced) != self._sites_sent:
            msg = self._sites_msg()
            for worker in self._workers:
                worker.child.send(msg)
        if self._owed is not None:
            self._learn_owed()
        n = min(len(view.present), self.rows)
        if n == 0:
            return
        self.sync_bookings()
        at = view.scraped_at[:n]
        failures = view.scrape_failures[:n]
        moved = (self._tokens[:n] >= 0) & ~((at == self._last_at[:n]) | (np.isnan(at) & np.isnan(self._last_at[:n])))
        moved |= (self._tokens[:n] >= 0) & (failures != self._last_failures[:n])
        rows = np.flatnonzero(moved)
        if rows.size:
            values = scrape_values(view, rows)
            write_rows(self._rows, rows, self._tokens[rows], values, view.scrape_ok[rows], failures[rows])
            self._last_at[rows] = at[rows]
            self._last_failures[rows] = failures[rows]

    def _remap(self, table: EndpointTable) -> None:
        members = []
        view = table.view()
        infos: dict[int, Any] = {}
        within, beyond = table.members(self.rows)
        if beyond and not self._warned_full:
            log.warning("more than %d endpoints: the workers do not see the rest", self.rows)
            self._warned_full = True
        for slot, info in within:
            if self._infos.get(slot) != info:
                self._tokens[slot] = self._next_token
                self._next_token += 1
                self._last_at[slot] = np.nan  # republish this row under its new token
                self._last_failures[slot] = -1
            infos[slot] = info
            members.append((slot, float(self._tokens[slot]), info, sorted(view.running_adapters[slot]),
                            sorted(view.waiting_adapters[slot])))  # fmt: skip
        for slot in set(self._infos) - set(infos):
            self._tokens[slot] = -1.0
        self._infos = infos
        rewrites = {key: rules for key, rules in self._objectives.rewrites().items()}
        self._members_msg = Members(
            members, self._failure_mode().value, self._objectives.objectives(), rewrites, self._namespace(),
            self._pools_msg(),
        )  # fmt: skip
        for worker in self._workers:
            worker.child.send(self._members_msg)

    def _pools_key(self) -> tuple[Any, ...] | None:
        pools = self._pools
        if pools is None:
            return None
        return tuple((key, spec, pools.objectives_of(key).version) for key, spec in pools.specs.items())

    def _pools_msg(self) -> dict[str, tuple[Any, Any, Any]] | None:
        pools = self._pools
        if pools is None:
            return None
        out = {}
        for key, spec in pools.specs.items():
            store = pools.objectives_of(key)
            out[key] = (spec, store.objectives(), store.rewrites())
        return out

    def _relay_kv(self, msg: Any, fd: int | None) -> None:
        for worker in self._workers:
            self._send_kv(worker, msg, fd)

    @staticmethod
    def _send_kv(worker: _Worker, msg: Any, fd: int | None) -> None:
        if fd is None:
            worker.child.send(msg)
        else:
            worker.child.send_with_fd(msg, fd)

    def _learn_owed(self) -> None:
        """The workers' precise picks that owe stores, into the control process's producer (its /debug/pool)."""
        assert self._owed is not None and self._kv is not None
        pick_log, owed = self._owed
        for position, slot, token, values in pick_log.read():
            info = self._infos.get(slot)
            if position == owed and values and info is not None and self._tokens[slot] == token:
                self._kv.producer.expect_stores(info.address, owed_since(values))

    def _sites_msg(self) -> Sites:
        sites = self._sites
        assert sites is not None
        self._sites_sent = (sites.version, sites.synced)
        return Sites(sites.sites(), sites.synced)

    # -- reporting ------------------------------------------------------------------------------------------

    def supervision(self, now: float | None = None) -> list[dict[str, Any]]:
        """For /debug/pool: each worker, its process (the kit's report), its restarts, how it last ended."""
        now = time.monotonic() if now is None else now
        return [
            {
                "worker": w.index,
                **w.child.report(now),
                "serving": w.ready,
                "streams": int(self.stats[w.index, 0]),
                "picks_learned": int(self.stats[w.index, 2]),  # from the other workers, through the pick log
                "picks_lost": int(self.stats[w.index, 3]),  # theirs, overwritten before this worker read them
            }
            for w in self._workers
        ]

    def expositions(self) -> list[bytes]:
        return [w.exposition for w in self._workers if w.exposition]

    async def fresh_expositions(self, timeout_s: float = RENDER_TIMEOUT_S) -> None:
        """Every serving worker's exposition rendered now (`Render`), before /metrics or /debug/pool is: a worker
        renders its families only when they are read. One that does not answer within `timeout_s` is shown as it
        last sent them."""
        asked = [(w, w.rendered) for w in self._workers if w.ready and w.child.send(Render())]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while any(w.rendered <= before for w, before in asked) and loop.time() < deadline:
            self._rendered.clear()
            await wait_set(self._rendered, deadline - loop.time())


class WorkerCollector:
    """/metrics of a picker with workers: per-worker counters, the workers' request series folded and rendered
    by `render` (the control process's `PickerMetrics.families`: the families of one process), and their other
    metrics summed."""

    def __init__(self, pool: WorkerPool, render: Callable[[MetricsState], Iterable[Metric]]) -> None:
        self._pool = pool
        self._render = render

    def collect(self) -> Iterable[Metric]:
        pool = self._pool
        about = "ext_proc streams each serving worker accepted (since it last started)."
        streams = CounterMetricFamily("epp_worker_streams", about, labels=["worker"])
        up = GaugeMetricFamily("epp_worker_up", "1 while the serving worker has its port bound.", labels=["worker"])
        restarts = CounterMetricFamily("epp_worker_restarts", "Restarts of each serving worker.", labels=["worker"])
        for row in pool.supervision():
            worker = str(row["worker"])
            streams.add_metric([worker], row["streams"])
            up.add_metric([worker], 1.0 if row["serving"] else 0.0)
            restarts.add_metric([worker], row["restarts"])
        yield from (streams, up, restarts)
        yield from self._render(pool.series.state())
        yield from merge_expositions(pool.expositions())


def merge_expositions(texts: list[bytes]) -> list[Metric]:
    """Several processes' exposition of the same metrics → one family each, samples with equal labels summed
    (counters, histograms, gauges such as in-flight counts); `_created` keeps the earliest, the degradation
    alarms' gauge the largest (`receipt_metrics.MAX_FAMILIES`)."""
    families: dict[str, Metric] = {}
    sums: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text.decode()):
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type)
                sums[family.name] = {}
            acc = sums[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if sample.name.endswith("_created"):
                    acc[key] = min(acc.get(key, sample.value), sample.value)
                elif family.name in MAX_FAMILIES:  # an alarm: the picker's is up while any worker's is
                    acc[key] = max(acc.get(key, sample.value), sample.value)
                else:
                    acc[key] = acc.get(key, 0.0) + sample.value
    out = []
    for name, metric in families.items():
        for (sample_name, labels), value in sums[name].items():
            metric.add_sample(sample_name, dict(labels), value)
        out.append(metric)
    return out

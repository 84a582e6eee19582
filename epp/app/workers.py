"""`epp serve --workers N`: the control process's side of N serving workers (epp.app.worker).

One GIL serves one core: past it, a picker scales by processes. The control process keeps everything that must
have one owner (discovery, leader election, config, the scrape child, health, /metrics) and starts N workers
that share the ext_proc port through SO_REUSEPORT (the kernel spreads connections over them). It publishes to
them, each piece with a single writer:

- the endpoint rows, into one seqlocked block by the control slot (`epp.scrape.process.write_rows`), every
  `PUBLISH_S`, only rows whose scrape moved;
- membership (with a token per slot, so a reused slot's late rows are ignored), the pool's failure mode and the
  objectives, as a message to every worker when any of them changes;
- the in-flight matrix (worker × endpoint) is written by the workers, each its own row; the control process only
  clears the row of a worker that died, so its picks stop counting as load;
- the shared log of picks (epp.app.pick_log): a ring per worker, written by that worker, read by the others.

Supervision is the scrape child's (epp.supervision): a worker that exits is logged with its exit code or signal
and started again after the backoff. Readiness is on while any worker is serving; on SIGTERM every worker gets
"stop" and drains its open streams for `--grace-period`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from epp.app.pick_log import ring_words
from epp.app.settings import ServeSettings
from epp.app.worker import MATRIX_COLUMNS, STATS_COLUMNS, shared_array
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.pool import FailureMode
from epp.datastore.table import EndpointTable
from epp.observability.relay import reemit
from epp.scrape.process import NCOL, TOKEN, write_rows
from epp.supervision import RestartBackoff, describe_exit, watch_pipe

log = logging.getLogger(__name__)

PUBLISH_S = 0.005
MAX_ENDPOINTS = 16384
READY_TIMEOUT_S = 60.0  # a worker that has not bound its port by then is hung: killed and restarted


@dataclass
class _Worker:
    index: int
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    proc: subprocess.Popen[bytes] | None = None
    conn: Connection | None = None
    ready: bool = False
    started_at: float = 0.0
    restart_at: float | None = None
    restarts: int = 0
    last_exit: str | None = None
    exposition: bytes = b""


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
        max_endpoints: int = MAX_ENDPOINTS,
    ) -> None:
        self.count = count
        self._settings = settings
        self._table = table
        self._objectives = objectives
        self._failure_mode = failure_mode
        self._namespace = namespace
        self._on_change = on_change
        self.rows = max_endpoints
        self._fds = [os.memfd_create(f"epp-{name}") for name in ("rows", "inflight", "stats", "picks")]
        shapes = ((self.rows, NCOL), (count, self.rows, MATRIX_COLUMNS), (count, STATS_COLUMNS), (ring_words(count),))
        for fd, shape in zip(self._fds, shapes, strict=True):
            os.ftruncate(fd, int(np.prod(shape)) * 8)
        self._rows = shared_array(self._fds[0], shapes[0], np.float64)
        self._rows[:, TOKEN] = -1.0
        self.inflight = shared_array(self._fds[1], shapes[1], np.int64)
        self._slots = np.arange(self.rows)
        self.stats = shared_array(self._fds[2], shapes[2], np.int64)
        self._workers = [_Worker(i) for i in range(count)]
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        # publication state
        self._members_key: tuple[Any, ...] | None = None
        self._tokens = np.full(self.rows, -1.0)
        self._infos: dict[int, Any] = {}
        self._next_token = 0
        self._last_at = np.full(self.rows, np.nan)
        self._last_failures = np.full(self.rows, -1, dtype=np.int64)
        self._members_msg: tuple[Any, ...] = ("members", [], FailureMode.FAIL_CLOSE.value, {}, {}, "")
        self._warned_full = False

    # -- lifecycle ------------------------------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """Any worker is up with its port bound: the pool is served."""
        return any(w.ready for w in self._workers)

    async def start(self) -> None:
        self._publish()
        for worker in self._workers:
            self._spawn(worker)
        self._task = asyncio.create_task(self._run(), name="serving-workers")

    async def stop(self, grace_s: float) -> None:
        """Every worker drains its open streams (up to `grace_s`) and exits; one that does not is killed."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for worker in self._workers:
            if worker.conn is not None:
                with contextlib.suppress(OSError):
                    worker.conn.send(("stop",))
        loop = asyncio.get_running_loop()
        for worker in self._workers:
            proc = worker.proc
            if proc is None:
                continue
            try:
                await loop.run_in_executor(None, proc.wait, grace_s + 5.0)
            except subprocess.TimeoutExpired:
                log.warning("worker %d (pid %d) did not drain in time: killing it", worker.index, proc.pid)
                proc.kill()
                await loop.run_in_executor(None, proc.wait, 5.0)
            self._drop(worker)
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def _spawn(self, worker: _Worker) -> None:
        ours, theirs = socket.socketpair()
        passed = (theirs.fileno(), *self._fds)
        argv = [sys.executable, "-m", "epp.app.worker", *map(str, passed)]
        argv += [str(worker.index), str(self.rows), str(self.count)]
        self.inflight[worker.index] = 0
        try:
            worker.proc = subprocess.Popen(argv, pass_fds=passed)
        finally:
            theirs.close()
        ours.setblocking(True)
        worker.conn = Connection(ours.detach())
        worker.conn.send(("init", self._settings, logging.getLogger("epp").getEffectiveLevel()))
        worker.conn.send(self._members_msg)
        worker.started_at = time.monotonic()
        worker.ready = False
        watch_pipe(asyncio.get_running_loop(), worker.conn, self._on_message, worker)

    def _drop(self, worker: _Worker) -> None:
        if worker.conn is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(worker.conn.fileno())
            worker.conn.close()
            worker.conn = None
        worker.proc = None
        worker.exposition = b""
        self.inflight[worker.index] = 0  # its picks are no longer anyone's load
        if worker.ready:
            worker.ready = False
            self._on_change()

    def _on_message(self, worker: _Worker) -> None:
        conn = worker.conn
        if conn is None:
            return
        try:
            while conn.poll():
                msg = conn.recv()
                if msg[0] == "ready":
                    worker.ready = True
                    log.info("worker %d serving (pid %d)", worker.index, msg[1])
                    self._on_change()
                elif msg[0] == "metrics":
                    worker.exposition = msg[1]
                elif msg[0] == "log":
                    reemit(msg[1], f"epp-worker-{worker.index}")
        except (EOFError, OSError):
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(conn.fileno())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_S)
            try:
                now = time.monotonic()
                for worker in self._workers:
                    self._supervise(worker, now)
                self._publish()
            except Exception:  # the supervisor must outlive any surprise, or nothing restarts a worker again
                log.exception("worker supervisor pass failed")

    def _supervise(self, worker: _Worker, now: float) -> None:
        proc = worker.proc
        if proc is not None:
            code = proc.poll()
            if code is None and not worker.ready and now - worker.started_at > READY_TIMEOUT_S:
                log.warning("worker %d (pid %d) not serving after %.0fs: killing it", worker.index, proc.pid,
                            now - worker.started_at)  # fmt: skip
                proc.kill()
                code = proc.wait()
            if code is None:
                return
            ran = now - worker.started_at
            worker.last_exit = describe_exit(code)
            self._drop(worker)
            worker.backoff.died_after(ran)
            delay = worker.backoff.next_delay()
            worker.restart_at = now + delay
            log.warning("worker %d (pid %d) died (%s) after %.1fs; restarting in %.1fs",
                        worker.index, proc.pid, worker.last_exit, ran, delay)  # fmt: skip
            return
        if worker.restart_at is not None and now >= worker.restart_at and not self._stopping:
            worker.restart_at = None
            try:
                self._spawn(worker)
            except OSError as exc:
                worker.restart_at = now + worker.backoff.next_delay()
                log.warning("worker %d restart failed (%s)", worker.index, exc)
                return
            worker.restarts += 1
            log.warning("worker %d restarted (pid %d, restart %d)", worker.index, worker.proc.pid, worker.restarts)  # type: ignore[union-attr]

    # -- publication ----------------------------------------------------------------------------------------

    def _publish(self) -> None:
        table = self._table
        view = table.view()
        key = (table.version, view.running_adapters, view.waiting_adapters, self._objectives.version,
               self._failure_mode(), self._namespace())  # fmt: skip
        if key != self._members_key:
            self._members_key = key
            self._remap(table)
        n = min(len(view.present), self.rows)
        if n == 0:
            return
        # The workers' bookings, summed into the control process's table: /metrics (llm_d_epp_inflight_requests)
        # and /debug/pool show what is in flight, as one process's would.
        table.set_bookings(self._slots[:n], self.inflight[:, :n, :].sum(axis=0))
        at = view.scraped_at[:n]
        failures = view.scrape_failures[:n]
        moved = (self._tokens[:n] >= 0) & ~((at == self._last_at[:n]) | (np.isnan(at) & np.isnan(self._last_at[:n])))
        moved |= (self._tokens[:n] >= 0) & (failures != self._last_failures[:n])
        rows = np.flatnonzero(moved)
        if rows.size:
            values = np.stack(
                (view.waiting, view.running, view.kv_usage, view.max_lora, view.block_size, view.num_blocks,
                 view.scraped_at), axis=1,
            )[rows]  # fmt: skip
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
        self._members_msg = ("members", members, self._failure_mode().value, self._objectives.objectives(),
                             rewrites, self._namespace())  # fmt: skip
        for worker in self._workers:
            if worker.conn is not None:
                with contextlib.suppress(OSError):
                    worker.conn.send(self._members_msg)

    # -- reporting ------------------------------------------------------------------------------------------

    def supervision(self) -> list[dict[str, Any]]:
        """For /debug/pool: each worker, its process, its restarts, how it last ended."""
        return [
            {
                "worker": w.index,
                "pid": w.proc.pid if w.proc is not None else None,
                "serving": w.ready,
                "restarts": w.restarts,
                "last_exit": w.last_exit,
                "streams": int(self.stats[w.index, 0]),
                "picks_learned": int(self.stats[w.index, 2]),  # from the other workers, through the pick log
                "picks_lost": int(self.stats[w.index, 3]),  # theirs, overwritten before this worker read them
            }
            for w in self._workers
        ]

    def expositions(self) -> list[bytes]:
        return [w.exposition for w in self._workers if w.exposition]


class WorkerCollector:
    """/metrics of a picker with workers: per-worker counters, and every worker's own metrics summed."""

    def __init__(self, pool: WorkerPool) -> None:
        self._pool = pool

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
        yield from merge_expositions(pool.expositions())


def merge_expositions(texts: list[bytes]) -> list[Metric]:
    """Several processes' exposition of the same metrics → one family each, samples with equal labels summed
    (counters, histograms, gauges such as in-flight counts); `_created` keeps the earliest."""
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
                else:
                    acc[key] = acc.get(key, 0.0) + sample.value
    out = []
    for name, metric in families.items():
        for (sample_name, labels), value in sums[name].items():
            metric.add_sample(sample_name, dict(labels), value)
        out.append(metric)
    return out

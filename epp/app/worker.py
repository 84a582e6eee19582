"""One serving worker of `epp serve --workers N`: an ext_proc server on the shared port, deciding on the control
process's view of the pool.

The control process (epp.app.workers) owns discovery, leader election, config and the scrapers; a worker owns
only a gRPC server (SO_REUSEPORT on the ext_proc port, TLS as the control process was told) and a Director. What
it decides on comes through memory it shares with the control process:

- the endpoint rows (the shared-row layout, epp.datastore.rows, by the control process's slot, seqlocked), and the
  membership with its tokens as a `Members` message on the kit's pipe (membership changes rarely; rows change
  every scrape);
- the in-flight matrix: one row per worker, one column per endpoint, (in flight, picks since the last scrape,
  prompt tokens in flight).
  Each worker writes its own row when it books or releases a pick; every decision reads the sum over all rows,
  refreshed as the decision reads the table when the last refresh is `REFRESH_S` old (so no decision reads older
  sums, and no timer runs for it: a busy worker refreshes at most every `REFRESH_S`, an idle one every `IDLE_S`,
  sooner while the others' picks come fast, `idle_wait`: next to no CPU), so a burst split over workers is seen
  whole, as one process would see it;
- a stats row (streams started, pid, picks learned from the other workers, picks of theirs lost) the control
  process shows per worker in /metrics and /debug/pool;
- the shared log of picks (epp.app.pick_log): each worker's prefix scorers learn their own picks at once and the
  other workers' picks at the same refresh, so a repeat of a prompt finds its endpoint whichever worker takes it.

With the flowControl gate the worker's requests wait in the control process's queues, the picker's one set
(epp.director.flow_link: enqueue, verdict, decided, abandon, and eviction's track, untrack and evict messages on
the kit's pipe).
With federation, the sites come as a `Sites` message whenever the control process's FederatedCluster watch
changes them (the watch runs once, there); the worker's router reads its own copy, empty until the first message,
so a worker that has not heard the sites routes nothing remote. With `--tracing`, the worker exports its own spans
(its OTLP exporter, the control process's resource plus `epp.worker`).

The worker's own metrics go to the control process when they are read there (its /metrics or /debug/pool asks
every worker, `Render`), and only then: no clock drives them. Its request series as a delta of the series that
moved (epp.observability.worker_series), which the control process folds under the picker's label caps and renders;
the exposition text of its few other families (the prefix index, the sampled plugin timings, refusal counters),
summed there. A worker with a predicted-latency producer also sends its model's sums (with the series) at most
every `METRICS_S` when a number changed: the control process's models, their sum, are what flow control's
`latency-slo-admitter` reads.
The worker is a child of the child-process kit (epp.supervision): started by `child_main`, it ignores the
process group's SIGTERM and SIGINT while the control process lives (that process stops it with `Stop`), and drains
and exits within a second of the control process's end, however it ended (the pipe's EOF, the parent-death
signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from epp.app.kv_feeder import FeederStatus, KvDirectory, KvGone, SharedKvIndex, TableSegment
from epp.app.kv_metrics import PreciseFallbacksCollector
from epp.app.mirror_table import MATRIX_COLUMNS, MirrorTable
from epp.app.pick_log import CAPACITY, PickLog, ring_words
from epp.app.pool_metrics import PrefixCollector
from epp.app.receipt_metrics import ReceiptMetrics
from epp.app.settings import ServeSettings
from epp.app.tls import tls_policy
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.pool import PoolSpec
from epp.datastore.rows import NCOL
from epp.datastore.sites import Site
from epp.datastore.table import EndpointInfo, Snapshot
from epp.director.flow_link import CONTROL_MESSAGES, RemoteFlowGate
from epp.extproc.native import native_front_built
from epp.observability.plugins import PluginTimer
from epp.observability.worker_series import DeltaSource, SeriesDelta
from epp.scheduling.latency_model import LearnedSums
from epp.scheduling.precise import PrecisePrefixCacheProducer
from epp.scheduling.slo import PredictedLatencyProducer
from epp.supervision.child_end import ChildEnd
from epp.supervision.loop import run_loop, wait_set
from epp.supervision.memory import map_array
from epp.supervision.messages import Stop
from epp.supervision.pipe import recv_fd, watch_pipe

log = logging.getLogger(__name__)

REFRESH_S = 0.01  # shared rows, in-flight sums, the others' picks → this worker's table, as a decision reads it
IDLE_S = 0.5  # the same with no decision reading it (the others' picks learned before their ring laps ours)
METRICS_S = 0.5  # with a latency model, at most this often when something changed: its sums → the control process
QUIET_KEPT = 8  # per slot, the picks a refresh remembers as having changed nothing (`_learn`)
STATS_COLUMNS = 4  # streams started, pid, picks learned from the pick log, picks lost from it (lapped)


@dataclass(frozen=True, slots=True)
class WorkerStart:
    """The kit's `Start` payload of a worker: the settings it builds its server from (opaque here), which worker
    it is, and the shared blocks' sizes."""

    settings: ServeSettings
    index: int
    rows: int
    workers: int
    stamps: int = 0  # the length of the scrape child's stamps, passed as a fifth descriptor (0: none)


@dataclass(frozen=True, slots=True)
class Members:
    """Control → worker, whenever any of it changes: the membership (control slot, token, endpoint, running and
    waiting adapters), the pool's failure mode, the objectives and their rewrites, the pool's namespace. With
    several pools, `pools`: each pool served now by key, its spec (its failure mode) with its own objectives and
    rewrites (each endpoint names its pool in `EndpointInfo.pool`)."""

    members: list[tuple[int, float, EndpointInfo, list[str], list[str]]]
    failure_mode: str
    objectives: Any
    rewrites: Any
    namespace: str
    pools: dict[str, tuple[PoolSpec, Any, Any]] | None = None


class WorkerPools:
    """Several pools as a worker knows them: the control process's `Members.pools`, applied in place (the
    `PoolSet` its pool directors read)."""

    def __init__(self) -> None:
        self.specs: dict[str, PoolSpec] = {}
        self._stores: dict[str, ObjectiveStore] = {}

    def objectives_of(self, key: str) -> ObjectiveStore:
        store = self._stores.get(key)
        if store is None:
            store = self._stores[key] = ObjectiveStore()
        return store

    def apply(self, pools: dict[str, tuple[PoolSpec, Any, Any]]) -> None:
        for key, (_, objectives, rewrites) in pools.items():
            store = self.objectives_of(key)
            store.replace_objectives(objectives)
            store.replace_rewrites(rewrites)
        self.specs = {key: spec for key, (spec, _, _) in pools.items()}


@dataclass(frozen=True, slots=True)
class Sites:
    """Control → worker, with federation, whenever the watch changed them: every site (heartbeats on
    CLOCK_MONOTONIC, which every process of the host shares) and whether the watch has listed them yet."""

    sites: tuple[Site, ...]
    synced: bool


@dataclass(frozen=True, slots=True)
class Metrics:
    """Worker → control, on `Render` (and with a latency model at most every `METRICS_S`): the request series that
    moved (None: none did), what each predicted-latency-producer's model learned (`LatencyModel.export`, by the
    config's order: the control process's models are their sum); on `Render`, the exposition text of the worker's
    other families (else None)."""

    series: SeriesDelta | None
    exposition: bytes | None
    learned: tuple[LearnedSums, ...] = ()


@dataclass(frozen=True, slots=True)
class Render:
    """Control → worker: /metrics or /debug/pool is being read, a `Metrics` with the exposition is wanted now
    (rendered only then: ~3.6 ms of a busy worker's CPU each, 7 µs per request at 2 a second)."""


class _CountingObserver:
    """The worker's metrics as the ext_proc server's observer, counting started streams in the shared stats row."""

    def __init__(self, inner: Any, stats: np.ndarray) -> None:
        self._inner = inner
        self._stats = stats.data.cast("B").cast("q")  # our stats row as Python ints: no numpy scalar per stream

    def stream_started(self) -> None:
        self._stats[0] += 1
        self._inner.stream_started()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        setattr(self, name, value)  # found in the instance from now on: the path reads several per request
        return value


async def _worker(
    end: ChildEnd, settings: ServeSettings, index: int, arrays: tuple[np.ndarray, ...], stamps: np.ndarray | None
) -> int:
    # Imported here, not at the top: gRPC reads its TLS cipher list at its first import, which `child_main` sets
    # first.
    from prometheus_client import CollectorRegistry, generate_latest

    from epp.app.build import (
        build_decisions,
        build_director,
        build_processor,
        build_tracing,
        extproc_server,
        load_picker_config,
    )
    from epp.app.federation import worker_federation
    from epp.app.runtime import settle_garbage_collector
    from epp.datastore.pool import FailureMode
    from epp.observability.metrics import PickerMetrics

    rows, matrix, stats, picks = arrays
    stats[index, 1] = os.getpid()
    config = load_picker_config(settings.config)
    scheduler = build_decisions(settings, config).scheduler
    table = MirrorTable(rows, matrix, index, stamps)
    pick_log = PickLog(picks, matrix.shape[0], index)
    scorers: list[Learner] = list(scheduler.prefix_scorers)  # every profile's, in order: a record names one by position
    for position, scorer in enumerate(scheduler.prefix_scorers):
        scorer.on_pick = _sharing(pick_log, table, position)
    kv_index = _share_precise(scheduler.kv_events, pick_log, table, scorers)
    objectives = ObjectiveStore()
    flow = None
    if scheduler.flow is not None:  # the picker's queues are the control process's (epp.app.flow_host)
        flow = RemoteFlowGate(end.send, time.monotonic, objectives, scheduler.flow.spec.enable_eviction)
    failure = [FailureMode.FAIL_CLOSE]
    registry = CollectorRegistry(auto_describe=True)
    registry.register(PrefixCollector.of(scheduler))  # this worker's prefix index, summed by the control process
    receipts = ReceiptMetrics()  # this worker's receipts and alarms: summed (alarms: max) by the control process
    registry.register(receipts)
    plugin_timer = PluginTimer()  # one pick in 64 timed, as in one process; the histograms summed likewise
    registry.register(plugin_timer)
    scheduler.instrument(plugin_timer)
    if scheduler.kv_events is not None:  # this worker's precise producer's fallbacks, summed by the control process
        registry.register(PreciseFallbacksCollector(scheduler.kv_events))

    def endpoint_name(address: str) -> tuple[str, str, str]:
        slot = table.slot_of(address)
        info = table.info(slot) if slot is not None else None
        name = info.pod_name if info is not None and info.pod_name else address
        return name, namespace[0], address.rpartition(":")[2]

    namespace = [""]
    metrics = PickerMetrics(registry, labels=objectives, endpoint_name=endpoint_name)
    registry.unregister(metrics)  # its series travel as deltas (`Metrics.series`), rendered by the control process
    deltas = DeltaSource(metrics)

    models = [p.model for p in scheduler.learners if isinstance(p, PredictedLatencyProducer)]

    def send_metrics(render: bool = False) -> None:
        delta = deltas.delta()
        if render:
            end.send(Metrics(delta, generate_latest(registry), tuple(m.export() for m in models)))
        elif delta is not None:
            end.send(Metrics(delta, None, tuple(m.export() for m in models)))

    tracer_provider, tracer = build_tracing(settings.tracing, worker=index)
    if tracer is not None:
        from epp.app.tracing import traced_scheduler

        scheduler = traced_scheduler(scheduler, tracer)
    federation = worker_federation(settings.federation, config, scheduler.saturation.saturated)
    director = build_director(
        settings,
        scheduler,
        table,
        objectives,
        failure_mode=lambda: failure[0],
        observer=metrics,
        federation=federation[0] if federation is not None else None,
        flow=flow,
        receipts=receipts,
    )
    decider: Any = director
    if tracer is not None:
        from epp.app.tracing import TracingDirector

        decider = TracingDirector(director, tracer)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    wake = asyncio.Event()  # the worker must stop: the loop below runs now
    refreshed_at = [-1.0]

    def refresh() -> None:
        """The shared rows and in-flight sums into our table, the other workers' picks into our prefix scorers."""
        refreshed_at[0] = loop.time()  # first: `_learn` reads the table too
        table.refresh()
        _learn(pick_log, table, scorers, stats[index])

    def on_read() -> None:
        """A decision reads the table: what the control process and the other workers wrote, if we last took it
        `REFRESH_S` ago or more."""
        if loop.time() - refreshed_at[0] >= REFRESH_S:
            refresh()

    def halt() -> None:
        stop.set()
        wake.set()

    table.on_read = on_read
    observer = _CountingObserver(metrics, stats[index])
    pools: WorkerPools | None = None
    if settings.endpoints.multi:  # several pools: the same per-pool directors as one process, on this table
        from epp.app.pool_path import pools_processor

        pools = WorkerPools()
        processor = pools_processor(
            settings, config, pools, table, registry, plugin_timer, tracer, metrics, observer, receipts
        )
    else:
        processor = build_processor(settings, config, decider, observer)
    server = extproc_server(settings, processor, reuse_port=True)

    conn = end.conn

    def on_message() -> None:
        try:
            while conn.poll():
                msg = conn.recv()
                if isinstance(msg, Members):
                    table.mirror(msg.members)
                    failure[0] = FailureMode(msg.failure_mode)
                    objectives.replace_objectives(msg.objectives)
                    objectives.replace_rewrites(msg.rewrites)
                    namespace[0] = msg.namespace
                    if pools is not None and msg.pools is not None:
                        pools.apply(msg.pools)
                    table.synced = True
                elif isinstance(msg, (KvDirectory, TableSegment)):
                    fd = recv_fd(conn)  # it follows its message on the pipe
                    try:
                        if kv_index is not None and isinstance(msg, KvDirectory):
                            kv_index.use_directory(fd)
                        elif kv_index is not None and isinstance(msg, TableSegment):
                            kv_index.add_table(msg.generation, fd)
                    finally:
                        os.close(fd)  # mapped
                elif isinstance(msg, FeederStatus) and kv_index is not None:
                    kv_index.take_status(msg)
                elif isinstance(msg, KvGone) and kv_index is not None:
                    kv_index.drop()
                elif isinstance(msg, CONTROL_MESSAGES):
                    if flow is not None:
                        flow.receive(msg)
                elif isinstance(msg, Sites) and federation is not None:
                    federation[1].replace_all(msg.sites)
                    federation[1].synced = msg.synced
                elif isinstance(msg, Render):
                    with contextlib.suppress(OSError):
                        send_metrics(render=True)
                elif isinstance(msg, Stop):
                    halt()
        except (EOFError, OSError):
            if flow is not None:
                flow.close()  # its queued requests are answered 503 shutting down
            halt()  # the control process is gone: drain and exit

    watch_pipe(loop, conn, on_message)
    end.on_parent_gone(halt, loop)  # the group's SIGTERM is the control process's; its death is ours
    # Nothing is served before the control process's view is ours: its membership (sent right after "init") and
    # the rows scraped so far. A stream taken earlier would see the endpoints without their data (all unusable:
    # e.g. no prefill stage, or a saturated pool).
    if conn.poll(10.0):
        on_message()
    table.refresh()
    settle_garbage_collector()
    await server.start()
    # The metrics first: from the moment a worker counts as serving, /metrics shows every family it exports.
    send_metrics(render=True)
    end.ready()
    beating = asyncio.ensure_future(end.keep_alive())
    next_metrics = 0.0
    wait, heads, heads_at = IDLE_S, pick_log.heads(), loop.time()
    try:
        while not stop.is_set():
            # Decisions refresh the table as they read it (`on_read`); with none, the others' picks are learned
            # here, every IDLE_S or sooner when the others append fast (`idle_wait`), before their rings lap ours.
            await wait_set(wake, wait)
            wake.clear()
            if loop.time() - refreshed_at[0] >= wait / 2:
                refresh()
            now, latest = loop.time(), pick_log.heads()
            appended = max((b - a for w, (a, b) in enumerate(zip(heads, latest, strict=True)) if w != index), default=0)
            wait, heads, heads_at = idle_wait(appended, now - heads_at), latest, now
            if models and loop.time() >= next_metrics:  # what flow control's latency admitter reads, there
                next_metrics = loop.time() + METRICS_S
                with contextlib.suppress(OSError):
                    send_metrics()
    finally:
        beating.cancel()
        loop.remove_reader(conn.fileno())
        await server.stop(settings.grace_period_s)
        matrix[index] = 0  # nothing of ours is in flight any more
        if tracer_provider is not None:  # the spans still batched
            await loop.run_in_executor(None, tracer_provider.shutdown)
    return 0


def idle_wait(appended: int, elapsed: float) -> float:
    """How long a worker with no decision waits before it reads the pick log again: `IDLE_S`, or less when another
    worker's ring took `appended` records in the last `elapsed` seconds, so that at that rate a quarter of a ring
    (`CAPACITY` / 4) is written meanwhile, not the whole ring: above ~2,000 picks a second the others' rings would
    lap ours in `IDLE_S` (`picks_lost`). An idle pool waits `IDLE_S`; at most one read per 256 of the others' picks."""
    if appended <= 0 or elapsed <= 0:
        return IDLE_S
    return max(REFRESH_S, min(IDLE_S, CAPACITY / 4 * elapsed / appended))


class Learner(Protocol):
    """What learns another worker's pick from the shared log (a prefix scorer, an approximate producer)."""

    def learning(self, snapshot: Snapshot) -> Callable[[int, list[int]], bool]:
        """What learns one refresh's picks over `snapshot`, a call of (slot, hashes) each: False only when its state
        is left exactly as it was, and learning the same pick again over the same snapshot would leave it so too
        until a pick of the same slot changes it (`_learn` skips it)."""
        ...


class OwedStores:
    """The precise producer's picks that owe an endpoint's KV events, learned from the other workers' records: the
    endpoint turns stale in this process too, as soon as in the worker that sent the request, if its events do not
    come. A record's one value is the pick's time (`owed_record`)."""

    def __init__(self, producer: PrecisePrefixCacheProducer) -> None:
        self._producer = producer

    def learn(self, snapshot: Snapshot, slot: int, hashes: list[int]) -> bool:
        if hashes and slot < snapshot.present.size and snapshot.present[slot]:
            self._producer.expect_stores(snapshot.addresses[slot], owed_since(hashes))
        return True

    def learning(self, snapshot: Snapshot) -> Callable[[int, list[int]], bool]:
        return functools.partial(self.learn, snapshot)


def owed_record(now: float) -> list[int]:
    """An owed-stores record's values: the pick's time (CLOCK_MONOTONIC, which every process of the host shares)
    in microseconds."""
    return [round(now * 1e6)]


def owed_since(values: list[int]) -> float:
    return values[0] / 1e6


def _share_precise(
    producer: PrecisePrefixCacheProducer | None, pick_log: PickLog, table: MirrorTable, learners: list[Learner]
) -> SharedKvIndex | None:
    """The precise producer in a worker: it reads the feeder's shared table (the control process passes the
    descriptors on), and its picks join the pick log after the prefix scorers' positions (`precise_positions`):
    its approximate fallback's blocks, then the picks that owe stores."""
    if producer is None:
        return None
    index = SharedKvIndex()
    producer.attach(index)
    approx, owed = precise_positions(len(learners))
    producer.approx.on_pick = _sharing(pick_log, table, approx)
    share_owed = _sharing(pick_log, table, owed)
    producer.on_owed = lambda slot, now: share_owed(slot, owed_record(now))
    learners.extend((producer.approx, OwedStores(producer)))
    return index


def precise_positions(prefix_scorers: int) -> tuple[int, int]:
    """The pick log's positions of the precise producer's records: its approximate fallback's, its owed stores'."""
    return prefix_scorers, prefix_scorers + 1


def _sharing(pick_log: PickLog, table: MirrorTable, position: int) -> Callable[[int, list[int]], None]:
    """The prefix scorer's `on_pick`: our pick, as a record in our ring of the shared log."""

    def share(slot: int, hashes: list[int]) -> None:
        names = table.names  # (control slot, token) by our slot, remade with each membership
        named = names[slot] if 0 <= slot < len(names) else None
        if named is not None:
            pick_log.append(position, named[0], named[1], hashes)

    return share


def _learn(
    pick_log: PickLog,
    table: MirrorTable,
    scorers: Sequence[Learner],
    stats: np.ndarray,
) -> None:
    """The other workers' picks since the last call, into our prefix scorers (their counts into our stats row)."""
    if not scorers:
        return
    lost = pick_log.lost
    records = pick_log.read()  # the only step that counts records lost
    if pick_log.lost != lost:
        stats[3] += pick_log.lost - lost
    if not records:
        return
    snapshot = table.view()
    learns = [scorer.learning(snapshot) for scorer in scorers]  # each slot's address and capacity once, not per pick
    kinds, named = len(learns), table.by_name  # `table.local_of`, looked up here without its call
    learned = 0
    # By (scorer, slot): the picks learned since that slot's index last changed, each of which changed nothing.
    # Only a learn on the same slot changes what `learn` reads for it (the snapshot is the same throughout), so the
    # same pick again changes nothing either: a repeated prompt costs a list compare (equal hashes in a row: the
    # same list, `PickLog.read`), not a learn.
    quiet: dict[tuple[int, int], list[list[int]]] = {}
    for position, control, token, hashes in records:
        local = named.get((control, token))
        if local is None or position >= kinds:
            continue
        learned += 1
        seen = quiet.get((position, local)) if quiet else None  # distinct prompts: no lookup at all
        if seen is not None and hashes in seen:
            continue
        if learns[position](local, hashes):
            if seen is not None:
                del quiet[position, local]
        elif seen is None:
            quiet[position, local] = [hashes]
        elif len(seen) < QUIET_KEPT:
            seen.append(hashes)
    if learned:
        stats[2] = stats.item(2) + learned  # Python ints: no numpy scalar made and added


def child_main(end: ChildEnd) -> int:
    """The kit's entry (epp.supervision.launch): map the shared blocks, serve until told to stop."""
    start: WorkerStart = end.payload
    rows_fd, matrix_fd, stats_fd, picks_fd, *stamps_fd = end.fds
    index, rows, workers = start.index, start.rows, start.workers
    arrays = (
        map_array(rows_fd, (rows, NCOL), np.float64),
        map_array(matrix_fd, (workers, rows, MATRIX_COLUMNS), np.int64),
        map_array(stats_fd, (workers, STATS_COLUMNS), np.int64),
        map_array(picks_fd, (ring_words(workers),), np.int64),
    )
    stamps = map_array(stamps_fd[0], (start.stamps,), np.float64) if stamps_fd else None
    for fd in end.fds:  # the mappings stay
        os.close(fd)
    settings: ServeSettings = start.settings
    if settings.tls.enabled:  # before gRPC's first import, as `epp serve` does: it reads its cipher list then
        tls_policy(settings.tls, native=settings.listen.transport == "native" and native_front_built())
    with contextlib.suppress(KeyboardInterrupt):
        return run_loop(_worker(end, settings, index, arrays, stamps))
    return 0

"""Routing policies side by side in the quality benchmark.

`epp` (and any `--config` profile, and `upstream`: upstream's default profile run by our code) is the picker's own
code: the real `epp.director.Director` over a real `EndpointTable` fed by simulated scrapes, with the scheduler
`epp serve` builds (epp.scheduling.build_scheduler), booking and releasing in-flight picks as the director does.
The others are what users run instead (round-robin, random, least-queue) and an oracle that sees every server's
true queue and cache contents and picks the lowest predicted TTFT. They live here, not in epp/scheduling: they
are yardsticks, not features.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from benchmarks.workloads import UNIT_TOKENS, Item, prompt_text
from epp.app.config_file import load_config
from epp.config.decode import parse_config
from epp.config.model import EndpointPickerConfig
from epp.datastore import EndpointInfo, EndpointTable, MetricsSample
from epp.director import Director
from epp.director.decision import Timing
from epp.kvevents.decode import Event
from epp.kvevents.index import KvBlockIndex
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import Scheduler, build_scheduler, upstream_default_config
from epp.scheduling.precise import LocalIndexView
from epp.sim.engine import Engine, Finished, KvRecord, SimRequest
from epp.sim.kvevents import records_to_events

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def picker_scheduler(config: Path | None, seed: int, upstream: bool = False) -> Scheduler:
    """The scheduler `epp serve` builds: from a config file, else the built-in profile (or upstream's, to compare)."""
    if config is not None:
        return build_scheduler(load_config(config), seed=seed)
    return build_scheduler(upstream_default_config() if upstream else None, seed=seed)


def timing_of(fin: Finished | None) -> Timing | None:
    """The engine's measurement of a finished request as the stream would time it (streaming, no queue before the
    pick): the observation feed's input in virtual time."""
    if fin is None:
        return None
    tpot = (fin.finished_at - fin.first_token_at) / (fin.output_tokens - 1) if fin.output_tokens > 1 else math.nan
    return Timing(fin.first_token_at - fin.arrived, tpot, fin.output_tokens, True, 0.0)


def first_byte_timing(ttft_s: float) -> Timing:
    """The first response byte as the stream times it (its TTFT; TPOT and usage not known yet): what the stream
    hands `Director.first_byte`, so the learners see each TTFT when it happens, as on the serving path."""
    return Timing(ttft_s, math.nan, -1, True, 0.0)


class Policy:
    """One routing policy. `pick` returns a server index; `done` is called when a request finishes there."""

    name = "policy"
    reads_scrapes = False

    def pick(self, index: int, item: Item, req: SimRequest, now: float) -> int:
        raise NotImplementedError

    def done(self, server: int, index: int, fin: Finished | None = None) -> None:
        """`fin`: what the engine measured (the observation feed's timing)."""

    def first_token(self, server: int, index: int, ttft_s: float) -> None:
        """Request `index`'s first token came out on `server` (the stream's first response byte), `ttft_s` after
        its pick."""

    def scrape(self, engines: Sequence[Engine], now: float) -> None:
        pass

    wants_kv_events = False

    def kv_records(self, server: int, records: list[KvRecord], now: float) -> None:
        """The engine's cache records of one step (only when `wants_kv_events`)."""


class RoundRobin(Policy):
    name = "rr"

    def __init__(self, n: int, seed: int) -> None:
        self._next = itertools.cycle(range(n))

    def pick(self, index: int, item: Item, req: SimRequest, now: float) -> int:
        return next(self._next)


class Random(Policy):
    name = "random"

    def __init__(self, n: int, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self._n = n

    def pick(self, index: int, item: Item, req: SimRequest, now: float) -> int:
        return int(self._rng.integers(self._n))


class LeastQueue(Policy):
    """Fewest requests in flight as the router itself counts them (Envoy LEAST_REQUEST with a full scan): exact
    and instant, so it is the strongest load-only baseline, with no staleness to hide behind."""

    name = "least-queue"

    def __init__(self, n: int, seed: int) -> None:
        self._inflight = np.zeros(n, dtype=np.int64)
        self._rng = np.random.default_rng(seed)

    def pick(self, index: int, item: Item, req: SimRequest, now: float) -> int:
        least = np.flatnonzero(self._inflight == self._inflight.min())
        server = int(least[self._rng.integers(least.size)])
        self._inflight[server] += 1
        return server

    def done(self, server: int, index: int, fin: Finished | None = None) -> None:
        self._inflight[server] -= 1


class Oracle(Policy):
    """Perfect, instant knowledge of every queue and cache; picks the lowest predicted TTFT (greedy, myopic)."""

    name = "oracle"

    def __init__(self, engines: Sequence[Engine], seed: int) -> None:
        self._engines = engines
        self._rng = np.random.default_rng(seed)

    def predicted_ttft(self, engine: Engine, req: SimRequest) -> float:
        p = engine.profile
        own = max(1, req.prompt_tokens - engine.cached_units(req) * req.unit_tokens)
        tokens = engine.queued_prefill_tokens() + own
        per_step = max(1, p.max_batched_tokens - engine.num_running)
        steps = -(-tokens // per_step)
        return steps * engine.step_estimate(min(tokens, per_step))

    def pick(self, index: int, item: Item, req: SimRequest, now: float) -> int:
        ttft = np.array([self.predicted_ttft(e, req) for e in self._engines])
        best = np.flatnonzero(ttft <= ttft.min() * (1 + 1e-9))
        return int(best[self._rng.integers(best.size)])


class Picker(Policy):
    """The picker's director and scheduler, reading only scraped metrics and its own in-flight bookkeeping."""

    reads_scrapes = True

    def __init__(self, name: str, n: int, scheduler: Scheduler, clock: Callable[[], float]) -> None:
        self.name = name
        self.table = EndpointTable()
        self.slots = [
            self.table.upsert(EndpointInfo(address=f"127.10.0.{i + 1}:8000", pod_name=f"sim-{i}")) for i in range(n)
        ]
        self.table.synced = True
        self._server_of = {slot: i for i, slot in enumerate(self.slots)}
        self.scheduler = scheduler
        self.director = Director(self.table, scheduler, clock, saturation=scheduler.saturation)  # as epp serve
        self._decisions: dict[int, object] = {}

    def pick(self, index: int, item: Item, req: SimRequest, now: float) -> int:
        request = InferenceRequest(
            request_id=str(index), api=ApiKind.COMPLETIONS, model=MODEL, prompt=prompt_text(index, item)
        )
        decision = self.director.decide(request)
        self._decisions[index] = decision
        return self._server_of[decision.slot]

    def first_token(self, server: int, index: int, ttft_s: float) -> None:
        self.director.first_byte(self._decisions[index], first_byte_timing(ttft_s))  # type: ignore[arg-type]

    def done(self, server: int, index: int, fin: Finished | None = None) -> None:
        self.director.complete(self._decisions.pop(index), timing_of(fin))  # type: ignore[arg-type]

    def server_of(self, slot: int) -> int:
        return self._server_of[slot]

    def scrape(self, engines: Sequence[Engine], now: float, skip: frozenset[int] = frozenset()) -> None:
        """Every server's metrics into the table, but those in `skip` (their data ages: a scrape outage)."""
        for k, (slot, e) in enumerate(zip(self.slots, engines, strict=True)):
            if k in skip:
                continue
            p = e.profile
            sample = MetricsSample(
                waiting=float(e.num_waiting),
                running=float(e.num_running),
                kv_usage=e.kv_usage,
                max_lora=float(p.max_loras),
                block_size=float(p.block_size),
                num_blocks=float(p.num_blocks),
                running_adapters=(),
                waiting_adapters=(),
            )
            self.table.record_scrape(slot, sample, now)


class Split(Policy):
    """The decision split over `replicas` pickers × `workers` serving workers each, as `epp serve --workers W` run
    R times behind one gateway: a replica has its own table (its own in-flight view and scrapes, the replicas'
    scrapes spread evenly over the interval: each one's phase is offset), a worker of a replica has its own
    scheduler (its own prefix index) over the replica's shared table (the in-flight matrix summed). Arrivals go
    round-robin over replicas, then over a replica's workers, as a gateway balancing streams would.

    `log_delay` (seconds; None: off) feeds each worker's prefix index with every other worker's picks of the same
    replica as well, each applied `log_delay` after it was made: a shared log of picks (records of block hashes and
    endpoint slot), to measure against indexes that learn only their own picks."""

    reads_scrapes = True

    def __init__(
        self,
        name: str,
        n: int,
        scheduler: Callable[[int], Scheduler],
        replicas: int,
        workers: int,
        clock: Callable[[], float],
        log_delay: float | None = None,
    ) -> None:
        self.name = name
        self.replicas = [Picker(name, n, scheduler(r * workers), clock) for r in range(replicas)]
        self.workers = workers
        self.directors: list[list[Director]] = []
        self._logs: list[PickLog] = []
        for r, replica in enumerate(self.replicas):
            schedulers = [replica.scheduler] + [scheduler(r * workers + w) for w in range(1, workers)]
            extra = [Director(replica.table, s, clock, saturation=s.saturation) for s in schedulers[1:]]
            self.directors.append([replica.director, *extra])
            if log_delay is not None and workers > 1:
                self._logs.append(PickLog(replica.table, schedulers, log_delay, clock))
        self._owner: dict[int, tuple[Director, object]] = {}
        self._tick = 0

    def pick(self, index: int, item: Item, req: SimRequest, now: float) -> int:
        r = index % len(self.replicas)
        if self._logs:
            self._logs[r].deliver(now)
        director = self.directors[r][(index // len(self.replicas)) % self.workers]
        request = InferenceRequest(
            request_id=str(index), api=ApiKind.COMPLETIONS, model=MODEL, prompt=prompt_text(index, item)
        )
        decision = director.decide(request)
        self._owner[index] = (director, decision)
        return self.replicas[r].server_of(decision.slot)

    def first_token(self, server: int, index: int, ttft_s: float) -> None:
        director, decision = self._owner[index]
        director.first_byte(decision, first_byte_timing(ttft_s))  # type: ignore[arg-type]

    def done(self, server: int, index: int, fin: Finished | None = None) -> None:
        director, decision = self._owner.pop(index)
        director.complete(decision, timing_of(fin))  # type: ignore[arg-type]

    def scrape(self, engines: Sequence[Engine], now: float) -> None:
        """Called R times per scrape interval: one replica's scrape each time, in turn (the phase offset)."""
        self.replicas[self._tick % len(self.replicas)].scrape(engines, now)
        self._tick += 1


class PickLog:
    """A shared log of one replica's picks: every worker's prefix scorer also learns each pick of every other worker
    (`PrefixCacheScorer.learn`, as the serving workers' pick rings feed it), `delay` seconds after it was made."""

    def __init__(
        self,
        table: EndpointTable,
        schedulers: Sequence[Scheduler],
        delay: float,
        clock: Callable[[], float],
    ) -> None:
        self.table = table
        self.delay = delay
        self._clock = clock
        self._scorers = [list(sched.prefix_scorers) for sched in schedulers]
        self._pending: deque[tuple[float, int, int, int, list[int]]] = deque()
        for worker, scorers in enumerate(self._scorers):
            for position, scorer in enumerate(scorers):
                scorer.on_pick = self._recorder(worker, position)

    def _recorder(self, worker: int, position: int) -> Callable[[int, list[int]], None]:
        def record(slot: int, hashes: list[int]) -> None:
            self._pending.append((self._clock() + self.delay, worker, position, slot, hashes))

        return record

    def deliver(self, now: float) -> None:
        """Every record due by `now`, to the other workers' scorers."""
        pending = self._pending
        snapshot = self.table.view()
        while pending and pending[0][0] <= now:
            _, origin, position, slot, hashes = pending.popleft()
            for worker, scorers in enumerate(self._scorers):
                if worker != origin:
                    scorers[position].learn(snapshot, slot, hashes)


def precise_config() -> EndpointPickerConfig:
    """Our built-in profile with the prefix-cache scorer fed by precise-prefix-cache-producer (engine token ids
    from a vllm token-producer), weighted 5 instead of 3, and upstream's `token-load-scorer` (weight 4) over the
    in-flight producer: prompt tokens this picker has in flight on the endpoint plus this request's tokens the
    precise match does not find there, i.e. the prefill work a pick adds. With the index's match exact, affinity
    pays more often than the approximate producer's guess (weight 5); the token load ranks endpoints whose load
    scores tie by the prefill they hold. And our `prefill-queue-scorer` (weight 4): the prefill still queued there
    (this picker's uncached tokens booked at each pick, released at its first token) plus this request's own
    uncached tokens, in one unit, as the oracle predicts TTFT. One profile for every workload (issue 27;
    benchmarks/RESULTS.md)."""
    doc = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "token-producer", "parameters": {"modelName": MODEL, "vllm": {"url": "http://127.0.0.1:8000"}}},
            {"type": "precise-prefix-cache-producer"},
            {
                "type": "prefix-cache-scorer",
                "parameters": {"prefixMatchInfoProducerName": "precise-prefix-cache-producer"},
            },
            {"type": "utilization-detector"},
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "inflight-load-scorer"},
            {"type": "inflight-load-producer"},
            {
                "type": "token-load-scorer",
                "parameters": {"prefixMatchInfoProducerName": "precise-prefix-cache-producer"},
            },
            {
                "type": "prefill-queue-scorer",
                "parameters": {"prefixMatchInfoProducerName": "precise-prefix-cache-producer"},
            },
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "utilization-detector"},
                    {"pluginRef": "queue-scorer", "weight": 2},
                    {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
                    {"pluginRef": "prefix-cache-scorer", "weight": 5},
                    {"pluginRef": "inflight-load-scorer", "weight": 2},
                    {"pluginRef": "token-load-scorer", "weight": 4},
                    {"pluginRef": "prefill-queue-scorer", "weight": 4},
                    {"pluginRef": "max-score-picker"},
                ],
            }
        ],
    }
    return parse_config(doc, "<precise>")


class PrecisePicker(Picker):
    """`precise`: the picker whose prefix signal is the engines' own KV events, converted to vLLM events
    (`epp.sim.kvevents.records_to_events`) and applied to a `KvBlockIndex` `delay_s` after the step that made them,
    as the feeder would receive them; requests carry the engine's token ids (the render call's answer)."""

    wants_kv_events = True

    def __init__(self, n: int, seed: int, clock: Callable[[], float], delay_s: float) -> None:
        scheduler = build_scheduler(precise_config(), seed=seed)
        super().__init__("precise", n, scheduler, clock)
        self.delay_s = delay_s
        self.index = KvBlockIndex()
        self.addresses = self.table.addresses()
        for address in self.addresses:
            self.index.add_endpoint(address)
        producer = scheduler.kv_events
        assert producer is not None
        producer.attach(LocalIndexView(self.index))
        self.producer = producer
        self._pending: deque[tuple[float, str, list[Event]]] = deque()

    def kv_records(self, server: int, records: list[KvRecord], now: float) -> None:
        events = records_to_events(records, UNIT_TOKENS)
        if events:
            self._pending.append((now + self.delay_s, self.table.addresses()[self.slots[server]], events))

    def _deliver(self, now: float) -> None:
        pending = self._pending
        while pending and pending[0][0] <= now:
            at, address, events = pending.popleft()
            self.index.apply(address, events, at)

    def pick(self, index: int, item: Item, req: SimRequest, now: float) -> int:
        self._deliver(now)
        request = InferenceRequest(
            request_id=str(index),
            api=ApiKind.COMPLETIONS,
            model=MODEL,
            prompt=prompt_text(index, item),
            token_ids=req.token_ids or None,
        )
        decision = self.director.decide(request)
        self._decisions[index] = decision
        return self._server_of[decision.slot]


BASELINES = {"rr": RoundRobin, "random": Random, "least-queue": LeastQueue}

"""Flow-control metrics, upstream's names and labels (llm-d-router `pkg/epp/metrics`): `llm_d_epp_flow_control_*`
and, for the first six, the deprecated `inference_extension_flow_control_*` spelling from the same numbers.

Outcomes and durations are counted as they happen (`flow_outcome`, `flow_cycle`, called by the dispatch task on
the serving loop); queue sizes, bytes and saturation are read from the queues when `/metrics` is scraped. The
`model_name` / `target_model_name` labels of the queue series are empty: a request waits before its body is
parsed. Fairness ids come from clients and pass through the same bound as the request metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from epp.observability.collector import FreezableCollector
from epp.observability.families import counter_family, gauge_family, histogram_family
from epp.observability.labels import FAIRNESS_LIMIT, BoundedLabel
from epp.observability.plain import PlainHistogram

QUEUE_DURATION = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CYCLE_DURATION = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
CONFIRMATION_DURATION = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # upstream's buckets
_PREFIXES = ("llm_d_epp_", "inference_extension_")


@dataclass(frozen=True, slots=True)
class EvictionState:
    """In-flight eviction's counters (from `epp.flowcontrol.eviction.Reclaimer`); present only with it on."""

    issued: dict[int, int]  # demand band's priority → revocations issued
    confirmed: int
    timed_out: int
    reclaim_target: float
    pending_reclaim: float


@dataclass(frozen=True, slots=True)
class QueueState:
    """What the queues hold now (from `epp.director.flow.FlowGate.queue_state`)."""

    flows: list[tuple[str, int, int, int]] = field(default_factory=list)  # (fairness id, priority, requests, bytes)
    saturation: float = 0.0
    stale_endpoints: int = 0
    band_utilization: list[tuple[int, float, float]] = field(default_factory=list)  # (priority, requests, bytes)
    global_utilization: tuple[float, float] | None = None  # (requests, bytes) when global caps are set
    eviction: EvictionState | None = None  # None: enableEviction off, and its series are not exported


@dataclass(slots=True)
class _Numbers:
    queue: dict[tuple[str, str, str], PlainHistogram] = field(default_factory=dict)  # (fairness, priority, outcome)
    totals: dict[tuple[str, str], int] = field(default_factory=dict)  # (outcome, priority)
    cycle: PlainHistogram = field(default_factory=lambda: PlainHistogram(CYCLE_DURATION))
    confirmation: PlainHistogram = field(default_factory=lambda: PlainHistogram(CONFIRMATION_DURATION))


class FlowControlMetrics(FreezableCollector):
    def __init__(self, registry: CollectorRegistry, pool: Callable[[], str], state: Callable[[], QueueState]):
        self._pool = pool
        self._state = state
        self._n = _Numbers()
        self.fairness_label = BoundedLabel(FAIRNESS_LIMIT)
        registry.register(self)

    # -- FlowObserver ---------------------------------------------------------------------------------------
    def flow_outcome(self, outcome: Any, fairness_id: str, priority: int, waited_s: float) -> None:
        label = outcome.value
        key = (self.fairness_label(fairness_id), str(priority), label)
        hist = self._n.queue.get(key)
        if hist is None:
            hist = self._n.queue[key] = PlainHistogram(QUEUE_DURATION)
        hist.observe(waited_s)
        total = (label, str(priority))
        self._n.totals[total] = self._n.totals.get(total, 0) + 1

    def flow_cycle(self, seconds: float, saturation: float) -> None:
        self._n.cycle.observe(seconds)

    def flow_revocation_confirmed(self, seconds: float) -> None:
        self._n.confirmation.observe(seconds)

    # -- collection -----------------------------------------------------------------------------------------
    def snapshot(self) -> Any:
        n = self._n
        queue = {k: _copy(h) for k, h in n.queue.items()}
        return queue, dict(n.totals), _copy(n.cycle), self._state(), self._pool(), _copy(n.confirmation)

    def families(self, data: Any) -> Iterator[Metric]:
        queue, totals, cycle, state, pool, confirmation = data
        for prefix in _PREFIXES:
            p = prefix + "flow_control_"
            yield histogram_family(
                p + "request_queue_duration_seconds",
                "Distribution of total time requests spend in the Flow Control layer (from enqueue to final outcome).",
                ("fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name"),
                (((f, pr, o, pool, "", ""), h) for (f, pr, o), h in sorted(queue.items())),
            )
            yield histogram_family(
                p + "dispatch_cycle_duration_seconds",
                "Distribution of time taken for each internal dispatch cycle in the Flow Control layer.",
                (),
                [((), cycle)],
            )
            yield histogram_family(
                p + "request_enqueue_duration_seconds",
                "Distribution of time taken to enqueue requests into the Flow Control layer.",
                ("fairness_id", "priority", "outcome"),
                [],  # enqueueing is synchronous here: no separate enqueue stage to time
            )
            yield gauge_family(
                p + "queue_size",
                "Current number of requests being actively managed by the Flow Control layer.",
                ("fairness_id", "priority", "inference_pool", "model_name", "target_model_name"),
                (((self.fairness_label(f), str(pr), pool, "", ""), float(r)) for f, pr, r, _ in state.flows),
            )
            yield gauge_family(
                p + "queue_bytes",
                "Current total size in bytes of requests being actively managed by the Flow Control layer.",
                ("fairness_id", "priority", "inference_pool", "model_name", "target_model_name"),
                (((self.fairness_label(f), str(pr), pool, "", ""), float(b)) for f, pr, _, b in state.flows),
            )
            yield gauge_family(
                p + "pool_saturation",
                "Current saturation of the pool as the flow-control dispatch reads it (effective: the maximum).",
                ("inference_pool", "stage"),
                [((pool, "effective"), state.saturation), ((pool, "decode"), state.saturation)],
            )
        p = "llm_d_epp_flow_control_"
        yield gauge_family(
            p + "stale_endpoints",
            "Endpoints whose metrics are not usable for the dispatch saturation.",
            ("detector",),
            [(("pool",), float(state.stale_endpoints))],
        )
        yield gauge_family(
            p + "capacity_utilization_requests",
            "Queued requests over the band's request capacity.",
            ("priority", "inference_pool"),
            (((str(pr), pool), r) for pr, r, _ in state.band_utilization),
        )
        yield gauge_family(
            p + "capacity_utilization_bytes",
            "Queued bytes over the band's byte capacity.",
            ("priority", "inference_pool"),
            (((str(pr), pool), b) for pr, _, b in state.band_utilization),
        )
        glob = state.global_utilization
        yield gauge_family(
            p + "global_capacity_utilization_requests",
            "Queued requests over the global request capacity (when one is configured).",
            ("inference_pool",),
            [((pool,), glob[0])] if glob is not None else [],
        )
        yield gauge_family(
            p + "global_capacity_utilization_bytes",
            "Queued bytes over the global byte capacity (when one is configured).",
            ("inference_pool",),
            [((pool,), glob[1])] if glob is not None else [],
        )
        yield counter_family(
            p + "requests",
            "Requests that left the Flow Control layer, by outcome.",
            ("outcome", "priority", "inference_pool"),
            (((o, pr, pool), float(v)) for (o, pr), v in sorted(totals.items())),
        )
        if state.eviction is not None:
            yield from _eviction_families(p, state.eviction, confirmation, pool)


def _eviction_families(p: str, ev: EvictionState, confirmation: PlainHistogram, pool: str) -> Iterator[Metric]:
    """Upstream's reclamation series, exported only with `enableEviction` on (as upstream's exist only then)."""
    yield counter_family(
        p + "revocations_issued",
        "Total number of in-flight eviction revocations issued, labeled by the demand band's priority.",
        ("priority", "inference_pool"),
        (((str(pr), pool), float(n)) for pr, n in sorted(ev.issued.items())),
    )
    yield counter_family(
        p + "revocations",
        "Total number of in-flight eviction revocations by terminal outcome (confirmed, timed_out).",
        ("outcome", "inference_pool"),
        [(("confirmed", pool), float(ev.confirmed)), (("timed_out", pool), float(ev.timed_out))],
    )
    yield gauge_family(
        p + "reclaim_target",
        "Last computed reclamation deficit, in saturation-gauge units.",
        ("inference_pool",),
        [((pool,), ev.reclaim_target)],
    )
    yield gauge_family(
        p + "pending_reclaim",
        "Sum of outstanding and cooling pending-reclaim debits, in saturation-gauge units.",
        ("inference_pool",),
        [((pool,), ev.pending_reclaim)],
    )
    yield histogram_family(
        p + "revocation_confirmation_seconds",
        "Time from revocation issue to confirmed stream termination.",
        ("inference_pool",),
        [((pool,), confirmation)],
    )


def _copy(hist: PlainHistogram) -> PlainHistogram:
    out = PlainHistogram(hist.bounds)
    out.add(hist)
    return out

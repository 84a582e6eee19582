"""Per-pool request counts for a picker that serves several InferencePools.

The request series of `PickerMetrics` stay the picker's (with one pool, the exposition is upstream's, byte for
byte); with several pools each stream reports through its pool's `PoolObserver`, which forwards every call to the
picker's metrics and counts the request's outcome under its pool: `llm_d_epp_pool_requests_total{pool, code}`
(`code` is `OK` for a routed request, else the refusal's code) and `llm_d_epp_pool_decisions_total{pool}`. The
`pool` label is bounded: pools are named by the picker's own configuration (its `--pool-name`s, or what its pool
selector matches), at most `MAX_POOLS`; more share one `other` series.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import Metric

from epp.errors import ErrorCode
from epp.observability.collector import FreezableCollector
from epp.observability.families import counter_family
from epp.observability.labels import OVERFLOW

MAX_POOLS = 256


class PoolObserver:
    """A stream's observer for one pool: the picker's metrics, plus the pool's own counts."""

    __slots__ = ("_counts", "_inner", "decisions", "pool")

    def __init__(self, inner: Any, pool: str) -> None:
        self._inner = inner
        self.pool = pool
        self._counts: Counter[str] = Counter()
        self.decisions = 0

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def request_started(self, now: float) -> Any:
        return self._inner.request_started(now)

    def decided(
        self,
        record: Any,
        started: float,
        now: float,
        model: str,
        target: str,
        fairness_id: str | None,
        objective: str | None,
        address: str,
    ) -> None:
        self.decisions += 1
        self._inner.decided(record, started, now, model, target, fairness_id, objective, address)

    def request_done(
        self,
        code: ErrorCode | None,
        model: str,
        target_model: str,
        record: Any = None,
        now: float = 0.0,
        fairness_id: str | None = None,
        objective: str | None = None,
    ) -> None:
        self._counts["OK" if code is None else code.label] += 1
        self._inner.request_done(code, model, target_model, record, now, fairness_id, objective)

    def response_chunk(self, record: Any, now: float, size: int) -> None:
        self._inner.response_chunk(record, now, size)

    def usage(
        self, model: str, prompt_tokens: int, completion_tokens: int, record: Any = None, cached_tokens: int = -1
    ) -> None:
        self._inner.usage(model, prompt_tokens, completion_tokens, record, cached_tokens)

    def usage_invalid(self) -> None:
        self._inner.usage_invalid()

    def served_mismatch(self) -> None:
        self._inner.served_mismatch()

    def stream_refused(self, reason: str) -> None:
        self._inner.stream_refused(reason)

    # The server-level calls go to the picker's metrics too (the adapter makes them on its own observer).
    def stream_started(self) -> None:
        self._inner.stream_started()

    def stream_finished(self, code: str, seconds: float) -> None:
        self._inner.stream_finished(code, seconds)


class PoolRequestCollector(FreezableCollector):
    """The per-pool families over every pool's observer (one observer per pool key, made on first use)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._observers: dict[str, PoolObserver] = {}

    def observer(self, pool: str) -> PoolObserver:
        observer = self._observers.get(pool)
        if observer is None:
            label = pool if len(self._observers) < MAX_POOLS else OVERFLOW
            observer = self._observers.get(label) or PoolObserver(self._inner, label)
            self._observers[pool] = observer
        return observer

    def snapshot(self) -> list[tuple[str, dict[str, int], int]]:
        seen: set[int] = set()
        rows = []
        for observer in self._observers.values():
            if id(observer) in seen:
                continue
            seen.add(id(observer))
            rows.append((observer.pool, observer.counts(), observer.decisions))
        return sorted(rows, key=lambda row: row[0])

    def families(self, data: Any) -> Iterator[Metric]:
        yield counter_family(
            "llm_d_epp_pool_requests",
            "Requests by the InferencePool the gateway named and their outcome (OK, or the refusal's code).",
            ("pool", "code"),
            [((pool, code), float(n)) for pool, counts, _ in data for code, n in sorted(counts.items())],
        )
        yield counter_family(
            "llm_d_epp_pool_decisions",
            "Requests given an endpoint, by InferencePool.",
            ("pool",),
            [((pool,), float(decisions)) for pool, _, decisions in data],
        )

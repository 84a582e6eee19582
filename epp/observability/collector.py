"""Collectors whose numbers live on the serving loop, readable from a `/metrics` thread without a lock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector


class FreezableCollector(Collector):
    """A collector whose numbers live on the serving loop: `freeze()` (on the loop) copies them, and a `collect()`
    from any other thread reads that copy, so `/metrics` can render in a worker thread without a lock."""

    _frozen: Any = None
    _owner: int | None = None

    def freeze(self) -> None:
        self._frozen = self.snapshot()
        self._owner = threading.get_ident()

    def snapshot(self) -> Any:
        raise NotImplementedError

    def families(self, data: Any) -> Iterator[Metric]:
        raise NotImplementedError

    def collect(self) -> Iterator[Metric]:
        frozen = self._frozen
        if frozen is not None and threading.get_ident() != self._owner:
            return self.families(frozen)
        return self.families(self.snapshot())


class LoopCollector(FreezableCollector):
    """Any collector that reads loop-owned state, made freezable: `freeze()` collects its families on the loop."""

    def __init__(self, inner: Collector) -> None:
        self._inner = inner

    def snapshot(self) -> list[Metric]:
        return list(self._inner.collect())

    def families(self, data: Any) -> Iterator[Metric]:
        return iter(data)

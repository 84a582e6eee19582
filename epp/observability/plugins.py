"""Per-plugin durations (upstream's `plugin_duration_seconds`), measured on a sample of picks.

Timing every plugin of every pick would add two clock reads per plugin to the hot path; one pick in `every` (64 by
default) runs through timing wrappers instead, and the histogram counts those sampled calls (docs/observability.md).
The scheduler stays clock-free: it only swaps which tuple of plugins it iterates (`ProfileScheduler.instrument`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import Metric

from epp.observability import buckets as b
from epp.observability.collector import FreezableCollector
from epp.observability.families import counter_family, histogram_family
from epp.observability.plain import PlainHistogram

SAMPLE_EVERY = 64


class PluginTimer(FreezableCollector):
    """Wraps plugins so each call is timed into a histogram keyed by (extension point, type, name)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, every: int = SAMPLE_EVERY) -> None:
        self.every = every
        self._clock = clock
        self._hists: dict[tuple[str, str, str], PlainHistogram] = {}

    def _hist(self, point: str, plugin: Any) -> PlainHistogram:
        key = (point, str(getattr(plugin, "type_name", type(plugin).__name__)), str(getattr(plugin, "name", "")))
        return self._hists.setdefault(key, PlainHistogram(b.SCHEDULER))

    def timed(self, point: str, plugin: Any, method: Callable[..., Any]) -> Callable[..., Any]:
        hist, clock = self._hist(point, plugin), self._clock

        def call(*args: Any) -> Any:
            started = clock()
            try:
                return method(*args)
            finally:
                hist.observe(clock() - started)

        return call

    def snapshot(self) -> list[tuple[tuple[str, str, str], PlainHistogram]]:
        out = []
        for key, hist in sorted(self._hists.items()):
            copy = PlainHistogram(hist.bounds)
            copy.add(hist)
            out.append((key, copy))
        return out

    def families(self, data: Any) -> Iterator[Metric]:
        labels = ("extension_point", "plugin_type", "plugin_name")
        help_text = "Plugin processing latency in seconds per extension point, plugin type and name (sampled picks)."
        yield histogram_family("llm_d_epp_plugin_duration_seconds", help_text, labels, data)
        yield histogram_family(
            "inference_extension_plugin_duration_seconds", "[Deprecated: use llm_d_epp_*] " + help_text, labels, data
        )
        yield _empty_counter()


def _empty_counter() -> Metric:
    return counter_family(
        "llm_d_epp_plugin_data_scope_violations",
        "Endpoint attribute accesses rejected for an undeclared data key. Plugins here read the endpoint table "
        "through typed columns and declare no data keys, so nothing is ever rejected: no series.",
        ("extension_point", "plugin_type", "plugin_name", "access"),
        [],
    )

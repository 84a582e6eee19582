"""Prometheus metric families built from plain numbers (`plain.PlainHistogram`, ints) at scrape time."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from epp.observability.plain import PlainHistogram

LabelValues = tuple[str, ...]


def histogram_family(
    name: str, help_text: str, labels: Sequence[str], series: Iterable[tuple[LabelValues, PlainHistogram]]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, help_text, labels=list(labels))
    for values, hist in series:
        cumulative, buckets = 0, []
        for bound, count in zip((*map(floatToGoString, hist.bounds), "+Inf"), hist.counts, strict=True):
            cumulative += count
            buckets.append((bound, float(cumulative)))
        family.add_metric(list(values), buckets, hist.sum)
    return family


def counter_family(
    name: str, help_text: str, labels: Sequence[str], series: Iterable[tuple[LabelValues, float]]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text, labels=list(labels))
    for values, value in series:
        family.add_metric(list(values), value)
    return family


def gauge_family(
    name: str, help_text: str, labels: Sequence[str], series: Iterable[tuple[LabelValues, float]]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=list(labels))
    for values, value in series:
        family.add_metric(list(values), value)
    return family

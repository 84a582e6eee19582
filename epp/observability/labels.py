"""Bounded label values: a client chooses the `model` field and the fairness header, so neither may become an
unbounded set of Prometheus series.

Names the operator configured (InferenceModelRewrite sources and targets, the objectives the watches report) are
*pinned* and always keep their own label. Any other name gets its own label only while fewer than `limit` such
names have been seen and only if it is at most `MAX_LABEL_BYTES` long; past that it is counted under `other`.
So the label set, and with it `/metrics` and the memory behind it, is bounded by
`pinned + limit` values of at most `MAX_LABEL_BYTES` each, whatever clients send (docs/observability.md).

A request label set (a series) costs `/metrics` about `SERIES_LINES` lines, each carrying its labels: a series
with a client-chosen value gets its own labels only while the client series' estimated share of the page,
`client_series_cost` summed, stays within `CLIENT_SERIES_BYTES`; in a later one each client-chosen value is
`other` (`without_client_values`). So
the page stays under a megabyte whatever names clients send (a few long ones, or more short ones).
"""

from __future__ import annotations

from collections.abc import Iterable

OVERFLOW = "other"
MAX_LABEL_BYTES = 256  # longer names (no real model or objective name is) are never a label of their own
MODEL_LIMIT = 100  # model names neither configured nor pinned that get their own series, first come first served
FAIRNESS_LIMIT = 100  # fairness ids (x-llm-d-inference-fairness-id), likewise
SERIES_LINES = 320  # lines of /metrics one request label set takes (its histograms' buckets, both spellings)
SERIES_LINE_BYTES = 150  # a line's bytes besides the client-chosen label values
CLIENT_SERIES_BYTES = 768 * 1024  # the client-chosen series' share of /metrics, estimated


class BoundedLabel:
    """Maps a client-chosen value to itself or to `other`, with at most `limit` unpinned values ever admitted."""

    __slots__ = ("_admitted", "_limit", "_pinned")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pinned: frozenset[str] = frozenset()
        self._admitted: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._admitted or value in self._pinned or not value:
            return value
        if len(self._admitted) >= self._limit or len(value) > MAX_LABEL_BYTES:
            return OVERFLOW
        self._admitted.add(value)
        return value

    def pin(self, values: Iterable[str]) -> None:
        """Replace the configured set (called when the objectives or rewrites change; cheap, rare)."""
        self._pinned = frozenset(v for v in values if v and len(v) <= MAX_LABEL_BYTES)

    def pinned(self, value: str) -> bool:
        return value in self._pinned

    def __contains__(self, value: object) -> bool:
        """`value` has its own label (pinned or admitted): asking never admits it."""
        return value in self._admitted or value in self._pinned

    def __len__(self) -> int:
        return len(self._admitted)


def client_series_cost(model_label: BoundedLabel, key: tuple[str, str, str, str], default_fairness: str) -> int:
    """The estimated bytes of /metrics a request label set (model, target, fairness id, priority; already bounded)
    takes, if a client chose any of its values; 0 for a set of configured names, `other` and the default flow."""
    model, target, fairness, _ = key
    chosen = 0
    for name in (model, target):
        if _chosen_model(model_label, name):
            chosen += len(name)
    if fairness not in (default_fairness, OVERFLOW):
        chosen += len(fairness)
    return SERIES_LINES * (SERIES_LINE_BYTES + chosen) if chosen else 0


def without_client_values(
    model_label: BoundedLabel, key: tuple[str, str, str, str], default_fairness: str
) -> tuple[str, str, str, str]:
    """The label set with each client-chosen value replaced by `other`: where a set past the client series'
    share of the page is counted (its cost is 0)."""
    model, target, fairness, priority = key
    return (
        OVERFLOW if _chosen_model(model_label, model) else model,
        OVERFLOW if _chosen_model(model_label, target) else target,
        fairness if fairness in (default_fairness, OVERFLOW) else OVERFLOW,
        priority,
    )


def _chosen_model(model_label: BoundedLabel, name: str) -> bool:
    return bool(name) and name != OVERFLOW and not model_label.pinned(name)

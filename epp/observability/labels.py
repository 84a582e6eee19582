"""Bounded label values: a client chooses the `model` field and the fairness header, so neither may become an
unbounded set of Prometheus series.

Names the operator configured (InferenceModelRewrite sources and targets, the objectives the watches report) are
*pinned* and always keep their own label. Any other name gets its own label only while fewer than `limit` such
names have been seen and only if it is at most `MAX_LABEL_BYTES` long; past that it is counted under `other`.
So the label set, and with it `/metrics` and the memory behind it, is bounded by
`pinned + limit` values of at most `MAX_LABEL_BYTES` each, whatever clients send (docs/observability.md).
"""

from __future__ import annotations

from collections.abc import Iterable

OVERFLOW = "other"
MAX_LABEL_BYTES = 256  # longer names (no real model or objective name is) are never a label of their own
MODEL_LIMIT = 100  # model names neither configured nor pinned that get their own series, first come first served
FAIRNESS_LIMIT = 100  # fairness ids (x-llm-d-inference-fairness-id), likewise


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

    def __len__(self) -> int:
        return len(self._admitted)

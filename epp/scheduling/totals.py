"""The profile runner's arithmetic on its candidates: the weighted total of the scorers' terms, and the max-score
picker's tie search; numpy code that defines them, and the compiled kernels that run them when they were built
(with the saturation filter's elementwise pass, `epp.scheduling.saturation.kept_under`, and the prefix index's
match, `epp.scheduling.prefix.PrefixIndex.match`; `epp.scheduling.framework.extremes` loads the small-pool
extremes from the same extension).

A term is one scorer's part of the total: `values × coef`, with NaN → `fill` when the scorer has a fill
(`Linear.part`: coef = weight × scale, fill = weight × (unknown − offset)). The total is the sum of the terms in the
profile's order plus the constant parts, NaN counting as 0 (`weighted_total_numpy`). The pick is the highest total,
ties (within `tie`) drawn uniformly (`max_tie_numpy`).

Why a compiled form earns its place: on a pool of 8 endpoints each numpy call costs ~3–5k instructions of dispatch
for 8 multiplications, and the default profile's total and tie search were about 13 of them per pick (a multiply
and an add per scorer, the offset, `fmax`, the extremes, the comparison, `nonzero`), with the extremes of every
pick's new total filling `framework._RECENT` (the cache of the scrape columns' extremes) with keys never seen again.
The kernels (epp/scheduling/_native.c) do the same steps element by element in one call each; the numpy code stays
the definition, and tests/scheduling/test_totals.py holds the two equal (benchmarks/RESULTS.md, stream_path).
`EPP_NATIVE=0` in the environment, an install without a compiler, or a buffer that is not contiguous float64 runs
the numpy code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import numpy as np

from epp.datastore.table import BoolArray, FloatArray, IntArray
from epp.scheduling.framework import Term, extremes, weighted_term


class Kernels(Protocol):
    """The extension's functions (epp/scheduling/_native.pyi)."""

    ENABLED: int

    def weighted_total(self, out: FloatArray, offset: float, *terms: object) -> object: ...

    def weighted_total_rows(self, out: FloatArray, rows: FloatArray, offset: float, *terms: object) -> object: ...

    def max_tie(self, scores: FloatArray, tie: float, draw: Callable[[], float]) -> object: ...

    def kept_under(
        self,
        candidates: IntArray,
        queue: FloatArray,
        kv: FloatArray,
        fresh: BoolArray | None,
        queue_limit: float,
        kv_limit: float,
        out: IntArray,
    ) -> object: ...

    def prefix_match(self, holders: dict[int, int], hashes: list[int], out: FloatArray) -> object: ...

    def holds_all(self, young: set[int], hashes: list[int]) -> bool: ...

    # epp.scheduling.fused: an int, or NotImplemented where the plugins must run (read by its class)
    def fused_pick(self, *args: object) -> Any: ...


_compiled: Kernels | None
try:  # by name: a `from epp.scheduling import` would tie this module to the package's own imports (the registry)
    _compiled = cast(Kernels, importlib.import_module("epp.scheduling._native"))
except ImportError:  # built without a compiler: the numpy code runs
    _compiled = None

NATIVE: Kernels | None = _compiled if _compiled is not None and _compiled.ENABLED else None


def weighted_total_numpy(terms: Sequence[Term], offset: float) -> FloatArray:
    """The definition: Σ values × coef (NaN → fill where a fill is given, `np.nan_to_num`) in order, + offset
    (when not 0), NaN → 0 (`fmax`). `terms` is not empty; a new array."""
    total: FloatArray | None = None
    for values, coef, fill in terms:
        term = weighted_term(values, coef, fill)
        if total is None:
            total = term
        else:
            total += term
    assert total is not None
    if offset:
        total += offset
    np.fmax(total, 0.0, out=total)  # a NaN that slipped through counts as 0, not as "best"
    return total


def weighted_total(flat: list[object], offset: float, size: int) -> FloatArray:
    """`weighted_total_numpy` of the terms in `flat`, one after another (values, coef, fill, values, …, as the
    kernel takes them: no tuple per term), compiled when it can be."""
    if NATIVE is not None:
        out: FloatArray = np.empty(size)
        if NATIVE.weighted_total(out, offset, *flat) is None:
            return out
    terms: list[Term] = list(zip(flat[0::3], flat[1::3], flat[2::3], strict=True))  # type: ignore[arg-type]
    return weighted_total_numpy(terms, offset)


def weighted_total_rows_numpy(terms: Sequence[Term], offset: float) -> tuple[FloatArray, FloatArray]:
    """The definition of a detailed pick's arithmetic: `weighted_total_numpy`, and each term's `weighted_term` as
    one row of a terms × candidates array (what its route receipt reads)."""
    size = terms[0][0].size
    rows: FloatArray = np.empty((len(terms), size))
    for row, (values, coef, fill) in zip(rows, terms, strict=True):
        row[:] = weighted_term(values, coef, fill)
    return weighted_total_numpy(terms, offset), rows


def weighted_total_rows(flat: list[object], offset: float, size: int) -> tuple[FloatArray, FloatArray]:
    """`weighted_total_rows_numpy` of the terms in `flat` (as `weighted_total` takes them), compiled when it can be:
    the one pass that sums the terms writes them out too."""
    if NATIVE is not None:
        out: FloatArray = np.empty(size)
        rows: FloatArray = np.empty((len(flat) // 3, size))
        if NATIVE.weighted_total_rows(out, rows, offset, *flat) is None:
            return out, rows
    terms: list[Term] = list(zip(flat[0::3], flat[1::3], flat[2::3], strict=True))  # type: ignore[arg-type]
    return weighted_total_rows_numpy(terms, offset)


def max_tie_numpy(scores: FloatArray, tie: float, draw: Callable[[], float]) -> int:
    """The definition: the index of the highest score (NaN ignored), scores within `tie` of it a tie, the k-th tie
    in index order for k = int(draw() × ties), `draw` called only when there are several."""
    ties = (scores >= extremes(scores)[1] - tie).nonzero()[0]
    return int(ties[0] if ties.size == 1 else ties[int(draw() * ties.size)])


def max_tie(scores: FloatArray, tie: float, draw: Callable[[], float]) -> int:
    """`max_tie_numpy`, compiled when it can be."""
    if NATIVE is not None:
        choice = NATIVE.max_tie(scores, tie, draw)
        if choice.__class__ is int:
            return choice
    return max_tie_numpy(scores, tie, draw)

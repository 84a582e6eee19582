# The compiled kernels (epp/scheduling/_native.c); epp.scheduling.totals says when they run.
from collections.abc import Callable
from typing import Any

from numpy.typing import NDArray

ENABLED: int

def weighted_total(out: NDArray[Any], offset: float, *terms: object) -> object: ...
def weighted_total_rows(out: NDArray[Any], rows: NDArray[Any], offset: float, *terms: object) -> object: ...
def max_tie(scores: NDArray[Any], tie: float, draw: Callable[[], float]) -> object: ...
def kept_under(
    candidates: NDArray[Any],
    queue: NDArray[Any],
    kv: NDArray[Any],
    fresh: NDArray[Any] | None,
    queue_limit: float,
    kv_limit: float,
    out: NDArray[Any],
) -> object: ...
def prefix_match(holders: dict[int, int], hashes: list[int], out: NDArray[Any]) -> object: ...
def small_extremes(values: NDArray[Any], /) -> object: ...

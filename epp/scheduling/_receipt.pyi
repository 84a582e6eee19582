# The compiled receipt steps (epp/scheduling/_receipt.c); epp.scheduling.receipt says when they run.
from typing import Any

from numpy.typing import NDArray

ENABLED: int

def pick_terms(
    scored: NDArray[Any], total: NDArray[Any], primary: int, named: object, rows: NDArray[Any] | None
) -> object: ...
def receipt_json(receipt: object) -> object: ...
def scored_pairs(addresses: object, slots: NDArray[Any], scores: NDArray[Any]) -> object: ...
def signal_health(
    scraped_at: NDArray[Any],
    failures: NDArray[Any],
    candidates: NDArray[Any],
    primary: int,
    now: float,
    staleness_s: float,
    max_failures: int,
) -> object: ...
def account(*fields: object) -> object: ...
def receipt_of(*fields: object) -> object: ...
def fold(*fields: object) -> object: ...
def account_pick(
    plan: list[object], state: object, primary: int, flow_wait_s: float, profiles: object, keep: bool
) -> object: ...

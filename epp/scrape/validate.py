"""Plausibility checks on scraped values: a value no model server can mean becomes unknown, never a score.

A model server (or anything answering on its metrics port) can publish any float. The scorers rank by these values,
so a queue of `-5` would look shorter than an idle server's and draw most picks; `+Inf` or `1e300` would poison a
min-max normalisation. Each series value is checked where a page turns into signals (`extract`), before values are
summed or maxed, so one bad rank of a data-parallel server cannot hide inside a sum.

A rejected value leaves its signal NaN (unknown: scorers treat it as such, the saturation logic as saturated) and
is counted by signal and reason (`negative`, `nan`, `infinite`, `too_large`); the endpoint's scrape status says
which value was refused, so `/debug/pool` shows it.

Bounds (inclusive), generous enough for any real deployment and far below what breaks the arithmetic:

| signal | accepted |
|---|---|
| waiting, running (requests) | 0 … 1,000,000 |
| kv_usage (fraction) | 0 … 1 |
| max_lora (adapters) | 0 … 100,000 |
| block_size (tokens per block) | 1 … 1,000,000 |
| num_blocks | 0 … 1,000,000,000 |
"""

from __future__ import annotations

import math

# signal → (lowest, highest) accepted value
BOUNDS: dict[str, tuple[float, float]] = {
    "waiting": (0.0, 1e6),
    "running": (0.0, 1e6),
    "kv_usage": (0.0, 1.0),
    "max_lora": (0.0, 1e5),
    "block_size": (1.0, 1e6),
    "num_blocks": (0.0, 1e9),
}


def rejection(signal: str, value: float) -> str | None:
    """Why `value` cannot be this signal, or None when it is plausible."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "infinite"
    low, high = BOUNDS[signal]
    if value < 0:
        return "negative"
    if value < low:
        return "too_small"
    if value > high:
        return "too_large"
    return None

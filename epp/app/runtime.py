"""How a picker process runs, control process and serving worker alike: the garbage collector settled once
everything long-lived is built (the event loop they run on: epp.supervision.loop)."""

from __future__ import annotations

import gc


def settle_garbage_collector() -> None:
    """Move everything built at start-up out of the collector's sight, and collect the young generation less often.

    Each request allocates a few hundred short-lived objects (protobuf messages, numpy arrays, dicts); with the
    default thresholds the collector runs every few requests and re-walks the long-lived start-up objects
    (modules, the kubernetes client, numpy) on every older-generation pass. Freezing them and raising the
    first threshold cuts that cost without letting cycles build up.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)

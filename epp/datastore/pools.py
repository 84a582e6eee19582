"""Several InferencePools in one endpoint table: which slots belong to a pool, and how a pool is named.

A picker that serves several pools keeps one table (one scrape child, one set of shared rows, one membership
message to the serving workers), and each endpoint carries its pool's key (`EndpointInfo.pool`, `namespace/name`).
A pool's decisions read only its own slots: `PoolSlots.of` gives them, recomputed only when membership changes
(the table rebuilds its `infos` tuple then, so an identity check is the whole cost of an unchanged table).

One address (ip:port) belongs to one pool: the table is keyed by address. Two pools that select the same pod on the
same port are a misconfiguration the source resolves (the first pool by key keeps it) and logs.
"""

from __future__ import annotations

import numpy as np

from epp.datastore.table import IntArray, Snapshot

SEPARATOR = "/"


def pool_key(namespace: str, name: str) -> str:
    """The key of a pool: `namespace/name`, as the gateway names it in the stream's metadata."""
    return f"{namespace}{SEPARATOR}{name}"


def split_key(key: str, default_namespace: str) -> tuple[str, str]:
    """`namespace/name` → (namespace, name); a bare `name` is in `default_namespace`."""
    namespace, sep, name = key.partition(SEPARATOR)
    if not sep:
        return default_namespace, namespace
    return namespace, name


class PoolSlots:
    """The present slots of one pool in a table's snapshot, cached per membership."""

    __slots__ = ("_infos", "_slots", "key")

    def __init__(self, key: str) -> None:
        self.key = key
        self._infos: object = None
        self._slots: IntArray = np.empty(0, dtype=np.int64)

    def of(self, snapshot: Snapshot) -> IntArray:
        infos = snapshot.infos
        if infos is not self._infos:
            key = self.key
            slots = np.fromiter(
                (slot for slot, info in enumerate(infos) if info is not None and info.pool == key), dtype=np.int64
            )
            slots.flags.writeable = False
            self._slots, self._infos = slots, infos
        return self._slots

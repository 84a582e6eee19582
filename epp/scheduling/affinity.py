"""Affinity scorers: LoRA adapters already loaded, and sticky sessions.

Both need per-endpoint sets of strings (adapters) or an address lookup, which numpy cannot vectorise; they cache
what they derive per snapshot identity (the endpoint table hands out the same adapter/address tuples until a scrape
or membership change alters them), so the per-endpoint Python work happens once per change, not once per pick.
"""

from __future__ import annotations

import base64
import binascii
from collections import OrderedDict

import numpy as np

from epp.datastore import Snapshot
from epp.datastore.table import FloatArray, IntArray
from epp.scheduling.framework import CycleState

ACTIVE, ROOM, WAITING, NONE = 1.0, 0.8, 0.6, 0.0


class LoraAffinityScorer:
    """`lora-affinity-scorer`: 1.0 adapter running there, 0.8 room to load it, 0.6 queued to load there, else 0.

    "Room" = running + waiting adapters < max_lora. An endpoint that does not report max_lora (NaN: not a LoRA server,
    not scraped yet, or its data not usable: `CycleState.usable`) cannot be judged on room and scores 0.5 unless the
    adapter is known to be running or waiting there, so missing metrics never push a request away from an endpoint
    that may be perfectly able to serve it.
    """

    type_name = "lora-affinity-scorer"
    UNIT_INTERVAL = True

    def __init__(self, name: str = "lora-affinity-scorer") -> None:
        self.name = name
        # The adapter tuples the cache was built from, held (not their ids: ids are reused after collection).
        self._source: tuple[object, object] = (None, None)
        self._loaded: FloatArray = np.zeros(0)
        self._by_model: dict[str, FloatArray] = {}

    def _per_model(self, snapshot: Snapshot, model: str) -> FloatArray:
        if self._source[0] is not snapshot.running_adapters or self._source[1] is not snapshot.waiting_adapters:
            self._source = (snapshot.running_adapters, snapshot.waiting_adapters)
            self._by_model = {}
            self._loaded = np.fromiter(
                (len(r) + len(w) for r, w in zip(snapshot.running_adapters, snapshot.waiting_adapters, strict=True)),
                dtype=np.float64,
                count=len(snapshot.running_adapters),
            )
        scores = self._by_model.get(model)
        if scores is None:
            if len(self._by_model) > 256:
                self._by_model.clear()
            n = len(snapshot.running_adapters)
            active = np.fromiter((model in r for r in snapshot.running_adapters), dtype=np.bool_, count=n)
            waiting = np.fromiter((model in w for w in snapshot.waiting_adapters), dtype=np.bool_, count=n)
            scores = np.where(active, ACTIVE, np.where(waiting, WAITING, NONE))
            self._by_model[model] = scores
        return scores

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray:
        snapshot = state.snapshot
        known = self._per_model(snapshot, state.request.model)[candidates]
        max_lora = snapshot.max_lora[candidates]
        fresh = state.usable(candidates)
        if fresh is not None:  # stale or failing: the room it reported is unknown now
            max_lora = np.where(fresh, max_lora, np.nan)
        loaded = self._loaded[candidates]
        room = loaded < max_lora  # NaN max_lora compares False
        out = np.where(known == ACTIVE, ACTIVE, np.where(room, ROOM, known))
        unknown_room = np.isnan(max_lora) & (known == NONE)
        out[unknown_room] = 0.5
        return out


class SessionAffinityScorer:
    """`session-affinity-scorer`: 1.0 for the endpoint that served this `x-session-token` before, 0 elsewhere.

    The token is either one we saw on an earlier pick (remembered here, newest 100,000 tokens) or upstream's form,
    base64 of the endpoint's pod name or address, so clients written against upstream keep their stickiness.
    A request without a token, or whose endpoint left, scores 0 everywhere (no preference).
    """

    type_name = "session-affinity-scorer"
    UNIT_INTERVAL = True

    def __init__(self, name: str = "session-affinity-scorer", max_sessions: int = 100_000) -> None:
        self.name = name
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._index_version = -1
        self._slot_by_key: dict[str, int] = {}

    def _slot_of(self, snapshot: Snapshot, key: str) -> int | None:
        if snapshot.version != self._index_version:
            by_key: dict[str, int] = {}
            for slot, info in enumerate(snapshot.infos):
                if info is not None:
                    by_key[info.address] = slot
                    if info.pod_name:
                        by_key.setdefault(info.pod_name, slot)
            self._slot_by_key = by_key
            self._index_version = snapshot.version
        return self._slot_by_key.get(key)

    def _target(self, snapshot: Snapshot, token: str) -> int | None:
        address = self._sessions.get(token)
        if address is not None:
            return self._slot_of(snapshot, address)
        try:
            decoded = base64.b64decode(token, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        slot = self._slot_of(snapshot, decoded)
        if slot is None and "/" in decoded:  # upstream encodes "namespace/pod"
            slot = self._slot_of(snapshot, decoded.rsplit("/", 1)[1])
        return slot

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray:
        out = np.zeros(candidates.size)
        token = state.request.session_token
        if token:
            slot = self._target(state.snapshot, token)
            if slot is not None:
                out[candidates == slot] = 1.0
        return out

    def picked(self, state: CycleState, slot: int) -> None:
        token = state.request.session_token
        if not token:
            return
        sessions = self._sessions
        sessions[token] = state.snapshot.addresses[slot]
        sessions.move_to_end(token)
        if len(sessions) > self.max_sessions:
            sessions.popitem(last=False)

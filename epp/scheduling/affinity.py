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


ENCODED_ENDPOINT_HEADER = "encoded_endpoint_header"
SESSION_ID = "session_id"
SESSION_TOKEN_HEADER = "x-session-token"
SESSION_ID_HEADER = "x-session-id"


def encode_endpoint(snapshot: Snapshot, slot: int) -> str:
    """The token written back on the response: base64 of the endpoint's pod name (its address when it has none)."""
    info = snapshot.infos[slot]
    name = info.pod_name if info is not None and info.pod_name else snapshot.addresses[slot]
    return base64.b64encode(name.encode("utf-8")).decode("ascii")


class SessionAffinityScorer:
    """`session-affinity-scorer`: 1.0 for the endpoint this session was routed to before, 0 elsewhere.

    Upstream's two strategies (`scheduling/scorer/sessionaffinity`):
    - `encoded_endpoint_header` (default): the client echoes `x-session-token`, the base64 of the endpoint's name
      that the picker writes on every response (`response_headers`), so no server state is needed. Tokens of
      upstream's form (base64 of `namespace/pod` or the address) and tokens seen on earlier picks (remembered, newest
      `maxSessions`) both work.
    - `session_id`: the client sends an opaque id in `x-session-id`; the picker keeps id → endpoint, each binding
      expiring `ttl` (300 s) after its last use (time from the pick's `now`); nothing is written back.
    A request without a token or id, or whose endpoint left, scores 0 everywhere (no preference).
    """

    type_name = "session-affinity-scorer"
    UNIT_INTERVAL = True

    def __init__(
        self,
        name: str = "session-affinity-scorer",
        max_sessions: int = 100_000,
        strategy: str = ENCODED_ENDPOINT_HEADER,
        header: str | None = None,
        ttl_s: float = 300.0,
    ) -> None:
        self.name = name
        self.max_sessions = max_sessions
        self.strategy = strategy
        default = SESSION_ID_HEADER if strategy == SESSION_ID else SESSION_TOKEN_HEADER
        self.header = (header or default).lower()
        self.ttl_s = ttl_s
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._used: dict[str, float] = {}  # session_id strategy: when each binding was last used
        self._index_version = -1
        self._slot_by_key: dict[str, int] = {}

    def _key(self, state: CycleState) -> str | None:
        request = state.request
        if self.strategy == ENCODED_ENDPOINT_HEADER and self.header == SESSION_TOKEN_HEADER:
            return request.session_token or None
        return request.headers.get(self.header) or None

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

    def _target(self, state: CycleState, token: str) -> int | None:
        snapshot = state.snapshot
        address = self._sessions.get(token)
        if self.strategy == SESSION_ID:
            if address is None:
                return None
            if state.now - self._used.get(token, state.now) > self.ttl_s:
                del self._sessions[token]
                self._used.pop(token, None)
                return None
            return self._slot_of(snapshot, address)
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
        token = self._key(state)
        if token:
            slot = self._target(state, token)
            if slot is not None:
                out[candidates == slot] = 1.0
        return out

    def picked(self, state: CycleState, slot: int) -> None:
        token = self._key(state)
        if not token:
            return
        sessions = self._sessions
        sessions[token] = state.snapshot.addresses[slot]
        sessions.move_to_end(token)
        if self.strategy == SESSION_ID:
            self._used[token] = state.now
        if len(sessions) > self.max_sessions:
            old, _ = sessions.popitem(last=False)
            self._used.pop(old, None)

    def response_headers(self, snapshot: Snapshot, slot: int) -> tuple[tuple[str, str], ...]:
        """What the response carries back to the client: the encoded endpoint (encoded_endpoint_header only)."""
        if self.strategy != ENCODED_ENDPOINT_HEADER:
            return ()
        return ((self.header, encode_endpoint(snapshot, slot)),)

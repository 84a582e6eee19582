"""`precise-prefix-cache-producer`: per-endpoint prefix match from the engines' own KV-cache events.

The approximate producer guesses what each server caches from the picks this picker made; this one asks an index
built from the engines' `BlockStored` / `BlockRemoved` / `AllBlocksCleared` events (`epp.kvevents`). The request's
engine token ids (the `token-producer`'s vllm backend) are cut into block keys exactly as the index cuts each event's
`token_ids`, so the lookup finds what the engine really holds whatever its own hash algorithm or seed.

Where the index cannot be trusted for an endpoint, that endpoint's match falls back to the approximate producer's
(this plugin keeps one, fed by its picks), counted by reason:
- `absent`: no event ever heard from the endpoint (no publisher, wrong port, not yet connected);
- `stale`: the picker sent it a request that had to store new blocks (at least `EXPECT_STORE_TOKENS` tokens it did
  not hold: more than any engine's block) more than `staleAfter` ago, and no event has arrived since: such a
  prefill publishes stores, so the stream has stopped (an idle engine, or one serving cache hits, sends nothing
  and stays trusted);
- `no_tokens`: the request has no engine token ids (the render call failed and the estimate stood in), so no
  endpoint can be matched precisely.

Speculative entries (upstream's `speculativeIndexing`): the chosen endpoint is credited with the request's blocks
for `speculativeTTL` (2 s) after the pick, until its events can have arrived, so a burst of requests sharing a new
prefix does not scatter before the first prefill's stores are seen.

The index is reached through `KvIndexView` (the composition layer gives the serving process a view over the
feeder's shared-memory table; the virtual-time benchmark an in-process `KvBlockIndex`). Pure: `state.now`, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from epp.kvevents.blockkeys import BlockKeys, U64Array
from epp.kvevents.index import KvBlockIndex
from epp.scheduling.framework import CycleState, PrefixMatch, produced, publish
from epp.scheduling.producers import ApproxPrefixCacheProducer, tokenized

FALLBACK_REASONS = ("absent", "stale", "no_tokens")
EXPECT_STORE_TOKENS = 512  # uncached prompt tokens after which a pick must produce a BlockStored
NEVER = float("-inf")


class KvIndexView(Protocol):
    """What the producer reads of the KV-event index. Endpoints have slots in the index (its mask bits); the
    producer maps them to snapshot slots once per `version`, so a lookup hands back plain counts by index slot."""

    @property
    def version(self) -> int:
        """Changes whenever `slot_names()` or the set of endpoints never heard from changes."""
        ...

    def slot_names(self) -> Sequence[str | None]:
        """The endpoint address (`ip:port`) of each index slot; None: a free slot."""
        ...

    def prefix_blocks(
        self, keys: U64Array
    ) -> npt.NDArray[np.unsignedinteger[Any]] | npt.NDArray[np.signedinteger[Any]]:
        """Per index slot (at least `len(slot_names())` of them), how many leading keys the endpoint holds."""
        ...

    def last_event_at(self, endpoint: str) -> float:
        """When the endpoint's last event batch arrived (−inf: never), on the clock of `CycleState.now`."""
        ...


class LocalIndexView:
    """A `KvIndexView` over an index in the same process (tests, the virtual-time benchmark): `KvBlockIndex.match`."""

    def __init__(self, index: KvBlockIndex) -> None:
        self.index = index
        self._names_version = -1
        self._slot_of: dict[str, int] = {}

    @property
    def version(self) -> int:
        return self.index.version

    def slot_names(self) -> Sequence[str | None]:
        return self.index.slot_names()

    def prefix_blocks(self, keys: U64Array) -> npt.NDArray[np.int64]:
        index = self.index
        if index.version != self._names_version:
            self._names_version = index.version
            self._slot_of = {name: slot for slot, name in enumerate(index.slot_names()) if name is not None}
        counts = np.zeros(index.slots(), dtype=np.int64)
        for name, blocks in index.match(keys.tolist()).items():
            counts[self._slot_of[name]] = blocks
        return counts

    def last_event_at(self, endpoint: str) -> float:
        return self.index.last_event_at(endpoint)


class _NoIndex:
    """Until the composition layer attaches the feeder's table: every endpoint is absent."""

    version = 0

    def slot_names(self) -> Sequence[str | None]:
        return ()

    def prefix_blocks(self, keys: U64Array) -> npt.NDArray[np.int64]:
        return np.zeros(0, dtype=np.int64)

    def last_event_at(self, endpoint: str) -> float:
        return NEVER


class _Membership:
    """What a pick needs of the snapshot's membership against the index's, computed once per (membership tuple,
    index version): snapshot slot by address, each snapshot slot's index slot, and the snapshot slots never heard
    from (the only endpoints besides those owing events that can be untrusted)."""

    __slots__ = ("addresses", "index_slot", "mapped", "never", "slot_of", "version", "view")

    def __init__(self, addresses: tuple[str, ...], view: KvIndexView) -> None:
        self.addresses, self.view, self.version = addresses, view, view.version
        self.slot_of = {a: i for i, a in enumerate(addresses) if a}
        # per snapshot slot, its endpoint's index slot; −1 (a count of 0 the producer appends) when the index has none
        of_name = {name: bit for bit, name in enumerate(view.slot_names()) if name is not None}
        self.index_slot = np.array([of_name.get(a, -1) if a else -1 for a in addresses], dtype=np.intp)
        self.mapped = bool((self.index_slot >= 0).any())
        self.never = tuple(i for i, a in enumerate(addresses) if a and view.last_event_at(a) == NEVER)


class PrecisePrefixCacheProducer:
    """Publishes a `PrefixMatch` (blocks of `block_size` tokens) for `prefix-cache-scorer`."""

    type_name = "precise-prefix-cache-producer"
    ORDER: ClassVar[int] = 10

    def __init__(
        self,
        name: str = "precise-prefix-cache-producer",
        block_size: int = 16,
        hash_seed: str = "",
        socket_port: int = 5557,
        replay_port: int | None = None,
        topic_filter: str = "kv@",
        max_blocks_per_endpoint: int = 65_536,
        max_request_blocks: int = 8192,
        stale_after_s: float = 10.0,
        speculative: bool = False,
        speculative_ttl_s: float = 2.0,
        token_producer: str = "token-producer",
    ) -> None:
        self.name = name
        self.block_size = block_size
        self.hash_seed = hash_seed
        self.socket_port = socket_port
        self.replay_port = replay_port
        self.topic_filter = topic_filter
        self.max_blocks_per_endpoint = max_blocks_per_endpoint
        self.stale_after_s = stale_after_s
        self.speculative = speculative
        self.speculative_ttl_s = speculative_ttl_s
        self.token_producer = token_producer
        self.keys = BlockKeys(block_size, hash_seed, max_request_blocks)
        self.view: KvIndexView = _NoIndex()
        self.approx = ApproxPrefixCacheProducer(
            f"{name}:approximate", block_tokens=block_size, max_tokens=block_size * max_request_blocks, auto_tune=False
        )
        self.fallbacks: dict[str, int] = dict.fromkeys(FALLBACK_REASONS, 0)
        self.precise_picks = 0
        # endpoint → when the picker first sent it a request that no event has answered yet
        self._unanswered: dict[str, float] = {}
        # speculative entries: block key → {endpoint: expiry}, oldest insertions first
        self._spec: OrderedDict[int, dict[str, float]] = OrderedDict()
        self._key = f"precise-prefix:{name}"
        self._members: _Membership | None = None
        # told (slot, now) of each pick that owes the endpoint's stores (a serving worker shares them: the pick log)
        self.on_owed: Callable[[int, float], None] | None = None

    # -- per endpoint state ------------------------------------------------------------------------------------

    def attach(self, view: KvIndexView) -> None:
        self.view = view

    def trust(self, endpoint: str, now: float) -> str | None:
        """None when the endpoint's entries are trusted, otherwise the fallback reason (absent, stale)."""
        last = self.view.last_event_at(endpoint)
        if last == NEVER:
            return "absent"
        sent = self._unanswered.get(endpoint)
        if sent is None:
            return None
        if last >= sent:
            del self._unanswered[endpoint]
            return None
        return "stale" if now - sent > self.stale_after_s else None

    def expect_stores(self, endpoint: str, now: float) -> None:
        """Another process's pick (a serving worker's, from the shared pick log) owes `endpoint`'s stores since
        `now`: the endpoint turns stale here too if its events do not come."""
        self._unanswered.setdefault(endpoint, now)

    def freshness(self, endpoint: str, now: float) -> dict[str, object]:
        """For /debug/pool: the last event's age and whether the endpoint is trusted."""
        last = self.view.last_event_at(endpoint)
        reason = self.trust(endpoint, now)
        return {
            "lastEventAgeSeconds": None if last == NEVER else round(max(0.0, now - last), 3),
            "precise": reason is None,
            "fallbackReason": reason,
        }

    # -- the pick ----------------------------------------------------------------------------------------------

    def produce(self, state: CycleState) -> None:
        tokens = tokenized(state, self.token_producer)
        if not tokens.exact:
            self.approx.produce(state)
            self.fallbacks["no_tokens"] += 1
            state.scratch[self._key] = None
            publish(state, self.name, produced(state, self.approx.name))
            return
        keys = self.keys.request_keys(np.frombuffer(tokens.data, dtype="<u4"))  # uint32: widened as it is keyed
        # the fallback learns and matches by the same block keys (its blocks are ours: block_size tokens)
        self.approx.produce_keyed(state, keys.tolist(), self.block_size)
        approx: PrefixMatch = produced(state, self.approx.name)
        snapshot = state.snapshot
        now = state.now
        members = self._membership(snapshot.addresses)
        if keys.size and members.mapped:
            counts = self.view.prefix_blocks(keys)
            held = np.zeros(counts.size + 1)  # + a 0 for the snapshot slots the index does not know
            held[:-1] = counts
            matched = held[members.index_slot]
        else:
            matched = np.zeros(snapshot.present.size)
        # Only endpoints never heard from or owing events can be untrusted (few): their match comes from the
        # approximate producer; no per-candidate work for the many trusted endpoints.
        untrusted: set[str] = set()
        if members.never or self._unanswered:
            scale = approx.block_tokens / self.block_size if approx.block_tokens > 0 else 0.0
            for slot in self._suspects(state, members):
                address = members.addresses[slot]
                reason = self.trust(address, now)
                if reason is None:
                    continue
                self.fallbacks[reason] += 1
                untrusted.add(address)
                matched[slot] = (
                    min(float(keys.size), float(approx.matched[slot]) * scale) if approx.matched.size > slot else 0.0
                )
        if self.speculative and self._spec:
            slot_of = members.slot_of
            for address, blocks in self._speculative(keys, now).items():
                at = slot_of.get(address)
                if at is not None and address not in untrusted and blocks > matched[at]:
                    matched[at] = blocks
        if not untrusted:
            self.precise_picks += 1
        state.scratch[self._key] = (keys, matched)
        publish(state, self.name, PrefixMatch(matched, int(keys.size), self.block_size))

    def untrusted(self, state: CycleState) -> tuple[str, int, int]:
        """What this pick's match rested on, for its route receipt: "no_tokens" (no engine token ids: every match
        approximate), "approximate" (some candidate's match came from the fallback) or "precise"; and how many
        candidates were stale and absent (never heard from). Read after the pick: its own pick owes nothing yet."""
        if state.scratch.get(self._key) is None:
            return "no_tokens", 0, 0
        members = self._membership(state.snapshot.addresses)
        stale = absent = 0
        if members.never or self._unanswered:
            now = state.now
            for slot in self._suspects(state, members):
                reason = self.trust(members.addresses[slot], now)
                if reason == "stale":
                    stale += 1
                elif reason == "absent":
                    absent += 1
        return ("approximate" if stale or absent else "precise"), stale, absent

    def _membership(self, addresses: tuple[str, ...]) -> _Membership:
        """The snapshot ↔ index mapping (kept while the membership tuple is the same object and the index's
        version holds)."""
        members, view = self._members, self.view
        if (
            members is None
            or members.addresses is not addresses
            or members.view is not view
            or members.version != view.version
        ):
            members = self._members = _Membership(addresses, view)
        return members

    def _suspects(self, state: CycleState, members: _Membership) -> list[int]:
        """Candidate slots never heard from or owing events, ascending."""
        slot_of = members.slot_of
        suspects = set(members.never)
        suspects.update(slot for slot in map(slot_of.get, self._unanswered) if slot is not None)
        candidates = state.candidates
        if candidates.size != state.snapshot.present.size:  # a subset: keep the suspects among the candidates
            suspects.intersection_update(candidates.tolist())
        return sorted(suspects)

    def picked(self, state: CycleState, slot: int) -> None:
        self.approx.picked(state, slot)
        address = state.snapshot.addresses[slot]
        cached = state.scratch.get(self._key)
        if cached is None:
            return
        keys, matched = cached
        if (len(keys) - matched[slot]) * self.block_size >= EXPECT_STORE_TOKENS:
            self._unanswered.setdefault(address, state.now)
            if self.on_owed is not None:
                self.on_owed(slot, state.now)
        if self.speculative and len(keys):
            self._remember(keys, address, state.now + self.speculative_ttl_s)

    # -- speculative entries -----------------------------------------------------------------------------------

    MAX_SPECULATIVE_KEYS: ClassVar[int] = 1 << 18

    def _remember(self, keys: U64Array, address: str, expiry: float) -> None:
        spec = self._spec
        for key in keys.tolist():
            holders = spec.get(key)
            if holders is None:
                spec[key] = {address: expiry}
            else:
                holders[address] = expiry
                spec.move_to_end(key)
        while len(spec) > self.MAX_SPECULATIVE_KEYS:
            spec.popitem(last=False)

    def _speculative(self, keys: U64Array, now: float) -> dict[str, int]:
        out: dict[str, int] = {}
        alive: set[str] | None = None
        for n, key in enumerate(keys.tolist(), 1):
            holders = self._spec.get(key)
            here = {a for a, exp in holders.items() if exp > now} if holders else set()
            alive = here if alive is None else alive & here
            if not alive:
                break
            for a in alive:
                out[a] = n
        return out

"""Which endpoint caches which prefix blocks, from the engines' own KV events: pure, bounded, `now` an argument.

Keys are recomputed from each `BlockStored` event's `token_ids` (`epp.kvevents.blockkeys`), so a request's keys,
computed the same way from its token ids, find the blocks whatever hash algorithm, seed or block size the engine
uses, as long as one block size divides the other (vLLM's 16 under upstream's sample's 64, or 512-token engine blocks
under our 16; other events are counted and skipped). Engine hashes are opaque names: they resolve an event's parent
and a later `BlockRemoved`.

State:
- `holders`: block key → bit mask of the endpoints holding it (one bit per endpoint slot; Python ints, so any
  number of endpoints). A lookup walks the request's keys once and ANDs masks, so its cost is the matched length,
  not the number of endpoints.
- per endpoint, `engine`: engine hash → our key (or the keys of the k blocks of ours one engine block spans; or,
  for an engine block smaller than ours that does not end one of ours, the open block's state: `_Open`), in
  store order (an OrderedDict: evicting the oldest is O(1)); the KV-cache groups it learnt (only full-attention
  groups establish a prefix); when it last heard an event and a store.

Bound: at most `max_blocks_per_endpoint` engine blocks per endpoint (default 65,536, over twice the 28,672 blocks of
an H100 serving Llama-3.1-8B); past it the endpoint's *oldest-stored* blocks are evicted first. In steady state the
engine's own `BlockRemoved` events keep each endpoint under its cache size and the bound never acts; it is there
for streams that lost removals (a gap without replay, a misbehaving engine). Memory is therefore at most
`endpoints × max_blocks_per_endpoint` entries; benchmarks/kv_events.py measures the bytes per block.

Age: each endpoint's `last_event_at` (any batch, even empty) and `last_store_at` are kept; a caller decides from
them whether the endpoint's entries are fresh enough to trust (per-entry times are not kept: they would cost a
float per block). Only blocks on the GPU (`medium` GPU or absent) are indexed: offloaded copies are not a prefix hit
on the engine's next request.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat

from epp.kvevents.blockkeys import MASK, BlockKeys, U64Array
from epp.kvevents.decode import AllBlocksCleared, Batch, BlockRemoved, BlockStored, Event, engine_key

DEFAULT_MAX_BLOCKS_PER_ENDPOINT = 65_536
INDEXED_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
SKIP_REASONS = ("non_dense", "block_size", "orphan", "medium", "cache_kind", "bad_tokens")


class _Open:
    """An engine block that ends inside one of our blocks (engine blocks smaller than ours): it holds no key of
    ours; it keeps what its successor in the chain needs to continue: the key before our open block, how many of
    that block's tokens are in, and their pre-mix sum (`BlockKeys.unit_sums`). The engine block that completes our
    block holds its key, so a prefix counts only whole blocks of ours, as a request's keys do."""

    __slots__ = ("acc", "offset", "prev")

    def __init__(self, prev: int, offset: int, acc: int) -> None:
        self.prev, self.offset, self.acc = prev, offset, acc


Keys = int | tuple[int, ...] | _Open


@dataclass(slots=True)
class _Endpoint:
    slot: int
    bit: int
    engine: OrderedDict[int, Keys] = field(default_factory=OrderedDict)
    groups: dict[int, bool] = field(default_factory=dict)  # group_idx → indexable (learnt from stores)
    last_event_at: float = float("-inf")
    last_store_at: float = float("-inf")


@dataclass(slots=True)
class IndexCounters:
    batches: int = 0
    stored_blocks: int = 0
    removed_blocks: int = 0
    cleared: int = 0
    evicted_blocks: int = 0
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SKIP_REASONS, 0))


class KvBlockIndex:
    """Not thread-safe: one writer (the feeder) and readers on the same thread, or a published copy."""

    def __init__(
        self,
        block_size: int = 16,
        hash_seed: str = "",
        max_blocks_per_endpoint: int = DEFAULT_MAX_BLOCKS_PER_ENDPOINT,
        max_request_blocks: int = 8192,
        mirror: Callable[[Mapping[int, int]], None] | None = None,
    ) -> None:
        if max_blocks_per_endpoint < 1:
            raise ValueError("max_blocks_per_endpoint must be positive")
        self.keys = BlockKeys(block_size, hash_seed, max_request_blocks)
        self.block_size = block_size
        self.max_blocks_per_endpoint = max_blocks_per_endpoint
        self.holders: dict[int, int] = {}
        # told {key: new holder mask} once per write (a batch, a clear, an endpoint's removal), each changed key
        # once with its last mask: the shared-memory table (epp.kvevents.shared) follows it
        self.mirror = mirror
        self._changed: dict[int, int] = {}
        self.counters = IndexCounters()
        self._endpoints: dict[str, _Endpoint] = {}
        self._by_slot: list[str | None] = []
        self._free: list[int] = []
        # changes whenever an endpoint takes or leaves a slot or is first heard from (a reader's mapping of slots
        # to its own endpoints, and of who was never heard from, holds while it stands)
        self.version = 0

    # -- membership ---------------------------------------------------------------------------------------------

    def add_endpoint(self, endpoint: str) -> None:
        if endpoint in self._endpoints:
            return
        if self._free:
            slot = self._free.pop()
            self._by_slot[slot] = endpoint
        else:
            slot = len(self._by_slot)
            self._by_slot.append(endpoint)
        self._endpoints[endpoint] = _Endpoint(slot, 1 << slot)
        self.version += 1

    def remove_endpoint(self, endpoint: str) -> None:
        ep = self._endpoints.get(endpoint)
        if ep is None:
            return
        self.clear(endpoint)
        del self._endpoints[endpoint]
        self._by_slot[ep.slot] = None
        self._free.append(ep.slot)
        self.version += 1

    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    def slots(self) -> int:
        """Endpoint slots in use or freed (a holder mask has at most this many bits)."""
        return len(self._by_slot)

    def slot_names(self) -> list[str | None]:
        """The endpoint of each slot (None: free), for a reader of the shared table's masks."""
        return list(self._by_slot)

    def clear(self, endpoint: str) -> int:
        """Forget every block of one endpoint (a clear event, a sequence gap, a restart); returns how many."""
        try:
            return self._clear(endpoint)
        finally:
            self._flush()

    def _clear(self, endpoint: str) -> int:
        ep = self._endpoints.get(endpoint)
        if ep is None:
            return 0
        n = len(ep.engine)
        for keys in ep.engine.values():
            self._unhold(keys, ep.bit)
        ep.engine.clear()
        ep.groups.clear()
        return n

    # -- writes -------------------------------------------------------------------------------------------------

    def apply(self, endpoint: str, batch: Batch | Sequence[Event], now: float) -> None:
        """Apply one batch of events from one endpoint, in order (the endpoint is added if new)."""
        ep = self._endpoints.get(endpoint)
        if ep is None:
            self.add_endpoint(endpoint)
            ep = self._endpoints[endpoint]
        events = batch.events if isinstance(batch, Batch) else batch
        self.counters.batches += 1
        if ep.last_event_at == float("-inf"):
            self.version += 1  # first heard from
        ep.last_event_at = now
        try:
            values = self._stored_values(ep, events)
            for event in events:
                if isinstance(event, BlockStored):
                    vals = values.get(id(event))
                    if vals is not None:
                        self._store(ep, event, vals, now)
                elif isinstance(event, BlockRemoved):
                    self._remove(ep, event)
                elif isinstance(event, AllBlocksCleared):
                    self.counters.cleared += 1
                    self._clear(endpoint)
            over = len(ep.engine) - self.max_blocks_per_endpoint
            if over > 0:
                self._evict(ep, over)
        finally:
            self._flush()

    def _flush(self) -> None:
        """Tell the mirror what this write changed, once: a key changed several times is told its last mask."""
        changed = self._changed
        if changed:
            self._changed = {}
            if self.mirror is not None:
                self.mirror(changed)

    def _skip(self, reason: str) -> None:
        self.counters.skipped[reason] += 1

    def _indexable_store(self, ep: _Endpoint, ev: BlockStored) -> bool:
        if ev.medium is not None and ev.medium.upper() != "GPU":
            self._skip("medium")
            return False
        if ev.group_idx is not None:
            kind = ev.kv_cache_spec_kind
            if kind is not None:
                ep.groups[ev.group_idx] = kind in INDEXED_KINDS
            if not ep.groups.get(ev.group_idx, False):
                self._skip("cache_kind")
                return False
        n, size = len(ev.block_hashes), ev.block_size
        if n == 0 or size <= 0 or len(ev.token_ids) != n * size:
            self._skip("non_dense")
            return False
        if size % self.block_size and self.block_size % size:
            self._skip("block_size")
            return False
        return True

    def _stored_values(self, ep: _Endpoint, events: Sequence[Event]) -> dict[int, list[int]]:
        """Block values of every indexable store in the batch, from one vectorised pass over all their tokens."""
        todo = [ev for ev in events if isinstance(ev, BlockStored) and self._indexable_store(ep, ev)]
        if not todo:
            return {}
        bs = self.block_size
        out: dict[int, list[int]] = {}
        if any(ev.block_size < bs for ev in todo):  # engine blocks smaller than ours: summed in `_store_units`
            out.update((id(ev), []) for ev in todo if ev.block_size < bs)
            todo = [ev for ev in todo if ev.block_size >= bs]
            if not todo:
                return out
        try:
            tokens: list[int] = []
            for ev in todo:
                tokens.extend(ev.token_ids)
            values = self.keys.block_values(self.keys.tokens_array(tokens))
        except (OverflowError, TypeError, ValueError):  # one event's bad token ids: find it, keep the others
            for ev in todo:
                try:
                    out[id(ev)] = self.keys.block_values(self.keys.tokens_array(ev.token_ids))
                except (OverflowError, TypeError, ValueError):
                    self._skip("bad_tokens")
            return out
        at = 0
        for ev in todo:
            n = len(ev.token_ids) // bs
            out[id(ev)] = values[at : at + n]
            at += n
        return out

    def _store(self, ep: _Endpoint, ev: BlockStored, values: list[int], now: float) -> None:
        parent = ev.parent_block_hash
        if parent is None:
            start: Keys = self.keys.root(ev.lora_name)
        else:
            pk = ep.engine.get(engine_key(parent))
            if pk is None:  # its parent was never seen (or evicted): the chain cannot be recomputed
                self._skip("orphan")
                return
            start = pk
        if ev.block_size < self.block_size:
            self._store_units(ep, ev, start)
            ep.last_store_at = now
            return
        if isinstance(start, _Open):  # a larger block after one that ended inside ours: the chain is misaligned
            self._skip("block_size")
            return
        keys = self.keys.chain(start if isinstance(start, int) else start[-1], values)
        per = ev.block_size // self.block_size
        engine, holders, bit, changed = ep.engine, self.holders, ep.bit, self._changed
        for i, h in enumerate(ev.block_hashes):
            ek = engine_key(h)
            old = engine.pop(ek, None)
            if old is not None:
                self._unhold(old, bit)
            if per == 1:
                key = keys[i]
                engine[ek] = key
                changed[key] = holders[key] = holders.get(key, 0) | bit
            else:
                span = tuple(keys[i * per : (i + 1) * per])
                engine[ek] = span
                for key in span:
                    changed[key] = holders[key] = holders.get(key, 0) | bit
        self.counters.stored_blocks += len(ev.block_hashes)
        ep.last_store_at = now

    def _store_units(self, ep: _Endpoint, ev: BlockStored, start: Keys) -> None:
        """Engine blocks smaller than ours: each adds its tokens' sum to the open block of ours; the one that
        completes it holds the block's key, the others keep the open state (`_Open`)."""
        bs, unit = self.block_size, ev.block_size
        if isinstance(start, _Open):
            prev, offset, acc = start.prev, start.offset, start.acc
        else:
            prev, offset, acc = (start if isinstance(start, int) else start[-1]), 0, 0
        try:
            sums = self.keys.unit_sums(self.keys.tokens_array(ev.token_ids), offset, unit)
        except (OverflowError, TypeError, ValueError):
            self._skip("bad_tokens")
            return
        states: list[
            tuple[int, int] | None
        ] = []  # per engine block: (offset, sum) in the open block; None: completes it
        whole: list[int] = []
        for s in sums:
            acc = (acc + s) & MASK
            offset += unit
            if offset == bs:
                whole.append(acc)
                states.append(None)
                offset = acc = 0
            else:
                states.append((offset, acc))
        keys = self.keys.chain(prev, self.keys.mix_sums(whole)) if whole else []
        engine, holders, bit, changed = ep.engine, self.holders, ep.bit, self._changed
        done = 0
        for h, state in zip(ev.block_hashes, states, strict=True):
            ek = engine_key(h)
            old = engine.pop(ek, None)
            if old is not None:
                self._unhold(old, bit)
            if state is None:
                key = prev = keys[done]
                done += 1
                engine[ek] = key
                changed[key] = holders[key] = holders.get(key, 0) | bit
            else:
                engine[ek] = _Open(prev, state[0], state[1])
        self.counters.stored_blocks += len(ev.block_hashes)

    def _remove(self, ep: _Endpoint, ev: BlockRemoved) -> None:
        if ev.medium is not None and ev.medium.upper() != "GPU":
            return
        if ev.group_idx is not None and not ep.groups.get(ev.group_idx, False):
            return
        engine = ep.engine
        for h in ev.block_hashes:
            keys = engine.pop(engine_key(h), None)
            if keys is not None:
                self._unhold(keys, ep.bit)
                self.counters.removed_blocks += 1

    def _unhold(self, keys: Keys, bit: int) -> None:
        holders, changed = self.holders, self._changed
        if type(keys) is int:  # one key per engine block: the common case, and evictions call this per block
            m = changed[keys] = holders.get(keys, 0) & ~bit
            if m:
                holders[keys] = m
            else:
                holders.pop(keys, None)
            return
        if isinstance(keys, _Open):
            return
        for k in keys if isinstance(keys, tuple) else (keys,):
            m = changed[k] = holders.get(k, 0) & ~bit
            if m:
                holders[k] = m
            else:
                holders.pop(k, None)

    def _evict(self, ep: _Endpoint, n: int) -> None:
        popitem, unhold, bit = ep.engine.popitem, self._unhold, ep.bit
        for _ in range(n):
            unhold(popitem(last=False)[1], bit)
        self.counters.evicted_blocks += n

    # -- reads --------------------------------------------------------------------------------------------------

    def request_keys(self, token_ids: Sequence[int] | U64Array, lora_name: str | None = None) -> list[int]:
        """The block keys of a request's token ids, to pass to `match` (compute once per request)."""
        return self.keys.request_keys(token_ids, lora_name).tolist()  # type: ignore[no-any-return]

    def match(self, keys: Iterable[int], endpoints: Iterable[str] | None = None) -> dict[str, int]:
        """Longest cached prefix, in blocks of ours, per endpoint (only endpoints with at least one block)."""
        by_slot, get = self._by_slot, self.holders.get
        if endpoints is None:
            acc = (1 << len(by_slot)) - 1
        else:
            acc = 0
            for name in endpoints:
                ep = self._endpoints.get(name)
                if ep is not None:
                    acc |= ep.bit
        out: dict[str, int] = {}
        n = 0
        for m in map(get, keys, repeat(0)):  # map in C: no per-key method lookup
            m &= acc
            if m != acc:
                self._credit(out, by_slot, acc & ~m, n)
                acc = m
                if not acc:
                    return out
            n += 1
        self._credit(out, by_slot, acc, n)
        return out

    @staticmethod
    def _credit(out: dict[str, int], by_slot: list[str | None], bits: int, blocks: int) -> None:
        if blocks == 0:
            return
        while bits:
            low = bits & -bits
            bits ^= low
            name = by_slot[low.bit_length() - 1]
            if name is not None:
                out[name] = blocks

    def blocks(self, endpoint: str) -> int:
        ep = self._endpoints.get(endpoint)
        return 0 if ep is None else len(ep.engine)

    def total_blocks(self) -> int:
        return sum(len(ep.engine) for ep in self._endpoints.values())

    def last_event_at(self, endpoint: str) -> float:
        ep = self._endpoints.get(endpoint)
        return float("-inf") if ep is None else ep.last_event_at

    def age(self, endpoint: str, now: float) -> float:
        """Seconds since the endpoint's last event batch (inf when none was ever heard)."""
        return now - self.last_event_at(endpoint)

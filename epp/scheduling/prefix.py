"""Prefix-cache affinity: an approximate index of which endpoint holds which prompt blocks, and its scorer.

The model servers' real caches are invisible to us, so we remember what we sent where (upstream's approach): after
each pick the chosen endpoint is assumed to hold the request's blocks, up to a per-endpoint capacity.

Index layout, chosen for the hot path:
- `holders[h]` is a Python int used as a bit set of slots holding block hash h. Matching a prompt is one dict lookup
  and one AND per block, and the AND narrows to the endpoints that match *every* leading block (chained hashes make
  "holds block i" imply "held blocks < i", so contiguity is what a real prefix cache gives).
- Eviction is a two-generation approximation of LRU per endpoint: blocks sent (or re-sent) land in the `young`
  set; when it reaches half the capacity, the old generation minus anything refreshed is evicted. Retention stays
  between capacity/2 and capacity blocks, with no per-hit bookkeeping beyond a C-level `set.update`.
- Slots are reused by the endpoint table, so the index remembers each slot's address and forgets a slot whose
  address changed (checked only when the snapshot's membership version moves).

Pure: no clock, no I/O; state changes only in `add` (called with the final pick, or with a pick another serving
worker made: `PrefixCacheScorer.learn`) and on membership changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import repeat

import numpy as np

from epp.datastore import Snapshot
from epp.datastore.table import FloatArray, IntArray
from epp.observability import buckets
from epp.observability.plain import RecurringHistogram
from epp.scheduling.framework import CycleState, Linear, LinearScorer
from epp.scheduling.hashing import BlockHasher
from epp.scheduling.totals import NATIVE

AVERAGE_BYTES_PER_TOKEN = 4
# A scraped num_gpu_blocks above this is treated as this: one bad metric must not switch eviction off.
MAX_TUNED_CAPACITY = 1_000_000
_LOOP_BITS = 24  # upstream's characters-per-token estimate, applied to UTF-8 bytes


class PrefixIndex:
    """Which slots hold which block hashes; bounded per slot."""

    def __init__(self, default_capacity: int) -> None:
        self.default_capacity = max(2, default_capacity)
        self._holders: dict[int, int] = {}
        self._young: dict[int, set[int]] = {}
        self._old: dict[int, set[int]] = {}
        self._owner: dict[int, str] = {}
        self._version = -1
        self.reach = 0  # blocks of the last matched prompt held by at least one endpoint

    def __len__(self) -> int:
        return len(self._holders)

    def sync(self, snapshot: Snapshot) -> None:
        """Forget slots whose endpoint left or was replaced; cheap unless membership changed."""
        if snapshot.version == self._version:
            return
        self._version = snapshot.version
        addresses = snapshot.addresses
        for slot in [s for s, owner in self._owner.items() if s >= len(addresses) or addresses[s] != owner]:
            self.forget(slot)

    def forget(self, slot: int) -> None:
        keep = ~(1 << slot)
        for h in self._young.pop(slot, set()) | self._old.pop(slot, set()):
            self._clear(h, keep)
        self._owner.pop(slot, None)

    def _clear(self, h: int, keep: int) -> None:
        mask = self._holders.get(h, 0) & keep
        if mask:
            self._holders[h] = mask
        else:
            self._holders.pop(h, None)

    def match(self, hashes: list[int], size: int) -> FloatArray:
        """`match_python`, compiled when it can be (`epp.scheduling.totals`: one call instead of ~360 bytecodes a
        prompt); a holder set of more than 64 slots runs the definition."""
        if NATIVE is not None:
            matched = np.zeros(size)
            reach = NATIVE.prefix_match(self._holders, hashes, matched)
            if reach.__class__ is int:
                self.reach = reach
                return matched
        return self.match_python(hashes, size)

    def match_python(self, hashes: list[int], size: int) -> FloatArray:
        """The definition: per slot (array of `size`), how many leading blocks of `hashes` it holds.

        Holding block i implies holding every block before it (chained hashes are inserted and refreshed as whole
        prefixes, and a generation evicts the deeper blocks first), so the holder sets shrink with depth and take
        only a few distinct values. Each run of equal holder sets is found by binary search: a handful of dict
        lookups per distinct set instead of one per block; a prompt nobody has seen costs a single lookup.
        """
        matched = np.zeros(size)
        get = self._holders.get
        n = len(hashes)
        segments: list[tuple[int, int]] = []
        depth = 0
        current = get(hashes[0], 0) if n else 0
        while current:
            lo, hi = depth, n - 1  # the run of blocks whose holders are exactly `current` ends in [lo, hi]
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if get(hashes[mid], 0) == current:
                    lo = mid
                else:
                    hi = mid - 1
            depth = lo + 1
            deeper = get(hashes[depth], 0) & current if depth < n else 0
            segments.append((depth, current & ~deeper))  # these slots hold exactly `depth` leading blocks
            current = deeper
        self.reach = depth
        for seg_length, mask in segments:
            if mask.bit_length() > size:  # slots beyond this snapshot: the index is ahead of it
                mask &= (1 << size) - 1
            if mask.bit_count() <= _LOOP_BITS:  # few holders: walking the bits beats four numpy calls
                while mask:
                    low = mask & -mask
                    matched[low.bit_length() - 1] = seg_length
                    mask ^= low
            else:
                raw = np.frombuffer(mask.to_bytes((size + 7) // 8, "little"), dtype=np.uint8)
                matched[np.unpackbits(raw, bitorder="little")[:size].view(np.bool_)] = seg_length
        return matched

    def holds_young(self, slot: int, address: str, hashes: list[int], capacity: int) -> bool:
        """Whether `add(slot, address, hashes, …, capacity)` would change nothing: the slot is still `address`'s,
        every block is in its young generation (so its bit is set: a young or old block always has it), and the
        generation would not turn. One C-level subset test, where `add` needs the match first (compiled, lookups
        that stop at the first hash it lacks: 3.11's issuperset builds a set of the list first)."""
        young = self._young.get(slot)
        return (
            young is not None
            and len(young) < (capacity // 2 if capacity >= 2 else 1)  # max(1, capacity // 2), no builtin call
            and self._owner.get(slot) == address
            and (young.issuperset(hashes) if NATIVE is None else NATIVE.holds_all(young, hashes))
        )

    def add(
        self, slot: int, address: str, hashes: list[int], already_held: int, capacity: int, reach: int | None = None
    ) -> None:
        """Record that `slot` now holds `hashes`.

        Its first `already_held` blocks were held before (no bit to set). `reach` is how far *any* endpoint matched
        (from `match`): blocks beyond it have no holder at all, because holding block i implies holding every block
        before it, so they are inserted with one C-level `dict.update` instead of a read-modify-write each.
        """
        if not hashes:
            return
        if self._owner.get(slot) != address:
            self.forget(slot)
            self._owner[slot] = address
            already_held = 0
        bit = 1 << slot
        holders = self._holders
        n = len(hashes)
        # max(already_held, reach) and max(1, capacity // 2) as comparisons: no builtin call on every pick
        shared_until = n if reach is None else (already_held if already_held > reach else reach)
        if already_held < shared_until:
            for h in hashes[already_held:shared_until]:
                holders[h] = holders.get(h, 0) | bit
        if shared_until < n:
            holders.update(zip(hashes[shared_until:], repeat(bit)))
        young = self._young.get(slot)
        if young is None:
            young = self._young[slot] = set()
        young.update(hashes)
        if len(young) >= (capacity // 2 if capacity >= 2 else 1):
            old = self._old.get(slot, set())
            keep = ~bit
            for h in old - young:
                self._clear(h, keep)
            self._old[slot] = young
            self._young[slot] = set()


def slot_capacity(index: PrefixIndex, snapshot: Snapshot, slot: int, auto_tune: bool) -> int:
    """How many blocks `slot` may hold in `index`: its engine's GPU blocks when auto-tuned and reported (capped),
    else the index's default. One rule for the prefix scorer and the approximate producer."""
    if auto_tune:
        gpu_blocks = snapshot.num_blocks.item(slot)
        if math.isfinite(gpu_blocks) and gpu_blocks > 0:
            return min(int(gpu_blocks), MAX_TUNED_CAPACITY)
    return index.default_capacity


def learn_pick(index: PrefixIndex, snapshot: Snapshot, slot: int, hashes: list[int], auto_tune: bool) -> bool:
    """A pick another decider of this picker made (a serving worker's, from the shared pick log): `slot` now holds
    `hashes`, recorded in `index` as if this decider had picked it. A slot not in `snapshot` is ignored. False when
    `index` is left as it was (ignored, or a repeat its young generation holds): the same pick learned again right
    after, over the same snapshot, leaves it as it is too. `pick_learner`'s, for one pick."""
    return pick_learner(index, snapshot, auto_tune)(slot, hashes)


def pick_learner(index: PrefixIndex, snapshot: Snapshot, auto_tune: bool) -> Callable[[int, list[int]], bool]:
    """`learn_pick(index, snapshot, slot, hashes, auto_tune)` as a call of (slot, hashes), for the picks of one
    refresh over one snapshot: each slot's presence, address and capacity are looked up at its first pick, not at
    every one (the snapshot's membership and block counts do not move while a refresh learns)."""
    slots: dict[int, tuple[str, int] | None] = {}  # slot → (address, capacity); None: not in the snapshot

    def learn(slot: int, hashes: list[int]) -> bool:
        if not hashes:
            return False
        if slot in slots:
            known = slots[slot]
        else:
            present = snapshot.present
            known = slots[slot] = (
                (snapshot.addresses[slot], slot_capacity(index, snapshot, slot, auto_tune))
                if slot < present.size and present[slot]
                else None
            )
        if known is None:
            return False
        if snapshot.version != index._version:  # `sync`'s own test, without its call
            index.sync(snapshot)
        address, capacity = known
        if index.holds_young(slot, address, hashes, capacity):
            return False  # `add` would change nothing (a repeat since the generation turned): nor would its match
        held = int(index.match(hashes, slot + 1)[slot])
        index.add(slot, address, hashes, held, capacity, index.reach)
        return True

    return learn


class PrefixCacheScorer(LinearScorer):
    """`prefix-cache-scorer`: score = leading blocks the endpoint is believed to hold / blocks in the prompt.

    Parameters as upstream: blockSize (bytes of prompt per block, default 64 = 16 tokens × 4), maxPrefixBlocksToMatch
    (256), lruCapacityPerServer (31250 blocks), autoTune (true: block size = the engine's `cache_config_info`
    block_size × 4, capacity = its num_gpu_blocks, when scraped). Never NaN: no match is a plain 0.
    """

    type_name = "prefix-cache-scorer"

    def __init__(
        self,
        name: str = "prefix-cache-scorer",
        block_size: int = 64,
        max_blocks: int = 256,
        lru_capacity: int = 31250,
        auto_tune: bool = True,
    ) -> None:
        self.name = name
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.auto_tune = auto_tune
        self.index = PrefixIndex(lru_capacity)
        self._hashers: dict[int, BlockHasher] = {}
        self._by_tokens: dict[float, BlockHasher] = {}  # engine block size (tokens, as scraped) → its hasher
        self._key = f"prefix-cache:{name}"
        # Called with (slot, block hashes) after each pick is recorded: how the serving workers share their picks.
        self.on_pick: Callable[[int, list[int]], None] | None = None
        # Per lookup: matched share of the prompt and matched bytes (upstream's prefix_indexer_hit_* histograms),
        # plain counts read when /metrics is scraped.
        self.hit_ratio = RecurringHistogram(buckets.PREFIX_HIT_RATIO)
        self.hit_bytes = RecurringHistogram(buckets.PREFIX_HIT_BYTES)

    def _hasher(self, snapshot: Snapshot, first: int) -> BlockHasher:
        block = self.block_size
        if self.auto_tune and first >= 0:
            # One pool, one engine config: upstream reads pod 0 (`first`, the first candidate's slot; -1: none).
            # `item` gives Python numbers, no numpy scalars.
            tokens = snapshot.block_size.item(first)
            known = self._by_tokens.get(tokens)  # the hasher of an engine block size seen before (never NaN's)
            if known is not None:
                return known
            if math.isfinite(tokens) and tokens > 0:
                block = int(tokens) * AVERAGE_BYTES_PER_TOKEN
                if len(self._by_tokens) >= 8:  # scraped values: bounded, as `_hashers` is
                    self._by_tokens.clear()
                hasher = self._by_tokens[tokens] = self._hasher_of(block)
                return hasher
        return self._hasher_of(block)

    def _hasher_of(self, block: int) -> BlockHasher:
        hasher = self._hashers.get(block)
        if hasher is None:
            if len(self._hashers) >= 8:  # block sizes come from scraped metrics: bound what they can allocate
                self._hashers.clear()
            hasher = self._hashers[block] = BlockHasher(block, self.max_blocks)
        return hasher

    def _state(self, state: CycleState, candidates: IntArray) -> tuple[list[int], FloatArray, int]:
        cached: tuple[list[int], FloatArray, int] | None = state.scratch.get(self._key)
        if cached is None:
            cached = self.lookup_first(state, candidates.item(0) if candidates.size else -1)
        return cached

    def lookup_first(self, state: CycleState, first: int) -> tuple[list[int], FloatArray, int]:
        """This pick's lookup (`_state`), run now if it has not, where `first` is the first candidate's slot
        (whose engine block size an auto-tuned scorer hashes with; -1: no candidate): the fused default profile
        calls it with the first candidate the filter kept, as `linear` would."""
        cached: tuple[list[int], FloatArray, int] | None = state.scratch.get(self._key)
        if cached is None:
            request, snapshot, index = state.request, state.snapshot, self.index
            hasher = self._hasher(snapshot, first)
            hashes = hasher.hash_list(request.prompt, request.model)
            if snapshot.version != index._version:  # `sync`'s own test, without its call
                index.sync(snapshot)
            if hashes:
                matched = index.match(hashes, snapshot.present.size)
                reach = index.reach
                self.hit_ratio.observe(reach / len(hashes))
                self.hit_bytes.observe(reach * hasher.block_bytes)
            else:
                matched, reach = _NO_MATCH, 0
            cached = state.scratch[self._key] = (hashes, matched, reach)
        return cached

    def linear(self, state: CycleState, candidates: IntArray) -> Linear:
        hashes, matched, reach = self._state(state, candidates)
        if not reach:  # nobody holds even the first block (or the prompt is shorter than one block)
            return Linear(None, 0.0, 0.0)
        return Linear(state.take(matched, candidates), 1.0 / len(hashes), 0.0)

    @property
    def scratch_key(self) -> str:
        """The pick's scratch key this pick's lookup is kept under: `lookup` is its `get` (a route receipt's
        compiled read, `epp.scheduling.receipt`, reads it by the key)."""
        return self._key

    def lookup(self, state: CycleState) -> tuple[list[int], FloatArray, int] | None:
        """This pick's lookup (the prompt's block hashes, blocks matched per slot, the longest match), if it ran."""
        cached: tuple[list[int], FloatArray, int] | None = state.scratch.get(self._key)
        return cached

    def cached_blocks(self, state: CycleState, slot: int) -> int:
        """Leading prompt blocks `slot` is believed to hold, as this pick scored them (0 when it did not score)."""
        cached: tuple[list[int], FloatArray, int] | None = state.scratch.get(self._key)
        if cached is None or not cached[0] or not 0 <= slot < cached[1].size:
            return 0
        return int(cached[1][slot])

    def picked(self, state: CycleState, slot: int) -> None:
        cached: tuple[list[int], FloatArray, int] | None = state.scratch.get(self._key)  # `_state`, inlined
        hashes, matched, reach = cached if cached is not None else self._state(state, state.candidates)
        if not hashes:
            return
        snapshot = state.snapshot
        index = self.index
        capacity = slot_capacity(index, snapshot, slot, self.auto_tune)  # `_capacity`, inlined
        index.add(slot, snapshot.addresses[slot], hashes, int(matched.item(slot)), capacity, reach)
        if self.on_pick is not None:
            self.on_pick(slot, hashes)

    def learn(self, snapshot: Snapshot, slot: int, hashes: list[int]) -> bool:
        """A pick another decider of this picker made (a serving worker's, from the shared pick log): `slot` now
        holds `hashes`, recorded as if this scorer had picked it. A slot not in `snapshot` is ignored. False: the
        index is as it was (`learn_pick`)."""
        return learn_pick(self.index, snapshot, slot, hashes, self.auto_tune)

    def learning(self, snapshot: Snapshot) -> Callable[[int, list[int]], bool]:
        """`learn` over `snapshot`, as a call of (slot, hashes): one refresh's picks (`pick_learner`)."""
        return pick_learner(self.index, snapshot, self.auto_tune)


_NO_MATCH: FloatArray = np.zeros(0)

"""Data producers (upstream's DataProducer plugins): per-request data computed once before the filters.

Each writes one value per pick (`framework.publish`, keyed by its name) that filters and scorers read by naming the
producer (`prefixMatchInfoProducerName`, `inFlightLoadProducerName`), as upstream's data keys do:

- `token-producer` (alias `tokenizer`): the prompt as tokens. `estimate` guesses 4 bytes per token (upstream's
  estimator); `vllm` uses the engine's token ids, which the request lifecycle fetched from the render endpoints
  before scheduling (`epp.director.tokens`: an HTTP call cannot run in this pure layer), and falls back to the
  estimate when they are absent (render failed or timed out).
- `approx-prefix-cache-producer`: which endpoint holds how many leading token blocks of the prompt, from what this
  picker sent where (the same `PrefixIndex` as the self-contained prefix scorer, keyed by token blocks).
- `inflight-load-producer`: this picker's requests and prompt tokens in flight per endpoint.
- `session-id-producer`: the session id from a header, and the endpoint the session was last routed to.

Pure: no clock (time comes in as `state.now`), no I/O.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from epp.datastore import Snapshot
from epp.datastore.table import FloatArray
from epp.kvevents.token_ids import TokenIds
from epp.observability import buckets
from epp.observability.plain import PlainHistogram
from epp.scheduling.framework import (
    CycleState,
    InflightLoad,
    PrefixMatch,
    TokenizedPrompt,
    produced,
    publish,
)
from epp.scheduling.hashing import BlockHasher
from epp.scheduling.prefix import PrefixIndex, learn_pick, pick_learner, slot_capacity

BYTES_PER_TOKEN = 4  # upstream's estimate backend: about 4 bytes per token
TOKEN_PRODUCER = "token-producer"
_NO_MATCH: FloatArray = np.zeros(0)


def estimate_tokens(prompt: str) -> int:
    """Upstream's estimate: ⌈UTF-8 bytes / 4⌉ (a character-count shortcut for ASCII prompts)."""
    size = len(prompt) if prompt.isascii() else len(prompt.encode("utf-8", "surrogatepass"))
    return -(-size // BYTES_PER_TOKEN)


def token_ids_of(request: object) -> Sequence[int] | None:
    """Engine token ids the lifecycle attached to the request (vllm backend), if any."""
    ids: Sequence[int] | None = getattr(request, "token_ids", None)
    return ids if ids else None


def tokenized(state: CycleState, producer: str = TOKEN_PRODUCER) -> TokenizedPrompt:
    """The request's tokens from the named token producer; the estimate when none ran (upstream auto-creates an
    estimate token-producer for any consumer of TokenizedPrompt)."""
    tokens: TokenizedPrompt | None = produced(state, producer)
    if tokens is None:
        tokens = _estimate(state.request.prompt)
        publish(state, producer, tokens)
    return tokens


def _estimate(prompt: str) -> TokenizedPrompt:
    data = prompt.encode("utf-8", "surrogatepass")
    return TokenizedPrompt(-(-len(data) // BYTES_PER_TOKEN), data, exact=False)


class TokenProducer:
    """`token-producer`: the prompt's tokens, published under this plugin's name and under `token-producer`."""

    type_name = "token-producer"
    ORDER: ClassVar[int] = 0

    def __init__(
        self,
        name: str = TOKEN_PRODUCER,
        backend: str = "estimate",
        type_name: str = "token-producer",
        model_name: str = "",
        url: str = "http://localhost:8000",
        timeout_s: float = 5.0,
        chat_timeout_s: float = 30.0,
        cache_size: int = 4096,
    ) -> None:
        self.name = name
        self.type_name = type_name
        self.backend = backend
        # The vllm backend's client settings: the request lifecycle (epp.director.tokens) makes the render calls.
        self.model_name = model_name
        self.url = url
        self.timeout_s = timeout_s
        self.chat_timeout_s = chat_timeout_s
        self.cache_size = cache_size

    def produce(self, state: CycleState) -> None:
        # Token ids the request already carries (vLLM generate bodies; the render call of the vllm backend) win,
        # as upstream's producer skips a request whose tokens are known.
        ids = token_ids_of(state.request)
        if isinstance(ids, TokenIds):  # the render client's buffer: already the bytes the producers hash
            tokens = TokenizedPrompt(len(ids), ids.data, exact=True)
        elif ids is not None:
            tokens = TokenizedPrompt(len(ids), np.asarray(ids, dtype="<u4").tobytes(), exact=True)
        else:
            tokens = _estimate(state.request.prompt)
        publish(state, self.name, tokens)
        if self.name != TOKEN_PRODUCER:
            publish(state, TOKEN_PRODUCER, tokens)


class ApproxPrefixCacheProducer:
    """`approx-prefix-cache-producer`: per-endpoint leading token blocks held, from this picker's own picks.

    Parameters as upstream (`dataproducer/approximateprefix`): blockSizeTokens 16, maxPrefixTokensToMatch 131072
    (the block cap is maxPrefixTokensToMatch / blockSizeTokens; 0 falls back to maxPrefixBlocksToMatch, 2048),
    lruCapacityPerServer 31250 blocks, autoTune (block size and capacity from the engine's scraped cache config).
    Tokens come from the token producer (the estimate when none is configured); the chosen endpoint is recorded
    as holding the prompt's blocks after the pick.
    """

    type_name = "approx-prefix-cache-producer"
    ORDER: ClassVar[int] = 10

    def __init__(
        self,
        name: str = "approx-prefix-cache-producer",
        block_tokens: int = 16,
        max_tokens: int = 131072,
        max_blocks: int = 2048,
        lru_capacity: int = 31250,
        auto_tune: bool = True,
    ) -> None:
        self.name = name
        self.block_tokens = block_tokens
        self.max_tokens = max_tokens
        self.max_blocks = max_blocks
        self.auto_tune = auto_tune
        self.index = PrefixIndex(lru_capacity)
        self._hashers: dict[int, BlockHasher] = {}
        self._key = f"approx-prefix:{name}"
        self.hit_ratio = PlainHistogram(buckets.PREFIX_HIT_RATIO)
        self.hit_bytes = PlainHistogram(buckets.PREFIX_HIT_BYTES)
        # told each pick's blocks (a serving worker shares them through the pick log), as the prefix scorer's
        self.on_pick: Callable[[int, list[int]], None] | None = None

    def block_cap(self, block_tokens: int) -> int:
        if self.max_tokens > 0:
            return max(1, self.max_tokens // block_tokens)
        return self.max_blocks if self.max_blocks > 0 else 1 << 30

    def _block_tokens(self, state: CycleState) -> int:
        if self.auto_tune and state.candidates.size:
            tuned = float(state.snapshot.block_size[state.candidates[0]])  # one pool, one engine config
            if math.isfinite(tuned) and tuned > 0:
                return int(tuned)
        return self.block_tokens

    def _hasher(self, block_tokens: int) -> BlockHasher:
        hasher = self._hashers.get(block_tokens)
        if hasher is None:
            if len(self._hashers) >= 8:  # block sizes may come from scraped metrics: bound what they allocate
                self._hashers.clear()
            hasher = BlockHasher(block_tokens * BYTES_PER_TOKEN, self.block_cap(block_tokens))
            self._hashers[block_tokens] = hasher
        return hasher

    def produce(self, state: CycleState) -> None:
        tokens = tokenized(state)
        block_tokens = self._block_tokens(state)
        hasher = self._hasher(block_tokens)
        self.produce_keyed(state, hasher.hash_bytes(tokens.data, state.request.model).tolist(), block_tokens)

    def produce_keyed(self, state: CycleState, hashes: list[int], block_tokens: int) -> None:
        """`produce` with the prompt's chain keys of `block_tokens`-token blocks already computed: the precise
        producer's fallback passes its own block keys of the same blocks (one hashing per pick, not two)."""
        self.index.sync(state.snapshot)
        matched = self.index.match(hashes, state.snapshot.present.size) if hashes else _NO_MATCH
        reach = self.index.reach if hashes else 0
        state.scratch[self._key] = (hashes, matched, reach)
        if hashes:
            self.hit_ratio.observe(reach / len(hashes))
            self.hit_bytes.observe(reach * block_tokens * BYTES_PER_TOKEN)
        publish(state, self.name, PrefixMatch(matched, len(hashes), block_tokens))

    @property
    def scratch_key(self) -> str:
        """The pick's scratch key this pick's lookup is kept under: `lookup` is its `get` (a route receipt's
        compiled read, `epp.scheduling.receipt`, reads it by the key)."""
        return self._key

    def lookup(self, state: CycleState) -> tuple[list[int], FloatArray, int] | None:
        """This pick's lookup (the prompt's block hashes, blocks matched per slot, the longest match), if it ran."""
        cached: tuple[list[int], FloatArray, int] | None = state.scratch.get(self._key)
        return cached

    def picked(self, state: CycleState, slot: int) -> None:
        cached = state.scratch.get(self._key)
        if cached is None or not cached[0]:
            return
        hashes, matched, reach = cached
        snapshot = state.snapshot
        self.index.add(
            slot, snapshot.addresses[slot], hashes, int(matched[slot]), self._capacity(snapshot, slot), reach
        )
        if self.on_pick is not None:
            self.on_pick(slot, hashes)

    def learn(self, snapshot: Snapshot, slot: int, hashes: list[int]) -> bool:
        """A pick another serving worker made (from the shared pick log): `slot` now holds `hashes`, recorded as if
        this producer had seen it. A slot not in `snapshot` is ignored. False: the index is as it was
        (`learn_pick`)."""
        return learn_pick(self.index, snapshot, slot, hashes, self.auto_tune)

    def learning(self, snapshot: Snapshot) -> Callable[[int, list[int]], bool]:
        """`learn` over `snapshot`, as a call of (slot, hashes): one refresh's picks (`pick_learner`)."""
        return pick_learner(self.index, snapshot, self.auto_tune)

    def _capacity(self, snapshot: Snapshot, slot: int) -> int:
        return slot_capacity(self.index, snapshot, slot, self.auto_tune)


class InflightLoadProducer:
    """`inflight-load-producer`: this picker's requests and prompt tokens in flight per endpoint (booked at the
    pick, released when the response ends: `EndpointTable.book_pick` / `release_pick`), and the request's own
    prompt tokens (what it adds wherever it goes)."""

    type_name = "inflight-load-producer"
    ORDER: ClassVar[int] = 5

    def __init__(self, name: str = "inflight-load-producer") -> None:
        self.name = name

    def produce(self, state: CycleState) -> None:
        snapshot = state.snapshot
        publish(state, self.name, InflightLoad(snapshot.inflight, snapshot.inflight_tokens, tokenized(state).n_tokens))


def inflight_load(state: CycleState, producer: str) -> InflightLoad:
    """The named in-flight producer's data; the table's own counts when it did not run (upstream auto-creates
    the default producer for its consumers)."""
    load: InflightLoad | None = produced(state, producer)
    if load is None:
        snapshot = state.snapshot
        load = InflightLoad(snapshot.inflight, snapshot.inflight_tokens, tokenized(state).n_tokens)
        publish(state, producer, load)
    return load


class SessionBinding:
    """A session id and the address its session was last routed to (None: no binding yet)."""

    __slots__ = ("address", "session_id")

    def __init__(self, session_id: str, address: str | None) -> None:
        self.session_id = session_id
        self.address = address


class SessionIdProducer:
    """`session-id-producer`: the session id from `headerName` (default x-session-id) or a cookie, and the endpoint
    the session was bound to by an earlier pick. Bindings: newest `lruSize` (1024), each expiring `ttl` (30 min)
    after its last use, refreshed on every read and write (upstream's `dataproducer/sessionid`)."""

    type_name = "session-id-producer"
    ORDER: ClassVar[int] = 5

    def __init__(
        self,
        name: str = "session-id-producer",
        header: str | None = "x-session-id",
        cookie: str | None = None,
        lru_size: int = 1024,
        ttl_s: float = 1800.0,
    ) -> None:
        self.name = name
        self.header = header.lower() if header else None
        self.cookie = cookie
        self.lru_size = lru_size
        self.ttl_s = ttl_s
        self._bindings: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def session_id(self, state: CycleState) -> str | None:
        headers = state.request.headers
        if self.header is not None:
            return headers.get(self.header) or None
        for part in headers.get("cookie", "").split(";"):
            key, _, value = part.strip().partition("=")
            if key == self.cookie and value:
                return value
        return None

    def produce(self, state: CycleState) -> None:
        sid = self.session_id(state)
        if sid is None:
            return
        address = None
        entry = self._bindings.get(sid)
        if entry is not None:
            if state.now - entry[1] > self.ttl_s:
                del self._bindings[sid]
            else:
                address = entry[0]
                self._bindings[sid] = (address, state.now)
                self._bindings.move_to_end(sid)
        publish(state, self.name, SessionBinding(sid, address))

    def picked(self, state: CycleState, slot: int) -> None:
        binding: SessionBinding | None = produced(state, self.name)
        if binding is None:
            return
        bindings = self._bindings
        bindings[binding.session_id] = (state.snapshot.addresses[slot], state.now)
        bindings.move_to_end(binding.session_id)
        while len(bindings) > self.lru_size:
            bindings.popitem(last=False)


class _Burst:
    """One prompt group inside the window: when it started, requests per endpoint, the endpoint it fills now."""

    __slots__ = ("counts", "current", "started")

    def __init__(self, started: float) -> None:
        self.started = started
        self.counts: dict[str, int] = {}
        self.current: str | None = None


class BurstPrefixCacheProducer:
    """`burst-prefix-cache-producer` (alpha): co-locates a burst of prompt-sharing requests (e.g. the n samples of
    an RL rollout group) instead of scattering them over cold caches, where every prefix score is 0 and load
    balancing spreads them (upstream's herding complaint, llm-d-router #1726).

    Parameters as upstream (`dataproducer/burstprefix/README.md`): windowDurationMs 100, maxPerReplica −1 (whole
    group on one replica), blockSizeTokens 64, maxPrefixTokensToMatch 0 (the default cap), minColocateBlocks 0.
    Upstream holds each request for up to the window and assigns the batch jointly; here the decision is online and
    adds no latency: the first request of a group goes where the other scorers send it, and later requests with the
    same prefix inside the window get a full match on that endpoint (the next least-loaded one once it holds
    maxPerReplica of the group). With minColocateBlocks > 0 a request sharing that many leading blocks with a group
    of the window joins it. Publishes a PrefixMatch for `prefix-cache-scorer` (prefixMatchInfoProducerName).
    """

    type_name = "burst-prefix-cache-producer"
    ORDER: ClassVar[int] = 10
    MAX_GROUPS = 10_000

    def __init__(
        self,
        name: str = "burst-prefix-cache-producer",
        window_s: float = 0.1,
        max_per_replica: int = -1,
        block_tokens: int = 64,
        max_tokens: int = 0,
        min_colocate_blocks: int = 0,
    ) -> None:
        self.name = name
        self.window_s = window_s
        self.max_per_replica = max_per_replica
        self.block_tokens = block_tokens
        self.min_colocate_blocks = min_colocate_blocks
        max_blocks = max_tokens // block_tokens if max_tokens > 0 else 2048
        self._hasher = BlockHasher(block_tokens * BYTES_PER_TOKEN, max(1, max_blocks))
        self._groups: OrderedDict[int, _Burst] = OrderedDict()  # by start time, oldest first
        self._by_prefix: dict[int, int] = {}  # hash of the first minColocateBlocks blocks → group key
        self._key = f"burst:{name}"

    def _expire(self, now: float) -> None:
        groups = self._groups
        while groups:
            group = next(iter(groups.values()))
            if now - group.started <= self.window_s and len(groups) <= self.MAX_GROUPS:
                break
            groups.popitem(last=False)
        if len(self._by_prefix) > 2 * len(groups):
            self._by_prefix = {h: k for h, k in self._by_prefix.items() if k in groups}

    def _target(self, state: CycleState, group: _Burst) -> str | None:
        current = group.current
        k = self.max_per_replica
        if current is not None and (k < 0 or group.counts.get(current, 0) < k):
            return current
        snapshot = state.snapshot
        candidates = state.candidates
        if candidates.size == 0:
            return None
        load = np.asarray(state.take(snapshot.effective_queue(), candidates), dtype=np.float64)
        load = np.where(np.isnan(load), np.inf, load)
        used = np.fromiter((snapshot.addresses[s] in group.counts for s in candidates.tolist()), dtype=np.bool_)
        if used.all():
            return current
        load[used] = np.inf
        return snapshot.addresses[int(candidates[int(np.argmin(load))])]

    def produce(self, state: CycleState) -> None:
        self._expire(state.now)
        tokens = tokenized(state)
        hashes = self._hasher.hash_bytes(tokens.data, state.request.model)
        size = state.snapshot.present.size
        matched = np.zeros(size)
        key: int | None = None
        if hashes.size:
            key = int(hashes[-1])
            group_key = key if key in self._groups else None
            m = self.min_colocate_blocks
            if group_key is None and m > 0 and hashes.size >= m:
                group_key = self._by_prefix.get(int(hashes[m - 1]))
                if group_key not in self._groups:
                    group_key = None
            if group_key is not None:
                target = self._target(state, self._groups[group_key])
                slot = None if target is None else _slot_of(state, target)
                if slot is not None:
                    matched[slot] = hashes.size
                key = group_key
        state.scratch[self._key] = (
            key,
            None
            if hashes.size == 0
            else int(hashes[self.min_colocate_blocks - 1])
            if 0 < self.min_colocate_blocks <= hashes.size
            else None,
        )
        publish(state, self.name, PrefixMatch(matched, int(hashes.size), self.block_tokens))

    def picked(self, state: CycleState, slot: int) -> None:
        cached = state.scratch.get(self._key)
        if cached is None or cached[0] is None:
            return
        key, prefix_hash = cached
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Burst(state.now)
            if prefix_hash is not None:
                self._by_prefix.setdefault(prefix_hash, key)
        address = state.snapshot.addresses[slot]
        group.counts[address] = group.counts.get(address, 0) + 1
        group.current = address


def _slot_of(state: CycleState, address: str) -> int | None:
    addresses = state.snapshot.addresses
    for slot in state.candidates.tolist():
        if addresses[slot] == address:
            return int(slot)
    return None

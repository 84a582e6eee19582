"""vLLM's KV-cache event batches, decoded from msgpack: every encoding vLLM has shipped, and nothing that crashes.

The wire (vLLM `vllm/distributed/kv_events.py`): a batch `KVEventBatch[ts, events, data_parallel_rank]` whose
events are `BlockStored`, `BlockRemoved` and `AllBlocksCleared`, msgspec structs with `omit_defaults` (trailing
fields left at their defaults are not sent). Older engines encode batch and events as arrays with the tag first
(`array_like=True, tag=True`); newer ones (vllm#42892) as maps with the tag under `"type"`. Block hashes are bytes
(sha256 digests) or int64 (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`).

How: one typed msgspec decode per batch (array-like or map, picked by the first byte), which validates in C and
costs about a microsecond per event. When it refuses a batch (a malformed event, a field of the wrong type, a future
field we do not know about in the middle of an array), the batch is decoded again without a schema and walked event
by event in Python: the good events survive, each bad one is counted in `Batch.skipped` and dropped. Only a payload
that is not a batch at all raises `MalformedBatch`. The benchmark (benchmarks/kv_events.py) measured msgspec's typed
decode against msgpack's `unpackb` plus this walk; RESULTS.md has the figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, cast

import msgspec

Hash = int | bytes


class BlockStored(msgspec.Struct, array_like=True, tag=True, omit_defaults=True, gc=False):
    """Blocks the engine computed and now caches, in chain order; `token_ids` cover all of them."""

    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(msgspec.Struct, array_like=True, tag=True, omit_defaults=True, gc=False):
    """Blocks the engine evicted."""

    block_hashes: list[Hash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, array_like=True, tag=True, omit_defaults=True, gc=False):
    """The engine dropped its whole prefix cache (`POST /reset_prefix_cache`, a weight update)."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


class _BatchArray(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None


class Batch(msgspec.Struct, gc=False):
    """A decoded batch: its events in order, and how many malformed ones were dropped."""

    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None
    skipped: int = 0


# The map-encoded variant: the same fields, the tag under "type". Subclasses, so `isinstance` sees one type.
class _BlockStoredMap(BlockStored, array_like=False, tag="BlockStored", tag_field="type"):
    pass


class _BlockRemovedMap(BlockRemoved, array_like=False, tag="BlockRemoved", tag_field="type"):
    pass


class _AllBlocksClearedMap(AllBlocksCleared, array_like=False, tag="AllBlocksCleared", tag_field="type"):
    pass


class _BatchMap(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[_BlockStoredMap | _BlockRemovedMap | _AllBlocksClearedMap]
    data_parallel_rank: int | None = None


class MalformedBatch(ValueError):
    """The payload is not an event batch in any encoding we know."""


_ARRAY: Final = msgspec.msgpack.Decoder(_BatchArray)
_MAP: Final = msgspec.msgpack.Decoder(_BatchMap)
_ANY: Final = msgspec.msgpack.Decoder()
_STORED_FIELDS: Final = BlockStored.__struct_fields__
_REMOVED_FIELDS: Final = BlockRemoved.__struct_fields__
MAX_HASH_BYTES: Final = 64


def decode_batch(payload: bytes) -> Batch:
    """One `KVEventBatch` payload; raises `MalformedBatch` when it is not a batch, never anything else."""
    first = payload[:1]
    # fixmap 0x80-0x8f, map16 0xde, map32 0xdf; anything else is tried as an array first
    is_map = bool(first) and (0x80 <= first[0] <= 0x8F or first[0] in (0xDE, 0xDF))
    try:
        if is_map:
            m = _MAP.decode(payload)
            return Batch(m.ts, list(m.events), m.data_parallel_rank)
        a = _ARRAY.decode(payload)
        return Batch(a.ts, a.events, a.data_parallel_rank)
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass
    try:
        raw = _ANY.decode(payload)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise MalformedBatch(f"not msgpack: {exc}") from None
    return _walk_batch(raw)


def _walk_batch(raw: object) -> Batch:
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    else:
        raise MalformedBatch("a batch is [ts, events, data_parallel_rank] or a map of those")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not isinstance(events, list):
        raise MalformedBatch("batch needs a numeric ts and a list of events")
    if rank is not None and not _is_int(rank):
        rank = None
    good: list[Event] = []
    for item in events:
        event = _walk_event(item)
        if event is not None:
            good.append(event)
    return Batch(float(ts), good, rank, skipped=len(events) - len(good))


def _walk_event(item: object) -> Event | None:
    if isinstance(item, list) and item and isinstance(item[0], str):
        tag, values = item[0], item[1:]
    elif isinstance(item, dict) and isinstance(item.get("type"), str):
        tag = item["type"]
        names = _STORED_FIELDS if tag == "BlockStored" else _REMOVED_FIELDS if tag == "BlockRemoved" else ()
        values = [item.get(n) for n in names]
    else:
        return None
    if tag == "BlockStored":
        return _stored(values)
    if tag == "BlockRemoved":
        return _removed(values)
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _at(values: Sequence[object], i: int) -> object:
    return values[i] if i < len(values) else None


def _stored(v: Sequence[object]) -> BlockStored | None:
    if len(v) < 4:
        return None
    hashes, parent, tokens, size = v[0], v[1], v[2], v[3]
    if not _hashes(hashes) or not (parent is None or _hash(parent)):
        return None
    if not isinstance(tokens, list) or not all(_is_int(t) for t in tokens):
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return None
    lora_id, medium, lora_name, extra, group, kind, window = (_at(v, i) for i in range(4, 11))
    if not (_opt_int(lora_id) and _opt_str(medium) and _opt_str(lora_name) and _opt_int(group)):
        return None
    if not (_opt_str(kind) and _opt_int(window)) or not (extra is None or isinstance(extra, list)):
        return None
    # every field was type-checked above; the casts only tell mypy so
    return BlockStored(
        cast(list[Hash], hashes),
        cast(Hash | None, parent),
        tokens,
        size,
        cast(int | None, lora_id),
        cast(str | None, medium),
        cast(str | None, lora_name),
        extra,
        cast(int | None, group),
        cast(str | None, kind),
        cast(int | None, window),
    )


def _removed(v: Sequence[object]) -> BlockRemoved | None:
    if not v or not _hashes(v[0]):
        return None
    medium, group = _at(v, 1), _at(v, 2)
    if not (_opt_str(medium) and _opt_int(group)):
        return None
    return BlockRemoved(cast(list[Hash], v[0]), cast(str | None, medium), cast(int | None, group))


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _opt_int(x: object) -> bool:
    return x is None or _is_int(x)


def _opt_str(x: object) -> bool:
    return x is None or isinstance(x, str)


def _hash(x: object) -> bool:
    return _is_int(x) or (isinstance(x, bytes) and 0 < len(x) <= MAX_HASH_BYTES)


def _hashes(x: object) -> bool:
    return isinstance(x, list) and all(_hash(h) for h in x)


_MASK: Final = (1 << 64) - 1


def engine_key(h: Hash) -> int:
    """An engine block hash as one unsigned 64-bit key: an int as its two's complement, bytes by their last 8
    (big-endian), as upstream reads them. Engine hashes are opaque: they only name blocks in later events."""
    if isinstance(h, bytes):
        return int.from_bytes(h[-8:], "big")
    return h & _MASK

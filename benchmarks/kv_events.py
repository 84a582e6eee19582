"""KV events: decoder choice, what one feeder process sustains, index memory, and the lookup cost at 64 endpoints.

    .venv/bin/python -m benchmarks.kv_events [--seconds S] [--blocks N] [--only decode,feeder,memory,lookup,pick]

Sections (all side by side in one run; the machine is shared, so compare ratios):
- decode: µs per batch for the same payloads through msgspec's typed decode (what `epp.kvevents.decode` does),
  msgspec untyped + the Python walk (its fallback), and msgpack's `unpackb` + the same walk. Batches as vLLM sends
  them during a busy step: 16 `BlockStored` of 4 blocks (64 token ids) and 4 `BlockRemoved`, array-like, int hashes.
- feeder: block events per second through decode + index, on one core, in this process (`decode_batch` +
  `KvBlockIndex.apply` over 64 endpoints with chains that continue earlier events and with removals); and decode +
  index over real ZMQ on loopback: a publisher child process sends pre-encoded batches and the `Feeder` polls them.
  Each twice: without and `_with_table`, the shared-memory table's `TableWriter` mirroring the index into real
  segments, as the feeder child (`epp.app.kv_feeder`) runs: the `_with_table` rows are the child's rate.
- memory: tracemalloc bytes held by the index per block stored, at `--blocks` blocks over 64 endpoints.
- lookup: µs per pick at 64 endpoints: `request_keys` (token ids → keys, once per request, from a Python list or
  from a uint64 array) and `match` (the longest prefix of all 64 endpoints) for 1k/4k/16k-token prompts whose first
  half is cached on 8 of the endpoints; and the same answer from the shared-memory table (`epp.kvevents.shared`,
  vectorised probes); the best of many 5-call rounds (a round must fit in one scheduler slice on a loaded box).
- pick: the serving path's own cost per request at 64 endpoints, 1k and 4k tokens: the render response parsed into
  token ids (`epp.director.tokens`), and the pick's producers (`token-producer` vllm + `precise-prefix-cache-
  producer`, its approximate fallback included) over the shared-memory table, as `epp serve` reads it
  (`KvFeederProcess` over a real segment): once with the table nearly empty (`pick_64_endpoints_us`, only the
  64 endpoints' halves of this prompt) and once 40 % full (`..._full_table_us`: other prompts' blocks of the same
  endpoints), the load a table keeps once it holds more than 16k blocks (it is rebuilt at half full).
The key function and the table lookup have two implementations (`epp.kvevents.kernels`): the compiled kernels,
when built, and the numpy definition. Their cells are measured for both in the same run, the numpy ones named
`..._numpy_us` (an object built while `kernels.NATIVE` is None uses numpy).
Bounded: each timed loop runs at most `--seconds` (default 3); the ZMQ section sends at most 20,000 batches.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import multiprocessing as mp
import os
import platform
import random
import statistics
import time
import timeit
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import msgspec
import numpy as np
import zmq

from epp.kvevents import kernels
from epp.kvevents.decode import BlockRemoved, BlockStored, _walk_batch, decode_batch
from epp.kvevents.feeder import Feeder, FeederSettings, KvSource
from epp.kvevents.index import KvBlockIndex
from epp.kvevents.shared import TableWriter
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling.framework import CycleState
from epp.scheduling.precise import PrecisePrefixCacheProducer
from epp.scheduling.producers import TokenProducer

ENDPOINTS = 64
BLOCK = 16
STORES_PER_BATCH, BLOCKS_PER_STORE, REMOVES_PER_BATCH = 16, 4, 4


class _Wire(msgspec.Struct, array_like=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


def make_batches(n: int, seed: int) -> tuple[list[bytes], int]:
    """n payloads for one endpoint: chains that continue across batches, and removals of older blocks."""
    rng = random.Random(seed)
    next_hash = seed * 10**9 + 1
    tips: list[int] = []  # chain ends that later stores continue
    stored: list[int] = []
    out: list[bytes] = []
    blocks = 0
    for _ in range(n):
        events: list[Any] = []
        for _ in range(STORES_PER_BATCH):
            parent = tips.pop(rng.randrange(len(tips))) if tips and rng.random() < 0.7 else None
            hashes = list(range(next_hash, next_hash + BLOCKS_PER_STORE))
            next_hash += BLOCKS_PER_STORE
            tokens = [rng.randrange(128_000) for _ in range(BLOCKS_PER_STORE * BLOCK)]
            events.append(BlockStored(hashes, parent, tokens, BLOCK, None, "GPU"))
            tips.append(hashes[-1])
            stored.extend(hashes)
            blocks += BLOCKS_PER_STORE
        for _ in range(REMOVES_PER_BATCH):
            if len(stored) > 64:
                events.append(BlockRemoved([stored.pop(0)], "GPU"))
                blocks += 1
        if len(tips) > 64:
            tips = tips[-64:]
        out.append(msgspec.msgpack.encode(_Wire(time.time(), events, 0)))
    return out, blocks


def _time_loop(fn: Callable[[], None], seconds: float, max_calls: int) -> tuple[int, float]:
    calls, start = 0, time.perf_counter()
    while calls < max_calls and time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return calls, time.perf_counter() - start


def bench_decode(payloads: list[bytes], seconds: float) -> dict[str, Any]:
    untyped = msgspec.msgpack.Decoder()
    ways: dict[str, Callable[[bytes], object]] = {
        "msgspec_typed": decode_batch,
        "msgspec_untyped_walk": lambda p: _walk_batch(untyped.decode(p)),
        "msgpack_unpackb_walk": lambda p: _walk_batch(msgpack.unpackb(p, raw=False, strict_map_key=False)),
    }
    rounds: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(5):  # interleaved rounds, median: the box's load hits every way alike
        for name, fn in ways.items():

            def run(fn: Callable[[bytes], object] = fn) -> None:
                for p in payloads:
                    fn(p)

            calls, elapsed = _time_loop(run, seconds / 15, 10_000)
            rounds[name].append(elapsed / (calls * len(payloads)) * 1e6)
    med = {k: statistics.median(v) for k, v in rounds.items()}
    return {
        "us_per_batch": {k: round(v, 2) for k, v in med.items()},
        "msgpack_walk_over_msgspec_typed": round(med["msgpack_unpackb_walk"] / med["msgspec_typed"], 2),
        "payload_bytes": statistics.median(len(p) for p in payloads),
    }


def _with_table(index: KvBlockIndex) -> Callable[[], None]:
    """The shared-memory table mirrored from `index` into real segments, as the feeder child runs
    (`epp.app.kv_feeder`); returns the cleanup."""
    from epp.kvevents.publish import SegmentAllocator, new_directory

    directory = new_directory()
    segments = SegmentAllocator(directory, lambda generation, fd: None)  # the child's parent maps each table
    writer = TableWriter(index, segments, published=segments.published)

    def cleanup() -> None:
        nonlocal writer
        index.mirror = None
        del writer  # its table views the segments: free it before they close
        segments.close()
        os.close(directory)

    return cleanup


def bench_feeder_in_process(
    batches: dict[str, list[bytes]], blocks: int, seconds: float, table: bool = False
) -> dict[str, Any]:
    index = KvBlockIndex()
    cleanup = _with_table(index) if table else None
    names = list(batches)
    n = len(next(iter(batches.values())))
    start_cpu, start = time.process_time(), time.perf_counter()
    done_batches = 0
    for i in range(n):
        for name in names:
            index.apply(name, decode_batch(batches[name][i]), 0.0)
            done_batches += 1
        if time.perf_counter() - start > seconds:
            break
    cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start
    events = blocks / n * done_batches  # `blocks`: block events in one endpoint's n batches
    if cleanup is not None:
        cleanup()
    return {
        "batches": done_batches,
        "block_events": int(events),
        "block_events_per_cpu_s": round(events / cpu),
        "block_events_per_wall_s": round(events / wall),
        "index_blocks": index.total_blocks(),
        "skipped": {k: v for k, v in index.counters.skipped.items() if v},
    }


def _publisher(port_q: Any, payloads: list[bytes], go: Any) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)  # never drop: the benchmark measures the subscriber
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    port_q.put(port)
    go.wait(30)
    # warm-up pings until the subscriber is joined, then the payloads once
    for seq, p in enumerate(payloads):
        pub.send_multipart([b"kv@bench@model", seq.to_bytes(8, "big"), p])
    time.sleep(2)
    pub.close(linger=1000)
    ctx.term()


def bench_feeder_zmq(
    payloads: list[bytes], blocks_per_batch: float, seconds: float, table: bool = False
) -> dict[str, Any]:
    port_q: Any = mp.Queue()
    go = mp.Event()
    child = mp.Process(target=_publisher, args=(port_q, payloads, go), daemon=True)
    child.start()
    port = port_q.get(timeout=30)
    index = KvBlockIndex()
    cleanup = _with_table(index) if table else None
    feeder = Feeder(index, FeederSettings(max_messages_per_poll=4096))
    feeder.update([KvSource("127.0.0.1:8000", "127.0.0.1", port=port)])
    for _ in range(20):
        feeder.poll(10)  # let the subscription reach the publisher
    go.set()
    start, start_cpu = time.perf_counter(), time.process_time()
    deadline = time.monotonic() + seconds + 20
    while time.monotonic() < deadline and feeder.stats()["127.0.0.1:8000"].batches < len(payloads):
        feeder.poll(100)
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    st = feeder.stats()["127.0.0.1:8000"]
    feeder.close()
    child.join(10)
    if cleanup is not None:
        cleanup()
    events = st.batches * blocks_per_batch
    return {
        "batches": st.batches,
        "gaps": st.gaps,
        "block_events_per_cpu_s": round(events / cpu) if cpu else None,
        "block_events_per_wall_s": round(events / wall) if wall else None,
    }


def bench_memory(total_blocks: int) -> dict[str, Any]:
    per_endpoint = total_blocks // ENDPOINTS
    rng = random.Random(3)
    tokens = [rng.randrange(128_000) for _ in range(BLOCK * 64)]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    index = KvBlockIndex(max_blocks_per_endpoint=per_endpoint)
    for e in range(ENDPOINTS):
        name = f"127.10.0.{e}:8000"
        h = e * 10**9
        parent = None
        for b in range(0, per_endpoint, 64):  # chains of 64 blocks, each endpoint's own tokens
            tokens[0] = e * 100_000 + b  # a different chain every time
            n = min(64, per_endpoint - b)
            index.apply(name, [BlockStored(list(range(h + b, h + b + n)), parent, tokens[: n * BLOCK], BLOCK)], 0.0)
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    blocks = index.total_blocks()
    writer = TableWriter(index, lambda _gen, nbytes: bytearray(nbytes))  # the same blocks as a shared-memory table
    table_bytes = 8 * (8 + writer.table.capacity * (1 + writer.table.words))
    return {
        "blocks": blocks,
        "bytes_per_block": round(held / blocks, 1),
        "mib_per_million_blocks": round(held / blocks * 1e6 / 2**20),
        "shared_table_bytes_per_block": round(table_bytes / blocks, 1),
    }


@contextlib.contextmanager
def numpy_kernels() -> Iterator[None]:
    """Objects built inside use the numpy code even where the compiled kernels are installed."""
    saved = kernels.NATIVE
    kernels.NATIVE = None
    try:
        yield
    finally:
        kernels.NATIVE = saved


def _numpy_twin(obj: Any) -> Any:
    """A shallow copy of a `BlockKeys` or `SharedBlockTable` (same arrays, same buffer) that runs the numpy code."""
    twin = copy.copy(obj)
    twin._native = None
    return twin


def _ways() -> list[tuple[str, Callable[[], contextlib.AbstractContextManager[None]]]]:
    """("", as installed) and, when the kernels run, ("_numpy", the numpy code) for side-by-side cells."""
    ways: list[tuple[str, Callable[[], contextlib.AbstractContextManager[None]]]] = [("", contextlib.nullcontext)]
    if kernels.NATIVE is not None:
        ways.append(("_numpy", numpy_kernels))
    return ways


def bench_lookup(seconds: float) -> dict[str, Any]:
    rng = random.Random(5)
    index = KvBlockIndex()
    writer = TableWriter(index, lambda _gen, nbytes: bytearray(nbytes))  # the shared-memory layout, in a bytearray
    out: dict[str, Any] = {}
    for tokens_n in (1024, 4096, 16384):
        prompt = [rng.randrange(128_000) for _ in range(tokens_n)]
        half = tokens_n // 2 // BLOCK
        for e in range(ENDPOINTS):
            name = f"127.10.0.{e}:8000"
            base = (tokens_n * 1000 + e) * 10**6
            if e < 8:  # the first half of the prompt cached here
                index.apply(
                    name, [BlockStored(list(range(base, base + half)), None, prompt[: half * BLOCK], BLOCK)], 0.0
                )
            else:  # something else of the same size
                other = [rng.randrange(128_000) for _ in range(half * BLOCK)]
                index.apply(name, [BlockStored(list(range(base, base + half)), None, other, BLOCK)], 0.0)
        keys = index.request_keys(prompt)
        assert sum(1 for v in index.match(keys).values() if v == half) == 8
        as_array = np.asarray(prompt, dtype=np.uint64)
        key_array = np.asarray(keys, dtype=np.uint64)
        table = writer.table
        names = index.slot_names()
        from_table = {names[i]: int(c) for i, c in enumerate(table.prefix_blocks(key_array)) if c}
        assert from_table == index.match(keys)
        block_keys = index.keys
        cells = {
            "request_keys_from_list_us": lambda p=prompt: index.request_keys(p),
            "request_keys_from_uint64_array_us": lambda a=as_array, b=block_keys: b.request_keys(a),
            "match_64_endpoints_us": lambda k=keys: index.match(k),
            "shared_table_64_endpoints_us": lambda k=key_array, t=table: t.prefix_blocks(k),
        }
        if kernels.NATIVE is not None:  # the same cells through the numpy code, side by side
            numpy_keys, numpy_table = _numpy_twin(block_keys), _numpy_twin(table)
            assert numpy_keys.request_keys(as_array).tolist() == keys
            assert numpy_table.prefix_blocks(key_array).tolist() == table.prefix_blocks(key_array).tolist()
            cells["request_keys_from_list_numpy_us"] = lambda p=prompt, b=numpy_keys: b.request_keys(p)
            cells["request_keys_from_uint64_array_numpy_us"] = lambda a=as_array, b=numpy_keys: b.request_keys(a)
            cells["shared_table_64_endpoints_numpy_us"] = lambda k=key_array, t=numpy_table: t.prefix_blocks(k)
        row: dict[str, Any] = {"blocks": len(keys), "matched_blocks": half}
        for name, fn in cells.items():
            # best of many 5-call rounds: a round short enough to fit in a scheduler slice on a loaded box
            rounds = max(20, min(400, int(seconds / 45 / 5 / 50e-6)))
            row[name] = round(min(timeit.repeat(fn, number=5, repeat=rounds)) / 5 * 1e6, 1)
        out[f"{tokens_n}_tokens"] = row
    return out


FULL_TABLE = 0.4  # a table's load once it holds more than 16k blocks: rebuilt at half full, so 1/4 to 1/2


def _pick_case(
    rng: random.Random, tokens_n: int, fill: float
) -> tuple[Callable[[], None], bytes, float, Callable[[], None]]:
    """The serving path's pick over a real shared-memory table whose slots are at least `fill` taken (other
    blocks of the same endpoints); returns (pick, render answer, the table's load, cleanup)."""
    from epp.app.kv_feeder import FeederStatus, KvFeederProcess
    from epp.datastore.table import EndpointInfo, EndpointTable
    from epp.director import tokens as render
    from epp.kvevents.publish import SegmentAllocator, TableReader, new_directory

    index = KvBlockIndex()
    directory = new_directory()  # real shared memory (memfd), as the feeder child publishes it
    reader = TableReader(directory)
    segments = SegmentAllocator(directory, reader.add)
    writer = TableWriter(index, segments, published=segments.published)
    table = EndpointTable()
    prompt = [rng.randrange(128_000) for _ in range(tokens_n)]
    half = tokens_n // 2 // BLOCK
    for e in range(ENDPOINTS):
        name = f"127.10.0.{e}:8000"
        table.upsert(EndpointInfo(address=name))
        ids = prompt[: half * BLOCK] if e < 8 else [rng.randrange(128_000) for _ in range(half * BLOCK)]
        index.apply(name, [BlockStored(list(range(e * 10**6, e * 10**6 + half)), None, ids, BLOCK)], 0.0)
    chain, first_capacity = 0, writer.table.capacity
    # other prompts' blocks, 64 at a time, until the table is `fill` taken; bounded: a writer that rebuilds larger
    # before reaching it (too long a probe) stops the filling at the load it keeps
    while writer.table._used < fill * writer.table.capacity and writer.table.capacity == first_capacity:
        e, chain = chain % ENDPOINTS, chain + 1
        ids = [rng.randrange(128_000) for _ in range(64 * BLOCK)]
        first = e * 10**6 + 10**5 + chain * 64
        index.apply(f"127.10.0.{e}:8000", [BlockStored(list(range(first, first + 64)), None, ids, BLOCK)], 0.0)
    load = writer.table._used / writer.table.capacity
    producer = PrecisePrefixCacheProducer(block_size=BLOCK)
    # the serving process's view (`epp serve`), told what the child's status message tells it
    view = KvFeederProcess(table, producer)
    view._reader = reader
    last = dict.fromkeys(index.endpoints(), 0.0)
    view._on_message(FeederStatus(writer.table.generation, list(index.slot_names()), last, {}, {}))
    producer.attach(view)
    tokenizer = TokenProducer(backend="vllm", model_name="m")
    body = json.dumps({"token_ids": prompt, "features": None}).encode()
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    request = InferenceRequest(
        request_id="r", api=ApiKind.COMPLETIONS, model="m", prompt="", token_ids=render._token_ids(raw)
    )
    snapshot = table.snapshot()

    def pick() -> None:
        state = CycleState(snapshot, snapshot.slots, request, 1.0)
        tokenizer.produce(state)
        producer.produce(state)

    state = CycleState(snapshot, snapshot.slots, request, 1.0)
    tokenizer.produce(state)
    producer.produce(state)
    assert producer.fallbacks == {"absent": 0, "stale": 0, "no_tokens": 0} and producer.precise_picks == 1
    assert state.scratch[f"precise-prefix:{producer.name}"][1].tolist() == [half] * 8 + [0] * (ENDPOINTS - 8)

    def cleanup() -> None:
        if view._reader is not None:  # the serving side lets go of its mapping first
            view._reader.close()
            view._reader = None
        index.mirror = None
        writer.table = None  # type: ignore[assignment]
        segments.close()
        os.close(directory)

    return pick, raw, load, cleanup


def bench_pick(seconds: float) -> dict[str, Any]:
    from epp.director import tokens as render

    rng = random.Random(6)
    out: dict[str, Any] = {}
    rounds = max(20, min(400, int(seconds / 45 / 5 / 50e-6)))
    for tokens_n in (1024, 4096):
        row: dict[str, Any] = {"blocks": tokens_n // BLOCK, "matched_blocks": tokens_n // 2 // BLOCK}
        for fill, cell in ((0.0, "pick_64_endpoints"), (FULL_TABLE, "pick_64_endpoints_full_table")):
            for way, built in _ways():  # as installed, then the numpy code (when the kernels run)
                with built():
                    pick, raw, load, cleanup = _pick_case(rng, tokens_n, fill)
                if not fill and not way:
                    row["render_parse_us"] = round(
                        min(timeit.repeat(lambda r=raw: render._token_ids(r), number=5, repeat=rounds)) / 5 * 1e6, 1
                    )
                row[f"{cell}{way}_us"] = round(min(timeit.repeat(pick, number=5, repeat=rounds)) / 5 * 1e6, 1)
                row[f"{cell}{way}_load"] = round(load, 3)
                cleanup()
        out[f"{tokens_n}_tokens"] = row
    return out


def bench_feeder(seconds: float) -> dict[str, dict[str, Any]]:
    """The feeder rows: in process and over real ZMQ, each without and with the shared-memory table."""
    batches: dict[str, list[bytes]] = {}
    for e in range(ENDPOINTS):
        batches[f"127.10.0.{e}:8000"], blocks = make_batches(60, e + 1)
    zmq_batches, zmq_blocks = make_batches(5000, 99)
    per_batch = zmq_blocks / len(zmq_batches)
    return {
        "feeder_in_process": bench_feeder_in_process(batches, blocks, seconds),
        "feeder_in_process_with_table": bench_feeder_in_process(batches, blocks, seconds, table=True),
        "feeder_zmq": bench_feeder_zmq(zmq_batches, per_batch, seconds),
        "feeder_zmq_with_table": bench_feeder_zmq(zmq_batches, per_batch, seconds, table=True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    sections: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
        "decode": lambda a: {"decode": bench_decode(make_batches(200, 1)[0], a.seconds)},
        "feeder": lambda a: bench_feeder(a.seconds),
        "memory": lambda a: {"memory": bench_memory(a.blocks)},
        "lookup": lambda a: {"lookup": bench_lookup(a.seconds)},
        "pick": lambda a: {"pick": bench_pick(a.seconds)},
    }
    parser.add_argument(
        "--only", default="", help=f"comma list of sections to run: {', '.join(sections)} (default: all)"
    )
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(
        f"# benchmarks/kv_events.py on {os.cpu_count()} CPUs, python {platform.python_version()}, load {load:.1f}, "
        f"kernels {kernels.name()}"
    )
    only = [s.strip() for s in args.only.split(",") if s.strip()] or list(sections)
    for name in only:
        for row, result in sections[name](args).items():
            print(f"{row}:", json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

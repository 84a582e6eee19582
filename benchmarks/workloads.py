"""Workloads for the quality benchmark: synthetic shared-prefix groups and real traces (Azure CSV, Mooncake JSONL).

A workload is a list of `Item`s: arrival time (seconds, before rate scaling), token counts, and the ids of the
prompt's leading 512-token units. Equal unit ids at equal positions mean equal text: `prompt_text` turns the ids
into synthetic text deterministically (4 characters per token, the simulator's tokenizer), so the picker's prefix
hashing sees exactly the sharing the trace records, and `sim_request` turns them into chain hashes for the engine.
Text is built only for the policies that read it, from short repeated tokens: cheap.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from epp.sim.engine import SimRequest

UNIT_TOKENS = 512  # Mooncake's hash-id block; also the unit of the synthetic groups
CHARS_PER_TOKEN = 4
MAX_CONTEXT = 131_072  # Llama-3.1's context window: longer trace requests are clipped to it
TRACES = Path(__file__).resolve().parent / "data" / "traces"  # sources and licences: data/SOURCES.md
WORKLOADS = ("shared-prefix", "azure-conv", "azure-code", "mooncake", "mooncake-arxiv", "mooncake-conversation")


@dataclass(frozen=True, slots=True)
class Item:
    arrival: float
    prompt_tokens: int
    output_tokens: int
    units: tuple[int, ...] = ()  # ids of the leading UNIT_TOKENS-token units (positional, as Mooncake's hash_ids)


def _clip(prompt: int, output: int) -> tuple[int, int]:
    output = max(1, min(output, 4096))
    return max(1, min(prompt, MAX_CONTEXT - output)), output


def shared_prefix(
    n: int,
    groups: int = 256,
    prefix_tokens: int = 8192,
    question_tokens: int = 256,
    output_tokens: int = 256,
    seed: int = 0,
) -> list[Item]:
    """`groups` customers, each with its own `prefix_tokens` context, asking unique questions (Poisson, rate 1/s).

    Sized after llm-d's prefix-cache benchmark (150 customers × 6k-token contexts), scaled so the prefixes'
    working set (256 × 8k = 2.1M tokens) exceeds one reference server's KV cache (458k) but fits 16 of them.
    """
    rng = np.random.default_rng(seed)
    per_group = prefix_tokens // UNIT_TOKENS
    gaps = rng.exponential(1.0, n)
    picks = rng.integers(0, groups, n)
    t = np.cumsum(gaps)
    return [
        Item(
            float(t[i]),
            prefix_tokens + question_tokens,
            output_tokens,
            tuple(int(g) * 1000 + u for u in range(per_group)),
        )
        for i, g in enumerate(picks)
    ]


def _azure(path: Path, n: int | None) -> list[Item]:
    items: list[Item] = []
    t0: datetime | None = None
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            stamp = datetime.fromisoformat(row["TIMESTAMP"][:26])
            t0 = t0 or stamp
            prompt, output = _clip(int(row["ContextTokens"]), int(row["GeneratedTokens"]))
            items.append(Item((stamp - t0).total_seconds(), prompt, output))  # no prefix ids in Azure's traces
            if n is not None and len(items) >= n:
                break
    return items


def _mooncake(path: Path, n: int | None) -> list[Item]:
    items: list[Item] = []
    with path.open() as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            prompt, output = _clip(int(row["input_length"]), int(row["output_length"]))
            full_units = prompt // UNIT_TOKENS  # the last, partial block is never shared
            ids = tuple(int(h) for h in row.get("hash_ids", ())[:full_units])
            items.append(Item(float(row["timestamp"]) / 1000.0, prompt, output, ids))
            if n is not None and len(items) >= n:
                break
    return items


def load_trace(path: Path, n: int | None = None) -> list[Item]:
    """Any file in the Azure CSV (TIMESTAMP, ContextTokens, GeneratedTokens) or Mooncake JSONL format."""
    with path.open() as f:
        first = f.readline().strip()
    if first.startswith("{"):
        return _mooncake(path, n)
    if "ContextTokens" in first:
        return _azure(path, n)
    raise ValueError(f"{path}: neither Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens) nor Mooncake JSONL")


def load(name: str, n: int, trace: Path | None = None, seed: int = 0) -> list[Item]:
    if trace is not None:
        return load_trace(trace, n)
    if name == "shared-prefix":
        return shared_prefix(n, seed=seed)
    files = {
        "azure-conv": "AzureLLMInferenceTrace_conv.csv",
        "azure-code": "AzureLLMInferenceTrace_code.csv",
        "mooncake": "mooncake-synthetic_trace.jsonl",
        "mooncake-arxiv": "mooncake-arxiv_trace.jsonl",  # a 1,000-request slice: at most 1,000 items
        "mooncake-conversation": "mooncake-conversation_trace.jsonl",  # its first 268 requests: at most 268 items
    }
    if name not in files:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return load_trace(TRACES / files[name], n)


def scaled_arrivals(items: Sequence[Item], rate: float) -> np.ndarray:
    """Arrival times compressed or stretched so the mean rate is `rate` req/s, keeping the trace's burstiness."""
    t = np.array([i.arrival for i in items], dtype=np.float64)
    t -= t[0]
    span = t[-1]
    if span <= 0:
        return np.arange(len(items), dtype=np.float64) / rate
    return t * ((len(items) - 1) / rate / span)


def _chain(units: Sequence[int]) -> tuple[int, ...]:
    out: list[int] = []
    h = 0
    for u in units:
        h = hash((h, u))
        out.append(h)
    return tuple(out)


def sim_request(index: int, item: Item, unique_prefix: bool = False, with_tokens: bool = False) -> SimRequest:
    """The engine's view; `unique_prefix` drops all sharing (for measuring capacity without cache hits);
    `with_tokens` adds synthetic token ids (`item_token_ids`), which the engine's KV events then carry."""
    units = () if unique_prefix else _chain(item.units)
    ids = item_token_ids(index, item) if with_tokens and not unique_prefix else ()
    return SimRequest(
        index, item.prompt_tokens, item.output_tokens, prefix=units, unit_tokens=UNIT_TOKENS, token_ids=ids
    )


_UNIT_OFFSETS = np.arange(UNIT_TOKENS, dtype=np.int64)


def item_token_ids(index: int, item: Item) -> tuple[int, ...]:
    """Synthetic engine token ids: UNIT_TOKENS ids per unit, a function of the unit id alone (so equal unit
    sequences give equal token prefixes), then ids unique to the request up to its prompt length."""
    parts = [((u * 0x9E3779B1) & 0x3FFFFFFF) + _UNIT_OFFSETS for u in item.units]
    tail = item.prompt_tokens - len(item.units) * UNIT_TOKENS
    if tail > 0:
        parts.append((1 << 30) + ((index * 0x9E3779B1) & 0x1FFFFFFF) + np.arange(tail, dtype=np.int64) % (1 << 29))
    if not parts:
        return ()
    return tuple(np.concatenate(parts).tolist())


def prompt_text(index: int, item: Item) -> str:
    """Synthetic prompt text: each unit id spelled as 16-char words over 2,048 chars, then a unique tail."""
    reps = UNIT_TOKENS * CHARS_PER_TOKEN // 16
    parts = [f"u{u:014x} " * reps for u in item.units]
    tail_chars = (item.prompt_tokens - len(item.units) * UNIT_TOKENS) * CHARS_PER_TOKEN
    if tail_chars > 0:
        word = f"r{index:014x} "
        parts.append((word * (tail_chars // 16 + 1))[:tail_chars])
    return "".join(parts)


def working_set(items: Sequence[Item]) -> tuple[int, int]:
    """(distinct prefix units, units that recur) over the items, in UNIT_TOKENS-token units: the cacheable prefix
    blocks a pool would have to hold for every reuse to hit, and the part of it that is ever reused."""
    seen: dict[int, int] = {}
    for item in items:
        for h in _chain(item.units):
            seen[h] = seen.get(h, 0) + 1
    return len(seen), sum(1 for n in seen.values() if n > 1)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from epp.sim.profiles import H100_LLAMA_8B

    p = argparse.ArgumentParser(description="working set of the quality benchmark's workloads")
    p.add_argument("--workload", default="shared-prefix,mooncake")
    p.add_argument("--requests", type=int, default=4000)
    args = p.parse_args(argv)
    kv = H100_LLAMA_8B.num_blocks * H100_LLAMA_8B.block_size
    for name in args.workload.split(","):
        items = load(name.strip(), args.requests)
        distinct, recurring = working_set(items)
        print(
            f"{name}: {len(items)} requests; working set {distinct * UNIT_TOKENS / 1e6:.1f} M tokens"
            f" = {distinct * UNIT_TOKENS / kv:.1f} x one server's {kv // 1000}k-token KV cache;"
            f" reused part {recurring * UNIT_TOKENS / 1e6:.1f} M tokens = {recurring * UNIT_TOKENS / kv:.1f} x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

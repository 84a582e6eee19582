"""`epp inspect-metrics [--engine E] SOURCE`: what the picker reads from one model server's metrics page.

The operator's check that an engine's metric names match the mapping: prints the signals as one JSON object,
`null` where the page does not say. SOURCE is a file path or an http:// URL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from typing import Any
from urllib.parse import urlsplit

from epp.cli.flag_types import positive_duration
from epp.scrape.engines import EngineRegistry, extract
from epp.scrape.http import HttpConnection, ScrapeError

_MAX_BYTES = 64 * 1024 * 1024


def register(sub: Any) -> None:
    p = sub.add_parser("inspect-metrics", help="print the signals the picker reads from a metrics page, as JSON")
    p.add_argument("source", metavar="SOURCE", help="a file path or an http:// URL of a /metrics page")
    p.add_argument("--engine", default="vllm", help="engine mapping to read it with (default vllm)")
    p.add_argument("--timeout", type=positive_duration, default=5.0, help="how long to wait for a URL (default 5s)")
    p.set_defaults(func=run)


def _fetch(url: str, timeout_s: float) -> bytes:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ScrapeError(f"only http:// URLs are supported: {url}")
    path = parts.path or "/metrics"
    if parts.query:
        path += "?" + parts.query
    conn = HttpConnection(parts.hostname, parts.port or 80, path)

    async def get() -> bytes:
        try:
            return await conn.get(timeout_s, _MAX_BYTES)
        finally:
            conn.close()

    return asyncio.run(get())


def _num(x: float) -> float | None:
    return None if math.isnan(x) else x


def run(args: argparse.Namespace) -> int:
    source: str = args.source
    try:
        if "://" in source:
            body = _fetch(source, args.timeout)
        else:
            with open(source, "rb") as f:
                body = f.read(_MAX_BYTES + 1)
            if len(body) > _MAX_BYTES:
                raise ScrapeError(f"file larger than {_MAX_BYTES} bytes")
    except (OSError, ScrapeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"epp inspect-metrics: cannot read {source}: {reason}", file=sys.stderr)
        return 1
    engine = EngineRegistry().for_engine(args.engine)
    result = extract(body.decode("utf-8", errors="replace"), engine)
    s = result.sample
    out = {
        "engine": engine.name,
        "waiting": _num(s.waiting),
        "running": _num(s.running),
        "kv_cache_usage": _num(s.kv_usage),
        "running_lora_adapters": None if s.running_adapters is None else list(s.running_adapters),
        "waiting_lora_adapters": None if s.waiting_adapters is None else list(s.waiting_adapters),
        "max_lora": _num(s.max_lora),
        "block_size": _num(s.block_size),
        "num_blocks": _num(s.num_blocks),
        "problems": list(result.problems),
    }
    print(json.dumps(out))
    return 0

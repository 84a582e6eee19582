"""The metrics port: Prometheus `/metrics`, the operator's `/debug/pool`, and plain `/healthz` and `/readyz`.

`/metrics` is rendered in a worker thread: the collectors whose numbers live on the serving loop are frozen there
first (a copy of bounded size), then the text is built off the loop, so a large scrape never delays a decision.
With `--metrics-endpoint-auth`, `/metrics` and `/debug/pool` need an authorized bearer token (metrics_auth.py);
`/healthz` and `/readyz` stay open (probes).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from epp.app.metrics_auth import MetricsAuth
from epp.datastore import EndpointTable, Freshness, usable_slots
from epp.datastore.pool import PoolSpec
from epp.observability.collector import FreezableCollector
from epp.observability.stacks import dump_heap, dump_stacks


def _num(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def pool_report(
    table: EndpointTable,
    pool: PoolSpec | None,
    now: float,
    ready: bool,
    freshness: Freshness,
    extra: dict[str, Any] | None = None,
    scrape_status: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """What `/debug/pool` shows: the pool, and each endpoint with whether decisions use its data (`healthy`: the
    datastore's `usable` rule, the one the scorers and saturation apply), its latest metrics and scrape status
    (the last error, since when and why it is unusable)."""
    snap = table.snapshot()
    fresh = usable_slots(snap, now, freshness)
    endpoints = []
    for slot in snap.slots:
        info = snap.infos[slot]
        assert info is not None
        age = now - snap.scraped_at[slot]
        endpoints.append(
            {
                "address": info.address,
                "slot": int(slot),
                "engine": info.engine,
                "pod": info.pod_name,
                "labels": dict(info.labels),
                "healthy": bool(fresh[slot]),
                "metrics": {
                    "waiting": _num(snap.waiting[slot]),
                    "running": _num(snap.running[slot]),
                    "kvCacheUsage": _num(snap.kv_usage[slot]),
                    "maxLora": _num(snap.max_lora[slot]),
                    "blockSize": _num(snap.block_size[slot]),
                    "numBlocks": _num(snap.num_blocks[slot]),
                    "runningAdapters": sorted(snap.running_adapters[slot]),
                    "waitingAdapters": sorted(snap.waiting_adapters[slot]),
                },
                "metricsAgeSeconds": _num(age),
                "scrapeFailures": int(snap.scrape_failures[slot]),
                "inflight": int(snap.inflight[slot]),
                "scrape": (scrape_status or {}).get(info.address),
            }
        )
    endpoints.sort(key=lambda e: e["address"])
    report: dict[str, Any] = {
        "pool": None
        if pool is None
        else {
            "name": pool.name,
            "namespace": pool.namespace,
            "failureMode": pool.failure_mode.value,
            "selector": dict(pool.selector),
            "targetPorts": list(pool.target_ports),
        },
        "synced": table.synced,
        "ready": ready,
        "endpoints": endpoints,
    }
    if extra:
        report.update(extra)
    return report


def build_http_app(
    registry: CollectorRegistry,
    report: Callable[[], dict[str, Any]],
    ready: Callable[[], bool],
    loop_collectors: Sequence[FreezableCollector] = (),
    auth: MetricsAuth | None = None,
    stacks: bool = False,
    before_render: Callable[[], Awaitable[None]] | None = None,
) -> web.Application:
    """The metrics port's routes. `loop_collectors`: those of `registry` whose numbers the serving loop writes
    (frozen before rendering); `auth`: --metrics-endpoint-auth; `stacks` adds `/debug/stacks` (every thread and
    asyncio task, `--enable-pprof`); `before_render`, awaited before /metrics and /debug/pool are rendered (the
    serving workers' expositions asked for)."""

    async def denied(request: web.Request) -> web.Response | None:
        if auth is None:
            return None
        refusal = await auth.check(request.headers.get("Authorization", ""))
        if refusal is None:
            return None
        status, reason = refusal
        headers = {"WWW-Authenticate": 'Bearer realm="epp-metrics"'} if status == 401 else None
        return web.Response(status=status, text=reason + "\n", headers=headers)

    async def metrics(request: web.Request) -> web.Response:
        if (refused := await denied(request)) is not None:
            return refused
        if before_render is not None:
            await before_render()
        for collector in loop_collectors:
            collector.freeze()
        body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def debug_pool(request: web.Request) -> web.Response:
        if (refused := await denied(request)) is not None:
            return refused
        if before_render is not None:
            await before_render()
        return web.json_response(report(), dumps=_dumps)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ready\n") if ready() else web.Response(status=503, text="not ready\n")

    async def debug_stacks(request: web.Request) -> web.Response:
        if (refused := await denied(request)) is not None:
            return refused
        return web.Response(text=dump_stacks())

    async def debug_heap(request: web.Request) -> web.Response:
        if (refused := await denied(request)) is not None:
            return refused
        return web.Response(text=dump_heap())

    app = web.Application()
    if stacks:
        app.router.add_get("/debug/stacks", debug_stacks)
        app.router.add_get("/debug/heap", debug_heap)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/debug/pool", debug_pool)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=2)

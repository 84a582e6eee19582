"""What a pod event costs the Kubernetes source, and how soon the picker sees it.

Side by side in one run, on one pool of N pods:
  (a) incremental: each MODIFIED pod event updates only that pod's endpoints (what the source does);
  (b) full reconcile: the same events, each followed by a rebuild of the whole endpoint set (a naive source);
  (c) end to end through the fake API server and the real client: apply a pod change, wait until the table has it.
(a) and (b) are CPU per event on the event loop (the loop also serves ext_proc streams, so this is time taken from
requests); (c) is the delay from the API server's write to the picker's table, median and p99.

Run:
    .venv/bin/python -m benchmarks.k8s_discovery [--pods 1000] [--events 2000] [--changes 200]
Every loop is bounded by its count and by --max-seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from epp.cli.flag_types import positive_duration
from epp.datastore import EndpointTable
from epp.datastore.objectives import ObjectiveStore
from epp.discovery.kubernetes.settings import KubernetesSettings
from epp.discovery.kubernetes.source import KubernetesSource
from epp.discovery.kubernetes.watch import Changed, Listed, WatchOptions
from tests.discovery.k8s_objects import pod, pool
from tests.fakes.apiserver import FakeApiServer


def _ip(i: int) -> str:
    return f"127.{10 + i // 65536}.{(i // 256) % 256}.{i % 256 or 1}"


def cpu_per_event(pods: int, events: int, full: bool, max_seconds: float) -> float:
    """Microseconds per MODIFIED pod event handled by the source (optionally with a full rebuild after each)."""
    source = KubernetesSource(EndpointTable(), None, KubernetesSettings(pool_name="pool"))
    source._on_pool(Listed((pool(ports=(8000, 8001)),), "1"))
    objs = [pod(f"p{i}", ip=_ip(i)) for i in range(pods)]
    source._on_pods(Listed(tuple(objs), "1"))
    changes = [Changed("MODIFIED", pod(f"p{i % pods}", ip=_ip(i % pods), ready=i % 3 != 0)) for i in range(events)]
    started = time.perf_counter()
    done = 0
    for change in changes:
        source._on_pods(change)
        if full:
            source._rebuild()
        done += 1
        if time.perf_counter() - started > max_seconds:
            break
    return (time.perf_counter() - started) / done * 1e6


async def end_to_end(changes: int, max_seconds: float) -> list[float]:
    """Seconds from the API server applying a pod change to the picker's table showing it."""
    delays: list[float] = []
    with FakeApiServer() as api, tempfile.TemporaryDirectory() as tmp:
        api.apply(pool())
        kubeconfig = api.write_kubeconfig(Path(tmp) / "kubeconfig")
        table = EndpointTable()
        source = KubernetesSource(
            table,
            ObjectiveStore(),
            KubernetesSettings(pool_name="pool", kubeconfig=str(kubeconfig), watch=WatchOptions()),
        )
        await source.start()
        try:
            await source.wait_ready(10)
            deadline = time.monotonic() + max_seconds
            for i in range(changes):
                if time.monotonic() > deadline:
                    break
                address = f"{_ip(i)}:8000"
                started = time.perf_counter()
                await asyncio.to_thread(api.apply, pod(f"p{i}", ip=_ip(i)))
                while address not in table and time.monotonic() < deadline:
                    await asyncio.sleep(0.0005)
                delays.append(time.perf_counter() - started)
        finally:
            await source.stop()
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--max-seconds", type=positive_duration, default=60.0)
    args = parser.parse_args()
    incremental = cpu_per_event(args.pods, args.events, full=False, max_seconds=args.max_seconds)
    rebuild = cpu_per_event(args.pods, args.events, full=True, max_seconds=args.max_seconds)
    print(f"pool of {args.pods} pods x 2 target ports, {args.events} MODIFIED events")
    print(f"  (a) incremental      {incremental:9.1f} us/event")
    print(f"  (b) full reconcile   {rebuild:9.1f} us/event")
    print(f"  (b)/(a)              {rebuild / incremental:9.1f}x")
    delays = asyncio.run(end_to_end(args.changes, args.max_seconds))
    p99 = sorted(delays)[max(0, int(len(delays) * 0.99) - 1)]
    print(
        f"  (c) API write -> table, {len(delays)} changes: median {statistics.median(delays) * 1e3:.2f} ms, "
        f"p99 {p99 * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()

"""The process's own metrics: process_* (CPU, memory, fds), python_info and python_gc_*, and upstream's info
gauge with the build's commit and version."""

from __future__ import annotations

import os

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Gauge

from epp import __version__


def register_process_metrics(registry: CollectorRegistry) -> None:
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    for name in ("llm_d_epp_info", "inference_extension_info"):
        info = Gauge(name, "General information of the current build of the endpoint picker.", ["commit", "build_ref"],
                     registry=registry)  # fmt: skip
        info.labels(os.environ.get("EPP_COMMIT", "unknown"), __version__).set(1)

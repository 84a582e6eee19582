"""gRPC health on its own port, with upstream's service names.

`liveness` is SERVING while the process runs; `readiness`, `inference-extension` (the name upstream's chart probes)
and the ext_proc service name are SERVING only once the endpoint source has synced (and, with leader election, only
on the leader), so Kubernetes and gateways send traffic only to a picker that can decide.
"""

from __future__ import annotations

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]

from epp import wire

LIVENESS = "liveness"
READINESS = "readiness"
INFERENCE_EXTENSION = "inference-extension"  # what upstream's chart probes with one replica: served as readiness
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthState:
    def __init__(self) -> None:
        self.servicer = health_aio.HealthServicer()
        self.ready = False

    async def start(self) -> None:
        await self.servicer.set(LIVENESS, _SERVING)
        await self.set_ready(False)

    async def set_ready(self, ready: bool) -> None:
        self.ready = ready
        status = _SERVING if ready else _NOT_SERVING
        for name in ("", READINESS, INFERENCE_EXTENSION, wire.EXTPROC_SERVICE):
            await self.servicer.set(name, status)

    async def stopping(self) -> None:
        await self.servicer.enter_graceful_shutdown()

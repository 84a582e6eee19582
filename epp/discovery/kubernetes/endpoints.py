"""Which pods are endpoints of a pool, and at which addresses: upstream's rules, as pure functions.

A pod counts when its labels match the pool's `selector.matchLabels`, its Ready condition is True, it has no
deletionTimestamp (it is draining) and it has a podIP. It gives one endpoint per target port, `podIP:port`,
narrowed to the ports listed in the annotation `inference.networking.k8s.io/active-ports` when the pod has it.
The engine comes from the label `inference.networking.k8s.io/engine-type` (vllm when absent).

Pods are reduced to `PodView` on arrival so the cache holds a few fields per pod, not whole pod objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from epp.datastore.pool import PoolSpec
from epp.datastore.table import EndpointInfo
from epp.wire import ACTIVE_PORTS_ANNOTATION, ENGINE_LABEL

DEFAULT_ENGINE = "vllm"


@dataclass(frozen=True, slots=True)
class PodView:
    """The fields of a pod the endpoint rules read."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ip: str = ""
    ready: bool = False
    deleting: bool = False
    active_ports: frozenset[int] | None = None  # None: no annotation (all target ports)


def pod_view(pod: Mapping[str, Any]) -> PodView:
    """Reduce a pod object (a dict as the API returns it) to a PodView; tolerant of missing or odd fields."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    conditions = status.get("conditions") or []
    ready = any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return PodView(
        name=str(meta.get("name") or ""),
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {},
        ip=str(status.get("podIP") or ""),
        ready=ready,
        deleting=bool(meta.get("deletionTimestamp")),
        active_ports=_parse_ports(annotations.get(ACTIVE_PORTS_ANNOTATION))
        if isinstance(annotations, Mapping)
        else None,
    )


def _parse_ports(text: object) -> frozenset[int] | None:
    """The active-ports annotation: comma-separated port numbers; unparsable entries are ignored."""
    if not isinstance(text, str):
        return None
    ports = set()
    for part in text.split(","):
        part = part.strip()
        if part.isdigit() and 0 < int(part) <= 65535:
            ports.add(int(part))
    return frozenset(ports)


def join_host_port(ip: str, port: int) -> str:
    """`ip:port`, with IPv6 addresses in brackets as Go's net.JoinHostPort writes them."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"  # only IPv6 has colons; no parsing per endpoint


def endpoints_of(pod: PodView, pool: PoolSpec | None) -> tuple[EndpointInfo, ...]:
    """The endpoints one pod contributes to the pool (none when it does not count)."""
    if pool is None or not pod.ip or not pod.ready or pod.deleting or not pool.selects(pod.labels):
        return ()
    ports = pool.target_ports
    if pod.active_ports is not None:
        ports = tuple(p for p in ports if p in pod.active_ports)
    engine = pod.labels.get(ENGINE_LABEL) or DEFAULT_ENGINE
    return tuple(
        EndpointInfo(address=join_host_port(pod.ip, port), engine=engine, labels=pod.labels, pod_name=pod.name)
        for port in ports
    )


def pool_endpoints(pods: Iterable[PodView], pool: PoolSpec | None) -> list[EndpointInfo]:
    """Every endpoint of the pool, in a stable order (by pod name, then port order)."""
    out: list[EndpointInfo] = []
    for pod in sorted(pods, key=lambda p: p.name):
        out.extend(endpoints_of(pod, pool))
    return out

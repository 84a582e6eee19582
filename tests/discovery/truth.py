"""The endpoint set a picker should hold, computed straight from the fake API server's objects.

Written independently of epp.discovery (no shared code), so the scenario tests compare the picker with a second
reading of upstream's rules rather than with itself.
"""

from __future__ import annotations

from typing import Any

from tests.fakes.apiserver import FakeApiServer

ACTIVE_PORTS = "inference.networking.k8s.io/active-ports"


def expected_endpoints(api: FakeApiServer, pool_name: str = "pool", namespace: str = "default") -> set[str]:
    pool = api.get("inference.networking.k8s.io/v1", "InferencePool", namespace, pool_name)
    if pool is None:
        return set()
    selector = pool["spec"]["selector"]["matchLabels"]
    ports = [p["number"] for p in pool["spec"]["targetPorts"]]
    return endpoints_for(api.list("v1", "Pod"), selector, ports, namespace)


def endpoints_for(pods: list[dict[str, Any]], selector: dict[str, str], ports: list[int], namespace: str) -> set[str]:
    out: set[str] = set()
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status", {})
        if meta.get("namespace") != namespace or meta.get("deletionTimestamp"):
            continue
        labels = meta.get("labels", {})
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            continue
        if not any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])):
            continue
        ip = status.get("podIP")
        if not ip:
            continue
        wanted = ports
        annotation = meta.get("annotations", {}).get(ACTIVE_PORTS)
        if annotation is not None:
            active = {int(p) for p in annotation.split(",") if p.strip().isdigit()}
            wanted = [p for p in ports if p in active]
        out.update(f"{ip}:{p}" for p in wanted)
    return out

"""Builders for the objects the scenario tests put into the fake API server (loopback addresses only)."""

from __future__ import annotations

from typing import Any

from epp.wire import ACTIVE_PORTS_ANNOTATION, ENGINE_LABEL

NAMESPACE = "default"


def pod(
    name: str,
    ip: str | None = "127.10.0.1",
    labels: dict[str, str] | None = None,
    ready: bool = True,
    deleting: bool = False,
    active_ports: str | None = None,
    engine: str | None = None,
    namespace: str = NAMESPACE,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {"app": "vllm"})}
    if engine is not None:
        meta["labels"][ENGINE_LABEL] = engine
    if active_ports is not None:
        meta["annotations"] = {ACTIVE_PORTS_ANNOTATION: active_ports}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip is not None:
        status["podIP"] = ip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "server", "image": "model-server"}]},
        "status": status,
    }


def pool(
    name: str = "pool",
    selector: dict[str, str] | None = None,
    ports: tuple[int, ...] = (8000,),
    failure_mode: str = "FailClose",
    namespace: str = NAMESPACE,
) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": dict(selector or {"app": "vllm"})},
            "targetPorts": [{"number": p} for p in ports],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}, "failureMode": failure_mode},
        },
    }


def objective(name: str, priority: int | None, pool_name: str = "pool", group: str = "inference.networking.x-k8s.io"):
    spec: dict[str, Any] = {"poolRef": {"name": pool_name}}
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": f"{group}/v1alpha2",
        "kind": "InferenceObjective",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


def rewrite(
    name: str,
    source: str,
    targets: dict[str, int],
    pool_name: str = "pool",
    group: str = "inference.networking.x-k8s.io",
) -> dict[str, Any]:
    return {
        "apiVersion": f"{group}/v1alpha2",
        "kind": "InferenceModelRewrite",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "poolRef": {"name": pool_name},
            "rules": [
                {
                    "matches": [{"model": {"value": source}}],
                    "targets": [{"modelRewrite": m, "weight": w} for m, w in targets.items()],
                }
            ],
        },
    }

"""manifests/: every object validates, the pieces refer to each other, and RBAC grants exactly what the code calls.

- InferencePool / InferenceObjective / InferenceModelRewrite: jsonschema on the real CRDs' openAPIV3Schema (committed
  under tests/data/crds), with unknown fields rejected (the API server would silently prune them);
- core kinds: the `kubernetes` client's models (pydantic, unknown fields forbidden, types checked);
- RBAC: a picker (pool mode, objectives, leader election) runs against the fake API server; every call it made
  must be granted by the Roles, and every grant must be used by some call.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kubernetes import client as k8s

from epp.app.cores import default_workers, usable_cores
from epp.datastore import EndpointTable
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.pool import parse_pool
from epp.discovery.kubernetes.rest import KubeRest
from epp.discovery.kubernetes.settings import KubernetesSettings, LeaseTiming
from epp.discovery.kubernetes.source import KubernetesSource
from epp.discovery.kubernetes.watch import WatchOptions
from tests.conftest import ROOT
from tests.discovery.k8s_objects import objective, pod, pool, rewrite
from tests.fakes.apiserver import Call, FakeApiServer

MANIFESTS = ROOT / "manifests"

CRD_FILES = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inference.networking.k8s.io_inferencepools.yaml",
    (
        "inference.networking.x-k8s.io/v1alpha2",
        "InferenceObjective",
    ): "inference.networking.x-k8s.io_inferenceobjectives.yaml",
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceModelRewrite"): (
        "inference.networking.x-k8s.io_inferencemodelrewrites.yaml"
    ),
    ("llm-d.ai/v1alpha2", "InferenceObjective"): "llm-d.ai_inferenceobjectives.yaml",
    ("llm-d.ai/v1alpha2", "InferenceModelRewrite"): "llm-d.ai_inferencemodelrewrites.yaml",
    ("federation.llmkube.dev/v1alpha1", "FederatedCluster"): "federation.llmkube.dev_federatedclusters.yaml",
}
CORE_MODELS = {
    ("v1", "ServiceAccount"): k8s.V1ServiceAccount,
    ("v1", "Service"): k8s.V1Service,
    ("v1", "ConfigMap"): k8s.V1ConfigMap,
    ("apps/v1", "Deployment"): k8s.V1Deployment,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.V1Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.V1RoleBinding,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.V1ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.V1ClusterRoleBinding,
    ("policy/v1", "PodDisruptionBudget"): k8s.V1PodDisruptionBudget,
    ("v1", "Secret"): k8s.V1Secret,
}
# The Prometheus Operator's ServiceMonitor and PrometheusRule (manifests/monitoring, optional): no CRD vendored here;
# their fields are checked by test_the_monitoring_overlay_scrapes_with_an_authorized_token and
# tests/observability/test_alert_rules.py.
OPERATOR_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
# Prometheus's own files next to them (a rules file and its promtool test), not Kubernetes objects.
PROMETHEUS_FILES = {"epp-alerts.rules.yaml", "epp-alerts.test.yaml"}
# Gateway vendors' policy kinds live in manifests/gateways/ and are checked by tests/gateway/test_manifests.py.
VENDOR_GROUPS = {"gateway.envoyproxy.io", "networking.istio.io", "gateway.kgateway.dev"}
GATEWAY_KINDS = {("gateway.networking.k8s.io/v1", "Gateway"), ("gateway.networking.k8s.io/v1", "HTTPRoute")}


# -- a small `kustomize build`: resources (files and directories) and JSON 6902 patches -------------------------


def build(directory: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        assert path.exists(), f"{directory}/kustomization.yaml lists {entry}, which does not exist"
        if path.is_dir():
            objects.extend(build(path))
        else:
            objects.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    for patch in spec.get("patches", []):
        target = patch["target"]
        ops = yaml.safe_load((directory / patch["path"]).read_text())
        matched = [o for o in objects if o["kind"] == target["kind"] and o["metadata"]["name"] == target["name"]]
        assert matched, f"patch {patch['path']} matches nothing"
        for obj in matched:
            for op in ops:
                _json_patch(obj, op)
    return objects


def _json_patch(obj: dict[str, Any], op: dict[str, Any]) -> None:
    *parents, last = [int(p) if p.isdigit() else p for p in op["path"].strip("/").split("/")]
    node: Any = obj
    for key in parents:
        node = node[key]
    if op["op"] == "add" and last == "-":
        node.append(op["value"])
    elif op["op"] in ("add", "replace"):
        node[last] = op["value"]
    else:
        raise AssertionError(f"unsupported patch op {op}")


def all_objects() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{path.relative_to(MANIFESTS)}#{i}", doc)
        for path in sorted(MANIFESTS.rglob("*.yaml"))
        if path.name not in ("kustomization.yaml", "deployment-patch.yaml") and path.name not in PROMETHEUS_FILES
        for i, doc in enumerate(yaml.safe_load_all(path.read_text()))
        if doc
    ]


OBJECTS = all_objects()
CRD_OBJECTS = [(w, o) for w, o in OBJECTS if (o["apiVersion"], o["kind"]) in CRD_FILES]
CORE_OBJECTS = [(w, o) for w, o in OBJECTS if (o["apiVersion"], o["kind"]) in CORE_MODELS]


def strict_schema(schema: Any) -> Any:
    """The CRD schema with unknown fields rejected wherever the API server would prune them."""
    if isinstance(schema, dict):
        out = {k: strict_schema(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict_schema(v) for v in schema]
    return schema


def crd_schema(reference: Path, file: str, version: str) -> dict[str, Any]:
    crd = yaml.safe_load((reference / "crds" / file).read_text())
    [v] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return strict_schema(v["schema"]["openAPIV3Schema"])


# -- every object ------------------------------------------------------------------------------------------------


def test_every_manifest_is_a_kind_validated_here_or_a_gateway_vendors() -> None:
    known = set(CRD_FILES) | set(CORE_MODELS) | GATEWAY_KINDS | OPERATOR_KINDS
    kinds = [(where, (o.get("apiVersion"), o.get("kind"))) for where, o in OBJECTS]
    vendor = [k for k in kinds if str(k[1][0]).split("/")[0] in VENDOR_GROUPS]
    assert [k for k in kinds if k[1] not in known and k not in vendor] == []
    assert all(where.startswith("gateways/") for where, _ in vendor)


@pytest.mark.parametrize(("where", "obj"), CRD_OBJECTS, ids=[w for w, _ in CRD_OBJECTS])
def test_inference_objects_validate_against_the_real_crds(where: str, obj: dict[str, Any], reference_data) -> None:
    key = (obj["apiVersion"], obj["kind"])
    schema = crd_schema(reference_data, CRD_FILES[key], obj["apiVersion"].split("/")[1])
    jsonschema.validate(obj, schema)
    if obj["kind"] == "InferencePool":
        parse_pool(obj, where)


def test_the_crd_check_catches_a_typo(reference_data) -> None:
    schema = crd_schema(reference_data, CRD_FILES[("inference.networking.k8s.io/v1", "InferencePool")], "v1")
    bad = copy.deepcopy(pool())
    bad["spec"]["targetPort"] = bad["spec"].pop("targetPorts")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


@pytest.mark.parametrize(("where", "obj"), CORE_OBJECTS, ids=[w for w, _ in CORE_OBJECTS])
def test_core_objects_validate_against_the_client_models(where: str, obj: dict[str, Any]) -> None:
    CORE_MODELS[(obj["apiVersion"], obj["kind"])].model_validate(obj)


def test_the_model_check_catches_a_typo() -> None:
    deployment = next(o for _, o in OBJECTS if o["kind"] == "Deployment" and o["metadata"]["name"] == "epp")
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True
    with pytest.raises(ValueError):
        k8s.V1Deployment.model_validate(bad)


# -- the pieces fit together -------------------------------------------------------------------------------------


def by_kind(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def test_the_sample_wires_gateway_route_pool_service_and_picker() -> None:
    objects = build(MANIFESTS / "samples")
    picker = by_kind(objects, "Deployment", "epp")
    container = picker["spec"]["template"]["spec"]["containers"][0]
    service = by_kind(objects, "Service", "epp")
    inference_pool = by_kind(objects, "InferencePool")
    route = by_kind(objects, "HTTPRoute")
    gateway = by_kind(objects, "Gateway")
    model_server = by_kind(objects, "Deployment", "vllm-llama3-8b-instruct")

    ref = inference_pool["spec"]["endpointPickerRef"]
    assert ref["name"] == service["metadata"]["name"]
    assert ref["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]
    assert f"--pool-name={inference_pool['metadata']['name']}" in container["args"]
    labels = model_server["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in inference_pool["spec"]["selector"]["matchLabels"].items())
    target_ports = {
        p["containerPort"] for c in model_server["spec"]["template"]["spec"]["containers"] for p in c["ports"]
    }
    assert {p["number"] for p in inference_pool["spec"]["targetPorts"]} <= target_ports
    pod_labels = picker["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in service["spec"]["selector"].items())
    assert {p["port"] for p in service["spec"]["ports"]} == {9002, 9003, 9090}
    [backend] = route["spec"]["rules"][0]["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        inference_pool["metadata"]["name"],
    )
    assert route["spec"]["parentRefs"][0]["name"] == gateway["metadata"]["name"]
    for obj in objects:
        if obj["kind"] in ("InferenceObjective", "InferenceModelRewrite"):
            assert obj["spec"]["poolRef"]["name"] == inference_pool["metadata"]["name"]


def test_the_picker_runs_hardened() -> None:
    picker = by_kind(build(MANIFESTS / "base"), "Deployment", "epp")
    pod_spec = picker["spec"]["template"]["spec"]
    [container] = pod_spec["containers"]
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    # One replica: upstream's chart probes the `inference-extension` health service for both.
    assert container["readinessProbe"]["grpc"] == {"port": 9003, "service": "inference-extension"}
    assert container["livenessProbe"]["grpc"] == {"port": 9003, "service": "inference-extension"}
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    bindings = [o for o in build(MANIFESTS / "base") if o["kind"] == "RoleBinding"]
    assert all(s["name"] == pod_spec["serviceAccountName"] for b in bindings for s in b["subjects"])


def test_the_cpu_limit_sizes_the_serving_workers(tmp_path: Path) -> None:
    """No --workers in the args: the default (auto) follows the container's CPU limit, as the kubelet writes it
    into the cgroup (limits.cpu 2 → cpu.max "200000 100000"), not the node's cores."""
    [container] = by_kind(build(MANIFESTS / "base"), "Deployment", "epp")["spec"]["template"]["spec"]["containers"]
    assert not any(arg.startswith("--workers") for arg in container["args"])
    cpu = container["resources"]["limits"]["cpu"]
    millicores = int(cpu[:-1]) if cpu.endswith("m") else int(float(cpu) * 1000)
    (tmp_path / "cpu.max").write_text(f"{millicores * 100} 100000\n")
    (tmp_path / "self-cgroup").write_text("0::/\n")
    assert default_workers(usable_cores(64, tmp_path / "self-cgroup", tmp_path)) == millicores // 1000 >= 2


def test_the_ha_overlay_runs_two_replicas_with_leader_election() -> None:
    objects = build(MANIFESTS / "ha")
    picker = by_kind(objects, "Deployment", "epp")
    assert picker["spec"]["replicas"] == 2
    assert picker["spec"]["strategy"] == {"type": "Recreate"}  # as upstream's chart: the old leader goes at once
    [container] = picker["spec"]["template"]["spec"]["containers"]
    assert "--ha-enable-leader-election" in container["args"]
    assert container["readinessProbe"]["grpc"]["service"] == "readiness"  # only the leader is ready
    assert container["livenessProbe"]["grpc"]["service"] == "liveness"
    pdb = by_kind(objects, "PodDisruptionBudget", "epp")
    assert pdb["spec"]["minAvailable"] == 1
    labels = picker["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())
    assert any(r["resources"] == ["leases"] for o in objects if o["kind"] == "Role" for r in o["rules"])
    assert not any(
        r["resources"] == ["leases"] for o in build(MANIFESTS / "base") if o["kind"] == "Role" for r in o["rules"]
    )


# -- RBAC against the calls the code really makes -------------------------------------------------------------------


def grants(objects: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    out = set()
    for role in (o for o in objects if o["kind"] == "Role"):
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    out.update((group, resource, verb) for verb in rule["verbs"])
    return out


def needed(call: Call) -> tuple[str, str, str]:
    parts = [p for p in call.path.split("/") if p]
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest and rest[0] == "namespaces":
        rest = rest[2:]
    return group, rest[0], call.verb


async def _run_picker(api: FakeApiServer, rest: KubeRest, leader_election: bool) -> set[tuple[str, str, str]]:
    start = len(api.calls)
    settings = KubernetesSettings(
        pool_name="pool",
        leader_election=leader_election,
        lease=LeaseTiming(lease_duration_s=2, renew_deadline_s=1.5, retry_period_s=0.2),
        watch=WatchOptions(backoff_initial_s=0.02, backoff_max_s=0.1),
    )
    source = KubernetesSource(EndpointTable(), ObjectiveStore(), settings, rest=rest)
    await source.start()
    try:
        assert await source.wait_ready(10)
        await asyncio.sleep(0.5)  # a few renewals too
    finally:
        await source.stop()
    return {needed(c) for c in api.calls[start:]}


async def test_rbac_grants_exactly_the_calls_the_picker_makes(apiserver: FakeApiServer, rest: KubeRest) -> None:
    for obj in (pool(), pod("a", ip="127.10.0.1"), objective("o", 1), rewrite("r", "m", {"n": 1})):
        apiserver.apply(obj)
    base, ha = grants(build(MANIFESTS / "base")), grants(build(MANIFESTS / "ha"))
    plain = await _run_picker(apiserver, rest, leader_election=False)
    with_lease = await _run_picker(apiserver, rest, leader_election=True)
    assert plain - base == set(), "the base Role misses calls the picker makes"
    assert with_lease - ha == set(), "the HA overlay misses calls the picker makes"
    assert base - plain == set(), "the base Role grants calls the picker never makes"
    assert ha - (plain | with_lease) == set(), "the HA overlay grants calls the picker never makes"


def test_the_configmap_holds_a_config_the_picker_accepts(tmp_path: Path) -> None:
    from epp.app.config_file import load_config

    objects = build(MANIFESTS / "base")
    config_map = by_kind(objects, "ConfigMap", "epp-config")
    picker = by_kind(objects, "Deployment", "epp")
    container = picker["spec"]["template"]["spec"]["containers"][0]
    [flag] = [a for a in container["args"] if a.startswith("--config-file=")]
    mount = next(m for m in container["volumeMounts"] if flag.split("=", 1)[1].startswith(m["mountPath"] + "/"))
    key = flag.split("=", 1)[1].removeprefix(mount["mountPath"] + "/")
    path = tmp_path / key
    path.write_text(config_map["data"][key])
    load_config(path)  # raises ConfigError naming the plugin and field at fault


def _seconds(flag: str) -> float:
    value = flag.split("=", 1)[1]
    return float(value.removesuffix("s"))


def test_the_picker_is_sized_and_named_like_upstreams_chart() -> None:
    import epp

    objects = build(MANIFESTS / "base")
    picker = by_kind(objects, "Deployment", "epp")
    pod_spec = picker["spec"]["template"]["spec"]
    [container] = pod_spec["containers"]
    args = container["args"]
    assert "serve" not in args  # upstream's form: flags only, no subcommand
    assert picker["spec"]["strategy"] == {"type": "Recreate"}
    assert pod_spec["terminationGracePeriodSeconds"] == 130
    drain = _seconds(next(a for a in args if a.startswith("--drain-timeout=")))
    grace = _seconds(next(a for a in args if a.startswith("--grace-period=")))
    assert drain == 30 and drain + grace < 130  # upstream's drain, and the stop fits the pod's grace period
    assert "--zap-encoder=json" in args
    repository, tag = container["image"].rsplit(":", 1)
    assert repository == "ghcr.io/llmkube/epp" and tag == epp.__version__  # docs/kubernetes.md
    service = by_kind(objects, "Service", "epp")
    [grpc_port] = [p for p in service["spec"]["ports"] if p["name"] == "grpc-ext-proc"]
    assert grpc_port["appProtocol"] == "kubernetes.io/h2c" and grpc_port["port"] == 9002


def cluster_grants(objects: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    out = set()
    for role in (o for o in objects if o["kind"] == "ClusterRole"):
        for rule in role["rules"]:
            for group in rule.get("apiGroups", []):
                for resource in rule["resources"]:
                    out.update((group, resource, verb) for verb in rule["verbs"])
    return out


def test_the_metrics_auth_cluster_role_grants_exactly_the_reviews_the_picker_makes(
    apiserver: FakeApiServer, rest: KubeRest
) -> None:
    from epp.discovery.kubernetes.review import AccessReviewer

    apiserver.review_tokens = {"t": ("reader", [])}
    apiserver.allow_non_resource = {("reader", "get", "/metrics")}
    start = len(apiserver.calls)
    assert AccessReviewer(rest).review("t").status == 200
    made = {needed(c) for c in apiserver.calls[start:]}
    assert made == cluster_grants(build(MANIFESTS / "base"))
    binding = by_kind(build(MANIFESTS / "base"), "ClusterRoleBinding", "epp-metrics-auth")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "epp", "namespace": "default"}]


def test_the_monitoring_overlay_scrapes_with_an_authorized_token() -> None:
    objects = build(MANIFESTS / "monitoring")
    monitor = by_kind(objects, "ServiceMonitor", "epp-monitor")
    [endpoint] = monitor["spec"]["endpoints"]
    service = by_kind(objects, "Service", "epp")
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["path"] == "/metrics"
    secret = by_kind(objects, "Secret", endpoint["authorization"]["credentials"]["name"])
    assert secret["type"] == "kubernetes.io/service-account-token"
    reader = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    role = by_kind(objects, "ClusterRole", "epp-metrics-reader")
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = by_kind(objects, "ClusterRoleBinding", "epp-metrics-reader")
    assert binding["roleRef"]["name"] == "epp-metrics-reader"
    assert [s["name"] for s in binding["subjects"]] == [reader]


def test_the_pools_overlay_serves_every_labelled_pool_from_one_picker_behind_one_gateway() -> None:
    objects = build(MANIFESTS / "pools")
    container = by_kind(objects, "Deployment", "epp")["spec"]["template"]["spec"]["containers"][0]
    service = by_kind(objects, "Service", "epp")
    gateway = by_kind(objects, "Gateway")
    pools = [o for o in objects if o["kind"] == "InferencePool"]
    routes = [o for o in objects if o["kind"] == "HTTPRoute"]
    assert len(pools) == len(routes) == 3
    [selector] = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--pool-selector=")]
    assert not any(a.startswith("--pool-name") for a in container["args"])
    key, value = selector.split("=")
    for served in pools:
        assert served["metadata"]["labels"][key] == value
        assert served["spec"]["endpointPickerRef"]["name"] == service["metadata"]["name"]
    backends = sorted(r["spec"]["rules"][0]["backendRefs"][0]["name"] for r in routes)
    assert backends == sorted(p["metadata"]["name"] for p in pools)
    assert {r["spec"]["parentRefs"][0]["name"] for r in routes} == {gateway["metadata"]["name"]}
    assert grants(objects) == grants(build(MANIFESTS / "base"))  # RBAC unchanged in kind

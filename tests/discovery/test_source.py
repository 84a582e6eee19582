"""KubernetesSource on the test's event loop: what reaches the ObjectiveStore, standalone mode, readiness."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from epp.datastore import EndpointTable
from epp.datastore.objectives import ObjectiveStore, RewriteTarget
from epp.datastore.pool import FailureMode
from epp.discovery.kubernetes.rest import KubeRest, load_api_client
from epp.discovery.kubernetes.settings import KubernetesSettings, parse_endpoint_selector
from epp.discovery.kubernetes.source import KubernetesSource
from epp.discovery.kubernetes.watch import WatchOptions
from tests.discovery.k8s_objects import objective, pod, pool, rewrite
from tests.fakes.apiserver import DEFAULT_RESOURCES, FakeApiServer

FAST = WatchOptions(backoff_initial_s=0.02, backoff_max_s=0.1, inactivity_timeout_s=5, absent_retry_s=0.2)


async def until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


@pytest.fixture
async def start(rest: KubeRest) -> AsyncIterator[Callable[..., KubernetesSource]]:
    sources: list[KubernetesSource] = []

    async def make(**settings) -> KubernetesSource:
        source = KubernetesSource(
            EndpointTable(), ObjectiveStore(), KubernetesSettings(watch=FAST, **settings), rest=rest
        )
        await source.start()
        sources.append(source)
        return source

    yield make
    for source in sources:
        await source.stop()


LEGACY = "inference.networking.x-k8s.io"
LEGACY_ONLY = tuple(r for r in DEFAULT_RESOURCES if r.group != "llm-d.ai")  # a cluster with only the older CRDs


@pytest.fixture
async def legacy_only() -> AsyncIterator[tuple[FakeApiServer, KubeRest]]:
    """An API server that serves the objective kinds only in inference.networking.x-k8s.io (llm-d.ai: 404)."""
    with FakeApiServer(resources=LEGACY_ONLY) as server, tempfile.TemporaryDirectory() as tmp:
        client = load_api_client(str(server.write_kubeconfig(Path(tmp) / "kubeconfig")))
        yield server, KubeRest(client)
        client.close()


async def test_objectives_of_the_older_group_count_when_llm_d_ai_is_not_served(legacy_only) -> None:
    apiserver, rest = legacy_only
    apiserver.apply(pool())
    apiserver.apply(objective("critical", 10))
    apiserver.apply(objective("unset", None))
    apiserver.apply(objective("elsewhere", 99, pool_name="other"))
    apiserver.apply(rewrite("canary", "llama", {"llama-v1": 90, "llama-v2": 10}))
    apiserver.apply(rewrite("other", "gpt", {"x": 1}, pool_name="other"))
    store = ObjectiveStore()
    source = KubernetesSource(EndpointTable(), store, KubernetesSettings(pool_name="pool", watch=FAST), rest=rest)
    await source.start()
    try:
        await until(lambda: store.objectives() == {"critical": 10, "unset": 0})
        await until(lambda: store.rewrite_rule_for("llama") is not None)
        rule = store.rewrite_rule_for("llama")
        assert rule.targets == (RewriteTarget("llama-v1", 90), RewriteTarget("llama-v2", 10))
        assert store.rewrite_rule_for("gpt") is None
        apiserver.delete(f"{LEGACY}/v1alpha2", "InferenceObjective", "default", "critical")
        apiserver.delete(f"{LEGACY}/v1alpha2", "InferenceModelRewrite", "default", "canary")
        await until(lambda: "critical" not in store.objectives() and store.rewrite_rule_for("llama") is None)
    finally:
        await source.stop()


async def test_with_both_groups_served_llm_d_ai_wins_and_the_older_group_is_ignored(
    apiserver: FakeApiServer, start
) -> None:
    """Upstream picks llm-d.ai whenever its CRD is installed and then ignores the older group's objects."""
    apiserver.apply(pool())
    apiserver.apply(objective("critical", 10))  # older group: ignored, the same name in llm-d.ai wins
    apiserver.apply(objective("legacy-only", 5))  # older group: ignored too
    apiserver.apply(objective("critical", 1, group="llm-d.ai"))
    apiserver.apply(objective("batch", -1, group="llm-d.ai"))
    apiserver.apply(objective("elsewhere", 99, pool_name="other", group="llm-d.ai"))
    apiserver.apply(rewrite("canary", "llama", {"llama-v1": 1}))
    apiserver.apply(rewrite("canary", "llama", {"llama-v2": 1}, group="llm-d.ai"))
    source = await start(pool_name="pool")
    store = source.objectives
    await until(lambda: store.objectives() == {"critical": 1, "batch": -1})
    await until(lambda: store.rewrite_rule_for("llama") is not None)
    assert store.rewrite_rule_for("llama").targets == (RewriteTarget("llama-v2", 1),)
    # the last llm-d.ai object gone: the kind is still served there, so the older group stays ignored
    apiserver.delete("llm-d.ai/v1alpha2", "InferenceModelRewrite", "default", "canary")
    await until(lambda: store.rewrite_rule_for("llama") is None)
    apiserver.apply(objective("late", 7, group="llm-d.ai"))
    await until(lambda: "late" in store.objectives())
    assert store.rewrite_rule_for("llama") is None and "legacy-only" not in store.objectives()


async def test_llm_d_ai_takes_over_once_its_crd_is_installed(legacy_only) -> None:
    apiserver, rest = legacy_only
    apiserver.apply(pool())
    apiserver.apply(objective("critical", 10))
    store = ObjectiveStore()
    source = KubernetesSource(EndpointTable(), store, KubernetesSettings(pool_name="pool", watch=FAST), rest=rest)
    await source.start()
    try:
        await until(lambda: store.objectives() == {"critical": 10})
        for res in DEFAULT_RESOURCES:
            if res.group == "llm-d.ai":
                apiserver.register(res)  # the new CRDs installed while the picker runs
        apiserver.apply(objective("critical", 2, group="llm-d.ai"))
        await until(lambda: store.objectives() == {"critical": 2})
    finally:
        await source.stop()


async def test_standalone_mode_selects_pods_without_a_pool_object(apiserver: FakeApiServer, start) -> None:
    apiserver.apply(pod("a", ip="127.10.0.1", labels={"role": "llm"}))
    apiserver.apply(pod("b", ip="127.10.0.2", labels={"role": "other"}))
    apiserver.apply(pod("c", ip="127.10.0.3", labels={"role": "llm", "canary": "true"}))
    apiserver.apply(pod("d", ip="127.10.0.4", labels={"role": "embed"}))
    source = await start(
        endpoint_selector=parse_endpoint_selector("role in (llm, embed),!canary"), endpoint_target_ports=(8000, 8002)
    )
    assert await source.wait_ready(5)
    assert set(source.table.addresses()) == {"127.10.0.1:8000", "127.10.0.1:8002", "127.10.0.4:8000", "127.10.0.4:8002"}
    assert not any(c.path.endswith("inferencepools") for c in apiserver.calls)


async def test_not_ready_until_the_pool_exists_then_failure_mode_follows_it(apiserver: FakeApiServer, start) -> None:
    flips: list[bool] = []
    source = await start(pool_name="pool")
    source.subscribe(lambda: flips.append(source.ready))
    await until(lambda: source.table.synced)
    assert not source.ready and source.pool_spec() is None
    apiserver.apply(pool(failure_mode="FailOpen"))
    await until(lambda: source.ready)
    assert source.pool_spec().failure_mode is FailureMode.FAIL_OPEN
    assert flips[-1] is True


async def test_a_pool_without_endpoint_picker_ref_is_served_fail_close(apiserver: FakeApiServer, start) -> None:
    """InferencePool v1 made `endpointPickerRef` optional: such a pool loads and its pods are endpoints."""
    bare = pool()
    del bare["spec"]["endpointPickerRef"]
    apiserver.apply(bare)
    apiserver.apply(pod("a", ip="127.10.0.1"))
    source = await start(pool_name="pool")
    await until(lambda: source.ready)
    assert source.pool_spec().failure_mode is FailureMode.FAIL_CLOSE
    assert set(source.table.addresses()) == {"127.10.0.1:8000"}


async def test_an_invalid_pool_update_keeps_the_previous_spec(apiserver: FakeApiServer, start) -> None:
    apiserver.apply(pool(ports=(8000,)))
    apiserver.apply(pod("a", ip="127.10.0.1"))
    source = await start(pool_name="pool")
    await until(lambda: source.ready)
    broken = pool()
    broken["spec"]["targetPorts"] = []
    apiserver.apply(broken)
    apiserver.apply(pod("b", ip="127.10.0.2"))  # an event after the bad one: the watch is still alive
    await until(lambda: len(source.table) == 2)
    assert source.pool_spec().target_ports == (8000,)


async def test_metrics_survive_pod_updates_that_keep_the_address(apiserver: FakeApiServer, start) -> None:
    from epp.datastore import MetricsSample

    apiserver.apply(pool())
    apiserver.apply(pod("a", ip="127.10.0.1"))
    source = await start(pool_name="pool")
    await until(lambda: len(source.table) == 1)
    slot = source.table.slot_of("127.10.0.1:8000")
    source.table.record_scrape(slot, MetricsSample(waiting=3), now=1.0)
    apiserver.apply(pod("a", ip="127.10.0.1", labels={"app": "vllm", "rev": "2"}))
    await until(lambda: source.table.info(slot).labels.get("rev") == "2")
    assert source.table.snapshot().waiting[slot] == 3

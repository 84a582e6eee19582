"""Random sequences of cluster events (pods, pool spec, dropped watches, 410 gaps) never leave the picker wrong:
after every step its endpoint set equals the truth within 2 seconds."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from epp.discovery.kubernetes.settings import KubernetesSettings
from epp.discovery.kubernetes.watch import WatchOptions
from tests.discovery.k8s_objects import pod, pool
from tests.discovery.pickers import ThreadedSource, eventually
from tests.discovery.truth import expected_endpoints
from tests.fakes.apiserver import FakeApiServer

NAMES = st.sampled_from([f"pod-{i}" for i in range(5)])
IPS = st.sampled_from([f"127.10.0.{i}" for i in range(1, 5)])  # few IPs: pods sharing an address happen too
LABELS = st.sampled_from([{"app": "vllm"}, {"app": "vllm", "tier": "gold"}, {"app": "other"}])
PORTS = st.sampled_from([(8000,), (8000, 8001), (8001, 8002)])
SELECTORS = st.sampled_from([{"app": "vllm"}, {"tier": "gold"}])
ACTIVE = st.sampled_from([None, "8000", "8001,8002", ""])


class ClusterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.api = FakeApiServer().start()
        self.api.apply(pool())
        self._tmp = tempfile.TemporaryDirectory()
        kubeconfig = self.api.write_kubeconfig(Path(self._tmp.name) / "kubeconfig")
        self.source = ThreadedSource(
            KubernetesSettings(
                namespace="default",
                pool_name="pool",
                kubeconfig=str(kubeconfig),
                watch=WatchOptions(backoff_initial_s=0.02, backoff_max_s=0.1, inactivity_timeout_s=5),
            )
        )

    @rule(name=NAMES, ip=IPS, labels=LABELS, ready=st.booleans(), deleting=st.booleans(), active=ACTIVE)
    def put_pod(self, name: str, ip: str, labels: dict[str, str], ready: bool, deleting: bool, active: str | None):
        self.api.apply(pod(name, ip=ip, labels=labels, ready=ready, deleting=deleting, active_ports=active))

    @rule(name=NAMES)
    def pod_without_ip(self, name: str) -> None:
        self.api.apply(pod(name, ip=None))

    @rule(name=NAMES)
    def delete_pod(self, name: str) -> None:
        self.api.delete("v1", "Pod", "default", name)

    @rule(selector=SELECTORS, ports=PORTS)
    def change_pool(self, selector: dict[str, str], ports: tuple[int, ...]) -> None:
        self.api.apply(pool(selector=selector, ports=ports))

    @rule()
    def delete_pool(self) -> None:
        self.api.delete("inference.networking.k8s.io/v1", "InferencePool", "default", "pool")

    @rule()
    def drop_watches(self) -> None:
        self.api.drop_watches()

    @rule(name=NAMES)
    def delete_in_a_410_gap(self, name: str) -> None:
        self.api.hold_watches()
        self.api.drop_watches()
        self.api.delete("v1", "Pod", "default", name)
        self.api.compact()
        self.api.release_watches()

    @invariant()
    def endpoints_match_the_truth(self) -> None:
        truth = expected_endpoints(self.api)
        eventually(
            lambda: self.source.endpoints() == truth,
            2.0,
            lambda: f"picker {sorted(self.source.endpoints())} != truth {sorted(truth)}",
        )

    def teardown(self) -> None:
        self.source.close()
        self.api.stop()
        self._tmp.cleanup()


ClusterMachine.TestCase.settings = settings(
    max_examples=12,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRandomClusterEvents = ClusterMachine.TestCase

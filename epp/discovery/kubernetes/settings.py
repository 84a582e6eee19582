"""What the Kubernetes source needs to know, validated once at start-up (bad values are ConfigError, exit 2).

Two modes, as upstream:
- pool mode (`--pool-name`): the InferencePool object decides selector, target ports and failure mode, live;
- standalone mode (`--endpoint-selector` in label-selector syntax, `app=vllm,env in (a,b),!canary`, with
  `--endpoint-target-ports 8000,…`): no pool object.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any

from epp.datastore.pool import POOL_GROUP, FailureMode, PoolSpec
from epp.datastore.selector import DOUBLE_EQUALS, EQUALS, Requirement, SelectorError, parse_label_selector
from epp.discovery.kubernetes.watch import WatchOptions
from epp.errors import ConfigError


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """client-go's leader-election timing (and its defaults, which controller-runtime and upstream use)."""

    lease_duration_s: float = 15.0  # a follower takes over this long after the leader's last renewal
    renew_deadline_s: float = 10.0  # the leader steps down when it could not renew for this long
    retry_period_s: float = 2.0  # how often to try to acquire or renew


@dataclass(frozen=True, slots=True)
class KubernetesSettings:
    namespace: str = "default"
    pool_name: str = ""  # pool mode when set
    # Several pools (one picker for many InferencePools): the pools named by a repeated --pool-name, or every pool
    # of the namespace that --pool-selector matches; each pool keeps its endpoints, failure mode and objectives.
    pool_names: tuple[str, ...] = ()
    pool_selector: str = ""
    pool_group: str = POOL_GROUP
    endpoint_selector: tuple[Requirement, ...] = ()  # standalone mode when set (`parse_endpoint_selector`)
    endpoint_target_ports: tuple[int, ...] = ()
    kubeconfig: str | None = None
    leader_election: bool = False
    lease: LeaseTiming = field(default_factory=LeaseTiming)
    lease_name: str = ""  # derived from the pool when empty
    identity: str = ""  # derived from the host name when empty
    watch: WatchOptions = field(default_factory=WatchOptions)

    @property
    def standalone(self) -> bool:
        return not self.pool_name and not self.multi

    @property
    def multi(self) -> bool:
        """Several pools: pool keys on the endpoints, the request's pool read from the stream (epp.director.pools)."""
        return bool(self.pool_names or self.pool_selector)

    def standalone_pool(self) -> PoolSpec:
        """The PoolSpec of standalone mode: no pool object, so upstream's defaults (FailClose).

        Equality requirements become matchLabels pairs (the same meaning), the rest stay expressions; a key
        required twice keeps both requirements, so `a=1,a=2` selects nothing, as upstream's selector.
        """
        pairs: dict[str, str] = {}
        expressions: list[Requirement] = []
        for req in self.endpoint_selector:
            if req.operator in (EQUALS, DOUBLE_EQUALS) and req.key not in pairs:
                pairs[req.key] = req.values[0]
            else:
                expressions.append(req)
        return PoolSpec(
            name="",
            namespace=self.namespace,
            selector=pairs,
            expressions=tuple(expressions),
            target_ports=self.endpoint_target_ports,
            failure_mode=FailureMode.FAIL_CLOSE,
        )

    def effective_lease_name(self) -> str:
        if self.lease_name:
            return self.lease_name
        subject = self.pool_name or ("pools" if self.multi else "standalone")
        return f"epp-{self.namespace}-{subject}.gateway-api-inference-extension.sigs.k8s.io"[:253]

    def effective_identity(self) -> str:
        return self.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def parse_endpoint_selector(text: str) -> tuple[Requirement, ...]:
    """`--endpoint-selector` in Kubernetes label-selector syntax, as upstream parses it; ConfigError says what is
    wrong. A blank selector is refused (upstream's would select every pod of the namespace)."""
    try:
        requirements = parse_label_selector(text)
    except SelectorError as exc:
        raise ConfigError(f"--endpoint-selector {text!r}: {exc}") from None
    if not requirements:
        raise ConfigError("--endpoint-selector: needs at least one requirement, such as app=vllm")
    return requirements


def parse_target_ports(text: str) -> tuple[int, ...]:
    """`8000,8001` → (8000, 8001); 1 to 8 distinct ports 1-65535, as the InferencePool CRD allows."""
    ports: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or not 1 <= int(part) <= 65535:
            raise ConfigError(f"--endpoint-target-ports: {part!r} is not a port number 1-65535")
        if int(part) in ports:
            raise ConfigError(f"--endpoint-target-ports: {part} is listed twice")
        ports.append(int(part))
    if not 1 <= len(ports) <= 8:
        raise ConfigError("--endpoint-target-ports: list 1 to 8 ports")
    return tuple(ports)


def settings_from_flags(args: Any) -> KubernetesSettings | None:
    """The settings `epp serve`'s Kubernetes flags ask for, or None when they ask for no Kubernetes source.

    `args` is the argparse namespace of `epp serve` (attributes pool_name, pool_namespace, pool_group, kubeconfig,
    endpoint_selector, endpoint_target_ports, ha_enable_leader_election, leader_elect_lease_duration,
    leader_elect_renew_deadline, leader_elect_retry_period).
    """
    given = getattr(args, "pool_names", None) or ([args.pool_name] if getattr(args, "pool_name", None) else [])
    names = tuple(dict.fromkeys(str(n).strip() for n in given))
    pool_selector = (getattr(args, "pool_selector", None) or "").strip()
    if "" in names:
        raise ConfigError("--pool-name: an empty name")
    if pool_selector:
        try:
            parse_label_selector(pool_selector)
        except SelectorError as exc:
            raise ConfigError(f"--pool-selector {pool_selector!r}: {exc}") from None
    multi = len(names) > 1 or bool(pool_selector)
    pool_name = names[0] if len(names) == 1 and not multi else ""
    selector_text = getattr(args, "endpoint_selector", None) or ""
    ports_text = getattr(args, "endpoint_target_ports", None) or ""
    if not pool_name and not selector_text and not multi:
        if ports_text:
            raise ConfigError("--endpoint-target-ports needs --endpoint-selector (standalone mode)")
        if getattr(args, "ha_enable_leader_election", False):
            raise ConfigError("--ha-enable-leader-election needs --pool-name or --endpoint-selector")
        return None
    if (pool_name or multi) and selector_text:
        raise ConfigError("--pool-name and --endpoint-selector are exclusive: a pool object, or standalone mode")
    group = getattr(args, "pool_group", None) or POOL_GROUP
    if group != POOL_GROUP:
        raise ConfigError(f"--pool-group: only {POOL_GROUP} (InferencePool v1) is supported, got {group!r}")
    namespace = getattr(args, "pool_namespace", None) or os.environ.get("NAMESPACE") or "default"
    selector: tuple[Requirement, ...] = ()
    ports: tuple[int, ...] = ()
    if selector_text:
        selector = parse_endpoint_selector(selector_text)
        if not ports_text:
            raise ConfigError("--endpoint-selector needs --endpoint-target-ports")
        ports = parse_target_ports(ports_text)
    elif ports_text:
        raise ConfigError("--endpoint-target-ports is for standalone mode; the pool's targetPorts apply")
    timing = LeaseTiming(
        lease_duration_s=float(getattr(args, "leader_elect_lease_duration", 15.0)),
        renew_deadline_s=float(getattr(args, "leader_elect_renew_deadline", 10.0)),
        retry_period_s=float(getattr(args, "leader_elect_retry_period", 2.0)),
    )
    if not 0 < timing.retry_period_s < timing.renew_deadline_s < timing.lease_duration_s:
        raise ConfigError(
            "--leader-elect-*: need 0 < retry period < renew deadline < lease duration, got "
            f"{timing.retry_period_s}s, {timing.renew_deadline_s}s, {timing.lease_duration_s}s"
        )
    return KubernetesSettings(
        namespace=namespace,
        pool_name=pool_name,
        pool_names=names if multi else (),
        pool_selector=pool_selector,
        pool_group=group,
        endpoint_selector=selector,
        endpoint_target_ports=ports,
        kubeconfig=getattr(args, "kubeconfig", None) or None,
        leader_election=bool(getattr(args, "ha_enable_leader_election", False)),
        lease=timing,
    )

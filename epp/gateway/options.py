"""What a rendered gateway needs to know: the pool, where the picker is, and the choices an operator makes.

Parsing lives here (not in the CLI) so the renderer, the tests and the CLI agree on one meaning of every value,
and a bad value is a ConfigError that names the flag, never a half-written Envoy config.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass

from epp import wire
from epp.datastore.pool import FailureMode, PoolSpec
from epp.errors import ConfigError


class BodyMode(enum.Enum):
    """How Envoy hands the request body to the picker.

    FULL_DUPLEX_STREAMED is upstream's mode (the picker streams the body back); BUFFERED sends it in one message.
    Only BUFFERED keeps FailOpen whole: Envoy can fail open only before a body chunk has gone to the picker, and
    under FULL_DUPLEX_STREAMED the first chunk is committed to the stream at once — measured with Envoy 1.40,
    every request with a body gets 500 while the picker is down (tests/e2e/test_failure_modes.py, docs).
    """

    FULL_DUPLEX_STREAMED = "FULL_DUPLEX_STREAMED"
    BUFFERED = "BUFFERED"


class ResponsePhases(enum.Enum):
    """Which response messages the picker gets. Each extra ext_proc message costs Python CPU in the picker, so the
    default is the headers only (served endpoint, status); `body` streams every chunk through the picker (usage
    accounting, undoing a model rewrite); `none` ends the picker's part after the decision."""

    NONE = "none"
    HEADERS = "headers"
    BODY = "body"


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    @property
    def is_ip(self) -> bool:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_host_port(text: str, what: str, default_port: int | None = None) -> HostPort:
    """`host:port`, `[v6]:port`, or `host` alone when a default port applies; ConfigError names `what`."""
    raw = text.strip()
    if not raw:
        raise ConfigError(f"{what}: empty address")
    host, port_text = raw, ""
    if raw.startswith("["):
        close = raw.find("]")
        if close < 0:
            raise ConfigError(f"{what}: unbalanced '[' in {raw!r}")
        host, rest = raw[1:close], raw[close + 1 :]
        if rest and not rest.startswith(":"):
            raise ConfigError(f"{what}: expected ':port' after ']' in {raw!r}")
        port_text = rest[1:]
    elif raw.count(":") == 1:
        host, port_text = raw.split(":")
    elif raw.count(":") > 1:
        raise ConfigError(f"{what}: write an IPv6 address as [addr]:port, got {raw!r}")
    if not host:
        raise ConfigError(f"{what}: missing host in {raw!r}")
    if not port_text:
        if default_port is None:
            raise ConfigError(f"{what}: missing ':port' in {raw!r}")
        return HostPort(host, default_port)
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{what}: port is not a number in {raw!r}") from None
    if not 1 <= port <= 65535:
        raise ConfigError(f"{what}: port out of range 1-65535 in {raw!r}")
    return HostPort(host, port)


def parse_endpoint_list(text: str, what: str = "--endpoints") -> tuple[HostPort, ...]:
    """A comma list of pool endpoints; each must be an IP (the picker names endpoints by podIP:port)."""
    items = [part for part in (p.strip() for p in text.split(",")) if part]
    if not items:
        raise ConfigError(f"{what}: no endpoint given")
    endpoints: list[HostPort] = []
    for item in items:
        endpoint = parse_host_port(item, what)
        if not endpoint.is_ip:
            raise ConfigError(f"{what}: {item!r} is not ip:port (use --endpoints-dns for a DNS name)")
        if endpoint in endpoints:
            raise ConfigError(f"{what}: {item!r} is listed twice")
        endpoints.append(endpoint)
    return tuple(endpoints)


@dataclass(frozen=True, slots=True)
class GatewayOptions:
    """Everything the bootstrap is rendered from. `endpoints` (static IPs) or `endpoints_dns` (a headless Service
    name resolving to the pod IPs) gives Envoy the pool's members: needed for FailOpen's fallback, and it also
    confines the picker's choice to pool members (the override_host policy picks only hosts it knows)."""

    pool: PoolSpec
    epp: HostPort
    listen: HostPort = HostPort("0.0.0.0", 8081)
    admin: HostPort = HostPort("127.0.0.1", 9901)
    endpoints: tuple[HostPort, ...] = ()
    endpoints_dns: str = ""
    body_mode: BodyMode = BodyMode.BUFFERED
    response_phases: ResponsePhases = ResponsePhases.HEADERS
    message_timeout_s: float = 1.0
    # How long the picker may ask Envoy to wait (override_message_timeout) while it holds a request in its
    # flow-control queue; the picker asks for wire.QUEUE_HOLD_S at a time, so it must be at least that.
    max_message_timeout_s: float = 30.0
    retries: int = 2
    max_body_bytes: int = 16 * 1024 * 1024
    dns_refresh_s: float = 2.0
    access_log: str = ""  # a file path (or /dev/stdout): one JSON line per request, with the upstream that served
    allow_full_duplex_fail_open: bool = False
    epp_tls: bool = True  # the picker serves TLS by default; False for one run with --secure-serving=false
    epp_sni_name: str = ""  # SNI sent to the picker; default: --epp's host when it is a DNS name, else "localhost"
    # Streams Envoy sends over one connection to the picker before it opens a new one (0: no limit). Envoy keeps
    # one HTTP/2 connection per worker thread and multiplexes every ext_proc stream over it; a picker with
    # several serving workers gets connections, not streams, spread over them, so new connections now and then
    # give every worker its share (see docs/architecture.md, "Scale beyond one core").
    epp_streams_per_connection: int = 1000
    # One picker for several pools: the pools after `pool`, each its own virtual host (domains: its name), its
    # route setting the stream's `x-llm-d-inference-pool` metadata (ExtProcPerRoute.overrides).
    more_pools: tuple[PoolSpec, ...] = ()

    @property
    def pools(self) -> tuple[PoolSpec, ...]:
        return (self.pool, *self.more_pools)

    def __post_init__(self) -> None:
        if self.endpoints and self.endpoints_dns:
            raise ConfigError("--endpoints and --endpoints-dns exclude each other: give one")
        if self.more_pools:
            names = [p.name for p in self.pools]
            if len(set(names)) != len(names):
                raise ConfigError("--pool-file: two pools have the same name (each is the host name of its route)")
            if self.has_pool_endpoints:
                raise ConfigError(
                    "--endpoints/--endpoints-dns are one pool's members; with several --pool-file the picker names "
                    "every destination (a FailOpen pool has no fallback members in this bootstrap)"
                )
        elif self.fail_open and not self.has_pool_endpoints:
            raise ConfigError(
                f"pool {self.pool.name}: failureMode FailOpen needs the pool's endpoints for the fallback cluster "
                "used when the picker is down: pass --endpoints ip:port,... or --endpoints-dns <headless service>"
            )
        if self.fail_open and self.body_mode is BodyMode.FULL_DUPLEX_STREAMED and not self.allow_full_duplex_fail_open:
            raise ConfigError(
                f"pool {self.pool.name}: FailOpen does not work with --body-mode FULL_DUPLEX_STREAMED (measured with "
                "Envoy 1.40: with the picker down, every request with a body gets 500, because its first chunk is "
                "already committed to the picker's stream); use --body-mode BUFFERED, or pass "
                "--allow-full-duplex-fail-open to render it anyway"
            )
        if not 0 < self.message_timeout_s <= 3600:
            raise ConfigError(f"--message-timeout must be in (0, 3600] seconds, got {self.message_timeout_s}")
        if not max(self.message_timeout_s, wire.QUEUE_HOLD_S) <= self.max_message_timeout_s <= 3600:
            raise ConfigError(
                f"--max-message-timeout must be at least --message-timeout and the picker's {wire.QUEUE_HOLD_S:g}s "
                f"queue hold (a request waiting in its flow-control queue would otherwise be failed by Envoy), and "
                f"at most 3600s; got {self.max_message_timeout_s:g}s"
            )
        if not 0 <= self.retries <= 10:
            raise ConfigError(f"--retries must be 0-10, got {self.retries}")
        if self.max_body_bytes <= 0:
            raise ConfigError(f"--max-body-bytes must be positive, got {self.max_body_bytes}")
        if self.dns_refresh_s <= 0:
            raise ConfigError(f"DNS refresh must be positive, got {self.dns_refresh_s}")

    @property
    def epp_sni(self) -> str:
        """SNI must be a host name, never an IP: a DNS --epp is its own name, an IP gets the self-signed one's."""
        if self.epp_sni_name:
            return self.epp_sni_name
        return "localhost" if self.epp.is_ip else self.epp.host

    @property
    def fail_open(self) -> bool:
        """The filter's own failure mode; with several pools FailClose, and each FailOpen pool's route overrides
        it (ExtProcOverrides.failure_mode_allow)."""
        return not self.more_pools and self.pool.failure_mode is FailureMode.FAIL_OPEN

    @property
    def has_pool_endpoints(self) -> bool:
        return bool(self.endpoints or self.endpoints_dns)

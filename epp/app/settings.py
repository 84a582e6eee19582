"""What `epp serve` was asked to do: one frozen, typed value built from the flags once (`epp.cli.serve_settings`).

The control process reads it to build and start the picker, and hands the same value to every serving worker (it
pickles: plain dataclasses of numbers, strings and tuples), so both processes build from one description and
neither reads a flag. The flags themselves stay upstream's names (a drop-in contract); the fields here are named
after what they mean, with the flag in the comment where the two differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from epp.app.tls import TlsSettings
from epp.discovery.kubernetes.settings import KubernetesSettings
from epp.extproc.bounds import ServerLimits
from epp.scrape.scraper import ScrapeSettings


@dataclass(frozen=True, slots=True)
class ListenSettings:
    """Where the picker's servers listen."""

    bind_address: str = "0.0.0.0"
    grpc_port: int = 9002  # ext_proc
    grpc_health_port: int = 9003
    metrics_port: int = 9090  # /metrics and /debug
    # --extproc-transport: "native" (HTTP/2 framing in C, epp.extproc.native) or "grpc" (grpcio's grpc.aio server)
    transport: str = "native"


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """The EndpointPickerConfig: `--config-file`, or upstream's inline `--config-text`; neither: the built-in one."""

    path: str | None = None
    text: str | None = None
    allow_experimental: bool = False  # --allow-experimental-plugins: Alpha plugin types, as upstream


@dataclass(frozen=True, slots=True)
class EndpointFlags:
    """Where the endpoints come from: a cluster (`kubernetes`), or cluster-free files and lists."""

    kubernetes: KubernetesSettings | None = None  # --pool-name / --endpoint-selector and their lease flags
    static_endpoints: str | None = None  # ip:port,... as given
    pool_file: str | None = None
    objectives_file: str | None = None
    # Several pools (docs/kubernetes.md, "One picker for several pools"): cluster-free, the pool files beyond the
    # first (`pool_file` is the first); each pool's own config file by key; what a request of no known pool gets.
    more_pool_files: tuple[str, ...] = ()
    pool_configs: tuple[tuple[str, str], ...] = ()  # (pool key or name, EndpointPickerConfig path)
    pool_less_mode: str = "FailClose"

    @property
    def multi(self) -> bool:
        """Several pools: from the cluster (names, a selector) or several pool files."""
        return bool(self.more_pool_files) or (self.kubernetes is not None and self.kubernetes.multi)


@dataclass(frozen=True, slots=True)
class MessageLimits:
    """How large a request may be and what one ext_proc server holds at once (checked against each other)."""

    max_body_bytes: int = 16 * 1024 * 1024
    streams: ServerLimits = field(default_factory=ServerLimits)
    grpc_max_recv_msg_size: int | None = None  # None: follows max_body_bytes
    grpc_max_send_msg_size: int | None = None  # None: gRPC's default


@dataclass(frozen=True, slots=True)
class FederationFlags:
    """`--tier`, `--federation-watch`, `--federation-allow-fail-open`: whether and how federation is on."""

    tier: str = ""
    watch: bool = False
    allow_fail_open: bool = False


@dataclass(frozen=True, slots=True)
class LogSettings:
    """`-v` and upstream's zap flags."""

    verbosity: int = 2
    encoder: str = "console"
    level: str = ""  # --zap-log-level, overrides the verbosity
    time_encoding: str = ""


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """Everything `epp serve` was told, resolved (cluster-dependent defaults filled, values checked)."""

    listen: ListenSettings = field(default_factory=ListenSettings)
    config: ConfigSource = field(default_factory=ConfigSource)
    endpoints: EndpointFlags = field(default_factory=EndpointFlags)
    limits: MessageLimits = field(default_factory=MessageLimits)
    scrape: ScrapeSettings = field(default_factory=ScrapeSettings)
    scrape_in_process: bool = False  # --metrics-scrape-in-process
    federation: FederationFlags = field(default_factory=FederationFlags)
    tls: TlsSettings = field(default_factory=lambda: TlsSettings(enabled=False))
    logging: LogSettings = field(default_factory=LogSettings)
    workers: int | None = 1  # None: `auto`, resolved once the configuration is known
    grace_period_s: float = 10.0
    drain_timeout_s: float = 0.0
    kubeconfig: str = ""  # also for federation's watch and the metrics port's access reviews
    tracing: bool = False
    metrics_auth: bool = False  # --metrics-endpoint-auth, defaulted on in a cluster
    enable_pprof: bool = False  # /debug/stacks
    honour_subset: bool = True  # not --disable-endpoint-subset-filter
    test_selection: bool = False  # --enable-test-endpoint-selection
    emit_scores: bool = False  # --emit-endpoint-scores
    serve_models_list: bool = False  # --serve-models-list: GET /v1/models answered from the pools (epp.director.models)
    emit_receipts: bool = False  # --emit-route-receipts
    receipt_log_every: int = 0  # one receipt read in this many is logged (1 / --route-receipt-log-rate; 0: none)
    startup_warnings: tuple[str, ...] = ()  # logged once the checks that refuse to start have passed

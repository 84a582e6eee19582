"""`epp envoy-config`: print a complete Envoy bootstrap for an InferencePool, honouring its failureMode."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from epp.cli.flag_types import positive_duration
from epp.errors import ConfigError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "envoy-config",
        help="render an Envoy bootstrap (YAML) for a pool: ext_proc to the picker, FailOpen/FailClose routing",
    )
    p.add_argument(
        "--pool-file",
        required=True,
        action="append",
        help="InferencePool v1 YAML (its failureMode decides the routing); repeat it for one picker of several pools: "
        "a virtual host per pool (its name as the host), each route naming its pool to the picker",
    )
    p.add_argument("--epp", required=True, help="the picker's ext_proc address, host:port (an IP or a DNS name)")
    tls = p.add_mutually_exclusive_group()
    tls.add_argument(
        "--epp-plaintext",
        action="store_true",
        help="dial the picker without TLS (only for a picker run with --secure-serving=false)",
    )
    tls.add_argument("--epp-sni", default="", help="SNI for the TLS connection to the picker (default: --epp's host)")
    p.add_argument("--listen", default="0.0.0.0:8081", help="where Envoy accepts requests (default 0.0.0.0:8081)")
    p.add_argument("--admin", default="127.0.0.1:9901", help="Envoy admin address (default 127.0.0.1:9901)")
    members = p.add_mutually_exclusive_group()
    members.add_argument("--endpoints", help="the pool's endpoints, comma list of ip:port (FailOpen fallback)")
    members.add_argument(
        "--endpoints-dns",
        help="a headless Service name resolving to the pool's pod IPs, on each of the pool's targetPorts",
    )
    p.add_argument(
        "--body-mode",
        choices=["BUFFERED", "FULL_DUPLEX_STREAMED"],
        default="BUFFERED",
        help="how Envoy hands the request body to the picker (default BUFFERED; see docs/failure-modes.md)",
    )
    p.add_argument(
        "--allow-full-duplex-fail-open",
        action="store_true",
        help="render a FailOpen pool with FULL_DUPLEX_STREAMED anyway (Envoy then fails requests with a body)",
    )
    p.add_argument(
        "--response-phases",
        choices=["none", "headers", "body"],
        default="headers",
        help="response messages the picker gets (default headers; body streams every chunk through the picker)",
    )
    p.add_argument(
        "--message-timeout", type=positive_duration, default=1.0, help="how long Envoy waits per picker answer (1s)"
    )
    p.add_argument(
        "--max-message-timeout",
        type=positive_duration,
        default=30.0,
        help="the longest wait the picker may ask Envoy for (ext_proc max_message_timeout); a request queued by "
        "flow control is held 10s at a time, so at least 10s (default 30s)",
    )
    p.add_argument(
        "--epp-streams-per-connection",
        type=int,
        default=1000,
        help="ext_proc streams per connection to the picker before Envoy opens a new one, so a picker's serving "
        "workers (epp serve --workers) each get a share; 0: no limit (default 1000)",
    )
    p.add_argument("--retries", type=int, default=2, help="retries on connect failure, walking the picker's list")
    p.add_argument("--max-body-bytes", type=int, default=16 * 1024 * 1024, help="BUFFERED body limit (413 above)")
    p.add_argument("--access-log", default="", help="write a JSON access log line per request here (e.g. /dev/stdout)")
    p.add_argument("-o", "--output", help="write here instead of stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from epp.discovery.static import load_pool_file
    from epp.gateway import (
        BodyMode,
        GatewayOptions,
        ResponsePhases,
        parse_endpoint_list,
        parse_host_port,
        render_yaml,
    )

    options = GatewayOptions(
        pool=load_pool_file(args.pool_file[0]),
        more_pools=tuple(load_pool_file(path) for path in args.pool_file[1:]),
        epp=parse_host_port(args.epp, "--epp"),
        listen=parse_host_port(args.listen, "--listen"),
        admin=parse_host_port(args.admin, "--admin"),
        endpoints=parse_endpoint_list(args.endpoints) if args.endpoints is not None else (),
        endpoints_dns=(args.endpoints_dns or "").strip(),
        body_mode=BodyMode(args.body_mode),
        response_phases=ResponsePhases(args.response_phases),
        message_timeout_s=args.message_timeout,
        max_message_timeout_s=args.max_message_timeout,
        retries=args.retries,
        max_body_bytes=args.max_body_bytes,
        access_log=args.access_log,
        allow_full_duplex_fail_open=args.allow_full_duplex_fail_open,
        epp_tls=not args.epp_plaintext,
        epp_sni_name=args.epp_sni,
        epp_streams_per_connection=args.epp_streams_per_connection,
    )
    text = render_yaml(options)
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{args.output}: cannot write: {exc.strerror or exc}") from None
    else:
        sys.stdout.write(text)
    return 0

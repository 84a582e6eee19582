"""`epp sim`: simulated vLLM-compatible model servers on loopback ports, until interrupted (or --duration)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

from epp.cli.flag_types import duration
from epp.errors import ConfigError
from epp.sim.config import DEFAULT_MODEL, ROLE_LABEL
from epp.sim.metrics import ENGINES
from epp.sim.pool import SimulatedPool
from epp.sim.profiles import PROFILES, profile_named
from epp.supervision.loop import wait_set


def register(sub: Any) -> None:
    p = sub.add_parser("sim", help="run simulated model servers (vLLM API and metrics) on loopback")
    p.add_argument("--servers", type=int, default=8, help="number of servers (default 8)")
    p.add_argument("--base-port", type=int, default=8100, help="server i listens on base-port + i (default 8100)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--profiles",
        default="h100",
        help=f"comma list of performance profiles, cycled over the servers ({', '.join(sorted(PROFILES))})",
    )
    p.add_argument("--engine", default="vllm", choices=ENGINES, help="metric names to export (default vllm)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="served model name")
    p.add_argument("--lora", default="", help="comma list of LoRA adapter names served as models")
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall-clock second")
    p.add_argument(
        "--kv-events-port",
        type=int,
        default=None,
        help="publish vLLM-format KV-cache events over ZMQ: server i on this port + i (default: off)",
    )
    p.add_argument(
        "--kv-events-replay-port",
        type=int,
        default=None,
        help="also answer replay requests on a ROUTER socket: server i on this port + i (default: off)",
    )
    p.add_argument(
        "--kv-events-hash", choices=("int", "bytes"), default="int", help="block hashes as int64 or 32 bytes"
    )
    p.add_argument(
        "--role",
        default="both",
        help="P/D role, labelled llm-d.ai/role: prefill, decode or both; a comma list is cycled over the servers "
        "(decode and both servers run the routing sidecar's steps for x-prefiller-host-port)",
    )
    p.add_argument("--duration", type=duration, default=0.0, help="stop after this long, e.g. 30s (0: until signalled)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        profiles = [profile_named(n.strip()) for n in args.profiles.split(",") if n.strip()]
        pool = SimulatedPool(
            servers=args.servers,
            base_port=args.base_port,
            host=args.host,
            profiles=profiles,
            engine=args.engine,
            model=args.model,
            lora_adapters=[n.strip() for n in args.lora.split(",") if n.strip()],
            speed=args.speed,
            kv_events_port=args.kv_events_port,
            kv_events_replay_port=args.kv_events_replay_port,
            kv_events_hash=args.kv_events_hash,
            roles=[r.strip() for r in args.role.split(",") if r.strip()],
        )
    except ValueError as exc:
        raise ConfigError(f"epp sim: {exc}") from None
    return asyncio.run(_serve(pool, args.duration))


async def _serve(pool: SimulatedPool, duration: float) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await pool.start()
    except OSError as exc:
        print(f"epp sim: error: cannot listen: {exc}", file=sys.stderr)
        return 1
    try:
        for server in pool.servers:
            line = f"{server.config.name} {server.address} {server.config.profile.name} {server.config.engine}"
            if server.config.role != "both":  # the label a P/D pool's endpoints file gives this server
                line += f" {ROLE_LABEL}={server.config.role}"
            if server.kv_events_port is not None:
                line += f" kv-events={server.config.host}:{server.kv_events_port}"
            print(line)
        sys.stdout.flush()
        if duration > 0:
            await wait_set(stop, duration)
        else:
            await stop.wait()
    finally:
        await pool.stop()
    return 0

"""`epp demo`: a simulated pool, the picker and Envoy on loopback; the same traffic through the picker and through
round robin, summarised side by side; everything stopped afterwards (also on Ctrl-C)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from epp.errors import ConfigError


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="compare the picker with round robin on a simulated pool, on loopback")
    p.add_argument("--seconds", type=float, default=30.0, help="traffic in all, half per listener (default 30)")
    p.add_argument("--rate", type=float, default=12.0, help="requests per second per listener (default 12)")
    p.add_argument(
        "--profiles",
        default="h100,h100,h100,l4",
        help="one simulated server per entry: h100 or l4 (default h100,h100,h100,l4)",
    )
    p.add_argument("--groups", type=int, default=24, help="customers sharing a context (default 24)")
    p.add_argument("--context-tokens", type=int, default=4096, help="tokens of each customer's context (default 4096)")
    p.add_argument("--output-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall-clock second (default 1)")
    p.add_argument("--drain", type=float, default=30.0, help="seconds to wait for answers after sending (default 30)")
    p.add_argument("--workdir", help="keep logs and the Envoy config here (default: a temporary directory)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from epp.demo.run import DemoConfig, run_demo
    from epp.sim.profiles import PROFILES

    profiles = tuple(p.strip() for p in args.profiles.split(",") if p.strip())
    unknown = [p for p in profiles if p not in PROFILES]
    if unknown:
        raise ConfigError(f"--profiles: unknown {', '.join(unknown)}; choose from {', '.join(sorted(PROFILES))}")
    if args.groups <= 0 or args.context_tokens <= 0 or args.output_tokens <= 0:
        raise ConfigError("--groups, --context-tokens and --output-tokens must be positive")
    try:
        config = DemoConfig(
            seconds=args.seconds,
            rate=args.rate,
            profiles=profiles,
            groups=args.groups,
            context_tokens=args.context_tokens,
            output_tokens=args.output_tokens,
            speed=args.speed,
            drain_s=args.drain,
            workdir=Path(args.workdir) if args.workdir else None,
        )
    except ValueError as exc:
        raise ConfigError(f"epp demo: {exc}") from None
    return run_demo(config)

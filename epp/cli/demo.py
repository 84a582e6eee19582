"""`epp demo`: a simulated pool, the picker and Envoy on loopback; the same traffic through the picker and through
round robin, summarised side by side; everything stopped afterwards (also on Ctrl-C)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from epp.cli.flag_types import duration, positive_duration
from epp.demo.config import DemoConfig
from epp.errors import ConfigError

_D = DemoConfig()


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="compare the picker with round robin on a simulated pool, on loopback")
    p.add_argument(
        "--seconds",
        type=positive_duration,
        default=_D.seconds,
        help=f"traffic in all, half per listener ({_D.seconds:g}s)",
    )
    p.add_argument("--rate", type=float, default=_D.rate, help=f"requests per second per listener ({_D.rate:g})")
    p.add_argument(
        "--profiles",
        default=",".join(_D.profiles),
        help=f"one simulated server per entry, h100 or l4 ({','.join(_D.profiles)})",
    )
    p.add_argument("--groups", type=int, default=_D.groups, help=f"customers sharing a context ({_D.groups})")
    p.add_argument(
        "--context-tokens", type=int, default=_D.context_tokens, help=f"tokens per context ({_D.context_tokens})"
    )
    p.add_argument(
        "--output-tokens", type=int, default=_D.output_tokens, help=f"tokens generated per request ({_D.output_tokens})"
    )
    p.add_argument("--speed", type=float, default=_D.speed, help=f"simulated seconds per wall second ({_D.speed:g})")
    p.add_argument(
        "--drain", type=duration, default=_D.drain_s, help=f"how long to wait after sending ({_D.drain_s:g}s)"
    )
    p.add_argument("--workdir", help="keep logs and the Envoy config here (default: a temporary directory)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from epp.demo.run import run_demo
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
        raise ConfigError(str(exc)) from None
    return run_demo(config)

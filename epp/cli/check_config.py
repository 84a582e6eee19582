"""`epp check-config FILE...`: the verdict the server would reach on an EndpointPickerConfig, without serving.

Exit 0 when every file loads (each printed with the profile it builds and every plugin it runs, with its parameters
after defaults, those the picker adds itself marked "(added)"), 1 when any is refused (with the reason the server
would log at start-up: the file, the plugin and why). Deprecations print as `warning:` lines.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from epp.errors import ConfigError


def register(sub: Any) -> None:
    p = sub.add_parser("check-config", help="validate EndpointPickerConfig files (exit 0 loads, 1 refused)")
    p.add_argument("files", nargs="+", metavar="FILE", help="EndpointPickerConfig YAML file(s)")
    p.add_argument(
        "--allow-experimental-plugins",
        action="store_true",
        help="accept plugin types upstream marks Alpha (as `epp serve --allow-experimental-plugins`)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from epp.config.federation import parse_federation
    from epp.config.files import read_config
    from epp.scheduling import build_scheduler
    from epp.scheduling.build import deprecations, effective_plugins
    from epp.scrape.engines import engines_of_config

    allow = bool(getattr(args, "allow_experimental_plugins", False))
    refused = 0
    for path in args.files:
        try:
            config = read_config(path)
            scheduler = build_scheduler(config, seed=0, allow_experimental=allow)
            plugins = effective_plugins(config, allow_experimental=allow)
            engines_of_config(config)  # metric names per engine, as the scraper will read them
            federation = parse_federation(config.federation, config.source) if config.federation is not None else None
        except ConfigError as exc:
            refused += 1
            print(f"refused: {exc}", file=sys.stdout)
            continue
        print(f"ok: {path}: {scheduler.description}")
        t, fresh = config.saturation, scheduler.freshness
        staleness = f"{fresh.staleness_s * 1000:g}ms" + (
            "" if t.staleness_s is not None else " (--metrics-staleness-threshold)"
        )
        print(
            f"    saturation: queueDepthThreshold {t.queue_depth:g}, kvCacheUtilThreshold {t.kv_util:g}, "
            f"metricsStalenessThreshold {staleness}, headroom {t.headroom:g}"
        )
        if federation is not None:
            rules = ", ".join(r.name for r in federation.rules) or "none"
            stale = "as last resort" if federation.stale_last_resort else "excluded"
            print(f"    federation: residency rules {rules}; stale sites {stale}")
        for plugin in plugins:
            added = " (added)" if plugin.implicit else ""
            params = json.dumps(plugin.parameters, sort_keys=True, default=str)
            print(f"    plugin {plugin.name} ({plugin.type_name}, {plugin.kind.value}){added}: {params}")
        parsers = (
            ", ".join(config.parser_refs) or "openai-parser, anthropic-parser, vllmhttp-parser, passthrough-parser"
        )
        print(f"    parsers: {parsers}")
        gates = ", ".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(config.feature_gates.items()))
        print(f"    featureGates: {gates}")
        if config.discovery_ref is not None:
            print(f"    endpoints: from plugin {config.discovery_ref} (no cluster needed)")
        for note in config.notes:
            print(f"    note: {note}")
        for warning in deprecations(config):
            print(f"    warning: {warning}")
    return 1 if refused else 0

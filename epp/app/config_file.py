"""`--config-file`: read an EndpointPickerConfig and prove it builds, before any port is opened.

Reading and decoding are `epp.config`; building is `epp.scheduling.build`. Both verdicts come from here, so
`epp serve` and the benchmarks refuse exactly what `epp check-config` refuses, in the same words. Upstream's
deprecation warnings (the older apiVersion, top-level parser and saturationDetector, deprecated plugin types, a
flowControl section with its gate off) are logged here once, at WARNING.
"""

from __future__ import annotations

import logging
from pathlib import Path

from epp.config.files import read_config, read_config_text
from epp.config.model import EndpointPickerConfig
from epp.requests import DEFAULT_PARSERS, ParserChain
from epp.scheduling import build_scheduler
from epp.scheduling.build import deprecations, plugin_object
from epp.scheduling.config_plugins import FileDiscoveryPlugin
from epp.scheduling.registry import Registry

log = logging.getLogger("epp.config")


def load_config(
    path: str | Path | None,
    registry: Registry | None = None,
    *,
    text: str | None = None,
    allow_experimental: bool = False,
    warn: bool = True,
) -> EndpointPickerConfig:
    """Read (or, with `text`, decode upstream's `--config-text`), validate and test-build a config; raises
    ConfigError naming the source, plugin and why. Deprecations are logged at WARNING unless `warn` is false."""
    config = read_config_text(text) if text is not None else read_config(path or "")
    build_scheduler(config, seed=0, registry=registry, allow_experimental=allow_experimental)
    if warn:
        for warning in deprecations(config, registry):
            log.warning("%s: DEPRECATION/IGNORED: %s", config.source, warning)
    return config


def parser_chain_of(config: EndpointPickerConfig | None) -> ParserChain:
    """The parsers `requestHandler.parsers` lists, in order (their plugins' types); none listed: upstream's default."""
    if config is None or not config.parser_refs:
        return DEFAULT_PARSERS
    return ParserChain([config.plugin(ref).type for ref in config.parser_refs])


def file_discovery_of(config: EndpointPickerConfig | None) -> FileDiscoveryPlugin | None:
    """The `file-discovery` plugin `dataLayer.discovery.pluginRef` names, with its parameters checked; else None."""
    if config is None or config.discovery_ref is None:
        return None
    plugin = plugin_object(config, config.discovery_ref)
    return plugin if isinstance(plugin, FileDiscoveryPlugin) else None

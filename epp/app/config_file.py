"""`--config-file`: read an EndpointPickerConfig and prove it builds, before any port is opened.

Reading and decoding are `epp.config`; building is `epp.scheduling.build`. Both verdicts come from here, so
`epp serve` and the benchmarks refuse exactly what `epp check-config` refuses, in the same words.
"""

from __future__ import annotations

from pathlib import Path

from epp.config.files import read_config
from epp.config.model import EndpointPickerConfig
from epp.scheduling import build_scheduler
from epp.scheduling.registry import Registry


def load_config(path: str | Path, registry: Registry | None = None) -> EndpointPickerConfig:
    """Read, decode, validate and test-build a config file; raises ConfigError naming file, plugin and why."""
    config = read_config(path)
    build_scheduler(config, seed=0, registry=registry)
    return config

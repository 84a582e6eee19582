"""Reading an EndpointPickerConfig file: the only module of the config package that touches a file or YAML.

The decision layer never imports it (an import-linter contract), so scheduling and the residency policy stay pure:
they receive decoded values. `epp.app.config_file.load_config` adds the check that a file also builds.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from epp.config.decode import parse_config
from epp.config.model import EndpointPickerConfig
from epp.errors import ConfigError


def read_config(path: str | Path) -> EndpointPickerConfig:
    """Read and decode a file (phase one only); `epp.app.config_file.load_config` also checks that it builds."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the file ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: not UTF-8 text") from None
    return read_config_text(text, source)


def read_config_text(text: str, source: str = "--config-text") -> EndpointPickerConfig:
    """Decode a config given as text (upstream's `--config-text`), as `read_config` decodes a file's."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        raise ConfigError(f"{source}: not valid YAML{at}: {problem}") from None
    if len(docs) > 1:
        raise ConfigError(f"{source}: holds {len(docs)} YAML documents; expected one EndpointPickerConfig")
    return parse_config(docs[0] if docs else None, source)

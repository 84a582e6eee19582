"""Scheduling: which endpoint serves a request. Pure decision code: snapshot + request + `now` in, slots out.

Upstream's vocabulary and config format (EndpointPickerConfig: filters → weighted scorers → picker, in profiles),
vectorised over the endpoint table's numpy columns.
"""

from epp.scheduling.build import build_scheduler, default_config, load_config, upstream_default_config
from epp.scheduling.config import EndpointPickerConfig, parse_config, read_config
from epp.scheduling.profile import ProfileScheduler, SchedulingProfile
from epp.scheduling.registry import Registry, builtin_registry, register_builtins
from epp.scheduling.saturation import SaturationDetector, SaturationThresholds

__all__ = [
    "EndpointPickerConfig",
    "ProfileScheduler",
    "Registry",
    "SaturationDetector",
    "SaturationThresholds",
    "SchedulingProfile",
    "build_scheduler",
    "builtin_registry",
    "default_config",
    "load_config",
    "parse_config",
    "read_config",
    "register_builtins",
    "upstream_default_config",
]

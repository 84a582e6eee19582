"""Scheduling: which endpoint serves a request. Pure decision code: snapshot + request + `now` in, slots out.

Upstream's vocabulary and config format (EndpointPickerConfig: filters → weighted scorers → picker, in profiles),
vectorised over the endpoint table's numpy columns. The config file itself (model, decoding, reading) is
`epp.config`; this package instantiates it (`build`) from an explicit plugin registry.
"""

from epp.config.model import SaturationThresholds
from epp.scheduling.build import build_scheduler, default_config, upstream_default_config
from epp.scheduling.profile import ProfileScheduler, SchedulingProfile
from epp.scheduling.registry import Registry, builtin_registry, register_builtins
from epp.scheduling.saturation import SaturationDetector
from epp.scheduling.scheduler import Scheduler

__all__ = [
    "ProfileScheduler",
    "Registry",
    "SaturationDetector",
    "SaturationThresholds",
    "Scheduler",
    "SchedulingProfile",
    "build_scheduler",
    "builtin_registry",
    "default_config",
    "register_builtins",
    "upstream_default_config",
]
